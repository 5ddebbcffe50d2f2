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
//! Metrics belong to one server (the server builds them), so tests can run several servers in
//! one process. Logs and traces hang off the process-wide `tracing` subscriber that
//! [`init`] installs once, in `main`.

pub mod admin;
pub mod metrics;
mod observables;
pub mod otlp;
pub mod rules;
pub mod traces;

use std::time::Duration;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

pub use admin::AdminMetrics;
pub use metrics::{BreakerReading, BreakerState, Metrics, MetricsOptions, Outcome, RedisCalls};

use crate::settings::{LogFormat, TelemetryArgs};

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
