//! Token leases: tokens a replica took from the shared backend ahead of need, spent locally.
//!
//! A rule with `lease: B` makes the limiter take up to `B` tokens in the one backend call a
//! request needs anyway ([`crate::algorithm::Demand::lease`]); the tokens beyond the request's own
//! are kept here, per bucket key, and pay the next requests of that key with no backend call.
//! Tokens leave the shared bucket before they are spent, so a lease never admits more than the
//! bucket gave; it only shifts when: a token taken at `t` is spent by `t + lifetime` at the
//! latest. Older ones are not spent: [`LeaseStore::sweep`] hands them back as refunds, and
//! [`LeaseStore::drain`] hands back everything on shutdown.
//!
//! The store is a fixed number of mutex-guarded shards of a hash map (a key's shard by hash), so
//! concurrent requests on different keys rarely share a lock; paying from an existing lease looks
//! the key up by `&str` and allocates nothing. It holds at most `max_keys` keys: a new key evicts
//! only a lease with nothing in it, and when there is none it is not leased (its requests go to
//! the backend as without `lease`), so eviction never loses or strands tokens.
//!
//! A call dropped between reserving and settling (its client went away while the backend was
//! asked) hands what it took from a lease being refilled back to that lease
//! ([`LeaseStore::abandon`], from the limiter's drop guard); tokens a lease paid in full, and
//! those the backend granted meanwhile, are lost: the bucket gets them back by refill only
//! (under-admission, never over).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::algorithm::Demand;
use crate::backend::Hit;
use crate::rule::RuleId;

/// Shards of the map; a power of two well above the cores a replica has.
const SHARDS: usize = 64;
/// Entries a new key looks at for an empty lease to evict when its shard is full.
const EVICTION_PROBES: usize = 8;

/// How many keys a replica leases for at most, and how long a lease may be spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseOptions {
    pub max_keys: usize,
    pub lifetime_ms: u64,
}

impl LeaseOptions {
    pub const DEFAULT_MAX_KEYS: usize = 100_000;
    /// How long leased tokens may be spent locally (a lifetime must be above zero).
    pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(1);
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            max_keys: Self::DEFAULT_MAX_KEYS,
            lifetime_ms: Self::DEFAULT_LIFETIME.as_millis() as u64,
        }
    }
}

/// What the shared bucket said at the last refill, reported with locally paid answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Remote {
    pub remaining: u64,
    pub until_full_ms: u64,
}

/// What a replica holds of one key's lease ([`LeaseStore::holding`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding {
    /// Tokens that may still be spent here.
    pub tokens: u64,
    /// ms until they expire (0 with no tokens).
    pub expires_in_ms: u64,
    /// Expired tokens waiting to be handed back.
    pub stale: u64,
    /// Backend calls in flight that will refill the lease.
    pub refilling: u32,
}

/// The answer to [`LeaseStore::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// The lease paid every token; `left` remain in it.
    Paid {
        left: u64,
        expires_ms: u64,
        remote: Remote,
    },
    /// The lease could not pay in full: it gave all it had (`taken`, fewer than asked) and the
    /// rest must come from the backend. `refill`: the key has a place in the store, so the
    /// backend call may be a lease take, followed by [`LeaseStore::refilled`] or
    /// [`LeaseStore::abandon`]. (A lease emptied meanwhile may be evicted; a refill that finds it
    /// gone hands its tokens back through the next sweep.)
    Short {
        taken: u64,
        expires_ms: u64,
        refill: bool,
    },
}

/// How the bucket is asked to take tokens back: its algorithm, shape and rule.
#[derive(Clone, Copy, Debug)]
struct Origin {
    demand: Demand,
    rule: Option<RuleId>,
}

impl Origin {
    fn of(hit: &Hit) -> Origin {
        Origin {
            demand: hit.demand,
            rule: hit.rule,
        }
    }

    fn refund(&self, key: String, tokens: u64) -> Hit {
        Hit {
            key,
            demand: Demand {
                tokens,
                refund: true,
                shadow: false,
                quota: false,
                lease: 0,
                holder: 0,
                ..self.demand
            },
            rule: self.rule,
        }
    }
}

struct Lease {
    /// Tokens that may still be spent, until `expires_ms`.
    left: u64,
    expires_ms: u64,
    /// Expired tokens waiting to be handed back.
    stale: u64,
    remote: Remote,
    origin: Origin,
    /// Backend calls in flight that will refill this lease: the sweep and eviction keep a lease
    /// being refilled even while it is empty and expired (a new one is both), so the refill
    /// lands in it instead of being handed back as an orphan and the next request paying for
    /// another.
    refilling: u32,
}

impl Lease {
    /// Moves expired tokens to `stale`.
    fn age(&mut self, now_ms: u64) {
        if self.left > 0 && self.expires_ms <= now_ms {
            self.stale = self.stale.saturating_add(self.left);
            self.left = 0;
        }
    }

    fn is_empty(&self) -> bool {
        self.left == 0 && self.stale == 0
    }

    /// Adds `tokens` that expire at `expires_ms`. The lease keeps the earliest expiry of what it
    /// holds, so no token outlives its own lifetime (some may be returned early).
    fn add(&mut self, tokens: u64, expires_ms: u64, now_ms: u64) {
        if tokens == 0 {
            return;
        }
        if expires_ms <= now_ms {
            self.stale = self.stale.saturating_add(tokens);
            return;
        }
        self.expires_ms = if self.left == 0 {
            expires_ms
        } else {
            self.expires_ms.min(expires_ms)
        };
        self.left = self.left.saturating_add(tokens);
    }
}

#[derive(Default)]
struct Shard {
    leases: HashMap<String, Lease>,
    /// Tokens of leases that were gone when their refill came back (evicted while empty, or
    /// drained at shutdown), waiting to be handed back.
    orphans: Vec<Hit>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
struct Counters {
    local: AtomicU64,
    refills: AtomicU64,
    returned: AtomicU64,
}

/// The leases of one replica.
pub struct LeaseStore {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    per_shard: usize,
    lifetime_ms: u64,
    counters: Counters,
}

impl LeaseStore {
    pub fn new(options: LeaseOptions) -> LeaseStore {
        LeaseStore {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            per_shard: options.max_keys.div_ceil(SHARDS).max(1),
            lifetime_ms: options.lifetime_ms,
            counters: Counters::default(),
        }
    }

    /// Most keys the store holds (`--lease-max-keys`, rounded up to whole shards).
    pub fn capacity(&self) -> usize {
        self.per_shard * SHARDS
    }

    pub fn lifetime_ms(&self) -> u64 {
        self.lifetime_ms
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, Shard> {
        let index = self.hasher.hash_one(key) as usize % SHARDS;
        // A panic under the lock leaves counts that are still whole numbers; keep serving.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Pays `hit`'s tokens from its key's lease if the lease holds them all; otherwise takes
    /// what it holds and says whether the backend call may refill it.
    pub fn reserve(&self, hit: &Hit, now_ms: u64) -> Reservation {
        let tokens = hit.demand.tokens;
        let mut shard = self.shard(&hit.key);
        if let Some(lease) = shard.leases.get_mut(hit.key.as_str()) {
            lease.age(now_ms);
            lease.origin = Origin::of(hit);
            if lease.left >= tokens {
                lease.left -= tokens;
                return Reservation::Paid {
                    left: lease.left,
                    expires_ms: lease.expires_ms,
                    remote: lease.remote,
                };
            }
            let taken = std::mem::take(&mut lease.left);
            lease.refilling = lease.refilling.saturating_add(1);
            return Reservation::Short {
                taken,
                expires_ms: lease.expires_ms,
                refill: true,
            };
        }
        let refill = shard.leases.len() < self.per_shard || evict_one(&mut shard);
        if refill {
            shard.leases.insert(
                hit.key.clone(),
                Lease {
                    left: 0,
                    expires_ms: now_ms,
                    stale: 0,
                    remote: Remote::default(),
                    origin: Origin::of(hit),
                    refilling: 1,
                },
            );
        }
        Reservation::Short {
            taken: 0,
            expires_ms: now_ms,
            refill,
        }
    }

    /// What the lease of `key` holds at `now_ms`, read only.
    pub fn holding(&self, key: &str, now_ms: u64) -> Option<Holding> {
        let shard = self.shard(key);
        let lease = shard.leases.get(key)?;
        let live = lease.expires_ms > now_ms;
        let (tokens, expired) = if live {
            (lease.left, 0)
        } else {
            (0, lease.left)
        };
        Some(Holding {
            tokens,
            expires_in_ms: if tokens > 0 {
                lease.expires_ms - now_ms
            } else {
                0
            },
            stale: lease.stale.saturating_add(expired),
            refilling: lease.refilling,
        })
    }

    /// Drops the lease of `key` with its tokens, spendable and stale, not handed back: the
    /// bucket they came from was reset. A refill in flight finds no lease and hands its tokens
    /// back to the fresh bucket, which caps them at its capacity.
    pub fn forget(&self, key: &str, now_ms: u64) -> Option<Holding> {
        let held = self.holding(key, now_ms);
        self.shard(key).leases.remove(key);
        held
    }

    /// Gives tokens of a [`Reservation::Paid`] back: the request was rejected after all.
    pub fn put_back(&self, key: &str, tokens: u64, expires_ms: u64, now_ms: u64) {
        let mut shard = self.shard(key);
        if let Some(lease) = shard.leases.get_mut(key) {
            lease.add(tokens, expires_ms, now_ms);
        }
    }

    /// Ends a refilling [`Reservation::Short`] whose backend call took `tokens` more for the
    /// lease (0 when the bucket had no more), all new, so they expire a lifetime from now.
    /// Returns what the lease holds now.
    pub fn refilled(&self, hit: &Hit, tokens: u64, remote: Remote, now_ms: u64) -> u64 {
        self.counters.refills.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shard(&hit.key);
        match shard.leases.get_mut(hit.key.as_str()) {
            Some(lease) => {
                lease.refilling = lease.refilling.saturating_sub(1);
                lease.remote = remote;
                lease.add(tokens, now_ms.saturating_add(self.lifetime_ms), now_ms);
                lease.left
            }
            None => {
                if tokens > 0 {
                    let origin = Origin::of(hit);
                    shard.orphans.push(origin.refund(hit.key.clone(), tokens));
                }
                0
            }
        }
    }

    /// Ends a [`Reservation::Short`] that took nothing from the backend (rejected, failed, not
    /// asked): the `taken` tokens go back into the lease.
    pub fn abandon(&self, key: &str, taken: u64, expires_ms: u64, now_ms: u64) {
        let mut shard = self.shard(key);
        if let Some(lease) = shard.leases.get_mut(key) {
            lease.refilling = lease.refilling.saturating_sub(1);
            lease.add(taken, expires_ms, now_ms);
        }
    }

    /// Counts hits paid locally and not given back.
    pub fn note_local(&self, hits: u64) {
        self.counters.local.fetch_add(hits, Ordering::Relaxed);
    }

    /// Refunds for every expired lease (one hit per key), and forgets leases with nothing in
    /// them that expired; the caller sends the refunds to the backend.
    pub fn sweep(&self, now_ms: u64) -> Vec<Hit> {
        self.collect(|lease| {
            lease.age(now_ms);
            lease.expires_ms <= now_ms && lease.refilling == 0
        })
    }

    /// Refunds for every token of every lease, leaving the store empty of tokens: shutdown.
    pub fn drain(&self) -> Vec<Hit> {
        self.collect(|lease| {
            lease.stale = lease.stale.saturating_add(std::mem::take(&mut lease.left));
            true
        })
    }

    /// Refunds the stale tokens of every lease after `prepare`; drops the empty leases for
    /// which it returned true.
    fn collect(&self, mut prepare: impl FnMut(&mut Lease) -> bool) -> Vec<Hit> {
        let mut refunds = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            refunds.append(&mut shard.orphans);
            shard.leases.retain(|key, lease| {
                let droppable = prepare(lease);
                if lease.stale > 0 {
                    let tokens = std::mem::take(&mut lease.stale);
                    refunds.push(lease.origin.refund(key.clone(), tokens));
                }
                !(droppable && lease.is_empty())
            });
        }
        refunds
    }

    /// Counts tokens the backend took back.
    pub fn note_returned(&self, tokens: u64) {
        self.counters.returned.fetch_add(tokens, Ordering::Relaxed);
    }

    /// Keys with a lease (spendable, stale or being refilled).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .leases
                    .len()
            })
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens that may be spent locally right now, over all keys (tests and debugging).
    pub fn tokens(&self, now_ms: u64) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                let shard = s.lock().unwrap_or_else(PoisonError::into_inner);
                shard
                    .leases
                    .values()
                    .filter(|l| l.expires_ms > now_ms)
                    .map(|l| l.left)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Hits paid from a lease (`sluice_lease_local_total`).
    pub fn local_total(&self) -> u64 {
        self.counters.local.load(Ordering::Relaxed)
    }

    /// Lease takes sent to the backend that came back taken (`sluice_lease_refill_total`).
    pub fn refill_total(&self) -> u64 {
        self.counters.refills.load(Ordering::Relaxed)
    }

    /// Tokens handed back to the backend, expired or at shutdown
    /// (`sluice_lease_returned_tokens_total`).
    pub fn returned_total(&self) -> u64 {
        self.counters.returned.load(Ordering::Relaxed)
    }
}

/// Removes one lease with nothing in it from a full shard, if one of the first few is.
fn evict_one(shard: &mut Shard) -> bool {
    let victim = shard
        .leases
        .iter()
        .take(EVICTION_PROBES)
        .find(|(_, lease)| lease.is_empty() && lease.refilling == 0)
        .map(|(key, _)| key.clone());
    match victim {
        Some(key) => {
            shard.leases.remove(&key);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::BucketParams;

    const P: BucketParams = BucketParams {
        capacity: 100,
        requests_per_unit: 100,
        unit_ms: 60_000,
    };

    fn hit(key: &str, tokens: u64) -> Hit {
        Hit::new(key, P, tokens)
    }

    fn store(max_keys: usize) -> LeaseStore {
        LeaseStore::new(LeaseOptions {
            max_keys,
            lifetime_ms: 1_000,
        })
    }

    fn remote(remaining: u64) -> Remote {
        Remote {
            remaining,
            until_full_ms: 0,
        }
    }

    /// A first request finds nothing, refills 9; the next 9 are paid locally; the 10th is short.
    #[test]
    fn refill_then_pay_locally_until_empty() {
        let s = store(100);
        let first = s.reserve(&hit("k", 1), 0);
        assert_eq!(
            first,
            Reservation::Short {
                taken: 0,
                expires_ms: 0,
                refill: true
            }
        );
        s.refilled(&hit("k", 1), 9, remote(90), 0);
        for left in (0..9).rev() {
            match s.reserve(&hit("k", 1), 10) {
                Reservation::Paid {
                    left: l, remote: r, ..
                } => {
                    assert_eq!((l, r.remaining), (left, 90));
                }
                other => panic!("expected a local payment, got {other:?}"),
            }
        }
        assert!(matches!(
            s.reserve(&hit("k", 1), 10),
            Reservation::Short { taken: 0, .. }
        ));
        assert_eq!(s.refill_total(), 1);
    }

    /// A demand larger than the lease takes what is there; abandoning gives it back.
    #[test]
    fn short_reservation_takes_all_and_abandon_restores_it() {
        let s = store(100);
        s.reserve(&hit("k", 1), 0);
        s.refilled(&hit("k", 1), 3, remote(0), 0);
        let Reservation::Short {
            taken,
            expires_ms,
            refill,
        } = s.reserve(&hit("k", 5), 1)
        else {
            panic!("3 cannot pay 5");
        };
        assert_eq!((taken, expires_ms, refill), (3, 1_000, true));
        assert_eq!(s.tokens(1), 0);
        s.abandon("k", taken, expires_ms, 2);
        assert_eq!(s.tokens(2), 3);
        // A paid reservation given back is spendable again, with its own expiry.
        let Reservation::Paid { expires_ms, .. } = s.reserve(&hit("k", 2), 3) else {
            panic!("3 pays 2");
        };
        s.put_back("k", 2, expires_ms, 4);
        assert_eq!(s.tokens(4), 3);
    }

    /// Tokens older than the lifetime are never spent; the sweep refunds them once.
    #[test]
    fn expired_tokens_are_not_spent_and_are_swept_back() {
        let s = store(100);
        s.reserve(&hit("k", 1), 0);
        s.refilled(&hit("k", 1), 5, remote(0), 0);
        assert!(matches!(
            s.reserve(&hit("k", 1), 999),
            Reservation::Paid { left: 4, .. }
        ));
        // At the expiry the 4 left are stale: the request goes to the backend.
        let short = s.reserve(&hit("k", 1), 1_000);
        assert!(
            matches!(short, Reservation::Short { taken: 0, .. }),
            "{short:?}"
        );
        s.abandon("k", 0, 1_000, 1_000);
        let refunds = s.sweep(1_000);
        assert_eq!(refunds.len(), 1);
        assert_eq!(refunds[0].key, "k");
        assert!(refunds[0].demand.refund);
        assert_eq!(refunds[0].demand.tokens, 4);
        assert_eq!(refunds[0].demand.params, P);
        // Nothing is left in it and it expired: forgotten, and a second sweep returns nothing.
        assert!(s.is_empty());
        assert!(s.sweep(2_000).is_empty());
    }

    /// A put back after the expiry goes to the refunds, not to spending.
    #[test]
    fn put_back_after_expiry_is_returned_not_spent() {
        let s = store(100);
        s.reserve(&hit("k", 1), 0);
        s.refilled(&hit("k", 1), 5, remote(0), 0);
        let Reservation::Paid { expires_ms, .. } = s.reserve(&hit("k", 1), 10) else {
            panic!()
        };
        s.put_back("k", 1, expires_ms, 1_500);
        assert_eq!(s.tokens(1_500), 0);
        let refunds = s.sweep(1_500);
        assert_eq!(refunds[0].demand.tokens, 5);
    }

    /// Adding to a lease keeps the earliest expiry: no token lives past its lifetime.
    #[test]
    fn a_refill_on_top_keeps_the_earlier_expiry() {
        let s = store(100);
        // Two concurrent refills: the first at 0, the second at 600.
        s.reserve(&hit("k", 1), 0);
        s.reserve(&hit("k", 1), 0);
        s.refilled(&hit("k", 1), 2, remote(0), 0);
        s.refilled(&hit("k", 1), 2, remote(0), 600);
        assert_eq!(s.tokens(999), 4);
        assert_eq!(s.tokens(1_000), 0);
        assert_eq!(s.sweep(1_000)[0].demand.tokens, 4);
    }

    /// The key bound holds; only empty leases are evicted; a key with no place is not leased.
    #[test]
    fn bounded_keys_evict_only_empty_leases() {
        let s = store(SHARDS);
        assert_eq!(s.capacity(), SHARDS);
        let mut unleased = 0;
        for i in 0..SHARDS * 4 {
            let key = format!("k{i}");
            match s.reserve(&hit(&key, 1), 0) {
                Reservation::Short { refill: true, .. } => {
                    s.refilled(&hit(&key, 1), 5, remote(0), 0);
                }
                Reservation::Short { refill: false, .. } => unleased += 1,
                Reservation::Paid { .. } => panic!("new key {key} paid"),
            }
            assert!(s.len() <= s.capacity());
        }
        assert!(unleased > 0, "full shards refuse new keys");
        let held = s.tokens(0);
        assert_eq!(held, 5 * s.len() as u64, "no lease lost its tokens");
        // Once they are returned, the empty leases make room again.
        let returned: u64 = s.drain().iter().map(|h| h.demand.tokens).sum();
        assert_eq!(returned, held);
        assert!(s.is_empty());
        assert!(matches!(
            s.reserve(&hit("new", 1), 0),
            Reservation::Short { refill: true, .. }
        ));
    }

    /// A sweep while a new lease's first refill is in flight (the lease is empty and expired
    /// then) keeps it: the refill lands in the lease, not among the orphans, and the next
    /// request is paid from it.
    #[test]
    fn a_sweep_keeps_a_lease_whose_refill_is_in_flight() {
        let s = store(100);
        assert!(matches!(
            s.reserve(&hit("k", 1), 0),
            Reservation::Short { refill: true, .. }
        ));
        assert!(s.sweep(0).is_empty());
        assert_eq!(s.refilled(&hit("k", 1), 9, remote(90), 0), 9);
        assert!(matches!(
            s.reserve(&hit("k", 1), 1),
            Reservation::Paid { left: 8, .. }
        ));
        assert!(s.sweep(1).is_empty(), "nothing orphaned, nothing expired");
        // A refill of an existing lease that comes back empty ends its hold: once expired and
        // empty, the lease is forgotten.
        assert!(matches!(
            s.reserve(&hit("k", 9), 2),
            Reservation::Short {
                taken: 8,
                refill: true,
                ..
            }
        ));
        assert!(s.sweep(2).is_empty());
        s.abandon("k", 8, 1_000, 2);
        assert_eq!(s.sweep(1_000).len(), 1, "the 8 go back once expired");
        assert!(s.is_empty());
    }

    /// A refill that finds its lease gone (drained, or evicted while empty) is handed back by
    /// the next sweep.
    #[test]
    fn a_refill_whose_lease_is_gone_is_returned() {
        let s = store(100);
        s.reserve(&hit("k", 1), 0);
        assert!(s.drain().is_empty());
        assert!(s.is_empty(), "an empty lease is dropped");
        assert_eq!(s.refilled(&hit("k", 1), 7, remote(0), 5), 0);
        let refunds = s.drain();
        assert_eq!(refunds.len(), 1);
        assert_eq!(refunds[0].demand.tokens, 7);
    }
}
