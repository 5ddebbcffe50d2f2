//! The embedded in-memory backend: sharded buckets, idle eviction, a bound on live buckets.
//!
//! Buckets live in `shards` maps, each behind its own mutex, so requests for different clients
//! rarely contend and nothing global is locked per request. One request's buckets are decided
//! atomically: the distinct shards it touches are locked in ascending index order (so two requests
//! can never wait on each other in a cycle), [`algorithm::decide`] runs (each key by its own
//! algorithm), states are written back, and the locks are released.
//!
//! Each stored key remembers when its state settles: the bucket is full again, the window is
//! over, the arrival time has passed ([`State::settled_at_ms`]). From then on it is
//! indistinguishable from a missing key (a missing key has nothing counted), so it is treated as
//! missing on lookup and may be dropped at any time: by [`MemoryBackend::sweep`], by the sweeper task, or when a shard needs
//! room. A request that leaves its bucket full stores nothing at all.
//!
//! With [`MemoryOptions::max_buckets_per_rule`], each rule (the [`Hit::rule`] that created a
//! bucket) may hold only so many buckets: a new bucket of a rule at its bound evicts one of that
//! rule's own buckets, so a flood of distinct values reaching one rule (spoofed client
//! addresses, random header values) cannot evict the buckets of any other rule.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use indexmap::{IndexMap, IndexSet};

use crate::algorithm::{self, Demand, State, Verdict};
use crate::backend::{Backend, BackendError, Hit};
use crate::clock::SharedClock;
use crate::rule::RuleId;
use crate::settings::Settings;

/// Buckets looked at when a shard must evict one that is not yet full again.
const EVICTION_SAMPLE: usize = 8;

/// Size and layout of the in-memory store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Upper bound on stored buckets, so a flood of distinct keys cannot exhaust memory.
    /// Split evenly across shards; 0 is treated as 1.
    pub max_buckets: usize,
    /// Number of independently locked maps; capped at `max_buckets`, at least 1.
    pub shards: usize,
    /// Upper bound on stored buckets of one rule; `None`: only `max_buckets` applies. Split
    /// across shards like `max_buckets`, with at least one per shard (so the effective bound is
    /// at least the shard count).
    pub max_buckets_per_rule: Option<usize>,
}

/// Independently locked maps of a store built from settings (not a flag).
const SHARDS: usize = 64;

impl From<&Settings> for MemoryOptions {
    /// The memory backend's bounds, and the same for the `local` failure policy's buckets.
    fn from(settings: &Settings) -> Self {
        MemoryOptions {
            max_buckets: settings.memory_max_buckets,
            shards: SHARDS,
            max_buckets_per_rule: settings
                .security
                .memory_max_buckets_per_rule
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        }
    }
}

impl Default for MemoryOptions {
    /// `--memory-max-buckets` and `--memory-max-buckets-per-rule` at their defaults.
    fn default() -> Self {
        MemoryOptions::from(&Settings::defaults())
    }
}

/// One stored key.
#[derive(Clone, Copy, Debug)]
struct Slot {
    state: State,
    /// From this time on the state is as good as missing ([`State::settled_at_ms`]).
    full_at_ms: u64,
    /// The rule that created the bucket.
    rule: Option<RuleId>,
}

struct Shard {
    buckets: IndexMap<String, Slot>,
    /// This shard's share of `max_buckets`.
    capacity: usize,
    /// No bucket here is full again before this time (a lower bound: updates may raise the true
    /// minimum), so a shard at capacity skips its O(n) sweep when nothing could be swept.
    earliest_full_ms: u64,
    /// This shard's share of `max_buckets_per_rule`, if set.
    rule_capacity: Option<usize>,
    /// Positions in `buckets` of each rule's buckets (kept only with a `rule_capacity`), so a
    /// rule at its bound finds a victim among its own buckets in O(1).
    members: HashMap<Option<RuleId>, IndexSet<usize>>,
}

impl Shard {
    fn new(capacity: usize, rule_capacity: Option<usize>) -> Self {
        Shard {
            buckets: IndexMap::new(),
            capacity,
            earliest_full_ms: u64::MAX,
            rule_capacity,
            members: HashMap::new(),
        }
    }

    /// Removes the bucket at `index`; the last bucket moves into its place.
    fn remove_at(&mut self, index: usize) {
        let last = self.buckets.len() - 1;
        let Some((_, removed)) = self.buckets.swap_remove_index(index) else {
            return;
        };
        if self.rule_capacity.is_none() {
            return;
        }
        if let Some(set) = self.members.get_mut(&removed.rule) {
            set.swap_remove(&index);
            if set.is_empty() {
                self.members.remove(&removed.rule);
            }
        }
        if index != last {
            let moved = self.buckets[index].rule;
            if let Some(set) = self.members.get_mut(&moved) {
                set.swap_remove(&last);
                set.insert(index);
            }
        }
    }

    fn rebuild_members(&mut self) {
        if self.rule_capacity.is_none() {
            return;
        }
        self.members.clear();
        for (index, slot) in self.buckets.values().enumerate() {
            self.members.entry(slot.rule).or_default().insert(index);
        }
    }

    /// Frees a place for one more bucket of `rule` if it is at its bound, by evicting the one of
    /// its buckets closest to full (sampled). False when every candidate belongs to `request`.
    fn make_room_for_rule(&mut self, rule: Option<RuleId>, request: &[Hit]) -> bool {
        let Some(cap) = self.rule_capacity else {
            return true;
        };
        let Some(set) = self.members.get(&rule) else {
            return true;
        };
        if set.len() < cap {
            return true;
        }
        let len = set.len();
        let sampled = len > EVICTION_SAMPLE;
        let victim = (0..len.min(EVICTION_SAMPLE))
            .map(|i| {
                if sampled {
                    rand::random_range(0..len)
                } else {
                    i
                }
            })
            .filter_map(|i| set.get_index(i).copied())
            .filter_map(|pos| self.buckets.get_index(pos).map(|(k, s)| (pos, k, s)))
            .filter(|(_, k, _)| !request.iter().any(|hit| hit.key == **k))
            .min_by_key(|(_, _, slot)| slot.full_at_ms)
            .map(|(pos, _, _)| pos);
        match victim {
            Some(pos) => {
                self.remove_at(pos);
                true
            }
            None => false,
        }
    }

    /// The stored state of `key` as of `now_ms`; `None` (nothing counted) when missing or settled.
    fn state(&self, key: &str, now_ms: u64) -> Option<State> {
        self.buckets
            .get(key)
            .filter(|slot| slot.full_at_ms > now_ms)
            .map(|slot| slot.state)
    }

    /// Writes back a decided bucket. `request` holds every hit of the deciding request, none of
    /// which may be evicted to make room for another.
    fn store(&mut self, key: &str, slot: Slot, now_ms: u64, request: &[Hit]) {
        let full = slot.full_at_ms <= now_ms;
        if let Some((index, _, stored)) = self.buckets.get_full_mut(key) {
            if full {
                self.remove_at(index);
            } else {
                // The bucket stays counted under the rule that created it.
                *stored = Slot {
                    rule: stored.rule,
                    ..slot
                };
                self.earliest_full_ms = self.earliest_full_ms.min(slot.full_at_ms);
            }
            return;
        }
        if full || !self.make_room_for_rule(slot.rule, request) || !self.make_room(now_ms, request)
        {
            return;
        }
        let index = self.buckets.len();
        self.buckets.insert(key.to_owned(), slot);
        if self.rule_capacity.is_some() {
            self.members.entry(slot.rule).or_default().insert(index);
        }
        self.earliest_full_ms = self.earliest_full_ms.min(slot.full_at_ms);
    }

    /// Frees one place if the shard is at capacity. False only when every candidate belongs to
    /// the current request (a shard smaller than one request's keys).
    fn make_room(&mut self, now_ms: u64, request: &[Hit]) -> bool {
        if self.buckets.len() < self.capacity {
            return true;
        }
        self.sweep(now_ms);
        if self.buckets.len() < self.capacity {
            return true;
        }
        // Evicting a bucket resets it to full, so the bucket closest to full loses the least
        // information; sampling keeps this O(1) instead of scanning the shard.
        let len = self.buckets.len();
        let sampled = len > EVICTION_SAMPLE;
        let victim = (0..len.min(EVICTION_SAMPLE))
            .map(|i| {
                if sampled {
                    rand::random_range(0..len)
                } else {
                    i
                }
            })
            .filter_map(|i| {
                self.buckets
                    .get_index(i)
                    .map(|(k, slot)| (i, k, slot.full_at_ms))
            })
            .filter(|(_, k, _)| !request.iter().any(|hit| hit.key == **k))
            .min_by_key(|&(_, _, full_at)| full_at)
            .map(|(i, _, _)| i);
        match victim {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// Drops every bucket that is full again at `now_ms`; returns how many.
    fn sweep(&mut self, now_ms: u64) -> usize {
        if now_ms < self.earliest_full_ms {
            return 0;
        }
        let before = self.buckets.len();
        let mut earliest = u64::MAX;
        self.buckets.retain(|_, slot| {
            let live = slot.full_at_ms > now_ms;
            if live {
                earliest = earliest.min(slot.full_at_ms);
            }
            live
        });
        self.earliest_full_ms = earliest;
        let swept = before - self.buckets.len();
        if swept > 0 {
            self.rebuild_members();
        }
        swept
    }
}

/// Rate-limit state in this process's memory, with the same semantics as the Redis backend.
pub struct MemoryBackend {
    clock: SharedClock,
    shards: Box<[Mutex<Shard>]>,
    /// Picks a key's shard; independent of the maps' own hashers so a shard's keys do not cluster
    /// inside its map.
    router: RandomState,
}

impl MemoryBackend {
    pub fn new(clock: SharedClock, opts: MemoryOptions) -> Self {
        let max_buckets = opts.max_buckets.max(1);
        let count = opts.shards.clamp(1, max_buckets);
        let split = |total: usize, i: usize| total / count + usize::from(i < total % count);
        let shards = (0..count)
            .map(|i| {
                let rule_capacity = opts.max_buckets_per_rule.map(|cap| split(cap, i).max(1));
                Mutex::new(Shard::new(split(max_buckets, i), rule_capacity))
            })
            .collect();
        MemoryBackend {
            clock,
            shards,
            router: RandomState::new(),
        }
    }

    /// Buckets currently stored (some may already be full again and awaiting a sweep).
    pub fn live_buckets(&self) -> usize {
        self.shards.iter().map(|s| lock(s).buckets.len()).sum()
    }

    /// Removes the buckets that are full again; returns how many. Locks one shard at a time.
    pub fn sweep(&self) -> usize {
        (0..self.shards.len()).map(|i| self.sweep_shard(i)).sum()
    }

    /// Sweeps every `every` on the tokio runtime until this backend is dropped (the task holds
    /// only a weak reference) or the handle is aborted.
    pub fn spawn_sweeper(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let backend = Arc::downgrade(self);
        let every = every.max(Duration::from_millis(1));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(shards) = backend.upgrade().map(|b| b.shards.len()) else {
                    return;
                };
                let mut swept = 0;
                for i in 0..shards {
                    let Some(b) = backend.upgrade() else { return };
                    swept += b.sweep_shard(i);
                    drop(b);
                    // Let requests run between shards: a full sweep of a large store takes a while.
                    tokio::task::yield_now().await;
                }
                tracing::debug!(swept, "memory backend sweep");
            }
        })
    }

    fn sweep_shard(&self, index: usize) -> usize {
        let mut shard = lock(&self.shards[index]);
        let now_ms = self.clock.now_ms();
        shard.sweep(now_ms)
    }

    fn shard_index(&self, key: &str) -> usize {
        let hash = self.router.hash_one(key);
        // Multiply-shift maps the hash onto 0..len without a division.
        ((u128::from(hash) * self.shards.len() as u128) >> 64) as usize
    }

    /// Decides one request's hits atomically.
    fn decide(&self, hits: &[Hit]) -> Vec<Verdict> {
        debug_assert!(
            hits.iter()
                .enumerate()
                .all(|(i, a)| hits[..i].iter().all(|b| a.key != b.key)),
            "keys of one request must be distinct"
        );
        let shard_of: Vec<usize> = hits.iter().map(|h| self.shard_index(&h.key)).collect();
        let mut locked = shard_of.clone();
        locked.sort_unstable();
        locked.dedup();
        let mut guards: Vec<MutexGuard<'_, Shard>> =
            locked.iter().map(|&i| lock(&self.shards[i])).collect();
        let guard_of = |shard: usize| {
            locked
                .binary_search(&shard)
                .expect("every touched shard is locked")
        };

        // Read the clock under the locks, so a bucket's updates are stamped in the order they
        // were applied.
        let now_ms = self.clock.now_ms();
        let mut states: Vec<Option<State>> = hits
            .iter()
            .zip(&shard_of)
            .map(|(hit, &s)| guards[guard_of(s)].state(&hit.key, now_ms))
            .collect();
        let demands: Vec<Demand> = hits.iter().map(|h| h.demand).collect();
        let verdicts = algorithm::decide(now_ms, &demands, &mut states);

        for ((hit, &s), state) in hits.iter().zip(&shard_of).zip(states) {
            let state = state.expect("decide returns a state for every key");
            let slot = Slot {
                state,
                full_at_ms: state.settled_at_ms(&hit.demand.params),
                rule: hit.rule,
            };
            guards[guard_of(s)].store(&hit.key, slot, now_ms, hits);
        }
        verdicts
    }
}

impl Backend for MemoryBackend {
    fn check(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Result<Vec<Verdict>, BackendError>> + Send {
        std::future::ready(Ok(self.decide(hits)))
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn probe(&self) -> impl Future<Output = Result<(), BackendError>> + Send {
        std::future::ready(Ok(()))
    }
}

/// A panic while a shard was locked leaves its map intact (at worst one bucket's state is
/// stale), so later requests keep using it rather than failing forever.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::algorithm::BucketParams;
    use crate::clock::{Clock, ManualClock};

    /// 10 tokens, refilled 1 per 100 ms.
    const TEN: BucketParams = BucketParams {
        capacity: 10,
        requests_per_unit: 10,
        unit_ms: 1_000,
    };

    fn backend(opts: MemoryOptions) -> (MemoryBackend, ManualClock) {
        let clock = ManualClock::new(1_000_000);
        (MemoryBackend::new(Arc::new(clock.clone()), opts), clock)
    }

    fn small(max_buckets: usize, shards: usize) -> MemoryOptions {
        MemoryOptions {
            max_buckets,
            shards,
            max_buckets_per_rule: None,
        }
    }

    async fn check(b: &MemoryBackend, hits: &[Hit]) -> Vec<Verdict> {
        b.check(hits).await.expect("the memory backend never fails")
    }

    async fn one(b: &MemoryBackend, key: &str, params: BucketParams, tokens: u64) -> Verdict {
        check(b, &[Hit::new(key, params, tokens)]).await[0]
    }

    /// Whole tokens in `key` right now, read with a check-only hit (which takes nothing).
    async fn level(b: &MemoryBackend, key: &str, params: BucketParams) -> u64 {
        one(b, key, params, 0).await.remaining
    }

    /// `n` keys that the backend places in `n` different shards.
    fn keys_in_distinct_shards(b: &MemoryBackend, n: usize) -> Vec<String> {
        let mut seen = std::collections::HashSet::new();
        (0..)
            .map(|i| format!("k{i}"))
            .filter(|k| seen.insert(b.shard_index(k)))
            .take(n)
            .collect()
    }

    #[tokio::test]
    async fn token_bucket_semantics_through_the_trait() {
        let (b, clock) = backend(MemoryOptions::default());
        assert_eq!(b.name(), "memory");
        assert_eq!(b.probe().await, Ok(()));
        assert!(check(&b, &[]).await.is_empty());

        let v = one(&b, "a", TEN, 4).await;
        assert!(v.allowed);
        assert_eq!(
            (v.remaining, v.retry_after_ms, v.until_full_ms),
            (6, Some(0), 400)
        );
        let v = one(&b, "a", TEN, 7).await;
        assert!(!v.allowed);
        assert_eq!((v.remaining, v.retry_after_ms), (6, Some(100)));
        assert_eq!(one(&b, "a", TEN, 11).await.retry_after_ms, None);

        clock.advance(150);
        let v = one(&b, "a", TEN, 7).await;
        assert!(v.allowed, "1.5 tokens refilled");
        assert_eq!(v.remaining, 0);
        assert_eq!(level(&b, "a", TEN).await, 0);

        // Refunds are capped at capacity; a bucket refunded to full is no longer stored.
        let mut refund = Hit::new("a", TEN, 50);
        refund.demand.refund = true;
        assert_eq!(check(&b, &[refund]).await[0].remaining, 10);
        assert_eq!(b.live_buckets(), 0);

        // Check-only hits take nothing and store nothing for a full bucket.
        assert_eq!(one(&b, "fresh", TEN, 0).await.remaining, 10);
        assert_eq!(b.live_buckets(), 0);

        // The clock stepping back refills nothing.
        one(&b, "a", TEN, 5).await;
        clock.set(999_000);
        assert_eq!(level(&b, "a", TEN).await, 5);
        clock.set(1_000_150);
        assert_eq!(level(&b, "a", TEN).await, 5);
    }

    /// Each algorithm's key is kept exactly while it holds anything and then swept: a fixed
    /// window until it ends, a sliding window until its count has aged out of the next window,
    /// a GCRA key until its arrival time.
    #[tokio::test]
    async fn every_algorithm_is_dropped_once_its_state_settles() {
        use crate::algorithm::Algorithm;

        let (b, clock) = backend(small(1_000, 4));
        // The clock starts 1_000_000 ms after the epoch: on a second boundary.
        let hit = |key: &str, algorithm| Hit::new(key, TEN, 4).using(algorithm);
        let v = check(
            &b,
            &[
                hit("fw", Algorithm::FixedWindow),
                hit("sw", Algorithm::SlidingWindow),
                hit("gcra", Algorithm::Gcra),
            ],
        )
        .await;
        assert!(v.iter().all(|v| v.allowed && v.remaining == 6), "{v:?}");
        assert_eq!(b.live_buckets(), 3);
        // GCRA: 4 hits at one per 100 ms are paid off after 400 ms.
        clock.advance(400);
        assert_eq!(b.sweep(), 1);
        // The fixed window ends after 1000 ms.
        clock.advance(600);
        assert_eq!(b.sweep(), 1);
        let again = check(&b, &[Hit::new("fw", TEN, 0).using(Algorithm::FixedWindow)]).await;
        assert_eq!(again[0].remaining, 10, "a new window");
        // The sliding window still weighs the 4 over the next window, then forgets them.
        let sliding = check(
            &b,
            &[Hit::new("sw", TEN, 0).using(Algorithm::SlidingWindow)],
        )
        .await;
        assert_eq!(sliding[0].remaining, 6);
        clock.advance(999);
        assert_eq!(b.sweep(), 0);
        clock.advance(1);
        assert_eq!(b.sweep(), 1);
        assert_eq!(b.live_buckets(), 0);
        // A check on an empty window stores nothing.
        check(&b, &[Hit::new("fw", TEN, 0).using(Algorithm::FixedWindow)]).await;
        assert_eq!(b.live_buckets(), 0);
    }

    #[tokio::test]
    async fn rejected_request_takes_nothing_from_any_bucket() {
        let (b, _clock) = backend(MemoryOptions::default());
        let keys = keys_in_distinct_shards(&b, 3);
        one(&b, &keys[1], TEN, 8).await;
        let hits: Vec<Hit> = keys.iter().map(|k| Hit::new(k.as_str(), TEN, 3)).collect();
        let verdicts = check(&b, &hits).await;
        assert_eq!(
            verdicts.iter().map(|v| v.allowed).collect::<Vec<_>>(),
            [true, false, true]
        );
        for (key, expected) in keys.iter().zip([10, 2, 10]) {
            assert_eq!(level(&b, key, TEN).await, expected, "{key}");
        }
        // A short shadow bucket does not reject, and is not taken from.
        let mut hits = hits;
        hits[1].demand.shadow = true;
        let verdicts = check(&b, &hits).await;
        assert!(verdicts[0].allowed && !verdicts[1].allowed && verdicts[2].allowed);
        for (key, expected) in keys.iter().zip([7, 2, 7]) {
            assert_eq!(level(&b, key, TEN).await, expected, "{key}");
        }
    }

    #[test]
    fn shards_split_the_bound_exactly() {
        for (max, shards, count) in [
            (1_000_000, 64, 64),
            (10, 3, 3),
            (3, 64, 3),
            (0, 0, 1),
            (5, 0, 1),
        ] {
            let (b, _) = backend(small(max, shards));
            assert_eq!(b.shards.len(), count);
            let total: usize = b.shards.iter().map(|s| lock(s).capacity).sum();
            assert_eq!(total, max.max(1), "max {max}, shards {shards}");
        }
    }

    #[tokio::test]
    async fn full_again_buckets_are_swept() {
        let (b, clock) = backend(small(1_000, 4));
        one(&b, "drained", TEN, 10).await;
        one(&b, "sipped", TEN, 1).await;
        assert_eq!(b.live_buckets(), 2);
        assert_eq!(b.sweep(), 0);

        clock.advance(100);
        assert_eq!(
            b.sweep(),
            1,
            "the bucket that was one token short is full again"
        );
        assert_eq!(b.live_buckets(), 1);
        clock.advance(899);
        assert_eq!(b.sweep(), 0);
        assert_eq!(level(&b, "drained", TEN).await, 9);
        one(&b, "later", TEN, 10).await;
        clock.advance(1);
        // Full again: still stored, read as full, and dropped by the request that found it full.
        assert_eq!(b.live_buckets(), 2);
        assert_eq!(level(&b, "drained", TEN).await, 10);
        assert_eq!(b.live_buckets(), 1);
        clock.advance(1_000);
        assert_eq!(b.sweep(), 1);
        assert_eq!(b.live_buckets(), 0);
        assert_eq!(level(&b, "later", TEN).await, 10);
    }

    #[tokio::test]
    async fn full_shard_drops_full_again_buckets_first() {
        let (b, clock) = backend(small(4, 1));
        for (key, cost) in [("a", 5), ("b", 1), ("c", 6), ("d", 7)] {
            one(&b, key, TEN, cost).await;
        }
        clock.advance(100);
        // "b" is full again; making room for "e" drops it and keeps every other state.
        one(&b, "e", TEN, 8).await;
        assert_eq!(b.live_buckets(), 4);
        let mut keys: Vec<String> = lock(&b.shards[0]).buckets.keys().cloned().collect();
        keys.sort_unstable();
        assert_eq!(keys, ["a", "c", "d", "e"]);
        for (key, expected) in [("a", 6), ("c", 5), ("d", 4), ("e", 2)] {
            assert_eq!(level(&b, key, TEN).await, expected, "{key}");
        }
    }

    #[tokio::test]
    async fn full_shard_evicts_the_bucket_closest_to_full() {
        let (b, _clock) = backend(small(4, 1));
        for (key, cost) in [("a", 5), ("b", 2), ("c", 6), ("d", 7)] {
            one(&b, key, TEN, cost).await;
        }
        // Nothing is full again; "b" (2 tokens short) is closest to full and is reset.
        one(&b, "e", TEN, 8).await;
        assert_eq!(b.live_buckets(), 4);
        assert!(lock(&b.shards[0]).buckets.get("b").is_none());
        for (key, expected) in [("a", 5), ("b", 10), ("c", 4), ("d", 3), ("e", 2)] {
            assert_eq!(level(&b, key, TEN).await, expected, "{key}");
        }
    }

    #[tokio::test]
    async fn request_never_evicts_its_own_buckets() {
        let (b, _clock) = backend(small(2, 1));
        one(&b, "old", TEN, 9).await;
        let hits = [
            Hit::new("x", TEN, 1),
            Hit::new("y", TEN, 5),
            Hit::new("z", TEN, 3),
        ];
        assert!(check(&b, &hits).await.iter().all(|v| v.allowed));
        // Room for two: "x" evicts "old", "y" then has only request keys to evict, so the later
        // keys are not stored (they read as full) while "x" keeps its state.
        assert_eq!(b.live_buckets(), 2);
        let shard = lock(&b.shards[0]);
        assert!(shard.buckets.contains_key("x"));
        assert!(!shard.buckets.contains_key("old"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn distinct_key_flood_never_exceeds_the_bound() {
        let (b, clock) = backend(small(100, 8));
        let b = Arc::new(b);
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let b = Arc::clone(&b);
                tokio::spawn(async move {
                    for i in 0..2_000 {
                        let key = format!("flood-{t}-{i}");
                        let hits = [Hit::new(key.as_str(), TEN, 1 + i % 9)];
                        assert!(b.check(&hits).await.unwrap()[0].allowed);
                        assert!(b.live_buckets() <= 100);
                    }
                })
            })
            .collect();
        for (step, task) in tasks.into_iter().enumerate() {
            clock.advance(step as u64 * 7);
            task.await.unwrap();
        }
        assert_eq!(b.live_buckets(), 100);
        for max in [1, 3] {
            let (tiny, _) = backend(small(max, 64));
            for i in 0..50 {
                one(&tiny, &format!("k{i}"), TEN, 1).await;
                assert!(tiny.live_buckets() <= max);
            }
        }
    }

    fn ruled(key: &str, rule: u32, tokens: u64) -> Hit {
        let mut hit = Hit::new(key, TEN, tokens);
        hit.rule = Some(RuleId(rule));
        hit
    }

    /// Buckets stored per rule, and a check that the per-rule index matches the maps.
    fn per_rule(b: &MemoryBackend) -> HashMap<Option<RuleId>, usize> {
        let mut counts = HashMap::new();
        for shard in b.shards.iter() {
            let shard = lock(shard);
            let mut expected: HashMap<Option<RuleId>, IndexSet<usize>> = HashMap::new();
            for (i, slot) in shard.buckets.values().enumerate() {
                expected.entry(slot.rule).or_default().insert(i);
                *counts.entry(slot.rule).or_insert(0) += 1;
            }
            if shard.rule_capacity.is_some() {
                assert_eq!(shard.members.len(), expected.len());
                for (rule, set) in &expected {
                    let mut have: Vec<usize> = shard.members[rule].iter().copied().collect();
                    let mut want: Vec<usize> = set.iter().copied().collect();
                    have.sort_unstable();
                    want.sort_unstable();
                    assert_eq!(have, want, "positions of {rule:?}");
                }
            } else {
                assert!(shard.members.is_empty());
            }
        }
        counts
    }

    #[tokio::test]
    async fn a_flooded_rule_evicts_only_its_own_buckets() {
        let (b, _clock) = backend(MemoryOptions {
            max_buckets_per_rule: Some(5),
            ..small(100, 1)
        });
        for key in ["b1", "b2", "b3"] {
            check(&b, &[ruled(key, 2, 4)]).await;
        }
        for i in 0..200 {
            let v = check(&b, &[ruled(&format!("flood-{i}"), 1, 1 + i % 9)]).await;
            assert!(v[0].allowed);
            let counts = per_rule(&b);
            assert!(counts[&Some(RuleId(1))] <= 5);
        }
        let counts = per_rule(&b);
        assert_eq!(counts[&Some(RuleId(1))], 5);
        assert_eq!(counts[&Some(RuleId(2))], 3);
        for key in ["b1", "b2", "b3"] {
            let mut probe = ruled(key, 2, 0);
            probe.demand.tokens = 0;
            assert_eq!(
                check(&b, &[probe]).await[0].remaining,
                6,
                "{key} kept its state"
            );
        }
        // Without a per-rule bound the same flood pushes the other rule out.
        let (b, _clock) = backend(small(100, 1));
        for key in ["b1", "b2", "b3"] {
            check(&b, &[ruled(key, 2, 4)]).await;
        }
        for i in 0..2_000 {
            check(&b, &[ruled(&format!("flood-{i}"), 1, 9)]).await;
        }
        assert_eq!(per_rule(&b).get(&Some(RuleId(2))), None);
    }

    #[tokio::test]
    async fn per_rule_bound_is_split_across_shards_and_index_stays_consistent() {
        let (b, clock) = backend(MemoryOptions {
            max_buckets_per_rule: Some(40),
            ..small(1_000, 8)
        });
        for round in 0..3u64 {
            for i in 0..600u64 {
                let rule = (i % 3) as u32;
                let hits = [
                    ruled(&format!("r{round}-{i}"), rule, 1 + i % 10),
                    ruled(&format!("shared-{}", i % 7), 9, 1),
                ];
                check(&b, &hits).await;
                if i % 50 == 0 {
                    clock.advance(37);
                    b.sweep();
                }
            }
            // Time stands still: every shard's share of every rule fills up.
            for i in 0..900u64 {
                check(
                    &b,
                    &[ruled(&format!("still{round}-{i}"), (i % 3) as u32, 5)],
                )
                .await;
            }
            let counts = per_rule(&b);
            for rule in 0..3 {
                assert_eq!(
                    counts[&Some(RuleId(rule))],
                    40,
                    "rule {rule}, round {round}"
                );
            }
            assert!(b.live_buckets() <= 1_000);
            clock.advance(400);
        }
        clock.advance(10_000);
        b.sweep();
        assert!(per_rule(&b).is_empty());
        // Fewer allowed buckets than shards: one per shard still.
        let (tiny, _) = backend(MemoryOptions {
            max_buckets_per_rule: Some(2),
            ..small(1_000, 8)
        });
        for i in 0..500 {
            check(&tiny, &[ruled(&format!("k{i}"), 1, 5)]).await;
        }
        assert_eq!(per_rule(&tiny)[&Some(RuleId(1))], 8);
    }

    /// Many tasks on one key, with the clock moving: the bucket never grants more than its
    /// capacity plus what refilled.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_hits_on_one_key_never_over_grant() {
        let (b, clock) = backend(MemoryOptions::default());
        let b = Arc::new(b);
        let start = clock.now_ms();
        let granted = Arc::new(AtomicU64::new(0));
        let ticking = {
            let clock = clock.clone();
            tokio::spawn(async move {
                for _ in 0..300 {
                    clock.advance(1);
                    tokio::task::yield_now().await;
                }
            })
        };
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let (b, granted) = (Arc::clone(&b), Arc::clone(&granted));
                tokio::spawn(async move {
                    for i in 0..500u64 {
                        let tokens = 1 + (t + i) % 3;
                        if b.check(&[Hit::new("hot", TEN, tokens)]).await.unwrap()[0].allowed {
                            granted.fetch_add(tokens, Ordering::Relaxed);
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        ticking.await.unwrap();
        let elapsed = clock.now_ms() - start;
        let bound = TEN.capacity as f64 + TEN.tokens_over(elapsed as f64);
        let granted = granted.load(Ordering::Relaxed);
        assert!(granted as f64 <= bound, "granted {granted} > {bound}");
        assert!(
            granted >= TEN.capacity - 2,
            "the full bucket was spent: {granted}"
        );
    }

    /// With the clock frozen, lost updates would show up as more than the capacity granted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_hits_on_a_frozen_clock_grant_exactly_capacity() {
        let (b, _clock) = backend(MemoryOptions::default());
        let b = Arc::new(b);
        let big = BucketParams {
            capacity: 1_000,
            ..TEN
        };
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let b = Arc::clone(&b);
                tokio::spawn(async move {
                    let mut granted = 0;
                    for _ in 0..200 {
                        if b.check(&[Hit::new("hot", big, 1)]).await.unwrap()[0].allowed {
                            granted += 1;
                        }
                        tokio::task::yield_now().await;
                    }
                    granted
                })
            })
            .collect();
        let mut granted = 0;
        for task in tasks {
            granted += task.await.unwrap();
        }
        assert_eq!(granted, 1_000);
    }

    /// Requests spanning several shards, in both key orders, decide all-or-nothing and never
    /// deadlock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn multi_shard_requests_are_atomic() {
        let (b, _clock) = backend(MemoryOptions::default());
        let b = Arc::new(b);
        let keys = keys_in_distinct_shards(&b, 3);
        let params = BucketParams {
            capacity: 300,
            ..TEN
        };
        // Each task sends one pair of keys, in one order, cost 1 each.
        let pairs = [(0, 1), (1, 0), (1, 2), (2, 1), (0, 2), (2, 0)];
        let tasks: Vec<_> = pairs
            .iter()
            .cycle()
            .take(12)
            .map(|&(x, y)| {
                let b = Arc::clone(&b);
                let hits = [
                    Hit::new(keys[x].as_str(), params, 1),
                    Hit::new(keys[y].as_str(), params, 1),
                ];
                tokio::spawn(async move {
                    let mut taken = [0u64; 3];
                    for _ in 0..200 {
                        let v = b.check(&hits).await.unwrap();
                        if v.iter().all(|v| v.allowed) {
                            taken[x] += 1;
                            taken[y] += 1;
                        }
                        tokio::task::yield_now().await;
                    }
                    taken
                })
            })
            .collect();
        let mut taken = [0u64; 3];
        let all = tokio::time::timeout(Duration::from_secs(60), futures::future::join_all(tasks))
            .await
            .expect("no deadlock");
        for t in all {
            for (sum, n) in taken.iter_mut().zip(t.unwrap()) {
                *sum += n;
            }
        }
        for (key, taken) in keys.iter().zip(taken) {
            assert!(taken <= 300);
            assert_eq!(level(&b, key, params).await, 300 - taken, "{key}");
        }
        assert!(
            taken.iter().sum::<u64>() >= 2 * 300,
            "the buckets were contended to empty"
        );
    }

    #[tokio::test]
    async fn sweeper_removes_full_buckets_and_stops_when_the_backend_is_dropped() {
        let (b, clock) = backend(small(1_000, 4));
        let b = Arc::new(b);
        let sweeper = b.spawn_sweeper(Duration::from_millis(5));
        for i in 0..20 {
            one(&b, &format!("k{i}"), TEN, 3).await;
        }
        assert_eq!(b.live_buckets(), 20);
        clock.advance(300);
        tokio::time::timeout(Duration::from_secs(30), async {
            while b.live_buckets() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the sweeper empties the store");
        drop(b);
        tokio::time::timeout(Duration::from_secs(30), sweeper)
            .await
            .expect("the sweeper stops once the backend is gone")
            .unwrap();
    }
}
