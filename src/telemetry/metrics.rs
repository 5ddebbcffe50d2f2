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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter, MeterProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::metrics::{Instrument, PeriodicReader, SdkMeterProvider, Stream};
use prometheus::Encoder as _;

use super::otlp::{self, OtlpSettings};
use super::rules::{Counter, RuleMetrics};
use crate::backend::BackendError;
use crate::clock::Stopwatch;
use crate::config::{Config, ConfigStore};
use crate::lease::LeaseStore;
use crate::limiter::Decision;
use crate::request::LimitRequest;

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

/// How a `ShouldRateLimit` call ended (the `outcome` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    OverLimit,
    InvalidArgument,
    Unavailable,
    ResourceExhausted,
    /// Any other gRPC error.
    Error,
}

impl Outcome {
    const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::OverLimit,
        Outcome::InvalidArgument,
        Outcome::Unavailable,
        Outcome::ResourceExhausted,
        Outcome::Error,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::OverLimit => "over_limit",
            Outcome::InvalidArgument => "invalid_argument",
            Outcome::Unavailable => "unavailable",
            Outcome::ResourceExhausted => "resource_exhausted",
            Outcome::Error => "error",
        }
    }

    pub fn of_status(status: &tonic::Status) -> Outcome {
        match status.code() {
            tonic::Code::InvalidArgument => Outcome::InvalidArgument,
            tonic::Code::Unavailable => Outcome::Unavailable,
            tonic::Code::ResourceExhausted => Outcome::ResourceExhausted,
            _ => Outcome::Error,
        }
    }

    const fn index(self) -> usize {
        self as usize
    }
}

/// A circuit breaker's state, as the `state` label of `sluice_redis_breaker_state`.
pub use crate::resilience::breaker::BreakerState;

/// One endpoint's breaker, as a registered source reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerReading {
    /// `host:port` of the Redis endpoint (or another stable name for it).
    pub endpoint: String,
    pub state: BreakerState,
}

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

impl Default for MetricsOptions {
    fn default() -> Self {
        MetricsOptions {
            enabled: true,
            near_limit_ratio: 0.8,
            detailed_max_values: 100,
            otlp: OtlpSettings::default(),
            redis_timeout: None,
        }
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

type BreakerSource = Box<dyn Fn() -> Vec<BreakerReading> + Send + Sync>;
type GaugeSource = Box<dyn Fn() -> u64 + Send + Sync>;
/// A `sluice_lease_*` counter: name, description, and how to read it from the store.
type LeaseCounter = (&'static str, &'static str, fn(&LeaseStore) -> u64);

/// The atomics and sources the observable instruments read.
struct Shared {
    rules: RuleMetrics,
    outcomes: [AtomicU64; 6],
    unknown_domain: AtomicU64,
    redis_errors: [AtomicU64; 5],
    config: Arc<ConfigStore>,
    memory_buckets: Mutex<Option<GaugeSource>>,
    breakers: Mutex<Vec<BreakerSource>>,
    redis_timeout: Option<Duration>,
    leases: Mutex<Option<Arc<LeaseStore>>>,
}

const REDIS_ERROR_KINDS: [&str; 5] = [
    "timeout",
    "unavailable",
    "protocol",
    "circuit_open",
    "overloaded",
];

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
        let shared = Arc::new(Shared {
            rules: RuleMetrics::new(
                active,
                options.near_limit_ratio,
                options.detailed_max_values,
            ),
            outcomes: Default::default(),
            unknown_domain: AtomicU64::new(0),
            redis_errors: Default::default(),
            config: store,
            memory_buckets: Mutex::new(None),
            breakers: Mutex::new(Vec::new()),
            redis_timeout: options.redis_timeout,
            leases: Mutex::new(None),
        });
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
            crate::limiter::Code::Ok => Outcome::Ok,
            crate::limiter::Code::OverLimit => Outcome::OverLimit,
        };
        if decision.unknown_domain {
            inner.shared.unknown_domain.fetch_add(1, Ordering::Relaxed);
        } else {
            inner.shared.rules.record(request, decision);
        }
        inner.finish(started, outcome);
    }

    /// Counts a request answered with a gRPC error.
    pub fn record_error(&self, started: Option<Stopwatch>, outcome: Outcome) {
        if let Some(inner) = &self.0 {
            inner.finish(started, outcome);
        }
    }

    /// The handle the Redis backend records its calls with.
    pub fn redis_calls(&self) -> RedisCalls {
        RedisCalls(self.0.clone())
    }

    /// Feeds `sluice_memory_buckets` (the memory backend's live buckets) from `source`.
    pub fn observe_memory_buckets(&self, source: impl Fn() -> u64 + Send + Sync + 'static) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.memory_buckets) = Some(Box::new(source));
        }
    }

    /// Feeds the `sluice_lease_*` counters from the limiter's lease store.
    pub fn observe_leases(&self, store: Arc<LeaseStore>) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.leases) = Some(store);
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
}

/// Records Redis calls: latency, and failures by kind. Empty when metrics are off.
#[derive(Clone, Default)]
pub struct RedisCalls(Option<Arc<Inner>>);

impl std::fmt::Debug for RedisCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCalls")
            .field("enabled", &self.0.is_some())
            .finish()
    }
}

impl RedisCalls {
    /// Runs `call`, timing it and counting its failure kind.
    pub async fn time<T>(
        &self,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let Some(inner) = &self.0 else {
            return call.await;
        };
        let started = Stopwatch::start();
        let result = call.await;
        inner
            .redis_duration
            .record(started.elapsed().as_secs_f64(), &[]);
        if let Err(e) = &result
            && let Some(i) = REDIS_ERROR_KINDS.iter().position(|k| *k == e.kind())
        {
            inner.shared.redis_errors[i].fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Counts one batched script call of `requests` requests.
    pub fn batch(&self, requests: usize) {
        if let Some(inner) = &self.0 {
            inner.redis_batch.record(requests as u64, &[]);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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

/// Every counter and gauge, read from `shared` at collection time.
fn register_observables(meter: &Meter, shared: &Arc<Shared>) {
    for counter in Counter::ALL {
        let s = shared.clone();
        meter
            .u64_observable_counter(counter.metric_name())
            .with_description(counter.description())
            .with_callback(move |observer| {
                s.rules
                    .each(counter, &mut |value, attrs| observer.observe(value, attrs));
            })
            .build();
    }

    let s = shared.clone();
    meter
        .u64_observable_counter("ratelimit_service_total_requests")
        .with_description("ShouldRateLimit calls, by outcome (ok, over_limit, or the gRPC error)")
        .with_callback(move |observer| {
            for outcome in Outcome::ALL {
                observer.observe(
                    s.outcomes[outcome.index()].load(Ordering::Relaxed),
                    &[
                        KeyValue::new("grpc_method", "ShouldRateLimit"),
                        KeyValue::new("outcome", outcome.as_str()),
                    ],
                );
            }
        })
        .build();

    let s = shared.clone();
    meter
        .u64_observable_counter("ratelimit_service_should_rate_limit_error")
        .with_description("ShouldRateLimit calls that failed: redis_error (backend unavailable and the failure policy is error), service_error (invalid request)")
        .with_callback(move |observer| {
            let n = |o: Outcome| s.outcomes[o.index()].load(Ordering::Relaxed);
            observer.observe(
                n(Outcome::Unavailable) + n(Outcome::ResourceExhausted),
                &[KeyValue::new("err_type", "redis_error")],
            );
            observer.observe(
                n(Outcome::InvalidArgument) + n(Outcome::Error),
                &[KeyValue::new("err_type", "service_error")],
            );
        })
        .build();

    let s = shared.clone();
    meter
        .u64_observable_counter("ratelimit_service_config_load_success")
        .with_description("Config sets activated (the initial load included)")
        .with_callback(move |observer| observer.observe(s.config.load_counts().0, &[]))
        .build();
    let s = shared.clone();
    meter
        .u64_observable_counter("ratelimit_service_config_load_error")
        .with_description("Config sets rejected (the last good config stayed active)")
        .with_callback(move |observer| observer.observe(s.config.load_counts().1, &[]))
        .build();
    let s = shared.clone();
    meter
        .u64_observable_gauge("sluice_config_last_load_failed")
        .with_description(
            "1 while the most recent config set was rejected (until a good one is activated)",
        )
        .with_callback(move |observer| {
            observer.observe(u64::from(s.config.last_rejected().is_some()), &[]);
        })
        .build();
    let s = shared.clone();
    meter
        .u64_observable_gauge("sluice_config_info")
        .with_description("The active config: digest (the version replicas can be compared by), domains and rules")
        .with_callback(move |observer| {
            let active = s.config.active().load();
            observer.observe(
                1,
                &[
                    KeyValue::new("digest", active.digest().to_owned()),
                    KeyValue::new("domains", active.domains().count() as i64),
                    KeyValue::new("rules", active.rule_count() as i64),
                ],
            );
        })
        .build();

    let s = shared.clone();
    meter
        .u64_observable_counter("sluice_unknown_domain_total")
        .with_description(
            "ShouldRateLimit calls for a domain the config does not have (answered OK)",
        )
        .with_callback(move |observer| {
            observer.observe(s.unknown_domain.load(Ordering::Relaxed), &[]);
        })
        .build();

    let s = shared.clone();
    meter
        .u64_observable_counter("sluice_degraded_decisions_total")
        .with_description(
            "Descriptors decided by a failure policy because the backend could not answer",
        )
        .with_callback(move |observer| {
            s.rules
                .each_degraded(&mut |value, attrs| observer.observe(value, attrs));
        })
        .build();

    let leased: [LeaseCounter; 3] = [
        (
            "sluice_lease_local_total",
            "Hits of rules with `lease` paid from a local lease, with no backend call",
            LeaseStore::local_total,
        ),
        (
            "sluice_lease_refill_total",
            "Backend calls that refilled a lease (a lease take that was granted)",
            LeaseStore::refill_total,
        ),
        (
            "sluice_lease_returned_tokens_total",
            "Leased tokens handed back to the backend: expired, or at shutdown",
            LeaseStore::returned_total,
        ),
    ];
    for (name, description, read) in leased {
        let s = shared.clone();
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_callback(move |observer| {
                if let Some(store) = lock(&s.leases).as_ref() {
                    observer.observe(read(store), &[]);
                }
            })
            .build();
    }

    let s = shared.clone();
    meter
        .u64_observable_counter("sluice_redis_errors_total")
        .with_description("Redis decisions that failed, by kind")
        .with_callback(move |observer| {
            if s.redis_timeout.is_none() {
                return;
            }
            for (i, kind) in REDIS_ERROR_KINDS.iter().enumerate() {
                observer.observe(
                    s.redis_errors[i].load(Ordering::Relaxed),
                    &[KeyValue::new("kind", *kind)],
                );
            }
        })
        .build();

    let s = shared.clone();
    meter
        .f64_observable_gauge("sluice_redis_timeout_seconds")
        .with_description("Deadline of one Redis decision (--redis-timeout)")
        .with_callback(move |observer| {
            if let Some(timeout) = s.redis_timeout {
                observer.observe(timeout.as_secs_f64(), &[]);
            }
        })
        .build();

    let s = shared.clone();
    meter
        .u64_observable_gauge("sluice_memory_buckets")
        .with_description("Buckets the memory backend holds")
        .with_callback(move |observer| {
            if let Some(source) = lock(&s.memory_buckets).as_ref() {
                observer.observe(source(), &[]);
            }
        })
        .build();

    let s = shared.clone();
    meter
        .u64_observable_gauge("sluice_redis_breaker_state")
        .with_description(
            "Circuit breaker per Redis endpoint: 1 for its current state, 0 for the others",
        )
        .with_callback(move |observer| {
            for source in lock(&s.breakers).iter() {
                for reading in source() {
                    for state in BreakerState::ALL {
                        observer.observe(
                            u64::from(reading.state == state),
                            &[
                                KeyValue::new("endpoint", reading.endpoint.clone()),
                                KeyValue::new("state", state.as_str()),
                            ],
                        );
                    }
                }
            }
        })
        .build();
}
