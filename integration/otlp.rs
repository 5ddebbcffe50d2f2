//! OTLP export against an in-test collector (a tonic server with `opentelemetry-proto`'s
//! services): spans of a Redis-backed ShouldRateLimit, with the caller's W3C `traceparent` as
//! parent and the sampling ratio applied, and the metrics pushed with their names and attributes.
//!
//! One test in this binary: it installs the process-wide tracing subscriber.

use std::time::Duration;

use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use sluice::settings::TelemetryArgs;
use sluice::settings::{BackendKind, LogFormat};
use sluice::telemetry;
use sluice_harness::RedisServer;
use sluice_harness::otlp::{Collector, attr};
use sluice_harness::rls::{desc, req};
use sluice_harness::sluice::TestServer;

const CONFIG: &str = "domain: otlp\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn traced(
    flags: &str,
) -> tonic::Request<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest> {
    let mut request = tonic::Request::new(req("otlp", vec![desc(&[("client", "a")])]));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{TRACE_ID}-{CALLER_SPAN}-{flags}")
            .parse()
            .unwrap(),
    );
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_and_metrics_reach_an_otlp_collector() {
    let collector = Collector::start().await;
    let redis = RedisServer::start();

    // Ratio 0: only a caller's sampled traceparent gets a request traced.
    let mut args = TelemetryArgs {
        tracing: true,
        trace_sampling_ratio: Some(0.0),
        ..TelemetryArgs::default()
    };
    args.otlp.traces_endpoint = Some(collector.endpoint());
    let guard = telemetry::init("warn", LogFormat::Text, &args);

    let (url, endpoint) = (redis.url(), collector.endpoint());
    let mut s = TestServer::start_with(&[("otlp.yaml", CONFIG)], move |settings| {
        settings.backend = BackendKind::Redis;
        settings.redis_url = vec![url];
        settings.telemetry.otlp.metrics_endpoint = Some(endpoint);
        settings.telemetry.otlp.metric_interval = Some(Duration::from_millis(200));
    })
    .await;
    s.client.should_rate_limit(traced("01")).await.unwrap();
    // Not sampled by the caller, and no caller at all: neither is traced.
    s.client.should_rate_limit(traced("00")).await.unwrap();
    for _ in 0..3 {
        s.ok(req("otlp", vec![desc(&[("client", "b")])])).await;
    }
    // Stopping flushes the last metric export; the guard flushes the spans.
    s.stop().await;
    guard.shutdown().await;

    assert_spans_traced(&collector, &redis.addr());
    assert_metrics_pushed(&collector);
    collector.stop().await;
}

/// The one traced request: its server span, child of the caller's, and its Redis client span.
fn assert_spans_traced(collector: &Collector, redis_addr: &str) {
    let spans = collector.spans();
    assert_eq!(spans.len(), 2, "{spans:#?}");
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .expect("server span");
    let client = spans
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .expect("client span");
    assert_eq!(
        server.name,
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    );
    assert_eq!(hex(&server.trace_id), TRACE_ID);
    assert_eq!(hex(&server.parent_span_id), CALLER_SPAN);
    let server_attr = |k: &str| attr(&server.attributes, k);
    assert_eq!(server_attr("rpc.system").as_deref(), Some("grpc"));
    assert_eq!(
        server_attr("rpc.service").as_deref(),
        Some("envoy.service.ratelimit.v3.RateLimitService")
    );
    assert_eq!(server_attr("ratelimit.domain").as_deref(), Some("otlp"));
    assert_eq!(server_attr("ratelimit.descriptors").as_deref(), Some("1"));
    assert_eq!(server_attr("ratelimit.outcome").as_deref(), Some("ok"));
    assert_eq!(server_attr("rpc.grpc.status_code").as_deref(), Some("0"));

    assert_eq!(client.name, "EVALSHA");
    assert_eq!(client.trace_id, server.trace_id);
    assert_eq!(client.parent_span_id, server.span_id);
    let client_attr = |k: &str| attr(&client.attributes, k);
    assert_eq!(client_attr("db.system").as_deref(), Some("redis"));
    assert_eq!(client_attr("db.operation.name").as_deref(), Some("EVALSHA"));
    assert_eq!(client_attr("db.redis.keys").as_deref(), Some("1"));
    assert_eq!(client_attr("server.address").as_deref(), Some(redis_addr));
}

/// The pushed metrics after five requests: per-rule hits, requests, Redis call latencies.
fn assert_metrics_pushed(collector: &Collector) {
    assert!(collector.metric_exports() >= 1);
    let metrics = collector.metrics();
    assert!(metrics.iter().all(|(service, _)| service == "sluice"));
    // Cumulative: the last export holds the totals.
    let last = |name: &str| {
        metrics
            .iter()
            .rev()
            .find(|(_, m)| m.name == name)
            .map(|(_, m)| m.clone())
            .unwrap_or_else(|| {
                panic!(
                    "no {name} in {:?}",
                    metrics.iter().map(|(_, m)| &m.name).collect::<Vec<_>>()
                )
            })
    };
    let sum_value = |name: &str, attrs: &[(&str, &str)]| -> i64 {
        let Some(metric::Data::Sum(sum)) = last(name).data else {
            panic!("{name} is not a sum");
        };
        assert!(sum.is_monotonic, "{name}");
        let point = sum
            .data_points
            .iter()
            .find(|p| {
                attrs
                    .iter()
                    .all(|(k, v)| attr(&p.attributes, k).as_deref() == Some(*v))
            })
            .unwrap_or_else(|| panic!("{name} {attrs:?}: {:?}", sum.data_points));
        match point.value {
            Some(number_data_point::Value::AsInt(n)) => n,
            other => panic!("{name}: {other:?}"),
        }
    };
    assert_eq!(
        sum_value(
            "ratelimit_service_rate_limit_total_hits",
            &[("domain", "otlp"), ("key", "client")]
        ),
        5
    );
    assert_eq!(
        sum_value(
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit"), ("outcome", "ok")]
        ),
        5
    );
    let Some(metric::Data::Histogram(redis_latency)) =
        last("sluice_redis_call_duration_seconds").data
    else {
        panic!("sluice_redis_call_duration_seconds is not a histogram");
    };
    assert_eq!(redis_latency.data_points[0].count, 5);
}
