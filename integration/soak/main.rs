//! Soak: two `sluice serve` processes on one redis-server decide a mixed load for a while, with a
//! fault on a schedule, and must come out as they went in.
//!
//! The load: several tasks send `ShouldRateLimit` calls round robin to both replicas, each for
//! one or two rules of [`config`] (all four algorithms; `lease` on two rules, `shards` on one;
//! failure policies `local`, `closed`, `open` and `error`) with a key drawn Zipf over 100,000
//! values, so a few keys sit at their limit while most are touched once. The faults, in turn:
//! Redis killed (-9) and started again empty after 1 s, Redis SIGSTOPped for 3 s, a changed valid
//! config written (both replicas must activate it), an invalid one (both must refuse it and keep
//! the last good one). A Cluster failover is left out: this soak runs on one standalone Redis
//! (failovers under load are `integration/chaos.rs`'s and `integration/scale.rs`'s).
//!
//! Sampled every few seconds: each sluice's RSS, open file descriptors and threads (from
//! `/proc/<pid>`), its `sluice_replicas` gauge, and Redis's key count (`DBSIZE`). sluice exposes
//! no tokio task count, so none is sampled. The series is printed as a table and written as CSV
//! next to the test's temp files (`target/tmp/soak-*.csv`); the long variant also plots it when
//! a Python with matplotlib is at hand (`SLUICE_SOAK_PYTHON`, default `python3`).
//!
//! Asserted, with margins and never on timings: no failed or hung call outside a fault window
//! (from the fault's start to a few seconds after Redis is back); few degraded decisions outside
//! them; for every key of every rule, the admissions Redis decided stay within what its algorithm
//! can give (a bucket's C + r·T, a window's limit per window touched) over the quiet tail after
//! the last Redis fault, and over the whole run with one more full bucket per restart (a restart
//! loses the buckets); RSS and descriptors at the end within 1.5× their post-warm-up values plus
//! a small constant; Redis's key count never above what the keys touched in the last 5 s
//! explain (keys expire); both replicas counting each other at the end and exiting cleanly on
//! SIGTERM.
//!
//! `chaos_soak_one_minute` runs in CI; `chaos_soak_long` only with `SLUICE_SOAK_MINUTES=N`
//! (outside nextest, whose slow-test limit would end it):
//! `SLUICE_SOAK_MINUTES=5 cargo test -p sluice --test soak chaos_soak_long -- --nocapture`.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice_harness::rls::{OK, OVER_LIMIT, desc, header};
use sluice_harness::{RedisServer, SluiceBuilder, SluiceProcess};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

const REPLICAS: usize = 2;
/// Distinct key values, drawn Zipf with this exponent (the hottest value gets about 13 % of a
/// rule's calls, the 10th about 1 %).
const KEYS: usize = 100_000;
const ZIPF_EXPONENT: f64 = 1.1;
const WORKERS: usize = 4;
/// Each worker's pause between calls.
const PACE: Duration = Duration::from_millis(3);
/// A call not answered within this counts as failed (hung).
const HUNG: Duration = Duration::from_secs(5);
/// How long Redis stays down when restarted, and stopped when paused.
const RESTART_DOWN: Duration = Duration::from_secs(1);
const PAUSE: Duration = Duration::from_secs(3);
/// A Redis fault's window ends this long after Redis is back: the breaker's cooldown, the
/// reconnect backoff and a probe fit well inside.
const GRACE: Duration = Duration::from_secs(4);
/// `--lease-lifetime` (the default): leased tokens may be spent this long after leaving Redis.
const LEASE_LIFETIME_S: f64 = 1.0;
/// Every key sluice writes settles within 3 s here (a full bucket, an ended window) and then
/// expires; Redis's key count is compared with the keys touched within this span.
const KEY_SPAN: Duration = Duration::from_secs(5);
/// The fixed window's limit alternates between these on each valid reload.
const FW_LIMITS: [u64; 2] = [5, 6];

/// How one rule limits, for its bound.
#[derive(Clone, Copy, Debug)]
enum Limit {
    /// Token bucket or GCRA: capacity (burst), refill per second, lease size (0: none).
    Bucket {
        capacity: f64,
        rate: f64,
        lease: f64,
    },
    /// Fixed or sliding window of one second: at most `limit` per aligned window.
    Window { limit: f64 },
}

#[derive(Clone, Copy, Debug)]
struct Rule {
    key: &'static str,
    limit: Limit,
    /// Redis keys one descriptor value may use (its shards).
    keys_per_value: usize,
}

/// The rules of [`config`], in its order.
const RULES: [Rule; 5] = [
    Rule {
        key: "tb",
        limit: Limit::Bucket {
            capacity: 10.0,
            rate: 5.0,
            lease: 3.0,
        },
        keys_per_value: 1,
    },
    Rule {
        key: "gcra",
        limit: Limit::Bucket {
            capacity: 8.0,
            rate: 4.0,
            lease: 2.0,
        },
        keys_per_value: 1,
    },
    Rule {
        key: "fw",
        limit: Limit::Window {
            limit: FW_LIMITS[1] as f64,
        },
        keys_per_value: 1,
    },
    Rule {
        key: "sw",
        limit: Limit::Window { limit: 6.0 },
        keys_per_value: 1,
    },
    Rule {
        key: "sh",
        limit: Limit::Bucket {
            capacity: 16.0,
            rate: 8.0,
            lease: 0.0,
        },
        keys_per_value: 4,
    },
];

/// The soak's config: the rules of [`RULES`], the fixed window at `fw_limit`; `fw_extra` is
/// appended to the fixed window's `rate_limit` (a `lease` there makes the file invalid).
fn config(fw_limit: u64, fw_extra: &str) -> String {
    format!(
        r#"domain: soak
descriptors:
  - key: tb
    failure_mode: local
    rate_limit: {{unit: second, requests_per_unit: 5, burst: 10, lease: 3}}
  - key: gcra
    failure_mode: closed
    rate_limit: {{unit: second, requests_per_unit: 4, burst: 8, lease: 2, algorithm: gcra}}
  - key: fw
    failure_mode: open
    rate_limit: {{unit: second, requests_per_unit: {fw_limit}, algorithm: fixed_window{fw_extra}}}
  - key: sw
    failure_mode: error
    rate_limit: {{unit: second, requests_per_unit: 6, algorithm: sliding_window}}
  - key: sh
    failure_mode: local
    rate_limit: {{unit: second, requests_per_unit: 8, burst: 16, shards: 4}}
"#
    )
}

impl Rule {
    /// The most this rule's algorithm can admit for one key over `span_s` seconds, with the
    /// bucket lost `resets` times (a Redis restart): each loss gives a full bucket again (and
    /// a window its full count again), plus what leases held then. One token of rounding.
    fn bound(&self, span_s: f64, resets: u32) -> f64 {
        let segments = f64::from(resets) + 1.0;
        match self.limit {
            Limit::Bucket {
                capacity,
                rate,
                lease,
            } => {
                let lease_slack = if lease > 0.0 {
                    rate * LEASE_LIFETIME_S
                } else {
                    0.0
                };
                segments * (capacity + lease_slack)
                    + rate * span_s
                    + f64::from(resets) * REPLICAS as f64 * lease
                    + 1.0
            }
            Limit::Window { limit } => limit * (span_s.floor() + 2.0 + f64::from(resets)),
        }
    }
}

/// Test time: the load and the schedule measure wall time; no decision reads it.
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}

/// A blocking harness call (signals, /proc, an HTTP scrape) without stalling the load.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Zipf over `0..n` (0 the most frequent) by inverse CDF.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, exponent: f64) -> Zipf {
        let mut total = 0.0;
        let mut cdf: Vec<f64> = (1..=n)
            .map(|rank| {
                total += (rank as f64).powf(-exponent);
                total
            })
            .collect();
        for p in &mut cdf {
            *p /= total;
        }
        Zipf { cdf }
    }

    fn sample(&self, rng: &mut impl Rng) -> u32 {
        let u: f64 = rng.random();
        self.cdf.partition_point(|&p| p < u).min(self.cdf.len() - 1) as u32
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    OverLimit,
    /// A gRPC error or a hung call.
    Failed,
}

/// No second rule in [`Sample::rules`].
const NO_RULE: u8 = u8::MAX;

/// One call, kept small: a long soak holds millions.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// ms since the soak started.
    sent: u32,
    replied: u32,
    value: u32,
    /// Indexes into [`RULES`]; the second may be [`NO_RULE`].
    rules: [u8; 2],
    outcome: Outcome,
    degraded: bool,
}

impl Sample {
    fn rules(&self) -> impl Iterator<Item = usize> {
        self.rules
            .into_iter()
            .filter(|r| *r != NO_RULE)
            .map(usize::from)
    }

    /// Admitted on Redis's word (not by a failure policy).
    fn admitted_by_redis(&self) -> bool {
        self.outcome == Outcome::Ok && !self.degraded
    }
}

fn request(rules: [u8; 2], value: u32) -> RateLimitRequest {
    let value = format!("k{value}");
    let descriptors: Vec<RateLimitDescriptor> = rules
        .into_iter()
        .filter(|r| *r != NO_RULE)
        .map(|r| desc(&[(RULES[usize::from(r)].key, &value)]))
        .collect();
    RateLimitRequest {
        domain: "soak".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// A worker's samples, and the errors it kept.
type Collected = (Vec<Sample>, Vec<CallError>);

/// A failed call's send and reply times (ms) and what it failed with.
type CallError = (u32, u32, String);

/// The load: workers calling the replicas round robin until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    workers: Vec<JoinHandle<Collected>>,
}

impl Load {
    fn start(
        clients: Vec<RateLimitServiceClient<Channel>>,
        zipf: Arc<Zipf>,
        start: Instant,
        seed: u64,
    ) -> Load {
        let stop: Arc<AtomicBool> = Arc::default();
        let sent: Arc<AtomicU64> = Arc::default();
        let workers = (0..WORKERS)
            .map(|worker| {
                let (clients, zipf, stop, sent) =
                    (clients.clone(), zipf.clone(), stop.clone(), sent.clone());
                tokio::spawn(async move {
                    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(worker as u64));
                    let mut samples = Vec::new();
                    let mut errors = Vec::new();
                    let mut n = worker;
                    let ms = |at: Instant| (at - start).as_millis() as u32;
                    while !stop.load(Ordering::Relaxed) {
                        let value = zipf.sample(&mut rng);
                        let first = rng.random_range(0..RULES.len());
                        // A quarter of the calls carry a second rule for the same value.
                        let second = if rng.random_ratio(1, 4) {
                            ((first + rng.random_range(1..RULES.len())) % RULES.len()) as u8
                        } else {
                            NO_RULE
                        };
                        let rules = [first as u8, second];
                        let mut client = clients[n % clients.len()].clone();
                        n += 1;
                        let sent_at = now();
                        let reply = tokio::time::timeout(
                            HUNG,
                            client.should_rate_limit(request(rules, value)),
                        )
                        .await;
                        let replied_at = now();
                        let (outcome, degraded) = match reply {
                            Ok(Ok(r)) => {
                                let r = r.into_inner();
                                let degraded = header(&r, "x-ratelimit-degraded").is_some();
                                match r.overall_code {
                                    OK => (Outcome::Ok, degraded),
                                    OVER_LIMIT => (Outcome::OverLimit, degraded),
                                    code => {
                                        errors.push((
                                            ms(sent_at),
                                            ms(replied_at),
                                            format!("overall code {code}"),
                                        ));
                                        (Outcome::Failed, degraded)
                                    }
                                }
                            }
                            Ok(Err(status)) => {
                                if errors.len() < 1_000 {
                                    errors.push((
                                        ms(sent_at),
                                        ms(replied_at),
                                        format!("{:?}: {}", status.code(), status.message()),
                                    ));
                                }
                                (Outcome::Failed, false)
                            }
                            Err(_) => {
                                errors.push((
                                    ms(sent_at),
                                    ms(replied_at),
                                    format!("no answer within {HUNG:?}"),
                                ));
                                (Outcome::Failed, false)
                            }
                        };
                        samples.push(Sample {
                            sent: ms(sent_at),
                            replied: ms(replied_at),
                            value,
                            rules,
                            outcome,
                            degraded,
                        });
                        sent.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(PACE).await;
                    }
                    (samples, errors)
                })
            })
            .collect();
        Load {
            stop,
            sent,
            workers,
        }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Every sample, by send time, and every error message kept (with its send time).
    async fn finish(self) -> Collected {
        self.stop.store(true, Ordering::Relaxed);
        let (mut samples, mut errors) = (Vec::new(), Vec::new());
        for worker in self.workers {
            let (s, e) = worker.await.expect("load worker");
            samples.extend(s);
            errors.extend(e);
        }
        samples.sort_by_key(|s| s.sent);
        errors.sort_by_key(|e| e.0);
        (samples, errors)
    }
}

/// A `sluice serve` replica on `redis_url` reading `config_dir`.
fn replica(config_dir: &Path, redis_url: &str) -> SluiceProcess {
    SluiceBuilder::config(config_dir)
        .args(["--backend", "redis", "--redis-url", redis_url])
        // The test takes a replica out of rotation itself before its SIGTERM.
        .args(["--drain-delay", "0s"])
        // Generous: this run checks resources and invariants, not latency, on 2 busy cores.
        .args(["--redis-timeout", "250ms", "--redis-connect-timeout", "2s"])
        .args(["--watch-debounce", "100ms", "--drain-timeout", "2s"])
        .start()
}

/// Resources from `/proc` and the replica count from `/metrics`.
fn resources(replica: &SluiceProcess) -> Resources {
    let pid = replica.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("proc fd")
        .count() as u64;
    Resources {
        rss_kib: field("VmRSS:"),
        fds,
        threads: field("Threads:"),
        replicas: value(&replica.metrics(), "sluice_replicas")
            .expect("sluice_replicas in the scrape") as u64,
    }
}

/// The last 40 lines of `replica`'s log.
fn log_tail(replica: &SluiceProcess) -> String {
    let text = replica.log();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The value of an unlabelled metric in a Prometheus text scrape.
fn value(scrape: &str, name: &str) -> Option<f64> {
    scrape.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// The active config's digest (`sluice_config_info{digest="…"}`).
fn digest(scrape: &str) -> String {
    scrape
        .lines()
        .find_map(|line| {
            let labels = line.strip_prefix("sluice_config_info{")?;
            let from = labels.find("digest=\"")? + "digest=\"".len();
            let len = labels[from..].find('"')?;
            Some(labels[from..from + len].to_string())
        })
        .unwrap_or_else(|| panic!("no sluice_config_info in the scrape:\n{scrape}"))
}

#[derive(Clone, Copy, Debug, Default)]
struct Resources {
    rss_kib: u64,
    fds: u64,
    threads: u64,
    replicas: u64,
}

/// One point of the series.
#[derive(Clone, Debug)]
struct Row {
    at: u32,
    requests: u64,
    sluice: [Resources; REPLICAS],
    redis_keys: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FaultKind {
    RedisRestart,
    RedisPause,
    Reload,
    InvalidConfig,
}

impl FaultKind {
    const CYCLE: [FaultKind; 4] = [
        FaultKind::RedisRestart,
        FaultKind::RedisPause,
        FaultKind::Reload,
        FaultKind::InvalidConfig,
    ];

    fn name(self) -> &'static str {
        match self {
            FaultKind::RedisRestart => "redis kill -9 + restart empty",
            FaultKind::RedisPause => "redis SIGSTOP",
            FaultKind::Reload => "config reload",
            FaultKind::InvalidConfig => "invalid config",
        }
    }

    fn hits_redis(self) -> bool {
        matches!(self, FaultKind::RedisRestart | FaultKind::RedisPause)
    }
}

/// One injected fault: when it started, when Redis was back (or the config was applied or
/// refused on both replicas), ms since the start.
#[derive(Clone, Copy, Debug)]
struct Fault {
    kind: FaultKind,
    start: u32,
    back: u32,
}

impl Fault {
    /// The span in which calls may fail or be degraded: none for a config change.
    fn window(&self) -> Option<(u32, u32)> {
        self.kind
            .hits_redis()
            .then(|| (self.start, self.back + GRACE.as_millis() as u32))
    }
}

/// How long a soak runs and how often things happen in it.
struct Plan {
    name: String,
    duration: Duration,
    fault_every: Duration,
    sample_every: Duration,
    warm_up: Duration,
    plot: bool,
}

impl Plan {
    fn new(name: &str, duration: Duration, fault_every: Duration, sample_every: Duration) -> Plan {
        Plan {
            name: name.to_string(),
            duration,
            fault_every,
            sample_every,
            // Past the first fault, so the first outage's one-time allocations are in the base.
            warm_up: fault_every / 2 + Duration::from_secs(10),
            plot: false,
        }
    }

    /// Faults at F/2, F/2 + F, … leaving at least F of quiet at the end.
    fn fault_times(&self) -> Vec<Duration> {
        let mut times = Vec::new();
        let mut at = self.fault_every / 2;
        while at + self.fault_every <= self.duration {
            times.push(at);
            at += self.fault_every;
        }
        times
    }
}

/// The CI variant: a minute, a fault every 12 s (each kind once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak_one_minute() {
    soak(Plan::new(
        "1min",
        Duration::from_secs(60),
        Duration::from_secs(12),
        Duration::from_secs(2),
    ))
    .await;
}

/// The long variant: `SLUICE_SOAK_MINUTES=N` minutes, a fault every N·12 s (between 15 s and
/// 3 min; `SLUICE_SOAK_FAULT_EVERY_S` overrides), plotted when matplotlib is at hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_soak_long() {
    let Some(minutes) = std::env::var("SLUICE_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse::<u64>().ok())
        .filter(|m| *m > 0)
    else {
        println!("SOAK long: skipped; set SLUICE_SOAK_MINUTES=N to soak for N minutes");
        return;
    };
    let duration = Duration::from_secs(minutes * 60);
    let fault_every = std::env::var("SLUICE_SOAK_FAULT_EVERY_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or((duration / 5).clamp(Duration::from_secs(15), Duration::from_secs(180)));
    let mut plan = Plan::new(
        &format!("{minutes}min"),
        duration,
        fault_every,
        Duration::from_secs(5),
    );
    plan.plot = true;
    soak(plan).await;
}

/// Writes `text` as the config directory's one file, atomically (a rename within one
/// filesystem), so a replica never reads half a file.
fn write_config(dir: &Path, text: &str) {
    let staged = dir.with_extension("next");
    std::fs::write(&staged, text).expect("stage the config");
    std::fs::rename(&staged, dir.join("soak.yaml")).expect("move the config in");
}

/// Polls every replica's scrape until `done` holds for all of them; panics after 20 s.
async fn until_every_replica(
    replicas: &[SluiceProcess],
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Vec<String> {
    let deadline = now() + Duration::from_secs(20);
    loop {
        let scrapes: Vec<String> =
            blocking(|| replicas.iter().map(SluiceProcess::metrics).collect());
        if scrapes.iter().all(|s| done(s)) {
            return scrapes;
        }
        assert!(
            now() < deadline,
            "not every replica {what} within 20 s; logs:\n{}",
            replicas
                .iter()
                .map(log_tail)
                .collect::<Vec<_>>()
                .join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The config state the soak tracks across reloads.
struct ConfigState {
    dir: PathBuf,
    fw_limit: u64,
    digest: String,
}

async fn soak(plan: Plan) {
    let seed: u64 = rand::rng().random();
    println!(
        "SOAK {}: {:.0} s, a fault every {:.0} s, a sample every {:.0} s, warm-up {:.0} s, seed {seed}",
        plan.name,
        plan.duration.as_secs_f64(),
        plan.fault_every.as_secs_f64(),
        plan.sample_every.as_secs_f64(),
        plan.warm_up.as_secs_f64(),
    );
    let mut redis = blocking(RedisServer::start);
    let dir = tempfile::tempdir().unwrap();
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir).unwrap();
    write_config(&config_dir, &config(FW_LIMITS[0], ""));
    let mut replicas: Vec<SluiceProcess> = blocking(|| {
        (0..REPLICAS)
            .map(|_| replica(&config_dir, &redis.url()))
            .collect()
    });
    let mut clients = Vec::new();
    for r in &replicas {
        clients.push(r.client().await);
    }
    let initial = until_every_replica(&replicas, "loaded the config", |s| {
        value(s, "ratelimit_service_config_load_success") == Some(1.0)
    })
    .await;
    let mut state = ConfigState {
        dir: config_dir.clone(),
        fw_limit: FW_LIMITS[0],
        digest: digest(&initial[0]),
    };

    let zipf = Arc::new(Zipf::new(KEYS, ZIPF_EXPONENT));
    let start = now();
    let ms = |at: Instant| (at - start).as_millis() as u32;
    let load = Load::start(clients, zipf, start, seed);

    let mut schedule = plan.fault_times().into_iter().peekable();
    let mut faults: Vec<Fault> = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut config_notes: Vec<String> = Vec::new();
    let mut next_sample = Duration::ZERO;
    while start.elapsed() < plan.duration {
        if schedule.peek().is_some_and(|at| start.elapsed() >= *at) {
            schedule.next();
            let kind = FaultKind::CYCLE[faults.len() % FaultKind::CYCLE.len()];
            let started = now();
            match kind {
                FaultKind::RedisRestart => {
                    blocking(|| redis.kill());
                    tokio::time::sleep(RESTART_DOWN).await;
                    blocking(|| redis.start_again());
                }
                FaultKind::RedisPause => {
                    blocking(|| redis.pause());
                    tokio::time::sleep(PAUSE).await;
                    blocking(|| redis.resume());
                }
                FaultKind::Reload => {
                    config_notes.push(reload(&replicas, &mut state).await);
                }
                FaultKind::InvalidConfig => {
                    config_notes.push(refuse_invalid(&replicas, &state).await);
                }
            }
            faults.push(Fault {
                kind,
                start: ms(started),
                back: ms(now()),
            });
        }
        if start.elapsed() >= next_sample {
            let at = ms(now());
            let sluice: Vec<Resources> = blocking(|| replicas.iter().map(resources).collect());
            let redis_keys: u64 = blocking(|| redis.cmd(&["DBSIZE"]));
            rows.push(Row {
                at,
                requests: load.sent(),
                sluice: sluice.try_into().expect("one per replica"),
                redis_keys,
            });
            next_sample += plan.sample_every;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (samples, errors) = load.finish().await;
    let end = ms(now());

    // Both replicas count each other through the heartbeat again after every Redis restart.
    until_every_replica(&replicas, "counted 2 replicas", |s| {
        value(s, "sluice_replicas") == Some(REPLICAS as f64)
    })
    .await;
    // SIGTERM: drain, leases handed back.
    let exits: Vec<ExitStatus> = blocking(|| {
        replicas
            .iter_mut()
            .map(|r| r.terminate(Duration::from_secs(30)))
            .collect()
    });

    let report = Report::new(&plan, &samples, &errors, &faults, &rows, end);
    report.print(&config_notes);
    write_series(&plan, &rows, &faults);
    for (i, status) in exits.iter().enumerate() {
        assert!(
            status.success(),
            "sluice {i} exited with {status} after SIGTERM:\n{}",
            log_tail(&replicas[i])
        );
    }
    report.assert_invariants();
}

/// Writes a changed valid config and waits until both replicas run it.
async fn reload(replicas: &[SluiceProcess], state: &mut ConfigState) -> String {
    let before: Vec<f64> = blocking(|| {
        replicas
            .iter()
            .map(|r| value(&r.metrics(), "ratelimit_service_config_load_success").unwrap_or(0.0))
            .collect()
    });
    let next = if state.fw_limit == FW_LIMITS[0] {
        FW_LIMITS[1]
    } else {
        FW_LIMITS[0]
    };
    let written = now();
    blocking(|| write_config(&state.dir, &config(next, "")));
    let old = state.digest.clone();
    let scrapes = until_every_replica(replicas, "activated the reloaded config", |s| {
        digest(s) != old
    })
    .await;
    let applied = written.elapsed();
    let digests: HashSet<String> = scrapes.iter().map(|s| digest(s)).collect();
    assert_eq!(
        digests.len(),
        1,
        "replicas run different configs: {digests:?}"
    );
    for (scrape, before) in scrapes.iter().zip(before) {
        assert_eq!(
            value(scrape, "ratelimit_service_config_load_success"),
            Some(before + 1.0),
            "one more config activated"
        );
        assert_eq!(value(scrape, "sluice_config_last_load_failed"), Some(0.0));
    }
    state.fw_limit = next;
    state.digest = digests.into_iter().next().expect("a digest");
    format!(
        "reload (fixed window {} → {next}) active on both replicas {:.0} ms after the write",
        if next == FW_LIMITS[0] {
            FW_LIMITS[1]
        } else {
            FW_LIMITS[0]
        },
        applied.as_secs_f64() * 1e3
    )
}

/// Writes an invalid config (`lease` on a fixed window) and waits until both replicas refused
/// it; the last good config must stay active.
async fn refuse_invalid(replicas: &[SluiceProcess], state: &ConfigState) -> String {
    let before: Vec<f64> = blocking(|| {
        replicas
            .iter()
            .map(|r| value(&r.metrics(), "ratelimit_service_config_load_error").unwrap_or(0.0))
            .collect()
    });
    let written = now();
    blocking(|| write_config(&state.dir, &config(state.fw_limit, ", lease: 2")));
    let scrapes = until_every_replica(replicas, "refused the invalid config", |s| {
        value(s, "sluice_config_last_load_failed") == Some(1.0)
    })
    .await;
    let refused = written.elapsed();
    for (scrape, before) in scrapes.iter().zip(before) {
        assert_eq!(
            value(scrape, "ratelimit_service_config_load_error"),
            Some(before + 1.0),
            "one more config refused"
        );
        assert_eq!(digest(scrape), state.digest, "the last good config stays");
    }
    format!(
        "invalid config (lease on a fixed window) refused by both replicas {:.0} ms after the \
         write, the last good one kept",
        refused.as_secs_f64() * 1e3
    )
}

/// The worst key of one rule over one span.
#[derive(Clone, Copy, Debug)]
struct Worst {
    rule: usize,
    value: u32,
    admitted: u64,
    bound: f64,
}

impl Worst {
    fn ratio(&self) -> f64 {
        self.admitted as f64 / self.bound
    }
}

/// Per rule, every key's Redis-decided admissions among samples sent from `from` on, against
/// the rule's bound over that span with `resets` bucket losses: the worst key, and the hottest
/// three values' figures.
fn accuracy(samples: &[Sample], from: u32, resets: u32) -> (f64, Vec<Worst>, Vec<Worst>) {
    let spanned: Vec<&Sample> = samples.iter().filter(|s| s.sent >= from).collect();
    let last = spanned.iter().map(|s| s.replied).max().unwrap_or(from);
    let span_s = f64::from(last - from) / 1e3;
    let mut admitted: Vec<HashMap<u32, u64>> = vec![HashMap::new(); RULES.len()];
    for s in spanned.iter().filter(|s| s.admitted_by_redis()) {
        for rule in s.rules() {
            *admitted[rule].entry(s.value).or_default() += 1;
        }
    }
    let mut worst = Vec::new();
    let mut hottest = Vec::new();
    for (rule, counts) in admitted.iter().enumerate() {
        let bound = RULES[rule].bound(span_s, resets);
        let of = |value: u32| Worst {
            rule,
            value,
            admitted: counts.get(&value).copied().unwrap_or(0),
            bound,
        };
        let top = counts.iter().max_by_key(|(_, n)| **n).map(|(v, _)| *v);
        worst.push(of(top.unwrap_or(0)));
        hottest.extend((0..3).map(of));
    }
    (span_s, worst, hottest)
}

/// What a soak showed.
struct Report<'a> {
    plan: &'a Plan,
    samples: &'a [Sample],
    errors: &'a [CallError],
    faults: &'a [Fault],
    rows: &'a [Row],
    end: u32,
}

impl<'a> Report<'a> {
    fn new(
        plan: &'a Plan,
        samples: &'a [Sample],
        errors: &'a [CallError],
        faults: &'a [Fault],
        rows: &'a [Row],
        end: u32,
    ) -> Report<'a> {
        Report {
            plan,
            samples,
            errors,
            faults,
            rows,
            end,
        }
    }

    fn windows(&self) -> Vec<(u32, u32)> {
        self.faults.iter().filter_map(Fault::window).collect()
    }

    fn in_window(&self, sent: u32, replied: u32) -> bool {
        self.windows()
            .iter()
            .any(|(from, to)| sent <= *to && replied >= *from)
    }

    fn outside(&self) -> impl Iterator<Item = &Sample> {
        let windows = self.windows();
        self.samples
            .iter()
            .filter(move |s| !windows.iter().any(|(f, t)| s.sent <= *t && s.replied >= *f))
    }

    fn restarts(&self) -> u32 {
        self.faults
            .iter()
            .filter(|f| f.kind == FaultKind::RedisRestart)
            .count() as u32
    }

    /// Where the quiet tail starts: the end of the last Redis fault's window.
    fn quiet_from(&self) -> u32 {
        self.windows().iter().map(|(_, to)| *to).max().unwrap_or(0)
    }

    /// The first row at or past the warm-up.
    fn base(&self) -> &Row {
        let warm = self.plan.warm_up.as_millis() as u32;
        self.rows
            .iter()
            .find(|r| r.at >= warm)
            .expect("a sample past the warm-up")
    }

    /// Redis keys the calls sent in the `KEY_SPAN` before `at` may have written.
    fn touched_keys(&self, at: u32) -> usize {
        let from = at.saturating_sub(KEY_SPAN.as_millis() as u32);
        let lo = self.samples.partition_point(|s| s.sent < from);
        let hi = self.samples.partition_point(|s| s.sent <= at);
        let mut keys: HashSet<(usize, u32)> = HashSet::new();
        for s in &self.samples[lo..hi] {
            for rule in s.rules() {
                keys.insert((rule, s.value));
            }
        }
        keys.iter()
            .map(|(rule, _)| RULES[*rule].keys_per_value)
            .sum()
    }

    /// Per fault: calls overlapping it, degraded, failed, and the last degraded or failed
    /// answer after Redis was back (ms after `back`).
    fn fault_figures(&self, fault: &Fault) -> (usize, usize, usize, Option<u32>) {
        let to = fault.window().map_or(fault.back, |(_, to)| to);
        let during: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| s.sent <= to && s.replied >= fault.start)
            .collect();
        let bad = |s: &&&Sample| s.degraded || s.outcome == Outcome::Failed;
        let recovered = during
            .iter()
            .filter(bad)
            .map(|s| s.replied.saturating_sub(fault.back))
            .max();
        (
            during.len(),
            during.iter().filter(|s| s.degraded).count(),
            during
                .iter()
                .filter(|s| s.outcome == Outcome::Failed)
                .count(),
            recovered,
        )
    }

    fn print(&self, config_notes: &[String]) {
        let name = &self.plan.name;
        println!(
            "SOAK {name} series (RSS MiB / open fds / threads / sluice_replicas per replica; \
             Redis DBSIZE; keys touched in the {} s before):",
            KEY_SPAN.as_secs()
        );
        println!(
            "{:>7} {:>9} {:>24} {:>24} {:>8} {:>8}",
            "t s", "requests", "sluice 0", "sluice 1", "keys", "touched"
        );
        // At most about 60 rows printed; the CSV has them all.
        let every = self.rows.len().div_ceil(60).max(1);
        for (i, row) in self.rows.iter().enumerate() {
            if i % every != 0 && i + 1 != self.rows.len() {
                continue;
            }
            let cell = |r: &Resources| {
                format!(
                    "{:.1} / {} / {} / {}",
                    r.rss_kib as f64 / 1024.0,
                    r.fds,
                    r.threads,
                    r.replicas
                )
            };
            println!(
                "{:>7.1} {:>9} {:>24} {:>24} {:>8} {:>8}",
                f64::from(row.at) / 1e3,
                row.requests,
                cell(&row.sluice[0]),
                cell(&row.sluice[1]),
                row.redis_keys,
                self.touched_keys(row.at)
            );
        }
        for fault in self.faults {
            let (calls, degraded, failed, recovered) = self.fault_figures(fault);
            println!(
                "SOAK {name} fault at {:.1} s: {} ({:.1} s until back{}): {calls} calls overlapping \
                 its window, {degraded} degraded, {failed} failed{}",
                f64::from(fault.start) / 1e3,
                fault.kind.name(),
                f64::from(fault.back - fault.start) / 1e3,
                if fault.kind.hits_redis() {
                    format!(" + {} s grace", GRACE.as_secs())
                } else {
                    String::new()
                },
                match (fault.kind.hits_redis(), recovered) {
                    (true, Some(ms)) => format!(
                        "; last degraded or failed answer {:.2} s after Redis was back",
                        f64::from(ms) / 1e3
                    ),
                    (true, None) => "; none after Redis was back".into(),
                    _ => String::new(),
                }
            );
        }
        for note in config_notes {
            println!("SOAK {name} {note}");
        }
        let outside: Vec<&Sample> = self.outside().collect();
        let (whole_span, whole, _) = accuracy(self.samples, 0, self.restarts());
        let (quiet_span, quiet, hottest) = accuracy(self.samples, self.quiet_from(), 0);
        let worst_of = |w: &[Worst]| {
            w.iter()
                .map(|w| {
                    format!(
                        "{} k{} {}/{:.1} = {:.3}",
                        RULES[w.rule].key,
                        w.value,
                        w.admitted,
                        w.bound,
                        w.ratio()
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "SOAK {name}: {:.1} s, {} requests ({:.0}/s), {} degraded ({} outside fault windows, \
             of {} calls there), {} failed ({} outside)",
            f64::from(self.end) / 1e3,
            self.samples.len(),
            self.samples.len() as f64 / (f64::from(self.end) / 1e3),
            self.samples.iter().filter(|s| s.degraded).count(),
            outside.iter().filter(|s| s.degraded).count(),
            outside.len(),
            self.samples
                .iter()
                .filter(|s| s.outcome == Outcome::Failed)
                .count(),
            outside
                .iter()
                .filter(|s| s.outcome == Outcome::Failed)
                .count(),
        );
        println!(
            "SOAK {name} accuracy, worst key per rule (Redis-decided admitted / bound): whole \
             run {whole_span:.1} s with {} restart(s): {}; quiet tail {quiet_span:.1} s: {}; \
             hottest keys in the tail: {}",
            self.restarts(),
            worst_of(&whole),
            worst_of(&quiet),
            worst_of(&hottest),
        );
        let (base, last) = (self.base(), self.rows.last().expect("rows"));
        for i in 0..REPLICAS {
            let peak = self
                .rows
                .iter()
                .map(|r| r.sluice[i].rss_kib)
                .max()
                .unwrap_or(0);
            println!(
                "SOAK {name} sluice {i}: RSS {:.1} MiB at {:.0} s (post-warm-up) → {:.1} MiB at \
                 the end (peak {:.1}); fds {} → {}; threads {} → {}",
                base.sluice[i].rss_kib as f64 / 1024.0,
                f64::from(base.at) / 1e3,
                last.sluice[i].rss_kib as f64 / 1024.0,
                peak as f64 / 1024.0,
                base.sluice[i].fds,
                last.sluice[i].fds,
                base.sluice[i].threads,
                last.sluice[i].threads,
            );
        }
        let shown: Vec<String> = self
            .errors
            .iter()
            .filter(|(sent, replied, _)| !self.in_window(*sent, *replied))
            .take(10)
            .map(|(sent, _, e)| format!("{:.2} s: {e}", f64::from(*sent) / 1e3))
            .collect();
        if !shown.is_empty() {
            println!("SOAK {name} errors outside fault windows: {shown:#?}");
        }
    }

    fn assert_invariants(&self) {
        let name = &self.plan.name;
        let outside: Vec<&Sample> = self.outside().collect();
        let failed_outside = outside
            .iter()
            .filter(|s| s.outcome == Outcome::Failed)
            .count();
        assert_eq!(
            failed_outside, 0,
            "{name}: calls failed outside fault windows"
        );
        let degraded_outside = outside.iter().filter(|s| s.degraded).count();
        // A busy shared machine misses a deadline now and then by itself.
        assert!(
            degraded_outside * 100 <= outside.len(),
            "{name}: {degraded_outside} of {} decisions degraded outside fault windows",
            outside.len()
        );
        for fault in self.faults.iter().filter(|f| f.kind.hits_redis()) {
            let (calls, degraded, failed, _) = self.fault_figures(fault);
            assert!(
                degraded + failed > 0,
                "{name}: the {} at {} ms went unnoticed in {calls} calls",
                fault.kind.name(),
                fault.start
            );
        }
        for (span, from, resets) in [
            ("whole run", 0, self.restarts()),
            ("quiet tail", self.quiet_from(), 0),
        ] {
            let (span_s, worst, _) = accuracy(self.samples, from, resets);
            for w in worst {
                assert!(
                    w.admitted as f64 <= w.bound,
                    "{name}, {span} ({span_s:.1} s): {} k{} admitted {} > bound {:.1}",
                    RULES[w.rule].key,
                    w.value,
                    w.admitted,
                    w.bound
                );
            }
        }
        for (rule, r) in RULES.iter().enumerate() {
            assert!(
                self.samples.iter().any(|s| s.outcome == Outcome::OverLimit
                    && !s.degraded
                    && s.rules().any(|x| x == rule)),
                "{name}: no key of `{}` was pushed past its limit",
                r.key
            );
        }
        let (base, last) = (self.base(), self.rows.last().expect("rows"));
        for i in 0..REPLICAS {
            let (b, e) = (base.sluice[i], last.sluice[i]);
            assert!(
                e.rss_kib as f64 <= 1.5 * b.rss_kib as f64 + 8.0 * 1024.0,
                "{name}: sluice {i}'s RSS grew from {} KiB to {} KiB",
                b.rss_kib,
                e.rss_kib
            );
            assert!(
                e.fds as f64 <= 1.5 * b.fds as f64 + 16.0,
                "{name}: sluice {i}'s open fds grew from {} to {}",
                b.fds,
                e.fds
            );
        }
        for row in self.rows.iter().filter(|r| r.at >= base.at) {
            let touched = self.touched_keys(row.at);
            assert!(
                row.redis_keys as f64 <= 1.5 * touched as f64 + 100.0,
                "{name}: Redis held {} keys at {} ms, more than the {touched} the last {} s \
                 touched explain (keys must expire)",
                row.redis_keys,
                row.at,
                KEY_SPAN.as_secs()
            );
        }
    }
}

/// Writes the series as CSV beside the test's temp files, and plots it for the long variant
/// when a Python with matplotlib is at hand.
fn write_series(plan: &Plan, rows: &[Row], faults: &[Fault]) {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let csv = dir.join(format!("soak-{}.csv", plan.name));
    let mut out = File::create(&csv).expect("create the series CSV");
    let mut header = String::from("t_s,requests");
    for i in 0..REPLICAS {
        header += &format!(",rss{i}_kib,fds{i},threads{i},replicas{i}");
    }
    writeln!(out, "{header},redis_keys").unwrap();
    for row in rows {
        let mut line = format!("{:.1},{}", f64::from(row.at) / 1e3, row.requests);
        for r in &row.sluice {
            line += &format!(",{},{},{},{}", r.rss_kib, r.fds, r.threads, r.replicas);
        }
        writeln!(out, "{line},{}", row.redis_keys).unwrap();
    }
    println!("SOAK {} series written to {}", plan.name, csv.display());
    if !plan.plot {
        return;
    }
    let png = csv.with_extension("png");
    let python = std::env::var("SLUICE_SOAK_PYTHON").unwrap_or_else(|_| "python3".into());
    let marks: Vec<String> = faults
        .iter()
        .map(|f| format!("{:.1}:{}", f64::from(f.start) / 1e3, f.kind.name()))
        .collect();
    let plotted = Command::new(&python)
        .args(["-c", PLOT])
        .arg(&csv)
        .arg(&png)
        .args(&marks)
        .output();
    match plotted {
        Ok(out) if out.status.success() => {
            println!("SOAK {} plot written to {}", plan.name, png.display());
        }
        Ok(out) => println!(
            "SOAK {} not plotted ({python} with matplotlib needed; set SLUICE_SOAK_PYTHON): {}",
            plan.name,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => println!("SOAK {} not plotted: {python}: {e}", plan.name),
    }
}

/// Plots the series CSV (argv 1) to a PNG (argv 2), with the faults (argv 3…, `t:kind`) marked.
const PLOT: &str = r#"
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open(sys.argv[1])))
t = [float(r["t_s"]) for r in rows]
replicas = sorted({k[3:-4] for k in rows[0] if k.startswith("rss")})
fig, ax = plt.subplots(4, 1, sharex=True, figsize=(10, 11))
for i in replicas:
    ax[0].plot(t, [int(r["rss%s_kib" % i]) / 1024 for r in rows], label="sluice %s" % i)
    ax[1].plot(t, [int(r["fds%s" % i]) for r in rows], label="sluice %s" % i)
ax[2].plot(t, [int(r["redis_keys"]) for r in rows], label="Redis DBSIZE")
rate = [0.0] + [(int(b["requests"]) - int(a["requests"])) / max(float(b["t_s"]) - float(a["t_s"]), 1e-9)
                for a, b in zip(rows, rows[1:])]
ax[3].plot(t, rate, label="requests/s")
for a, label in zip(ax, ["RSS (MiB)", "open fds", "Redis keys", "requests/s"]):
    a.set_ylabel(label)
    a.set_ylim(bottom=0)
    a.legend(loc="lower right")
    for mark in sys.argv[3:]:
        at, kind = mark.split(":", 1)
        a.axvline(float(at), color="grey", linestyle=":", linewidth=1)
for mark in sys.argv[3:]:
    at, kind = mark.split(":", 1)
    ax[0].annotate(kind, (float(at), 0), rotation=90, fontsize=7, va="bottom")
ax[3].set_xlabel("seconds")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=90)
"#;
