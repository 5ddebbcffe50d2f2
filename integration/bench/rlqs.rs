//! `rlqs`: load on a Rate Limit Quota Service (`StreamRateLimitQuotas`). S streams, each one data
//! plane, each reporting the usage of B bucket ids in one message — every `interval` as Envoy's
//! `rate_limit_quota` filter does, or back to back as fast as HTTP/2 flow control lets them
//! through — while the assignments the server pushes back are counted by kind.
//!
//! RLQS has no answer per report, so a report counts when the stream took it: in flood mode that
//! is when the transport pulled it under the server's flow-control window, so the count runs at
//! most one window ahead of what the server read. The server's own count of reported requests
//! (`sluice_rlqs_reported_requests_total`, read from its admin port with `--admin`) is printed
//! beside the generator's to show the two agree.
//!
//! A message is encoded once per stream and re-sent as bytes: the generator shares the machine
//! with the server, and building the same protobuf again for every report would make it, not the
//! server, the limit.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use prost::Message;
use serde::{Deserialize, Serialize};
use tokio_stream::Stream;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

use crate::load::{cpu_pressure_avg10, loadavg_1m, now};
use crate::stats::{CpuSnapshot, CpuUse, NamedPid, RedisProbe, RedisUse};

const PATH: &str = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// How long the streams get to end after the run before they are dropped.
const DRAIN: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub struct RlqsSpec {
    pub target: String,
    pub streams: usize,
    /// HTTP/2 connections the streams are spread over.
    pub connections: usize,
    pub buckets: usize,
    /// Each stream reports its own bucket ids (S × B storage keys); otherwise every stream
    /// reports the same B, as replicas of one proxy fleet do.
    pub distinct_buckets: bool,
    /// `None`: back to back.
    pub interval: Option<Duration>,
    /// Requests one bucket's report covers (allowed + denied).
    pub per_report: u64,
    /// Share of them reported denied.
    pub denied_share: f64,
    pub domain: String,
    pub key_name: String,
    pub value_prefix: String,
    pub duration: Duration,
    pub warmup: Duration,
    pub pids: Vec<NamedPid>,
    pub redis_url: Option<String>,
    /// host:port of the server's admin listener (`GET /metrics`).
    pub admin: Option<String>,
}

/// One run's figures; also the JSON the generator writes. Rates are per second of the measured
/// window.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RlqsReport {
    pub target: String,
    pub streams: usize,
    pub connections: usize,
    pub buckets_per_stream: usize,
    pub distinct_bucket_ids: usize,
    pub subscriptions: usize,
    /// `None`: back to back.
    pub interval_s: Option<f64>,
    pub per_report: u64,
    pub duration_s: f64,
    pub warmup_s: f64,
    /// Report messages (one per stream per interval, each with every bucket of the stream).
    pub reports: u64,
    pub reports_per_s: f64,
    pub bucket_reports_per_s: f64,
    /// Requests the reports covered: Σ (allowed + denied) per second.
    pub covered_rps: f64,
    pub responses_per_s: f64,
    /// Bucket actions received per second, and their count by kind.
    pub assignments_per_s: f64,
    pub assignments_by_kind: BTreeMap<String, u64>,
    /// Subscriptions that had received no assignment when the run ended.
    pub unassigned: usize,
    /// Streams that ended with an error, by gRPC code.
    pub stream_errors: BTreeMap<String, u64>,
    /// The server's own counts over the window (with `--admin`).
    pub server: Option<ServerCounts>,
    /// CPU per process; `us_per_request` is per bucket-report.
    pub cpu: BTreeMap<String, CpuUse>,
    /// Requests covered per CPU-second of each process.
    pub covered_per_cpu_s: BTreeMap<String, f64>,
    /// Redis's work per bucket-report.
    pub redis: Option<RedisUse>,
    pub loadavg_1m: Option<f64>,
    pub cpu_pressure_avg10: Option<f64>,
}

/// `sluice_rlqs_*` counters over the measured window, per second.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ServerCounts {
    pub covered_rps: f64,
    pub assignments_per_s: f64,
    pub slack_per_s: f64,
    pub ignored: u64,
}

/// One stream's counters, read at the window's edges.
#[derive(Default)]
struct Counters {
    reports: AtomicU64,
    responses: AtomicU64,
    /// allow_all, deny_all, token_bucket, abandon, other.
    kinds: [AtomicU64; 5],
}

const KINDS: [&str; 5] = ["allow_all", "deny_all", "token_bucket", "abandon", "other"];

#[derive(Clone, Copy, Default)]
struct Totals {
    reports: u64,
    responses: u64,
    kinds: [u64; 5],
}

impl Totals {
    fn read(counters: &[Arc<Counters>]) -> Totals {
        let mut t = Totals::default();
        for c in counters {
            t.reports += c.reports.load(Ordering::Relaxed);
            t.responses += c.responses.load(Ordering::Relaxed);
            for (sum, kind) in t.kinds.iter_mut().zip(&c.kinds) {
                *sum += kind.load(Ordering::Relaxed);
            }
        }
        t
    }
}

/// Sends pre-encoded report messages and decodes the assignments.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = RateLimitQuotaResponse;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = RateLimitQuotaResponse;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, tonic::Status> {
        RateLimitQuotaResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("decoding an assignment: {e}")))
    }
}

/// The bucket id values stream `s` reports: `prefix<n>` for n in its range.
fn bucket_range(spec: &RlqsSpec, s: usize) -> std::ops::Range<usize> {
    let base = if spec.distinct_buckets {
        s * spec.buckets
    } else {
        0
    };
    base..base + spec.buckets
}

/// Stream `s`'s report, encoded: every bucket of its range, `per_report` requests each.
fn encode_report(spec: &RlqsSpec, s: usize) -> Bytes {
    let denied = ((spec.per_report as f64) * spec.denied_share).round() as u64;
    let denied = denied.min(spec.per_report);
    let elapsed = spec.interval.map(|d| PbDuration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    });
    let message = RateLimitQuotaUsageReports {
        // Every message names the domain, as Envoy's filter sends it.
        domain: spec.domain.clone(),
        bucket_quota_usages: bucket_range(spec, s)
            .map(|n| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: [(spec.key_name.clone(), format!("{}{n}", spec.value_prefix))]
                        .into_iter()
                        .collect(),
                }),
                time_elapsed: elapsed,
                num_requests_allowed: spec.per_report - denied,
                num_requests_denied: denied,
            })
            .collect(),
    };
    Bytes::from(message.encode_to_vec())
}

type Reports = Pin<Box<dyn Stream<Item = Bytes> + Send>>;

/// The stream's outgoing reports: back to back (counted as the transport pulls them), or one per
/// interval from `first`.
fn reports(
    body: Bytes,
    interval: Option<Duration>,
    first: Instant,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) -> Reports {
    match interval {
        None => Box::pin(tokio_stream::iter(std::iter::from_fn(move || {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            counters.reports.fetch_add(1, Ordering::Relaxed);
            Some(body.clone())
        }))),
        Some(every) => {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(first.into(), every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    if stop.load(Ordering::Relaxed) || tx.send(body.clone()).await.is_err() {
                        break;
                    }
                    counters.reports.fetch_add(1, Ordering::Relaxed);
                }
            });
            Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
        }
    }
}

/// What one stream saw by its end.
struct StreamEnd {
    /// Which of its buckets got at least one assignment.
    assigned: Vec<bool>,
    error: Option<String>,
}

/// One data plane: opens the stream, and counts the assignments until the server ends it.
async fn data_plane(
    channel: Channel,
    reports: Reports,
    range: std::ops::Range<usize>,
    spec: Arc<RlqsSpec>,
    counters: Arc<Counters>,
) -> StreamEnd {
    let mut end = StreamEnd {
        assigned: vec![false; range.len()],
        error: None,
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    let call = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        grpc.streaming(
            tonic::Request::new(reports),
            PathAndQuery::from_static(PATH),
            RawCodec,
        )
        .await
    };
    let mut inbound = match call.await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            end.error = Some(format!("{:?}", status.code()));
            return end;
        }
    };
    loop {
        match inbound.message().await {
            Ok(Some(response)) => {
                counters.responses.fetch_add(1, Ordering::Relaxed);
                for action in &response.bucket_action {
                    counters.kinds[kind(action.bucket_action.as_ref())]
                        .fetch_add(1, Ordering::Relaxed);
                    if let Some(i) = action
                        .bucket_id
                        .as_ref()
                        .and_then(|id| id.bucket.get(&spec.key_name))
                        .and_then(|v| v.strip_prefix(&spec.value_prefix))
                        .and_then(|n| n.parse::<usize>().ok())
                        .filter(|n| range.contains(n))
                    {
                        end.assigned[i - range.start] = true;
                    }
                }
            }
            Ok(None) => return end,
            Err(status) => {
                end.error = Some(format!("{:?}", status.code()));
                return end;
            }
        }
    }
}

/// Index into [`KINDS`].
fn kind(action: Option<&Kind>) -> usize {
    match action {
        Some(Kind::QuotaAssignmentAction(a)) => {
            match a.rate_limit_strategy.as_ref().and_then(|s| s.strategy) {
                Some(Strategy::BlanketRule(r)) if r == BlanketRule::DenyAll as i32 => 1,
                Some(Strategy::BlanketRule(_)) | None => 0,
                Some(Strategy::TokenBucket(_)) => 2,
                Some(Strategy::RequestsPerTimeUnit(_)) => 4,
            }
        }
        Some(Kind::AbandonAction(_)) => 3,
        None => 4,
    }
}

async fn connect(target: &str, n: usize) -> Result<Vec<Channel>, String> {
    let uri = if target.contains("://") {
        target.to_string()
    } else {
        format!("http://{target}")
    };
    let mut channels = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
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

/// The server's `sluice_rlqs_*` counters: covered requests, assignments sent, slack, ignored.
#[derive(Clone, Copy, Default)]
struct ServerSnapshot {
    reported: f64,
    sent: f64,
    slack: f64,
    ignored: f64,
}

/// `GET /metrics` from the admin listener (HTTP/1.1, closed after the answer).
fn scrape(admin: &str) -> Result<ServerSnapshot, String> {
    let mut conn =
        std::net::TcpStream::connect(admin).map_err(|e| format!("admin {admin}: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(
        conn,
        "GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("admin {admin}: {e}"))?;
    let mut text = String::new();
    conn.read_to_string(&mut text)
        .map_err(|e| format!("admin {admin}: {e}"))?;
    if !text.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "admin {admin}: {}",
            text.lines().next().unwrap_or("")
        ));
    }
    Ok(parse_metrics(&text))
}

/// Sums each counter over its label sets (Prometheus text format).
fn parse_metrics(text: &str) -> ServerSnapshot {
    let mut s = ServerSnapshot::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or("");
        let Some(value) = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.trim().parse::<f64>().ok())
        else {
            continue;
        };
        match name {
            "sluice_rlqs_reported_requests_total" => s.reported += value,
            "sluice_rlqs_assignments_sent_total" => s.sent += value,
            "sluice_rlqs_grant_slack_total" => s.slack += value,
            "sluice_rlqs_reports_ignored_total" => s.ignored += value,
            _ => {}
        }
    }
    s
}

async fn server_snapshot(admin: &Option<String>) -> Result<Option<ServerSnapshot>, String> {
    let Some(admin) = admin.clone() else {
        return Ok(None);
    };
    tokio::task::spawn_blocking(move || scrape(&admin))
        .await
        .map_err(|e| e.to_string())?
        .map(Some)
}

/// The snapshots either side of the measured window.
struct Window {
    before: Totals,
    after: Totals,
    wall: f64,
    cpu: BTreeMap<String, CpuUse>,
    server: Option<(ServerSnapshot, ServerSnapshot)>,
    redis: Option<(crate::stats::RedisSnapshot, crate::stats::RedisSnapshot)>,
}

/// What the data planes ended with: buckets never assigned, and stream errors by code.
#[derive(Default)]
struct Ends {
    unassigned: usize,
    stream_errors: BTreeMap<String, u64>,
}

pub async fn run(spec: RlqsSpec) -> Result<RlqsReport, String> {
    check(&spec)?;
    let spec = Arc::new(spec);
    let channels = connect(&spec.target, spec.connections.min(spec.streams)).await?;
    let mut redis = match &spec.redis_url {
        Some(url) => Some(RedisProbe::connect(url).await?),
        None => None,
    };
    // Read once up front, so a wrong --admin fails before the load.
    server_snapshot(&spec.admin).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let start = now();
    let (counters, planes) = start_planes(&spec, &channels, start, &stop);
    tokio::time::sleep_until((start + spec.warmup).into()).await;
    let window = measure(&spec, &counters, redis.as_mut()).await?;
    stop.store(true, Ordering::Relaxed);
    let ends = drain(planes).await?;
    Ok(report(&spec, channels.len(), window, ends))
}

fn check(spec: &RlqsSpec) -> Result<(), String> {
    if spec.streams == 0 || spec.buckets == 0 {
        return Err("--streams and --buckets must be at least 1".into());
    }
    if spec.interval.is_some_and(|d| d.is_zero()) {
        return Err("--interval must be positive (omit it for back-to-back reports)".into());
    }
    if !(0.0..=1.0).contains(&spec.denied_share) {
        return Err("--denied-share must be within 0..=1".into());
    }
    Ok(())
}

/// One data plane per stream over the channels in turn, reporting out of phase with each
/// other, as independent proxies do; their counters and tasks.
fn start_planes(
    spec: &Arc<RlqsSpec>,
    channels: &[Channel],
    start: Instant,
    stop: &Arc<AtomicBool>,
) -> (Vec<Arc<Counters>>, Vec<tokio::task::JoinHandle<StreamEnd>>) {
    let mut counters = Vec::with_capacity(spec.streams);
    let mut planes = Vec::with_capacity(spec.streams);
    for s in 0..spec.streams {
        let c = Arc::new(Counters::default());
        let phase = spec.interval.map_or(Duration::ZERO, |d| {
            d.mul_f64(s as f64 / spec.streams as f64)
        });
        let body = reports(
            encode_report(spec, s),
            spec.interval,
            start + phase,
            c.clone(),
            stop.clone(),
        );
        planes.push(tokio::spawn(data_plane(
            channels[s % channels.len()].clone(),
            body,
            bucket_range(spec, s),
            spec.clone(),
            c.clone(),
        )));
        counters.push(c);
    }
    (counters, planes)
}

/// Snapshots of the counters, the processes' CPU, the server and Redis either side of
/// `spec.duration`.
async fn measure(
    spec: &RlqsSpec,
    counters: &[Arc<Counters>],
    mut redis: Option<&mut RedisProbe>,
) -> Result<Window, String> {
    let cpu_before = CpuSnapshot::take(&spec.pids);
    let redis_before = match redis.as_mut() {
        Some(r) => Some(r.snapshot().await?),
        None => None,
    };
    let server_before = server_snapshot(&spec.admin).await?;
    let before = Totals::read(counters);
    let measured_start = now();
    tokio::time::sleep(spec.duration).await;
    let after = Totals::read(counters);
    let wall = now().duration_since(measured_start).as_secs_f64();
    let cpu = CpuSnapshot::take(&spec.pids).since(&cpu_before, wall);
    let server_after = server_snapshot(&spec.admin).await?;
    let redis_after = match redis.as_mut() {
        Some(r) => Some(r.snapshot().await?),
        None => None,
    };
    Ok(Window {
        before,
        after,
        wall,
        cpu,
        server: server_before.zip(server_after),
        redis: redis_before.zip(redis_after),
    })
}

/// Waits for every data plane to end its stream (aborting one that does not within [`DRAIN`]).
async fn drain(planes: Vec<tokio::task::JoinHandle<StreamEnd>>) -> Result<Ends, String> {
    let mut ends = Ends::default();
    for plane in planes {
        let abort = plane.abort_handle();
        match tokio::time::timeout(DRAIN, plane).await {
            Ok(Ok(end)) => {
                ends.unassigned += end.assigned.iter().filter(|a| !**a).count();
                if let Some(code) = end.error {
                    *ends.stream_errors.entry(code).or_default() += 1;
                }
            }
            Ok(Err(e)) => return Err(format!("data plane task: {e}")),
            Err(_) => {
                abort.abort();
                *ends
                    .stream_errors
                    .entry("NotEndedAfterReports".to_string())
                    .or_default() += 1;
            }
        }
    }
    Ok(ends)
}

fn report(spec: &RlqsSpec, connections: usize, w: Window, ends: Ends) -> RlqsReport {
    let Window {
        before,
        after,
        wall,
        mut cpu,
        server,
        redis,
    } = w;
    let per_s = |n: u64| if wall > 0.0 { n as f64 / wall } else { 0.0 };
    let reports = after.reports - before.reports;
    let bucket_reports = reports * spec.buckets as u64;
    let covered = bucket_reports * spec.per_report;
    let mut covered_per_cpu_s = BTreeMap::new();
    for (name, use_) in cpu.iter_mut() {
        use_.us_per_request =
            (bucket_reports > 0).then(|| use_.seconds * 1e6 / bucket_reports as f64);
        if use_.seconds > 0.0 {
            covered_per_cpu_s.insert(name.clone(), covered as f64 / use_.seconds);
        }
    }
    let assignments: u64 = (0..KINDS.len())
        .map(|i| after.kinds[i] - before.kinds[i])
        .sum();
    let server = server.map(|(b, a)| ServerCounts {
        covered_rps: (a.reported - b.reported) / wall,
        assignments_per_s: (a.sent - b.sent) / wall,
        slack_per_s: (a.slack - b.slack) / wall,
        ignored: (a.ignored - b.ignored) as u64,
    });
    RlqsReport {
        target: spec.target.clone(),
        streams: spec.streams,
        connections,
        buckets_per_stream: spec.buckets,
        distinct_bucket_ids: if spec.distinct_buckets {
            spec.streams * spec.buckets
        } else {
            spec.buckets
        },
        subscriptions: spec.streams * spec.buckets,
        interval_s: spec.interval.map(|d| d.as_secs_f64()),
        per_report: spec.per_report,
        duration_s: wall,
        warmup_s: spec.warmup.as_secs_f64(),
        reports,
        reports_per_s: per_s(reports),
        bucket_reports_per_s: per_s(bucket_reports),
        covered_rps: per_s(covered),
        responses_per_s: per_s(after.responses - before.responses),
        assignments_per_s: per_s(assignments),
        assignments_by_kind: KINDS
            .iter()
            .enumerate()
            .map(|(i, k)| (k.to_string(), after.kinds[i] - before.kinds[i]))
            .filter(|(_, n)| *n > 0)
            .collect(),
        unassigned: ends.unassigned,
        stream_errors: ends.stream_errors,
        server,
        cpu,
        covered_per_cpu_s,
        redis: redis.map(|(b, a)| a.since(&b, bucket_reports)),
        loadavg_1m: loadavg_1m(),
        cpu_pressure_avg10: cpu_pressure_avg10(),
    }
}

/// The summary line: `key=value` fields, so scripts can pick them out.
pub fn line(label: &str, r: &RlqsReport) -> String {
    let interval = r
        .interval_s
        .map_or("flood".to_string(), |s| format!("{s}s"));
    let cpu: Vec<String> = r
        .cpu
        .iter()
        .map(|(n, c)| {
            format!(
                "{n}={:.2}({:.2}us/bucket-report)",
                c.cores,
                c.us_per_request.unwrap_or(f64::NAN)
            )
        })
        .collect();
    let per_cpu: Vec<String> = r
        .covered_per_cpu_s
        .iter()
        .map(|(n, v)| format!("covered_per_cpu_s.{n}={v:.0}"))
        .collect();
    let server = r.server.as_ref().map_or(String::new(), |s| {
        format!(
            " server_covered/s={:.0} server_assignments/s={:.0} slack/s={:.0} ignored={}",
            s.covered_rps, s.assignments_per_s, s.slack_per_s, s.ignored
        )
    });
    let redis = r.redis.as_ref().map_or(String::new(), |u| {
        format!(
            " redis_cmds/bucket-report={:.4} redis_cpu_s={:.2}",
            u.commands_per_request, u.cpu_seconds
        )
    });
    let kinds: Vec<String> = r
        .assignments_by_kind
        .iter()
        .map(|(k, n)| format!("{k}:{n}"))
        .collect();
    format!(
        "{label}: streams={} buckets={} ids={} interval={interval} per_report={} reports/s={:.1} bucket-reports/s={:.0} covered/s={:.0} assignments/s={:.0} responses/s={:.1} kinds=[{}] unassigned={} errors={:?}{server}{redis} cores[{}] {} load={:.2} cpu_pressure={:.0}%",
        r.streams,
        r.buckets_per_stream,
        r.distinct_bucket_ids,
        r.per_report,
        r.reports_per_s,
        r.bucket_reports_per_s,
        r.covered_rps,
        r.assignments_per_s,
        r.responses_per_s,
        kinds.join(","),
        r.unassigned,
        r.stream_errors,
        cpu.join(" "),
        per_cpu.join(" "),
        r.loadavg_1m.unwrap_or(f64::NAN),
        r.cpu_pressure_avg10.unwrap_or(f64::NAN)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(distinct: bool) -> RlqsSpec {
        RlqsSpec {
            target: String::new(),
            streams: 3,
            connections: 3,
            buckets: 4,
            distinct_buckets: distinct,
            interval: Some(Duration::from_millis(1500)),
            per_report: 1000,
            denied_share: 0.25,
            domain: "bench".into(),
            key_name: "tenant".into(),
            value_prefix: "t".into(),
            duration: Duration::from_secs(1),
            warmup: Duration::ZERO,
            pids: Vec::new(),
            redis_url: None,
            admin: None,
        }
    }

    #[test]
    fn a_report_carries_every_bucket_of_its_stream() {
        let s = spec(true);
        let decoded = RateLimitQuotaUsageReports::decode(encode_report(&s, 2)).unwrap();
        assert_eq!(decoded.domain, "bench");
        let values: Vec<&str> = decoded
            .bucket_quota_usages
            .iter()
            .map(|u| u.bucket_id.as_ref().unwrap().bucket["tenant"].as_str())
            .collect();
        assert_eq!(values, ["t8", "t9", "t10", "t11"]);
        let usage = &decoded.bucket_quota_usages[0];
        assert_eq!(
            (usage.num_requests_allowed, usage.num_requests_denied),
            (750, 250)
        );
        assert_eq!(
            usage.time_elapsed,
            Some(PbDuration {
                seconds: 1,
                nanos: 500_000_000
            })
        );
        assert_eq!(bucket_range(&spec(false), 2), 0..4);
    }

    #[test]
    fn counters_are_summed_over_label_sets() {
        let text = "# HELP x\nsluice_rlqs_reported_requests_total{result=\"allowed\",otel_scope_name=\"sluice\"} 1500\nsluice_rlqs_reported_requests_total{result=\"denied\"} 500\nsluice_rlqs_assignments_sent_total{kind=\"token_bucket\"} 7\nsluice_rlqs_assignments_sent_total{kind=\"abandon\"} 1\nsluice_rlqs_grant_slack_total 3\nsluice_rlqs_streams_open 2\n";
        let s = parse_metrics(text);
        assert_eq!(s.reported, 2000.0);
        assert_eq!(s.sent, 8.0);
        assert_eq!(s.slack, 3.0);
        assert_eq!(s.ignored, 0.0);
    }

    #[test]
    fn assignment_kinds_are_told_apart() {
        use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
        use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{AbandonAction, QuotaAssignmentAction};
        let assign = |strategy| {
            Kind::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: None,
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            })
        };
        let deny = assign(Strategy::BlanketRule(BlanketRule::DenyAll as i32));
        let allow = assign(Strategy::BlanketRule(BlanketRule::AllowAll as i32));
        let bucket = assign(Strategy::TokenBucket(TokenBucket::default()));
        assert_eq!(KINDS[kind(Some(&allow))], "allow_all");
        assert_eq!(KINDS[kind(Some(&deny))], "deny_all");
        assert_eq!(KINDS[kind(Some(&bucket))], "token_bucket");
        assert_eq!(
            KINDS[kind(Some(&Kind::AbandonAction(AbandonAction {})))],
            "abandon"
        );
        assert_eq!(KINDS[kind(None)], "other");
    }
}
