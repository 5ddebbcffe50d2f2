//! Hot-key splitting (`shards: N`) through the real path: gRPC in, Redis out — a Redis Cluster
//! (the shards of one descriptor on different slots and masters), a standalone Redis, and two
//! replicas leasing from the shards of one Redis. The limits are per day so the refill during a
//! test (seconds) is far below one token and every count is exact whatever the machine's speed.

use std::collections::HashSet;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::settings::RedisModeArg;
use sluice_harness::rls::{OK, OVER_LIMIT, header, request};
use sluice_harness::sluice::Sluice;
use sluice_harness::{RedisCluster, RedisServer, command_calls};

const CONFIG: &str = r#"
domain: shards
descriptors:
  - key: hot
    rate_limit: {unit: day, requests_per_unit: 100, shards: 4}
  - key: leased
    rate_limit: {unit: day, requests_per_unit: 100, shards: 4, lease: 5}
"#;

/// The storage key of shard `i` of `key=value`.
fn shard_key(key: &str, value: &str, i: u8) -> String {
    format!("sluice:{{shards|{key}={value}~s{i}}}")
}

/// Whole tokens a bucket holds (`HGET t`, rounded down), or `None` when the key does not exist.
fn tokens(redis: &RedisServer, key: &str) -> Option<f64> {
    let tokens: Option<String> = redis.cmd(&["HGET", key, "t"]);
    tokens.map(|t| t.parse::<f64>().expect("a number of tokens").floor())
}

/// Sends `n` requests of one descriptor through `clients` in turn: (admitted, last response).
async fn send(
    clients: &mut [RateLimitServiceClient<tonic::transport::Channel>],
    n: usize,
    descriptor: (&str, &str),
) -> (usize, Option<RateLimitResponse>) {
    let mut ok = 0;
    let mut last = None;
    for i in 0..n {
        let client = &mut clients[i % clients.len()];
        let response = client
            .should_rate_limit(request("shards", &[descriptor]))
            .await
            .expect("ShouldRateLimit answers")
            .into_inner();
        match response.overall_code {
            OK => ok += 1,
            OVER_LIMIT => {}
            other => panic!("unexpected code {other}"),
        }
        last = Some(response);
    }
    (ok, last)
}

/// On a Cluster the 4 shards of one descriptor are 4 keys on 4 slots spread over the masters,
/// and 200 requests are admitted exactly 100 times: each shard admits its 25 and no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_spread_over_cluster_slots_and_hold_the_limit_exactly() {
    let cluster = RedisCluster::start(3, 0);
    let sluice = Sluice::start(CONFIG, &cluster.urls(), RedisModeArg::Cluster, |_| {}).await;
    let mut clients = [sluice.client().await];
    let (ok, last) = send(&mut clients, 200, ("hot", "acme")).await;
    assert_eq!(ok, 100, "4 shards × 25");
    let last = last.unwrap();
    assert_eq!(last.overall_code, OVER_LIMIT);
    assert_eq!(
        header(&last, "x-ratelimit-limit"),
        Some("100, 100;w=86400"),
        "the rule's full limit"
    );
    assert_eq!(last.statuses[0].limit_remaining, 0);
    // A shard gets a token back every 86400 / 25 s.
    assert_eq!(header(&last, "retry-after"), Some("3456"));

    let keys: Vec<String> = (0..4).map(|i| shard_key("hot", "acme", i)).collect();
    let slots: HashSet<u16> = keys.iter().map(|k| cluster.keyslot(k)).collect();
    assert_eq!(slots.len(), 4, "one slot per shard: {slots:?}");
    let masters: HashSet<u16> = keys.iter().map(|k| cluster.master_for(k).port()).collect();
    assert!(masters.len() >= 2, "the shards span {masters:?}");
    for key in &keys {
        let master = cluster.master_for(key);
        assert_eq!(tokens(master, key), Some(0.0), "{key} is spent");
    }
    let unsharded = "sluice:{shards|hot=acme}";
    let owner = cluster.master_for(unsharded);
    assert_eq!(owner.cmd::<i64>(&["EXISTS", unsharded]), 0);
    sluice.stop().await;
}

/// On one Redis each shard is a bucket of 25 (a fresh descriptor's first hit leaves 24 in one
/// shard and creates no other key), and the shards together admit exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shard_holds_its_share_on_standalone_redis() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(CONFIG, &[redis.url()], RedisModeArg::Standalone, |_| {}).await;
    let mut clients = [sluice.client().await];
    let (ok, first) = send(&mut clients, 1, ("hot", "fresh")).await;
    assert_eq!(ok, 1);
    let first = first.unwrap();
    assert_eq!(
        first.statuses[0].limit_remaining, 24,
        "one shard's 25, less one"
    );
    let limit = first.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(limit.requests_per_unit, 100, "current_limit is the rule's");
    let held: Vec<Option<f64>> = (0..4)
        .map(|i| tokens(&redis, &shard_key("hot", "fresh", i)))
        .collect();
    assert_eq!(
        held.iter().flatten().collect::<Vec<_>>(),
        [&24.0],
        "one shard touched: {held:?}"
    );
    let (more, _) = send(&mut clients, 199, ("hot", "fresh")).await;
    assert_eq!(ok + more, 100);
    for i in 0..4 {
        let key = shard_key("hot", "fresh", i);
        assert_eq!(tokens(&redis, &key), Some(0.0), "{key}");
        // Expires when full again (25 tokens at 25 per day) plus the margin: about a day.
        let ttl: i64 = redis.cmd(&["PTTL", &key]);
        assert!(
            (86_000_000..=86_500_000).contains(&ttl),
            "{key} expires in {ttl} ms"
        );
    }
    assert_eq!(tokens(&redis, "sluice:{shards|hot=fresh}"), None);

    // The admin listener shows the split: the rule in GET /config, the shards and their keys in
    // GET /explain.
    let (status, body) = sluice.admin_get("/config").await;
    assert_eq!(status, 200);
    let config: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(config["domains"][0]["rules"][0]["shards"], 4, "{body}");
    let (status, body) = sluice
        .admin_get("/explain?domain=shards&descriptor=hot%3Dfresh")
        .await;
    assert_eq!(status, 200);
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let keys: Vec<String> = (0..4).map(|i| shard_key("hot", "fresh", i)).collect();
    assert_eq!(
        report["rule"]["shard_keys"],
        serde_json::json!(keys),
        "{body}"
    );
    assert_eq!(report["rule"]["bucket"]["shards"]["capacity"], 25);
    sluice.stop().await;
}

/// Two replicas leasing (`lease: 5`) from 4 shards of 25 on one Redis, 400 requests in turn:
/// exactly 100 admitted — every token leaves Redis once and each replica spends what it leased,
/// since each of its shards sees more requests than a shard holds — with far fewer script calls
/// than requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasing_replicas_hold_a_sharded_limit_exactly_with_few_script_calls() {
    let redis = RedisServer::start();
    let urls = [redis.url()];
    let start = || {
        Sluice::start(CONFIG, &urls, RedisModeArg::Standalone, |s| {
            // Leases outlive the test: no sweep hands tokens back mid-count.
            s.lease_lifetime = Duration::from_secs(600);
        })
    };
    let replicas = [start().await, start().await];
    let mut clients = [replicas[0].client().await, replicas[1].client().await];
    let before = command_calls(&redis, "evalsha") + command_calls(&redis, "eval");
    let requests = 400;
    let (ok, _) = send(&mut clients, requests, ("leased", "tenant")).await;
    let scripts = command_calls(&redis, "evalsha") + command_calls(&redis, "eval") - before;
    println!("shards + lease: {ok} OK, {scripts} script calls for {requests} requests");
    assert_eq!(ok, 100, "the limit, exactly");
    assert!(
        scripts * 5 <= requests as u64,
        "{scripts} script calls for {requests} requests"
    );
    for i in 0..4 {
        let key = shard_key("leased", "tenant", i);
        assert_eq!(tokens(&redis, &key), Some(0.0), "{key}");
    }
    for r in replicas {
        r.stop().await;
    }
}
