//! The log line of degraded decisions, rate-limited: during an outage every request is degraded,
//! and one warn line per request would bury everything else. The first degraded decision is
//! logged at once; after that at most one summary per interval, with counts per policy. Each
//! degraded decision is also logged at debug level.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::BackendError;
use crate::clock::SharedClock;
use crate::rule::FailureMode;

/// Summaries are at most this far apart.
pub const SUMMARY_INTERVAL_MS: u64 = 10_000;

/// Counts degraded decisions and logs them at a bounded rate.
pub struct DegradedNotices {
    clock: SharedClock,
    interval_ms: u64,
    /// Degraded descriptors per policy since the last line: open, closed, local, error.
    counts: [AtomicU64; 4],
    /// When the last line was written; 0 = never.
    last_ms: AtomicU64,
    last_error: Mutex<Option<BackendError>>,
}

impl DegradedNotices {
    pub fn new(clock: SharedClock) -> Self {
        Self::with_interval(clock, SUMMARY_INTERVAL_MS)
    }

    pub fn with_interval(clock: SharedClock, interval_ms: u64) -> Self {
        DegradedNotices {
            clock,
            interval_ms,
            counts: Default::default(),
            last_ms: AtomicU64::new(0),
            last_error: Mutex::new(None),
        }
    }

    /// Notes one decision the failure policy `mode` made because of `error`. Returns true when
    /// this call wrote the warn line (for tests).
    pub fn record(&self, mode: FailureMode, error: &BackendError) -> bool {
        self.counts[index(mode)].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(policy = mode.as_str(), %error, "degraded decision");
        let now = self.clock.now_ms();
        let last = self.last_ms.load(Ordering::Acquire);
        if last != 0 && now < last.saturating_add(self.interval_ms) {
            *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error.clone());
            return false;
        }
        if self
            .last_ms
            .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let [open, closed, local, error_count] =
            [0, 1, 2, 3].map(|i| self.counts[i].swap(0, Ordering::Relaxed));
        let since_ms = if last == 0 { 0 } else { now - last };
        tracing::warn!(
            open,
            closed,
            local,
            error = error_count,
            since_ms,
            last_error = %error,
            "Redis unavailable: decisions made by the failure policy"
        );
        true
    }

    /// Decisions counted since the last line, per policy (open, closed, local, error).
    pub fn pending(&self) -> [u64; 4] {
        [0, 1, 2, 3].map(|i| self.counts[i].load(Ordering::Relaxed))
    }
}

fn index(mode: FailureMode) -> usize {
    match mode {
        FailureMode::Open => 0,
        FailureMode::Closed => 1,
        FailureMode::Local => 2,
        FailureMode::Error => 3,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn first_is_logged_then_one_summary_per_interval() {
        let clock = ManualClock::new(5_000);
        let notices = DegradedNotices::with_interval(Arc::new(clock.clone()), 1_000);
        let err = BackendError::CircuitOpen;
        assert!(notices.record(FailureMode::Local, &err));
        for _ in 0..50 {
            assert!(!notices.record(FailureMode::Open, &err));
        }
        assert_eq!(notices.pending(), [50, 0, 0, 0]);
        clock.advance(999);
        assert!(!notices.record(FailureMode::Closed, &err));
        clock.advance(1);
        assert!(notices.record(FailureMode::Closed, &err));
        assert_eq!(notices.pending(), [0, 0, 0, 0]);
    }
}
