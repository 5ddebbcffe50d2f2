//! Which OTLP exporters the standard `OTEL_*` variables ask for.
//!
//! Resolved once, by `main`, into [`OtlpSettings`], so everything downstream (and every test)
//! takes plain values. The SDK itself still reads the variables that only tune an exporter
//! (`OTEL_EXPORTER_OTLP_HEADERS`, `_TIMEOUT`, `_COMPRESSION`,
//! `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`, `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_BSP_*`,
//! `OTEL_TRACES_SAMPLER`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).

use std::collections::HashMap;

use opentelemetry::KeyValue;
use opentelemetry_sdk::Resource;

use crate::settings::OtlpSettings;

/// The OTLP/gRPC default endpoint (the OpenTelemetry Collector's port on this host).
pub const DEFAULT_ENDPOINT: &str = "http://localhost:4317";

impl OtlpSettings {
    /// Reads the process environment.
    pub fn from_process_env() -> OtlpSettings {
        let env: HashMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        OtlpSettings::from_env(&env)
    }

    /// The OpenTelemetry specification's rules: a signal-specific endpoint wins over
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; `OTEL_METRICS_EXPORTER` without `otlp` (e.g. `none` or
    /// `prometheus`) keeps metrics off OTLP. Metrics are pushed only when an endpoint is named;
    /// traces, once switched on with `--tracing`, fall back to [`DEFAULT_ENDPOINT`].
    pub fn from_env(env: &HashMap<String, String>) -> OtlpSettings {
        let get = |name: &str| env.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let disabled = get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let wants_otlp = |var: &str| {
            get(var).is_none_or(|v| v.split(',').any(|e| e.trim().eq_ignore_ascii_case("otlp")))
        };
        let generic = get("OTEL_EXPORTER_OTLP_ENDPOINT");
        let metrics_endpoint = (!disabled && wants_otlp("OTEL_METRICS_EXPORTER"))
            .then(|| get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").or(generic))
            .flatten()
            .map(str::to_owned);
        let traces_endpoint = (!disabled && wants_otlp("OTEL_TRACES_EXPORTER")).then(|| {
            get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                .or(generic)
                .unwrap_or(DEFAULT_ENDPOINT)
                .to_owned()
        });
        OtlpSettings {
            metrics_endpoint,
            traces_endpoint,
            metric_interval: None,
        }
    }
}

/// The resource every signal carries: `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`, with
/// `service.name` defaulting to `sluice` (not the SDK's `unknown_service`).
pub fn resource() -> Resource {
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    let mut builder = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if !named {
        builder = builder.with_service_name("sluice");
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nothing_set_means_no_metric_push() {
        let s = OtlpSettings::from_env(&env(&[]));
        assert_eq!(s.metrics_endpoint, None);
        assert_eq!(s.traces_endpoint.as_deref(), Some(DEFAULT_ENDPOINT));
    }

    #[test]
    fn signal_specific_endpoints_win() {
        let s = OtlpSettings::from_env(&env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://tempo:4317"),
        ]));
        assert_eq!(s.metrics_endpoint.as_deref(), Some("http://collector:4317"));
        assert_eq!(s.traces_endpoint.as_deref(), Some("http://tempo:4317"));
        let s = OtlpSettings::from_env(&env(&[(
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "http://m:4317",
        )]));
        assert_eq!(s.metrics_endpoint.as_deref(), Some("http://m:4317"));
    }

    #[test]
    fn exporter_selection_and_sdk_switch() {
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317");
        let none = OtlpSettings::from_env(&env(&[base, ("OTEL_METRICS_EXPORTER", "none")]));
        assert_eq!(none.metrics_endpoint, None);
        let both =
            OtlpSettings::from_env(&env(&[base, ("OTEL_METRICS_EXPORTER", "prometheus,otlp")]));
        assert!(both.metrics_endpoint.is_some());
        let off = OtlpSettings::from_env(&env(&[base, ("OTEL_SDK_DISABLED", "TRUE")]));
        assert_eq!(off.metrics_endpoint, None);
        assert_eq!(off.traces_endpoint, None);
        let no_traces = OtlpSettings::from_env(&env(&[base, ("OTEL_TRACES_EXPORTER", "none")]));
        assert_eq!(no_traces.traces_endpoint, None);
        assert!(no_traces.metrics_endpoint.is_some());
    }
}
