//! Charge: every bucket of a plan gets its [`Outcome`] — from its lease, the over-limit cache,
//! one backend call, or its failure policy where the backend failed.

use crate::backend::{Backend, Hit};
use crate::config::Config;

use super::plan::{Bucket, Outcome, Plan};
use super::{LimitError, Limiter};

impl<B: Backend> Limiter<B> {
    /// Charges `plan`. A request its unbucketed descriptors already reject charges only the
    /// buckets that always land (never from a lease); any other is charged whole, and its
    /// holder events are recorded.
    pub(super) async fn charge(&self, plan: &mut Plan, config: &Config) -> Result<(), LimitError> {
        if plan.reject_before_charging() {
            return self.ask_backend(&mut plan.buckets).await;
        }
        self.charge_buckets(&mut plan.buckets).await?;
        self.slots.record(config, &plan.buckets);
        Ok(())
    }

    /// Charges the buckets of a request not rejected yet: from its lease where it has one
    /// (`charge_with_leases`), else through [`Limiter::ask_backend`].
    async fn charge_buckets(&self, buckets: &mut [Bucket]) -> Result<(), LimitError> {
        if buckets.is_empty() {
            return Ok(());
        }
        if let Some(store) = &self.leases
            && buckets.iter().any(|b| b.lease_batch().is_some())
        {
            return self.charge_with_leases(store, buckets).await;
        }
        self.ask_backend(buckets).await
    }

    /// Decides every bucket still pending: from the over-limit cache when it rejects one of
    /// them, else by one backend call, with each bucket's failure policy where the backend
    /// failed.
    pub(super) async fn ask_backend(&self, buckets: &mut [Bucket]) -> Result<(), LimitError> {
        let asked: Vec<Hit> = buckets
            .iter()
            .filter(|b| b.is_pending())
            .map(Bucket::asked)
            .collect();
        if asked.is_empty() {
            return Ok(());
        }
        let now_ms = self.resilience.clock.now_ms();
        if self.answer_from_cache(buckets, &asked, now_ms) {
            return Ok(());
        }

        let results = self.backend.check_each(&asked).await;
        if results.iter().any(Result::is_ok) {
            self.resilience.note_answer(now_ms);
        }
        let cache = self.resilience.over_limit.as_ref();
        let pending = buckets.iter_mut().filter(|b| b.is_pending());
        for ((bucket, hit), result) in pending.zip(&asked).zip(results) {
            bucket.outcome = match result {
                Ok(verdict) => {
                    if let Some(cache) = cache {
                        cache.learn(&hit.key, &hit.demand, &verdict, now_ms);
                    }
                    Outcome::Decided(verdict)
                }
                Err(error) => Outcome::Failed(error),
            };
        }
        if buckets
            .iter()
            .any(|b| matches!(b.outcome, Outcome::Failed(_)))
        {
            self.apply_policy(buckets).await?;
        }
        Ok(())
    }
}
