use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use indexmap::IndexSet;

use super::*;
use crate::algorithm::BucketParams;
use crate::clock::{Clock, ManualClock};
use crate::rule::RuleId;

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
fn each_rule_is_bound_to_a_quarter_unless_set() {
    assert_eq!(
        MemoryOptions::bounded(1_000, None).max_buckets_per_rule,
        Some(250)
    );
    assert_eq!(
        MemoryOptions::bounded(2, None).max_buckets_per_rule,
        Some(1)
    );
    assert_eq!(
        MemoryOptions::bounded(1_000, Some(900)).max_buckets_per_rule,
        Some(900)
    );
    assert_eq!(
        MemoryOptions::default().max_buckets_per_rule,
        Some(MemoryOptions::DEFAULT_MAX_BUCKETS / 4)
    );
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

async fn each(b: &MemoryBackend, hits: &[Hit]) -> Vec<Result<Verdict, BackendError>> {
    b.check_each(hits).await
}

/// A full shard whose buckets all still count refuses a new one (its hit fails, for the failure
/// policy) instead of resetting a client: the exhausted bucket stays exhausted.
#[tokio::test]
async fn full_shard_refuses_a_new_bucket_rather_than_reset_one() {
    let (b, clock) = backend(small(4, 1));
    for (key, cost) in [("a", 5), ("b", 2), ("c", 6), ("drained", 10)] {
        one(&b, key, TEN, cost).await;
    }
    let refused = each(&b, &[Hit::new("e", TEN, 8)]).await;
    assert!(
        matches!(refused[..], [Err(BackendError::Overloaded(_))]),
        "{refused:?}"
    );
    assert_eq!(b.refused_total(), 1);
    assert_eq!(
        b.check(&[Hit::new("e", TEN, 1)]).await.map(drop),
        Err(BackendError::Overloaded(super::NO_ROOM.into()))
    );
    // A check-only or rejected hit on a new key needs no place and is answered.
    assert_eq!(level(&b, "e", TEN).await, 10);
    assert!(!one(&b, "e", TEN, 11).await.allowed);
    assert_eq!(b.refused_total(), 2);
    for (key, expected) in [("a", 5), ("b", 8), ("c", 4), ("drained", 0)] {
        assert_eq!(level(&b, key, TEN).await, expected, "{key}");
    }
    // Once "b" is full again its place is free.
    clock.advance(200);
    assert!(one(&b, "e", TEN, 8).await.allowed);
    assert_eq!(level(&b, "e", TEN).await, 2);
    assert_eq!(level(&b, "drained", TEN).await, 2);
}

/// The `local` policy's store answers a refused new bucket as the fresh bucket it is.
#[tokio::test]
async fn keeping_what_fits_answers_a_refused_bucket_unstored() {
    let (b, _clock) = backend(small(1, 1));
    one(&b, "held", TEN, 10).await;
    let v = b.check_keeping_what_fits(&[Hit::new("new", TEN, 3)]);
    assert!(v[0].allowed);
    assert_eq!(v[0].remaining, 7);
    assert_eq!(b.live_buckets(), 1);
    assert_eq!(level(&b, "held", TEN).await, 0);
    assert_eq!(b.refused_total(), 1);
}

#[tokio::test]
async fn a_request_keeps_its_stored_buckets_and_refuses_only_new_ones() {
    let (b, clock) = backend(small(2, 1));
    one(&b, "old", TEN, 9).await;
    one(&b, "settled", TEN, 1).await;
    clock.advance(100);
    // "settled" is full again but still stored: the request rewrites it before "x" and "y"
    // look for room, so the sweep for them cannot take its place.
    let hits = [
        Hit::new("x", TEN, 1),
        Hit::new("settled", TEN, 5),
        Hit::new("y", TEN, 3),
    ];
    let outcomes = each(&b, &hits).await;
    assert!(
        outcomes[1].as_ref().is_ok_and(|v| v.allowed),
        "{outcomes:?}"
    );
    assert!(outcomes[0].is_err() && outcomes[2].is_err(), "{outcomes:?}");
    assert_eq!(b.live_buckets(), 2);
    assert_eq!(level(&b, "settled", TEN).await, 5);
    assert_eq!(level(&b, "old", TEN).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distinct_key_flood_never_exceeds_the_bound() {
    let (b, clock) = backend(small(100, 8));
    let b = Arc::new(b);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                let mut refused = 0u64;
                for i in 0..2_000 {
                    let key = format!("flood-{t}-{i}");
                    let hits = [Hit::new(key.as_str(), TEN, 1 + i % 9)];
                    match &b.check_each(&hits).await[0] {
                        Ok(v) => assert!(v.allowed),
                        Err(e) => {
                            assert!(matches!(e, BackendError::Overloaded(_)));
                            refused += 1;
                        }
                    }
                    assert!(b.live_buckets() <= 100);
                }
                refused
            })
        })
        .collect();
    let mut refused = 0;
    for (step, task) in tasks.into_iter().enumerate() {
        clock.advance(step as u64 * 7);
        refused += task.await.unwrap();
    }
    assert!(refused > 0);
    assert_eq!(b.refused_total(), refused);
    assert_eq!(b.live_buckets(), 100);
    for max in [1, 3] {
        let (tiny, _) = backend(small(max, 64));
        for i in 0..50 {
            let _ = each(&tiny, &[Hit::new(format!("k{i}"), TEN, 1)]).await;
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

/// A flood of fresh values for one rule neither resets that rule's exhausted buckets nor takes
/// another rule's room: past the rule's bound its new buckets are refused.
#[tokio::test]
async fn a_flooded_rule_fills_only_its_own_share_and_resets_nobody() {
    let (b, _clock) = backend(MemoryOptions {
        max_buckets_per_rule: Some(5),
        ..small(100, 1)
    });
    check(&b, &[ruled("victim", 1, 10)]).await;
    for key in ["b1", "b2", "b3"] {
        check(&b, &[ruled(key, 2, 4)]).await;
    }
    let mut refused = 0;
    for i in 0..200 {
        // Exhausting values: the victim is as close to full as any of them.
        match &each(&b, &[ruled(&format!("flood-{i}"), 1, 10)]).await[0] {
            Ok(v) => assert!(v.allowed),
            Err(_) => refused += 1,
        }
        assert!(per_rule(&b)[&Some(RuleId(1))] <= 5);
    }
    assert_eq!(refused, 196, "4 places beside the victim's");
    let counts = per_rule(&b);
    assert_eq!(counts[&Some(RuleId(1))], 5);
    assert_eq!(counts[&Some(RuleId(2))], 3);
    assert_eq!(
        level(&b, "victim", TEN).await,
        0,
        "the victim is still at its limit"
    );
    // The other rule keeps room for new buckets.
    assert!(check(&b, &[ruled("b4", 2, 4)]).await[0].allowed);
    for key in ["b1", "b2", "b3", "b4"] {
        assert_eq!(level(&b, key, TEN).await, 6, "{key} kept its state");
    }
    // Without a per-rule bound the same flood fills the store: nothing is reset, but the other
    // rule's new buckets are refused too.
    let (b, _clock) = backend(small(10, 1));
    check(&b, &[ruled("b1", 2, 4)]).await;
    for i in 0..100 {
        let _ = each(&b, &[ruled(&format!("flood-{i}"), 1, 9)]).await;
    }
    assert_eq!(level(&b, "b1", TEN).await, 6);
    assert!(each(&b, &[ruled("b2", 2, 1)]).await[0].is_err());
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
            let _ = each(&b, &hits).await;
            if i % 50 == 0 {
                clock.advance(37);
                b.sweep();
            }
        }
        // Time stands still: every shard's share of every rule fills up.
        for i in 0..900u64 {
            let _ = each(
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
        let _ = each(&tiny, &[ruled(&format!("k{i}"), 1, 5)]).await;
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
