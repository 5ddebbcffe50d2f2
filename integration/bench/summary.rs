//! The summary of a run.sh run: one table row per target (noop, memory, redis), the Redis floor
//! lines, the ratios against their targets, and p99 at half the peak; the same figures as JSON.

use serde::{Deserialize, Serialize};

use crate::floor::FloorPoint;
use crate::load::Report;
use crate::stats;

/// A sweep as `sweep --json` writes it.
#[derive(Serialize, Deserialize)]
pub struct SweepFile {
    pub label: String,
    pub peak: Report,
    pub points: Vec<Report>,
}

/// The Redis floor as `redis-floor --json` writes it.
#[derive(Serialize, Deserialize)]
pub struct FloorFile {
    pub in_flight: usize,
    pub points: Vec<FloorPoint>,
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

/// The summary text and the same figures as JSON (`targets`, `ratios`, `floor`).
pub fn summarize(
    noop: &SweepFile,
    memory: &SweepFile,
    redis: &SweepFile,
    floor: &FloorFile,
) -> (String, serde_json::Value) {
    let mut out = String::new();
    let rows = target_table(
        &mut out,
        [("noop", noop), ("memory", memory), ("redis", redis)],
    );
    for p in &floor.points {
        out.push_str(&format!(
            "floor    {:>10.0}   {} (CPU/call: client {:.1}us, redis {:.1}us)\n",
            p.throughput_rps,
            floor_name(p),
            p.client_cpu_us_per_call.unwrap_or(f64::NAN),
            p.redis_cpu_us_per_call.unwrap_or(f64::NAN)
        ));
    }
    let ratios = ratios(&mut out, noop, memory, redis, floor);
    half_peak_p99(&mut out, memory, redis);
    (
        out,
        serde_json::json!({"targets": rows, "ratios": ratios, "floor": floor.points}),
    )
}

/// The table of targets: a header and one row per target; returns the rows as JSON by name.
fn target_table(
    out: &mut String,
    targets: [(&str, &SweepFile); 3],
) -> serde_json::Map<String, serde_json::Value> {
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
    for (name, s) in targets {
        rows.insert(name.into(), target_row(out, name, s));
    }
    rows
}

/// One target's row of the table; returns its figures as JSON.
fn target_row(out: &mut String, name: &str, s: &SweepFile) -> serde_json::Value {
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
    })
}

/// The throughput and CPU ratios, each with its target and verdict where it has one; returns
/// them as JSON by name.
fn ratios(
    out: &mut String,
    noop: &SweepFile,
    memory: &SweepFile,
    redis: &SweepFile,
    floor: &FloorFile,
) -> serde_json::Map<String, serde_json::Value> {
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
    ratios
}

/// The server's CPU per request at the peak (the process that is neither generator nor redis).
fn server_us(s: &SweepFile) -> f64 {
    s.peak
        .cpu
        .iter()
        .find(|(n, _)| n.as_str() != "generator" && n.as_str() != "redis")
        .and_then(|(_, c)| c.us_per_request)
        .unwrap_or(f64::NAN)
}

/// p99 at half the peak for memory and Redis, against their bounds.
fn half_peak_p99(out: &mut String, memory: &SweepFile, redis: &SweepFile) {
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
}
