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
//! missing on lookup and may be dropped at any time: by [`MemoryBackend::sweep`], by the sweeper
//! task, or when a shard needs room. A request that leaves its bucket full stores nothing at all.
//!
//! The store is bounded ([`MemoryOptions::max_buckets`], and each rule, the [`Hit::rule`] that
//! created a bucket, to [`MemoryOptions::max_buckets_per_rule`]), and a bucket that still counts
//! is never evicted to stay within the bounds: evicting it would reset a client at its limit to
//! a full bucket, which a flood of fresh values could then do at will. A new key that finds no
//! room once the settled buckets are dropped is refused: [`Backend::check_each`] fails that hit
//! with [`BackendError::Overloaded`], for its rule's failure policy to answer, and
//! [`MemoryBackend::refused_total`] counts it. With the per-rule bound, a flood of distinct
//! values reaching one rule (spoofed client addresses, random header values) fills only that
//! rule's share, so every other rule keeps storing new buckets.

mod shard;
mod slots;
#[cfg(test)]
mod tests;

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::algorithm::{self, Algorithm, Demand, State, Verdict};
use crate::backend::{Backend, BackendError, Hit, KeyPeek};
use crate::clock::SharedClock;

use shard::{Shard, Slot};

/// Size and layout of the in-memory store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Upper bound on stored buckets, so a flood of distinct keys cannot exhaust memory.
    /// Split evenly across shards; 0 is treated as 1.
    pub max_buckets: usize,
    /// Number of independently locked maps; capped at `max_buckets`, at least 1.
    pub shards: usize,
    /// Upper bound on stored buckets of one rule; `None`: only `max_buckets` applies (from
    /// settings it is always set: a quarter of `max_buckets` unless the flag says otherwise).
    /// Split across shards like `max_buckets`, with at least one per shard (so the effective
    /// bound is at least the shard count).
    pub max_buckets_per_rule: Option<usize>,
}

/// Independently locked maps of a store built from settings (not a flag).
const SHARDS: usize = 64;

/// Without `--memory-max-buckets-per-rule`, one rule may hold this fraction (1 / RULE_SHARE) of
/// `--memory-max-buckets`: a flood of distinct values reaching one rule fills its quarter, and
/// the rest of the store keeps room for every other rule.
const RULE_SHARE: usize = 4;

impl MemoryOptions {
    pub const DEFAULT_MAX_BUCKETS: usize = 1_000_000;

    /// A store of at most `max_buckets`, of which one rule may hold `max_buckets_per_rule`
    /// (`None`: a quarter of `max_buckets`), over the default shards.
    pub fn bounded(max_buckets: usize, max_buckets_per_rule: Option<usize>) -> Self {
        MemoryOptions {
            max_buckets,
            shards: SHARDS,
            max_buckets_per_rule: Some(
                max_buckets_per_rule
                    .unwrap_or(max_buckets / RULE_SHARE)
                    .max(1),
            ),
        }
    }
}

impl Default for MemoryOptions {
    /// A million buckets, a quarter of them for any one rule.
    fn default() -> Self {
        MemoryOptions::bounded(Self::DEFAULT_MAX_BUCKETS, None)
    }
}

/// Rate-limit state in this process's memory, with the same semantics as the Redis backend.
pub struct MemoryBackend {
    clock: SharedClock,
    shards: Box<[Mutex<Shard>]>,
    /// Picks a key's shard; independent of the maps' own hashers so a shard's keys do not cluster
    /// inside its map.
    router: RandomState,
    /// See [`MemoryBackend::refused_total`].
    refused: AtomicU64,
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
            refused: AtomicU64::new(0),
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

    /// Buckets that could not be stored since this backend was made: a new key found its shard
    /// or its rule's share at the bound with every bucket still counting, so its hit was
    /// answered by the failure policy ([`Backend::check_each`]) or not remembered
    /// ([`MemoryBackend::check_keeping_what_fits`]).
    pub fn refused_total(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Like [`Backend::check`], for a store that answers when another backend could not (the
    /// `local` failure policy's): a new bucket with no room is answered as the fresh bucket it
    /// is, and not remembered, as there is no further policy to answer it.
    pub fn check_keeping_what_fits(&self, hits: &[Hit]) -> Vec<Verdict> {
        self.decide(hits).0
    }

    /// Decides one request's hits atomically: every verdict, and the positions of the hits whose
    /// new bucket had no room (decided as a fresh bucket, not stored).
    fn decide(&self, hits: &[Hit]) -> (Vec<Verdict>, Vec<usize>) {
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
            .map(|(hit, &s)| read_state(&mut guards[guard_of(s)], hit, now_ms))
            .collect();
        let before = states.clone();
        let demands: Vec<Demand> = hits.iter().map(|h| h.demand).collect();
        let verdicts = algorithm::decide(now_ms, &demands, &mut states);

        // Stored keys are written first, so the sweep that makes room for a new key cannot drop
        // one of them (full again before this request) and then find no room for it.
        let mut new = Vec::new();
        let mut no_room = Vec::new();
        for (at, ((hit, &s), state)) in hits.iter().zip(&shard_of).zip(states).enumerate() {
            if let Some(State::InFlight(prior)) = &before[at] {
                let expiry = now_ms.saturating_add(hit.demand.params.unit_ms);
                let ledgers = &mut guards[guard_of(s)].ledgers;
                let slot = (prior, state.as_ref());
                if !ledgers.apply(&hit.key, hit.demand.holder, slot, (now_ms, expiry)) {
                    no_room.push(at);
                }
                continue;
            }
            let state = state.expect("decide returns a state for every key");
            let slot = Slot {
                state,
                full_at_ms: state.settled_at_ms(&hit.demand.params),
                rule: hit.rule,
            };
            if !guards[guard_of(s)].update(&hit.key, slot, now_ms) {
                new.push((at, slot));
            }
        }
        // A refused key only ever took from its own fresh bucket (a rejected demand leaves a
        // fresh bucket fresh, which needs no place), so the other verdicts stand as decided.
        let mut refused: Vec<usize> = new
            .into_iter()
            .filter(|&(at, slot)| {
                !guards[guard_of(shard_of[at])].insert(&hits[at].key, slot, now_ms)
            })
            .map(|(at, _)| at)
            .collect();
        refused.extend(no_room);
        if !refused.is_empty() {
            self.refused
                .fetch_add(refused.len() as u64, Ordering::Relaxed);
        }
        (verdicts, refused)
    }

    /// Reads one key under its shard's lock, as [`MemoryBackend::decide`] would, storing nothing.
    fn peek_one(&self, hit: &Hit) -> KeyPeek {
        let shard = lock(&self.shards[self.shard_index(&hit.key)]);
        let now_ms = self.clock.now_ms();
        let (state, settles_at) = if hit.demand.algorithm == Algorithm::InFlight {
            let slots = shard.ledgers.peek(&hit.key, now_ms);
            (slots.map(State::InFlight), slots.map(|s| s.last_expiry_ms))
        } else {
            (
                shard.state(&hit.key, now_ms),
                shard.settles_at(&hit.key, now_ms),
            )
        };
        drop(shard);
        let demand = &hit.demand;
        KeyPeek {
            now_ms,
            peek: algorithm::peek(now_ms, demand.algorithm, demand.params, state),
            stored: state.is_some(),
            ttl_ms: settles_at.map(|at| at - now_ms),
            foreign: false,
        }
    }

    /// Drops one key; true when it held state that still counted.
    fn reset_one(&self, hit: &Hit) -> bool {
        let mut shard = lock(&self.shards[self.shard_index(&hit.key)]);
        let now_ms = self.clock.now_ms();
        if hit.demand.algorithm == Algorithm::InFlight {
            return shard.ledgers.remove(&hit.key, now_ms);
        }
        let counted = shard.state(&hit.key, now_ms).is_some();
        shard.remove(&hit.key);
        counted
    }

    /// One outcome per hit: a hit whose new bucket had no room fails with
    /// [`BackendError::Overloaded`], for its rule's failure policy to answer.
    fn decide_each(&self, hits: &[Hit]) -> Vec<Result<Verdict, BackendError>> {
        let (verdicts, refused) = self.decide(hits);
        let mut outcomes: Vec<Result<Verdict, BackendError>> =
            verdicts.into_iter().map(Ok).collect();
        for at in refused {
            outcomes[at] = Err(BackendError::Overloaded(NO_ROOM.into()));
        }
        outcomes
    }
}

/// A hit's state as `now_ms` finds it: its bucket's, or an in-flight cap's slots as its holder
/// sees them.
fn read_state(shard: &mut Shard, hit: &Hit, now_ms: u64) -> Option<State> {
    if hit.demand.algorithm == Algorithm::InFlight {
        let holder = Some(hit.demand.holder);
        return Some(State::InFlight(
            shard.ledgers.view(&hit.key, holder, now_ms),
        ));
    }
    shard.state(&hit.key, now_ms)
}

/// Why a new bucket was refused.
const NO_ROOM: &str = "memory backend full: --memory-max-buckets or --memory-max-buckets-per-rule \
     reached and every stored bucket still counts hits";

impl Backend for MemoryBackend {
    fn check_each(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Vec<Result<Verdict, BackendError>>> + Send {
        std::future::ready(self.decide_each(hits))
    }

    fn name(&self) -> &'static str {
        "memory"
    }

    fn probe(&self) -> impl Future<Output = Result<(), BackendError>> + Send {
        std::future::ready(Ok(()))
    }

    fn peek(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Vec<Result<KeyPeek, BackendError>>> + Send {
        std::future::ready(hits.iter().map(|hit| Ok(self.peek_one(hit))).collect())
    }

    fn reset(&self, hits: &[Hit]) -> impl Future<Output = Vec<Result<bool, BackendError>>> + Send {
        std::future::ready(hits.iter().map(|hit| Ok(self.reset_one(hit))).collect())
    }
}

/// A panic while a shard was locked leaves its map intact (at worst one bucket's state is
/// stale), so later requests keep using it rather than failing forever.
fn lock(shard: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}
