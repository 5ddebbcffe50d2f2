//! The service's metrics through the OpenTelemetry SDK: Prometheus text for `GET /metrics`, and
//! an OTLP/gRPC push when an endpoint is configured.
//!
//! Instrument names are what they are in the Prometheus output, in both exports (the Prometheus
//! exporter adds no `_total` or unit suffixes): envoyproxy/ratelimit's names where it has the
//! metric, `sluice_*` for the rest.
//!
//! Cost on the request path: counters are atomics read by observable instruments at collection
//! time; the two latency histograms are the SDK's. A [`Metrics`] built with metrics off is empty:
//! recording returns before reading a clock.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::metrics::{Instrument, PeriodicReader, SdkMeterProvider, Stream};
use prometheus::Encoder as _;

pub use super::observables::{BreakerReading, Outcome};
use super::observables::{REDIS_ERROR_KINDS, Shared, lock, register_observables};
use super::otlp;
use super::rules::RuleMetrics;
use super::traces;
use crate::backend::BackendError;
use crate::backend::redis::RedisObserver;
use crate::clock::Stopwatch;
use crate::config::{Config, ConfigStore};
use crate::decision::Decision;
use crate::limiter::SlotStats;
use crate::limiter::lease::LeaseStore;
use crate::quota::QuotaStats;
use crate::request::LimitRequest;
use crate::resilience::local::Replicas;
use crate::rls::validate::Problem;
use crate::security::listener::ConnectionStats;
use crate::settings::{BackendKind, OtlpSettings, Settings};

/// Upper bounds (seconds) of the latency histograms: sub-millisecond steps, then up to and past
/// Envoy's 20 ms filter timeout.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.003, 0.005, 0.01, 0.015, 0.02, 0.05, 0.1,
    0.5,
];

/// Buckets of `sluice_redis_batch_requests`: powers of two up to `--redis-max-batch`'s range.
const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// Series one per-rule metric may hold before the SDK folds the rest into an overflow series
/// (`otel_metric_overflow="true"`). The SDK reserves room for it up front.
pub const RULE_SERIES_LIMIT: usize = 10_000;

/// A circuit breaker's state, as the `state` label of `sluice_redis_breaker_state`.
pub use crate::backend::breaker::BreakerState;

/// What the metrics need beyond the config.
#[derive(Clone, Debug)]
pub struct MetricsOptions {
    pub enabled: bool,
    pub near_limit_ratio: f64,
    pub detailed_max_values: usize,
    pub otlp: OtlpSettings,
    /// The Redis call deadline, exported so alerts can compare latency with it; `None`: not
    /// the Redis backend (its metrics are left out).
    pub redis_timeout: Option<Duration>,
}

impl From<&Settings> for MetricsOptions {
    fn from(settings: &Settings) -> Self {
        let telemetry = &settings.telemetry;
        MetricsOptions {
            enabled: telemetry.metrics,
            near_limit_ratio: telemetry.near_limit_ratio,
            detailed_max_values: telemetry.metrics_detailed_max_values,
            otlp: telemetry.otlp.clone(),
            redis_timeout: (settings.backend == BackendKind::Redis)
                .then_some(settings.redis_timeout),
        }
    }
}

impl Default for MetricsOptions {
    /// Every flag at its default (the memory backend, so no Redis metrics); no OTLP push.
    fn default() -> Self {
        MetricsOptions::from(&Settings::defaults())
    }
}

/// Why metrics could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("Prometheus exporter: {0}")]
    Prometheus(String),
    #[error("OTLP metric exporter: {0}")]
    Otlp(String),
}

struct Inner {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
    shared: Arc<Shared>,
    response_time: Histogram<f64>,
    response_time_attrs: [KeyValue; 1],
    redis_duration: Histogram<f64>,
    redis_batch: Histogram<u64>,
}

/// Handle to one server's metrics; cheap to clone. Empty (all no-ops) when metrics are off.
#[derive(Clone, Default)]
pub struct Metrics(Option<Arc<Inner>>);

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("enabled", &self.0.is_some())
            .finish()
    }
}

impl Metrics {
    /// Metrics off: nothing is recorded, `/metrics` answers 404.
    pub fn off() -> Metrics {
        Metrics(None)
    }

    /// Builds the instruments over `store`'s active config. With an OTLP endpoint this must run
    /// inside a Tokio runtime (the exporter's gRPC channel lives on it).
    pub fn new(store: Arc<ConfigStore>, options: &MetricsOptions) -> Result<Metrics, MetricsError> {
        if !options.enabled {
            return Ok(Metrics(None));
        }
        let registry = prometheus::Registry::new();
        let exporter = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .without_counter_suffixes()
            .without_units()
            .scope_info_enabled(false)
            .build()
            .map_err(|e| MetricsError::Prometheus(e.to_string()))?;
        let mut builder = SdkMeterProvider::builder()
            .with_resource(otlp::resource())
            .with_reader(exporter)
            .with_view(rule_series_view);
        if let Some(endpoint) = &options.otlp.metrics_endpoint {
            let push = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|e| MetricsError::Otlp(e.to_string()))?;
            let mut reader = PeriodicReader::builder(push);
            if let Some(interval) = options.otlp.metric_interval {
                reader = reader.with_interval(interval);
            }
            builder = builder.with_reader(reader.build());
        }
        let provider = builder.build();
        let meter = provider.meter("sluice");

        let active: Arc<ArcSwap<Config>> = store.active().clone();
        let rules = RuleMetrics::new(
            active,
            options.near_limit_ratio,
            options.detailed_max_values,
        );
        let shared = Arc::new(Shared::new(rules, store, options.redis_timeout));
        register_observables(&meter, &shared);
        let response_time = meter
            .f64_histogram("ratelimit_service_response_time_seconds")
            .with_description(
                "Time to answer ShouldRateLimit, from the decoded request to the encoded response",
            )
            .with_boundaries(LATENCY_BUCKETS.to_vec())
            .build();
        let redis_duration = meter
            .f64_histogram("sluice_redis_call_duration_seconds")
            .with_description("Time of one Redis decision (one script call; in Cluster mode the concurrent calls of one request), errors included")
            .with_boundaries(LATENCY_BUCKETS.to_vec())
            .build();
        let redis_batch = meter
            .u64_histogram("sluice_redis_batch_requests")
            .with_description("Requests decided by one batched script call (standalone and Sentinel modes): _sum / _count is the mean batch, _count the calls")
            .with_boundaries(BATCH_BUCKETS.to_vec())
            .build();
        Ok(Metrics(Some(Arc::new(Inner {
            provider,
            registry,
            shared,
            response_time,
            response_time_attrs: [KeyValue::new("grpc_method", "ShouldRateLimit")],
            redis_duration,
            redis_batch,
        }))))
    }

    /// The admin listener's instruments (`sluice_admin_resets_total`); call once per server.
    pub fn admin(&self) -> super::AdminMetrics {
        self.0.as_ref().map_or_else(Default::default, |inner| {
            super::AdminMetrics::new(&inner.provider.meter("sluice"))
        })
    }

    pub fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Starts timing a request; `None` (no clock read) when metrics are off.
    pub fn start(&self) -> Option<Stopwatch> {
        self.0.as_ref().map(|_| Stopwatch::start())
    }

    /// Counts a decided request: its outcome, latency and per-rule counters.
    pub fn record_decision(
        &self,
        started: Option<Stopwatch>,
        request: &LimitRequest,
        decision: &Decision,
    ) {
        let Some(inner) = &self.0 else { return };
        let outcome = match decision.overall {
            crate::decision::Code::Ok => Outcome::Ok,
            crate::decision::Code::OverLimit => Outcome::OverLimit,
        };
        if decision.unknown_domain {
            inner.shared.unknown_domain.fetch_add(1, Ordering::Relaxed);
        } else {
            inner.shared.rules.record(request, decision);
        }
        inner.finish(started, outcome);
    }

    /// Counts a request Envoy can send that was not decided as sent ([`Problem`]).
    pub fn record_problem(&self, problem: Problem) {
        if let Some(inner) = &self.0 {
            inner.shared.problems[problem.index()].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a request answered with a gRPC error.
    pub fn record_error(&self, started: Option<Stopwatch>, outcome: Outcome) {
        if let Some(inner) = &self.0 {
            inner.finish(started, outcome);
        }
    }

    /// The observer the Redis backend reports its calls to.
    pub fn redis_calls(&self) -> RedisCalls {
        RedisCalls(self.0.clone())
    }

    /// Feeds `sluice_memory_buckets` (the memory backend's live buckets) from `source`.
    pub fn observe_memory_buckets(&self, source: impl Fn() -> u64 + Send + Sync + 'static) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.memory_buckets) = Some(Box::new(source));
        }
    }

    /// Feeds `sluice_memory_buckets_refused_total` (new buckets the memory backend had no room
    /// for) from `source`, a running total.
    pub fn observe_memory_refusals(&self, source: impl Fn() -> u64 + Send + Sync + 'static) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.memory_refused) = Some(Box::new(source));
        }
    }

    /// Feeds `sluice_in_flight_slots_total` and `sluice_reservations_total` from the limiter's
    /// holder counts, while the limiter lives.
    pub fn observe_slots(&self, stats: Weak<SlotStats>) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.slots) = Some(stats);
        }
    }

    /// Feeds the `sluice_lease_*` counters from the limiter's lease store.
    pub fn observe_leases(&self, store: Arc<LeaseStore>) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.leases) = Some(store);
        }
    }

    /// Feeds the `sluice_rlqs_*` metrics from the RLQS side's counts.
    pub fn observe_quota(&self, stats: Arc<QuotaStats>) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.quota) = Some(stats);
        }
    }

    /// Feeds `sluice_replicas` from the count the `local` failure policy divides limits by.
    pub fn observe_replicas(&self, replicas: Arc<Replicas>) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.replicas) = Some(replicas);
        }
    }

    /// Feeds the `sluice_connections_*` metrics from the gRPC listener's counts.
    pub fn observe_connections(&self, stats: Arc<ConnectionStats>) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.connections) = Some(stats);
        }
    }

    /// Adds a source of breaker states for `sluice_redis_breaker_state`; read at every
    /// collection, so it must be cheap and must not block.
    pub fn observe_breakers(
        &self,
        source: impl Fn() -> Vec<BreakerReading> + Send + Sync + 'static,
    ) {
        if let Some(inner) = &self.0 {
            lock(&inner.shared.breakers).push(Box::new(source));
        }
    }

    /// The Prometheus text exposition of every metric; `None` when metrics are off.
    pub fn prometheus_text(&self) -> Option<Result<String, String>> {
        let inner = self.0.as_ref()?;
        let families = inner.registry.gather();
        let mut out = Vec::new();
        Some(
            prometheus::TextEncoder::new()
                .encode(&families, &mut out)
                .map_err(|e| e.to_string())
                .and_then(|()| String::from_utf8(out).map_err(|e| e.to_string())),
        )
    }

    /// Pushes what is pending and stops the OTLP reader. Blocks: call off the async workers.
    pub fn shutdown(&self) {
        if let Some(inner) = &self.0
            && let Err(e) = inner.provider.shutdown_with_timeout(Duration::from_secs(5))
        {
            tracing::debug!(error = %e, "meter provider shutdown");
        }
    }
}

impl Inner {
    fn finish(&self, started: Option<Stopwatch>, outcome: Outcome) {
        self.shared.outcomes[outcome.index()].fetch_add(1, Ordering::Relaxed);
        if let Some(started) = started {
            self.response_time
                .record(started.elapsed().as_secs_f64(), &self.response_time_attrs);
        }
    }

    /// One Redis decision call failed (or was skipped by an open breaker) with `error`.
    fn count_redis_error(&self, error: &BackendError) {
        if let Some(i) = REDIS_ERROR_KINDS.iter().position(|k| *k == error.kind()) {
            self.shared.redis_errors[i].fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Observes the Redis backend's calls: spans always, metrics when they are on.
#[derive(Clone, Default)]
pub struct RedisCalls(Option<Arc<Inner>>);

impl std::fmt::Debug for RedisCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCalls")
            .field("enabled", &self.0.is_some())
            .finish()
    }
}

/// Every Redis call gets a client span (exported with `--tracing`); with metrics on, a
/// decision's calls are timed and their failures counted by kind, and batch sizes recorded.
impl RedisObserver for RedisCalls {
    fn call_span(&self, keys: usize, server: &str, slot: Option<u16>) -> tracing::Span {
        traces::redis_span(keys, Some(server), slot)
    }

    fn call_failed(&self, span: &tracing::Span, error: &BackendError) {
        traces::record_redis_error(span, error);
    }

    fn times_calls(&self) -> bool {
        self.0.is_some()
    }

    fn call_timed(&self, elapsed: Duration, outcome: Result<(), &BackendError>) {
        let Some(inner) = &self.0 else { return };
        inner.redis_duration.record(elapsed.as_secs_f64(), &[]);
        if let Err(e) = outcome {
            inner.count_redis_error(e);
        }
    }

    fn call_skipped(&self) {
        if let Some(inner) = &self.0 {
            inner.count_redis_error(&BackendError::CircuitOpen);
        }
    }

    fn batch_sent(&self, requests: usize) {
        if let Some(inner) = &self.0 {
            inner.redis_batch.record(requests as u64, &[]);
        }
    }

    fn key_repaired(&self, _key: &str) {
        if let Some(inner) = &self.0 {
            inner
                .shared
                .redis_keys_repaired
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Room for every rule's series (the per-rule bound is enforced by [`RuleMetrics`]).
fn rule_series_view(instrument: &Instrument) -> Option<Stream> {
    let per_rule = instrument
        .name()
        .starts_with("ratelimit_service_rate_limit_")
        || instrument.name() == "sluice_degraded_decisions_total";
    per_rule
        .then(|| {
            Stream::builder()
                .with_cardinality_limit(RULE_SERIES_LIMIT)
                .build()
                .ok()
        })
        .flatten()
}
