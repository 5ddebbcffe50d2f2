//! The Redis floor: the production script (`lua/limit.lua`) run by `redis-benchmark` with
//! EVALSHA, the ARGV shape `engine/src/backend/redis/script.rs` builds (one key, `""` for Redis's clock,
//! no expiry jitter, then the token bucket's algorithm code, capacity, requests_per_unit, unit_ms,
//! tokens, flags), at a given number of calls in flight;
//! and the same through redis-rs multiplexed connections (the client sluice uses), to choose the
//! number of sockets.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::load::now;
use crate::stats::RedisProbe;

pub const SCRIPT: &str = include_str!("../../lua/limit.lua");

/// The bucket the floor uses: the bench config's ordinary rule (capacity 1e9, 1 token a day),
/// so a key stays live (written) and never runs out during a run: jitter 0, then algorithm 1
/// (token bucket), capacity, requests_per_unit, unit_ms, tokens, flags.
pub const BUCKET_ARGS: [&str; 7] = ["0", "1", "1000000000", "1", "86400000", "1", "0"];

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FloorPoint {
    /// `redis-benchmark` or `redis-rs`.
    pub tool: String,
    /// redis-benchmark: connections (-c); redis-rs: multiplexed sockets.
    pub connections: usize,
    /// Commands per connection sent before reading replies (-P); redis-rs: calls in flight in
    /// total.
    pub pipeline: usize,
    pub in_flight: usize,
    pub throughput_rps: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// CPU of the client (redis-benchmark, or this process for redis-rs) per call, µs.
    #[serde(default)]
    pub client_cpu_us_per_call: Option<f64>,
    /// CPU of redis-server per call (INFO cpu), µs: the script's own cost.
    #[serde(default)]
    pub redis_cpu_us_per_call: Option<f64>,
}

/// CPU seconds of this process's reaped children (cutime + cstime in /proc/self/stat).
fn children_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let cutime: f64 = fields.get(13)?.parse().ok()?;
    let cstime: f64 = fields.get(14)?.parse().ok()?;
    Some((cutime + cstime) / 100.0)
}

/// Fills in the CPU per call of a floor point from readings before and after it.
pub fn with_cpu(
    mut point: FloorPoint,
    calls: f64,
    client_seconds: Option<f64>,
    redis_seconds: f64,
) -> FloorPoint {
    if calls > 0.0 {
        point.client_cpu_us_per_call = client_seconds.map(|s| s * 1e6 / calls);
        point.redis_cpu_us_per_call = Some(redis_seconds * 1e6 / calls);
    }
    point
}

/// [`redis_benchmark`] with the CPU of redis-benchmark and of Redis per call.
pub async fn redis_benchmark_measured(
    probe: &mut RedisProbe,
    run: &RedisBenchmark<'_>,
) -> Result<FloorPoint, String> {
    let redis_before = probe.snapshot().await?;
    let children_before = children_cpu_seconds();
    let point = redis_benchmark(run)?;
    let client = children_cpu_seconds()
        .zip(children_before)
        .map(|(a, b)| a - b);
    let redis = probe.snapshot().await?.since(&redis_before, run.requests);
    Ok(with_cpu(
        point,
        run.requests as f64,
        client,
        redis.cpu_seconds,
    ))
}

/// Loads the script and returns its SHA, after one call with the floor's arguments has answered
/// a verdict: `redis-benchmark` does not look at replies, so an ARGV shape the script refuses
/// would measure error replies instead of decisions.
pub async fn load_script(probe: &mut RedisProbe) -> Result<String, String> {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(SCRIPT);
    let sha: String = probe.query(&cmd).await?;
    let mut check = redis::cmd("EVALSHA");
    check
        .arg(&sha)
        .arg(1)
        .arg("sluice:{bench|floor-check}")
        .arg("");
    for a in BUCKET_ARGS {
        check.arg(a);
    }
    let verdict: Vec<i64> = probe
        .query(&check)
        .await
        .map_err(|e| format!("the floor's script call is refused: {e}"))?;
    // Five integers of one key's verdict, then the count of repaired keys (none here).
    if verdict.len() != 6 || verdict[0] != 1 {
        return Err(format!(
            "the floor's script call answered {verdict:?}, expected an allowed verdict"
        ));
    }
    Ok(sha)
}

/// One `redis-benchmark` run of the script.
pub struct RedisBenchmark<'a> {
    pub host: &'a str,
    pub port: u16,
    pub sha: &'a str,
    /// Calls in flight, spread as `in_flight / pipeline` connections.
    pub in_flight: usize,
    pub pipeline: usize,
    pub requests: u64,
    pub keys: u64,
}

/// Runs `redis-benchmark` once.
pub fn redis_benchmark(run: &RedisBenchmark<'_>) -> Result<FloorPoint, String> {
    let RedisBenchmark {
        host,
        port,
        sha,
        in_flight,
        pipeline,
        requests,
        keys,
    } = *run;
    let clients = (in_flight / pipeline.max(1)).max(1);
    let output = std::process::Command::new("redis-benchmark")
        .args(["-h", host, "-p", &port.to_string()])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .args([
            "-n",
            &requests.to_string(),
            "-r",
            &keys.to_string(),
            "--csv",
        ])
        .args(["EVALSHA", sha, "1", "sluice:{bench|k=v__rand_int__}", ""])
        .args(BUCKET_ARGS)
        .output()
        .map_err(|e| format!("redis-benchmark: {e} (Debian package redis-tools)"))?;
    if !output.status.success() {
        return Err(format!(
            "redis-benchmark failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let (rps, p50, p99) =
        parse_csv(&text).ok_or_else(|| format!("cannot read redis-benchmark output:\n{text}"))?;
    Ok(FloorPoint {
        tool: "redis-benchmark".into(),
        connections: clients,
        pipeline,
        in_flight: clients * pipeline,
        throughput_rps: rps,
        p50_ms: Some(p50),
        p99_ms: Some(p99),
        client_cpu_us_per_call: None,
        redis_cpu_us_per_call: None,
    })
}

/// `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
/// "p99_latency_ms","max_latency_ms"` then one row: rps, p50, p99.
pub fn parse_csv(text: &str) -> Option<(f64, f64, f64)> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = split_csv(lines.next()?);
    let row: Vec<String> = split_csv(lines.next()?);
    let col = |name: &str| -> Option<f64> {
        let i = header.iter().position(|h| h == name)?;
        row.get(i)?.parse().ok()
    };
    Some((col("rps")?, col("p50_latency_ms")?, col("p99_latency_ms")?))
}

fn split_csv(line: &str) -> Vec<String> {
    // redis-benchmark quotes every field and never embeds a quote in one.
    line.split("\",\"")
        .map(|f| f.trim().trim_matches('"').to_string())
        .collect()
}

/// EVALSHA at `in_flight` calls spread over `sockets` redis-rs multiplexed connections, closed
/// loop for `duration`: what one sluice process could get from Redis with that many sockets.
pub async fn redis_rs(
    url: &str,
    sha: &str,
    sockets: usize,
    in_flight: usize,
    duration: Duration,
    keys: u64,
) -> Result<FloorPoint, String> {
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let mut conns = Vec::new();
    for _ in 0..sockets.max(1) {
        conns.push(
            client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sha: Arc<str> = sha.into();
    let mut tasks = Vec::new();
    for w in 0..in_flight.max(1) {
        let mut conn = conns[w % conns.len()].clone();
        let stop = stop.clone();
        let sha = sha.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = crate::mix::Rng::new(w as u64);
            let mut done = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(&*sha)
                    .arg(1)
                    .arg(format!("sluice:{{bench|k=v{}}}", rng.below(keys)))
                    .arg("");
                for a in BUCKET_ARGS {
                    cmd.arg(a);
                }
                if cmd.query_async::<redis::Value>(&mut conn).await.is_ok() {
                    done += 1;
                }
            }
            done
        }));
    }
    let mut probe = RedisProbe::connect(url).await?;
    let redis_before = probe.snapshot().await?;
    let me = std::process::id();
    let cpu_before = crate::stats::cpu_seconds(me);
    let start = now();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = now().duration_since(start).as_secs_f64();
    let mut total = 0;
    for t in tasks {
        total += t.await.map_err(|e| e.to_string())?;
    }
    let client = crate::stats::cpu_seconds(me)
        .zip(cpu_before)
        .map(|(a, b)| a - b);
    let redis = probe.snapshot().await?.since(&redis_before, total);
    let point = FloorPoint {
        tool: "redis-rs".into(),
        connections: conns.len(),
        pipeline: in_flight,
        in_flight,
        throughput_rps: total as f64 / elapsed,
        p50_ms: None,
        p99_ms: None,
        client_cpu_us_per_call: None,
        redis_cpu_us_per_call: None,
    };
    Ok(with_cpu(point, total as f64, client, redis.cpu_seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_redis_benchmark_csv() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"EVALSHA abc 1 k  1 0\",\"58997.05\",\"0.784\",\"0.104\",\"0.735\",\"1.143\",\"3.287\",\"6.799\"\n";
        assert_eq!(parse_csv(text), Some((58997.05, 0.735, 3.287)));
        assert_eq!(parse_csv("garbage"), None);
    }
}
