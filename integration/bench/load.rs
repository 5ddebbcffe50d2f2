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

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;
use tonic::transport::{Channel, Endpoint};

use crate::hist::Histogram;
use crate::mix::{Rng, Sampler};
use crate::stats::{CpuSnapshot, CpuUse, NamedPid, RedisProbe, RedisUse};

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

    let start = now();
    let measure_from = start + spec.warmup;
    let end = measure_from + spec.duration;
    let sequence = Arc::new(AtomicU64::new(0));
    let measured_sent = Arc::new(AtomicU64::new(0));
    let permits = spec.rate.map(|_| Arc::new(Semaphore::new(0)));
    let pacer = match (&permits, spec.rate) {
        (Some(p), Some(rate)) => Some(spawn_pacer(p.clone(), rate, start, end)),
        _ => None,
    };

    let mut workers = Vec::with_capacity(spec.concurrency);
    for w in 0..spec.concurrency {
        let mut client = RateLimitServiceClient::new(channels[w % channels.len()].clone())
            .max_decoding_message_size(16 * 1024 * 1024);
        let sampler = sampler.clone();
        let sequence = sequence.clone();
        let measured_sent = measured_sent.clone();
        let permits = permits.clone();
        let rate = spec.rate;
        let limit = spec.requests;
        let timeout = spec.timeout;
        workers.push(tokio::spawn(async move {
            let mut rng = Rng::new(w as u64);
            let mut tally = Tally::default();
            loop {
                let (seq, intended) = match (&permits, rate) {
                    (Some(p), Some(rate)) => {
                        let Ok(permit) = p.acquire().await else { break };
                        permit.forget();
                        let k = sequence.fetch_add(1, Ordering::Relaxed);
                        (k, start + Duration::from_secs_f64(k as f64 / rate))
                    }
                    _ => (sequence.fetch_add(1, Ordering::Relaxed), now()),
                };
                if intended >= end {
                    break;
                }
                let measured = intended >= measure_from;
                if measured
                    && let Some(n) = limit
                    && measured_sent.fetch_add(1, Ordering::Relaxed) >= n
                {
                    break;
                }
                let request = sampler.request(&mut rng, seq);
                let result = tokio::time::timeout(timeout, client.should_rate_limit(request)).await;
                let done = now();
                if !measured {
                    continue;
                }
                // Closed loop with a duration: a call that returns after the end is not counted.
                if rate.is_none() && limit.is_none() && done > end {
                    break;
                }
                tally
                    .hist
                    .record(done.duration_since(intended).as_nanos() as u64);
                match result {
                    Ok(Ok(response)) => match PbCode::try_from(response.get_ref().overall_code) {
                        Ok(PbCode::Ok) => tally.outcomes.ok += 1,
                        Ok(PbCode::OverLimit) => tally.outcomes.over_limit += 1,
                        _ => tally.outcomes.other_code += 1,
                    },
                    Ok(Err(status)) => {
                        *tally
                            .outcomes
                            .errors
                            .entry(format!("{:?}", status.code()))
                            .or_default() += 1
                    }
                    Err(_) => {
                        *tally
                            .outcomes
                            .errors
                            .entry("ClientTimeout".into())
                            .or_default() += 1
                    }
                }
            }
            tally
        }));
    }

    // Snapshots at the start and end of the measured window.
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_before = CpuSnapshot::take(&spec.pids);
    let redis_before = match redis.as_mut() {
        Some(r) => Some(r.snapshot().await?),
        None => None,
    };
    let measured_start = now();

    let mut total = Tally::default();
    let mut cpu_after = None;
    let mut redis_after = None;
    let mut measured_end = None;
    let mut joined = Vec::with_capacity(workers.len());
    if spec.requests.is_none() {
        tokio::time::sleep_until(end.into()).await;
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
    let backlog = match pacer {
        Some(pacer) => {
            let released = pacer
                .join()
                .map_err(|_| "pacer thread panicked".to_string())?;
            released.saturating_sub(sequence.load(Ordering::Relaxed))
        }
        None => 0,
    };
    for tally in &joined {
        total.hist.merge(&tally.hist);
        let o = &tally.outcomes;
        total.outcomes.ok += o.ok;
        total.outcomes.over_limit += o.over_limit;
        total.outcomes.other_code += o.other_code;
        for (code, n) in &o.errors {
            *total.outcomes.errors.entry(code.clone()).or_default() += n;
        }
    }

    let wall = measured_end.duration_since(measured_start).as_secs_f64();
    let completed = total.hist.count();
    let us = |ns: u64| ns as f64 / 1_000.0;
    let mut cpu = cpu_after.since(&cpu_before, wall);
    for use_ in cpu.values_mut() {
        use_.us_per_request = (completed > 0).then(|| use_.seconds * 1e6 / completed as f64);
    }
    Ok(Report {
        target: spec.target.clone(),
        mode: if spec.rate.is_some() {
            "open"
        } else {
            "closed"
        }
        .into(),
        connections: channels.len(),
        concurrency: spec.concurrency,
        offered_rps: spec.rate,
        duration_s: wall,
        warmup_s: spec.warmup.as_secs_f64(),
        mix: mix_json(&sampler),
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
        redis: redis_before
            .zip(redis_after)
            .map(|(before, after)| after.since(&before, completed)),
        loadavg_1m: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok()),
        cpu_pressure_avg10: std::fs::read_to_string("/proc/pressure/cpu")
            .ok()
            .and_then(|p| {
                p.lines()
                    .find(|l| l.starts_with("some"))?
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix("avg10="))?
                    .parse()
                    .ok()
            }),
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
