//! The limiter's tests: failure policies, the over-limit cache, leases, shards, the in-flight
//! bound, against a memory backend that can be made to fail or stall.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use futures::FutureExt as _;

use super::*;
use crate::algorithm::{Algorithm, BucketParams, Verdict};
use crate::backend::memory::{MemoryBackend, MemoryOptions};
use crate::clock::{Clock, ManualClock};
use crate::config::load_sources;
use crate::key::RuleTag;
use crate::request::{Entry, RequestDescriptor};
use crate::resilience::ResilienceOptions;
use crate::resilience::local::Replicas;
use crate::rule::{FailureMode, Unit};

/// A memory backend that counts calls and fails the hits whose key contains a chosen part
/// (a dead Redis, or one dead Cluster node).
struct Flaky {
    inner: MemoryBackend,
    calls: AtomicUsize,
    failing: Mutex<HashSet<String>>,
    /// While set, every check waits for ever (a Redis that stopped answering).
    stalled: AtomicBool,
}

impl Flaky {
    fn fail(&self, part: &str) {
        self.failing.lock().unwrap().insert(part.to_string());
    }
    fn heal(&self) {
        self.failing.lock().unwrap().clear();
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn is_failing(&self, key: &str) -> bool {
        self.failing.lock().unwrap().iter().any(|p| key.contains(p))
    }
}

impl Backend for Flaky {
    async fn check(&self, hits: &[Hit]) -> Result<Vec<Verdict>, BackendError> {
        self.check_each(hits).await.into_iter().collect()
    }
    fn name(&self) -> &'static str {
        "flaky"
    }
    async fn probe(&self) -> Result<(), BackendError> {
        Ok(())
    }
    async fn check_each(&self, hits: &[Hit]) -> Vec<Result<Verdict, BackendError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.stalled.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let healthy: Vec<Hit> = hits
            .iter()
            .filter(|h| !self.is_failing(&h.key))
            .cloned()
            .collect();
        let mut verdicts = self.inner.check(&healthy).await.unwrap().into_iter();
        hits.iter()
            .map(|h| {
                if self.is_failing(&h.key) {
                    Err(BackendError::Unavailable("refused".into()))
                } else {
                    Ok(verdicts.next().unwrap())
                }
            })
            .collect()
    }
}

/// `a` and `b`: 4 per second each; `s`: shadow, 1 per hour; `h`: 8 per hour in 4 shards of 2;
/// `q1`, `q2`: quota mode, 1 and 2 per hour (`q2` would lease); one domain per failure mode.
const CONFIG: &str = "
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: c
    failure_mode: closed
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: h
    rate_limit: {unit: hour, requests_per_unit: 8, shards: 4}
  - key: q1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2, lease: 2}
";

struct Rig {
    limiter: Limiter<Arc<Flaky>>,
    backend: Arc<Flaky>,
    clock: ManualClock,
}

fn rig(replicas: u64, cache: bool, max_in_flight: usize) -> Rig {
    let sources: Vec<(String, String)> = ["open", "closed", "local", "error"]
        .iter()
        .map(|mode| {
            (
                format!("{mode}.yaml"),
                format!("domain: {mode}\nfailure_mode: {mode}\n{CONFIG}"),
            )
        })
        .collect();
    let config = Arc::new(ArcSwap::from_pointee(load_sources(&sources).unwrap()));
    let clock = ManualClock::new(1_000_000);
    let backend = Arc::new(Flaky {
        inner: MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default()),
        calls: AtomicUsize::new(0),
        failing: Mutex::new(HashSet::new()),
        stalled: AtomicBool::new(false),
    });
    let resilience = Resilience::new(
        &ResilienceOptions {
            over_limit_cache_keys: cache.then_some(1_000),
            max_in_flight,
            ..ResilienceOptions::default()
        },
        Arc::new(clock.clone()),
        Arc::new(Replicas::fixed(replicas)),
    );
    let limiter = Limiter::with_resilience(
        config,
        backend.clone(),
        LimiterOptions::default(),
        resilience,
    );
    Rig {
        limiter,
        backend,
        clock,
    }
}

fn request(domain: &str, descriptors: &[(&str, &str)]) -> LimitRequest {
    LimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|(k, v)| RequestDescriptor::new(vec![Entry::new(*k, *v)]))
            .collect(),
        hits_addend: 0,
    }
}

#[tokio::test]
async fn each_policy_answers_when_the_backend_fails() {
    let rig = rig(1, false, usize::MAX);
    rig.backend.fail("");
    let open = rig
        .limiter
        .decide(&request("open", &[("a", "1")]))
        .await
        .unwrap();
    assert_eq!(open.overall, Code::Ok);
    assert_eq!(open.statuses[0].basis, Basis::Degraded(FailureMode::Open));
    assert_eq!(open.degraded_modes(), [FailureMode::Open]);
    let closed = rig
        .limiter
        .decide(&request("closed", &[("a", "1")]))
        .await
        .unwrap();
    assert_eq!(closed.overall, Code::OverLimit);
    assert_eq!(
        closed.statuses[0].basis,
        Basis::Degraded(FailureMode::Closed)
    );
    let error = rig.limiter.decide(&request("error", &[("a", "1")])).await;
    assert!(
        matches!(error, Err(LimitError::Unavailable(_))),
        "{error:?}"
    );
    let mut allowed = 0;
    for _ in 0..10 {
        let local = rig
            .limiter
            .decide(&request("local", &[("a", "1")]))
            .await
            .unwrap();
        assert_eq!(local.statuses[0].basis, Basis::Degraded(FailureMode::Local));
        allowed += usize::from(local.overall == Code::Ok);
    }
    assert_eq!(allowed, 4, "one replica: the whole limit, locally");
    // A descriptor's own failure mode wins over its domain's.
    let mixed = rig
        .limiter
        .decide(&request("open", &[("a", "1"), ("c", "1")]))
        .await
        .unwrap();
    assert_eq!(mixed.overall, Code::OverLimit);
    assert_eq!(
        mixed.degraded_modes(),
        [FailureMode::Open, FailureMode::Closed]
    );
}

#[tokio::test]
async fn local_divides_by_the_replica_count_and_a_rejected_request_takes_nothing() {
    let rig = rig(2, false, usize::MAX);
    rig.backend.fail("");
    let mut allowed = 0;
    for _ in 0..10 {
        let d = rig
            .limiter
            .decide(&request("local", &[("a", "x")]))
            .await
            .unwrap();
        allowed += usize::from(d.overall == Code::Ok);
    }
    assert_eq!(allowed, 2, "capacity 4 over 2 replicas");

    // `c` is closed: the request is rejected, so the local bucket of `b` must not pay.
    for _ in 0..3 {
        let d = rig
            .limiter
            .decide(&request("local", &[("b", "y"), ("c", "y")]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::OverLimit);
        assert_eq!(d.statuses[0].code, Code::Ok);
    }
    let alone = rig
        .limiter
        .decide(&request("local", &[("b", "y")]))
        .await
        .unwrap();
    assert_eq!(alone.overall, Code::Ok);
    assert_eq!(
        alone.statuses[0].remaining, 1,
        "2 - 1: nothing was taken before"
    );
}

#[tokio::test]
async fn only_the_failed_endpoint_is_degraded() {
    let rig = rig(1, false, usize::MAX);
    rig.backend.fail("b=");
    let d = rig
        .limiter
        .decide(&request("open", &[("a", "1"), ("b", "1")]))
        .await
        .unwrap();
    assert_eq!(d.statuses[0].basis, Basis::Backend);
    assert_eq!(d.statuses[0].remaining, 3);
    assert_eq!(d.statuses[1].basis, Basis::Degraded(FailureMode::Open));
    // With `error` on the failed one, the whole call fails.
    assert!(
        rig.limiter
            .decide(&request("error", &[("a", "1"), ("b", "1")]))
            .await
            .is_err()
    );
    rig.backend.heal();
    let d = rig
        .limiter
        .decide(&request("open", &[("b", "1")]))
        .await
        .unwrap();
    assert!(!d.degraded());
}

#[tokio::test]
async fn over_limit_cache_answers_until_the_retry_after_without_asking() {
    let rig = rig(1, true, usize::MAX);
    let hammer = request("error", &[("a", "h")]);
    for _ in 0..4 {
        assert_eq!(rig.limiter.decide(&hammer).await.unwrap().overall, Code::Ok);
    }
    let first = rig.limiter.decide(&hammer).await.unwrap();
    assert_eq!(first.overall, Code::OverLimit);
    assert_eq!(first.statuses[0].basis, Basis::Backend);
    assert_eq!(first.statuses[0].retry_after_ms, Some(Some(250)));
    let asked = rig.backend.calls();
    for step in 0..5 {
        rig.clock.advance(49);
        let d = rig.limiter.decide(&hammer).await.unwrap();
        assert_eq!(d.overall, Code::OverLimit);
        assert_eq!(d.statuses[0].basis, Basis::Cached);
        assert_eq!(
            d.statuses[0].retry_after_ms,
            Some(Some(250 - 49 * (step + 1)))
        );
    }
    assert_eq!(rig.backend.calls(), asked, "Redis was not asked");
    rig.clock.advance(5);
    let d = rig.limiter.decide(&hammer).await.unwrap();
    assert_eq!(d.statuses[0].basis, Basis::Backend);
    assert_eq!(d.overall, Code::Ok, "a token is back after 250 ms");
    assert_eq!(rig.backend.calls(), asked + 1);
    assert_eq!(
        rig.limiter
            .resilience()
            .over_limit_cache()
            .unwrap()
            .answered(),
        5
    );
}

#[tokio::test]
async fn a_cached_key_rejects_the_whole_request_and_charges_no_other() {
    let rig = rig(1, true, usize::MAX);
    for _ in 0..5 {
        rig.limiter
            .decide(&request("error", &[("a", "full")]))
            .await
            .unwrap();
    }
    let asked = rig.backend.calls();
    // `b` has tokens, but `a` is known over limit: nothing is asked, nothing taken.
    for _ in 0..3 {
        let d = rig
            .limiter
            .decide(&request("error", &[("b", "spare"), ("a", "full")]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::OverLimit);
        assert_eq!(d.statuses[0].basis, Basis::NotEvaluated);
        assert_eq!(d.statuses[0].code, Code::Ok);
        assert_eq!(d.statuses[0].limit, None);
        assert_eq!(d.statuses[1].basis, Basis::Cached);
        assert_eq!(d.statuses[1].code, Code::OverLimit);
    }
    assert_eq!(rig.backend.calls(), asked);
    let b = rig
        .limiter
        .decide(&request("error", &[("b", "spare")]))
        .await
        .unwrap();
    assert_eq!(b.statuses[0].remaining, 3, "b was never charged");
}

#[tokio::test]
async fn shadow_keys_and_refunds_always_reach_the_backend() {
    let rig = rig(1, true, usize::MAX);
    // The shadow rule is over limit after one hit but never rejects: the cache must not
    // turn it into a rejection of the request.
    for _ in 0..3 {
        let d = rig
            .limiter
            .decide(&request("error", &[("s", "1"), ("a", "shadowed")]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::Ok);
        assert_eq!(d.statuses[0].basis, Basis::Backend);
    }
    for _ in 0..5 {
        rig.limiter
            .decide(&request("error", &[("a", "r")]))
            .await
            .unwrap();
    }
    let asked = rig.backend.calls();
    let mut refund = request("error", &[("a", "r")]);
    refund.descriptors[0].is_negative_hits = true;
    let d = rig.limiter.decide(&refund).await.unwrap();
    assert_eq!(d.statuses[0].basis, Basis::Backend);
    assert_eq!(rig.backend.calls(), asked + 1);
    // The refund gave a token back, and the cache forgot the key: the next take is asked.
    let d = rig
        .limiter
        .decide(&request("error", &[("a", "r")]))
        .await
        .unwrap();
    assert_eq!(d.overall, Code::Ok);
    assert_eq!(d.statuses[0].basis, Basis::Backend);
}

const LEASED: &str = "domain: lease
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 20, lease: 5}
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 1}
";

fn leased_rig() -> (Rig, Arc<LeaseStore>) {
    let sources = vec![("lease.yaml".to_owned(), LEASED.to_owned())];
    let config = Arc::new(ArcSwap::from_pointee(load_sources(&sources).unwrap()));
    let clock = ManualClock::new(1_000_000);
    let backend = Arc::new(Flaky {
        inner: MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default()),
        calls: AtomicUsize::new(0),
        failing: Mutex::new(HashSet::new()),
        stalled: AtomicBool::new(false),
    });
    let resilience = Resilience::new(
        &ResilienceOptions::default(),
        Arc::new(clock.clone()),
        Arc::new(Replicas::fixed(1)),
    );
    let store = Arc::new(LeaseStore::new(crate::lease::LeaseOptions {
        max_keys: 100,
        lifetime_ms: 1_000,
    }));
    let limiter = Limiter::with_resilience(
        config,
        backend.clone(),
        LimiterOptions::default(),
        resilience,
    )
    .with_leases(store.clone());
    let rig = Rig {
        limiter,
        backend,
        clock,
    };
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

#[tokio::test]
async fn in_flight_bound_refuses_at_once_and_frees_on_completion() {
    let rig = rig(1, false, 1);
    // Hold the one place, as a decision waiting on a stalled Redis would.
    let gate = rig.limiter.resilience().in_flight();
    let place = gate.enter().unwrap();
    let refused = rig.limiter.decide(&request("error", &[("a", "1")])).await;
    assert_eq!(refused, Err(LimitError::Overloaded(1)));
    drop(place);
    assert!(
        rig.limiter
            .decide(&request("error", &[("a", "1")]))
            .await
            .is_ok()
    );
    assert_eq!(gate.current(), 0);
}

#[tokio::test]
async fn share_threshold_puts_every_value_of_its_wildcard_in_one_bucket() {
    let text = "domain: share
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: /other/*
    rate_limit: {unit: hour, requests_per_unit: 2}
";
    let config = load_sources(&[("share.yaml".into(), text.into())]).unwrap();
    let clock = ManualClock::new(1_000_000);
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default());
    let limiter = Limiter::new(
        Arc::new(ArcSwap::from_pointee(config)),
        backend,
        LimiterOptions::default(),
    );
    let decide = |value: &'static str| {
        let limiter = &limiter;
        async move {
            limiter
                .decide(&request("share", &[("path", value)]))
                .await
                .unwrap()
                .overall
        }
    };
    // Three values of the shared wildcard: one bucket of 2.
    assert_eq!(decide("/files/a").await, Code::Ok);
    assert_eq!(decide("/files/b").await, Code::Ok);
    assert_eq!(decide("/files/c").await, Code::OverLimit);
    // Without share_threshold each value has its own bucket.
    assert_eq!(decide("/other/a").await, Code::Ok);
    assert_eq!(decide("/other/a").await, Code::Ok);
    assert_eq!(decide("/other/a").await, Code::OverLimit);
    assert_eq!(decide("/other/b").await, Code::Ok);
}

/// A quota bucket over its limit rejects the request only with every other quota bucket, so the
/// over-limit cache never answers for one (nor learns one): each such request is asked of the
/// backend, which decides it with the whole quota group.
#[tokio::test]
async fn the_over_limit_cache_never_answers_for_a_quota_bucket() {
    let rig = rig(1, true, usize::MAX);
    let decide = |pairs: &'static [(&'static str, &'static str)]| {
        let limiter = &rig.limiter;
        async move { limiter.decide(&request("open", pairs)).await.unwrap() }
    };
    let both: &[(&str, &str)] = &[("q1", "x"), ("q2", "x")];
    let codes = |d: &Decision| {
        (
            d.overall,
            d.statuses.iter().map(|s| s.code).collect::<Vec<_>>(),
        )
    };
    assert_eq!(codes(&decide(both).await), (Code::Ok, vec![Code::Ok; 2]));
    let second = decide(both).await;
    assert_eq!(
        codes(&second),
        (Code::Ok, vec![Code::OverLimit, Code::Ok]),
        "q1 over, q2 passes the request"
    );
    assert!(second.statuses.iter().all(|s| s.quota));
    for _ in 0..3 {
        let calls = rig.backend.calls();
        let rejected = decide(both).await;
        assert_eq!(
            codes(&rejected),
            (Code::OverLimit, vec![Code::OverLimit; 2])
        );
        assert!(
            rejected.statuses.iter().all(|s| s.basis == Basis::Backend),
            "{rejected:?}"
        );
        assert_eq!(rig.backend.calls(), calls + 1, "asked every time");
    }
    // An ordinary bucket beside them is still charged when a fresh quota bucket passes.
    let mixed = decide(&[("a", "1"), ("q1", "x"), ("q2", "y")]).await;
    assert_eq!(
        codes(&mixed),
        (Code::Ok, vec![Code::Ok, Code::OverLimit, Code::Ok])
    );
    assert_eq!(mixed.statuses[0].remaining, 3);
    let cache = rig.limiter.resilience().over_limit.as_ref().unwrap();
    assert_eq!(cache.len(), 0, "nothing learned from quota buckets");
}

/// `q2` has a `lease`, but a quota rule is never leased: with a lease store, every hit on it is
/// still decided by the backend beside the request's other quota buckets.
#[tokio::test]
async fn a_quota_rule_is_never_leased() {
    let rig = rig(1, false, usize::MAX);
    let store = Arc::new(LeaseStore::new(crate::lease::LeaseOptions::default()));
    let limiter = rig.limiter.with_leases(store.clone());
    let pair = request("open", &[("q1", "x"), ("q2", "x")]);
    for (overall, q2_left) in [(Code::Ok, 1), (Code::Ok, 0), (Code::OverLimit, 0)] {
        let calls = rig.backend.calls();
        let decision = limiter.decide(&pair).await.unwrap();
        assert_eq!(decision.overall, overall);
        assert_eq!(decision.statuses[1].remaining, q2_left);
        assert_eq!(rig.backend.calls(), calls + 1, "asked every time");
        assert!(store.is_empty(), "nothing leased");
        assert_eq!(store.local_total(), 0);
    }
}
