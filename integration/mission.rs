//! The mission: several sluice processes sharing one Redis hold one limit, whatever their number,
//! through the real path (gRPC in, Redis out). Real processes, real sockets.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_harness as harness;
use sluice_harness::{RedisCluster, RedisServer, SluiceBuilder, SluiceProcess, command_calls};
use tonic::transport::Channel;

const OK: i32 = 1;
const OVER_LIMIT: i32 = 2;

/// `sluice serve` with `config` as its one file, on the Redis at `redis_urls` in `mode`.
fn sluice(config: &str, redis_urls: &str, mode: &str) -> SluiceBuilder {
    SluiceBuilder::files(&[("mission.yaml", config)]).args([
        "--backend",
        "redis",
        "--redis-url",
        redis_urls,
        "--redis-mode",
        mode,
        // Generous: these tests check sharing, not latency, on a busy 2-core machine.
        "--redis-timeout",
        "500ms",
        "--redis-connect-timeout",
        "2s",
    ])
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|pairs| RateLimitDescriptor {
                entries: pairs
                    .iter()
                    .map(|(k, v)| Entry {
                        key: k.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Capacity 20, refill 20 per hour: no refill worth a token during a test, so the count of
/// allowed requests is exactly the capacity however the calls are spread.
const SLOW: &str = r#"
domain: mission
descriptors:
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 20}
    descriptors:
      - key: route
        rate_limit: {unit: hour, requests_per_unit: 5}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_one_two_and_four_replicas_allow_the_same_total() {
    let redis = RedisServer::start();
    let mut figures = Vec::new();
    for replicas in [1usize, 2, 4] {
        let procs: Vec<SluiceProcess> = (0..replicas)
            .map(|_| sluice(SLOW, &redis.url(), "standalone").start())
            .collect();
        let mut clients = Vec::new();
        for p in &procs {
            clients.push(p.client().await);
        }
        let client_id = format!("replicas-{replicas}");
        let mut allowed = 0;
        for i in 0..100 {
            let c = &mut clients[i % replicas];
            let r = c
                .should_rate_limit(request("mission", &[&[("client", &client_id)]]))
                .await
                .expect("call succeeds")
                .into_inner();
            if r.overall_code == OK {
                allowed += 1;
            } else {
                assert_eq!(r.overall_code, OVER_LIMIT);
            }
        }
        figures.push((replicas, allowed));
        println!("replicas={replicas} allowed={allowed} of 100 (capacity 20)");
    }
    for (replicas, allowed) in figures {
        assert_eq!(
            allowed, 20,
            "{replicas} replica(s) must hold the single-replica figure"
        );
    }
}

/// Per-process tallies from the client worker, in wall-clock ms (all processes share the
/// machine's clock).
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    allowed: u64,
    rejected: u64,
    errors: u64,
    first_send: u64,
    first_reply: u64,
    last_send: u64,
    last_reply: u64,
}

impl Tally {
    /// Nothing counted, no first send or reply yet.
    fn none_yet() -> Tally {
        Tally {
            first_send: u64::MAX,
            first_reply: u64::MAX,
            ..Tally::default()
        }
    }

    /// Adds `t`'s counts; the earliest firsts and the latest lasts.
    fn add(&mut self, t: &Tally) {
        self.allowed += t.allowed;
        self.rejected += t.rejected;
        self.errors += t.errors;
        self.first_send = self.first_send.min(t.first_send);
        self.first_reply = self.first_reply.min(t.first_reply);
        self.last_send = self.last_send.max(t.last_send);
        self.last_reply = self.last_reply.max(t.last_reply);
    }

    fn parse(line: &str) -> Option<Tally> {
        let mut t = Tally::default();
        let rest = line.strip_prefix("TALLY ")?;
        for field in rest.split_whitespace() {
            let (k, v) = field.split_once('=')?;
            let v: u64 = v.parse().ok()?;
            match k {
                "allowed" => t.allowed = v,
                "rejected" => t.rejected = v,
                "errors" => t.errors = v,
                "first_send" => t.first_send = v,
                "first_reply" => t.first_reply = v,
                "last_send" => t.last_send = v,
                "last_reply" => t.last_reply = v,
                _ => return None,
            }
        }
        Some(t)
    }
}

#[allow(clippy::disallowed_methods)]
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Not a test of its own: the body of one client process of the hammer test. The test binary
/// re-runs itself with `MISSION_CLIENT_TARGETS` set; without it this returns at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_client_worker() {
    let Ok(targets) = std::env::var("MISSION_CLIENT_TARGETS") else {
        return;
    };
    let concurrency: usize = env_number("MISSION_CLIENT_CONCURRENCY");
    let run_ms: u64 = env_number("MISSION_CLIENT_RUN_MS");
    let start_at: u64 = env_number("MISSION_CLIENT_START_AT");
    let mut clients = Vec::new();
    for t in targets.split(',') {
        clients.push(
            RateLimitServiceClient::connect(format!("http://{t}"))
                .await
                .unwrap(),
        );
    }
    let now = wall_ms();
    if start_at > now {
        tokio::time::sleep(Duration::from_millis(start_at - now)).await;
    }
    let stop_at = start_at + run_ms;
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let c = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(hammer(c, stop_at)));
    }
    let mut total = Tally::none_yet();
    for task in tasks {
        total.add(&task.await.unwrap());
    }
    println!(
        "TALLY allowed={} rejected={} errors={} first_send={} first_reply={} last_send={} last_reply={}",
        total.allowed,
        total.rejected,
        total.errors,
        total.first_send,
        total.first_reply,
        total.last_send,
        total.last_reply
    );
}

/// A number from the environment the hammer test sets for its client processes.
fn env_number<T: std::str::FromStr>(name: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    std::env::var(name).unwrap().parse().unwrap()
}

/// One connection's share of a client process: calls one after another until `stop_at`.
async fn hammer(mut c: RateLimitServiceClient<Channel>, stop_at: u64) -> Tally {
    let mut t = Tally::none_yet();
    loop {
        let sent = wall_ms();
        if sent >= stop_at {
            break;
        }
        t.first_send = t.first_send.min(sent);
        t.last_send = t.last_send.max(sent);
        let r = c
            .should_rate_limit(request("mission", &[&[("client", "hammered")]]))
            .await;
        let replied = wall_ms();
        t.first_reply = t.first_reply.min(replied);
        t.last_reply = t.last_reply.max(replied);
        match r.map(|r| r.into_inner().overall_code) {
            Ok(OK) => t.allowed += 1,
            Ok(_) => t.rejected += 1,
            Err(_) => t.errors += 1,
        }
    }
    t
}

#[test]
fn mission_four_client_processes_hammer_one_key_through_three_replicas() {
    const CAPACITY: f64 = 50.0;
    const RATE_PER_S: f64 = 100.0;
    let config = r#"
domain: mission
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 100, burst: 50}
"#;
    let redis = RedisServer::start();
    let procs: Vec<SluiceProcess> = (0..3)
        .map(|_| sluice(config, &redis.url(), "standalone").start())
        .collect();
    let targets = procs
        .iter()
        .map(|p| p.grpc.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let start_at = wall_ms() + 1_500;
    let clients: Vec<Child> = (0..4)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "mission_client_worker", "--nocapture"])
                .env("MISSION_CLIENT_TARGETS", &targets)
                .env("MISSION_CLIENT_CONCURRENCY", "16")
                .env("MISSION_CLIENT_RUN_MS", "3000")
                .env("MISSION_CLIENT_START_AT", start_at.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn client process")
        })
        .collect();
    let mut tallies = Vec::new();
    for c in clients {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "client process failed");
        let text = String::from_utf8_lossy(&out.stdout);
        let tally = text
            .lines()
            .find_map(Tally::parse)
            .unwrap_or_else(|| panic!("no TALLY line in client output:\n{text}"));
        tallies.push(tally);
    }
    let allowed: u64 = tallies.iter().map(|t| t.allowed).sum();
    let rejected: u64 = tallies.iter().map(|t| t.rejected).sum();
    let errors: u64 = tallies.iter().map(|t| t.errors).sum();
    let first_send = tallies.iter().map(|t| t.first_send).min().unwrap();
    let first_reply = tallies.iter().map(|t| t.first_reply).min().unwrap();
    let last_send = tallies.iter().map(|t| t.last_send).max().unwrap();
    let last_reply = tallies.iter().map(|t| t.last_reply).max().unwrap();
    // Every script run happened inside [first_send, last_reply] and the window
    // [first_reply, last_send] lies inside the span of script runs.
    let outer_s = (last_reply - first_send) as f64 / 1000.0;
    let inner_s = last_send.saturating_sub(first_reply) as f64 / 1000.0;
    let upper = CAPACITY + RATE_PER_S * outer_s;
    let lower = CAPACITY + RATE_PER_S * inner_s - 1.0;
    println!(
        "hammer: allowed={allowed} rejected={rejected} errors={errors} \
         window outer={outer_s:.3}s inner={inner_s:.3}s bound=[{lower:.1}, {upper:.1}] \
         over-admission={:.1}",
        (allowed as f64 - upper).max(0.0)
    );
    assert_eq!(errors, 0, "no call may fail");
    assert!(
        rejected > 0,
        "the load must exceed the limit for the test to mean anything"
    );
    assert!(
        (allowed as f64) <= upper,
        "over-admission: {allowed} > {upper:.1}"
    );
    assert!(
        (allowed as f64) >= lower,
        "under-admission: {allowed} < {lower:.1}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_one_evalsha_per_should_rate_limit() {
    let redis = RedisServer::start();
    // A fixed replica count: no heartbeat script runs beside the decisions being counted (and
    // the readiness probe stays quiet while traffic flows).
    let sluice = sluice(SLOW, &redis.url(), "standalone")
        .env("SLUICE_REPLICAS", "1")
        .start();
    let mut client = sluice.client().await;
    // Warm up (the connection and the script load happen at start).
    client
        .should_rate_limit(request("mission", &[&[("client", "warm")]]))
        .await
        .unwrap();
    let before = command_calls(&redis, "evalsha") + command_calls(&redis, "eval");
    let before_other = calls_outside_script(&redis);
    let n = 50;
    for i in 0..n {
        let id = format!("rt-{i}");
        // Three descriptors, two rules, one request: still one script call.
        client
            .should_rate_limit(request(
                "mission",
                &[
                    &[("client", &id)],
                    &[("client", &id), ("route", "a")],
                    &[("client", &id), ("route", "b")],
                ],
            ))
            .await
            .unwrap();
    }
    let scripts = command_calls(&redis, "evalsha") + command_calls(&redis, "eval") - before;
    // commandstats also counts what the script itself calls; anything else came from sluice.
    let other = calls_outside_script(&redis) - before_other;
    println!(
        "round trips: {scripts} script calls and {other} other commands for {n} ShouldRateLimit"
    );
    assert_eq!(scripts, n);
    assert_eq!(other, 0, "no extra reads or writes besides the script");
}

/// Concurrent calls share script calls (batching), and the limit stays exact: 300 calls at
/// once on one client of capacity 20, through two replicas, admit exactly 20.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_concurrent_calls_share_script_calls_and_hold_the_limit() {
    let redis = RedisServer::start();
    // No over-limit cache: every call must reach Redis, so fewer script calls than calls means
    // calls shared them.
    let env = [
        ("SLUICE_REPLICAS", "2"),
        ("SLUICE_OVER_LIMIT_CACHE", "false"),
    ];
    let procs = [(), ()].map(|_| sluice(SLOW, &redis.url(), "standalone").envs(env).start());
    let mut clients = Vec::new();
    for p in &procs {
        let mut client = p.client().await;
        client
            .should_rate_limit(request("mission", &[&[("client", "warm")]]))
            .await
            .unwrap();
        clients.push(client);
    }
    let before = command_calls(&redis, "evalsha") + command_calls(&redis, "eval");
    let n = 300;
    let calls = (0..n).map(|i| {
        let mut client = clients[i % 2].clone();
        async move {
            client
                .should_rate_limit(request("mission", &[&[("client", "crowd")]]))
                .await
                .map(|r| r.into_inner().overall_code)
        }
    });
    let codes = futures::future::join_all(calls).await;
    let scripts = command_calls(&redis, "evalsha") + command_calls(&redis, "eval") - before;
    let allowed = codes.iter().filter(|c| *c.as_ref().unwrap() == OK).count();
    assert!(codes.iter().all(|c| matches!(c, Ok(OK | OVER_LIMIT))));
    println!("batching: {n} concurrent calls, {scripts} script calls, {allowed} allowed");
    assert_eq!(allowed, 20);
    assert!(
        scripts < n as u64,
        "{scripts} script calls for {n} calls: no batching"
    );
}

/// Commands neither the script call itself, what the script runs inside Redis, nor this test's
/// own INFO.
fn calls_outside_script(redis: &RedisServer) -> u64 {
    const SCRIPT: [&str; 7] = [
        "evalsha", "eval", "hmget", "hset", "pexpire", "time", "info",
    ];
    redis
        .info("commandstats")
        .iter()
        .filter(|(k, _)| {
            let name = k.trim_start_matches("cmdstat_");
            !SCRIPT.contains(&name)
        })
        .filter_map(|(_, v)| {
            v.split(',')
                .find_map(|f| f.strip_prefix("calls="))
                .and_then(|c| c.parse::<u64>().ok())
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_script_flush_and_redis_restart_are_survived() {
    let mut redis = RedisServer::start();
    let sluice = sluice(SLOW, &redis.url(), "standalone").start();
    let mut client = sluice.client().await;
    let call = |c: &mut RateLimitServiceClient<Channel>, id: String| {
        let mut c = c.clone();
        async move {
            c.should_rate_limit(request("mission", &[&[("client", &id)]]))
                .await
                .map(|r| r.into_inner().overall_code)
        }
    };
    for i in 0..5 {
        assert_eq!(call(&mut client, format!("f{i}")).await.unwrap(), OK);
    }
    let _: String = redis.cmd(&["SCRIPT", "FLUSH"]);
    for i in 0..20 {
        assert_eq!(
            call(&mut client, format!("g{i}"))
                .await
                .expect("no NOSCRIPT reaches the client"),
            OK
        );
    }
    redis.restart();
    let mut recovered = false;
    for _ in 0..100 {
        if matches!(call(&mut client, "after-restart".into()).await, Ok(OK)) {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(recovered, "service recovers after a Redis restart");
    // And the data path works on the empty, restarted server: a full bucket of 20.
    let mut allowed = 0;
    for _ in 0..25 {
        if matches!(call(&mut client, "fresh".into()).await, Ok(OK)) {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_keys_carry_a_ttl() {
    let redis = RedisServer::start();
    let config = r#"
domain: mission
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 10, burst: 2}
"#;
    let sluice = sluice(config, &redis.url(), "standalone").start();
    let mut client = sluice.client().await;
    client
        .should_rate_limit(request("mission", &[&[("client", "ttl")]]))
        .await
        .unwrap();
    let keys: Vec<String> = redis.cmd(&["KEYS", "sluice:{mission|*"]);
    assert_eq!(keys, vec!["sluice:{mission|client=ttl}".to_string()]);
    let pttl: i64 = redis.cmd(&["PTTL", &keys[0]]);
    assert!(
        pttl > 0 && pttl <= 2_000,
        "TTL about capacity/rate + margin: {pttl}"
    );
    // Once the bucket would be full again (0.1 s) plus the margin, the key is gone.
    harness::wait_until("key expiry", Duration::from_secs(5), || {
        redis
            .cmd::<Vec<String>>(&["KEYS", "sluice:{mission|*"])
            .is_empty()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_cluster_keeps_a_request_in_one_slot() {
    let cluster = RedisCluster::start(3, 0);
    let sluice = sluice(SLOW, &cluster.urls().join(","), "cluster").start();
    let mut client = sluice.client().await;
    let r = client
        .should_rate_limit(request(
            "mission",
            &[&[("client", "c1")], &[("client", "c1"), ("route", "x")]],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
    let mut keys: Vec<String> = Vec::new();
    for node in cluster.masters() {
        keys.extend(node.cmd::<Vec<String>>(&["KEYS", "sluice:{mission|*"]));
    }
    assert_eq!(keys.len(), 2, "{keys:?}");
    let slots: Vec<u16> = keys.iter().map(|k| cluster.keyslot(k)).collect();
    assert_eq!(slots[0], slots[1], "{keys:?} → {slots:?}");
    // Both share one limit across the cluster too.
    let mut allowed = 1;
    for _ in 0..30 {
        let r = client
            .should_rate_limit(request("mission", &[&[("client", "c1")]]))
            .await
            .unwrap()
            .into_inner();
        if r.overall_code == OK {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 20);
}

/// Redis's clock is the only clock: one replica runs under libfaketime two hours ahead with its
/// clock running five times fast. If any local time reached a decision, its refills would differ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mission_local_clocks_do_not_matter() {
    let faketime = tool("faketime", "faketime");
    let redis = RedisServer::start();
    let normal = sluice(SLOW, &redis.url(), "standalone").start();
    let skewed = sluice(SLOW, &redis.url(), "standalone")
        .wrapped_in(&[faketime.to_str().unwrap(), "-f", "+2h x5"])
        .start();
    let mut clients = [normal.client().await, skewed.client().await];
    let mut remaining = Vec::new();
    for i in 0..30 {
        let r = clients[i % 2]
            .should_rate_limit(request("mission", &[&[("client", "clocks")]]))
            .await
            .unwrap()
            .into_inner();
        remaining.push((r.overall_code, r.statuses[0].limit_remaining));
    }
    let allowed = remaining.iter().filter(|(c, _)| *c == OK).count();
    println!("clock skew: allowed={allowed} sequence={remaining:?}");
    assert_eq!(allowed, 20);
    // One shared countdown, whichever replica answered.
    for (i, (code, left)) in remaining.iter().take(20).enumerate() {
        assert_eq!((*code, *left), (OK, 19 - i as u32));
    }
}

/// Path of a tool the test needs, or a panic naming the Debian package that provides it.
fn tool(name: &str, package: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found: install the Debian package `{package}` (apt-get install -y {package})")
        })
}
