//! `sluice-bench`: a load generator for any Envoy RLS endpoint, a no-op RLS server (the gRPC
//! floor), the Redis script floor, and the plots and summary of a benchmark run.
//! `integration/bench/run.sh` drives it; docs/benchmarks.md shows the commands and figures.

mod floor;
mod hist;
mod load;
mod mix;
mod noop;
mod rlqs;
mod stats;
mod summary;
mod svg;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

use crate::load::{LoadSpec, Report};
use crate::mix::{Distribution, MixSpec, Sampler};
use crate::stats::{NamedPid, RedisProbe};
use crate::summary::{FloorFile, SweepFile};

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
    /// multi-threaded with the LIFO slot off (src/runtime.rs's `build_with`); with it, `noop` is a
    /// tonic server on tokio's defaults (envoy.sh's no-op reference).
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
    Sweep(SweepArgs),
    /// Load on an RLQS server (StreamRateLimitQuotas): streams of usage reports, assignments
    /// counted.
    Rlqs(RlqsArgs),
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
    RedisFloor(FloorArgs),
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

// The options of `sweep` (the subcommand's help is the variant's doc comment).
#[derive(Args)]
struct SweepArgs {
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
}

// The options of `redis-floor`.
#[derive(Args)]
struct FloorArgs {
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
}

// The options of `rlqs`.
#[derive(Args)]
struct RlqsArgs {
    /// RLQS endpoint, host:port or http://host:port.
    #[arg(long, default_value = "127.0.0.1:8081")]
    target: String,
    /// Streams: one per data plane.
    #[arg(long, default_value_t = 16)]
    streams: usize,
    /// HTTP/2 connections the streams share (default: one per stream, as separate proxies).
    #[arg(long)]
    connections: Option<usize>,
    /// Bucket ids each stream reports (`<key-name>=<value-prefix><n>`), all in every report.
    #[arg(long, default_value_t = 100)]
    buckets: usize,
    /// Give each stream its own bucket ids (streams × buckets storage keys); by default every
    /// stream reports the same ones, as replicas of one proxy fleet do.
    #[arg(long)]
    distinct_buckets: bool,
    /// Report every this often per stream (Envoy: `reporting_interval`); without it, back to back
    /// as fast as the server takes them.
    #[arg(long, value_parser = parse_duration)]
    interval: Option<Duration>,
    /// Requests each bucket's report covers (num_requests_allowed + num_requests_denied).
    #[arg(long, default_value_t = 1000)]
    per_report: u64,
    /// Share of those reported denied (0..=1).
    #[arg(long, default_value_t = 0.0)]
    denied_share: f64,
    #[arg(long, default_value = "bench")]
    domain: String,
    #[arg(long, default_value = "tenant")]
    key_name: String,
    #[arg(long, default_value = "t")]
    value_prefix: String,
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    duration: Duration,
    /// Before measuring: the first reports subscribe, the first pushes assign.
    #[arg(long, value_parser = parse_duration, default_value = "3s")]
    warmup: Duration,
    /// name=pid of a process whose CPU to report (repeatable); the generator is always included.
    #[arg(long = "pid")]
    pids: Vec<NamedPid>,
    /// Redis to read INFO commandstats / cpu from.
    #[arg(long)]
    redis_url: Option<String>,
    /// host:port of sluice's admin listener: its sluice_rlqs_* counters are read around the
    /// measured window.
    #[arg(long)]
    admin: Option<String>,
    #[arg(long, default_value = "rlqs")]
    label: String,
    /// Write the report as JSON here (a summary line always goes to stdout).
    #[arg(long)]
    json: Option<PathBuf>,
}

impl RlqsArgs {
    fn spec(self) -> rlqs::RlqsSpec {
        rlqs::RlqsSpec {
            target: self.target,
            streams: self.streams,
            connections: self.connections.unwrap_or(self.streams),
            buckets: self.buckets,
            distinct_buckets: self.distinct_buckets,
            interval: self.interval,
            per_report: self.per_report,
            denied_share: self.denied_share,
            domain: self.domain,
            key_name: self.key_name,
            value_prefix: self.value_prefix,
            duration: self.duration,
            warmup: self.warmup,
            pids: self.pids,
            redis_url: self.redis_url,
            admin: self.admin,
        }
    }
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
        Command::Load { load, json } => load_once(&load, json).await,
        Command::Sweep(args) => sweep(args).await,
        Command::Rlqs(mut args) => {
            let (label, json) = (std::mem::take(&mut args.label), args.json.take());
            let report = rlqs::run(args.spec()).await?;
            println!("{}", rlqs::line(&label, &report));
            if let Some(path) = json {
                write_json(&path, &report)?;
            }
            Ok(())
        }
        Command::Plot { out, title, sweeps } => plot(&out, &title, &sweeps),
        Command::Noop { addr } => noop::serve(addr).await,
        Command::RedisFloor(args) => redis_floor(args).await,
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
            let summary = summary::summarize(&noop, &memory, &redis, &floor);
            print!("{}", summary.0);
            if let Some(path) = json {
                write_json(&path, &summary.1)?;
            }
            Ok(())
        }
        Command::GenConfig { rules, out } => gen_config(rules, &out),
        Command::FreePort => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            println!(
                "{}",
                listener.local_addr().map_err(|e| e.to_string())?.port()
            );
            Ok(())
        }
    }
}

/// `load`: one run, its summary line, and the report as JSON.
async fn load_once(load: &LoadArgs, json: Option<PathBuf>) -> Result<(), String> {
    let report = load::run(&load.spec(load.rate, load.duration), load.sampler()?).await?;
    println!("{}", line(&load.target, &report));
    if let Some(path) = json {
        write_json(&path, &report)?;
    }
    Ok(())
}

/// `sweep`: the closed-loop peak, then one open-loop run per offered rate.
async fn sweep(args: SweepArgs) -> Result<(), String> {
    let SweepArgs {
        load,
        rates,
        fractions,
        point_duration,
        label,
        json,
        svg,
    } = args;
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
    Ok(())
}

/// `plot`: sweeps given as `label=sweep.json`, overlaid in one SVG.
fn plot(out: &PathBuf, title: &str, sweeps: &[String]) -> Result<(), String> {
    let mut files = Vec::new();
    for arg in sweeps {
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
    std::fs::write(out, svg::render(title, &series)).map_err(|e| format!("{}: {e}", out.display()))
}

/// `redis-floor`: the script through redis-benchmark at each pipeline depth, then through
/// redis-rs at each socket count.
async fn redis_floor(args: FloorArgs) -> Result<(), String> {
    let info = redis::IntoConnectionInfo::into_connection_info(args.redis_url.as_str())
        .map_err(|e| e.to_string())?;
    let (host, port) = match info.addr() {
        redis::ConnectionAddr::Tcp(h, p) => (h.clone(), *p),
        _ => return Err("redis-floor needs a redis://host:port URL".into()),
    };
    let mut probe = RedisProbe::connect(&args.redis_url).await?;
    let sha = floor::load_script(&mut probe).await?;
    let mut points = Vec::new();
    for &pipeline in &args.pipelines {
        let run = floor::RedisBenchmark {
            host: &host,
            port,
            sha: &sha,
            in_flight: args.in_flight,
            pipeline,
            requests: args.requests,
            keys: args.keys,
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
    for &sockets in &args.sockets {
        let point = floor::redis_rs(
            &args.redis_url,
            &sha,
            sockets,
            args.in_flight,
            args.duration,
            args.keys,
        )
        .await?;
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
    if let Some(path) = args.json {
        let in_flight = args.in_flight;
        write_json(&path, &FloorFile { in_flight, points })?;
    }
    Ok(())
}

/// `gen-config`: `rules` exact-value rules under domain `bench`.
fn gen_config(rules: usize, out: &PathBuf) -> Result<(), String> {
    let mut text = String::from(
        "# Generated by `sluice-bench gen-config`: one exact-value rule per value.\ndomain: bench\ndescriptors:\n",
    );
    for i in 0..rules {
        text.push_str(&format!(
            "  - key: k\n    value: v{i}\n    rate_limit: {{unit: day, requests_per_unit: 1, burst: 1000000000}}\n"
        ));
    }
    std::fs::write(out, text).map_err(|e| format!("{}: {e}", out.display()))
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
