//! Rules whose capacity is a token or two (`1/min`, `1/day`, `2/s`), pushed at Envoy's cadence
//! (every second, early by up to a fifth at random, assignments of 3 s, reports every 5 s): the
//! data plane gets its first token at the first push, its assignment does not flip between a
//! token bucket and DENY_ALL, and the pool never holds a token it has not assigned. And the same
//! path for a large rule whose capacity is one push interval of its rate: its data plane's bucket
//! holds more than one token.

use super::tests::{DataPlane, ENVOY, Shared};
use super::*;
use crate::algorithm::BucketParams;

const REPORT_MS: u64 = 5_000;

/// Push times: every second, each up to 200 ms early (a fixed pattern, not random).
fn pushes(until: u64) -> impl Iterator<Item = u64> {
    (1..)
        .map(|k: u64| k * 1_000 - (k * 37 % 5) * 50)
        .take_while(move |&t| t <= until)
}

struct Seen {
    /// Every assignment pushed, in order.
    assigned: Vec<Strategy>,
    first_admission_ms: Option<u64>,
    admitted: u64,
    /// Whole tokens the pool held while its member was on DENY_ALL, at any push.
    hoarded: u64,
}

/// One data plane offering `offered_per_s` against a pool of `params` for `ms`, with the prepaid
/// invariant checked every ms.
fn run(params: BucketParams, offered_per_s: f64, ms: u64) -> Seen {
    let mut shared = Shared::new(params);
    let mut pool = Pool::new(params);
    let mut plane = DataPlane::new(0, offered_per_s);
    plane.ttl_ms = ENVOY.ttl_ms;
    pool.join(0);
    let mut pushes = pushes(ms).peekable();
    let mut seen = Seen {
        assigned: Vec::new(),
        first_admission_ms: None,
        admitted: 0,
        hoarded: 0,
    };
    let mut taken: i64 = 0;
    for now in 1..=ms {
        plane.step(now);
        if plane.admitted_total > 0 && seen.first_admission_ms.is_none() {
            seen.first_admission_ms = Some(now);
        }
        if now % REPORT_MS == 0 {
            pool.report(0, now, plane.allowed, plane.denied);
            plane.allowed = 0;
            plane.denied = 0;
        }
        if pushes.next_if_eq(&now).is_some() {
            let answer = match pool.plan(now, &ENVOY) {
                Ask::Take(n) => {
                    let got = shared.take(now, n);
                    taken += got as i64;
                    Answer::Granted(got)
                }
                Ask::Refund(n) => {
                    shared.give(now, n);
                    taken -= n as i64;
                    Answer::Refunded(n)
                }
                Ask::Nothing => Answer::Granted(0),
            };
            for (_, strategy) in pool.settle(now, &ENVOY, answer) {
                if strategy == Strategy::DenyAll {
                    seen.hoarded += pool.held().max(0.0).floor() as u64;
                }
                plane.assign(now, strategy);
                seen.assigned.push(strategy);
            }
        }
        assert!(
            plane.admitted_total as i64 <= taken,
            "at {now} ms the data plane admitted {} but the pool took only {taken}",
            plane.admitted_total
        );
    }
    seen.admitted = plane.admitted_total;
    seen
}

fn per(capacity: u64, unit_ms: u64) -> BucketParams {
    BucketParams {
        capacity,
        requests_per_unit: capacity,
        unit_ms,
    }
}

/// The assignments never leave the first one: one token bucket, re-sent.
fn assert_stable(seen: &Seen) -> TokenBucket {
    let Some(Strategy::TokenBucket(first)) = seen.assigned.first().copied() else {
        panic!("a token bucket first: {:?}", seen.assigned.first());
    };
    for (i, strategy) in seen.assigned.iter().enumerate() {
        assert_eq!(*strategy, Strategy::TokenBucket(first), "push {i}");
    }
    assert_eq!(seen.hoarded, 0);
    first
}

#[test]
fn one_per_minute_admits_at_the_first_push_and_keeps_one_bucket() {
    let seen = run(per(1, 60_000), 5.0, 200_000);
    let bucket = assert_stable(&seen);
    assert_eq!(seen.first_admission_ms, Some(1_000), "at the first push");
    assert_eq!((bucket.max_tokens, bucket.tokens_per_fill), (1, 1));
    assert_eq!(bucket.fill_interval_s, 61, "slowed by one push per token");
    // 200 s: the first token, then one every 61 s. C + r·T is 4.3.
    assert_eq!(seen.admitted, 4);
}

#[test]
fn one_per_day_admits_its_token_at_the_first_push() {
    let seen = run(per(1, 86_400_000), 5.0, 30_000);
    let bucket = assert_stable(&seen);
    assert_eq!(seen.first_admission_ms, Some(1_000));
    assert_eq!(bucket.max_tokens, 1);
    assert_eq!(seen.admitted, 1);
}

#[test]
fn two_per_second_pushed_every_second_keeps_one_bucket() {
    let seen = run(per(2, 1_000), 10.0, 60_000);
    let bucket = assert_stable(&seen);
    assert_eq!(seen.first_admission_ms, Some(1_000));
    // One token at once and 1/s: what two tokens in hand sustain one push ahead.
    assert_eq!((bucket.max_tokens, bucket.rate_per_s()), (1, 1.0));
    // About half of C + r·T = 2 + 2·60 (the rest stays in the shared bucket, for RLS).
    assert!((58..=62).contains(&seen.admitted), "{}", seen.admitted);
}

#[test]
fn an_idle_small_rule_pool_gives_its_token_back_to_rls() {
    // The data plane reports no demand: its share falls to a twentieth of the rate (1 per 20
    // minutes for 1/min), still one token; once it leaves, the pool holds none.
    let params = per(1, 60_000);
    let mut pool = Pool::new(params);
    pool.join(0);
    let Ask::Take(1) = pool.plan(1_000, &ENVOY) else {
        panic!("one token for the first assignment");
    };
    let assigned = pool.settle(1_000, &ENVOY, Answer::Granted(1));
    assert!(matches!(assigned[..], [(0, Strategy::TokenBucket(_))]));
    pool.report(0, 5_000, 0, 0);
    pool.report(0, 10_000, 0, 0);
    pool.leave(0);
    assert_eq!(pool.drain(), Some(0), "the token was the data plane's");
}

#[test]
fn two_data_planes_on_one_token_get_it_whole_one_of_them() {
    let mut pool = Pool::new(per(1, 86_400_000));
    pool.join(0);
    pool.join(1);
    let Ask::Take(n) = pool.plan(1_000, &ENVOY) else {
        panic!("an unassigned pool takes");
    };
    assert!(n >= 1);
    let mut assigned = pool.settle(1_000, &ENVOY, Answer::Granted(1));
    assigned.sort_by_key(|(id, _)| *id);
    let buckets: Vec<u32> = assigned
        .iter()
        .filter_map(|(_, s)| match s {
            Strategy::TokenBucket(b) => Some(b.max_tokens),
            _ => None,
        })
        .collect();
    assert_eq!(buckets, [1], "one data plane holds the token: {assigned:?}");
    assert_eq!(assigned.len(), 2);
    // Nothing is held for nobody: both leave, nothing goes back (the token was assigned).
    pool.leave(0);
    pool.leave(1);
    assert_eq!(pool.drain(), Some(0));
}

/// A rule of 1,000,000 a second with the default burst (one second of it), pushed every second:
/// each share's part of the capacity is one horizon of it, the case a one-token bucket once took.
/// The data plane's requests come 15 to a millisecond (15k a second, far below its share): every
/// one after the first push is admitted, from a bucket that holds a tenth of the part.
#[test]
fn a_large_rule_pushed_every_second_admits_bunched_requests() {
    let seen = run(per(1_000_000, 1_000), 15_000.0, 10_000);
    let Some(Strategy::TokenBucket(last)) = seen.assigned.last().copied() else {
        panic!("a token bucket: {:?}", seen.assigned);
    };
    assert!(last.max_tokens >= 1_000, "{last:?}");
    assert!(last.rate_per_s() >= 15_000.0, "{last:?}");
    // 15 per ms from the first push (1 s) to the end (10 s).
    let offered_after_first_push = 15 * 9_000;
    assert!(
        seen.admitted >= offered_after_first_push,
        "{} admitted of {offered_after_first_push} offered after the first push: {:?}",
        seen.admitted,
        seen.assigned
    );
}
