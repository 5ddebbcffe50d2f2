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

use super::otlp;
use super::rules::{Counter, RuleMetrics};
use super::traces;
use crate::backend::BackendError;
use crate::backend::redis::RedisObserver;
use crate::clock::Stopwatch;
use crate::config::{Config, ConfigStore};
use crate::decision::Decision;
use crate::lease::LeaseStore;
use crate::limiter::SlotEvent;
use crate::quota::{EndReason, Ignored, QuotaStats};
use crate::request::LimitRequest;
use crate::resilience::local::Replicas;
use crate::security::listener::{ConnectionStats, Refusal};
use crate::settings::{BackendKind, OtlpSettings, Settings};
use crate::validate::Problem;

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
pub use crate::backend::breaker::BreakerState;

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

type BreakerSource = Box<dyn Fn() -> Vec<BreakerReading> + Send + Sync>;
type GaugeSource = Box<dyn Fn() -> u64 + Send + Sync>;
/// Calls its argument with each point of a labelled counter.
type PointsSource = Box<dyn Fn(&mut dyn FnMut(u64, &[KeyValue])) + Send + Sync>;

/// The atomics and sources the observable instruments read.
struct Shared {
    rules: RuleMetrics,
    outcomes: [AtomicU64; 6],
    unknown_domain: AtomicU64,
    problems: [AtomicU64; Problem::ALL.len()],
    redis_errors: [AtomicU64; 5],
    redis_keys_repaired: AtomicU64,
    config: Arc<ConfigStore>,
    memory_buckets: Mutex<Option<GaugeSource>>,
    memory_refused: Mutex<Option<GaugeSource>>,
    breakers: Mutex<Vec<BreakerSource>>,
    redis_timeout: Option<Duration>,
    leases: Mutex<Option<Arc<LeaseStore>>>,
    connections: Mutex<Option<Arc<ConnectionStats>>>,
    quota: Mutex<Option<Arc<QuotaStats>>>,
    replicas: Mutex<Option<Arc<Replicas>>>,
    slots: Mutex<Option<PointsSource>>,
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
            problems: Default::default(),
            redis_errors: Default::default(),
            redis_keys_repaired: AtomicU64::new(0),
            config: store,
            memory_buckets: Mutex::new(None),
            memory_refused: Mutex::new(None),
            breakers: Mutex::new(Vec::new()),
            redis_timeout: options.redis_timeout,
            leases: Mutex::new(None),
            connections: Mutex::new(None),
            quota: Mutex::new(None),
            replicas: Mutex::new(None),
            slots: Mutex::new(None),
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

    /// Feeds `sluice_in_flight_slots_total` and `sluice_reservations_total` from `source`, which calls its argument with each
    /// rule's count and labels (`domain`, `key`, `event`).
    pub fn observe_slots(
        &self,
        source: impl Fn(&mut dyn FnMut(u64, &[KeyValue])) + Send + Sync + 'static,
    ) {
        if let Some(inner) = &self.0 {
            *lock(&inner.shared.slots) = Some(Box::new(source));
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
        if let Err(e) = outcome
            && let Some(i) = REDIS_ERROR_KINDS.iter().position(|k| *k == e.kind())
        {
            inner.shared.redis_errors[i].fetch_add(1, Ordering::Relaxed);
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

/// Where an observable's reader reports its points: a value and its attributes.
type Points<'a, T> = &'a mut dyn FnMut(T, &[KeyValue]);

/// The instrument kind of an observable, with the function that reads its points at collection
/// time.
#[derive(Clone, Copy)]
enum Reading {
    Counter(fn(&Shared, Points<'_, u64>)),
    Gauge(fn(&Shared, Points<'_, u64>)),
    GaugeF64(fn(&Shared, Points<'_, f64>)),
}

/// One observable instrument (no unit: the exports carry none).
struct Observable {
    name: &'static str,
    description: &'static str,
    reading: Reading,
}

/// Every observable but the per-rule counters ([`Counter::ALL`]).
const OBSERVABLES: &[Observable] = &[
    Observable {
        name: "ratelimit_service_total_requests",
        description: "ShouldRateLimit calls, by outcome (ok, over_limit, or the gRPC error)",
        reading: Reading::Counter(|s, points| {
            for outcome in Outcome::ALL {
                points(
                    s.outcomes[outcome.index()].load(Ordering::Relaxed),
                    &[
                        KeyValue::new("grpc_method", "ShouldRateLimit"),
                        KeyValue::new("outcome", outcome.as_str()),
                    ],
                );
            }
        }),
    },
    Observable {
        name: "ratelimit_service_should_rate_limit_error",
        description: "ShouldRateLimit calls that failed: redis_error (backend unavailable and the failure policy is error), service_error (invalid request)",
        reading: Reading::Counter(|s, points| {
            let n = |o: Outcome| s.outcomes[o.index()].load(Ordering::Relaxed);
            points(
                n(Outcome::Unavailable) + n(Outcome::ResourceExhausted),
                &[KeyValue::new("err_type", "redis_error")],
            );
            points(
                n(Outcome::InvalidArgument) + n(Outcome::Error),
                &[KeyValue::new("err_type", "service_error")],
            );
        }),
    },
    Observable {
        name: "ratelimit_service_config_load_success",
        description: "Config sets activated (the initial load included)",
        reading: Reading::Counter(|s, points| points(s.config.load_counts().0, &[])),
    },
    Observable {
        name: "ratelimit_service_config_load_error",
        description: "Config sets rejected (the last good config stayed active)",
        reading: Reading::Counter(|s, points| points(s.config.load_counts().1, &[])),
    },
    Observable {
        name: "sluice_config_last_load_failed",
        description: "1 while the most recent config set was rejected (until a good one is activated)",
        reading: Reading::Gauge(|s, points| {
            points(u64::from(s.config.last_rejected().is_some()), &[]);
        }),
    },
    Observable {
        name: "sluice_config_info",
        description: "The active config: digest (the version replicas can be compared by), domains and rules",
        reading: Reading::Gauge(|s, points| {
            let active = s.config.active().load();
            points(
                1,
                &[
                    KeyValue::new("digest", active.digest().to_owned()),
                    KeyValue::new("domains", active.domains().count() as i64),
                    KeyValue::new("rules", active.rule_count() as i64),
                ],
            );
        }),
    },
    Observable {
        name: "sluice_request_problems_total",
        description: "Requests Envoy can send that were not decided as sent, by problem: refused past a bound its route config reaches (message_bytes, descriptors, entries, key_bytes: INVALID_ARGUMENT, which Envoy lets through by default) or decided without their limit override (override_unit)",
        reading: Reading::Counter(|s, points| {
            for problem in Problem::ALL {
                points(
                    s.problems[problem.index()].load(Ordering::Relaxed),
                    &[KeyValue::new("problem", problem.as_str())],
                );
            }
        }),
    },
    Observable {
        name: "sluice_unknown_domain_total",
        description: "ShouldRateLimit calls for a domain the config does not have (answered OK)",
        reading: Reading::Counter(|s, points| {
            points(s.unknown_domain.load(Ordering::Relaxed), &[]);
        }),
    },
    Observable {
        name: "sluice_degraded_decisions_total",
        description: "Descriptors decided by a failure policy because the backend could not answer",
        reading: Reading::Counter(|s, points| s.rules.each_degraded(points)),
    },
    Observable {
        name: "sluice_in_flight_slots_total",
        description: "In-flight caps' slots by event: taken, released (a holder's release freed its slot), released_nothing (a release that freed nothing: a refused request's, or a slot max_hold had expired); taken - released over a span counts the slots max_hold freed",
        reading: Reading::Counter(|s, points| read_holders(s, &SlotEvent::IN_FLIGHT, points)),
    },
    Observable {
        name: "sluice_reservations_total",
        description: "Reservations (`reserve`) by event: reserved (a request's maximum taken up front), settled (its stream-done call gave back the unused part or charged the overrun); reserved - settled over a span counts the reservations that lapsed unsettled after max_hold",
        reading: Reading::Counter(|s, points| read_holders(s, &SlotEvent::RESERVATION, points)),
    },
    Observable {
        name: "sluice_lease_local_total",
        description: "Hits of rules with `lease` paid from a local lease, with no backend call",
        reading: Reading::Counter(|s, points| read_leases(s, LeaseStore::local_total, points)),
    },
    Observable {
        name: "sluice_lease_refill_total",
        description: "Backend calls that refilled a lease (a lease take that was granted)",
        reading: Reading::Counter(|s, points| read_leases(s, LeaseStore::refill_total, points)),
    },
    Observable {
        name: "sluice_lease_returned_tokens_total",
        description: "Leased tokens handed back to the backend: expired, or at shutdown",
        reading: Reading::Counter(|s, points| read_leases(s, LeaseStore::returned_total, points)),
    },
    Observable {
        name: "sluice_redis_errors_total",
        description: "Redis decisions that failed, by kind",
        reading: Reading::Counter(|s, points| {
            if s.redis_timeout.is_none() {
                return;
            }
            for (i, kind) in REDIS_ERROR_KINDS.iter().enumerate() {
                points(
                    s.redis_errors[i].load(Ordering::Relaxed),
                    &[KeyValue::new("kind", *kind)],
                );
            }
        }),
    },
    Observable {
        name: "sluice_redis_keys_repaired_total",
        description: "Redis keys found holding another type than sluice writes there (a bucket, the probe's, the heartbeat's set): deleted and started afresh, never counted as a Redis failure",
        reading: Reading::Counter(|s, points| {
            if s.redis_timeout.is_some() {
                points(s.redis_keys_repaired.load(Ordering::Relaxed), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_redis_timeout_seconds",
        description: "Deadline of one Redis decision (--redis-timeout)",
        reading: Reading::GaugeF64(|s, points| {
            if let Some(timeout) = s.redis_timeout {
                points(timeout.as_secs_f64(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_memory_buckets",
        description: "Buckets the memory backend holds",
        reading: Reading::Gauge(|s, points| {
            if let Some(source) = lock(&s.memory_buckets).as_ref() {
                points(source(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_replicas",
        description: "Replicas the `local` failure policy divides each limit by: --replicas when set, else the live replicas last counted through the Redis heartbeat (kept while Redis is away)",
        reading: Reading::Gauge(|s, points| {
            if let Some(replicas) = lock(&s.replicas).as_ref() {
                points(replicas.current(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_connections_open",
        description: "Open gRPC connections, pending TLS handshakes included (bounded by --max-connections)",
        reading: Reading::Gauge(|s, points| {
            if let Some(stats) = lock(&s.connections).as_ref() {
                points(stats.open(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_connections_rejected_total",
        description: "gRPC connections closed before carrying an RPC: cap (--max-connections reached at accept), handshake_timeout (TLS, the HTTP/2 preface or its SETTINGS not in within the deadline)",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.connections).as_ref() {
                for reason in Refusal::ALL {
                    points(
                        stats.refused(reason),
                        &[KeyValue::new("reason", reason.as_str())],
                    );
                }
            }
        }),
    },
    Observable {
        name: "sluice_rlqs_streams_open",
        description: "Open RLQS streams (StreamRateLimitQuotas), one per data plane and domain, counted from the moment they are accepted (before their first report)",
        reading: Reading::Gauge(|s, points| read_quota(s, QuotaStats::streams, points)),
    },
    Observable {
        name: "sluice_rlqs_buckets_subscribed",
        description: "RLQS bucket ids subscribed on this replica's open streams",
        reading: Reading::Gauge(|s, points| read_quota(s, QuotaStats::subscriptions, points)),
    },
    Observable {
        name: "sluice_rlqs_assignments_sent_total",
        description: "RLQS bucket actions handed to a stream's transport, by kind: allow_all, deny_all, token_bucket (each push re-sends a data plane's current one, and standing ones are re-sent before they expire), abandon",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.quota).as_ref() {
                for kind in QuotaStats::ACTION_KINDS {
                    points(stats.sent(kind), &[KeyValue::new("kind", kind)]);
                }
            }
        }),
    },
    Observable {
        name: "sluice_rlqs_assignments_superseded_total",
        description: "RLQS bucket actions replaced by a newer one for the same bucket before the data plane read them (a slow reader gets every bucket's newest action, never a queue)",
        reading: Reading::Counter(|s, points| read_quota(s, QuotaStats::superseded, points)),
    },
    Observable {
        name: "sluice_rlqs_stream_ends_total",
        description: "RLQS streams ended, by reason: half_closed (the last report answered, OK), cancelled (the data plane reset it or went away), too_large (a report over --max-message-bytes, RESOURCE_EXHAUSTED), invalid_report (no or another domain, an empty stream, INVALID_ARGUMENT), no_first_report (--rlqs-first-report-timeout, DEADLINE_EXCEEDED), stopping (UNAVAILABLE)",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.quota).as_ref() {
                for reason in EndReason::ALL {
                    points(
                        stats.ended(reason),
                        &[KeyValue::new("reason", reason.as_str())],
                    );
                }
            }
        }),
    },
    Observable {
        name: "sluice_rlqs_reported_requests_total",
        description: "Requests the data planes reported, by result (allowed, denied)",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.quota).as_ref() {
                points(
                    stats.reported_allowed(),
                    &[KeyValue::new("result", "allowed")],
                );
                points(
                    stats.reported_denied(),
                    &[KeyValue::new("result", "denied")],
                );
            }
        }),
    },
    Observable {
        name: "sluice_rlqs_grant_slack_total",
        description: "Requests the data planes reported admitting beyond what was prepaid for them (in flight with a report, a failure policy's assignment, a data plane not enforcing), past one bucket capacity of debt",
        reading: Reading::Counter(|s, points| read_quota(s, QuotaStats::slack, points)),
    },
    Observable {
        name: "sluice_rlqs_reports_ignored_total",
        description: "RLQS bucket reports ignored, by reason: too_many_buckets (--rlqs-max-buckets-per-stream), too_many_subscriptions (--rlqs-max-subscriptions), invalid_bucket (empty, too many entries, empty or oversized key or value), absurd_count",
        reading: Reading::Counter(|s, points| {
            if let Some(stats) = lock(&s.quota).as_ref() {
                for reason in Ignored::ALL {
                    points(
                        stats.ignored(reason),
                        &[KeyValue::new("reason", reason.as_str())],
                    );
                }
            }
        }),
    },
    Observable {
        name: "sluice_memory_buckets_refused_total",
        description: "New buckets the memory backend had no room for (--memory-max-buckets or the rule's --memory-max-buckets-per-rule reached, every bucket still counting): their hits were answered by the rule's failure policy",
        reading: Reading::Counter(|s, points| {
            if let Some(source) = lock(&s.memory_refused).as_ref() {
                points(source(), &[]);
            }
        }),
    },
    Observable {
        name: "sluice_redis_breaker_state",
        description: "Circuit breaker per Redis endpoint: 1 for its current state, 0 for the others",
        reading: Reading::Gauge(|s, points| {
            for source in lock(&s.breakers).iter() {
                for reading in source() {
                    for state in BreakerState::ALL {
                        points(
                            u64::from(reading.state == state),
                            &[
                                KeyValue::new("endpoint", reading.endpoint.clone()),
                                KeyValue::new("state", state.as_str()),
                            ],
                        );
                    }
                }
            }
        }),
    },
];

/// A `sluice_rlqs_*` value, once the RLQS side is observed.
fn read_quota(s: &Shared, read: fn(&QuotaStats) -> u64, points: Points<'_, u64>) {
    if let Some(stats) = lock(&s.quota).as_ref() {
        points(read(stats), &[]);
    }
}

/// A `sluice_lease_*` counter, once the limiter's lease store is observed.
fn read_leases(s: &Shared, read: fn(&LeaseStore) -> u64, points: Points<'_, u64>) {
    if let Some(store) = lock(&s.leases).as_ref() {
        points(read(store), &[]);
    }
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
    for observable in OBSERVABLES {
        let s = shared.clone();
        let (name, description) = (observable.name, observable.description);
        match observable.reading {
            Reading::Counter(read) => {
                meter
                    .u64_observable_counter(name)
                    .with_description(description)
                    .with_callback(move |o| read(&s, &mut |v, attrs| o.observe(v, attrs)))
                    .build();
            }
            Reading::Gauge(read) => {
                meter
                    .u64_observable_gauge(name)
                    .with_description(description)
                    .with_callback(move |o| read(&s, &mut |v, attrs| o.observe(v, attrs)))
                    .build();
            }
            Reading::GaugeF64(read) => {
                meter
                    .f64_observable_gauge(name)
                    .with_description(description)
                    .with_callback(move |o| read(&s, &mut |v, attrs| o.observe(v, attrs)))
                    .build();
            }
        }
    }
}

/// The points of the holder events in `events` (one metric's family) from the limiter's
/// [`SlotStats`](crate::limiter::SlotStats) source.
fn read_holders(s: &Shared, events: &[SlotEvent], points: &mut dyn FnMut(u64, &[KeyValue])) {
    let source = lock(&s.slots);
    let Some(source) = source.as_ref() else {
        return;
    };
    source(&mut |value, labels| {
        let ours = labels.iter().any(|l| {
            l.key.as_str() == "event" && events.iter().any(|e| l.value.as_str() == e.as_str())
        });
        if ours {
            points(value, labels);
        }
    });
}
