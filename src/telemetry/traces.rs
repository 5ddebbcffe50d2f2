//! Traces: a span per `ShouldRateLimit` (server) with a child span per Redis call (client),
//! exported by OTLP/gRPC when `--tracing` is on.
//!
//! The spans are `tracing` spans under the target [`TARGET`], turned into OpenTelemetry spans by
//! `tracing-opentelemetry`. Only the exporter's layer enables that target (the log layer never
//! does), so with tracing off a span is disabled at its callsite — creating one costs an atomic
//! load, and nothing else below (parent extraction, attributes) runs.
//!
//! Sampling is parent-based: a caller's W3C `traceparent` (in the gRPC metadata) decides for its
//! request; requests without one are sampled at `--trace-sampling-ratio`.

use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::{Layer, Registry};

use super::TelemetryArgs;
use super::observables::Outcome;
use crate::backend::BackendError;
use crate::decision::{Code, Decision};
use crate::request::LimitRequest;

/// The `tracing` target of every exported span.
pub const TARGET: &str = "sluice::otel";

/// The log layer's directive that keeps trace spans out of logs.
pub(super) const OFF_FOR_LOGS: &str = "sluice::otel=off";

const RPC_SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The OTLP span pipeline: batch export to the configured endpoint, parent-based sampling.
pub(super) fn provider(args: &TelemetryArgs) -> Result<SdkTracerProvider, String> {
    let endpoint = args.otlp.traces_endpoint.as_ref().ok_or_else(|| {
        "no trace exporter: OTEL_TRACES_EXPORTER or OTEL_SDK_DISABLED switch it off".to_owned()
    })?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|e| format!("OTLP span exporter for {endpoint}: {e}"))?;
    let mut builder = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(super::otlp::resource());
    // Without the flag the SDK's default applies: OTEL_TRACES_SAMPLER(_ARG), else
    // parentbased_always_on.
    if let Some(ratio) = args.trace_sampling_ratio {
        builder = builder.with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            ratio,
        ))));
    }
    Ok(builder.build())
}

/// The layer that turns [`TARGET`] spans into OpenTelemetry spans (and sees nothing else).
pub(super) fn layer(provider: &SdkTracerProvider) -> Box<dyn Layer<Registry> + Send + Sync> {
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("sluice"))
        .with_location(false)
        .with_threads(false)
        .with_target(false)
        .with_level(false)
        .with_tracked_inactivity(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE))
        .boxed()
}

/// The server span of one `ShouldRateLimit`; disabled unless tracing is on.
pub fn rpc_span() -> Span {
    tracing::info_span!(
        target: TARGET,
        "ShouldRateLimit",
        otel.name = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = RPC_SERVICE,
        rpc.method = "ShouldRateLimit",
        rpc.grpc.status_code = Empty,
        ratelimit.domain = Empty,
        ratelimit.descriptors = Empty,
        ratelimit.outcome = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    )
}

/// Makes the caller's W3C trace context (`traceparent`, `tracestate`) the span's parent.
pub fn adopt_remote_parent(span: &Span, metadata: &tonic::metadata::MetadataMap) {
    if span.is_disabled() || metadata.get("traceparent").is_none() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&MetadataExtractor(metadata));
    // Fails only for a span already started, which a fresh one is not.
    let _ = span.set_parent(parent);
}

/// Domain and descriptor count, once the request is decoded.
pub fn record_request(span: &Span, request: &LimitRequest) {
    if span.is_disabled() {
        return;
    }
    span.record("ratelimit.domain", request.domain.as_str());
    span.record("ratelimit.descriptors", request.descriptors.len() as i64);
}

/// The answer: OK or OVER_LIMIT (gRPC status OK either way).
pub fn record_decision(span: &Span, decision: &Decision) {
    if span.is_disabled() {
        return;
    }
    let outcome = match decision.overall {
        Code::Ok => Outcome::Ok,
        Code::OverLimit => Outcome::OverLimit,
    };
    span.record("ratelimit.outcome", outcome.as_str());
    span.record("rpc.grpc.status_code", 0_i64);
}

/// A gRPC error: the span's status is ERROR with the message.
pub fn record_error(span: &Span, status: &tonic::Status) {
    if span.is_disabled() {
        return;
    }
    span.record("ratelimit.outcome", Outcome::of_status(status).as_str());
    span.record("rpc.grpc.status_code", status.code() as i64);
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", status.message());
}

/// The client span of one script call: `keys` keys, on `server` (`host:port`) when known, or
/// Cluster `slot`.
pub fn redis_span(keys: usize, server: Option<&str>, slot: Option<u16>) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "EVALSHA",
        otel.kind = "client",
        db.system = "redis",
        db.system.name = "redis",
        db.operation.name = "EVALSHA",
        db.redis.keys = keys as i64,
        server.address = Empty,
        db.redis.cluster_slot = Empty,
        error.type = Empty,
        otel.status_code = Empty,
        otel.status_description = Empty,
    );
    if !span.is_disabled() {
        if let Some(server) = server {
            span.record("server.address", server);
        }
        if let Some(slot) = slot {
            span.record("db.redis.cluster_slot", i64::from(slot));
        }
    }
    span
}

/// Marks a failed script call on its span.
pub fn record_redis_error(span: &Span, error: &BackendError) {
    if span.is_disabled() {
        return;
    }
    span.record("error.type", error.kind());
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", error.to_string().as_str());
}

/// Reads W3C trace-context headers out of gRPC metadata.
struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}
