//! Backend hardening through the real path (gRPC in; the memory backend, or a real redis-server
//! out): a flood of fresh values never resets a client at its limit, and foreign data under one
//! key — a bucket's, the probe's, the heartbeat's — is that key's problem, repaired, never a
//! Redis failure that opens the breaker for every tenant.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice::settings::RedisModeArg;
use sluice_harness::RedisServer;
use sluice_harness::rls::{OK, OVER_LIMIT, desc, http_get, req, request};
use sluice_harness::sluice::{Sluice, TestServer};

/// The value of an unlabelled metric in a Prometheus text exposition (0 when absent).
fn metric(admin: std::net::SocketAddr, name: &str) -> u64 {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .map_or(0, |v| v.trim().parse().expect("an integer"))
}

async fn metric_async(admin: std::net::SocketAddr, name: &'static str) -> u64 {
    tokio::task::spawn_blocking(move || metric(admin, name))
        .await
        .unwrap()
}

const CLIENTS: &str = r#"
domain: edge
descriptors:
  - key: client
    failure_mode: closed
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 3}
"#;

fn exhausting(key: &str, value: &str) -> RateLimitDescriptor {
    let mut d = desc(&[(key, value)]);
    d.hits_addend = Some(UInt64Value { value: 3 });
    d
}

/// The store reached (16 buckets per shard, 4 per shard for one rule by default): a flood of
/// fresh, exhausting client values finds no bucket it may evict, so its new buckets are answered
/// by the rule's failure policy (`closed`: OVER_LIMIT) and counted, while the client at its limit
/// stays there and another rule still gets new buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_fresh_values_never_resets_a_client_at_its_limit() {
    let mut s = TestServer::start_with(&[("edge.yaml", CLIENTS)], |st| {
        st.memory_max_buckets = 1_024;
    })
    .await;
    let victim = || req("edge", vec![desc(&[("client", "victim")])]);
    for _ in 0..3 {
        assert_eq!(s.ok(victim()).await.overall_code, OK);
    }
    assert_eq!(s.ok(victim()).await.overall_code, OVER_LIMIT);

    let mut degraded = 0;
    for batch in 0..80 {
        let descriptors = (0..50)
            .map(|i| exhausting("client", &format!("10.0.{batch}.{i}")))
            .collect();
        let r = s.ok(req("edge", descriptors)).await;
        degraded += r.statuses.iter().filter(|st| st.code == OVER_LIMIT).count();
    }
    let r = s.ok(victim()).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (OVER_LIMIT, 0),
        "the flood did not reset the client at its limit"
    );
    assert!(
        degraded > 3_500,
        "most of the flood found no room: {degraded}"
    );
    // The per-rule default left the rest of the store to the other rule.
    for t in 0..10 {
        let tenant = || request("edge", &[("tenant", &format!("t{t}"))]);
        assert_eq!(s.ok(tenant()).await.statuses[0].limit_remaining, 2);
        assert_eq!(
            s.ok(tenant()).await.statuses[0].limit_remaining,
            1,
            "t{t} kept"
        );
    }
    let refused = metric_async(s.admin_addr(), "sluice_memory_buckets_refused_total").await;
    assert!(refused >= degraded as u64, "{refused} < {degraded}");
    s.stop().await;
}

const TENANTS: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;

/// A bucket key of the wrong type (`SET` by hand) is deleted and decided as a fresh bucket, in
/// unbatched and batched calls alike: the tenant is answered, its state is a bucket again, the
/// breaker stays closed for every tenant, and the repair is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_typed_bucket_key_is_repaired_and_opens_no_breaker() {
    let redis = RedisServer::start();
    for max_batch in [1, 128] {
        let sluice = Sluice::start(TENANTS, &[redis.url()], RedisModeArg::Standalone, |s| {
            s.replicas = 1;
            s.redis_max_batch = max_batch;
        })
        .await;
        let key = format!("sluice:{{edge|tenant=x{max_batch}}}");
        let _: () = redis.cmd(&["SET", &key, "foreign"]);
        let mut client = sluice.client().await;
        let tenant = format!("x{max_batch}");
        for call in 1..=8u32 {
            let r = client
                .should_rate_limit(request("edge", &[("tenant", &tenant)]))
                .await
                .expect("the wrong-typed key fails nothing")
                .into_inner();
            assert_eq!(
                (r.overall_code, r.statuses[0].limit_remaining),
                (OK, 10 - call),
                "call {call}"
            );
            assert!(!sluice.any_breaker_open(), "call {call}");
        }
        let kind: String = redis.cmd(&["TYPE", &key]);
        assert_eq!(kind, "hash");
        let other = client
            .should_rate_limit(request("edge", &[("tenant", "other")]))
            .await
            .expect("other tenants are served")
            .into_inner();
        assert_eq!(other.overall_code, OK);
        let admin = sluice.admin;
        let repaired = metric_async(admin, "sluice_redis_keys_repaired_total").await;
        assert_eq!(repaired, 1, "max batch {max_batch}");
        let errors = tokio::task::spawn_blocking(move || http_get(admin, "/metrics").1)
            .await
            .unwrap();
        assert!(
            !errors
                .lines()
                .any(|l| l.starts_with("sluice_redis_errors_total") && !l.ends_with(" 0")),
            "no Redis error counted:\n{errors}"
        );
        sluice.stop().await;
    }
}

/// The breaker probe's key and the heartbeat's set holding foreign data: both are repaired, so
/// sluice becomes ready, counts replicas, and stays ready when the keys are spoiled again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_typed_probe_and_heartbeat_keys_are_repaired() {
    let redis = RedisServer::start();
    let spoil = || {
        let _: () = redis.cmd(&["SET", "sluice:probe", "foreign"]);
        let _: () = redis.cmd(&["SET", "sluice:replicas", "foreign"]);
    };
    spoil();
    let sluice = Sluice::start(TENANTS, &[redis.url()], RedisModeArg::Standalone, |_| {}).await;
    let (status, body) = sluice.admin_get("/readyz").await;
    assert_eq!(
        status, 200,
        "ready although the probe key was foreign: {body}"
    );
    assert!(!sluice.any_breaker_open());
    assert_eq!(sluice.replicas(), 1);
    for key in ["sluice:probe", "sluice:replicas"] {
        let kind: String = redis.cmd(&["TYPE", key]);
        assert_ne!(kind, "string", "{key} repaired");
    }
    let members: Vec<String> = redis.cmd(&["ZRANGE", "sluice:replicas", "0", "-1"]);
    assert_eq!(members.len(), 1, "{members:?}");

    // Spoiled again while running: the next probe and heartbeat repair them again.
    spoil();
    let admin = sluice.admin;
    let mut repaired = 0;
    for _ in 0..250 {
        repaired = metric_async(admin, "sluice_redis_keys_repaired_total").await;
        if repaired >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(repaired >= 4, "two repairs at start, two after: {repaired}");
    let (status, _) = sluice.admin_get("/readyz").await;
    assert_eq!(status, 200);
    assert!(!sluice.any_breaker_open());
    sluice.stop().await;
}
