//! The local over-limit cache: a bucket Redis rejected with retry-after R cannot pay the same
//! demand again before R (tokens only appear by refill), so until then this replica answers
//! OVER_LIMIT itself instead of asking Redis. A client hammering past its limit then costs Redis
//! nothing.
//!
//! The one way tokens appear sooner is a refund (`is_negative_hits`). A refund through this
//! replica drops the key from its cache; a refund through another replica is not seen here, so
//! this replica may keep rejecting that key for at most the remaining R. That is the documented
//! caveat (docs/failure-modes.md).
//!
//! An entry answers only a demand at least as large as the one that was rejected (a smaller one
//! might fit sooner) with the same bucket shape (a reload may have raised the limit). The wait
//! is measured from the moment the call was sent, which is no later than the moment Redis
//! decided, so the cache never rejects after the tokens are back.
//!
//! Bounded: at most `max_keys` entries, split over independently locked shards; a full shard
//! evicts the sampled entry that expires first, so a flood of distinct over-limit keys costs a
//! fixed amount of memory.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use indexmap::IndexMap;

use crate::algorithm::{Algorithm, BucketParams, Demand, Verdict};

/// Entries sampled when a full shard must evict one.
const EVICTION_SAMPLE: usize = 8;
const SHARDS: usize = 16;

/// What the cache knows about one rejected bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// Before this time the demand cannot be met.
    until_ms: u64,
    /// The smallest demand (tokens, at least 1) known not to fit before `until_ms`.
    need: u64,
    params: BucketParams,
    /// Whole tokens the bucket held when rejected (a lower bound since).
    remaining: u64,
    /// When the bucket was expected to be full again.
    full_at_ms: u64,
}

/// A rejection answered from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedRejection {
    /// ms until the demand can be met (the retry-after to report).
    pub wait_ms: u64,
    /// Whole tokens left, as last seen.
    pub remaining: u64,
    /// ms until the bucket is full again, as last seen.
    pub until_full_ms: u64,
}

/// A bounded map of over-limit bucket keys to the time they can pay again.
pub struct OverLimitCache {
    shards: Box<[Mutex<IndexMap<String, Entry>>]>,
    shard_capacity: usize,
    router: RandomState,
    /// Rejections answered from the cache since start.
    answered: AtomicU64,
}

impl OverLimitCache {
    /// A cache holding at most `max_keys` entries (at least one per shard).
    pub fn new(max_keys: usize) -> Self {
        let shards = SHARDS.min(max_keys.max(1));
        OverLimitCache {
            shards: (0..shards).map(|_| Mutex::new(IndexMap::new())).collect(),
            shard_capacity: max_keys.max(1).div_ceil(shards),
            router: RandomState::new(),
            answered: AtomicU64::new(0),
        }
    }

    /// If `demand` on `key` is known to be rejected at `now_ms`, the rejection to report.
    pub fn rejects(&self, key: &str, demand: &Demand, now_ms: u64) -> Option<CachedRejection> {
        // Shadow and quota demands never reject a request on their own, and the cache answers
        // for the whole request.
        if demand.refund || demand.shadow || demand.quota {
            return None;
        }
        let mut shard = self.shard(key);
        let entry = *shard.get(key)?;
        if entry.until_ms <= now_ms {
            shard.swap_remove(key);
            return None;
        }
        drop(shard);
        if entry.params != demand.params || need(demand) < entry.need {
            return None;
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        Some(CachedRejection {
            wait_ms: entry.until_ms - now_ms,
            remaining: entry.remaining,
            until_full_ms: entry.full_at_ms.saturating_sub(now_ms),
        })
    }

    /// Learns from Redis's verdict on `demand` for a call sent at `sent_ms`: a rejected take
    /// with a finite wait is remembered; a refund forgets the key.
    pub fn learn(&self, key: &str, demand: &Demand, verdict: &Verdict, sent_ms: u64) {
        if demand.refund {
            self.forget(key);
            return;
        }
        // An in-flight cap's slot may be released at any moment: never answered from here.
        if verdict.allowed
            || demand.shadow
            || demand.quota
            || demand.algorithm == Algorithm::InFlight
        {
            return;
        }
        let Some(wait) = verdict.retry_after_ms.filter(|&w| w > 0) else {
            return;
        };
        let entry = Entry {
            until_ms: sent_ms.saturating_add(wait),
            need: need(demand),
            params: demand.params,
            remaining: verdict.remaining,
            full_at_ms: sent_ms.saturating_add(verdict.until_full_ms),
        };
        let mut shard = self.shard(key);
        if let Some(existing) = shard.get_mut(key) {
            *existing = entry;
            return;
        }
        if shard.len() >= self.shard_capacity {
            evict_one(&mut shard);
        }
        shard.insert(key.to_owned(), entry);
    }

    /// What the cache would answer for `key` at `now_ms` and the smallest demand it answers:
    /// read only, nothing counted or dropped (the admin listener's look at a bucket).
    pub fn holding(&self, key: &str, now_ms: u64) -> Option<(u64, CachedRejection)> {
        let entry = *self.shard(key).get(key)?;
        (entry.until_ms > now_ms).then(|| {
            let rejection = CachedRejection {
                wait_ms: entry.until_ms - now_ms,
                remaining: entry.remaining,
                until_full_ms: entry.full_at_ms.saturating_sub(now_ms),
            };
            (entry.need, rejection)
        })
    }

    pub fn forget(&self, key: &str) {
        self.shard(key).swap_remove(key);
    }

    /// Entries held (some may have expired and await their next lookup or eviction).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rejections answered from the cache since start.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, IndexMap<String, Entry>> {
        let hash = self.router.hash_one(key);
        let index = ((u128::from(hash) * self.shards.len() as u128) >> 64) as usize;
        lock(&self.shards[index])
    }
}

impl std::fmt::Debug for OverLimitCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverLimitCache")
            .field("entries", &self.len())
            .field("answered", &self.answered())
            .finish()
    }
}

/// Tokens a demand needs to fit (a check-only demand needs one), as in the algorithm.
fn need(demand: &Demand) -> u64 {
    demand.tokens.max(1)
}

/// Drops the sampled entry that expires first (an expired one, if sampled).
fn evict_one(shard: &mut IndexMap<String, Entry>) {
    let len = shard.len();
    let sampled = len > EVICTION_SAMPLE;
    let victim = (0..len.min(EVICTION_SAMPLE))
        .map(|i| {
            if sampled {
                rand::random_range(0..len)
            } else {
                i
            }
        })
        .min_by_key(|&i| shard[i].until_ms);
    if let Some(i) = victim {
        shard.swap_remove_index(i);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    const PARAMS: BucketParams = BucketParams {
        capacity: 10,
        requests_per_unit: 10,
        unit_ms: 1_000,
    };

    fn take(tokens: u64) -> Demand {
        Demand::take(Algorithm::TokenBucket, PARAMS, tokens)
    }

    fn rejected(retry: u64) -> Verdict {
        Verdict {
            allowed: false,
            remaining: 0,
            retry_after_ms: Some(retry),
            until_full_ms: 1_000,
            granted: 0,
        }
    }

    #[test]
    fn answers_until_the_retry_after_measured_from_the_send() {
        let cache = OverLimitCache::new(100);
        cache.learn("k", &take(1), &rejected(100), 1_000);
        let hit = cache.rejects("k", &take(1), 1_040).unwrap();
        assert_eq!(hit.wait_ms, 60);
        assert_eq!(hit.until_full_ms, 960);
        assert!(cache.rejects("k", &take(1), 1_099).is_some());
        assert_eq!(cache.rejects("k", &take(1), 1_100), None);
        // Expired entries are dropped on lookup.
        assert!(cache.is_empty());
        assert_eq!(cache.answered(), 2);
    }

    #[test]
    fn only_demands_at_least_as_large_with_the_same_shape() {
        let cache = OverLimitCache::new(100);
        cache.learn("k", &take(5), &rejected(400), 0);
        assert!(cache.rejects("k", &take(5), 10).is_some());
        assert!(cache.rejects("k", &take(7), 10).is_some());
        // A smaller demand may fit sooner: ask Redis.
        assert_eq!(cache.rejects("k", &take(4), 10), None);
        let mut raised = take(5);
        raised.params.capacity = 20;
        assert_eq!(cache.rejects("k", &raised, 10), None);
        let mut shadow = take(5);
        shadow.shadow = true;
        assert_eq!(cache.rejects("k", &shadow, 10), None);
        // A check-only demand (0 tokens) needs one token.
        cache.learn("c", &take(0), &rejected(100), 0);
        assert!(cache.rejects("c", &take(1), 10).is_some());
    }

    #[test]
    fn refunds_forget_and_allowed_or_unbounded_verdicts_are_not_cached() {
        let cache = OverLimitCache::new(100);
        cache.learn("k", &take(1), &rejected(100), 0);
        let mut refund = take(1);
        refund.refund = true;
        assert_eq!(cache.rejects("k", &refund, 1), None);
        cache.learn(
            "k",
            &refund,
            &Verdict {
                allowed: true,
                ..rejected(0)
            },
            1,
        );
        assert_eq!(cache.rejects("k", &take(1), 2), None);

        let allowed = Verdict {
            allowed: true,
            remaining: 3,
            retry_after_ms: Some(0),
            until_full_ms: 700,
            granted: 0,
        };
        cache.learn("a", &take(1), &allowed, 0);
        // Demand above capacity: no wait helps, nothing to expire.
        cache.learn(
            "never",
            &take(11),
            &Verdict {
                retry_after_ms: None,
                ..rejected(0)
            },
            0,
        );
        assert!(cache.is_empty());
    }

    #[test]
    fn bounded_by_evicting_the_entry_that_expires_first() {
        let cache = OverLimitCache::new(32);
        for i in 0..1_000u64 {
            cache.learn(&format!("k{i}"), &take(1), &rejected(10_000 + i), 0);
        }
        assert!(cache.len() <= 32, "{}", cache.len());
        // Recent, long-lived entries survive; the first ones were evicted.
        let survivors = (990..1_000)
            .filter(|i| cache.rejects(&format!("k{i}"), &take(1), 1).is_some())
            .count();
        assert!(survivors > 0);
        assert_eq!(cache.rejects("k0", &take(1), 1), None);
    }
}
