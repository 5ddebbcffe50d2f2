//! Telemetry: metrics (OpenTelemetry SDK; Prometheus text on the admin listener, OTLP/gRPC when
//! configured), traces (OTLP/gRPC, off by default) and logs (stderr, text or JSON).
//!
//! - [`metrics`]: the [`Metrics`] handle the service and the Redis backend record into; with
//!   metrics off it is empty and every call returns at once.
//! - [`rules`]: the per-rule decision counters (envoyproxy/ratelimit's
//!   `ratelimit_service_rate_limit_*` family), resolved per rule when a config is activated.
//! - [`traces`]: the span per `ShouldRateLimit` and per Redis call, W3C `traceparent` intake.
//! - [`otlp`]: which OTLP exporters the standard `OTEL_*` variables ask for.
//!
//! Metrics belong to one server ([`crate::server::start`] builds them), so tests can run several
//! servers in one process. Logs and traces hang off the process-wide `tracing` subscriber that
//! [`init`] installs once, in `main`.

pub mod metrics;
pub mod otlp;
pub mod rules;
pub mod traces;

use std::time::Duration;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

pub use metrics::{BreakerReading, BreakerState, Metrics, MetricsOptions, Outcome, RedisCalls};
pub use otlp::OtlpSettings;

use crate::settings::LogFormat;

/// Telemetry settings of `sluice serve`; every flag also reads `SLUICE_<FLAG_IN_CAPS>`.
#[derive(Clone, Debug, clap::Args)]
pub struct TelemetryArgs {
    /// Keep metrics: serve them at GET /metrics on the admin listener and export them by OTLP
    /// when OTEL_EXPORTER_OTLP_ENDPOINT is set. `false` removes all metric work from requests.
    #[arg(long = "metrics", env = "SLUICE_METRICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub metrics: bool,

    /// Share of a bucket's capacity that, once used, counts hits as near limit
    /// (ratelimit_service_rate_limit_near_limit); in (0, 1].
    #[arg(long, env = "SLUICE_NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_near_limit_ratio)]
    pub near_limit_ratio: f64,

    /// Most distinct descriptor values one `detailed_metric` rule gets its own series for; later
    /// values are counted in the rule's own series.
    #[arg(
        long,
        env = "SLUICE_METRICS_DETAILED_MAX_VALUES",
        default_value_t = 100
    )]
    pub metrics_detailed_max_values: usize,

    /// Export traces by OTLP/gRPC (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_ENDPOINT, default http://localhost:4317): a span per ShouldRateLimit
    /// and per Redis call.
    #[arg(long = "tracing", env = "SLUICE_TRACING", default_value_t = false, action = clap::ArgAction::Set)]
    pub tracing: bool,

    /// Share of requests without a sampled parent that are traced, in [0, 1]. A W3C
    /// `traceparent` from the caller decides for its own requests. Unset: OTEL_TRACES_SAMPLER
    /// (and _ARG), else every request.
    #[arg(long, env = "SLUICE_TRACE_SAMPLING_RATIO", value_parser = parse_sampling_ratio)]
    pub trace_sampling_ratio: Option<f64>,

    /// OTLP endpoints and intervals, read from the standard `OTEL_*` variables by `main`
    /// ([`OtlpSettings::from_env`]); tests set them directly.
    #[arg(skip)]
    pub otlp: OtlpSettings,
}

impl Default for TelemetryArgs {
    fn default() -> Self {
        TelemetryArgs {
            metrics: true,
            near_limit_ratio: 0.8,
            metrics_detailed_max_values: 100,
            tracing: false,
            trace_sampling_ratio: None,
            otlp: OtlpSettings::default(),
        }
    }
}

fn parse_near_limit_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!("`{s}` is not a ratio in (0, 1]")),
    }
}

fn parse_sampling_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("`{s}` is not a ratio in [0, 1]")),
    }
}

/// What [`init`] started; [`TelemetryGuard::shutdown`] flushes the spans still buffered.
#[derive(Default)]
pub struct TelemetryGuard {
    tracer: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Exports what is buffered and stops the exporter (off the async workers: it blocks).
    pub async fn shutdown(self) {
        if let Some(provider) = self.tracer {
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = provider.shutdown_with_timeout(Duration::from_secs(5)) {
                    tracing::warn!(error = %e, "trace exporter shutdown failed");
                }
            })
            .await;
        }
    }
}

/// Installs the process-wide subscriber: logs to stderr (`RUST_LOG`, when set, wins over
/// `level`) and, with `--tracing`, the OTLP span exporter. Must run inside a Tokio runtime
/// (the gRPC exporter's channel lives on it). An exporter that cannot be built is logged and
/// tracing stays off; logging never fails the start.
pub fn init(level: &str, format: LogFormat, args: &TelemetryArgs) -> TelemetryGuard {
    let tracer = if args.tracing {
        match traces::provider(args) {
            Ok(provider) => Some(provider),
            Err(e) => {
                eprintln!("sluice: tracing disabled: {e}");
                None
            }
        }
    } else {
        None
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![log_layer(level, format)];
    if let Some(provider) = &tracer {
        layers.push(traces::layer(provider));
    }
    if let Err(e) = tracing_subscriber::registry().with(layers).try_init() {
        eprintln!("sluice: logging already initialised: {e}");
    }
    TelemetryGuard { tracer }
}

fn log_layer(level: &str, format: LogFormat) -> Box<dyn Layer<Registry> + Send + Sync> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"))
        // Trace spans are for the exporter; a verbose log level must not turn them into log
        // context (or make them cost anything when tracing is off).
        .add_directive(traces::OFF_FOR_LOGS.parse().expect("static directive"));
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Text => layer.with_filter(filter).boxed(),
        LogFormat::Json => layer.json().with_filter(filter).boxed(),
    }
}
