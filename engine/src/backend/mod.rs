//! Where bucket state lives: one trait, an in-process [`memory`] backend and a shared [`redis`] one.
//!
//! Both evaluate every key of one request in one atomic step with the arithmetic of
//! [`crate::algorithm`] (each key by its own algorithm); `integration/conformance/` runs one
//! suite against each so they cannot drift.

pub mod breaker;
mod failure;
pub mod memory;
pub mod redis;
pub mod split;

use std::future::Future;
use std::sync::Arc;

use self::breaker::BreakerSet;
pub use self::failure::{BackendError, DEFAULT_CALL_DEADLINE};
use crate::algorithm::{Algorithm, BucketParams, Demand, Peek, Verdict};
use crate::rule::RuleId;

/// One bucket touched by a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Full storage key from [`crate::key`]; distinct within one call.
    pub key: String,
    pub demand: Demand,
    /// The rule the bucket belongs to (`None`: a `limit` override where no rule matched), so the
    /// memory backend can bound buckets per rule. Not part of the bucket's identity.
    pub rule: Option<RuleId>,
}

impl Hit {
    /// A token-bucket take of `tokens`; see [`Hit::using`] for the other algorithms.
    pub fn new(key: impl Into<String>, params: BucketParams, tokens: u64) -> Self {
        Hit {
            key: key.into(),
            demand: Demand::take(Algorithm::TokenBucket, params, tokens),
            rule: None,
        }
    }

    /// The same hit, counted by `algorithm`.
    pub fn using(mut self, algorithm: Algorithm) -> Self {
        self.demand.algorithm = algorithm;
        self
    }
}

/// A key read without counting ([`Backend::peek`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeyPeek {
    /// The deciding clock's now, ms (Redis `TIME`, or the memory backend's clock).
    pub now_ms: u64,
    /// The state brought to now and a check-only verdict, as the decision path computes them.
    pub peek: Peek,
    /// The key holds state; false: it reads as a fresh bucket.
    pub stored: bool,
    /// ms until the store drops the key: Redis's `PTTL`; in memory, until its state settles.
    /// `None`: no key, no expiry, or not known (`PTTL` refused).
    pub ttl_ms: Option<u64>,
    /// The key holds data of another type than sluice writes there (Redis); the next decision
    /// replaces it, a peek reads it as fresh.
    pub foreign: bool,
}

/// What a backend without [`Backend::peek`] or [`Backend::reset`] answers.
fn not_inspectable<T>(name: &str, count: usize) -> Vec<Result<T, BackendError>> {
    (0..count)
        .map(|_| {
            Err(BackendError::Unavailable(format!(
                "the {name} backend cannot inspect or reset buckets"
            )))
        })
        .collect()
}

/// A store of rate-limit state (token buckets, window counters, arrival times).
pub trait Backend: Send + Sync + 'static {
    /// Decides all `hits` of one request, one outcome per hit, in order: the one method the
    /// decision path calls. Keys are distinct. Atomic for hits that share a storage shard (all
    /// of them in memory and standalone Redis; those of one slot in Redis Cluster). A backend
    /// whose hits go to independent endpoints (Redis Cluster nodes) decides the hits of healthy
    /// endpoints and fails only the others, so the failure policy applies only where it must.
    fn check_each(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Vec<Result<Verdict, BackendError>>> + Send;

    /// [`check_each`](Backend::check_each) as one result: every verdict, or the first failure
    /// (tests, benchmarks and tools that want all or nothing).
    fn check(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Result<Vec<Verdict>, BackendError>> + Send {
        let each = self.check_each(hits);
        async move { each.await.into_iter().collect() }
    }

    /// Short name for logs and metrics (`memory`, `redis`).
    fn name(&self) -> &'static str;

    /// A cheap end-to-end health probe (for Redis: the script itself, not just PING).
    fn probe(&self) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// The circuit breakers in front of this backend's endpoints, if it has any (read-only use:
    /// readiness, metrics, tests).
    fn breakers(&self) -> Option<Arc<BreakerSet>> {
        None
    }

    /// Reads each hit's key (by its algorithm and shape; the demand's hits and flags are
    /// ignored) without counting or writing anything, its TTL included: the admin listener's
    /// `GET /buckets`. Each key on its own, not atomically together.
    fn peek(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Vec<Result<KeyPeek, BackendError>>> + Send {
        std::future::ready(not_inspectable(self.name(), hits.len()))
    }

    /// Deletes each hit's key, so its bucket starts fresh: the admin listener's
    /// `DELETE /buckets`. True where the key held state.
    fn reset(&self, hits: &[Hit]) -> impl Future<Output = Vec<Result<bool, BackendError>>> + Send {
        std::future::ready(not_inspectable(self.name(), hits.len()))
    }
}

/// Shared ownership of a backend (the server keeps a handle for its sweeper and probes).
impl<B: Backend> Backend for Arc<B> {
    fn name(&self) -> &'static str {
        B::name(self)
    }

    fn probe(&self) -> impl Future<Output = Result<(), BackendError>> + Send {
        B::probe(self)
    }

    fn check_each(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Vec<Result<Verdict, BackendError>>> + Send {
        B::check_each(self, hits)
    }

    fn breakers(&self) -> Option<Arc<BreakerSet>> {
        B::breakers(self)
    }

    fn peek(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Vec<Result<KeyPeek, BackendError>>> + Send {
        B::peek(self, hits)
    }

    fn reset(&self, hits: &[Hit]) -> impl Future<Output = Vec<Result<bool, BackendError>>> + Send {
        B::reset(self, hits)
    }
}
