//! The Redis backend against real servers: round trips per check, script cache loss, restarts,
//! key expiry, Cluster slot routing and MOVED, Sentinel failover, timeouts, credentials.
//!
//! This file: round trips, the script cache, batching, restarts, key expiry and the stored
//! format; [`servers`]: timeouts, the probe, credentials, Cluster and Sentinel.

use std::sync::Arc;
use std::time::Duration;

use sluice::algorithm::{Algorithm, BucketParams, Verdict};
use sluice::backend::redis::{BatchSettings, RedisBackend, RedisMode, RedisOptions};
use sluice::backend::{Backend, Hit};
use sluice::clock::ManualClock;
use sluice::key::{RuleTag, bucket_key};
use sluice::request::Entry;

use sluice_harness as harness;
use sluice_harness::{RedisServer, command_calls, wait_until};

mod servers;

/// Plenty of tokens: these tests are about transport, not limits.
const ROOMY: BucketParams = BucketParams {
    capacity: 1_000,
    requests_per_unit: 1_000,
    unit_ms: 1_000,
};
const TEN_PER_SECOND: BucketParams = BucketParams {
    capacity: 10,
    requests_per_unit: 10,
    unit_ms: 1_000,
};
/// Slow enough that a bucket's state visibly survives a failover.
const ONE_PER_MINUTE: BucketParams = BucketParams {
    capacity: 10,
    requests_per_unit: 1,
    unit_ms: 60_000,
};
/// Bound on waiting for a server to come back or a failover to be followed.
const RECOVERY: Duration = Duration::from_secs(20);

fn options(urls: Vec<String>, mode: RedisMode) -> RedisOptions {
    RedisOptions {
        urls,
        mode,
        // Generous: a shared CI machine must not turn a slow reply into a failed test. The
        // timeout test sets its own bound.
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    }
}

async fn standalone(server: &RedisServer) -> RedisBackend {
    RedisBackend::connect(options(vec![server.url()], RedisMode::Standalone))
        .await
        .expect("connect")
}

fn key(tag: &str, bucket: &str) -> String {
    format!("test:{{{tag}}}:{bucket}")
}

/// Retries `check` until it succeeds (the backend reconnecting or following a failover).
async fn check_until_ok(backend: &RedisBackend, hits: &[Hit]) -> Vec<Verdict> {
    let mut waited = Duration::ZERO;
    loop {
        match backend.check(hits).await {
            Ok(verdicts) => return verdicts,
            Err(err) => {
                assert!(waited < RECOVERY, "no recovery within {RECOVERY:?}: {err}");
                tokio::time::sleep(Duration::from_millis(20)).await;
                waited += Duration::from_millis(20);
            }
        }
    }
}

fn reset_stats(server: &RedisServer) {
    let _: String = server.cmd(&["CONFIG", "RESETSTAT"]);
}

#[test]
#[should_panic(
    expected = "redis-server-x not found: install the Debian package `redis-server` (apt-get install -y redis-server)"
)]
fn a_missing_tool_names_the_debian_package() {
    harness::binary("redis-server-x");
}

#[test]
fn servers_are_killed_when_a_test_panics() {
    let mut pid = 0;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let server = RedisServer::start();
        pid = server.pid();
        panic!("test failure while the server runs");
    }));
    assert!(outcome.is_err());
    // SAFETY: signal 0 only asks whether the pid exists.
    let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    assert!(!alive, "redis-server {pid} outlived the panicking test");
}

#[tokio::test]
async fn one_evalsha_per_check() {
    let server = RedisServer::start();
    let backend = standalone(&server).await;
    reset_stats(&server);

    const CHECKS: u64 = 40;
    for request in 0..CHECKS {
        // 1 to 4 buckets per request: still one round trip.
        let hits: Vec<Hit> = (0..=request % 4)
            .map(|bucket| Hit::new(key(&format!("rt{request}"), &bucket.to_string()), ROOMY, 1))
            .collect();
        let verdicts = backend.check(&hits).await.expect("check");
        assert_eq!(verdicts.len(), hits.len());
        assert!(verdicts.iter().all(|v| v.allowed));
    }

    let evalsha = command_calls(&server, "evalsha");
    println!(
        "standalone: {CHECKS} checks, {evalsha} EVALSHA: {} round trips per check",
        evalsha as f64 / CHECKS as f64
    );
    assert_eq!(evalsha, CHECKS);
    assert_eq!(command_calls(&server, "eval"), 0);
    // Nothing else reached the server: only the script's own commands and this test's inspection
    // (each harness connection announces itself with CLIENT SETINFO).
    let stats = server.info("commandstats");
    let own = [
        "cmdstat_evalsha",
        // Commands the script runs count too.
        "cmdstat_time",
        "cmdstat_hmget",
        "cmdstat_hset",
        "cmdstat_pexpire",
        "cmdstat_info",
        "cmdstat_config|resetstat",
        "cmdstat_client|setinfo",
    ];
    let others: Vec<&String> = stats
        .keys()
        .filter(|name| !own.contains(&name.as_str()))
        .collect();
    assert!(others.is_empty(), "unexpected commands: {others:?}");
}

#[tokio::test]
async fn script_flush_while_checking_costs_one_eval() {
    let server = RedisServer::start();
    for batch in [UNBATCHED, BatchSettings::default()] {
        script_flush_while_checking(&server, batch).await;
    }
}

/// One script call per request.
const UNBATCHED: BatchSettings = BatchSettings {
    max_keys: 1,
    in_flight: 1,
};

async fn script_flush_while_checking(server: &RedisServer, batch: BatchSettings) {
    let backend = RedisBackend::connect(RedisOptions {
        batch,
        ..options(vec![server.url()], RedisMode::Standalone)
    })
    .await
    .expect("connect");
    for round in 0..5 {
        let _: String = server.cmd(&["SCRIPT", "FLUSH"]);
        reset_stats(server);
        let checks = (0..20).map(|i| {
            let hit = Hit::new(key(&format!("flush{round}"), &i.to_string()), ROOMY, 1);
            let backend = &backend;
            async move { backend.check(std::slice::from_ref(&hit)).await }
        });
        for result in futures::future::join_all(checks).await {
            result.expect("a check during a script cache loss must not fail");
        }
        // Every NOSCRIPT costs one EVAL, and EVAL re-cached the script. Batched, the 20 checks
        // share fewer calls.
        let (evalsha, eval) = (
            command_calls(server, "evalsha"),
            command_calls(server, "eval"),
        );
        if batch.enabled() {
            assert!(
                (1..20).contains(&evalsha),
                "round {round}: {evalsha} EVALSHA"
            );
        } else {
            assert_eq!(evalsha, 20, "round {round}");
        }
        assert!((1..=evalsha).contains(&eval), "round {round}: {eval} EVAL");
        reset_stats(server);
        backend
            .check(&[Hit::new(key("flush", "after"), ROOMY, 1)])
            .await
            .expect("check");
        assert_eq!(
            (
                command_calls(server, "evalsha"),
                command_calls(server, "eval")
            ),
            (1, 0)
        );
    }
}

/// Concurrent checks share script calls, and each is decided as if alone, in arrival order:
/// all-or-nothing within its own keys, seeing every earlier request's takes.
#[tokio::test]
async fn concurrent_checks_share_calls_and_keep_their_own_answers() {
    let server = RedisServer::start();
    let backend = standalone(&server).await;
    let shared = key("batch", "shared");
    let scarce = key("batch", "scarce");
    let one = BucketParams {
        capacity: 1,
        requests_per_unit: 1,
        unit_ms: 3_600_000,
    };
    let two = BucketParams { capacity: 2, ..one };
    // Drain `scarce`.
    assert!(backend.check(&[Hit::new(&scarce, one, 1)]).await.unwrap()[0].allowed);
    reset_stats(&server);

    // The first request also needs `scarce`, so it takes nothing from `shared`; the next two
    // get `shared`'s two tokens and the fourth finds it empty.
    let requests = [
        vec![Hit::new(&shared, two, 1), Hit::new(&scarce, one, 1)],
        vec![Hit::new(&shared, two, 1)],
        vec![Hit::new(&shared, two, 1)],
        vec![Hit::new(&shared, two, 1)],
    ];
    // Polled together on this one-thread runtime, all four are queued before the batch worker
    // runs: one call.
    let answers = futures::future::join_all(requests.iter().map(|hits| backend.check(hits))).await;
    let allowed: Vec<Vec<bool>> = answers
        .into_iter()
        .map(|verdicts| verdicts.unwrap().iter().map(|v| v.allowed).collect())
        .collect();
    assert_eq!(
        allowed,
        [vec![true, false], vec![true], vec![true], vec![false]]
    );
    assert_eq!(command_calls(&server, "evalsha"), 1);

    // Past the batch size, the rest goes in the next call.
    reset_stats(&server);
    let max = BatchSettings::default().max_keys;
    let many: Vec<Hit> = (0..max + 3)
        .map(|i| Hit::new(key("batch", &format!("many{i}")), ROOMY, 1))
        .collect();
    let answers = futures::future::join_all(
        many.iter()
            .map(|hit| backend.check(std::slice::from_ref(hit))),
    )
    .await;
    assert!(
        answers
            .iter()
            .all(|a| a.as_ref().unwrap()[0].remaining == 999)
    );
    assert_eq!(command_calls(&server, "evalsha"), 2);
}

/// A batch is bounded in keys, and a request is never split: queued requests go in order, each
/// in the first call with room for all of its keys, and one with more keys than the bound goes
/// alone.
#[tokio::test]
async fn batches_are_bounded_in_keys_and_never_split_a_request() {
    let server = RedisServer::start();
    let backend = RedisBackend::connect(RedisOptions {
        batch: BatchSettings {
            max_keys: 4,
            in_flight: 1,
        },
        ..options(vec![server.url()], RedisMode::Standalone)
    })
    .await
    .expect("connect");
    let request = |name: &str, keys: usize| -> Vec<Hit> {
        (0..keys)
            .map(|i| Hit::new(key("bound", &format!("{name}{i}")), ROOMY, 1))
            .collect()
    };
    // Keys 3, 1 | 2, 2 | 6 | 3: four calls, each of at most 4 keys except the 6-key request's.
    let requests = [
        request("a", 3),
        request("b", 1),
        request("c", 2),
        request("d", 2),
        request("e", 6),
        request("f", 3),
    ];
    reset_stats(&server);
    // Polled together on this one-thread runtime: all six are queued before the worker runs.
    let answers = futures::future::join_all(requests.iter().map(|hits| backend.check(hits))).await;
    for (hits, answer) in requests.iter().zip(&answers) {
        let verdicts = answer.as_ref().expect("check");
        assert_eq!(verdicts.len(), hits.len());
        assert!(verdicts.iter().all(|v| v.allowed && v.remaining == 999));
    }
    assert_eq!(command_calls(&server, "evalsha"), 4);
}

#[tokio::test]
async fn recovers_after_redis_restart() {
    let mut server = RedisServer::start();
    let backend = standalone(&server).await;
    let hit = [Hit::new(key("restart", "a"), TEN_PER_SECOND, 1)];
    assert_eq!(backend.check(&hit).await.expect("check")[0].remaining, 9);

    server.restart();
    // No persistence: the restarted server starts empty and without the script.
    let verdicts = check_until_ok(&backend, &hit).await;
    assert_eq!(verdicts[0].remaining, 9);
    assert_eq!(
        command_calls(&server, "eval"),
        1,
        "NOSCRIPT after restart → one EVAL"
    );
    backend.probe().await.expect("probe after recovery");
}

#[tokio::test]
async fn keys_expire_once_the_bucket_would_be_full() {
    let server = RedisServer::start();
    let backend = standalone(&server).await;

    // 2 tokens, 10/s: taking one leaves it 100 ms from full; the key lives that + 1 s margin.
    let fast = key("ttl", "fast");
    let verdict = backend
        .check(&[Hit::new(
            &fast,
            BucketParams {
                capacity: 2,
                ..TEN_PER_SECOND
            },
            1,
        )])
        .await
        .expect("check")[0];
    assert!(verdict.until_full_ms <= 100);
    let pttl: i64 = server.cmd(&["PTTL", &fast]);
    assert!(pttl > 0 && pttl <= 1_100, "PTTL {pttl}");

    // 1 token an hour: the TTL follows the refill time, not a fixed default.
    let slow = key("ttl", "slow");
    let hourly = BucketParams {
        capacity: 10,
        requests_per_unit: 1,
        unit_ms: 3_600_000,
    };
    let until_full = backend
        .check(&[Hit::new(&slow, hourly, 1)])
        .await
        .expect("check")[0]
        .until_full_ms;
    assert!(until_full >= 3_600_000);
    let pttl: i64 = server.cmd(&["PTTL", &slow]);
    assert!(
        pttl > until_full as i64 && pttl <= until_full as i64 + 1_000,
        "PTTL {pttl}"
    );

    wait_until(
        "the refilled bucket's key to expire",
        Duration::from_secs(10),
        || server.cmd::<i64>(&["EXISTS", &fast]) == 0,
    );
    // A missing key is a full bucket.
    let verdict = backend
        .check(&[Hit::new(
            &fast,
            BucketParams {
                capacity: 2,
                ..TEN_PER_SECOND
            },
            0,
        )])
        .await
        .expect("check")[0];
    assert_eq!((verdict.remaining, verdict.until_full_ms), (2, 0));
}

/// 1 per hour, 3 at once (GCRA's burst); windows of an hour.
const HOURLY: BucketParams = BucketParams {
    capacity: 3,
    requests_per_unit: 3,
    unit_ms: 3_600_000,
};

/// Every algorithm's key expires when its state settles (window over, arrival time passed) plus
/// the 1 s margin, plus a jitter below `--expiry-jitter-max` drawn per call.
#[tokio::test]
async fn every_algorithm_expires_when_it_settles_plus_jitter() {
    let server = RedisServer::start();
    // An hour boundary plus 10 minutes.
    let now = 1_699_999_200_000 + 600_000;
    let clock = ManualClock::new(now);
    let jitter_max = 10_000i64;
    let backend = RedisBackend::connect(RedisOptions {
        expiry_jitter_max: Duration::from_millis(jitter_max as u64),
        ..options(vec![server.url()], RedisMode::Standalone)
    })
    .await
    .expect("connect")
    .with_test_clock(Arc::new(clock.clone()));
    let cases = [
        // The window ends 50 minutes from now.
        (Algorithm::FixedWindow, 3_000_000),
        // The count ages out of the next window: 110 minutes.
        (Algorithm::SlidingWindow, 6_600_000),
        // One hit at one per 20 minutes: the arrival time is 20 minutes ahead.
        (Algorithm::Gcra, 1_200_000),
    ];
    for (algorithm, settles_in) in cases {
        let mut jitters = Vec::new();
        for i in 0..20 {
            let k = key("jitter", &format!("{algorithm}-{i}"));
            let v = backend
                .check(&[Hit::new(&k, HOURLY, 1).using(algorithm)])
                .await
                .expect("check");
            assert!(v[0].allowed);
            let pttl: i64 = server.cmd(&["PTTL", &k]);
            let jitter = pttl - settles_in - 1_000;
            // PTTL runs on the real clock: allow a generous second of elapsed test time.
            assert!(
                (-1_000..jitter_max).contains(&jitter),
                "{algorithm}: PTTL {pttl}, jitter {jitter}"
            );
            jitters.push(jitter);
        }
        let spread = jitters.iter().max().unwrap() - jitters.iter().min().unwrap();
        assert!(spread > 1_000, "{algorithm}: jitters {jitters:?}");
    }
    // Without jitter the TTL is exact.
    let exact = standalone(&server)
        .await
        .with_test_clock(Arc::new(clock.clone()));
    let k = key("jitter", "none");
    exact
        .check(&[Hit::new(&k, HOURLY, 1).using(Algorithm::FixedWindow)])
        .await
        .expect("check");
    let pttl: i64 = server.cmd(&["PTTL", &k]);
    assert!(
        (3_000_000..=3_001_000).contains(&pttl),
        "PTTL {pttl} without jitter"
    );
}

/// A bucket written before the algorithms existed (the same key, the same `t`/`u` fields) is
/// read as it is: upgrading sluice resets no bucket. Keys of the other algorithms sit beside it.
#[tokio::test]
async fn token_buckets_stored_before_the_upgrade_are_kept() {
    let server = RedisServer::start();
    let now = 1_700_000_000_000u64;
    let backend = standalone(&server)
        .await
        .with_test_clock(Arc::new(ManualClock::new(now)));
    let entries = [Entry::new("tenant", "acme")];
    let bucket = bucket_key(
        "sluice:",
        "api",
        &entries,
        RuleTag::Configured,
        Algorithm::TokenBucket,
    );
    assert_eq!(bucket, "sluice:{api|tenant=acme}");
    let _: i64 = server.cmd(&["HSET", &bucket, "t", "3", "u", &now.to_string()]);
    let v = backend
        .check(&[Hit::new(&bucket, ONE_PER_MINUTE, 1)])
        .await
        .expect("check");
    assert_eq!(
        (v[0].allowed, v[0].remaining),
        (true, 2),
        "kept its 3 tokens"
    );
    let fields: Vec<String> = server.cmd(&["HKEYS", &bucket]);
    assert_eq!(fields, ["t", "u"]);

    // The same descriptor under another algorithm is another key, with its own fields.
    for (algorithm, expected) in [
        (Algorithm::FixedWindow, vec!["w", "c"]),
        (Algorithm::SlidingWindow, vec!["w", "c", "p"]),
        (Algorithm::Gcra, vec!["a", "f"]),
    ] {
        let k = bucket_key("sluice:", "api", &entries, RuleTag::Configured, algorithm);
        assert_ne!(k, bucket);
        let v = backend
            .check(&[Hit::new(&k, ONE_PER_MINUTE, 1).using(algorithm)])
            .await
            .expect("check");
        assert!(v[0].allowed, "{algorithm} starts empty");
        let fields: Vec<String> = server.cmd(&["HKEYS", &k]);
        assert_eq!(fields, expected, "{algorithm}");
    }
    let fields: Vec<String> = server.cmd(&["HMGET", &bucket, "t", "u"]);
    assert_eq!(fields[0], "2", "the bucket was not touched by the others");
}

/// The script refuses a malformed call with a reply naming what is wrong, and a refused call
/// writes nothing: every argument is parsed, and every key's algorithm checked, before the first
/// write. sluice never sends such calls; the script's contract (its header) says so anyway.
#[test]
fn malformed_script_calls_are_refused_and_write_nothing() {
    let server = RedisServer::start();
    let source = include_str!("../../lua/limit.lua");
    let mut conn = server.conn();
    let eval = |conn: &mut redis::Connection, keys: &[&str], args: &[&str]| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(source).arg(keys.len()).arg(keys).arg(args);
        cmd.query::<redis::Value>(conn)
    };
    // A token bucket of 5, 1 per second, 1 hit: a key's six values.
    const BUCKET: [&str; 6] = ["1", "5", "1", "1000", "1", "0"];
    fn call<'a>(keys: &[&[&'a str]]) -> Vec<&'a str> {
        let mut args = vec!["", "0"];
        keys.iter()
            .for_each(|values| args.extend_from_slice(values));
        args
    }
    let refusals: [(&[&str], Vec<&str>, &str); 6] = [
        (
            &["a"],
            vec!["", "0", "1", "5"],
            "expected 2 + 6 ARGV per key",
        ),
        (&[], vec!["", "0"], "expected 2 + 6 ARGV per key"),
        (
            &["a"],
            [&["soon", "0"][..], &BUCKET].concat(),
            "ARGV[1] must be empty or a number",
        ),
        (
            &["a"],
            [&["", "-1"][..], &BUCKET].concat(),
            "ARGV[2] must be a number >= 0",
        ),
        (
            &["a", "b"],
            call(&[&BUCKET, &["1", "5", "x", "1000", "1", "0"]]),
            "non-numeric ARGV for key 2",
        ),
        (
            &["a", "b"],
            call(&[&BUCKET, &["7", "5", "1", "1000", "1", "0"]]),
            "unknown algorithm 7 for key 2",
        ),
    ];
    for (keys, args, message) in refusals {
        let err = eval(&mut conn, keys, &args).expect_err(message);
        assert!(
            err.to_string().contains(message),
            "{keys:?} {args:?}: {err}"
        );
    }
    // Two requests of a batch (the second starts a group: 1 + 16) naming one key with two
    // algorithms: refused at the second, after the first was decided, yet nothing is written.
    let args = call(&[&BUCKET, &["18", "5", "1", "1000", "1", "0"]]);
    let err = eval(&mut conn, &["a", "a"], &args).expect_err("two algorithms on one key");
    assert!(
        err.to_string().contains("has two algorithms in one call"),
        "{err}"
    );
    for key in ["a", "b"] {
        let exists: i64 = server.cmd(&["EXISTS", key]);
        assert_eq!(exists, 0, "{key} was written by a refused call");
    }
    // The same call well formed is decided and written.
    let reply = eval(&mut conn, &["a"], &call(&[&BUCKET])).expect("a well-formed call");
    assert_eq!(
        redis::from_redis_value::<Vec<i64>>(reply).expect("five integers and no repair"),
        [1, 4, 0, 1000, 1, 0]
    );
    let exists: i64 = server.cmd(&["EXISTS", "a"]);
    assert_eq!(exists, 1);
}

/// Measures what one key of each algorithm costs Redis (`MEMORY USAGE key SAMPLES 0`) for a
/// realistic two-entry descriptor, and prints the figures quoted in docs/algorithms.md.
#[tokio::test]
async fn memory_usage_per_key_by_algorithm() {
    let server = RedisServer::start();
    let backend = standalone(&server).await;
    let entries = [
        Entry::new("tenant", "acme-corp"),
        Entry::new("route", "/api/v1/export"),
    ];
    let mut figures = Vec::new();
    for algorithm in Algorithm::ALL {
        let k = bucket_key("sluice:", "edge", &entries, RuleTag::Configured, algorithm);
        // Mid-window, mid-refill, a fractional arrival time: the state a busy key holds.
        let params = BucketParams {
            capacity: 100,
            requests_per_unit: 30,
            unit_ms: 60_000,
        };
        backend
            .check(&[Hit::new(&k, params, 7).using(algorithm)])
            .await
            .expect("check");
        let kind: String = server.cmd(&["TYPE", &k]);
        assert_eq!(kind, "hash", "{algorithm}");
        let bytes: i64 = server.cmd(&["MEMORY", "USAGE", &k, "SAMPLES", "0"]);
        assert!(bytes > 0 && bytes < 256, "{algorithm}: {bytes} bytes");
        figures.push(format!("{algorithm}: {bytes} bytes ({} byte key)", k.len()));
    }
    let version = server
        .info("server")
        .get("redis_version")
        .cloned()
        .unwrap_or_default();
    println!(
        "MEMORY USAGE per key, redis {version}: {}",
        figures.join(", ")
    );
}
