//! The limiter's tests: failure policies, the over-limit cache, the in-flight bound, against a
//! memory backend that can be made to fail or stall (leases and shards: `tests_leases.rs`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use super::*;
use crate::algorithm::Verdict;
use crate::backend::Hit;
use crate::backend::memory::{MemoryBackend, MemoryOptions};
use crate::clock::ManualClock;
use crate::config::load_sources;
use crate::request::{Entry, RequestDescriptor};
use crate::resilience::ResilienceOptions;
use crate::resilience::local::Replicas;
use crate::rule::FailureMode;

/// A memory backend that counts calls and fails the hits whose key contains a chosen part
/// (a dead Redis, or one dead Cluster node).
pub(super) struct Flaky {
    pub(super) inner: MemoryBackend,
    pub(super) calls: AtomicUsize,
    pub(super) failing: Mutex<HashSet<String>>,
    /// While set, every check waits for ever (a Redis that stopped answering).
    pub(super) stalled: AtomicBool,
}

impl Flaky {
    pub(super) fn fail(&self, part: &str) {
        self.failing.lock().unwrap().insert(part.to_string());
    }
    pub(super) fn heal(&self) {
        self.failing.lock().unwrap().clear();
    }
    pub(super) fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn is_failing(&self, key: &str) -> bool {
        self.failing.lock().unwrap().iter().any(|p| key.contains(p))
    }
}

impl Backend for Flaky {
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

pub(super) struct Rig {
    pub(super) limiter: Limiter<Arc<Flaky>>,
    pub(super) backend: Arc<Flaky>,
    pub(super) clock: ManualClock,
}

pub(super) fn rig(replicas: u64, cache: bool, max_in_flight: usize) -> Rig {
    let sources: Vec<(String, String)> = ["open", "closed", "local", "error"]
        .iter()
        .map(|mode| {
            (
                format!("{mode}.yaml"),
                format!("domain: {mode}\nfailure_mode: {mode}\n{CONFIG}"),
            )
        })
        .collect();
    let resilience = ResilienceOptions {
        over_limit_cache_keys: cache.then_some(1_000),
        max_in_flight,
        ..ResilienceOptions::default()
    };
    rig_on(&sources, &resilience, replicas, |limiter| limiter)
}

/// A limiter over the configs `sources` on a [`Flaky`] memory backend, with `resilience` for
/// `replicas` replicas, finished by `finish` (e.g. given a lease store).
pub(super) fn rig_on(
    sources: &[(String, String)],
    resilience: &ResilienceOptions,
    replicas: u64,
    finish: impl FnOnce(Limiter<Arc<Flaky>>) -> Limiter<Arc<Flaky>>,
) -> Rig {
    let config = Arc::new(ArcSwap::from_pointee(load_sources(sources).unwrap()));
    let clock = ManualClock::new(1_000_000);
    let backend = Arc::new(Flaky {
        inner: MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default()),
        calls: AtomicUsize::new(0),
        failing: Mutex::new(HashSet::new()),
        stalled: AtomicBool::new(false),
    });
    let resilience = Resilience::new(
        resilience,
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
        limiter: finish(limiter),
        backend,
        clock,
    }
}

pub(super) fn request(domain: &str, descriptors: &[(&str, &str)]) -> LimitRequest {
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
    let store = Arc::new(LeaseStore::new(
        crate::limiter::lease::LeaseOptions::default(),
    ));
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
