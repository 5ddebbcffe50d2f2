//! Settle: a charged plan → each descriptor's [`Status`] from what became of its bucket (or
//! the answer it had without one) → the [`Decision`] and its overall code.

use crate::algorithm::{Algorithm, BucketParams, Verdict};
use crate::decision::{AppliedLimit, Basis, Code, Decision, Status, overall};
use crate::resilience::over_limit::CachedRejection;
use crate::rule::FailureMode;

use super::plan::{Outcome, Plan, Slot};
use super::targets::Target;

impl Plan {
    /// Each descriptor's status from what became of its bucket, and the overall code.
    pub(super) fn settle(self) -> Decision {
        let Plan { slots, buckets } = self;
        let mut other_limits = Vec::new();
        let statuses: Vec<Status> = slots
            .into_iter()
            .enumerate()
            .map(|(i, slot)| match slot {
                Slot::Answered(status) => status,
                Slot::Charged { target, bucket } => status_of(target, &buckets[bucket].outcome),
                Slot::Limits(charged) => {
                    let mut all: Vec<Status> = charged
                        .into_iter()
                        .map(|(target, bucket)| status_of(target, &buckets[bucket].outcome))
                        .collect();
                    let answer = all.swap_remove(most_constraining(&all));
                    other_limits.extend(all.into_iter().map(|status| (i, status)));
                    answer
                }
            })
            .collect();
        Decision {
            overall: overall(&statuses),
            statuses,
            unknown_domain: false,
            other_limits,
        }
    }
}

/// Which status a descriptor with several limits reports: the limit that refuses with the
/// longest wait (a wait of never being the longest), else, when every limit passes, the one with
/// the fewest hits remaining; the first in config order on a tie.
fn most_constraining(statuses: &[Status]) -> usize {
    let rank = |s: &Status| {
        let wait = match s.retry_after_ms {
            Some(Some(ms)) => ms,
            Some(None) => u64::MAX,
            None => 0,
        };
        (
            s.code == Code::OverLimit,
            s.over,
            wait,
            u64::MAX - s.remaining,
        )
    };
    let mut best = 0;
    for (i, status) in statuses.iter().enumerate().skip(1) {
        if rank(status) > rank(&statuses[best]) {
            best = i;
        }
    }
    best
}

/// The status of a descriptor from what became of its bucket.
fn status_of(target: Target, outcome: &Outcome) -> Status {
    match outcome {
        Outcome::Decided(v) => from_verdict(target, v, Basis::Backend),
        Outcome::Local(v) => from_verdict(target, v, Basis::Degraded(FailureMode::Local)),
        Outcome::Failed(_) => degraded(target),
        Outcome::Cached(c) => cached(target, c),
        Outcome::NotEvaluated => Status {
            code: Code::Ok,
            basis: Basis::NotEvaluated,
            limit: None,
            remaining: 0,
            reset_ms: 0,
            retry_after_ms: None,
            shadow: target.shadow,
            over: false,
            quota: target.quota,
            rule: target.rule,
        },
        Outcome::Pending => unreachable!("every bucket is decided before the statuses"),
    }
}

fn from_verdict(target: Target, v: &Verdict, basis: Basis) -> Status {
    let over = !v.allowed;
    Status {
        code: if over && !target.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        },
        basis,
        limit: Some(AppliedLimit::new(&target.rate, target.name)),
        remaining: v.remaining,
        reset_ms: v.until_full_ms,
        retry_after_ms: over.then_some(v.retry_after_ms),
        shadow: target.shadow,
        over,
        quota: target.quota,
        rule: target.rule,
    }
}

/// The status of a descriptor answered OVER_LIMIT from the over-limit cache (OK for a shadow
/// rule).
fn cached(target: Target, c: &CachedRejection) -> Status {
    // A fixed window ends on a whole second and the backend reports it so (as
    // envoyproxy/ratelimit does); the cache's count-down from that answer keeps the shape.
    let reset_ms = if target.algorithm == Algorithm::FixedWindow {
        c.until_full_ms.div_ceil(1000).saturating_mul(1000)
    } else {
        c.until_full_ms
    };
    Status {
        code: if target.shadow {
            Code::Ok
        } else {
            Code::OverLimit
        },
        basis: Basis::Cached,
        limit: Some(AppliedLimit::new(&target.rate, target.name)),
        remaining: c.remaining,
        reset_ms,
        retry_after_ms: Some(Some(c.wait_ms)),
        shadow: target.shadow,
        over: true,
        quota: target.quota,
        rule: target.rule,
    }
}

/// A status decided by the `open` or `closed` policy (`local` has a verdict of its own, `error`
/// never gets here). `closed` asks for a retry after one second: the outage's end is unknown.
fn degraded(target: Target) -> Status {
    let BucketParams { capacity, .. } = target.params;
    let over = target.failure_mode == FailureMode::Closed;
    Status {
        code: if over && !target.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        },
        basis: Basis::Degraded(target.failure_mode),
        limit: Some(AppliedLimit::new(&target.rate, target.name)),
        remaining: if over { 0 } else { capacity },
        reset_ms: 0,
        retry_after_ms: over.then_some(Some(1_000)),
        shadow: target.shadow,
        over,
        quota: target.quota,
        rule: target.rule,
    }
}
