//! The engine against the memory backend on a manual clock: pushes driven by hand.

use std::sync::Arc;

use arc_swap::ArcSwap;
use futures::FutureExt;

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
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: hourly
    rate_limit: {unit: hour, requests_per_unit: 10}
";

fn quotas(clock: &ManualClock) -> Arc<Quotas<MemoryBackend>> {
    quotas_with(clock, ResilienceOptions::default())
}

fn quotas_with(clock: &ManualClock, options: ResilienceOptions) -> Arc<Quotas<MemoryBackend>> {
    let sources = vec![("mesh.yaml".to_string(), CONFIG.to_string())];
    let config = Arc::new(ArcSwap::from_pointee(load_sources(&sources).unwrap()));
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default());
    let resilience = Resilience::new(
        &options,
        Arc::new(clock.clone()),
        Arc::new(Replicas::fixed(1)),
    );
    let limiter = Limiter::with_resilience(config, backend, LimiterOptions::default(), resilience);
    Arc::new(Quotas::new(Arc::new(limiter), QuotaOptions::default()))
}

fn acme() -> BucketId {
    Arc::new([("tenant".to_string(), "acme".to_string())].into())
}

/// The actions queued so far (each bucket's newest).
fn queued(outbox: &Outbox) -> Vec<Action> {
    match outbox.next().now_or_never() {
        Some(Next::Actions(actions)) => actions,
        Some(Next::End(end)) => panic!("ended: {end:?}"),
        None => Vec::new(),
    }
}

/// The strategies of the assignments queued so far.
fn assigned(outbox: &Outbox) -> Vec<Strategy> {
    queued(outbox)
        .into_iter()
        .filter_map(|action| match action {
            Action::Assign { strategy, .. } => Some(strategy),
            Action::Abandon { .. } => None,
        })
        .collect()
}

fn bucket(key: &str, i: usize) -> BucketId {
    Arc::new([(key.to_string(), format!("b{i}"))].into())
}

fn usage(bucket: BucketId) -> Usage {
    Usage {
        bucket,
        allowed: 1,
        denied: 0,
    }
}

/// A data plane that does not read while pushes go on gets, when it reads, every bucket's newest
/// assignment once: nothing dropped, nothing counted as sent before the stream's transport took
/// it, and what was replaced unread counted as superseded.
#[tokio::test]
async fn a_slow_reader_gets_every_buckets_newest_assignment_and_only_deliveries_count() {
    let clock = ManualClock::new(1_000_000);
    let quotas = quotas(&clock);
    let (stream, outbox) = quotas.open("mesh");
    let mut usages: Vec<Usage> = (0..50)
        .flat_map(|i| [usage(bucket("blocked", i)), usage(bucket("nobody", i))])
        .collect();
    usages.push(usage(acme()));
    quotas.report_all(stream, usages);
    for _ in 0..10 {
        clock.advance(200);
        quotas.push().await;
    }
    let stats = quotas.stats();
    assert_eq!(stats.sent("deny_all") + stats.sent("allow_all"), 0);
    let actions = queued(&outbox);
    assert_eq!(actions.len(), 101, "one action per bucket");
    let count = |kind: &str| {
        actions
            .iter()
            .filter(|a| matches!(a, Action::Assign { strategy, .. } if strategy.kind() == kind))
            .count() as u64
    };
    for kind in ["deny_all", "allow_all", "token_bucket"] {
        assert_eq!(stats.sent(kind), count(kind), "{kind}");
    }
    assert_eq!((count("deny_all"), count("allow_all")), (50, 50));
    assert!(stats.superseded() >= 10, "{}", stats.superseded());
}

/// A standing assignment carries a ttl of whole seconds (`--rlqs-assignment-ttl` rounded up) and
/// is queued again by the last push before it expires that leaves the next push less than half a
/// push interval of margin; never by a push whose next one still comes in time.
#[tokio::test]
async fn standing_assignments_are_re_sent_before_they_expire() {
    let clock = ManualClock::new(1_000_000);
    let quotas = quotas(&clock);
    let options = *quotas.options();
    let push_ms = u64::try_from(options.push_interval.as_millis()).unwrap();
    let (stream, outbox) = quotas.open("mesh");
    quotas.report_all(stream, vec![usage(bucket("blocked", 0))]);
    let [Action::Assign { ttl, .. }] = &queued(&outbox)[..] else {
        panic!("one standing assignment at once")
    };
    let ttl_ms = u64::try_from(ttl.as_millis()).unwrap();
    assert!(ttl_ms >= 1000 && ttl_ms % 1000 == 0, "{ttl:?}");
    assert!(ttl_ms >= options.pool.ttl_ms);
    let mut sent_at = 0;
    let mut resends = 0;
    for step in 1..=4 * ttl_ms / push_ms {
        clock.advance(push_ms);
        quotas.push().await;
        let now = step * push_ms;
        if queued(&outbox).is_empty() {
            // Not re-sent: the next push still comes before it expires.
            assert!(
                now + push_ms < sent_at + ttl_ms,
                "late at {now} (sent {sent_at})"
            );
        } else {
            // Re-sent before it expired, and only when the next push would leave too little.
            assert!(now < sent_at + ttl_ms, "expired at {now} (sent {sent_at})");
            assert!(
                now + push_ms + push_ms / 2 >= sent_at + ttl_ms,
                "early at {now} (sent {sent_at})"
            );
            sent_at = now;
            resends += 1;
        }
    }
    assert!(resends >= 3, "{resends}");
}

/// A take the shared bucket refused (another client emptied it) must not shrink the pool's next
/// ask to nothing: the token bucket leases whatever the key holds, and once it refills the data
/// plane is assigned again. (A refusal used to set a take limit of 0, and the next push asked
/// for a lease of 0 - 1 tokens.)
#[tokio::test]
async fn a_refused_take_on_a_token_bucket_asks_again_and_assigns_after_the_refill() {
    let clock = ManualClock::new(1_000_000);
    let quotas = quotas(&clock);
    let (stream, outbox) = quotas.open("mesh");
    quotas.report_all(
        stream,
        vec![Usage {
            bucket: acme(),
            allowed: 1,
            denied: 0,
        }],
    );
    quotas.push().await;
    let first = match assigned(&outbox)[..] {
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
        for strategy in assigned(&outbox) {
            assert!(strategy.rate_per_ms() < first.rate_per_ms(), "{strategy:?}");
        }
    }
    // A second later the bucket is full again.
    clock.advance(1_000);
    quotas.push().await;
    assert!(
        matches!(assigned(&outbox)[..], [Strategy::TokenBucket(_)]),
        "a token bucket once the shared bucket refilled"
    );
}

/// A burst of subscriptions does not stay allocated: once its stream closes and the push drops
/// its pools, the replica's maps give their memory back.
#[tokio::test]
async fn a_closed_streams_subscriptions_give_their_memory_back() {
    let clock = ManualClock::new(1_000_000);
    let quotas = quotas(&clock);
    let (stream, _outbox) = quotas.open("mesh");
    let usages: Vec<Usage> = (0..5_000).map(|i| usage(bucket("tenant", i))).collect();
    quotas.report_all(stream, usages);
    quotas.push().await;
    assert!(quotas.lock().pools.capacity() >= 5_000);
    quotas.close(stream);
    clock.advance(200);
    quotas.push().await;
    let state = quotas.lock();
    assert!(state.pools.is_empty());
    assert!(
        state.pools.capacity() < 500,
        "the pools' map kept {} slots",
        state.pools.capacity()
    );
}

/// A pool that gives tokens back makes this replica's over-limit cache (as on Redis) forget the
/// key: `10/hour`, one data plane holding the ten; as the bucket refills the pool also takes its
/// one-token reserve, and RLS, having taken the rest, is rejected with a retry-after of minutes,
/// cached. When the data plane goes, its ten count as spent and the reserve goes back: RLS is
/// admitted at once.
#[tokio::test]
async fn a_pool_giving_tokens_back_makes_the_over_limit_cache_forget_the_key() {
    let clock = ManualClock::new(1_000_000);
    let options = ResilienceOptions {
        over_limit_cache_keys: Some(1_000),
        ..ResilienceOptions::default()
    };
    let quotas = quotas_with(&clock, options);
    let hourly: BucketId = Arc::new([("hourly".to_string(), "h".to_string())].into());
    let (stream, outbox) = quotas.open("mesh");
    let report = || {
        let usage = Usage {
            bucket: hourly.clone(),
            allowed: 0,
            denied: 0,
        };
        quotas.report_all(stream, vec![usage]);
    };
    report();
    quotas.push().await;
    match assigned(&outbox)[..] {
        [Strategy::TokenBucket(b)] => assert_eq!(b.max_tokens, 10, "{b:?}"),
        ref other => panic!("the ten tokens at the first push, got {other:?}"),
    }
    for _ in 0..2 {
        clock.advance(360_000);
        report();
        quotas.push().await;
    }
    let rls = LimitRequest {
        domain: "mesh".into(),
        descriptors: vec![RequestDescriptor::new(vec![Entry::new("hourly", "h")])],
        hits_addend: 0,
    };
    let decide = async || quotas.limiter.decide(&rls).await.unwrap().overall;
    // RLS takes what the pool left in the shared bucket.
    while decide().await == Code::Ok {}
    let cache = quotas.limiter.resilience().over_limit.as_ref().unwrap();
    assert_eq!(cache.len(), 1, "the rejection is cached, for minutes");
    assert_eq!(decide().await, Code::OverLimit);
    quotas.close(stream);
    clock.advance(1);
    quotas.push().await;
    assert!(
        cache.is_empty(),
        "the refund made the cached rejection stale"
    );
    assert_eq!(decide().await, Code::Ok);
}

/// A `1/day` rule with one data plane: its one token is assigned at the first push.
#[tokio::test]
async fn a_one_per_day_rule_assigns_its_token_at_the_first_push() {
    let clock = ManualClock::new(1_000_000);
    let quotas = quotas(&clock);
    let (stream, outbox) = quotas.open("mesh");
    let daily: BucketId = Arc::new([("daily".to_string(), "d".to_string())].into());
    let usage = Usage {
        bucket: daily,
        allowed: 0,
        denied: 0,
    };
    quotas.report_all(stream, vec![usage]);
    quotas.push().await;
    match assigned(&outbox)[..] {
        [Strategy::TokenBucket(b)] => assert_eq!(b.max_tokens, 1, "{b:?}"),
        ref other => panic!("the one token at the first push, got {other:?}"),
    }
}
