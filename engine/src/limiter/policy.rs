//! When the backend does not decide a bucket: the over-limit cache answers before it is asked,
//! and the failure policy after it failed (`error` fails the call, `local` decides on the
//! in-process buckets, `open` and `closed` are answered as degraded statuses).

use crate::algorithm::Algorithm;
use crate::backend::{Backend, Hit};
use crate::rule::FailureMode;

use super::plan::{Bucket, Outcome, rejected};
use super::{LimitError, Limiter};

impl<B: Backend> Limiter<B> {
    /// Answers the request from the over-limit cache if it knows one of the `asked` hits (those
    /// of the pending buckets, in order) is rejected: that bucket is [`Outcome::Cached`], every
    /// other one — leased ones included — is not evaluated, so nothing is asked and nothing is
    /// charged. Returns whether it answered.
    pub(super) fn answer_from_cache(
        &self,
        buckets: &mut [Bucket],
        asked: &[Hit],
        now_ms: u64,
    ) -> bool {
        // A refund, and an always-charged take (`charge: always`), must reach the backend even
        // when the request is rejected, so a request carrying one is never answered from the
        // cache. Shadow hits cannot reject, and a quota
        // hit rejects only with every other quota hit of the request, so neither ever makes the
        // cache answer for the whole request (the cache answers neither).
        let Some(cache) = self.resilience.over_limit.as_ref() else {
            return false;
        };
        // A reservation's ledger may settle its bucket, which must then be counted.
        let lands_anyway = |h: &Hit| {
            h.demand.refund
                || (h.demand.always && h.demand.tokens > 0)
                || h.demand.algorithm == Algorithm::Reservation
        };
        if asked.iter().any(lands_anyway) {
            return false;
        }
        let mut answered = false;
        let pending = buckets.iter_mut().filter(|b| b.is_pending());
        for (bucket, hit) in pending.zip(asked) {
            if let Some(rejection) = cache.rejects(&hit.key, &hit.demand, now_ms) {
                bucket.outcome = Outcome::Cached(rejection);
                answered = true;
            }
        }
        if answered {
            for bucket in buckets.iter_mut() {
                if !matches!(bucket.outcome, Outcome::Cached(_)) {
                    bucket.outcome = Outcome::NotEvaluated;
                }
            }
        }
        answered
    }

    /// Where the backend failed, the bucket's failure policy answers: `error` fails the call,
    /// `local` decides on the local buckets; `open` and `closed` stay failed and are answered by
    /// [`degraded`]. Each failure is recorded for the operator's notices.
    pub(super) async fn apply_policy(&self, buckets: &mut [Bucket]) -> Result<(), LimitError> {
        let notices = &self.resilience.notices;
        for bucket in buckets.iter() {
            if let (Outcome::Failed(error), FailureMode::Error) =
                (&bucket.outcome, bucket.failure_mode)
            {
                notices.record(FailureMode::Error, error);
                return Err(LimitError::Unavailable(error.clone()));
            }
        }
        for bucket in buckets.iter() {
            if let Outcome::Failed(error) = &bucket.outcome {
                notices.record(bucket.failure_mode, error);
            }
        }
        self.decide_locally(buckets).await;
        Ok(())
    }

    /// The `local` policy: the buckets whose backend call failed under it are decided on the
    /// in-process buckets, which only check (take nothing) when the request is rejected anyway.
    async fn decide_locally(&self, buckets: &mut [Bucket]) {
        let falls_back = |b: &Bucket| {
            matches!(b.outcome, Outcome::Failed(_)) && b.failure_mode == FailureMode::Local
        };
        // A quota bucket the backend found within its limit already passes the request's quota
        // group: the local quota demands can then only be taken or not, never reject.
        let quota_passed = buckets
            .iter()
            .any(|b| !falls_back(b) && b.hit.demand.quota && b.passes());
        let hits: Vec<Hit> = buckets
            .iter()
            .filter(|b| falls_back(b))
            .map(|b| {
                let mut hit = b.local_hit();
                hit.demand.shadow |= quota_passed && hit.demand.quota;
                hit
            })
            .collect();
        if hits.is_empty() {
            return;
        }
        let rejected = rejected(buckets);
        let verdicts = self.resilience.local.decide(&hits, rejected).await;
        let fallen = buckets.iter_mut().filter(|b| falls_back(b));
        for (bucket, verdict) in fallen.zip(verdicts) {
            bucket.outcome = Outcome::Local(verdict);
        }
    }
}
