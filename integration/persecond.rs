//! A second Redis for per-second rules (`--redis-per-second-url`, envoyproxy/ratelimit's
//! `REDIS_PERSECOND`), through the real path: gRPC in, two redis-server processes out. Per-second
//! buckets live only in the second Redis, the others only in the main one; both limit; a dead
//! per-second Redis puts only per-second descriptors under their failure policy.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::clock::Stopwatch;
use sluice::resilience::breaker::BreakerState;
use sluice::settings::RedisModeArg;
use sluice_harness::rls::{OK, OVER_LIMIT, header, http_get, request};
use sluice_harness::sluice::Sluice;
use sluice_harness::{RedisServer, SluiceBuilder, sluice_command, wait_until};
use tonic::transport::Channel;

/// `burst`: 3 per second, answered `closed` when its Redis is away; `quota`: 10 per minute.
const CONFIG: &str = r#"
domain: ps
descriptors:
  - key: burst
    failure_mode: closed
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: quota
    rate_limit: {unit: minute, requests_per_unit: 10}
"#;

/// The bucket keys of domain `ps` in `redis`, sorted.
fn keys(redis: &RedisServer, prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis.cmd(&["KEYS", &format!("{prefix}{{ps|*")]);
    keys.sort();
    keys
}

/// One call of `descriptors`, each taking `hits`.
async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: &[(&str, &str)],
    hits: u32,
) -> RateLimitResponse {
    let mut req = request("ps", descriptors);
    req.hits_addend = hits;
    client
        .should_rate_limit(req)
        .await
        .expect("call succeeds")
        .into_inner()
}

/// A per-second bucket is enforced: one call takes all 3 tokens, the next one wants 3 more and
/// is refused — unless a whole second (the refill of 3 tokens) passed between them on a slow
/// machine, in which case a fresh bucket is tried.
async fn assert_per_second_limit_holds(client: &mut RateLimitServiceClient<Channel>) {
    for attempt in 0..5 {
        let value = format!("enforced-{attempt}");
        let started = Stopwatch::start();
        let first = call(client, &[("burst", &value)], 3).await;
        let second = call(client, &[("burst", &value)], 3).await;
        let elapsed = started.elapsed();
        assert_eq!(first.overall_code, OK);
        if elapsed < Duration::from_millis(900) {
            assert_eq!(second.overall_code, OVER_LIMIT, "{second:?}");
            assert_eq!(
                header(&second, "x-ratelimit-degraded"),
                None,
                "decided by Redis"
            );
            return;
        }
        println!("two calls took {elapsed:?}; trying a fresh bucket");
    }
    panic!("no two calls within 900 ms in five attempts");
}

/// Breaker state of the endpoint `addr`, as sluice reports it.
fn breaker(sluice: &Sluice, addr: &str) -> Option<BreakerState> {
    sluice
        .breakers()
        .into_iter()
        .find(|(endpoint, _)| endpoint == addr)
        .map(|(_, state)| state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_second_buckets_live_in_their_own_redis_and_both_limit() {
    let main = RedisServer::start();
    let fast = RedisServer::start();
    let sluice = Sluice::start(CONFIG, &[main.url()], RedisModeArg::Standalone, |s| {
        s.redis_per_second.url = vec![fast.url()];
    })
    .await;
    let mut client = sluice.client().await;

    let both = call(&mut client, &[("burst", "a"), ("quota", "a")], 3).await;
    assert_eq!(both.overall_code, OK);
    let remaining: Vec<u32> = both.statuses.iter().map(|s| s.limit_remaining).collect();
    assert_eq!(remaining, [0, 7]);
    // A bucket of 3 emptied by 3 hits settles (and expires) no sooner than a second from now.
    assert_eq!(keys(&fast, "sluice:"), ["sluice:{ps|burst=a}"]);
    assert_eq!(keys(&main, "sluice:"), ["sluice:{ps|quota=a}"]);
    // The replica heartbeat stays on the main Redis.
    let heartbeat = |redis: &RedisServer| redis.cmd::<i64>(&["EXISTS", "sluice:replicas"]);
    assert_eq!((heartbeat(&main), heartbeat(&fast)), (1, 0));

    assert_per_second_limit_holds(&mut client).await;
    // The per-minute bucket: 10 taken at once, then one more is refused (a token takes 6 s to
    // come back).
    let full = call(&mut client, &[("quota", "q")], 10).await;
    assert_eq!(full.overall_code, OK);
    let over = call(&mut client, &[("quota", "q")], 1).await;
    assert_eq!(over.overall_code, OVER_LIMIT);
    assert_eq!(header(&over, "x-ratelimit-degraded"), None);
    assert!(keys(&main, "sluice:").contains(&"sluice:{ps|quota=q}".to_string()));
    assert!(!keys(&fast, "sluice:").contains(&"sluice:{ps|quota=q}".to_string()));

    // Readiness and metrics see both servers.
    let endpoints: Vec<String> = sluice.breakers().into_iter().map(|(e, _)| e).collect();
    let mut expected = vec![main.addr(), fast.addr()];
    expected.sort();
    assert_eq!(endpoints, expected);
    let (code, metrics) = sluice.admin_get("/metrics").await;
    assert_eq!(code, 200);
    for addr in [main.addr(), fast.addr()] {
        let gauge = format!("endpoint=\"{addr}\"");
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("sluice_redis_breaker_state{") && l.contains(&gauge)),
            "no breaker gauge for {addr}"
        );
    }
    sluice.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_per_second_redis_fails_only_per_second_descriptors() {
    let main = RedisServer::start();
    let mut fast = RedisServer::start();
    let sluice = Sluice::start(CONFIG, &[main.url()], RedisModeArg::Standalone, |s| {
        s.redis_per_second.url = vec![fast.url()];
        s.replicas = 1;
        // Open at the first failed moment: the calls below come one after another, faster than
        // the window's usual minimum of failed moments.
        s.breaker_failures = 1;
    })
    .await;
    let mut client = sluice.client().await;
    let healthy = call(&mut client, &[("burst", "b"), ("quota", "k")], 1).await;
    assert_eq!(healthy.overall_code, OK);

    fast.kill();
    // Past the breaker's threshold (one failed moment) and on: each call the per-minute bucket is
    // charged in Redis, the per-second descriptor answered by its policy, `closed`.
    let mut expected_remaining = 9;
    for _ in 0..8 {
        let r = call(&mut client, &[("burst", "b"), ("quota", "k")], 1).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(r.statuses[0].code, OVER_LIMIT);
        assert_eq!(r.statuses[1].code, OK);
        assert_eq!(header(&r, "x-ratelimit-degraded"), Some("closed"));
        // Each Redis is atomic on its own (as Cluster slots are): the main one decided `quota`
        // and counted it, though the request as a whole is refused.
        expected_remaining -= 1;
        assert_eq!(r.statuses[1].limit_remaining, expected_remaining);
    }
    // Open, or half-open while a health probe tries it.
    assert_ne!(breaker(&sluice, &fast.addr()), Some(BreakerState::Closed));
    assert!(breaker(&sluice, &fast.addr()).is_some());
    assert_eq!(breaker(&sluice, &main.addr()), Some(BreakerState::Closed));
    // A request of per-minute descriptors alone is untouched by the outage.
    let alone = call(&mut client, &[("quota", "other")], 1).await;
    assert_eq!(alone.overall_code, OK);
    assert_eq!(alone.statuses[0].limit_remaining, 9);
    assert_eq!(header(&alone, "x-ratelimit-degraded"), None);
    assert_eq!(
        keys(&main, "sluice:").len(),
        2,
        "{:?}",
        keys(&main, "sluice:")
    );

    // Back: the health probe closes the breaker without traffic, and Redis decides again.
    fast.start_again();
    wait_until(
        "the per-second breaker closes",
        Duration::from_secs(20),
        || breaker(&sluice, &fast.addr()) == Some(BreakerState::Closed),
    );
    let r = call(&mut client, &[("burst", "after")], 1).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(header(&r, "x-ratelimit-degraded"), None);
    assert_eq!(keys(&fast, "sluice:"), ["sluice:{ps|burst=after}"]);
    sluice.stop().await;
}

/// A deployment's environment, unchanged: REDIS_PERSECOND with a `host:port` URL and the
/// reference's pool size is all sluice needs to put per-second buckets on the second Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_environment_enables_the_per_second_redis() {
    let main = RedisServer::start();
    let fast = RedisServer::start();
    let _: () = fast.cmd(&["CONFIG", "SET", "requirepass", "fast-pw"]);
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("current/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("ps.yaml"), CONFIG).unwrap();
    let runtime_root = root.path().join("current");
    let serve = SluiceBuilder::environment()
        .envs([
            ("RUNTIME_ROOT", runtime_root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &main.addr()),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", &fast.addr()),
            ("REDIS_PERSECOND_AUTH", "fast-pw"),
            ("REDIS_PERSECOND_POOL_SIZE", "10"),
            ("CACHE_KEY_PREFIX", "rl:"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("LOG_LEVEL", "info"),
        ])
        .start();
    let log = serve.log();
    assert!(
        log.contains("REDIS_PERSECOND_URL → SLUICE_REDIS_PER_SECOND_URL=redis://:***@"),
        "{log}"
    );
    assert!(
        !log.contains("fast-pw"),
        "the password is never logged:\n{log}"
    );
    assert!(!log.contains("ignored: REDIS_PERSECOND"), "{log}");
    assert!(log.contains("REDIS_PERSECOND_POOL_SIZE accepted"), "{log}");

    let mut client = serve.client().await;
    let r = call(&mut client, &[("burst", "a"), ("quota", "a")], 1).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        fast.cli(Some(("default", "fast-pw")), &["KEYS", "rl:{ps|*"])
            .trim(),
        "rl:{ps|burst=a}"
    );
    assert_eq!(keys(&main, "rl:"), ["rl:{ps|quota=a}"]);
    assert_per_second_limit_holds(&mut client).await;
    let (code, body) = http_get(serve.admin, "/healthcheck");
    assert_eq!((code, body.as_str()), (200, "OK"));
    drop(serve);

    // Switched on without its URL, the service refuses to start and says what is missing.
    let out = sluice_command()
        .arg("serve")
        .envs([
            ("RUNTIME_ROOT", runtime_root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &main.addr()),
            ("REDIS_PERSECOND", "true"),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("REDIS_PERSECOND_URL"), "{stderr}");
}
