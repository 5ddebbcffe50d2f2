//! What metrics and traces cost: a closed-loop benchmark of the real gRPC server, in-process, on
//! the memory backend, with telemetry off, metrics on (the default), and metrics on plus traces at
//! 100 % sampling exported to an in-process OTLP collector.
//!
//! ```text
//! cargo run --release --example telemetry_cost -- [--seconds 5] [--concurrency 32] [--rounds 3]
//! ```
//!
//! Each mode runs in its own child process (the tracing subscriber is process-wide); the modes
//! take turns for `--rounds` rounds, and the medians are printed last. Besides throughput and
//! latency, each run reports the process CPU time per call (client and server, from
//! `getrusage`): on a shared machine that figure moves much less than the throughput, and the
//! client's share is the same in every mode. Prints figures only; nothing is asserted.

use std::process::Command;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice::clock::Stopwatch;
use sluice::settings::TelemetryArgs;
use sluice::settings::{LogFormat, Settings};
use sluice::telemetry;
use sluice_harness::{otlp, rls};

const CONFIG: &str = "domain: bench\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n    descriptors:\n      - key: route\n        rate_limit: {unit: second, requests_per_unit: 1000000000}\n";
const MODES: [&str; 3] = ["off", "metrics", "traces"];
/// Clients connections the calls are spread over (HTTP/2 multiplexes the rest).
const CONNECTIONS: usize = 4;

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map_or(default, |v| v.parse().expect("a number"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds = arg(&args, "--seconds", 5);
    let concurrency = arg(&args, "--concurrency", 32);
    let rounds = arg(&args, "--rounds", 3);
    if let Some(i) = args.iter().position(|a| a == "--mode") {
        let mode = args[i + 1].clone();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let line = runtime.block_on(run(&mode, seconds, concurrency as usize));
        println!("{line}");
        return;
    }
    println!(
        "telemetry_cost: {seconds} s per mode and round, {rounds} rounds, {concurrency} concurrent ShouldRateLimit calls over {CONNECTIONS} connections, memory backend, 2 descriptors per call"
    );
    println!("{HEADER}");
    let exe = std::env::current_exe().unwrap();
    let mut results: Vec<(&str, Vec<Run>)> = MODES.iter().map(|m| (*m, Vec::new())).collect();
    for _ in 0..rounds {
        for (mode, runs) in &mut results {
            let out = Command::new(&exe)
                .args(["--mode", mode, "--seconds", &seconds.to_string()])
                .args(["--concurrency", &concurrency.to_string()])
                .output()
                .expect("child runs");
            assert!(
                out.status.success(),
                "{mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let run = Run::parse(&line);
            println!("{}", run.row(mode));
            runs.push(run);
        }
    }
    println!("median of {rounds} rounds:");
    println!("{HEADER}");
    for (mode, runs) in &results {
        println!("{}", Run::median(runs).row(mode));
    }
}

const HEADER: &str = "mode          req/s   p50 µs   p99 µs p99.9 µs  CPU µs/call  notes";

/// One child's figures (its stdout line: `rate p50 p99 p999 cpu_per_call|notes`).
#[derive(Clone)]
struct Run {
    figures: [f64; 5],
    notes: String,
}

impl Run {
    fn parse(line: &str) -> Run {
        let (numbers, notes) = line.split_once('|').expect("figures|notes");
        let values: Vec<f64> = numbers
            .split_whitespace()
            .map(|v| v.parse().expect("a figure"))
            .collect();
        Run {
            figures: values.try_into().expect("five figures"),
            notes: notes.to_owned(),
        }
    }

    fn median(runs: &[Run]) -> Run {
        let mut figures = [0.0; 5];
        for (i, figure) in figures.iter_mut().enumerate() {
            let mut column: Vec<f64> = runs.iter().map(|r| r.figures[i]).collect();
            column.sort_by(f64::total_cmp);
            *figure = column[column.len() / 2];
        }
        Run {
            figures,
            notes: runs[0].notes.clone(),
        }
    }

    fn row(&self, mode: &str) -> String {
        let [rate, p50, p99, p999, cpu] = self.figures;
        format!(
            "{mode:<8} {rate:>10.0} {p50:>8.0} {p99:>8.0} {p999:>8.0} {cpu:>12.1}  {}",
            self.notes
        )
    }
}

/// User + system CPU time of this process so far, in µs.
fn cpu_micros() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let micros = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

async fn run(mode: &str, seconds: u64, concurrency: usize) -> String {
    let collector = otlp::Collector::start().await;
    let mut telemetry_args = TelemetryArgs {
        tracing: mode == "traces",
        trace_sampling_ratio: Some(1.0),
        ..TelemetryArgs::default()
    };
    telemetry_args.otlp.traces_endpoint = Some(collector.endpoint());
    let guard = telemetry::init("warn", LogFormat::Text, &telemetry_args);

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bench.yaml"), CONFIG).unwrap();
    let mut settings = Settings::with_config(dir.path());
    settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
    settings.admin_addr = "127.0.0.1:0".parse().unwrap();
    settings.telemetry.metrics = mode != "off";
    let running = sluice::server::start(settings)
        .await
        .expect("server starts");
    let url = format!("http://{}", running.grpc_addr);
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(RateLimitServiceClient::connect(url.clone()).await.unwrap());
    }

    // Warm up (connections, buckets, allocator), then measure.
    let _ = drive(&clients, concurrency, Duration::from_millis(500)).await;
    let measured = Duration::from_secs(seconds);
    let cpu_before = cpu_micros();
    let mut latencies = drive(&clients, concurrency, measured).await;
    let cpu_per_call = (cpu_micros() - cpu_before) / latencies.len() as f64;
    latencies.sort_unstable();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let rate = latencies.len() as f64 / measured.as_secs_f64();

    drop(clients);
    running.shutdown().await.unwrap();
    guard.shutdown().await;
    let notes = match mode {
        "traces" => format!("{} spans exported", collector.spans().len()),
        "metrics" => "Prometheus exporter, per-rule counters".to_owned(),
        _ => "--metrics false, no tracing".to_owned(),
    };
    format!(
        "{rate} {} {} {} {cpu_per_call}|{notes}",
        pct(0.50),
        pct(0.99),
        pct(0.999)
    )
}

/// `concurrency` tasks, each calling in a loop for `length`; every call's latency in µs.
async fn drive(
    clients: &[RateLimitServiceClient<tonic::transport::Channel>],
    concurrency: usize,
    length: Duration,
) -> Vec<u32> {
    let tasks: Vec<_> = (0..concurrency)
        .map(|task| {
            let mut client = clients[task % clients.len()].clone();
            tokio::spawn(async move {
                let started = Stopwatch::start();
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while started.elapsed() < length {
                    let request = RateLimitRequest {
                        domain: "bench".into(),
                        descriptors: vec![
                            rls::desc(&[("client", &format!("c{}", (n * 7 + task as u64) % 1000))]),
                            rls::desc(&[("client", "shared"), ("route", "r")]),
                        ],
                        hits_addend: 0,
                    };
                    let call = Stopwatch::start();
                    client.should_rate_limit(request).await.expect("call");
                    latencies.push(call.elapsed().as_micros().min(u32::MAX as u128) as u32);
                    n += 1;
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}
