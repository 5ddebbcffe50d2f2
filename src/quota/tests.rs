//! The engine against the memory backend on a manual clock: pushes driven by hand.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::*;
use crate::backend::memory::{MemoryBackend, MemoryOptions};
use crate::clock::ManualClock;
use crate::config::load_sources;
use crate::limiter::{Code, LimiterOptions};
use crate::request::{LimitRequest, RequestDescriptor};
use crate::resilience::local::Replicas;
use crate::resilience::{Resilience, ResilienceOptions};

const CONFIG: &str = "
domain: mesh
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
";

fn quotas(clock: &ManualClock) -> Arc<Quotas<MemoryBackend>> {
    let sources = vec![("mesh.yaml".to_string(), CONFIG.to_string())];
    let config = Arc::new(ArcSwap::from_pointee(load_sources(&sources).unwrap()));
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default());
    let resilience = Resilience::new(
        &ResilienceOptions::default(),
        Arc::new(clock.clone()),
        Arc::new(Replicas::fixed(1)),
    );
    let limiter = Limiter::with_resilience(config, backend, LimiterOptions::default(), resilience);
    Arc::new(Quotas::new(Arc::new(limiter), QuotaOptions::default()))
}

fn acme() -> BucketId {
    Arc::new([("tenant".to_string(), "acme".to_string())].into())
}

/// The strategies of the assignments queued so far, in order.
fn assigned(inbox: &mut mpsc::Receiver<Vec<Action>>) -> Vec<Strategy> {
    let mut out = Vec::new();
    while let Ok(actions) = inbox.try_recv() {
        for action in actions {
            if let Action::Assign { strategy, .. } = action {
                out.push(strategy);
            }
        }
    }
    out
}

/// A take the shared bucket refused (another client emptied it) must not shrink the pool's next
/// ask to nothing: the token bucket leases whatever the key holds, and once it refills the data
/// plane is assigned again. (A refusal used to set a take limit of 0, and the next push asked
/// for a lease of 0 - 1 tokens.)
#[tokio::test]
async fn a_refused_take_on_a_token_bucket_asks_again_and_assigns_after_the_refill() {
    let clock = ManualClock::new(1_000_000);
    let quotas = quotas(&clock);
    let (stream, mut inbox) = quotas.open("mesh");
    quotas.report_all(
        stream,
        vec![Usage {
            bucket: acme(),
            allowed: 1,
            denied: 0,
        }],
    );
    quotas.push().await;
    let first = match assigned(&mut inbox)[..] {
        [strategy @ Strategy::TokenBucket(_)] => strategy,
        ref other => panic!("a first token bucket, got {other:?}"),
    };
    // RLS calls on the same descriptor take what is left.
    let rls = LimitRequest {
        domain: "mesh".into(),
        descriptors: vec![RequestDescriptor::new(vec![Entry::new("tenant", "acme")])],
        hits_addend: 0,
    };
    let drain = async || while quotas.limiter.decide(&rls).await.unwrap().overall == Code::Ok {};
    // The data plane spent part of its assignment: the next push takes more, and is refused;
    // so is the one after it, at the same instant. The pool assigns only what it still holds.
    clock.advance(200);
    quotas.report_all(
        stream,
        vec![Usage {
            bucket: acme(),
            allowed: 3,
            denied: 0,
        }],
    );
    drain().await;
    for _ in 0..2 {
        quotas.push().await;
        for strategy in assigned(&mut inbox) {
            assert!(strategy.rate_per_ms() < first.rate_per_ms(), "{strategy:?}");
        }
    }
    // A second later the bucket is full again.
    clock.advance(1_000);
    quotas.push().await;
    assert!(
        matches!(assigned(&mut inbox)[..], [Strategy::TokenBucket(_)]),
        "a token bucket once the shared bucket refilled"
    );
}
