//! The resilience features through the real path (gRPC in, Redis out), one redis-server each:
//! the over-limit cache sparing Redis, the in-flight bound, the replica heartbeat. The faults
//! themselves (kill, stop, restart, failover) are in `chaos/`.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::settings::RedisModeArg;
use sluice_harness::rls::{OK, OVER_LIMIT, header, request};
use sluice_harness::sluice::Sluice;
use sluice_harness::{RedisServer, command_calls};
use tonic::transport::Channel;

/// 3 per hour: after three hits the bucket is empty for 20 minutes.
const SLOW: &str = r#"
domain: res
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 100}
"#;

/// One call that must succeed.
async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: &[(&str, &str)],
) -> RateLimitResponse {
    client
        .should_rate_limit(request("res", descriptors))
        .await
        .expect("call succeeds")
        .into_inner()
}

fn script_calls(redis: &RedisServer) -> u64 {
    command_calls(redis, "evalsha") + command_calls(redis, "eval")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_limit_cache_answers_without_asking_redis() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(SLOW, &[redis.url()], RedisModeArg::Standalone, |s| {
        // A fixed count, so no heartbeat shows up in the command counts.
        s.replicas = 1;
    })
    .await;
    let mut client = sluice.client().await;
    for _ in 0..3 {
        let r = call(&mut client, &[("client", "hammer")]).await;
        assert_eq!(r.overall_code, OK);
    }
    let before = script_calls(&redis);
    let first = call(&mut client, &[("client", "hammer")]).await;
    assert_eq!(first.overall_code, OVER_LIMIT);
    assert_eq!(
        script_calls(&redis),
        before + 1,
        "the first rejection asks Redis"
    );
    for _ in 0..50 {
        let r = call(&mut client, &[("client", "hammer")]).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(header(&r, "retry-after"), Some("1200"));
        assert_eq!(
            header(&r, "x-ratelimit-degraded"),
            None,
            "exact, not degraded"
        );
    }
    // With another descriptor that has tokens: still rejected locally, and `other` not charged.
    let both = call(&mut client, &[("other", "o"), ("client", "hammer")]).await;
    assert_eq!(both.overall_code, OVER_LIMIT);
    assert_eq!(both.statuses[0].code, OK);
    let after = script_calls(&redis);
    println!(
        "over-limit cache: 51 rejections cost {} script calls",
        after - before
    );
    assert_eq!(after, before + 1, "cached rejections never reach Redis");
    let keys: Vec<String> = redis.cmd(&["KEYS", "sluice:{res|other=o}"]);
    assert!(
        keys.is_empty(),
        "the other bucket was never touched: {keys:?}"
    );
    sluice.stop().await;

    // Switched off, every request asks.
    let sluice = Sluice::start(SLOW, &[redis.url()], RedisModeArg::Standalone, |s| {
        s.replicas = 1;
        s.over_limit_cache = false;
    })
    .await;
    let mut client = sluice.client().await;
    let before = script_calls(&redis);
    for _ in 0..10 {
        let r = call(&mut client, &[("client", "hammer")]).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
    }
    assert!(script_calls(&redis) >= before + 10);
    sluice.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_bound_refuses_with_resource_exhausted() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(SLOW, &[redis.url()], RedisModeArg::Standalone, |s| {
        s.replicas = 1;
        s.max_in_flight = 4;
        // Long enough that the stalled calls are still waiting when the fifth arrives.
        s.redis_timeout = Duration::from_secs(3);
        s.failure_mode = sluice::settings::FailureModeArg::Open;
    })
    .await;
    let client = sluice.client().await;
    redis.pause();
    let stalled: Vec<_> = (0..4)
        .map(|i| {
            let mut c = client.clone();
            tokio::spawn(async move {
                c.should_rate_limit(request("res", &[("other", &format!("s{i}"))]))
                    .await
                    .map(|r| r.into_inner())
            })
        })
        .collect();
    let in_flight = sluice.running().in_flight.clone();
    wait_until_async("4 decisions in progress", || in_flight.current() == 4).await;
    let mut c = client.clone();
    let refused = c
        .should_rate_limit(request("res", &[("other", "fifth")]))
        .await
        .expect_err("past the bound");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(refused.message().contains("4"), "{}", refused.message());
    redis.resume();
    for task in stalled {
        let r = task.await.unwrap().expect("a waiting call is answered");
        assert_eq!(r.overall_code, OK);
    }
    // The places are free again.
    let r = call(&mut c, &[("other", "after")]).await;
    assert_eq!(r.overall_code, OK);
    sluice.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_count_each_other_through_heartbeats() {
    let redis = RedisServer::start();
    let a = Sluice::start(SLOW, &[redis.url()], RedisModeArg::Standalone, |_| {}).await;
    assert_eq!(a.replicas(), 1, "alone at start");
    let b = Sluice::start(SLOW, &[redis.url()], RedisModeArg::Standalone, |_| {}).await;
    assert_eq!(b.replicas(), 2, "counted before serving");
    wait_until_async("the first replica sees the second", || a.replicas() == 2).await;
    let members: Vec<String> = redis.cmd(&["ZRANGE", "sluice:replicas", "0", "-1"]);
    assert_eq!(members.len(), 2, "{members:?}");
    let ttl: i64 = redis.cmd(&["PTTL", "sluice:replicas"]);
    assert!(ttl > 0 && ttl <= 5_000, "{ttl}");
    // A configured count is used as is and writes no heartbeat.
    let fixed = Sluice::start(SLOW, &[redis.url()], RedisModeArg::Standalone, |s| {
        s.replicas = 7;
    })
    .await;
    assert_eq!(fixed.replicas(), 7);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let members: u64 = redis.cmd(&["ZCARD", "sluice:replicas"]);
    assert_eq!(members, 2, "the fixed replica writes no heartbeat");
    // When one stops, the others forget it within the TTL.
    b.stop().await;
    let members: u64 = redis.cmd(&["ZCARD", "sluice:replicas"]);
    assert_eq!(members, 2);
    wait_until_async("the stopped replica expires", || a.replicas() == 1).await;
    a.stop().await;
    fixed.stop().await;
}

/// Polls `ready` every 20 ms for up to 10 s without blocking the runtime.
async fn wait_until_async(what: &str, mut ready: impl FnMut() -> bool) {
    for _ in 0..500 {
        if ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}
