//! `charge: always` through the limiter: a charge made after the fact lands whatever the
//! answer, never from the over-limit cache, and a refused request charges only such rules.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::*;
use crate::backend::memory::{MemoryBackend, MemoryOptions};
use crate::clock::ManualClock;
use crate::config::load_sources;
use crate::request::{Entry, RequestDescriptor};
use crate::resilience::ResilienceOptions;
use crate::resilience::local::Replicas;

/// `tenant`: 100 per minute, charges always land; `route`: 100 per minute, ordinary; `tight`:
/// 1 per hour, ordinary; `closed`: blocks every request (`requests_per_unit: 0`).
const CONFIG: &str = "domain: ai
descriptors:
  - key: tenant
    charge: always
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 0}
";

fn limiter(cache: bool) -> (Limiter<Arc<MemoryBackend>>, ManualClock) {
    let config = load_sources(&[("ai.yaml".to_owned(), CONFIG.to_owned())]).unwrap();
    let clock = ManualClock::new(1_700_000_040_000);
    let backend = Arc::new(MemoryBackend::new(
        Arc::new(clock.clone()),
        MemoryOptions::default(),
    ));
    let resilience = Resilience::new(
        &ResilienceOptions {
            over_limit_cache_keys: cache.then_some(1_000),
            ..ResilienceOptions::default()
        },
        Arc::new(clock.clone()),
        Arc::new(Replicas::fixed(1)),
    );
    let limiter = Limiter::with_resilience(
        Arc::new(ArcSwap::from_pointee(config)),
        backend,
        LimiterOptions::default(),
        resilience,
    );
    (limiter, clock)
}

/// One descriptor `key=value` asking `hits` (Some(0): check only).
fn descriptor(key: &str, value: &str, hits: Option<u64>) -> RequestDescriptor {
    RequestDescriptor {
        hits_addend: hits,
        ..RequestDescriptor::new(vec![Entry::new(key, value)])
    }
}

fn request(descriptors: Vec<RequestDescriptor>) -> LimitRequest {
    LimitRequest {
        domain: "ai".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// The issue's sequence: a check-only call on the request path, then the response's cost.
#[tokio::test]
async fn a_charge_that_does_not_fit_lands_and_the_check_refuses() {
    let (limiter, clock) = limiter(true);
    let check = request(vec![descriptor("tenant", "t", Some(0))]);
    let charge = request(vec![descriptor("tenant", "t", Some(60))]);
    let mut admitted = 0;
    for _ in 0..10 {
        if limiter.decide(&check).await.unwrap().overall == Code::Ok {
            admitted += 1;
            limiter.decide(&charge).await.unwrap();
        }
    }
    // 60 fits, then 60 more lands on 40 left: -20, and every later check is refused.
    assert_eq!(admitted, 2);
    let refused = limiter.decide(&check).await.unwrap();
    assert_eq!(refused.overall, Code::OverLimit);
    assert_eq!(refused.statuses[0].remaining, 0);
    // 21 tokens at one per 600 ms before one hit fits again.
    assert_eq!(refused.statuses[0].retry_after_ms, Some(Some(12_600)));
    // The over-limit cache now knows the check is refused, yet a charge still reaches the
    // backend and deepens the debt: 120 s of refill from -80 before the check passes.
    let over = limiter.decide(&charge).await.unwrap();
    assert_eq!(over.statuses[0].basis, Basis::Backend);
    assert_eq!(over.overall, Code::OverLimit);
    clock.advance(12_600);
    let still = limiter.decide(&check).await.unwrap();
    assert_eq!(
        still.overall,
        Code::OverLimit,
        "the second debt is not repaid"
    );
    assert_eq!(still.statuses[0].retry_after_ms, Some(Some(36_000)));
    clock.advance(36_000);
    assert_eq!(limiter.decide(&check).await.unwrap().overall, Code::Ok);
}

/// A request refused by one descriptor charges its always rule, never its ordinary ones.
#[tokio::test]
async fn a_refused_request_charges_only_the_always_rule() {
    let (limiter, _) = limiter(false);
    let tight = request(vec![descriptor("tight", "x", None)]);
    assert_eq!(limiter.decide(&tight).await.unwrap().overall, Code::Ok);
    let mixed = request(vec![
        descriptor("tight", "x", None),
        descriptor("tenant", "t", Some(30)),
        descriptor("route", "r", Some(30)),
    ]);
    let d = limiter.decide(&mixed).await.unwrap();
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(
        d.statuses.iter().map(|s| s.code).collect::<Vec<_>>(),
        [Code::OverLimit, Code::Ok, Code::Ok]
    );
    let left = request(vec![
        descriptor("tenant", "t", Some(0)),
        descriptor("route", "r", Some(0)),
    ]);
    let d = limiter.decide(&left).await.unwrap();
    assert_eq!(
        d.statuses.iter().map(|s| s.remaining).collect::<Vec<_>>(),
        [70, 100]
    );
}

/// A request refused before any bucket is asked (a blocking `requests_per_unit: 0` rule) still
/// charges its always rule; its ordinary ones are not asked.
#[tokio::test]
async fn a_blocked_request_still_charges_the_always_rule() {
    let (limiter, _) = limiter(true);
    let blocked = request(vec![
        descriptor("closed", "x", None),
        descriptor("tenant", "t", Some(30)),
        descriptor("route", "r", Some(30)),
    ]);
    let d = limiter.decide(&blocked).await.unwrap();
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(d.statuses[0].basis, Basis::Blocked);
    assert_eq!(d.statuses[1].basis, Basis::Backend);
    assert_eq!(d.statuses[2].basis, Basis::NotEvaluated);
    let left = request(vec![
        descriptor("tenant", "t", Some(0)),
        descriptor("route", "r", Some(0)),
    ]);
    let d = limiter.decide(&left).await.unwrap();
    assert_eq!(
        d.statuses.iter().map(|s| s.remaining).collect::<Vec<_>>(),
        [70, 100]
    );
}
