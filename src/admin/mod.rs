//! Admin HTTP: liveness, readiness, the active config and metrics; in submodules `/explain`,
//! `/buckets` (a descriptor's buckets), `/top` (who is limited now) and the page at `/`.
//! Read-only unless `serve --admin-write` is set: then `DELETE /buckets` resets buckets, the one
//! route that changes state.

pub mod buckets;
pub mod explain;
pub mod guard;
pub mod listener;
pub mod page;
pub mod top;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json};
use axum::routing::get;

use crate::config::ConfigStore;
use crate::telemetry::Metrics;

/// Readiness inputs, flipped by the server as it starts, degrades and drains.
#[derive(Debug, Default)]
pub struct Readiness {
    config_loaded: AtomicBool,
    backend_ready: AtomicBool,
    draining: AtomicBool,
}

impl Readiness {
    pub fn set_config_loaded(&self, v: bool) {
        self.config_loaded.store(v, Ordering::SeqCst);
    }
    pub fn set_backend_ready(&self, v: bool) {
        self.backend_ready.store(v, Ordering::SeqCst);
    }
    pub fn set_draining(&self, v: bool) {
        self.draining.store(v, Ordering::SeqCst);
    }
    pub fn is_ready(&self) -> bool {
        self.config_loaded.load(Ordering::SeqCst)
            && self.backend_ready.load(Ordering::SeqCst)
            && !self.draining.load(Ordering::SeqCst)
    }
    pub(crate) fn reasons(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.config_loaded.load(Ordering::SeqCst) {
            out.push("config not loaded");
        }
        if !self.backend_ready.load(Ordering::SeqCst) {
            out.push("backend not ready");
        }
        if self.draining.load(Ordering::SeqCst) {
            out.push("draining");
        }
        out
    }
}

/// What the admin handlers read.
#[derive(Clone)]
pub struct AdminState {
    pub config: Arc<ConfigStore>,
    pub readiness: Arc<Readiness>,
    pub metrics: Metrics,
}

/// What the metrics listener (`--metrics-addr`) serves: `/metrics` and the probes (`/healthz`,
/// `/readyz`), nothing that names a tenant.
pub fn metrics_router(metrics: Metrics, readiness: Arc<Readiness>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz).with_state(readiness))
        .route("/metrics", get(metrics_text).with_state(metrics))
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz).with_state(state.readiness.clone()))
        .route("/config", get(config))
        .route(
            "/metrics",
            get(metrics_text).with_state(state.metrics.clone()),
        )
        .with_state(state)
}

/// Prometheus text exposition (format 0.0.4) of every metric; 404 with metrics off.
async fn metrics_text(State(metrics): State<Metrics>) -> impl IntoResponse {
    const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
    match metrics.prometheus_text() {
        Some(Ok(text)) => (StatusCode::OK, [("content-type", CONTENT_TYPE)], text),
        Some(Err(e)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "text/plain; charset=utf-8")],
            format!("cannot render metrics: {e}\n"),
        ),
        None => (
            StatusCode::NOT_FOUND,
            [("content-type", "text/plain; charset=utf-8")],
            "metrics are off (--metrics false)\n".to_owned(),
        ),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(readiness): State<Arc<Readiness>>) -> impl IntoResponse {
    if readiness.is_ready() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}\n", readiness.reasons().join(", ")),
        )
    }
}

/// The active config, plus the last rejected set (until a good one replaces it) so an operator
/// sees why an edit did not take effect.
async fn config(State(state): State<AdminState>) -> Json<serde_json::Value> {
    let mut body = state.config.active().load().to_json();
    let (ok, failed) = state.config.load_counts();
    if let Some(map) = body.as_object_mut() {
        map.insert(
            "loads".into(),
            serde_json::json!({"ok": ok, "failed": failed}),
        );
        if let Some(rejected) = state.config.last_rejected() {
            map.insert(
                "last_rejected".into(),
                serde_json::json!({
                    "source": rejected.source,
                    "errors": rejected.errors.0,
                    "message": rejected.errors.to_string(),
                }),
            );
        }
    }
    Json(body)
}
