//! Telemetry flags of `serve`, and the OTLP exporters the standard `OTEL_*` variables ask for.

use std::time::Duration;

use super::flags::{parse_near_limit_ratio, parse_sampling_ratio};

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

    /// Counters per summary of the keys most limited and most active per rule (GET /top on the
    /// admin listener, `sluice top`), 0 to 1024; 0 turns the summaries off. Each rule keeps 4
    /// summaries (limited and active, this window and the one before), for at most 1,000 rules
    /// per replica.
    #[arg(long, env = "SLUICE_TOP_KEYS", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub top_keys: u64,

    /// Window of the top-keys summaries: a view covers the current window and the one before.
    #[arg(long, env = "SLUICE_TOP_WINDOW", value_parser = super::flags::parse_duration, default_value = "60s")]
    pub top_window: Duration,

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

/// Where (and whether) OTLP exports go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OtlpSettings {
    /// Metrics are pushed here; `None`: no OTLP metrics (Prometheus text only).
    pub metrics_endpoint: Option<String>,
    /// Spans go here when tracing is on; `None`: no span export (`OTEL_TRACES_EXPORTER=none`,
    /// `OTEL_SDK_DISABLED=true`).
    pub traces_endpoint: Option<String>,
    /// Push interval of metrics; `None`: `OTEL_METRIC_EXPORT_INTERVAL`, else 60 s.
    pub metric_interval: Option<Duration>,
}

impl Default for TelemetryArgs {
    /// Every flag at its default; no OTLP endpoint.
    fn default() -> Self {
        super::Settings::defaults().telemetry
    }
}
