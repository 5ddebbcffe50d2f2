//! Time as an injected value, so tests step it instead of sleeping.
//!
//! The memory backend and the local fallback buckets read a [`Clock`]; the Redis backend reads
//! Redis's own `TIME` inside the script and never this. This is the one module allowed to read
//! ambient time (see `.clippy.toml`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds on a monotonic timeline. The token bucket and GCRA only use differences; the
/// windows align to multiples of their unit on it, so production clocks count from the Unix
/// epoch (as Redis `TIME` does).
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// Wall-clock milliseconds since the Unix epoch at start, then monotonic process time: a minute
/// window starts at :00 as it does against Redis `TIME`, and a wall clock stepping back after
/// start (NTP) never moves this clock back.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    origin: Instant,
    /// The wall clock at `origin`; never 0 (0 would read as "never touched").
    base_ms: u64,
}

impl MonotonicClock {
    #[allow(clippy::disallowed_methods)]
    pub fn new() -> Self {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX / 2));
        MonotonicClock {
            origin: Instant::now(),
            // A machine whose clock says it is before 1970 still gets a non-zero timeline.
            base_ms: wall_ms.max(1_000_000),
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
        self.base_ms
            .saturating_add(self.origin.elapsed().as_millis() as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_clock_counts_from_the_unix_epoch() {
        let clock = MonotonicClock::new();
        let first = clock.now_ms();
        // 2023-11-14 onwards: the clock reads the wall clock's epoch milliseconds.
        assert!(first > 1_700_000_000_000, "{first}");
        assert!(clock.now_ms() >= first);
    }
}
