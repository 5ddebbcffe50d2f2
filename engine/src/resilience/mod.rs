//! What happens when Redis is slow or gone, decided in pure code with an injected clock.
//!
//! - [`breaker`]: the circuit breakers of the Redis endpoints live with the backend that consults
//!   them ([`crate::backend::breaker`]); re-exported here, where readiness reads their states.
//! - [`over_limit`]: the local over-limit cache: a bucket Redis rejected with retry-after R is
//!   answered OVER_LIMIT locally until R.
//! - [`local`]: the `local` failure policy's in-process buckets (limit / N replicas).
//! - [`in_flight`]: the bound on decisions in progress (RESOURCE_EXHAUSTED past it).
//! - [`notice`]: the rate-limited log line of degraded decisions.
//!
//! The failure policy itself (open → OK, closed → OVER_LIMIT, local → local bucket, error →
//! UNAVAILABLE) is applied per descriptor by [`crate::limiter`], which owns a [`Resilience`].
//! Deadlines are enforced where the calls are made (`--redis-timeout`, in the Redis backend).

pub use crate::backend::breaker;
pub mod in_flight;
pub mod local;
pub mod notice;
pub mod over_limit;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::memory::{MemoryBackend, MemoryOptions};
use crate::clock::{MonotonicClock, SharedClock};
use crate::config::Config;
use crate::rule::FailureMode;

use self::breaker::BreakerState;
use self::in_flight::InFlight;
use self::local::{LocalFallback, Replicas};
use self::notice::DegradedNotices;
use self::over_limit::OverLimitCache;

/// Sizes and switches of the resilience machinery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResilienceOptions {
    /// Entries of the over-limit cache; `None` switches it off.
    pub over_limit_cache_keys: Option<usize>,
    /// Decisions in progress before new ones are refused.
    pub max_in_flight: usize,
    /// Bounds of the `local` policy's bucket store.
    pub local_store: MemoryOptions,
}

impl Default for ResilienceOptions {
    /// Everything a library user gets without asking: no cache, no in-flight bound.
    fn default() -> Self {
        ResilienceOptions {
            over_limit_cache_keys: None,
            max_in_flight: usize::MAX,
            local_store: MemoryOptions {
                max_buckets: 100_000,
                ..MemoryOptions::default()
            },
        }
    }
}

/// The resilience state one limiter owns.
pub struct Resilience {
    pub clock: SharedClock,
    pub local: LocalFallback,
    pub over_limit: Option<OverLimitCache>,
    pub in_flight: Arc<InFlight>,
    pub notices: DegradedNotices,
    /// When the backend last answered a decision (ms on `clock`; 0 = never).
    last_answer_ms: AtomicU64,
}

impl Resilience {
    pub fn new(options: &ResilienceOptions, clock: SharedClock, replicas: Arc<Replicas>) -> Self {
        let store = Arc::new(MemoryBackend::new(clock.clone(), options.local_store));
        Resilience {
            local: LocalFallback::new(store, replicas),
            over_limit: options.over_limit_cache_keys.map(OverLimitCache::new),
            in_flight: Arc::new(InFlight::new(options.max_in_flight)),
            notices: DegradedNotices::new(clock.clone()),
            clock,
            last_answer_ms: AtomicU64::new(0),
        }
    }

    pub fn note_answer(&self, now_ms: u64) {
        self.last_answer_ms.store(now_ms, Ordering::Relaxed);
    }

    /// True when the backend answered a decision within the last `ms`: live traffic has just
    /// exercised the script, so a health probe would add nothing.
    pub fn answered_within(&self, ms: u64) -> bool {
        let last = self.last_answer_ms.load(Ordering::Relaxed);
        last != 0 && self.clock.now_ms() < last.saturating_add(ms)
    }

    pub fn local(&self) -> &LocalFallback {
        &self.local
    }

    pub fn over_limit_cache(&self) -> Option<&OverLimitCache> {
        self.over_limit.as_ref()
    }

    pub fn in_flight(&self) -> &Arc<InFlight> {
        &self.in_flight
    }

    pub fn replicas(&self) -> &Arc<Replicas> {
        self.local.replicas()
    }
}

impl Default for Resilience {
    fn default() -> Self {
        Resilience::new(
            &ResilienceOptions::default(),
            Arc::new(MonotonicClock::new()),
            Arc::new(Replicas::fixed(1)),
        )
    }
}

/// True when every failure policy `config` can apply is `error` (with `default` for rules and
/// domains that set none): then a Redis outage leaves this replica nothing to answer with.
pub fn only_error_policy(config: &Config, default: FailureMode) -> bool {
    let domains = config.domains().map(|d| d.failure_mode.unwrap_or(default));
    let rules = config.rules().map(|r| {
        r.failure_mode
            .or_else(|| config.domain(&r.domain).and_then(|d| d.failure_mode))
            .unwrap_or(default)
    });
    let mut modes = domains.chain(rules).peekable();
    if modes.peek().is_none() {
        return default == FailureMode::Error;
    }
    modes.all(|m| m == FailureMode::Error)
}

/// Readiness of the backend side: not ready only when Redis is unreachable from here — every
/// endpoint's breaker is open or probing — and the policy in force is `error`, so every
/// decision would be UNAVAILABLE anyway and Envoy is better served by another replica. With any
/// other policy this replica still answers, and a shared outage must not take every replica
/// out of rotation at once. In Cluster mode one failed node does not count: the others answer.
pub fn backend_ready(states: &[(String, BreakerState)], only_error: bool) -> bool {
    let unreachable = !states.is_empty() && states.iter().all(|(_, s)| *s != BreakerState::Closed);
    !(unreachable && only_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_sources;

    fn config(yaml: &str) -> Config {
        load_sources(&[("test.yaml".into(), yaml.into())]).unwrap()
    }

    #[test]
    fn only_error_sees_every_domain_and_rule() {
        let plain = config(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert!(only_error_policy(&plain, FailureMode::Error));
        assert!(!only_error_policy(&plain, FailureMode::Local));
        let mixed = config(
            "domain: a\ndescriptors:\n  - key: k\n    failure_mode: open\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert!(!only_error_policy(&mixed, FailureMode::Error));
        let domain_local = config(
            "domain: a\nfailure_mode: local\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert!(!only_error_policy(&domain_local, FailureMode::Error));
        let domain_error = config(
            "domain: a\nfailure_mode: error\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        assert!(only_error_policy(&domain_error, FailureMode::Open));
        assert!(only_error_policy(&Config::default(), FailureMode::Error));
    }

    #[test]
    fn not_ready_only_when_unreachable_and_error() {
        let s = |states: &[BreakerState]| -> Vec<(String, BreakerState)> {
            states
                .iter()
                .enumerate()
                .map(|(i, s)| (format!("n{i}"), *s))
                .collect()
        };
        use BreakerState::*;
        assert!(backend_ready(&s(&[Closed]), true));
        assert!(!backend_ready(&s(&[Open]), true));
        assert!(!backend_ready(&s(&[HalfOpen]), true));
        assert!(backend_ready(&s(&[Open]), false));
        assert!(backend_ready(&s(&[Open, Closed, Open]), true));
        assert!(!backend_ready(&s(&[Open, HalfOpen, Open]), true));
        assert!(backend_ready(&[], true));
    }
}
