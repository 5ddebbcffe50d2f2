//! The limiter's leases and shards, on the failing memory backend of `tests.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::FutureExt as _;

use super::tests::{Rig, request, rig, rig_on};
use super::*;
use crate::algorithm::{Algorithm, BucketParams};
use crate::backend::Hit;
use crate::clock::Clock;
use crate::key::RuleTag;
use crate::request::Entry;
use crate::resilience::ResilienceOptions;
use crate::rule::Unit;

const LEASED: &str = "domain: lease
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 20, lease: 5}
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 1}
";

fn leased_rig() -> (Rig, Arc<LeaseStore>) {
    let sources = [("lease.yaml".to_owned(), LEASED.to_owned())];
    let store = Arc::new(LeaseStore::new(crate::limiter::lease::LeaseOptions {
        max_keys: 100,
        lifetime_ms: 1_000,
    }));
    let rig = rig_on(&sources, &ResilienceOptions::default(), 1, |limiter| {
        limiter.with_leases(store.clone())
    });
    (rig, store)
}

async fn code(rig: &Rig, descriptors: &[(&str, &str)]) -> Code {
    rig.limiter
        .decide(&request("lease", descriptors))
        .await
        .unwrap()
        .overall
}

#[tokio::test]
async fn leased_hits_cost_one_backend_call_per_batch_and_never_exceed_the_limit() {
    let (rig, store) = leased_rig();
    let mut ok = 0;
    for _ in 0..30 {
        ok += usize::from(code(&rig, &[("hot", "k")]).await == Code::Ok);
    }
    assert_eq!(ok, 20, "the whole limit and no more");
    // Four batches of 5, then one rejected call; the over-limit cache is off here.
    assert_eq!(rig.backend.calls(), 4 + 10);
    assert_eq!(store.local_total(), 16);
    assert_eq!(store.refill_total(), 4);
    let d = rig
        .limiter
        .decide(&request("lease", &[("hot", "r")]))
        .await
        .unwrap();
    assert_eq!(
        d.statuses[0].remaining, 19,
        "15 in the bucket after the first batch, 4 in the lease"
    );
}

#[tokio::test]
async fn a_rejected_request_gives_its_leased_tokens_back() {
    let (rig, store) = leased_rig();
    assert_eq!(code(&rig, &[("hot", "k")]).await, Code::Ok);
    assert_eq!(code(&rig, &[("hot", "k"), ("one", "x")]).await, Code::Ok);
    let calls = rig.backend.calls();
    // `one` is spent: the request is rejected and `hot`'s local token goes back.
    for _ in 0..3 {
        assert_eq!(
            code(&rig, &[("hot", "k"), ("one", "x")]).await,
            Code::OverLimit
        );
    }
    assert_eq!(rig.backend.calls(), calls + 3);
    assert_eq!(store.tokens(rig.clock.now_ms()), 3);
    // A backend failure under `error` fails the call and gives the reservation back too.
    rig.backend.fail("");
    assert!(
        rig.limiter
            .decide(&request("lease", &[("hot", "k"), ("one", "y")]))
            .await
            .is_err()
    );
    rig.backend.heal();
    assert_eq!(store.tokens(rig.clock.now_ms()), 3);
    // A short lease pays what it has and the backend the rest: 3 local + 2 from the bucket.
    let mut five = request("lease", &[("hot", "k")]);
    five.hits_addend = 5;
    let d = rig.limiter.decide(&five).await.unwrap();
    assert_eq!(d.overall, Code::Ok);
    // The bucket had 15: 2 for the request and 3 more for the lease (batch 5).
    assert_eq!(d.statuses[0].remaining, 10 + 3);
    assert_eq!(store.tokens(rig.clock.now_ms()), 3);
}

/// A decision dropped while its backend call is out (the caller's deadline) gives back what
/// it took from its lease and stops holding the lease as being refilled.
#[tokio::test]
async fn a_cancelled_decision_gives_its_reservations_back() {
    let (rig, store) = leased_rig();
    rig.backend.stalled.store(true, Ordering::SeqCst);
    let new_key = request("lease", &[("hot", "new")]);
    assert!(rig.limiter.decide(&new_key).now_or_never().is_none());
    rig.backend.stalled.store(false, Ordering::SeqCst);
    // The new lease is empty and expired: nothing holds it, the sweep drops it.
    assert_eq!(rig.limiter.return_expired_leases().await, 0);
    assert!(
        store.is_empty(),
        "the cancelled refill no longer holds the lease"
    );

    assert_eq!(code(&rig, &[("hot", "k")]).await, Code::Ok);
    assert_eq!(store.tokens(rig.clock.now_ms()), 4);
    // Five hits: the lease's 4 are taken, the call for the rest stalls and is dropped.
    rig.backend.stalled.store(true, Ordering::SeqCst);
    let mut five = request("lease", &[("hot", "k")]);
    five.hits_addend = 5;
    assert!(rig.limiter.decide(&five).now_or_never().is_none());
    rig.backend.stalled.store(false, Ordering::SeqCst);
    assert_eq!(store.tokens(rig.clock.now_ms()), 4, "the 4 are back");
    rig.clock.advance(1_000);
    assert_eq!(rig.limiter.return_expired_leases().await, 4);
    assert!(store.is_empty());
}

#[tokio::test]
async fn expired_leases_are_not_spent_and_go_back() {
    let (rig, store) = leased_rig();
    assert_eq!(code(&rig, &[("hot", "k")]).await, Code::Ok);
    assert_eq!(store.tokens(rig.clock.now_ms()), 4);
    rig.clock.advance(1_000);
    let calls = rig.backend.calls();
    assert_eq!(code(&rig, &[("hot", "k")]).await, Code::Ok);
    assert_eq!(
        rig.backend.calls(),
        calls + 1,
        "the expired lease did not pay"
    );
    assert_eq!(rig.limiter.return_expired_leases().await, 4);
    assert_eq!(store.returned_total(), 4);
    // Paid locally: what the bucket said at the last refill (20 - 5 - 5, the refund came
    // after) and the 3 left here.
    let d = rig
        .limiter
        .decide(&request("lease", &[("hot", "k")]))
        .await
        .unwrap();
    assert_eq!(d.statuses[0].remaining, 10 + 3);
    assert_eq!(rig.limiter.return_all_leases().await, 3);
}

#[tokio::test]
async fn repeated_keys_are_paid_together_past_the_linear_dedupe() {
    let rig = rig(1, false, usize::MAX);
    // 20 distinct buckets, then the first and the last again: the repeats are found by
    // comparing keys (first) and through the map built once there are 16 hits (last).
    let mut values: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
    values.push("v0".into());
    values.push("v19".into());
    values.push("v19".into());
    let pairs: Vec<(&str, &str)> = values.iter().map(|v| ("a", v.as_str())).collect();
    let d = rig.limiter.decide(&request("error", &pairs)).await.unwrap();
    let remaining: Vec<u64> = d.statuses.iter().map(|s| s.remaining).collect();
    assert_eq!(remaining[0], 2, "v0: two hits of 4");
    assert_eq!(remaining[19], 1, "v19: three hits of 4");
    assert_eq!(remaining[20], 2);
    assert_eq!(remaining[22], 1);
    assert!(remaining[1..19].iter().all(|&r| r == 3), "{remaining:?}");
    assert_eq!(d.overall, Code::Ok);
}

/// Whole tokens shard `i` of `h=<value>` in `domain` holds, asked of the backend directly.
async fn shard_tokens(rig: &Rig, domain: &str, value: &str, shard: u8) -> u64 {
    let key = crate::key::bucket_key(
        "sluice:",
        domain,
        &[Entry::new("h", value)],
        RuleTag::Shard(shard),
        Algorithm::TokenBucket,
    );
    let check = Hit::new(
        key,
        BucketParams {
            capacity: 2,
            requests_per_unit: 2,
            unit_ms: 3_600_000,
        },
        0,
    );
    rig.backend.inner.check(&[check]).await.unwrap()[0].remaining
}

#[test]
fn consecutive_requests_spread_evenly_over_the_shards() {
    for n in [2u32, 3, 4, 7, 64] {
        for start in [0u64, 1, 12_345, u64::MAX - 3, 1 << 63, 0x9E37_79B9] {
            for per_shard in [1u64, 5, 25] {
                let mut counts = vec![0u64; n as usize];
                for k in 0..u64::from(n) * per_shard {
                    let shard = shard_of(start.wrapping_add(k), n);
                    counts[usize::from(shard)] += 1;
                }
                assert!(
                    counts.iter().all(|&c| c.abs_diff(per_shard) <= 2),
                    "{n} shards from {start}: {counts:?}"
                );
            }
        }
    }
    assert_eq!(shard_of(7, 1), 0);
}

#[tokio::test]
async fn a_sharded_rule_admits_its_limit_over_its_shards_and_reports_the_full_limit() {
    let rig = rig(1, false, usize::MAX);
    let mut ok = 0;
    for _ in 0..32 {
        let d = rig
            .limiter
            .decide(&request("error", &[("h", "k")]))
            .await
            .unwrap();
        let status = &d.statuses[0];
        let limit = status.limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.capacity), (8, 8));
        assert!(status.remaining <= 1, "a shard holds 2: {status:?}");
        if d.overall == Code::Ok {
            ok += 1;
        } else {
            // A shard's retry-after: one token of 2 per hour comes back in 30 minutes (the
            // whole rule's would be 7.5), to the millisecond the doubles round to.
            let wait = status.retry_after_ms.flatten().unwrap();
            assert!((1_800_000..=1_800_001).contains(&wait), "{wait}");
        }
    }
    assert_eq!(ok, 8, "4 shards × 2");
    for shard in 0..4 {
        assert_eq!(shard_tokens(&rig, "error", "k", shard).await, 0, "{shard}");
    }
    // One backend call per request: a request reaches one shard only.
    assert_eq!(rig.backend.calls(), 32);
}

#[tokio::test]
async fn duplicates_in_one_request_share_a_shard_and_overrides_are_not_sharded() {
    let rig = rig(1, false, usize::MAX);
    let limiter = rig.limiter.with_shard_cursor(0);
    let rig = Rig { limiter, ..rig };
    let first = shard_of(0, 4);
    let d = rig
        .limiter
        .decide(&request("error", &[("h", "d"), ("h", "d")]))
        .await
        .unwrap();
    assert_eq!(d.overall, Code::Ok);
    assert_eq!(d.statuses[0].remaining, 0, "both hits on one shard of 2");
    assert_eq!(d.statuses[1].remaining, 0);
    for shard in 0..4 {
        let expected = if shard == first { 0 } else { 2 };
        assert_eq!(shard_tokens(&rig, "error", "d", shard).await, expected);
    }
    // Three hits need more than a shard holds: rejected, and nothing is taken.
    let second = shard_of(1, 4);
    let d = rig
        .limiter
        .decide(&request("error", &[("h", "e"), ("h", "e"), ("h", "e")]))
        .await
        .unwrap();
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(d.statuses[0].retry_after_ms, Some(None), "never: 3 > 2");
    assert_eq!(shard_tokens(&rig, "error", "e", second).await, 2);

    // A request `limit` override has its own, unsharded bucket: 3 per hour, all of it.
    let mut overridden = request("error", &[("h", "o")]);
    overridden.descriptors[0].limit_override = Some(crate::request::LimitOverride {
        requests_per_unit: 3,
        unit: Unit::Hour,
    });
    let mut codes = Vec::new();
    for _ in 0..4 {
        codes.push(rig.limiter.decide(&overridden).await.unwrap().overall);
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
    let key = crate::key::bucket_key(
        "sluice:",
        "error",
        &[Entry::new("h", "o")],
        RuleTag::Override(crate::request::LimitOverride {
            requests_per_unit: 3,
            unit: Unit::Hour,
        }),
        Algorithm::TokenBucket,
    );
    assert!(!key.contains("~s"), "{key}");
    for shard in 0..4 {
        assert_eq!(
            shard_tokens(&rig, "error", "o", shard).await,
            2,
            "untouched"
        );
    }
}

#[tokio::test]
async fn a_sharded_rule_falls_back_to_one_local_bucket_of_the_full_limit() {
    // 3 replicas: the full limit's share is ceil(8 / 3) = 3; per shard it would be
    // 4 × ceil(2 / 3) = 4.
    let rig = rig(3, false, usize::MAX);
    rig.backend.fail("");
    let mut ok = 0;
    for _ in 0..12 {
        let d = rig
            .limiter
            .decide(&request("local", &[("h", "x")]))
            .await
            .unwrap();
        assert_eq!(d.statuses[0].basis, Basis::Degraded(FailureMode::Local));
        ok += usize::from(d.overall == Code::Ok);
    }
    assert_eq!(ok, 3);
    let local = rig.limiter.resilience().local.store().live_buckets();
    assert_eq!(local, 1, "one local bucket, not one per shard");
}
