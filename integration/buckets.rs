//! `GET /buckets` and `DELETE /buckets` through the real path, one suite over every backend:
//! `ShouldRateLimit` spends hits over gRPC, the admin listener shows the reduced state without
//! taking anything (asked again and again), a reset is refused without `--admin-write` and, with
//! it, leaves the next request at full capacity. Runs on memory, Redis standalone, Cluster and
//! Sentinel, and a per-second rule on the per-second Redis. Plus, per backend: a peek of each algorithm agrees with a check-only decision, the
//! Lua read-only mode agrees with the pure `algorithm::peek` to the bit and leaves a Redis key
//! and its TTL untouched.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;
use sluice::algorithm::{Algorithm, BucketParams};
use sluice::backend::memory::{MemoryBackend, MemoryOptions};
use sluice::backend::redis::{RedisBackend, RedisMode, RedisOptions};
use sluice::backend::{Backend, Hit};
use sluice::clock::ManualClock;
use sluice::settings::{RedisModeArg, Settings};
use sluice_harness::process::metric_in;
use sluice_harness::rls::{OK, OVER_LIMIT, request};
use sluice_harness::sluice::{Sluice, TestServer};
use sluice_harness::{RedisCluster, RedisSentinel, RedisServer, sluice_command};
use tonic::transport::Channel;

const CONFIG: &str = "domain: ops
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: win
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
  - key: gc
    rate_limit: {unit: hour, requests_per_unit: 6, algorithm: gcra}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 20, shards: 2}
  - key: free
    rate_limit: {unlimited: true}
  - key: leased
    rate_limit: {unit: hour, requests_per_unit: 100, lease: 5}
  - key: fast
    rate_limit: {unit: second, requests_per_unit: 1, burst: 50}
  - key: multi
    rate_limits:
      - {unit: hour, requests_per_unit: 10}
      - {unit: day, unit_multiplier: 2, requests_per_unit: 4, algorithm: fixed_window}
";

/// A sluice under test: its RLS client and admin listener.
struct Server {
    client: RateLimitServiceClient<Channel>,
    admin: SocketAddr,
    stop: Stop,
}

enum Stop {
    Memory(TestServer),
    Redis(Sluice),
}

impl Server {
    async fn stop(self) {
        match self.stop {
            Stop::Memory(server) => server.stop().await,
            Stop::Redis(server) => server.stop().await,
        }
    }

    async fn call(&mut self, key: &str, value: &str) -> RateLimitResponse {
        self.client
            .should_rate_limit(request("ops", &[(key, value)]))
            .await
            .expect("ShouldRateLimit answers")
            .into_inner()
    }

    /// Spends `n` hits of `key=value`, each allowed.
    async fn spend(&mut self, key: &str, value: &str, n: usize) {
        for i in 0..n {
            let answer = self.call(key, value).await;
            assert_eq!(answer.overall_code, OK, "hit {i} of {key}={value}");
        }
    }

    async fn admin(&self, method: &'static str, path: String) -> (u16, Value) {
        let addr = self.admin;
        tokio::task::spawn_blocking(move || http(addr, method, &path))
            .await
            .unwrap()
    }

    async fn show(&self, descriptor: &str) -> Value {
        let (status, body) = self.admin("GET", buckets(descriptor)).await;
        assert_eq!(status, 200, "GET /buckets {descriptor}: {body}");
        body
    }
}

/// How a backend's server is started: with `--admin-write` or without.
type Start = Box<dyn Fn(bool) -> futures::future::BoxFuture<'static, Server>>;

fn buckets(descriptor: &str) -> String {
    format!(
        "/buckets?domain=ops&descriptor={}",
        descriptor.replace('=', "%3D")
    )
}

/// One exchange as the operator (the token every server with `--admin-write` is started with):
/// status and JSON body.
fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, Value) {
    let (status, body) = sluice_harness::rls::http_as_operator(addr, method, path);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn remaining(answer: &RateLimitResponse) -> u32 {
    answer.statuses[0].limit_remaining
}

/// The suite, on servers `start` makes.
async fn suite(name: &str, start: Start) {
    reading_takes_nothing(name, start(false).await).await;
    errors_are_clear(name, start(false).await).await;
    resetting(name, start(true).await).await;
}

/// Spent hits show, asking again changes nothing, a reset without `--admin-write` is refused.
async fn reading_takes_nothing(name: &str, mut server: Server) {
    server.spend("tenant", "acme", 3).await;
    let first = server.show("tenant=acme").await;
    let key = &first["keys"][0];
    assert_eq!(
        first["keys"].as_array().unwrap().len(),
        1,
        "{name}: {first}"
    );
    assert_eq!(key["key"], "sluice:{ops|tenant=acme}", "{name}");
    assert_eq!(key["remaining"], 7, "{name}: {first}");
    assert_eq!(key["stored"], true, "{name}");
    assert_eq!(key["state"]["algorithm"], "token_bucket", "{name}");
    assert_eq!(key["state"]["capacity"], 10, "{name}");
    let tokens = key["state"]["tokens"].as_f64().unwrap();
    assert!((7.0..7.5).contains(&tokens), "{name}: {tokens} tokens");
    assert!(key["ttl_ms"].as_u64().unwrap() > 0, "{name}: {key}");
    assert_eq!(first["rule"]["path"], "ops.tenant", "{name}: {first}");
    let mut ttl = key["ttl_ms"].as_u64().unwrap();
    for _ in 0..5 {
        let again = server.show("tenant=acme").await;
        assert_eq!(again["keys"][0]["remaining"], 7, "{name}: {again}");
        let later = again["keys"][0]["ttl_ms"].as_u64().unwrap();
        assert!(
            later <= ttl,
            "{name}: a read moved the TTL from {ttl} to {later}"
        );
        ttl = later;
    }
    // The next hit is decided as if nobody had looked.
    assert_eq!(remaining(&server.call("tenant", "acme").await), 6, "{name}");

    let (status, body) = server.admin("DELETE", buckets("tenant=acme")).await;
    assert_eq!(status, 403, "{name}: {body}");
    assert!(
        body["error"].as_str().unwrap().contains("--admin-write"),
        "{name}: {body}"
    );
    assert_eq!(server.show("tenant=acme").await["keys"][0]["remaining"], 6);

    each_kind_of_bucket_reads_in_its_own_terms(name, &mut server).await;
    server.stop().await;
}

/// Reading beyond one token bucket: several limits on one key, each algorithm in its own
/// terms, a sharded key's shards, and an RLQS bucket id.
async fn each_kind_of_bucket_reads_in_its_own_terms(name: &str, server: &mut Server) {
    // Several limits on one key (`rate_limits`): a key each, named by its window, and a
    // metric series each.
    server.spend("multi", "a", 2).await;
    let multi = server.show("multi=a").await;
    let keys = multi["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "{name}: {multi}");
    assert_eq!(keys[0]["key"], "sluice:{ops|multi=a}~w3600", "{name}");
    assert_eq!(keys[1]["key"], "sluice:{ops|multi=a}~w172800~fw", "{name}");
    let left = |k: &Value| k["remaining"].as_u64();
    assert_eq!(
        (left(&keys[0]), left(&keys[1])),
        (Some(8), Some(2)),
        "{name}: {multi}"
    );
    let text = metrics_text(server.admin).await;
    for key in ["multi[1h]", "multi[2d]"] {
        let labels = [("domain", "ops"), ("key", key)];
        let hits = metric_in(&text, "ratelimit_service_rate_limit_total_hits", &labels);
        assert_eq!(hits, 2.0, "{name}: {key} in {text}");
    }

    // Each algorithm in its own terms.
    server.spend("win", "a", 2).await;
    let window = &server.show("win=a").await["keys"][0];
    assert_eq!(window["state"]["algorithm"], "fixed_window", "{name}");
    assert_eq!(
        (
            window["state"]["count"].as_u64(),
            window["remaining"].as_u64()
        ),
        (Some(2), Some(3))
    );
    let now = window["now_ms"].as_u64().unwrap();
    let end = window["state"]["window_end_ms"].as_u64().unwrap();
    assert!(end > now && end - now <= 3_600_000, "{name}: {window}");

    server.spend("gc", "a", 2).await;
    let gcra = &server.show("gc=a").await["keys"][0];
    assert_eq!(gcra["state"]["algorithm"], "gcra", "{name}");
    assert_eq!(gcra["state"]["hits_left"], 4, "{name}: {gcra}");
    assert_eq!(gcra["state"]["emission_interval_ms"], 600_000.0, "{name}");

    server.spend("hot", "x", 4).await;
    let hot = server.show("hot=x").await;
    let shards = hot["keys"].as_array().unwrap();
    assert_eq!(shards.len(), 2, "{name}: {hot}");
    let left: u64 = shards
        .iter()
        .map(|k| k["remaining"].as_u64().unwrap())
        .sum();
    assert_eq!(left, 16, "{name}: 4 of 2 × 10 spent: {hot}");
    assert_eq!(shards[1]["shard"], 1, "{name}");

    // An RLQS bucket id names the descriptor's key.
    let (status, pool) = server
        .admin("GET", "/buckets?domain=ops&bucket=tenant%3Dacme".into())
        .await;
    assert_eq!(status, 200, "{name}: {pool}");
    assert_eq!(pool["keys"][0]["key"], "sluice:{ops|tenant=acme}");
    assert_eq!(pool["keys"][0]["remaining"], 6, "{name}: {pool}");
    assert_eq!(pool["keys"][0]["replica"]["rlqs_pool"], Value::Null);
}

async fn errors_are_clear(name: &str, server: Server) {
    let cases = [
        (
            "/buckets?domain=nope&descriptor=tenant%3Da",
            404,
            "not configured",
        ),
        (
            "/buckets?domain=ops&descriptor=other%3Da",
            404,
            "matches no descriptor",
        ),
        ("/buckets?domain=ops&descriptor=free%3Da", 404, "unlimited"),
        ("/buckets?descriptor=tenant%3Da", 400, "domain"),
        ("/buckets?domain=ops", 400, "descriptor"),
        ("/buckets?domain=ops&descriptor=tenant", 400, "key=value"),
    ];
    for (path, want, says) in cases {
        let (status, body) = server.admin("GET", path.into()).await;
        assert_eq!(status, want, "{name}: {path}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{name}: {path}: {body}");
    }
    server.stop().await;
}

/// With `--admin-write`: a bucket spent past its limit starts fresh on every shard, and this
/// replica's over-limit cache entry and lease go with it.
async fn resetting(name: &str, mut server: Server) {
    server.spend("tenant", "bob", 10).await;
    assert_eq!(server.call("tenant", "bob").await.overall_code, OVER_LIMIT);
    let spent = server.show("tenant=bob").await;
    assert_eq!(spent["keys"][0]["remaining"], 0, "{name}: {spent}");
    // On Redis this replica now rejects the bucket from its over-limit cache (the memory
    // backend keeps none).
    let cached = &spent["keys"][0]["replica"]["over_limit_cache"];
    assert_eq!(cached.is_null(), name == "memory", "{name}: {spent}");

    let (status, body) = server.admin("DELETE", buckets("tenant=bob")).await;
    assert_eq!(status, 200, "{name}: {body}");
    let dropped = &body["replica"]["over_limit_cache_entries_dropped"];
    assert_eq!(
        dropped,
        if name == "memory" { 0 } else { 1 },
        "{name}: {body}"
    );
    assert_eq!(body["reset"][0]["key"], "sluice:{ops|tenant=bob}", "{name}");
    assert_eq!(body["reset"][0]["existed"], true, "{name}: {body}");
    let fresh = server.show("tenant=bob").await;
    assert_eq!(fresh["keys"][0]["remaining"], 10, "{name}: {fresh}");
    assert_eq!(fresh["keys"][0]["stored"], false, "{name}: {fresh}");
    let answer = server.call("tenant", "bob").await;
    assert_eq!(
        answer.overall_code, OK,
        "{name}: the next request is decided afresh"
    );
    assert_eq!(
        remaining(&answer),
        9,
        "{name}: full capacity, minus this hit"
    );

    server.spend("hot", "y", 6).await;
    let (status, body) = server.admin("DELETE", buckets("hot=y")).await;
    assert_eq!(status, 200, "{name}: {body}");
    assert_eq!(
        body["reset"].as_array().unwrap().len(),
        2,
        "{name}: every shard"
    );
    let hot = server.show("hot=y").await;
    let left: u64 = hot["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["remaining"].as_u64().unwrap())
        .sum();
    assert_eq!(left, 20, "{name}: {hot}");

    server.spend("multi", "b", 4).await;
    let (status, body) = server.admin("DELETE", buckets("multi=b")).await;
    assert_eq!(status, 200, "{name}: {body}");
    assert_eq!(
        body["reset"].as_array().unwrap().len(),
        2,
        "{name}: every limit"
    );
    assert_eq!(server.call("multi", "b").await.overall_code, OK, "{name}");

    a_reset_drops_the_replicas_lease(name, &mut server).await;
    let text = metrics_text(server.admin).await;
    assert_eq!(
        metric_in(&text, "sluice_admin_resets_total", &[("domain", "ops")]),
        4.0,
        "{name}: {text}"
    );
    server.stop().await;
}

/// The lease this replica took is dropped with the bucket.
async fn a_reset_drops_the_replicas_lease(name: &str, server: &mut Server) {
    server.spend("leased", "z", 1).await;
    let leased = server.show("leased=z").await;
    // `lease: 5`: the hit's token and 4 more, held here.
    assert_eq!(leased["keys"][0]["remaining"], 95, "{name}: {leased}");
    assert_eq!(
        leased["keys"][0]["replica"]["lease"]["tokens"], 4,
        "{name}: {leased}"
    );
    let (status, body) = server.admin("DELETE", buckets("leased=z")).await;
    assert_eq!(status, 200, "{name}: {body}");
    assert_eq!(body["replica"]["leases_dropped"], 1, "{name}: {body}");
    let fresh = server.show("leased=z").await;
    assert_eq!(fresh["keys"][0]["remaining"], 100, "{name}: {fresh}");
    assert_eq!(
        fresh["keys"][0]["replica"]["lease"],
        Value::Null,
        "{name}: {fresh}"
    );
}

async fn metrics_text(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || sluice_harness::rls::http_get(addr, "/metrics").1)
        .await
        .unwrap()
}

fn settings_with(write: bool) -> impl FnOnce(&mut Settings) {
    move |settings: &mut Settings| {
        settings.admin_write = write;
        if write {
            settings.admin.admin_token_file = Some(sluice_harness::rls::operator_token_file());
        }
        // A rejected bucket stays rejected here without asking the backend: the reset must
        // drop that too.
        settings.over_limit_cache = true;
        // Leases outlive the test: no sweep hands them back under it.
        settings.lease_lifetime = Duration::from_secs(60);
    }
}

async fn redis_server(urls: Vec<String>, mode: RedisModeArg, write: bool) -> Server {
    let sluice = Sluice::start(CONFIG, &urls, mode, settings_with(write)).await;
    Server {
        client: sluice.client().await,
        admin: sluice.admin,
        stop: Stop::Redis(sluice),
    }
}

#[tokio::test]
async fn memory_buckets_show_and_reset() {
    let start: Start = Box::new(|write| {
        Box::pin(async move {
            let server =
                TestServer::start_with(&[("ops.yaml", CONFIG)], settings_with(write)).await;
            Server {
                client: server.client.clone(),
                admin: server.admin_addr(),
                stop: Stop::Memory(server),
            }
        })
    });
    suite("memory", start).await;
}

#[tokio::test]
async fn redis_standalone_buckets_show_and_reset() {
    let redis = RedisServer::start();
    let url = redis.url();
    let start: Start = Box::new(move |write| {
        let urls = vec![url.clone()];
        Box::pin(redis_server(urls, RedisModeArg::Standalone, write))
    });
    suite("redis standalone", start).await;
    // The reads left the keys alone: the hash the last decision wrote is still there.
    let fields: Vec<String> = redis.cmd(&["HKEYS", "sluice:{ops|tenant=acme}"]);
    assert_eq!(fields.len(), 2, "{fields:?}");
}

#[tokio::test]
async fn redis_cluster_buckets_show_and_reset() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    let start: Start =
        Box::new(move |write| Box::pin(redis_server(urls.clone(), RedisModeArg::Cluster, write)));
    suite("redis cluster", start).await;
}

#[tokio::test]
async fn redis_sentinel_buckets_show_and_reset() {
    let sentinel = RedisSentinel::start();
    let urls = sentinel.sentinel_urls();
    let start: Start =
        Box::new(move |write| Box::pin(redis_server(urls.clone(), RedisModeArg::Sentinel, write)));
    suite("redis sentinel", start).await;
}

/// With `--redis-per-second-url`, a per-second rule's key is read and reset on its own Redis.
#[tokio::test]
async fn the_per_second_redis_is_read_and_reset_where_its_keys_live() {
    let (main, fast) = (RedisServer::start(), RedisServer::start());
    let per_second = fast.url();
    let sluice = Sluice::start(CONFIG, &[main.url()], RedisModeArg::Standalone, move |s| {
        settings_with(true)(s);
        s.redis_per_second.url = vec![per_second];
    })
    .await;
    let mut server = Server {
        client: sluice.client().await,
        admin: sluice.admin,
        stop: Stop::Redis(sluice),
    };
    server.spend("fast", "a", 5).await;
    let key = "sluice:{ops|fast=a}";
    let exists = |redis: &RedisServer| redis.cmd::<i64>(&["EXISTS", key]);
    assert_eq!((exists(&fast), exists(&main)), (1, 0));
    let shown = server.show("fast=a").await;
    let left = shown["keys"][0]["remaining"].as_u64().unwrap();
    assert!((45..=47).contains(&left), "{shown}");
    assert!(shown["keys"][0]["ttl_ms"].as_u64().is_some(), "{shown}");
    let (status, body) = server.admin("DELETE", buckets("fast=a")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["reset"][0]["existed"], true, "{body}");
    assert_eq!(exists(&fast), 0);
    assert_eq!(remaining(&server.call("fast", "a").await), 49);
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The backends' peek itself: the same answers as a decision, the same state in Lua and in Rust,
// and nothing written.

const T0: u64 = 1_700_000_000_000;

fn hit(key: &str, algorithm: Algorithm, tokens: u64) -> Hit {
    let params = BucketParams {
        capacity: 5,
        requests_per_unit: 5,
        unit_ms: 60_000,
    };
    Hit::new(key, params, tokens).using(algorithm)
}

fn keys() -> Vec<(String, Algorithm)> {
    Algorithm::ALL
        .iter()
        .map(|&a| (format!("sluice:{{peek}}{a}"), a))
        .collect()
}

/// Spends 2 hits on a key of each algorithm at `T0`, then peeks at `T0 + 7 s`.
async fn spend_then_peek<B: Backend>(
    backend: &B,
    clock: &ManualClock,
) -> Vec<sluice::backend::KeyPeek> {
    clock.set(T0);
    for (key, algorithm) in keys() {
        backend.check(&[hit(&key, algorithm, 2)]).await.unwrap();
    }
    clock.set(T0 + 7_000);
    let hits: Vec<Hit> = keys().iter().map(|(k, a)| hit(k, *a, 0)).collect();
    let peeks: Vec<_> = backend
        .peek(&hits)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    // A check-only decision at the same now answers the same.
    let checks = backend.check(&hits).await.unwrap();
    for ((peek, check), (key, _)) in peeks.iter().zip(checks).zip(keys()) {
        assert_eq!(peek.peek.verdict, check, "{key}");
        assert!(peek.stored, "{key}");
        assert_eq!(peek.now_ms, T0 + 7_000, "{key}");
    }
    peeks
}

#[tokio::test]
async fn the_script_peeks_as_the_pure_algorithm_and_writes_nothing() {
    let clock = ManualClock::new(T0);
    let memory = MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default());
    let in_memory = spend_then_peek(&memory, &clock).await;

    let server = RedisServer::start();
    let redis_clock = ManualClock::new(T0);
    let redis = RedisBackend::connect(RedisOptions {
        urls: vec![server.url()],
        mode: RedisMode::Standalone,
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    })
    .await
    .unwrap()
    .with_test_clock(Arc::new(redis_clock.clone()));
    let in_redis = spend_then_peek(&redis, &redis_clock).await;
    for ((m, r), (key, _)) in in_memory.iter().zip(&in_redis).zip(keys()) {
        assert_eq!(m.peek, r.peek, "{key}: memory and Lua read the same state");
        assert!(r.ttl_ms.is_some(), "{key}");
    }

    // Peeking leaves the hash and its TTL as they were (the TTL only runs down).
    let (key, algorithm) = keys()[0].clone();
    let before: Vec<String> = server.cmd(&["HGETALL", &key]);
    let ttl_before: i64 = server.cmd(&["PTTL", &key]);
    redis_clock.set(T0 + 20_000);
    for _ in 0..3 {
        redis.peek(&[hit(&key, algorithm, 0)]).await;
    }
    let after: Vec<String> = server.cmd(&["HGETALL", &key]);
    let ttl_after: i64 = server.cmd(&["PTTL", &key]);
    assert_eq!(before, after);
    assert!(ttl_after <= ttl_before, "{ttl_before} → {ttl_after}");

    // A key that is not a hash is read as fresh and left alone.
    let _: () = server.cmd(&["SET", "sluice:{peek}foreign", "x"]);
    let foreign = redis
        .peek(&[hit("sluice:{peek}foreign", Algorithm::TokenBucket, 0)])
        .await
        .remove(0)
        .unwrap();
    assert!(foreign.foreign && !foreign.stored);
    assert_eq!(foreign.peek.verdict.remaining, 5);
    let kept: String = server.cmd(&["GET", "sluice:{peek}foreign"]);
    assert_eq!(kept, "x");

    // A reset deletes; a second finds nothing.
    let resets = redis.reset(&[hit(&key, algorithm, 0)]).await;
    assert_eq!(resets, [Ok(true)]);
    assert_eq!(redis.reset(&[hit(&key, algorithm, 0)]).await, [Ok(false)]);
    assert_eq!(memory.reset(&[hit(&key, algorithm, 0)]).await, [Ok(true)]);
    let fresh = memory
        .peek(&[hit(&key, algorithm, 0)])
        .await
        .remove(0)
        .unwrap();
    assert!(!fresh.stored);
}

// ---------------------------------------------------------------------------------------------
// The CLI against a `sluice serve` process.

fn cli(admin: SocketAddr, args: &[&str]) -> (Option<i32>, Value, String) {
    let out = sluice_command()
        .arg("bucket")
        .args(&args[..1])
        .args(["--admin", &admin.to_string(), "--domain", "ops"])
        .args(&args[1..])
        .output()
        .expect("sluice bucket runs");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_cli_shows_and_resets_through_the_admin_listener() {
    let reader = sluice_harness::SluiceProcess::start(&[("ops.yaml", CONFIG)], &[]);
    let (code, shown, _) = cli(reader.admin, &["show", "tenant=cli"]);
    assert_eq!(code, Some(0));
    assert_eq!(shown["keys"][0]["remaining"], 10, "{shown}");
    let (code, _, stderr) = cli(reader.admin, &["reset", "tenant=cli"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("403") && stderr.contains("--admin-write"),
        "{stderr}"
    );
    let (code, _, stderr) = cli(reader.admin, &["show", "nothing=here"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("404"), "{stderr}");
    let (code, shown, _) = cli(reader.admin, &["show", "--bucket", "tenant=cli"]);
    assert_eq!(code, Some(0));
    assert_eq!(shown["bucket_id"][0]["value"], "cli", "{shown}");

    let token = sluice_harness::rls::operator_token_file();
    let token = token.to_str().unwrap();
    let writer = sluice_harness::SluiceProcess::start(
        &[("ops.yaml", CONFIG)],
        &["--admin-write", "--admin-token-file", token],
    );
    let (code, _, stderr) = cli(writer.admin, &["reset", "hot=cli"]);
    assert_eq!(code, Some(1), "no token: {stderr}");
    assert!(stderr.contains("401"), "{stderr}");
    let (code, reset, stderr) = cli(
        writer.admin,
        &["reset", "--admin-token-file", token, "hot=cli"],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(reset["reset"].as_array().map(Vec::len), Some(2), "{reset}");
    let log = writer.log();
    let line = log
        .lines()
        .find(|l| l.contains("bucket reset through the admin listener"))
        .unwrap_or_else(|| panic!("no reset logged:\n{log}"));
    let line = plain(line);
    for field in [
        "caller=127.0.0.1:",
        "domain=ops",
        "hot=cli",
        "sluice:{ops|hot=cli~s1}",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    drop(reader);
    let (code, _, _) = cli("127.0.0.1:1".parse().unwrap(), &["show", "tenant=cli"]);
    assert_eq!(code, Some(2), "no listener");
}

/// A log line without its ANSI colours.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut escaped = false;
    for c in line.chars() {
        match (escaped, c) {
            (false, '\u{1b}') => escaped = true,
            (false, c) => out.push(c),
            (true, 'm') => escaped = false,
            (true, _) => {}
        }
    }
    out
}
