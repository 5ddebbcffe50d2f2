//! Time as an injected value, so tests step it instead of sleeping.
//!
//! The memory backend and the local fallback buckets read a [`Clock`]; the Redis backend reads
//! Redis's own `TIME` inside the script and never this. This is the one module allowed to read
//! ambient time (see `.clippy.toml`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Milliseconds on a monotonic timeline. Only differences matter.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// Monotonic process time (never steps back when the wall clock does).
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    origin: Instant,
    /// Added to every reading so the timeline does not start at 0 (0 reads as "never touched").
    base_ms: u64,
}

impl MonotonicClock {
    #[allow(clippy::disallowed_methods)]
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
            base_ms: 1_000_000,
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ms(&self) -> u64 {
        self.base_ms + self.origin.elapsed().as_millis() as u64
    }
}

/// A clock tests set and advance by hand.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn new(start_ms: u64) -> Self {
        ManualClock(Arc::new(AtomicU64::new(start_ms)))
    }

    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }

    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Shared handle to whichever clock a component was given.
pub type SharedClock = Arc<dyn Clock>;

/// Measures how long something took (request and Redis latency for the metrics). Durations are
/// reported, never compared with stored timestamps, so this reads the monotonic clock directly
/// rather than through an injected [`Clock`] (whose millisecond grain is too coarse for
/// sub-millisecond histograms).
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(Instant);

impl Stopwatch {
    #[allow(clippy::disallowed_methods)]
    pub fn start() -> Self {
        Stopwatch(Instant::now())
    }

    pub fn elapsed(&self) -> std::time::Duration {
        self.0.elapsed()
    }
}
