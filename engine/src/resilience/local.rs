//! The `local` failure policy: while Redis cannot answer, each replica decides with an
//! in-process bucket holding its share of the limit, so N replicas together admit about the
//! configured limit instead of N times it (`open`) or nothing (`closed`).
//!
//! The buckets live in a [`MemoryBackend`] of their own, so they get exactly the memory
//! backend's algorithms, bounds and eviction. Each demand's shape is divided by N before it is
//! decided: capacity and requests per unit are each rounded *up* (`ceil(x / N)`, at least 1), so
//! a small limit still admits something on every replica; together N replicas admit at most
//! `N × ceil(x / N) ≤ x + N − 1`. The unit is kept, so a window-based algorithm keeps its window.
//! Tokens per hit are not divided: a request costs what it always costs.
//!
//! N is `--replicas` when set, else the number of live replicas last counted through the
//! heartbeat in Redis ([`Replicas::observe`]), which stays frozen while Redis is away.
//! The local buckets start full when the outage starts: Redis's state is not copied.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithm::{BucketParams, Verdict};
use crate::backend::Hit;
use crate::backend::memory::MemoryBackend;

/// How many replicas share the limit.
#[derive(Debug)]
pub struct Replicas {
    configured: Option<u64>,
    discovered: AtomicU64,
    /// A lower count seen once and not yet believed (0: none).
    lower_seen: AtomicU64,
}

impl Replicas {
    /// A fixed count (`--replicas N`, N ≥ 1).
    pub fn fixed(n: u64) -> Self {
        Replicas {
            configured: Some(n.max(1)),
            discovered: AtomicU64::new(1),
            lower_seen: AtomicU64::new(0),
        }
    }

    /// A count discovered through heartbeats; 1 until the first one.
    pub fn discovered() -> Self {
        Replicas {
            configured: None,
            discovered: AtomicU64::new(1),
            lower_seen: AtomicU64::new(0),
        }
    }

    /// True when the count comes from heartbeats.
    pub fn is_discovered(&self) -> bool {
        self.configured.is_none()
    }

    /// The count in force (at least 1).
    pub fn current(&self) -> u64 {
        self.configured
            .unwrap_or_else(|| self.discovered.load(Ordering::Relaxed).max(1))
    }

    /// Records a live count read from Redis (one heartbeat). A higher count applies at once; a
    /// lower one only when the next heartbeat confirms it (the higher of the two), because a
    /// count too low is the unsafe direction — the `local` policy would give each replica too
    /// large a share — and one low reading is what a Redis that lost the heartbeat set (a
    /// restart, a failover) shows until every replica has beaten again, within one interval.
    /// The heartbeat runs on one task, so the two atomics are never raced.
    pub fn observe(&self, live: u64) {
        let live = live.max(1);
        let current = self.discovered.load(Ordering::Relaxed);
        if live >= current {
            self.lower_seen.store(0, Ordering::Relaxed);
            self.discovered.store(live, Ordering::Relaxed);
            return;
        }
        match self.lower_seen.swap(live, Ordering::Relaxed) {
            0 => {}
            earlier => {
                self.lower_seen.store(0, Ordering::Relaxed);
                self.discovered.store(live.max(earlier), Ordering::Relaxed);
            }
        }
    }
}

/// This replica's share of a bucket shape among `replicas`.
pub fn share(params: BucketParams, replicas: u64) -> BucketParams {
    let n = replicas.max(1);
    BucketParams {
        capacity: params.capacity.div_ceil(n).max(1),
        requests_per_unit: params.requests_per_unit.div_ceil(n).max(1),
        ..params
    }
}

/// The in-process buckets the `local` policy decides with.
pub struct LocalFallback {
    store: Arc<MemoryBackend>,
    replicas: Arc<Replicas>,
}

impl LocalFallback {
    pub fn new(store: Arc<MemoryBackend>, replicas: Arc<Replicas>) -> Self {
        LocalFallback { store, replicas }
    }

    pub fn store(&self) -> &Arc<MemoryBackend> {
        &self.store
    }

    pub fn replicas(&self) -> &Arc<Replicas> {
        &self.replicas
    }

    /// Decides `hits` atomically on the local buckets, each at this replica's share. With
    /// `check_only` (the request is already rejected by another descriptor) takes are checked
    /// without taking anything, as a rejected request takes no tokens (but refunds and
    /// always-charged takes, which land whatever the answer).
    pub async fn decide(&self, hits: &[Hit], check_only: bool) -> Vec<Verdict> {
        let n = self.replicas.current();
        let local: Vec<Hit> = hits
            .iter()
            .map(|hit| {
                let mut hit = hit.clone();
                hit.demand.params = share(hit.demand.params, n);
                if check_only && !hit.demand.refund && !hit.demand.always {
                    hit.demand.tokens = 0;
                }
                hit
            })
            .collect();
        self.store.check_keeping_what_fits(&local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryOptions;
    use crate::clock::ManualClock;

    const HUNDRED_PER_MINUTE: BucketParams = BucketParams {
        capacity: 100,
        requests_per_unit: 100,
        unit_ms: 60_000,
    };

    #[test]
    fn share_rounds_up_and_keeps_the_unit() {
        assert_eq!(share(HUNDRED_PER_MINUTE, 1), HUNDRED_PER_MINUTE);
        let third = share(HUNDRED_PER_MINUTE, 3);
        assert_eq!((third.capacity, third.requests_per_unit), (34, 34));
        assert_eq!(third.unit_ms, 60_000);
        let tiny = BucketParams {
            capacity: 2,
            requests_per_unit: 1,
            unit_ms: 1_000,
        };
        assert_eq!(share(tiny, 10).capacity, 1);
        assert_eq!(share(tiny, 10).requests_per_unit, 1);
        assert_eq!(share(tiny, 0), tiny);
    }

    #[test]
    fn configured_count_wins_and_discovery_keeps_the_last_count() {
        assert_eq!(Replicas::fixed(4).current(), 4);
        let fixed = Replicas::fixed(4);
        fixed.observe(9);
        assert_eq!(fixed.current(), 4);
        let found = Replicas::discovered();
        assert_eq!(found.current(), 1);
        found.observe(3);
        assert_eq!(found.current(), 3);
        // One low reading (Redis lost the heartbeat set) is not believed...
        found.observe(1);
        assert_eq!(found.current(), 3);
        // ...and is forgotten when the next heartbeat counts everyone again.
        found.observe(3);
        found.observe(2);
        assert_eq!(found.current(), 3);
        // Two low readings in a row are: the higher of them.
        found.observe(1);
        assert_eq!(found.current(), 2);
        found.observe(0);
        found.observe(0);
        assert_eq!(found.current(), 1);
    }

    #[tokio::test]
    async fn local_buckets_hold_the_share_and_check_only_takes_nothing() {
        let clock = ManualClock::new(1_000_000);
        let store = Arc::new(MemoryBackend::new(
            Arc::new(clock.clone()),
            MemoryOptions::default(),
        ));
        let fallback = LocalFallback::new(store, Arc::new(Replicas::fixed(4)));
        let hit = Hit::new("k", HUNDRED_PER_MINUTE, 1);
        let mut allowed = 0;
        for _ in 0..100 {
            if fallback.decide(std::slice::from_ref(&hit), false).await[0].allowed {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 25, "capacity 100 / 4 replicas");
        // 25 per minute each: one token per 2.4 s.
        clock.advance(2_400);
        let v = fallback.decide(std::slice::from_ref(&hit), true).await[0];
        assert!(v.allowed);
        assert_eq!(v.remaining, 1, "check-only took nothing");
        assert!(fallback.decide(std::slice::from_ref(&hit), false).await[0].allowed);
        assert!(!fallback.decide(std::slice::from_ref(&hit), false).await[0].allowed);
    }

    /// An always-charged hit (`charge: always`) is counted on the local bucket even when the
    /// request is already rejected, into debt.
    #[tokio::test]
    async fn an_always_charged_hit_lands_on_the_local_bucket_whatever_the_answer() {
        let clock = ManualClock::new(1_000_000);
        let store = Arc::new(MemoryBackend::new(
            Arc::new(clock.clone()),
            MemoryOptions::default(),
        ));
        let fallback = LocalFallback::new(store, Arc::new(Replicas::fixed(1)));
        let mut charge = Hit::new("k", HUNDRED_PER_MINUTE, 60);
        charge.demand.always = true;
        let v = fallback.decide(std::slice::from_ref(&charge), true).await[0];
        assert_eq!((v.allowed, v.granted), (true, 60), "taken though rejected");
        let v = fallback.decide(std::slice::from_ref(&charge), true).await[0];
        assert_eq!(
            (v.allowed, v.granted, v.remaining),
            (false, 60, 0),
            "into debt"
        );
        let check = Hit::new("k", HUNDRED_PER_MINUTE, 0);
        assert!(!fallback.decide(&[check], false).await[0].allowed);
    }
}
