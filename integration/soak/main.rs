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
//! (failovers under load are `integration/chaos/`'s and `integration/scale.rs`'s).
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
//!
//! This file: the rules, the replicas, the fault schedule and the run; [`load`] the load and its
//! samples; [`report`] the figures, the series and the assertions on them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use sluice_harness::{RedisServer, SluiceBuilder, SluiceProcess};

mod load;
mod report;

use load::{Load, Zipf};
use report::{Report, write_series};

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
    /// The run's first line: the plan and the load's seed.
    fn announce(&self, seed: u64) {
        println!(
            "SOAK {}: {:.0} s, a fault every {:.0} s, a sample every {:.0} s, warm-up {:.0} s, seed {seed}",
            self.name,
            self.duration.as_secs_f64(),
            self.fault_every.as_secs_f64(),
            self.sample_every.as_secs_f64(),
            self.warm_up.as_secs_f64(),
        );
    }

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
    plan.announce(seed);
    let mut redis = blocking(RedisServer::start);
    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, mut state) = start_replicas(dir.path(), &redis).await;
    let mut clients = Vec::new();
    for r in &replicas {
        clients.push(r.client().await);
    }

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
            if let Some(note) = inject(kind, &mut redis, &replicas, &mut state).await {
                config_notes.push(note);
            }
            faults.push(Fault {
                kind,
                start: ms(started),
                back: ms(now()),
            });
        }
        if start.elapsed() >= next_sample {
            rows.push(sample(ms(now()), &load, &replicas, &redis));
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

/// The replicas on `redis`, their config directory in `dir` with the first config written, once
/// every one has loaded it; the config state the soak starts from.
async fn start_replicas(dir: &Path, redis: &RedisServer) -> (Vec<SluiceProcess>, ConfigState) {
    let config_dir = dir.join("config");
    std::fs::create_dir(&config_dir).unwrap();
    write_config(&config_dir, &config(FW_LIMITS[0], ""));
    let replicas: Vec<SluiceProcess> = blocking(|| {
        (0..REPLICAS)
            .map(|_| replica(&config_dir, &redis.url()))
            .collect()
    });
    let initial = until_every_replica(&replicas, "loaded the config", |s| {
        value(s, "ratelimit_service_config_load_success") == Some(1.0)
    })
    .await;
    let state = ConfigState {
        dir: config_dir.clone(),
        fw_limit: FW_LIMITS[0],
        digest: digest(&initial[0]),
    };
    (replicas, state)
}

/// One fault of kind `kind`, over when this returns; a config fault's note for the report.
async fn inject(
    kind: FaultKind,
    redis: &mut RedisServer,
    replicas: &[SluiceProcess],
    state: &mut ConfigState,
) -> Option<String> {
    match kind {
        FaultKind::RedisRestart => {
            blocking(|| redis.kill());
            tokio::time::sleep(RESTART_DOWN).await;
            blocking(|| redis.start_again());
            None
        }
        FaultKind::RedisPause => {
            blocking(|| redis.pause());
            tokio::time::sleep(PAUSE).await;
            blocking(|| redis.resume());
            None
        }
        FaultKind::Reload => Some(reload(replicas, state).await),
        FaultKind::InvalidConfig => Some(refuse_invalid(replicas, state).await),
    }
}

/// The row of the sample taken `at` ms into the run: requests sent so far, each replica's
/// resources, Redis's key count.
fn sample(at: u32, load: &Load, replicas: &[SluiceProcess], redis: &RedisServer) -> Row {
    let sluice: Vec<Resources> = blocking(|| replicas.iter().map(resources).collect());
    let redis_keys: u64 = blocking(|| redis.cmd(&["DBSIZE"]));
    Row {
        at,
        requests: load.sent(),
        sluice: sluice.try_into().expect("one per replica"),
        redis_keys,
    }
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
