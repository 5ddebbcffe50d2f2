//! The decision: a validated request → the buckets it charges → a [`Decision`].
//!
//! Pure domain logic: no protobuf, no gRPC. A request travels in named hops:
//!
//! 1. [`crate::rls`] converts the protobuf request and calls [`Limiter::decide`];
//! 2. plan (`plan.rs`, `targets.rs`): each descriptor → its rule or override → a target, and
//!    one bucket per distinct storage key (descriptors naming one bucket are paid together);
//! 3. charge (`charge.rs`): a request already rejected charges only what always lands; buckets
//!    with a lease are paid from it where they can (`leasing.rs`); the others are answered by
//!    the over-limit cache, else asked of the backend in one call, and where the backend
//!    failed each bucket's failure policy answers (`policy.rs`);
//! 4. settle (`settle.rs`): each descriptor's [`Status`] from its bucket's outcome → the
//!    [`Decision`]; the service turns it into the response and maps a [`LimitError`] to a gRPC
//!    status.
//!
//! When the backend cannot answer for a bucket, the failure policy of its descriptor decides
//! ([`Basis::Degraded`]): `open` → OK, `closed` → OVER_LIMIT, `local` → the in-process bucket of
//! [`crate::resilience::local`], `error` → the whole call fails with [`LimitError::Unavailable`].
//! Before the backend is asked, the over-limit cache may already know the request is rejected
//! ([`Basis::Cached`]); then nothing is asked and nothing is taken. Likewise when a descriptor
//! reaches a blocking `requests_per_unit: 0` rule ([`Basis::Blocked`]).
//!
//! A rule with `shards: N` (hot-key splitting) keeps each descriptor's bucket as N sub-buckets
//! of `limit / N` ([`crate::key::RuleTag::Shard`]); a request is judged by one of them, chosen by
//! [`shard_of`] from a per-replica counter, and reports that shard's remaining and retry-after
//! beside the rule's full limit. Under the `local` policy a sharded rule falls back to one
//! in-process bucket of the full limit / replicas, as an unsharded rule does.

mod charge;
pub mod lease;
mod leasing;
mod plan;
mod policy;
mod settle;
mod slots;
mod targets;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_charge;
#[cfg(test)]
mod tests_leases;
#[cfg(test)]
mod tests_limits;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::backend::{Backend, BackendError};
use crate::config::Config;
use crate::limiter::lease::LeaseStore;
use crate::request::LimitRequest;
use crate::resilience::Resilience;
use crate::resilience::breaker::BreakerState;
use crate::rule::FailureMode;

pub use crate::decision::{AppliedLimit, Basis, Code, Decision, Status};
pub use slots::{SlotEvent, SlotStats};
pub use targets::shard_of;

/// Why no decision could be made.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    /// The backend failed and the failure policy of some descriptor is `error`.
    #[error("rate-limit backend unavailable: {0}")]
    Unavailable(#[source] BackendError),
    /// Too many decisions are in progress (`--max-in-flight`).
    #[error("overloaded: {0} rate-limit decisions already in progress")]
    Overloaded(usize),
}

/// Settings of the decision path that do not come from the descriptor config.
#[derive(Clone, Debug)]
pub struct LimiterOptions {
    /// Prepended to every storage key (contains no `{` or `}`).
    pub key_prefix: String,
    /// Failure mode for rules and domains that set none.
    pub default_failure_mode: FailureMode,
    /// `--quota-mode`: every descriptor is in quota mode — the rules, compiled so by the config
    /// loader, and also the descriptors no rule limits (no rule, a replaced rule, a request
    /// `limit` override), which count as quota descriptors that pass, as in
    /// envoyproxy/ratelimit.
    pub quota_all: bool,
}

impl LimiterOptions {
    pub const DEFAULT_KEY_PREFIX: &'static str = "sluice:";
    pub const DEFAULT_FAILURE_MODE: FailureMode = FailureMode::Error;
}

impl Default for LimiterOptions {
    /// Keys under `sluice:`, a backend failure answered as an error (which Envoy's default
    /// `failure_mode_deny: false` lets through), quota mode only where a rule says so.
    fn default() -> Self {
        LimiterOptions {
            key_prefix: Self::DEFAULT_KEY_PREFIX.to_owned(),
            default_failure_mode: Self::DEFAULT_FAILURE_MODE,
            quota_all: false,
        }
    }
}

/// Decides requests against the active config and a backend.
pub struct Limiter<B> {
    config: Arc<ArcSwap<Config>>,
    backend: B,
    options: LimiterOptions,
    resilience: Resilience,
    /// Token leases of the rules with `lease` (`None`: every hit goes to the backend).
    leases: Option<Arc<LeaseStore>>,
    /// Advanced once per request that reaches a sharded rule; [`shard_of`] scatters it over the
    /// shards. Starts at a random value so replicas do not walk the shards in step.
    shard_cursor: AtomicU64,
    /// What decisions did to in-flight caps' slots.
    slots: Arc<SlotStats>,
}

impl<B: Backend> Limiter<B> {
    /// A limiter without over-limit cache or in-flight bound, whose `local` policy assumes one
    /// replica.
    pub fn new(config: Arc<ArcSwap<Config>>, backend: B, options: LimiterOptions) -> Self {
        Self::with_resilience(config, backend, options, Resilience::default())
    }

    pub fn with_resilience(
        config: Arc<ArcSwap<Config>>,
        backend: B,
        options: LimiterOptions,
        resilience: Resilience,
    ) -> Self {
        Limiter {
            config,
            backend,
            options,
            resilience,
            leases: None,
            shard_cursor: AtomicU64::new(rand::random()),
            slots: Arc::default(),
        }
    }

    /// Starts the shard counter at `seq` (tests that want a known sequence of shards).
    pub fn with_shard_cursor(self, seq: u64) -> Self {
        self.shard_cursor.store(seq, Ordering::Relaxed);
        self
    }

    /// Spends the tokens of rules with `lease` from `store` where it can.
    pub fn with_leases(mut self, store: Arc<LeaseStore>) -> Self {
        self.leases = Some(store);
        self
    }

    pub fn leases(&self) -> Option<&Arc<LeaseStore>> {
        self.leases.as_ref()
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn resilience(&self) -> &Resilience {
        &self.resilience
    }

    /// Each backend endpoint and the state of its circuit breaker (empty for the memory
    /// backend). Read-only, for readiness and metrics.
    pub fn breaker_states(&self) -> Vec<(String, BreakerState)> {
        self.backend
            .breakers()
            .map(|set| set.states())
            .unwrap_or_default()
    }

    /// Slots taken and released by in-flight caps, per rule (metrics).
    pub fn slot_stats(&self) -> &Arc<SlotStats> {
        &self.slots
    }

    pub fn config(&self) -> &Arc<ArcSwap<Config>> {
        &self.config
    }

    pub fn options(&self) -> &LimiterOptions {
        &self.options
    }

    /// Decides one request, straight down: [`plan`](plan.rs) (each descriptor's target and the
    /// buckets they charge), [`charge`](charge.rs) (leases, the over-limit cache or one backend
    /// call, failure policies), [`settle`](settle.rs) (each descriptor's status, the overall
    /// code). At most one backend call.
    pub async fn decide(&self, request: &LimitRequest) -> Result<Decision, LimitError> {
        let in_flight = &self.resilience.in_flight;
        let Some(_place) = in_flight.enter() else {
            return Err(LimitError::Overloaded(in_flight.limit()));
        };
        let config = self.config.load();
        let Some(domain) = config.domain(&request.domain) else {
            return Ok(Decision {
                overall: Code::Ok,
                statuses: request
                    .descriptors
                    .iter()
                    .map(|_| Status::unlimited(Basis::NoRule, None))
                    .collect(),
                unknown_domain: true,
                other_limits: Vec::new(),
            });
        };
        let mut plan = self.plan(domain, request);
        self.charge(&mut plan, &config).await?;
        Ok(plan.settle())
    }
}
