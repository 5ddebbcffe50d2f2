//! Token leasing (`lease: B`) through the real path: gRPC in, Redis out, several sluice replicas
//! sharing one Redis. The limits are per day so the refill during a test (seconds) is below one
//! token and every count is exact whatever the machine's speed.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use sluice::settings::RedisModeArg;
use sluice_harness::rls::{OK, OVER_LIMIT, request};
use sluice_harness::sluice::Sluice;
use sluice_harness::{RedisServer, command_calls};

const CONFIG: &str = r#"
domain: lease
descriptors:
  - key: hot
    rate_limit: {unit: day, requests_per_unit: 100, lease: 10}
  - key: scarce
    rate_limit: {unit: day, requests_per_unit: 1}
"#;

/// A replica whose leases outlive any test, so no sweep races an assertion.
async fn start(redis: &RedisServer) -> Sluice {
    start_with_lifetime(redis, Duration::from_secs(600)).await
}

async fn start_with_lifetime(redis: &RedisServer, lifetime: Duration) -> Sluice {
    Sluice::start(CONFIG, &[redis.url()], RedisModeArg::Standalone, |s| {
        s.lease_lifetime = lifetime;
    })
    .await
}

async fn ask(sluice: &Sluice, descriptors: &[(&str, &str)]) -> RateLimitResponse {
    sluice
        .client()
        .await
        .should_rate_limit(request("lease", descriptors))
        .await
        .expect("ShouldRateLimit answers")
        .into_inner()
}

/// Whole tokens the shared bucket of `hot=<value>` holds, read from Redis (the refill of 100 per
/// day adds a fraction of one during a test).
fn bucket_tokens(redis: &RedisServer, value: &str) -> f64 {
    let key = format!("sluice:{{lease|hot={value}}}");
    let tokens: String = redis.cmd(&["HGET", key.as_str(), "t"]);
    tokens.parse::<f64>().expect("a number of tokens").floor()
}

/// Three replicas with `lease: 10` on 100 per day, 300 requests round robin: at most 100 are
/// admitted overall (tokens leave Redis before they are spent), at least 100 − 3 × 9 (each
/// replica can strand at most B − 1 in its lease), and Redis runs at least 5× fewer scripts than
/// there are requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_hold_the_limit_with_few_script_calls() {
    let redis = RedisServer::start();
    let replicas = [
        start(&redis).await,
        start(&redis).await,
        start(&redis).await,
    ];
    let before = command_calls(&redis, "evalsha") + command_calls(&redis, "eval");
    let mut clients = Vec::new();
    for r in &replicas {
        clients.push(r.client().await);
    }
    let (mut ok, mut over) = (0u64, 0u64);
    let requests = 300u64;
    for i in 0..requests {
        let client = &mut clients[(i % 3) as usize];
        let code = client
            .should_rate_limit(request("lease", &[("hot", "shared")]))
            .await
            .unwrap()
            .into_inner()
            .overall_code;
        match code {
            OK => ok += 1,
            OVER_LIMIT => over += 1,
            other => panic!("unexpected code {other}"),
        }
    }
    let scripts = command_calls(&redis, "evalsha") + command_calls(&redis, "eval") - before;
    println!("lease: {ok} OK, {over} over limit, {scripts} script calls for {requests} requests");
    assert!(ok <= 100, "{ok} admitted, the limit is 100");
    assert!(ok >= 100 - 3 * 9, "{ok} admitted: more than 3 × 9 stranded");
    assert!(
        scripts * 5 <= requests,
        "{scripts} script calls for {requests} requests"
    );
    for r in replicas {
        r.stop().await;
    }
}

/// On shutdown a replica hands its unused leased tokens back to the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_unused_tokens() {
    let redis = RedisServer::start();
    let sluice = start(&redis).await;
    let first = ask(&sluice, &[("hot", "returned")]).await;
    assert_eq!(first.overall_code, OK);
    // One for the request, nine leased: Redis holds 90; the replica can spend 99 more.
    assert_eq!(bucket_tokens(&redis, "returned"), 90.0);
    assert_eq!(first.statuses[0].limit_remaining, 99);
    let second = ask(&sluice, &[("hot", "returned")]).await;
    assert_eq!(second.statuses[0].limit_remaining, 98);
    assert_eq!(bucket_tokens(&redis, "returned"), 90.0, "paid locally");
    sluice.stop().await;
    // The 8 tokens left in the lease are back.
    assert_eq!(bucket_tokens(&redis, "returned"), 98.0);
}

/// A request rejected because of another descriptor spends none of the leased tokens, whether
/// Redis rejected it or the over-limit cache did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_request_does_not_spend_leased_tokens() {
    let redis = RedisServer::start();
    let sluice = start(&redis).await;
    assert_eq!(ask(&sluice, &[("hot", "kept")]).await.overall_code, OK);
    // `scarce` pays once; the leased `hot` token is paid locally.
    let both = ask(&sluice, &[("hot", "kept"), ("scarce", "x")]).await;
    assert_eq!(both.overall_code, OK);
    assert_eq!(
        both.statuses[0].limit_remaining,
        98,
        "{both:?} redis {}",
        bucket_tokens(&redis, "kept")
    );
    for _ in 0..5 {
        let rejected = ask(&sluice, &[("hot", "kept"), ("scarce", "x")]).await;
        assert_eq!(rejected.overall_code, OVER_LIMIT);
    }
    // Still 8 in the lease after the five rejections: the next hit leaves 90 + 7.
    let alone = ask(&sluice, &[("hot", "kept")]).await;
    assert_eq!(alone.overall_code, OK);
    assert_eq!(alone.statuses[0].limit_remaining, 97);
    assert_eq!(bucket_tokens(&redis, "kept"), 90.0);
    sluice.stop().await;
    assert_eq!(bucket_tokens(&redis, "kept"), 97.0);
}

/// A lease past its lifetime is not spent: the sweeper hands its tokens back to Redis, and the
/// next request takes a fresh batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_go_back_to_redis() {
    let redis = RedisServer::start();
    let sluice = start_with_lifetime(&redis, Duration::from_millis(50)).await;
    assert_eq!(ask(&sluice, &[("hot", "expiring")]).await.overall_code, OK);
    // Polled without blocking: the sweeper runs on this test's runtime.
    let mut waited = Duration::ZERO;
    while bucket_tokens(&redis, "expiring") != 99.0 {
        assert!(
            waited < Duration::from_secs(20),
            "the expired lease was not returned"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    let metrics = sluice.admin_get("/metrics").await.1;
    assert!(
        metrics.contains("sluice_lease_returned_tokens_total 9"),
        "{metrics}"
    );
    sluice.stop().await;
}
