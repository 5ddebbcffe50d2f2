//! The load itself: N HTTP/2 connections, C calls in flight, closed loop (each worker sends its
//! next call when the last one returns: peak throughput) or open loop at a fixed rate.
//!
//! Open loop avoids coordinated omission: call k is due at `start + k / rate` whether or not the
//! server kept up, and its latency is measured from that intended time. A pacer thread releases
//! one permit per due call (OS sleep, microsecond resolution, instead of tokio's 1 ms timer
//! wheel); workers take permits in order. A call that waits for a free worker waits on the clock,
//! so a stalled server shows up as latency rather than as calls never sent. Calls still due but
//! unsent when the run ends are reported as `backlog`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tonic::transport::{Channel, Endpoint};

use crate::hist::Histogram;
use crate::mix::{Rng, Sampler};
use crate::stats::{CpuSnapshot, CpuUse, NamedPid, RedisProbe, RedisSnapshot, RedisUse};

/// The generator measures wall time; it is not part of the service, whose time is injected.
#[allow(clippy::disallowed_methods)]
pub fn now() -> Instant {
    Instant::now()
}

#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub target: String,
    pub connections: usize,
    /// Calls in flight in total, spread evenly over the connections.
    pub concurrency: usize,
    pub duration: Duration,
    /// Measured calls to send instead of a duration (closed loop only).
    pub requests: Option<u64>,
    pub warmup: Duration,
    /// Calls per second (open loop); `None`: closed loop.
    pub rate: Option<f64>,
    pub timeout: Duration,
    pub pids: Vec<NamedPid>,
    pub redis_url: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Outcomes {
    pub ok: u64,
    pub over_limit: u64,
    /// Other overall codes (UNKNOWN) — a conforming server sends none.
    pub other_code: u64,
    /// Failed calls by gRPC status code name.
    pub errors: BTreeMap<String, u64>,
}

/// One run's figures; also the JSON the generator writes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub target: String,
    /// `closed` or `open`.
    pub mode: String,
    pub connections: usize,
    pub concurrency: usize,
    pub offered_rps: Option<f64>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub mix: serde_json::Value,
    pub completed: u64,
    pub throughput_rps: f64,
    /// Open loop: calls that were due but not yet sent when the run ended.
    pub backlog: u64,
    pub latency: Latency,
    pub outcomes: Outcomes,
    pub cpu: BTreeMap<String, CpuUse>,
    pub redis: Option<RedisUse>,
    /// 1-minute load average at the end: other work on the machine shows here.
    #[serde(default)]
    pub loadavg_1m: Option<f64>,
    /// Share of the last 10 s in which some runnable task waited for a CPU (/proc/pressure/cpu):
    /// above a few percent, other work competed with the benchmark and tails are inflated.
    #[serde(default)]
    pub cpu_pressure_avg10: Option<f64>,
}

/// Per-worker results, merged at the end (no shared state on the hot path).
#[derive(Default)]
struct Tally {
    hist: Histogram,
    outcomes: Outcomes,
}

/// A call's result: the response, a gRPC error, or the client's timeout.
type CallResult =
    Result<Result<tonic::Response<RateLimitResponse>, tonic::Status>, tokio::time::error::Elapsed>;

impl Tally {
    /// One measured call: its latency from the intended send time, and its outcome.
    fn record(&mut self, latency: Duration, result: CallResult) {
        self.hist.record(latency.as_nanos() as u64);
        match result {
            Ok(Ok(response)) => match PbCode::try_from(response.get_ref().overall_code) {
                Ok(PbCode::Ok) => self.outcomes.ok += 1,
                Ok(PbCode::OverLimit) => self.outcomes.over_limit += 1,
                _ => self.outcomes.other_code += 1,
            },
            Ok(Err(status)) => {
                *self
                    .outcomes
                    .errors
                    .entry(format!("{:?}", status.code()))
                    .or_default() += 1
            }
            Err(_) => {
                *self
                    .outcomes
                    .errors
                    .entry("ClientTimeout".into())
                    .or_default() += 1
            }
        }
    }

    fn merge(&mut self, other: &Tally) {
        self.hist.merge(&other.hist);
        let o = &other.outcomes;
        self.outcomes.ok += o.ok;
        self.outcomes.over_limit += o.over_limit;
        self.outcomes.other_code += o.other_code;
        for (code, n) in &o.errors {
            *self.outcomes.errors.entry(code.clone()).or_default() += n;
        }
    }
}

/// What every worker shares: the request mix, the call sequence, the pacing and the clock marks.
#[derive(Clone)]
struct Plan {
    sampler: Arc<Sampler>,
    /// Next call number, over all workers.
    sequence: Arc<AtomicU64>,
    /// Measured calls sent so far (for `requests`).
    measured_sent: Arc<AtomicU64>,
    /// Open loop: one permit per due call, released by the pacer.
    permits: Option<Arc<Semaphore>>,
    rate: Option<f64>,
    limit: Option<u64>,
    timeout: Duration,
    start: Instant,
    measure_from: Instant,
    end: Instant,
}

impl Plan {
    fn new(spec: &LoadSpec, sampler: Arc<Sampler>, start: Instant) -> Plan {
        let measure_from = start + spec.warmup;
        Plan {
            sampler,
            sequence: Arc::new(AtomicU64::new(0)),
            measured_sent: Arc::new(AtomicU64::new(0)),
            permits: spec.rate.map(|_| Arc::new(Semaphore::new(0))),
            rate: spec.rate,
            limit: spec.requests,
            timeout: spec.timeout,
            start,
            measure_from,
            end: measure_from + spec.duration,
        }
    }

    /// The next call's number and intended send time: open loop, when its permit is released
    /// (`None` once the pacer is done); closed loop, now.
    async fn next_call(&self) -> Option<(u64, Instant)> {
        match (&self.permits, self.rate) {
            (Some(p), Some(rate)) => {
                let permit = p.acquire().await.ok()?;
                permit.forget();
                let k = self.sequence.fetch_add(1, Ordering::Relaxed);
                Some((k, self.start + Duration::from_secs_f64(k as f64 / rate)))
            }
            _ => Some((self.sequence.fetch_add(1, Ordering::Relaxed), now())),
        }
    }
}

/// One worker: sends its calls one at a time until the run ends and tallies the measured ones.
async fn worker(w: usize, mut client: RateLimitServiceClient<Channel>, plan: Plan) -> Tally {
    let mut rng = Rng::new(w as u64);
    let mut tally = Tally::default();
    while let Some((seq, intended)) = plan.next_call().await {
        if intended >= plan.end {
            break;
        }
        let measured = intended >= plan.measure_from;
        if measured
            && let Some(n) = plan.limit
            && plan.measured_sent.fetch_add(1, Ordering::Relaxed) >= n
        {
            break;
        }
        let request = plan.sampler.request(&mut rng, seq);
        let result = tokio::time::timeout(plan.timeout, client.should_rate_limit(request)).await;
        let done = now();
        if !measured {
            continue;
        }
        // Closed loop with a duration: a call that returns after the end is not counted.
        if plan.rate.is_none() && plan.limit.is_none() && done > plan.end {
            break;
        }
        tally.record(done.duration_since(intended), result);
    }
    tally
}

/// Snapshots at the start and end of the measured window.
struct Window {
    wall: f64,
    cpu_before: CpuSnapshot,
    cpu_after: CpuSnapshot,
    redis: Option<(RedisSnapshot, RedisSnapshot)>,
}

async fn connect(spec: &LoadSpec) -> Result<Vec<Channel>, String> {
    let uri = if spec.target.contains("://") {
        spec.target.clone()
    } else {
        format!("http://{}", spec.target)
    };
    let mut channels = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections.max(1) {
        // One Endpoint::connect is one TCP connection (HTTP/2); clones of a Channel share it.
        let channel = Endpoint::from_shared(uri.clone())
            .map_err(|e| format!("target {uri}: {e}"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| format!("connect {uri}: {e}"))?;
        channels.push(channel);
    }
    Ok(channels)
}

pub async fn run(spec: &LoadSpec, sampler: Arc<Sampler>) -> Result<Report, String> {
    if spec.concurrency == 0 {
        return Err("--concurrency must be at least 1".into());
    }
    if spec.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err("--rate must be a positive number".into());
    }
    let channels = connect(spec).await?;
    let mut redis = match &spec.redis_url {
        Some(url) => Some(RedisProbe::connect(url).await?),
        None => None,
    };

    let plan = Plan::new(spec, sampler.clone(), now());
    let pacer = match (&plan.permits, spec.rate) {
        (Some(p), Some(rate)) => Some(spawn_pacer(p.clone(), rate, plan.start, plan.end)),
        _ => None,
    };
    let workers = (0..spec.concurrency)
        .map(|w| {
            let client = RateLimitServiceClient::new(channels[w % channels.len()].clone())
                .max_decoding_message_size(16 * 1024 * 1024);
            tokio::spawn(worker(w, client, plan.clone()))
        })
        .collect();
    let (window, tallies) = measure(spec, &plan, redis.as_mut(), workers).await?;
    let backlog = match pacer {
        Some(pacer) => {
            let released = pacer
                .join()
                .map_err(|_| "pacer thread panicked".to_string())?;
            released.saturating_sub(plan.sequence.load(Ordering::Relaxed))
        }
        None => 0,
    };
    let mut total = Tally::default();
    for tally in &tallies {
        total.merge(tally);
    }
    Ok(report(
        spec,
        &sampler,
        channels.len(),
        window,
        total,
        backlog,
    ))
}

/// Waits out the warm-up, snapshots CPU and Redis, lets the workers run (until the end, or
/// until they sent `requests` calls), snapshots again and collects every worker's tally.
async fn measure(
    spec: &LoadSpec,
    plan: &Plan,
    mut redis: Option<&mut RedisProbe>,
    workers: Vec<tokio::task::JoinHandle<Tally>>,
) -> Result<(Window, Vec<Tally>), String> {
    tokio::time::sleep_until(plan.measure_from.into()).await;
    let cpu_before = CpuSnapshot::take(&spec.pids);
    let redis_before = match redis.as_mut() {
        Some(r) => Some(r.snapshot().await?),
        None => None,
    };
    let measured_start = now();

    let mut cpu_after = None;
    let mut redis_after = None;
    let mut measured_end = None;
    let mut joined = Vec::with_capacity(workers.len());
    if spec.requests.is_none() {
        tokio::time::sleep_until(plan.end.into()).await;
        measured_end = Some(now());
        cpu_after = Some(CpuSnapshot::take(&spec.pids));
        if let Some(r) = redis.as_mut() {
            redis_after = Some(r.snapshot().await?);
        }
    }
    for worker in workers {
        joined.push(worker.await.map_err(|e| format!("worker: {e}"))?);
    }
    let measured_end = measured_end.unwrap_or_else(now);
    let cpu_after = cpu_after.unwrap_or_else(|| CpuSnapshot::take(&spec.pids));
    if redis_after.is_none()
        && let Some(r) = redis.as_mut()
    {
        redis_after = Some(r.snapshot().await?);
    }
    let window = Window {
        wall: measured_end.duration_since(measured_start).as_secs_f64(),
        cpu_before,
        cpu_after,
        redis: redis_before.zip(redis_after),
    };
    Ok((window, joined))
}

/// The report of a finished run.
fn report(
    spec: &LoadSpec,
    sampler: &Sampler,
    connections: usize,
    window: Window,
    total: Tally,
    backlog: u64,
) -> Report {
    let wall = window.wall;
    let completed = total.hist.count();
    let us = |ns: u64| ns as f64 / 1_000.0;
    let mut cpu = window.cpu_after.since(&window.cpu_before, wall);
    for use_ in cpu.values_mut() {
        use_.us_per_request = (completed > 0).then(|| use_.seconds * 1e6 / completed as f64);
    }
    Report {
        target: spec.target.clone(),
        mode: if spec.rate.is_some() {
            "open"
        } else {
            "closed"
        }
        .into(),
        connections,
        concurrency: spec.concurrency,
        offered_rps: spec.rate,
        duration_s: wall,
        warmup_s: spec.warmup.as_secs_f64(),
        mix: mix_json(sampler),
        completed,
        throughput_rps: if wall > 0.0 {
            completed as f64 / wall
        } else {
            0.0
        },
        backlog,
        latency: Latency {
            p50_us: us(total.hist.quantile(0.50)),
            p90_us: us(total.hist.quantile(0.90)),
            p99_us: us(total.hist.quantile(0.99)),
            p999_us: us(total.hist.quantile(0.999)),
            max_us: us(total.hist.max()),
            mean_us: total.hist.mean() / 1_000.0,
        },
        outcomes: total.outcomes,
        cpu,
        redis: window
            .redis
            .map(|(before, after)| after.since(&before, completed)),
        loadavg_1m: loadavg_1m(),
        cpu_pressure_avg10: cpu_pressure_avg10(),
    }
}

/// The 1-minute load average (/proc/loadavg).
pub fn loadavg_1m() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
}

/// `some avg10` of /proc/pressure/cpu.
pub fn cpu_pressure_avg10() -> Option<f64> {
    std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|p| {
            p.lines()
                .find(|l| l.starts_with("some"))?
                .split_whitespace()
                .find_map(|f| f.strip_prefix("avg10="))?
                .parse()
                .ok()
        })
}

/// Releases one permit per call as it falls due; returns how many it released.
fn spawn_pacer(
    permits: Arc<Semaphore>,
    rate: f64,
    start: Instant,
    end: Instant,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut released: u64 = 0;
        loop {
            let t = now();
            if t >= end {
                break;
            }
            let due = (t.duration_since(start).as_secs_f64() * rate) as u64 + 1;
            if due > released {
                let add = (due - released).min(Semaphore::MAX_PERMITS as u64 / 2);
                permits.add_permits(add as usize);
                released += add;
            }
            let next = start + Duration::from_secs_f64(released as f64 / rate);
            let wait = next
                .saturating_duration_since(now())
                .min(end.saturating_duration_since(now()));
            // Below ~20 µs a sleep oversleeps anyway; release the next batch on the next pass.
            if wait > Duration::from_micros(20) {
                std::thread::sleep(wait);
            } else {
                std::thread::yield_now();
            }
        }
        permits.close();
        released
    })
}

fn mix_json(sampler: &Sampler) -> serde_json::Value {
    let s = sampler.spec();
    serde_json::json!({
        "domain": s.domain,
        "descriptors_per_request": s.descriptors,
        "keys": s.keys,
        "distribution": s.distribution.to_string(),
        "key_name": s.key_name,
        "value_prefix": s.value_prefix,
        "over_limit_share": s.over_limit_share,
        "over_key_name": s.over_key_name,
        "over_keys": s.over_keys,
    })
}
