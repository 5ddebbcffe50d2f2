//! Smoke tests of the benchmark tools (docs/benchmarks.md): `sluice-bench` drives the no-op
//! server and sluice (memory and Redis backends) for a fraction of a second and writes reports of
//! the documented shape with the outcomes the target must give. No speed is asserted.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use sluice_harness::{RedisServer, SluiceBuilder, SluiceProcess, without_sluice_env};

const BENCH: &str = env!("CARGO_BIN_EXE_sluice-bench");

/// sluice on the bench's own config (`integration/bench/config`), the flags after it.
fn sluice(args: &[&str]) -> SluiceProcess {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    SluiceBuilder::config(&config)
        .args(["--log-level", "warn"])
        .args(args)
        .start()
}

/// The no-op server (`sluice-bench noop`), a child that printed `... grpc=ADDR ...`; SIGTERM then
/// reaped on drop. sluice itself runs under the harness's [`SluiceBuilder`].
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(mut cmd: Command) -> Server {
        without_sluice_env(&mut cmd);
        cmd.stdout(Stdio::piped()).stderr(Stdio::inherit());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .map(str::to_string)
        };
        let addr = field("grpc=").unwrap_or_else(|| panic!("no ready line: {line:?}"));
        Server { child, addr }
    }

    fn noop() -> Server {
        let mut cmd = Command::new(BENCH);
        cmd.args(["noop", "--addr", "127.0.0.1:0"]);
        Server::start(cmd)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn bench(args: &[&str], json: &Path) -> Value {
    let out = Command::new(BENCH)
        .args(args)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run sluice-bench");
    assert!(
        out.status.success(),
        "sluice-bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap()
}

fn load(target: &str, extra: &[&str], json: &Path) -> Value {
    let mut args = vec![
        "load",
        "--target",
        target,
        "--connections",
        "2",
        "--in-flight",
        "2",
        "--duration",
        "300ms",
        "--warmup",
        "100ms",
    ];
    args.extend_from_slice(extra);
    bench(&args, json)
}

fn num(v: &Value, path: &str) -> f64 {
    let mut at = v;
    for part in path.split('.') {
        at = &at[part];
    }
    at.as_f64()
        .unwrap_or_else(|| panic!("{path} is not a number in {v}"))
}

/// Counts, latency order and CPU accounting of a report whose every call succeeded.
fn assert_sane(report: &Value, generator_pid_named: &str) {
    let completed = num(report, "completed");
    assert!(completed > 0.0, "{report}");
    let ok = num(report, "outcomes.ok");
    let over = num(report, "outcomes.over_limit");
    assert_eq!(ok + over, completed, "{report}");
    assert_eq!(
        report["outcomes"]["errors"],
        serde_json::json!({}),
        "{report}"
    );
    let l = |q: &str| num(report, &format!("latency.{q}"));
    assert!(l("p50_us") > 0.0);
    assert!(l("p50_us") <= l("p90_us") && l("p90_us") <= l("p99_us"));
    assert!(l("p99_us") <= l("p999_us") && l("p999_us") <= l("max_us"));
    assert!(num(report, "throughput_rps") > 0.0);
    assert!(
        report["cpu"]["generator"]["seconds"].is_number(),
        "{report}"
    );
    assert!(
        report["cpu"][generator_pid_named]["cores"].is_number(),
        "{report}"
    );
}

#[test]
fn generator_drives_the_noop_server_closed_and_open_loop() {
    let dir = tempfile::tempdir().unwrap();
    let noop = Server::noop();
    let pid = format!("noop={}", noop.pid());

    let closed = load(
        &noop.addr,
        &["--pid", &pid],
        &dir.path().join("closed.json"),
    );
    assert_eq!(closed["mode"], "closed");
    assert_eq!(num(&closed, "concurrency"), 4.0);
    assert_sane(&closed, "noop");
    assert_eq!(num(&closed, "outcomes.over_limit"), 0.0);

    let open = load(
        &noop.addr,
        &["--rate", "500", "--pid", &pid],
        &dir.path().join("open.json"),
    );
    assert_eq!(open["mode"], "open");
    assert_eq!(num(&open, "offered_rps"), 500.0);
    assert_sane(&open, "noop");
    // 0.3 s at 500/s: 150 calls fall due; each is either answered or still queued at the end.
    let due = num(&open, "completed") + num(&open, "backlog");
    assert!((100.0..=200.0).contains(&due), "{open}");
}

#[test]
fn generator_mix_reaches_over_limit_keys_on_sluice_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sluice = sluice(&["--backend", "memory"]);
    let addr = sluice.grpc.to_string();
    let pid = format!("sluice={}", sluice.pid());
    let report = load(
        &addr,
        &[
            "--over-limit-share",
            "0.5",
            "--descriptors",
            "2",
            "--pid",
            &pid,
        ],
        &dir.path().join("mix.json"),
    );
    assert_sane(&report, "sluice");
    // Half the requests name the one over-limit key (1 token an hour): all but its first are
    // rejected; the other half hit ordinary keys with room to spare.
    let completed = num(&report, "completed");
    let over = num(&report, "outcomes.over_limit");
    assert!(over > 0.3 * completed && over < 0.7 * completed, "{report}");
    assert_eq!(report["mix"]["descriptors_per_request"], 2);
}

#[test]
fn generator_counts_redis_commands_and_the_floor_runs() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start();
    let url = redis.url();
    let sluice = sluice(&[
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--redis-timeout",
        "500ms",
        // One script call per request, so the generator's counts have an exact expectation.
        "--redis-max-batch",
        "1",
    ]);
    let addr = sluice.grpc.to_string();
    let pids = [
        format!("sluice={}", sluice.pid()),
        format!("redis={}", redis.pid()),
    ];
    let report = load(
        &addr,
        &["--redis-url", &url, "--pid", &pids[0], "--pid", &pids[1]],
        &dir.path().join("redis.json"),
    );
    assert_sane(&report, "redis");
    // One EVALSHA per request, whose script runs TIME, HMGET, HSET and PEXPIRE; calls in flight
    // at either edge of the measured span count in Redis but not as completed (or the other
    // way round): up to `concurrency` each side, which a slow debug build on a loaded machine
    // makes a visible share of the few requests it completes.
    let edge = 2.0 * num(&report, "concurrency") / num(&report, "completed");
    let scripts = num(&report, "redis.script_calls_per_request");
    assert!((scripts - 1.0).abs() <= 0.05 + edge, "{report}");
    let commands = num(&report, "redis.commands_per_request");
    assert!((commands - 5.0).abs() <= 0.25 + 5.0 * edge, "{report}");

    let floor = bench(
        &[
            "redis-floor",
            "--redis-url",
            &url,
            "--in-flight",
            "8",
            "--pipelines",
            "1,4",
            "--requests",
            "2000",
            "--keys",
            "100",
            "--sockets",
            "1,2",
            "--duration",
            "200ms",
        ],
        &dir.path().join("floor.json"),
    );
    let points = floor["points"].as_array().unwrap();
    assert_eq!(points.len(), 4, "{floor}");
    assert_eq!(points[1]["tool"], "redis-benchmark");
    assert_eq!(
        (num(&points[1], "connections"), num(&points[1], "pipeline")),
        (2.0, 4.0)
    );
    assert_eq!(points[3]["tool"], "redis-rs");
    assert!(
        points.iter().all(|p| num(p, "throughput_rps") > 0.0),
        "{floor}"
    );
    // The floor ran the production script against its own keys.
    let keys: Vec<String> = redis.cmd(&["KEYS", "sluice:{bench|k=v*"]);
    assert!(!keys.is_empty());
}

#[test]
fn sweep_writes_points_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let noop = Server::noop();
    let json = dir.path().join("sweep.json");
    let svg = dir.path().join("sweep.svg");
    let sweep = bench(
        &[
            "sweep",
            "--target",
            &noop.addr,
            "--connections",
            "1",
            "--in-flight",
            "2",
            "--duration",
            "200ms",
            "--warmup",
            "50ms",
            "--fractions",
            "0.5",
            "--label",
            "noop",
            "--svg",
            svg.to_str().unwrap(),
        ],
        &json,
    );
    assert_eq!(sweep["label"], "noop");
    assert_eq!(sweep["peak"]["mode"], "closed");
    let points = sweep["points"].as_array().unwrap();
    assert_eq!(points.len(), 1);
    let half = num(&sweep["peak"], "throughput_rps") * 0.5;
    assert!((num(&points[0], "offered_rps") - half).abs() < 1e-6 * half.max(1.0));
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") && plot.contains("<polyline"),
        "{plot}"
    );

    let combined = dir.path().join("all.svg");
    let status = Command::new(BENCH)
        .args(["plot", "--out", combined.to_str().unwrap()])
        .arg(format!("a={}", json.display()))
        .arg(format!("b={}", json.display()))
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        std::fs::read_to_string(&combined)
            .unwrap()
            .contains(">b</text>")
    );
}

#[test]
fn rlqs_generator_reports_usage_and_counts_assignments_on_sluice_memory() {
    let dir = tempfile::tempdir().unwrap();
    let sluice = sluice(&["--backend", "memory", "--rlqs-push-interval", "100ms"]);
    let (addr, admin) = (sluice.grpc.to_string(), sluice.admin.to_string());
    let pid = format!("sluice={}", sluice.pid());
    let rlqs = |extra: &[&str], name: &str| {
        let mut args = vec![
            "rlqs",
            "--target",
            &addr,
            "--admin",
            &admin,
            "--streams",
            "3",
            "--buckets",
            "4",
            "--per-report",
            "10",
            "--duration",
            "1s",
            "--warmup",
            "500ms",
            "--pid",
            &pid,
        ];
        args.extend_from_slice(extra);
        bench(&args, &dir.path().join(name))
    };

    // 3 streams × 10 reports a second, 4 buckets each, 10 requests per bucket-report.
    let paced = rlqs(&["--interval", "100ms"], "paced.json");
    assert_eq!(paced["stream_errors"], serde_json::json!({}), "{paced}");
    assert_eq!(num(&paced, "subscriptions"), 12.0);
    assert_eq!(num(&paced, "distinct_bucket_ids"), 4.0);
    let reports = num(&paced, "reports_per_s");
    assert!((15.0..=45.0).contains(&reports), "{paced}");
    // Rates of the same window: equal up to floating-point rounding.
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs();
    assert!(
        close(num(&paced, "bucket_reports_per_s"), 4.0 * reports),
        "{paced}"
    );
    assert!(close(num(&paced, "covered_rps"), 40.0 * reports), "{paced}");
    // The config's `tenant` rule has room for every share: each bucket holds a token bucket.
    assert_eq!(num(&paced, "unassigned"), 0.0, "{paced}");
    assert!(
        num(&paced, "assignments_by_kind.token_bucket") > 0.0,
        "{paced}"
    );
    assert!(
        paced["assignments_by_kind"]["deny_all"].is_null(),
        "{paced}"
    );
    // The server counted what the generator sent (the window edges differ by a report or so per
    // stream) and pushed what the generator received.
    let covered = num(&paced, "covered_rps");
    let server_covered = num(&paced, "server.covered_rps");
    assert!(
        server_covered > 0.6 * covered && server_covered < 1.4 * covered,
        "{paced}"
    );
    let assignments = num(&paced, "assignments_per_s");
    assert!(assignments > 0.0, "{paced}");
    let server_assignments = num(&paced, "server.assignments_per_s");
    assert!(
        server_assignments > 0.6 * assignments && server_assignments < 1.4 * assignments,
        "{paced}"
    );
    assert_eq!(num(&paced, "server.ignored"), 0.0, "{paced}");
    assert!(paced["cpu"]["sluice"]["cores"].is_number(), "{paced}");

    // Back to back, each stream with its own bucket ids.
    let flood = rlqs(&["--distinct-buckets"], "flood.json");
    assert_eq!(flood["stream_errors"], serde_json::json!({}), "{flood}");
    assert!(flood["interval_s"].is_null(), "{flood}");
    assert_eq!(num(&flood, "distinct_bucket_ids"), 12.0);
    assert!(num(&flood, "reports_per_s") > reports, "{flood}");
    assert!(num(&flood, "server.covered_rps") > 0.0, "{flood}");
    assert_eq!(num(&flood, "unassigned"), 0.0, "{flood}");
}
