//! Pure rate-limit arithmetic: `(state, now, params, demand) -> (state, verdict)`.
//!
//! Nothing here reads a clock or touches I/O, so every edge case is a unit test with time as an
//! argument. The memory backend calls [`token_bucket::decide`] directly; `lua/token_bucket.lua`
//! performs the same floating-point operations in the same order, so both backends give
//! bit-identical answers (checked by the conformance suite).

pub mod token_bucket;

use serde::Serialize;

/// A bucket's shape: holds at most `capacity` tokens, refills `requests_per_unit` per `unit_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct BucketParams {
    pub capacity: u64,
    pub requests_per_unit: u64,
    pub unit_ms: u64,
}

impl BucketParams {
    /// Tokens per millisecond. Computed as one division of two doubles, exactly as the Lua does.
    pub fn rate_per_ms(&self) -> f64 {
        self.requests_per_unit as f64 / self.unit_ms as f64
    }
}

/// Stored state of one bucket. A bucket with no state is full.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketState {
    /// Fractional tokens are kept so slow refill rates are exact over time.
    pub tokens: f64,
    /// Time of the last refill, ms on the deciding clock.
    pub updated_ms: u64,
}

/// What one request asks of one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    pub params: BucketParams,
    /// Tokens to take (or give back when `refund`). 0 checks without taking: allowed while the
    /// bucket holds at least one token.
    pub tokens: u64,
    /// Give `tokens` back (capped at capacity) instead of taking them. Never rejected.
    pub refund: bool,
    /// Shadow-mode rule: reported, never the reason a request is rejected.
    pub shadow: bool,
}

/// The answer for one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// This bucket alone had enough tokens (always true for a refund). The request as a whole is
    /// allowed when every non-shadow bucket's verdict is.
    pub allowed: bool,
    /// Whole tokens left after this request (rounded down).
    pub remaining: u64,
    /// 0 when allowed; otherwise ms until enough tokens exist (rounded up); `None` when the
    /// demand exceeds the capacity and never can be met.
    pub retry_after_ms: Option<u64>,
    /// ms until the bucket is full again (rounded up).
    pub until_full_ms: u64,
}

/// `retry_after_ms` value the backends use on the wire for "never" (cost above capacity).
pub const NEVER: u64 = u64::MAX;
