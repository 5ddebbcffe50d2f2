//! `sluice-bench`: a load generator for any Envoy RLS endpoint, a no-op RLS server (the gRPC
//! floor), the Redis script floor, and the plots and summary of a benchmark run.
//! `integration/bench/run.sh` drives it; docs/benchmarks.md shows the commands and figures.

mod floor;
mod hist;
mod load;
mod mix;
mod noop;
mod stats;
mod svg;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

use crate::floor::FloorPoint;
use crate::load::{LoadSpec, Report};
use crate::mix::{Distribution, MixSpec, Sampler};
use crate::stats::{NamedPid, RedisProbe};

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    about = "Load generator and floors for Envoy RLS servers"
)]
struct Cli {
    /// Worker threads of the generator's runtime (it shares the machine with the server).
    #[arg(long, global = true, default_value_t = 2)]
    threads: usize,
    /// Keep tokio's LIFO slot (tokio's default scheduling). Without this the runtime is
    /// sluice's own (src/runtime.rs, LIFO slot off), so the no-op server is the floor under the
    /// same scheduling; with it, `noop` is a tonic server on tokio's defaults.
    #[arg(long, global = true)]
    tokio_lifo_slot: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One run: closed loop (peak) or open loop at --rate.
    Load {
        #[command(flatten)]
        load: LoadArgs,
        /// Write the report as JSON here (a summary line always goes to stdout).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// A closed-loop peak, then open-loop runs at --rates or at --fractions of that peak.
    Sweep {
        #[command(flatten)]
        load: LoadArgs,
        /// Offered loads (requests/s), comma-separated; instead of --fractions.
        #[arg(long, value_delimiter = ',')]
        rates: Vec<f64>,
        /// Fractions of the measured peak to offer, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "0.1,0.25,0.5,0.75,0.9,1.0,1.2"
        )]
        fractions: Vec<f64>,
        /// Duration of each open-loop point (default: --duration).
        #[arg(long, value_parser = parse_duration)]
        point_duration: Option<Duration>,
        #[arg(long, default_value = "target")]
        label: String,
        #[arg(long)]
        json: Option<PathBuf>,
        #[arg(long)]
        svg: Option<PathBuf>,
    },
    /// Overlays sweeps in one SVG: `plot --out x.svg noop=a.json sluice=b.json`.
    Plot {
        #[arg(long)]
        out: PathBuf,
        #[arg(
            long,
            default_value = "ShouldRateLimit: throughput and latency vs offered load"
        )]
        title: String,
        /// label=sweep.json
        #[arg(required = true)]
        sweeps: Vec<String>,
    },
    /// A no-op RLS server: answers OK without work. Stops on SIGTERM/SIGINT.
    Noop {
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: SocketAddr,
    },
    /// The Redis floor: the production script with EVALSHA via redis-benchmark (with and without
    /// pipelining) and via redis-rs over 1..N multiplexed sockets.
    RedisFloor {
        #[arg(long)]
        redis_url: String,
        /// Calls in flight (the load generator's connections × concurrency per connection).
        #[arg(long, default_value_t = 512)]
        in_flight: usize,
        /// redis-benchmark -P values (connections = in_flight / P).
        #[arg(long, value_delimiter = ',', default_value = "1,16")]
        pipelines: Vec<usize>,
        #[arg(long, default_value_t = 500_000)]
        requests: u64,
        #[arg(long, default_value_t = 10_000)]
        keys: u64,
        /// redis-rs multiplexed socket counts to try (empty: skip).
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        sockets: Vec<usize>,
        #[arg(long, value_parser = parse_duration, default_value = "5s")]
        duration: Duration,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Prints the summary table and ratios of a run.sh run and writes it as JSON.
    Summary {
        #[arg(long)]
        noop: PathBuf,
        #[arg(long)]
        memory: PathBuf,
        #[arg(long)]
        redis: PathBuf,
        #[arg(long)]
        floor: PathBuf,
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Writes a config with N rules under domain `bench` (key `k`, values v0..v{N-1}), for the
    /// config-size scaling benchmark.
    GenConfig {
        #[arg(long)]
        rules: usize,
        #[arg(long)]
        out: PathBuf,
    },
    /// Prints a free loopback TCP port.
    FreePort,
}

#[derive(Args, Clone)]
struct LoadArgs {
    /// RLS endpoint, host:port or http://host:port.
    #[arg(long, default_value = "127.0.0.1:8081")]
    target: String,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Calls in flight per connection (total in flight = connections × this).
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    /// Send this many measured calls instead of running for --duration (closed loop).
    #[arg(long)]
    requests: Option<u64>,
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    warmup: Duration,
    /// Open loop at this many calls per second; without it, closed loop.
    #[arg(long)]
    rate: Option<f64>,
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    timeout: Duration,
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Descriptors per request.
    #[arg(long, default_value_t = 1)]
    descriptors: usize,
    /// Distinct keys drawn from.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// uniform | zipf | zipf:S | sequential
    #[arg(long, default_value = "zipf:1.0")]
    distribution: Distribution,
    #[arg(long, default_value = "k")]
    key_name: String,
    #[arg(long, default_value = "v")]
    value_prefix: String,
    /// Share of requests aimed at over-limit keys (0..=1).
    #[arg(long, default_value_t = 0.0)]
    over_limit_share: f64,
    #[arg(long, default_value = "over")]
    over_key_name: String,
    #[arg(long, default_value_t = 1)]
    over_keys: u64,
    /// name=pid of a process whose CPU to report (repeatable); the generator is always included.
    #[arg(long = "pid")]
    pids: Vec<NamedPid>,
    /// Redis to read INFO commandstats / cpu from.
    #[arg(long)]
    redis_url: Option<String>,
}

impl LoadArgs {
    fn spec(&self, rate: Option<f64>, duration: Duration) -> LoadSpec {
        LoadSpec {
            target: self.target.clone(),
            connections: self.connections,
            concurrency: self.connections.max(1) * self.in_flight.max(1),
            duration: if self.requests.is_some() && rate.is_none() {
                Duration::from_secs(24 * 3600)
            } else {
                duration
            },
            requests: if rate.is_none() { self.requests } else { None },
            warmup: self.warmup,
            rate,
            timeout: self.timeout,
            pids: self.pids.clone(),
            redis_url: self.redis_url.clone(),
        }
    }

    fn sampler(&self) -> Result<Arc<Sampler>, String> {
        Sampler::new(MixSpec {
            domain: self.domain.clone(),
            descriptors: self.descriptors,
            keys: self.keys,
            distribution: self.distribution.clone(),
            key_name: self.key_name.clone(),
            value_prefix: self.value_prefix.clone(),
            over_limit_share: self.over_limit_share,
            over_key_name: self.over_key_name.clone(),
            over_keys: self.over_keys,
        })
        .map(Arc::new)
    }
}

/// `250ms`, `10s`, `2m`, or a bare number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration"))?;
    if !(v >= 0.0 && v.is_finite()) {
        return Err(format!("`{s}` is not a duration"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

#[derive(Serialize, Deserialize)]
struct SweepFile {
    label: String,
    peak: Report,
    points: Vec<Report>,
}

#[derive(Serialize, Deserialize)]
struct FloorFile {
    in_flight: usize,
    points: Vec<FloorPoint>,
}

fn line(label: &str, r: &Report) -> String {
    let offered = r
        .offered_rps
        .map_or("closed".to_string(), |o| format!("{o:.0}/s"));
    let cpu: Vec<String> = r
        .cpu
        .iter()
        .map(|(n, c)| {
            format!(
                "{n}={:.2}({:.1}us/req)",
                c.cores,
                c.us_per_request.unwrap_or(f64::NAN)
            )
        })
        .collect();
    let redis = r.redis.as_ref().map_or(String::new(), |u| {
        format!(
            " redis_cmds/req={:.2} scripts/req={:.2}",
            u.commands_per_request, u.script_calls_per_request
        )
    });
    format!(
        "{label}: offered={offered} throughput={:.0}/s p50={:.0}us p90={:.0}us p99={:.0}us p99.9={:.0}us ok={} over={} errors={:?} backlog={} cores[{}]{redis} load={:.2} cpu_pressure={:.0}%",
        r.throughput_rps,
        r.latency.p50_us,
        r.latency.p90_us,
        r.latency.p99_us,
        r.latency.p999_us,
        r.outcomes.ok,
        r.outcomes.over_limit,
        r.outcomes.errors,
        r.backlog,
        cpu.join(" "),
        r.loadavg_1m.unwrap_or(f64::NAN),
        r.cpu_pressure_avg10.unwrap_or(f64::NAN)
    )
}

fn write_json<T: Serialize>(path: &PathBuf, value: &T) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &PathBuf) -> Result<T, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

async fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Load { load, json } => {
            let report = load::run(&load.spec(load.rate, load.duration), load.sampler()?).await?;
            println!("{}", line(&load.target, &report));
            if let Some(path) = json {
                write_json(&path, &report)?;
            }
        }
        Command::Sweep {
            load,
            rates,
            fractions,
            point_duration,
            label,
            json,
            svg,
        } => {
            let sampler = load.sampler()?;
            let peak = load::run(&load.spec(None, load.duration), sampler.clone()).await?;
            println!("{}", line(&format!("{label} peak"), &peak));
            let offered: Vec<f64> = if rates.is_empty() {
                fractions.iter().map(|f| f * peak.throughput_rps).collect()
            } else {
                rates
            };
            let mut points = Vec::new();
            for rate in offered.into_iter().filter(|r| *r > 0.0) {
                let spec = load.spec(Some(rate), point_duration.unwrap_or(load.duration));
                let report = load::run(&spec, sampler.clone()).await?;
                println!("{}", line(&label, &report));
                points.push(report);
            }
            let file = SweepFile {
                label,
                peak,
                points,
            };
            if let Some(path) = &svg {
                let series = [svg::Series {
                    label: &file.label,
                    points: &file.points,
                }];
                std::fs::write(path, svg::render(&file.label, &series))
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
            if let Some(path) = json {
                write_json(&path, &file)?;
            }
        }
        Command::Plot { out, title, sweeps } => {
            let mut files = Vec::new();
            for arg in &sweeps {
                let (label, path) = arg
                    .split_once('=')
                    .ok_or_else(|| format!("`{arg}`: expected label=sweep.json"))?;
                files.push((
                    label.to_string(),
                    read_json::<SweepFile>(&PathBuf::from(path))?,
                ));
            }
            let series: Vec<svg::Series<'_>> = files
                .iter()
                .map(|(label, f)| svg::Series {
                    label,
                    points: &f.points,
                })
                .collect();
            std::fs::write(&out, svg::render(&title, &series))
                .map_err(|e| format!("{}: {e}", out.display()))?;
        }
        Command::Noop { addr } => noop::serve(addr).await?,
        Command::RedisFloor {
            redis_url,
            in_flight,
            pipelines,
            requests,
            keys,
            sockets,
            duration,
            json,
        } => {
            let info = redis::IntoConnectionInfo::into_connection_info(redis_url.as_str())
                .map_err(|e| e.to_string())?;
            let (host, port) = match info.addr() {
                redis::ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
                _ => return Err("redis-floor needs a redis://host:port URL".into()),
            };
            let mut probe = RedisProbe::connect(&redis_url).await?;
            let sha = floor::load_script(&mut probe).await?;
            let mut points = Vec::new();
            for p in pipelines {
                let run = floor::RedisBenchmark {
                    host: &host,
                    port,
                    sha: &sha,
                    in_flight,
                    pipeline: p,
                    requests,
                    keys,
                };
                let point = floor::redis_benchmark_measured(&mut probe, &run).await?;
                println!(
                    "redis-benchmark EVALSHA -c {} -P {}: {:.0}/s p50={}ms p99={}ms; CPU per call: redis-benchmark {:.1}us, redis-server {:.1}us",
                    point.connections,
                    point.pipeline,
                    point.throughput_rps,
                    point.p50_ms.unwrap_or(f64::NAN),
                    point.p99_ms.unwrap_or(f64::NAN),
                    point.client_cpu_us_per_call.unwrap_or(f64::NAN),
                    point.redis_cpu_us_per_call.unwrap_or(f64::NAN)
                );
                points.push(point);
            }
            for s in sockets {
                let point = floor::redis_rs(&redis_url, &sha, s, in_flight, duration, keys).await?;
                println!(
                    "redis-rs EVALSHA, {} multiplexed socket(s), {} in flight: {:.0}/s; CPU per call: client {:.1}us, redis-server {:.1}us",
                    point.connections,
                    point.in_flight,
                    point.throughput_rps,
                    point.client_cpu_us_per_call.unwrap_or(f64::NAN),
                    point.redis_cpu_us_per_call.unwrap_or(f64::NAN)
                );
                points.push(point);
            }
            if let Some(path) = json {
                write_json(&path, &FloorFile { in_flight, points })?;
            }
        }
        Command::Summary {
            noop,
            memory,
            redis,
            floor,
            json,
        } => {
            let noop: SweepFile = read_json(&noop)?;
            let memory: SweepFile = read_json(&memory)?;
            let redis: SweepFile = read_json(&redis)?;
            let floor: FloorFile = read_json(&floor)?;
            let summary = summarize(&noop, &memory, &redis, &floor);
            print!("{}", summary.0);
            if let Some(path) = json {
                write_json(&path, &summary.1)?;
            }
        }
        Command::GenConfig { rules, out } => {
            let mut text = String::from(
                "# Generated by `sluice-bench gen-config`: one exact-value rule per value.\ndomain: bench\ndescriptors:\n",
            );
            for i in 0..rules {
                text.push_str(&format!(
                    "  - key: k\n    value: v{i}\n    rate_limit: {{unit: day, requests_per_unit: 1, burst: 1000000000}}\n"
                ));
            }
            std::fs::write(&out, text).map_err(|e| format!("{}: {e}", out.display()))?;
        }
        Command::FreePort => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            println!(
                "{}",
                listener.local_addr().map_err(|e| e.to_string())?.port()
            );
        }
    }
    Ok(())
}

fn floor_name(p: &FloorPoint) -> String {
    if p.tool == "redis-benchmark" {
        format!("redis-benchmark -c {} -P {}", p.connections, p.pipeline)
    } else {
        format!(
            "redis-rs, {} socket(s), {} in flight",
            p.connections, p.in_flight
        )
    }
}

/// The point of a sweep offered closest to `fraction` of its peak.
fn at_fraction(sweep: &SweepFile, fraction: f64) -> Option<&Report> {
    let target = fraction * sweep.peak.throughput_rps;
    sweep.points.iter().min_by(|a, b| {
        let d = |r: &Report| (r.offered_rps.unwrap_or(0.0) - target).abs();
        d(a).total_cmp(&d(b))
    })
}

fn summarize(
    noop: &SweepFile,
    memory: &SweepFile,
    redis: &SweepFile,
    floor: &FloorFile,
) -> (String, serde_json::Value) {
    let mut out = String::new();
    out.push_str(&format!(
        "{:<8} {:>10} {:>9} {:>9} {:>10} {:>13} {:>13} {:>13} {:>13}\n",
        "target",
        "peak req/s",
        "peak p50",
        "peak p99",
        "½peak p99",
        "server CPU",
        "redis CPU",
        "generator CPU",
        "redis cmd/req"
    ));
    let mut rows = serde_json::Map::new();
    for (name, s) in [("noop", noop), ("memory", memory), ("redis", redis)] {
        let half = at_fraction(s, 0.5);
        let server = s
            .peak
            .cpu
            .iter()
            .find(|(n, _)| n.as_str() != "generator" && n.as_str() != "redis")
            .map(|(_, c)| c);
        let redis_cpu = s.peak.cpu.get("redis");
        let generator = s.peak.cpu.get("generator");
        let cmds = s.peak.redis.as_ref().map(|r| r.commands_per_request);
        let cpu = |c: Option<&stats::CpuUse>| {
            c.map_or("-".to_string(), |c| {
                format!("{:.1}us/req", c.us_per_request.unwrap_or(f64::NAN))
            })
        };
        out.push_str(&format!(
            "{:<8} {:>10.0} {:>7.0}us {:>7.0}us {:>8.0}us {:>13} {:>13} {:>13} {:>13}\n",
            name,
            s.peak.throughput_rps,
            s.peak.latency.p50_us,
            s.peak.latency.p99_us,
            half.map_or(f64::NAN, |h| h.latency.p99_us),
            cpu(server),
            cpu(redis_cpu),
            cpu(generator),
            cmds.map_or("-".into(), |c| format!("{c:.2}")),
        ));
        rows.insert(
            name.into(),
            serde_json::json!({
                "peak_rps": s.peak.throughput_rps,
                "peak_p50_us": s.peak.latency.p50_us,
                "peak_p99_us": s.peak.latency.p99_us,
                "half_peak_offered_rps": half.and_then(|h| h.offered_rps),
                "half_peak_p99_us": half.map(|h| h.latency.p99_us),
                "half_peak_p999_us": half.map(|h| h.latency.p999_us),
                "server_cores": server.map(|c| c.cores),
                "server_cpu_us_per_request": server.and_then(|c| c.us_per_request),
                "redis_cores": redis_cpu.map(|c| c.cores),
                "redis_cpu_us_per_request": redis_cpu.and_then(|c| c.us_per_request),
                "generator_cpu_us_per_request": generator.and_then(|c| c.us_per_request),
                "redis_commands_per_request": cmds,
                "redis_script_calls_per_request": s.peak.redis.as_ref().map(|r| r.script_calls_per_request),
            }),
        );
    }
    for p in &floor.points {
        out.push_str(&format!(
            "floor    {:>10.0}   {} (CPU/call: client {:.1}us, redis {:.1}us)\n",
            p.throughput_rps,
            floor_name(p),
            p.client_cpu_us_per_call.unwrap_or(f64::NAN),
            p.redis_cpu_us_per_call.unwrap_or(f64::NAN)
        ));
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let mut ratios = serde_json::Map::new();
    let mut add = |name: String, value: f64, target: Option<f64>| {
        let verdict = match target {
            Some(t) if value >= t => format!("(target ≥ {t}: met)"),
            Some(t) => format!("(target ≥ {t}: NOT met)"),
            None => String::new(),
        };
        out.push_str(&format!("{name:<44} {value:>6.3} {verdict}\n"));
        ratios.insert(name, serde_json::json!({"value": value, "target": target}));
    };
    add(
        "memory / noop (peak throughput)".into(),
        ratio(memory.peak.throughput_rps, noop.peak.throughput_rps),
        Some(0.85),
    );
    let server_us = |s: &SweepFile| {
        s.peak
            .cpu
            .iter()
            .find(|(n, _)| n.as_str() != "generator" && n.as_str() != "redis")
            .and_then(|(_, c)| c.us_per_request)
            .unwrap_or(f64::NAN)
    };
    add(
        "noop / memory (server CPU per request)".into(),
        ratio(server_us(noop), server_us(memory)),
        None,
    );
    add(
        "noop / redis (server CPU per request)".into(),
        ratio(server_us(noop), server_us(redis)),
        None,
    );
    add(
        "redis / noop (peak throughput)".into(),
        ratio(redis.peak.throughput_rps, noop.peak.throughput_rps),
        Some(0.4),
    );
    for p in &floor.points {
        let target = (p.tool == "redis-benchmark").then_some(0.7);
        add(
            format!("redis / {}", floor_name(p)),
            ratio(redis.peak.throughput_rps, p.throughput_rps),
            target,
        );
    }
    for (name, s, bound) in [("memory", memory, 1_000.0), ("redis", redis, 2_000.0)] {
        if let Some(h) = at_fraction(s, 0.5) {
            out.push_str(&format!(
                "{name} p99 at ½ peak ({:.0}/s offered): {:.0} us (target ≤ {bound:.0} us: {})\n",
                h.offered_rps.unwrap_or(0.0),
                h.latency.p99_us,
                if h.latency.p99_us <= bound {
                    "met"
                } else {
                    "NOT met"
                }
            ));
        }
    }
    (
        out,
        serde_json::json!({"targets": rows, "ratios": ratios, "floor": floor.points}),
    )
}

// sluice's allocator (src/main.rs), so the no-op server's floor is measured on the same one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = Cli::parse();
    let runtime = sluice::runtime::build_with(
        std::num::NonZeroUsize::new(cli.threads.max(1)),
        !cli.tokio_lifo_slot,
    )
    .expect("tokio runtime");
    if let Err(e) = runtime.block_on(run(cli.command)) {
        eprintln!("sluice-bench: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("x").is_err());
    }
}
