//! envoyproxy/ratelimit's own integration test (`test/integration/integration_test.go`)
//! replayed against `sluice serve`: its config directory (restated under
//! `integration/fixtures/reference-integration/`), its environment (`RUNTIME_*`, `REDIS_*`,
//! `GRPC_*`, `LOCAL_CACHE_SIZE_IN_BYTES`, `CACHE_KEY_PREFIX`, …) in the migration mode — fixed
//! windows (`SLUICE_DEFAULT_ALGORITHM=fixed_window`), no rate-limit headers (the runtime
//! layout's default) — a real redis-server, and its call sequences over gRPC, with the codes,
//! current limits and `limit_remaining` it expects.
//!
//! The reference counts every hit, over the limit or not, unless
//! `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`; sluice in this environment counts the same
//! (`--default-charge always`, from the variable or, unset, the runtime layout), and with the
//! variable true charges nothing for a rejected request. Where sluice answers differently on
//! purpose the test asserts sluice's answer and says why.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_harness::rls::{OK, OVER_LIMIT, desc, http_get, req, request};
use sluice_harness::{RedisServer, SluiceBuilder, SluiceProcess};
use tonic::transport::Channel;

/// `RateLimitResponse.RateLimit.Unit`.
const SECOND: i32 = 1;
const MINUTE: i32 = 2;
const HOUR: i32 = 3;

/// The restated config directory, laid out as the reference's `runtime/current/ratelimit`.
fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/fixtures/reference-integration")
}

/// A copy of the fixtures as a runtime root (`<root>/ratelimit/config/*.yaml`, and
/// `<root>/ratelimit/reload.yaml` beside `config/`), so the reload test can change it.
fn runtime_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let from = fixtures().join("ratelimit");
    let to = root.path().join("ratelimit");
    std::fs::create_dir_all(to.join("config")).unwrap();
    std::fs::copy(from.join("reload.yaml"), to.join("reload.yaml")).unwrap();
    for file in std::fs::read_dir(from.join("config")).unwrap() {
        let file = file.unwrap().path();
        std::fs::copy(&file, to.join("config").join(file.file_name().unwrap())).unwrap();
    }
    root
}

/// `sluice serve` in the reference's environment, and nothing else of this process's. `extra`:
/// the reference settings a test varies (local cache, key prefix, …).
fn serve(root: &Path, redis: &RedisServer, extra: &[(&str, &str)]) -> SluiceProcess {
    SluiceBuilder::environment()
        .envs([
            ("RUNTIME_ROOT", root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_APPDIRECTORY", "config"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "SINGLE"),
            ("REDIS_URL", &redis.addr()),
            ("BACKEND_TYPE", "redis"),
            ("USE_STATSD", "false"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            // The migration mode: the reference's fixed windows.
            ("SLUICE_DEFAULT_ALGORITHM", "fixed_window"),
            // A shared 2-core test machine must not turn a slow healthy Redis reply into an
            // error (the default bound is 15 ms; the reference waits on its pool).
            ("SLUICE_REDIS_TIMEOUT", "1s"),
        ])
        .envs(extra.iter().copied())
        .start()
}

/// `ratelimit_service_rate_limit_<counter>{domain, key}` from `serve`'s `/metrics` (0 when
/// absent).
async fn counter(serve: &SluiceProcess, counter: &str, domain: &str, key: &str) -> u64 {
    let admin = serve.admin;
    let (status, body) = tokio::task::spawn_blocking(move || http_get(admin, "/metrics"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    let prefix = format!("ratelimit_service_rate_limit_{counter}{{");
    let (domain, key) = (format!("domain=\"{domain}\""), format!("key=\"{key}\""));
    body.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&domain) && l.contains(&key))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    r: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
) -> RateLimitResponse {
    client.should_rate_limit(r).await.unwrap().into_inner()
}

/// `(code, requests_per_unit, unit, limit_remaining)` of a status with a limit.
fn limited(status: &DescriptorStatus) -> (i32, u32, i32, u32) {
    let limit = status
        .current_limit
        .as_ref()
        .unwrap_or_else(|| panic!("a current limit in {status:?}"));
    (
        status.code,
        limit.requests_per_unit,
        limit.unit,
        status.limit_remaining,
    )
}

/// The whole seconds to the end of the window, as the reference reports them (`unit -
/// now % unit`): never a fraction, within one unit.
fn reset_secs(status: &DescriptorStatus, unit_secs: i64) -> i64 {
    let reset = status.duration_until_reset.as_ref().expect("a reset");
    assert_eq!(reset.nanos, 0, "{reset:?}");
    assert!(
        (1..=unit_secs).contains(&reset.seconds),
        "{reset:?} within {unit_secs}s"
    );
    reset.seconds
}

/// Waits out the last seconds of a minute, so that the windows a sequence fills (minute, and
/// the hours and days that end on a minute) do not roll over under it (the reference's test
/// takes that chance).
#[allow(clippy::disallowed_methods)] // the windows are Redis's, on this machine's wall clock
async fn away_from_a_minute_boundary() {
    let into_minute = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        % 60.0;
    if into_minute > 50.0 {
        tokio::time::sleep(Duration::from_secs_f64(60.5 - into_minute)).await;
    }
}

/// `testBasicBaseConfig`: an unknown domain, a per-second limit, a minute limit run past, two
/// descriptors of one request where the second runs out first, and a day window counting down.
/// `local` selects the `_local` keys the reference sends with its local cache on.
async fn basic_sequence(serve: &SluiceProcess, local: bool) {
    let key = |k: &str| {
        if local {
            format!("{k}_local")
        } else {
            k.to_owned()
        }
    };
    let mut client = serve.client().await;

    // No such domain: OK, no limit, nothing remaining.
    let r = call(&mut client, request("foo", &[(&key("hello"), "world")])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 1);
    let status = &r.statuses[0];
    assert_eq!(
        (
            status.code,
            status.current_limit.is_none(),
            status.limit_remaining
        ),
        (OK, true, 0)
    );

    // 50 per second: 49 left, the window ends in one second.
    let r = call(&mut client, request("basic", &[(&key("key1"), "foo")])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(limited(&r.statuses[0]), (OK, 50, SECOND, 49));
    assert_eq!(reset_secs(&r.statuses[0], 1), 1);
    assert!(r.response_headers_to_add.is_empty(), "no headers");
    assert_eq!(counter(serve, "total_hits", "basic", &key("key1")).await, 1);

    minute_limit_run_past(&mut client, &key).await;
    let k2 = key("key2");
    assert_eq!(counter(serve, "total_hits", "another", &k2).await, 25);
    assert_eq!(counter(serve, "over_limit", "another", &k2).await, 5);
    // The first rejection is Redis's; the cache answers the next four (as in the reference).
    let cached = if local { 4 } else { 0 };
    assert_eq!(
        counter(serve, "over_limit_with_local_cache", "another", &k2).await,
        cached
    );

    // key2 (20/minute) and key3 (10/hour) in one request, 15 times: key3 runs out at the 11th.
    // Without the local cache this run counts as the reference's environment says
    // (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT unset: key2 keeps counting); with it, the
    // variable is true and the over-limit cache answers key3.
    two_keys_sequence(&mut client, &key, !local, local).await;
    // The reference's counters after both sequences: key2 40 hits, 5 over the limit; key3 15
    // hits, 5 over, 4 of them from the cache when it is on.
    assert_eq!(counter(serve, "total_hits", "another", &k2).await, 40);
    assert_eq!(counter(serve, "over_limit", "another", &k2).await, 5);
    let k3 = key("key3");
    assert_eq!(counter(serve, "total_hits", "another", &k3).await, 15);
    assert_eq!(counter(serve, "over_limit", "another", &k3).await, 5);
    assert_eq!(
        counter(serve, "over_limit_with_local_cache", "another", &k3).await,
        cached
    );

    day_window_counts_down(&mut client, &key).await;
}

/// 20 per minute, 25 calls of `key2`: 19..0 left, then OVER_LIMIT with 0.
async fn minute_limit_run_past(
    client: &mut RateLimitServiceClient<Channel>,
    key: &dyn Fn(&str) -> String,
) {
    // Each test has a Redis of its own, so a fixed value is fresh (the reference draws a random
    // one against its shared Redis).
    away_from_a_minute_boundary().await;
    let value = "first";
    for i in 0..25u32 {
        let r = call(client, request("another", &[(&key("key2"), value)])).await;
        let (code, remaining) = if i >= 20 {
            (OVER_LIMIT, 0)
        } else {
            (OK, 20 - (i + 1))
        };
        assert_eq!(r.overall_code, code, "call {i}");
        assert_eq!(
            limited(&r.statuses[0]),
            (code, 20, MINUTE, remaining),
            "call {i}"
        );
        reset_secs(&r.statuses[0], 60);
    }
}

/// A day window: the reset of `key4` counts down between two calls.
async fn day_window_counts_down(
    client: &mut RateLimitServiceClient<Channel>,
    key: &dyn Fn(&str) -> String,
) {
    let first = call(client, request("another", &[(&key("key4"), "durTest")])).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = call(client, request("another", &[(&key("key4"), "durTest")])).await;
    let (first, second) = (
        reset_secs(&first.statuses[0], 86_400),
        reset_secs(&second.statuses[0], 86_400),
    );
    println!("key4 reset: {first}s, then {second}s");
    assert!(second < first, "{second} < {first}");
}

/// The reference's "key2 keeps counting when the request is over" (`integration_test.go`,
/// key2 and key3 of one request, 15 times; key3, 10 per hour, runs out at the 11th call). With
/// `counts` (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT unset or false: `--default-charge always`)
/// key2 is counted on every call, the request being over or not, and reports `20 - (i + 1)`;
/// without, it keeps the 10 it had when key3 ran out. `local`: the over-limit cache is on.
async fn two_keys_sequence(
    client: &mut RateLimitServiceClient<Channel>,
    key: &dyn Fn(&str) -> String,
    counts: bool,
    local: bool,
) {
    away_from_a_minute_boundary().await;
    let value = "second";
    for i in 0..15u32 {
        let r = call(
            client,
            request("another", &[(&key("key2"), value), (&key("key3"), value)]),
        )
        .await;
        if i < 10 {
            assert_eq!(r.overall_code, OK, "call {i}");
            assert_eq!(limited(&r.statuses[0]), (OK, 20, MINUTE, 20 - (i + 1)));
            assert_eq!(limited(&r.statuses[1]), (OK, 10, HOUR, 10 - (i + 1)));
            continue;
        }
        assert_eq!(r.overall_code, OVER_LIMIT, "call {i}");
        assert_eq!(
            limited(&r.statuses[1]),
            (OVER_LIMIT, 10, HOUR, 0),
            "call {i}"
        );
        if counts {
            // As the reference: key2's window counts this call too.
            assert_eq!(
                limited(&r.statuses[0]),
                (OK, 20, MINUTE, 20 - (i + 1)),
                "call {i}"
            );
        } else if local && i > 10 {
            // key3's rejection now comes from the over-limit cache, before Redis is asked, so
            // key2 was not evaluated: OK, with no limit to report (sluice's, on purpose; the
            // reference reads key2 from Redis anyway).
            let status = &r.statuses[0];
            assert_eq!(
                (status.code, status.current_limit.is_none()),
                (OK, true),
                "call {i}"
            );
        } else {
            // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true: key2 keeps the 10 it had, as the
            // reference reports it then.
            assert_eq!(limited(&r.statuses[0]), (OK, 20, MINUTE, 10), "call {i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config() {
    let redis = RedisServer::start();
    let root = runtime_root();
    let serve = serve(root.path(), &redis, &[("LOCAL_CACHE_SIZE_IN_BYTES", "0")]);
    basic_sequence(&serve, false).await;
    // The reference's counting: key2's window counted all 15 calls of the second sequence,
    // key3's its 15 too, 5 past its limit of 10.
    assert_eq!(window_count(&redis, "key2=second"), 15);
    assert_eq!(window_count(&redis, "key3=second"), 15);
}

/// The reference's local-cache, key-prefix and stop-increment variants in one run: the cache
/// answers repeated rejections, and every counter lives under the prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_config_with_local_cache_and_key_prefix() {
    let redis = RedisServer::start();
    let root = runtime_root();
    let serve = serve(
        root.path(),
        &redis,
        &[
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1000"),
            ("CACHE_KEY_PREFIX", "prefix:"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ],
    );
    basic_sequence(&serve, true).await;
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    let counters: Vec<&String> = keys.iter().filter(|k| k.contains("{another|")).collect();
    assert!(!counters.is_empty(), "{keys:?}");
    assert!(
        counters.iter().all(|k| k.starts_with("prefix:")),
        "{keys:?}"
    );
}

/// The reference's over-limit counting with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true and no
/// local cache: key2 stops counting once the request is over (the variable unset is
/// [`basic_config`]). Redis holds what the answers say: key2's window counted 10, not 15.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_cache_key_increment_when_overlimit() {
    let redis = RedisServer::start();
    let root = runtime_root();
    let serve = serve(
        root.path(),
        &redis,
        &[
            ("LOCAL_CACHE_SIZE_IN_BYTES", "0"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
        ],
    );
    let mut client = serve.client().await;
    two_keys_sequence(&mut client, &|k| k.to_owned(), false, false).await;
    assert_eq!(window_count(&redis, "key2=second"), 10);
    assert_eq!(window_count(&redis, "key3=second"), 10);
}

/// The count (`c`) of the one fixed-window key in Redis whose name contains `part`.
fn window_count(redis: &RedisServer, part: &str) -> u64 {
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    let found: Vec<&String> = keys.iter().filter(|k| k.contains(part)).collect();
    assert_eq!(found.len(), 1, "{part} in {keys:?}");
    let count: Vec<String> = redis.cmd(&["HMGET", found[0], "c"]);
    count[0].parse().unwrap()
}

/// `testConfigReload`: the `reload` domain appears when its file is copied into the directory
/// (with its blocking `requests_per_unit: 0` key) and goes when the file is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_reload() {
    let redis = RedisServer::start();
    let root = runtime_root();
    let serve = serve(root.path(), &redis, &[]);
    let mut client = serve.client().await;
    let block = || request("reload", &[("block", "foo")]);

    // Not loaded yet: no limit.
    let r = call(&mut client, block()).await;
    assert_eq!(r.overall_code, OK);
    assert!(r.statuses[0].current_limit.is_none());

    let dir = root.path().join("ratelimit");
    std::fs::copy(dir.join("reload.yaml"), dir.join("config/reload.yaml")).unwrap();
    // `block` charges nothing, so asking it until the reload shows costs the test nothing.
    let mut reloaded = None;
    for _ in 0..200 {
        let r = call(&mut client, block()).await;
        if r.overall_code == OVER_LIMIT {
            reloaded = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = reloaded.expect("the reload domain appears within 10 s");
    assert_eq!(limited(&r.statuses[0]), (OVER_LIMIT, 0, SECOND, 0));

    let r = call(&mut client, request("reload", &[("key1", "foo")])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(limited(&r.statuses[0]), (OK, 50, SECOND, 49));

    // Removing the file is a reload too: the domain is gone.
    std::fs::remove_file(dir.join("config/reload.yaml")).unwrap();
    let mut gone = false;
    for _ in 0..200 {
        let r = call(&mut client, block()).await;
        if r.overall_code == OK && r.statuses[0].current_limit.is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the reload domain goes within 10 s");
}

/// `testShareThreshold`: the values under `files/*` drain one bucket of 10 an hour; each value
/// under `files_no_share/*` has a bucket of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold() {
    let redis = RedisServer::start();
    let root = runtime_root();
    let serve = serve(root.path(), &redis, &[]);
    let mut client = serve.client().await;
    let domain = "share-threshold-test";

    away_from_a_minute_boundary().await;
    // The reference accepts OK or OVER_LIMIT here (its Redis may hold earlier runs' counts);
    // this Redis is fresh, so the ten calls are exactly the ten the hour allows.
    for i in 0..10u32 {
        let r = call(&mut client, request(domain, &[("files", "files/a.pdf")])).await;
        assert_eq!(limited(&r.statuses[0]), (OK, 10, HOUR, 9 - i), "call {i}");
    }
    let r = call(&mut client, request(domain, &[("files", "files/b.csv")])).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(limited(&r.statuses[0]), (OVER_LIMIT, 10, HOUR, 0));
    reset_secs(&r.statuses[0], 3600);

    for i in 0..10 {
        let value = format!("files_no_share/{i}");
        let r = call(&mut client, request(domain, &[("files_no_share", &value)])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(limited(&r.statuses[0]), (OK, 10, HOUR, 9), "{value}");
    }
    // Redis holds one counter for all of files/*, one per files_no_share value.
    let keys: Vec<String> = redis.cmd(&["KEYS", "*share-threshold-test|*"]);
    let shared = keys.iter().filter(|k| k.contains("|files=")).count();
    let own = keys
        .iter()
        .filter(|k| k.contains("|files_no_share="))
        .count();
    assert_eq!((shared, own), (1, 10), "{keys:?}");

    // Two descriptors of one request under the shared pattern name one bucket.
    let r = call(
        &mut client,
        req(
            domain,
            vec![desc(&[("files", "files/c")]), desc(&[("files", "files/d")])],
        ),
    )
    .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
}
