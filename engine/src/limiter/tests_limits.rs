//! Several limits on one descriptor (`rate_limits`), decided by the limiter over a memory
//! backend whose clock the test holds: #190's own example, 5 per second, 60 per 30 seconds and
//! 100 per 5 minutes on one tenant.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::*;
use crate::algorithm::{Algorithm, BucketParams};
use crate::backend::Hit;
use crate::backend::memory::{MemoryBackend, MemoryOptions};
use crate::clock::{Clock, ManualClock};
use crate::config::load_sources;
use crate::key::{RuleTag, bucket_key};
use crate::request::{Entry, RequestDescriptor};
use crate::rule::Unit;

const CONFIG: &str = "domain: api
descriptors:
  - key: tenant
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: second, unit_multiplier: 30, requests_per_unit: 60}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: fixed_window}
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 1000}
";

/// 100 s into a 5-minute window of the epoch.
const T0: u64 = 1_000_000;

struct Rig {
    limiter: Limiter<MemoryBackend>,
    clock: ManualClock,
}

fn rig(config: &str) -> Rig {
    let config = load_sources(&[("api.yaml".to_owned(), config.to_owned())]).unwrap();
    let clock = ManualClock::new(T0);
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default());
    let limiter = Limiter::with_resilience(
        Arc::new(ArcSwap::from_pointee(config)),
        backend,
        LimiterOptions::default(),
        Resilience::new(
            &crate::resilience::ResilienceOptions::default(),
            Arc::new(clock.clone()),
            Arc::new(crate::resilience::local::Replicas::fixed(1)),
        ),
    );
    Rig { limiter, clock }
}

fn tenant(extra: &[(&str, &str)]) -> LimitRequest {
    let mut descriptors = vec![RequestDescriptor::new(vec![Entry::new("tenant", "acme")])];
    descriptors.extend(
        extra
            .iter()
            .map(|(k, v)| RequestDescriptor::new(vec![Entry::new(*k, *v)])),
    );
    LimitRequest {
        domain: "api".into(),
        descriptors,
        hits_addend: 0,
    }
}

impl Rig {
    async fn decide(&self, request: &LimitRequest) -> Decision {
        self.limiter.decide(request).await.unwrap()
    }

    /// Hits the limit of `window_secs` still holds, read without counting.
    async fn left(&self, window_secs: u64, algorithm: Algorithm, params: BucketParams) -> u64 {
        let key = bucket_key(
            "sluice:",
            "api",
            &[Entry::new("tenant", "acme")],
            RuleTag::Window(window_secs),
            algorithm,
        );
        let peek = Hit::new(key, params, 0).using(algorithm);
        self.limiter.backend().check(&[peek]).await.unwrap()[0].remaining
    }
}

fn params(capacity: u64, unit_ms: u64) -> BucketParams {
    BucketParams {
        capacity,
        requests_per_unit: capacity,
        unit_ms,
    }
}

/// (requests_per_unit, unit, unit_multiplier) of the limit a status reports.
fn reported(status: &Status) -> (u32, Unit, u32) {
    let l = status.limit.as_ref().expect("a limited status");
    (l.requests_per_unit, l.unit, l.unit_multiplier)
}

#[tokio::test]
async fn every_limit_must_pass_and_the_most_constraining_answers() {
    let rig = rig(CONFIG);
    for left in (0..5).rev() {
        let d = rig.decide(&tenant(&[])).await;
        assert_eq!(d.overall, Code::Ok);
        // The per-second limit has the fewest hits left: it is the one reported.
        assert_eq!(d.statuses[0].remaining, left);
        assert_eq!(reported(&d.statuses[0]), (5, Unit::Second, 1));
    }
    let d = rig.decide(&tenant(&[])).await;
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(reported(&d.statuses[0]), (5, Unit::Second, 1));
    assert_eq!(d.statuses[0].retry_after_ms, Some(Some(200)));
    // The refused request charged none of the other limits.
    let thirty = params(60, 30_000);
    let five_minutes = params(100, 300_000);
    assert_eq!(rig.left(30, Algorithm::TokenBucket, thirty).await, 55);
    assert_eq!(
        rig.left(300, Algorithm::FixedWindow, five_minutes).await,
        95
    );

    // Five a second: the 30-second limit (2 a second back) runs dry first and then answers,
    // with its own wait.
    let mut admitted = 5;
    let refusal = 'run: loop {
        rig.clock.advance(1_000);
        for _ in 0..5 {
            let d = rig.decide(&tenant(&[])).await;
            if d.overall == Code::OverLimit {
                break 'run d;
            }
            admitted += 1;
        }
        assert!(admitted < 100, "the 30-second limit never refused");
    };
    assert_eq!(reported(&refusal.statuses[0]), (60, Unit::Second, 30));
    let wait = refusal.statuses[0].retry_after_ms.flatten().unwrap();
    assert!((1..=500).contains(&wait), "{wait}");
    // Within 30 s of the start: at most 60 + 2 a second were admitted, and every admitted
    // request counted once in the 5-minute window (nothing for the refused ones).
    let elapsed_s = (rig.clock.now_ms() - T0) / 1_000;
    assert!(
        admitted <= 60 + 2 * elapsed_s,
        "{admitted} in {elapsed_s} s"
    );
    assert_eq!(
        rig.left(300, Algorithm::FixedWindow, five_minutes).await,
        100 - admitted
    );
}

#[tokio::test]
async fn a_request_refused_elsewhere_charges_no_limit_and_a_refund_reaches_every_limit() {
    let config = CONFIG.replace("requests_per_unit: 1000", "requests_per_unit: 1");
    let rig = rig(&config);
    assert_eq!(
        rig.decide(&tenant(&[("other", "x")])).await.overall,
        Code::Ok
    );
    // `other` is spent: the request is refused and none of the tenant's limits is charged.
    let d = rig.decide(&tenant(&[("other", "x")])).await;
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(d.statuses[0].code, Code::Ok);
    assert_eq!(
        rig.left(1, Algorithm::TokenBucket, params(5, 1_000)).await,
        4
    );
    assert_eq!(
        rig.left(30, Algorithm::TokenBucket, params(60, 30_000))
            .await,
        59
    );
    // A refund (Envoy's `is_negative_hits`) gives back to every limit of the descriptor.
    let mut refund = tenant(&[]);
    refund.descriptors[0].is_negative_hits = true;
    assert_eq!(rig.decide(&refund).await.overall, Code::Ok);
    assert_eq!(
        rig.left(1, Algorithm::TokenBucket, params(5, 1_000)).await,
        5
    );
    assert_eq!(
        rig.left(30, Algorithm::TokenBucket, params(60, 30_000))
            .await,
        60
    );
    assert_eq!(
        rig.left(300, Algorithm::FixedWindow, params(100, 300_000))
            .await,
        100
    );
}

#[tokio::test]
async fn a_request_override_replaces_every_configured_limit() {
    let rig = rig(CONFIG);
    let mut request = tenant(&[]);
    request.descriptors[0].limit_override = Some(crate::request::LimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour,
    });
    assert_eq!(rig.decide(&request).await.overall, Code::Ok);
    let d = rig.decide(&request).await;
    assert_eq!(d.overall, Code::OverLimit);
    assert_eq!(reported(&d.statuses[0]), (1, Unit::Hour, 1));
    // The configured limits were never charged.
    assert_eq!(
        rig.left(1, Algorithm::TokenBucket, params(5, 1_000)).await,
        5
    );
}
