//! An in-test OTLP/gRPC collector: a tonic server with the OpenTelemetry collector's metrics and
//! trace services (from `opentelemetry-proto`) that keeps every export for assertions.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::Metric;
use opentelemetry_proto::tonic::trace::v1::Span;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// What the collector received so far.
#[derive(Clone, Default)]
pub struct Received {
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metrics.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.traces.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// A running collector on a loopback port; stops on drop.
pub struct Collector {
    pub addr: SocketAddr,
    received: Received,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Collector {
    pub async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Received::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(MetricsServiceServer::new(received.clone()))
            .add_service(TraceServiceServer::new(received.clone()))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            );
        let task = tokio::spawn(async move {
            server.await.expect("collector serves");
        });
        Collector {
            addr,
            received,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// `http://127.0.0.1:<port>`, for OTEL_EXPORTER_OTLP_ENDPOINT.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received, in arrival order.
    pub fn spans(&self) -> Vec<Span> {
        let traces = self.received.traces.lock().unwrap();
        traces
            .iter()
            .flat_map(|r| &r.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| s.spans.iter().cloned())
            .collect()
    }

    /// Every metric of every export, with the `service.name` of its resource, in arrival order.
    pub fn metrics(&self) -> Vec<(String, Metric)> {
        let metrics = self.received.metrics.lock().unwrap();
        let mut out = Vec::new();
        for export in metrics.iter() {
            for rm in &export.resource_metrics {
                let service = rm
                    .resource
                    .as_ref()
                    .and_then(|r| attr(&r.attributes, "service.name"))
                    .unwrap_or_default();
                for sm in &rm.scope_metrics {
                    for m in &sm.metrics {
                        out.push((service.clone(), m.clone()));
                    }
                }
            }
        }
        out
    }

    pub fn metric_exports(&self) -> usize {
        self.received.metrics.lock().unwrap().len()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The value of attribute `key` as text (strings as they are, numbers and booleans printed).
pub fn attr(attrs: &[KeyValue], key: &str) -> Option<String> {
    let value = attrs.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    text(value)
}

fn text(value: &AnyValue) -> Option<String> {
    match value.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}
