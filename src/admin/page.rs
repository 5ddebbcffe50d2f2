//! `GET /`: one self-contained HTML page (no external asset, no build step) over the admin
//! listener's JSON endpoints, and `GET /status`, the replica's state in one answer.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::{Html, Json};
use axum::routing::get;
use serde::Serialize;

use super::Readiness;
use crate::backend::breaker::BreakerState;
use crate::resilience::local::Replicas;

/// Each backend endpoint and its circuit breaker's state (empty for the memory backend).
pub type BreakerStates = Arc<dyn Fn() -> Vec<(String, BreakerState)> + Send + Sync>;

/// What the page and `/status` read.
#[derive(Clone)]
pub struct PageState {
    pub readiness: Arc<Readiness>,
    pub replicas: Arc<Replicas>,
    /// `memory`, `redis`, …: the `--backend` in use.
    pub backend: &'static str,
    pub breakers: BreakerStates,
}

/// `GET /status`.
#[derive(Serialize)]
struct Status {
    version: &'static str,
    ready: bool,
    not_ready: Vec<&'static str>,
    backend: &'static str,
    replicas: u64,
    replicas_discovered: bool,
    breakers: Vec<Breaker>,
}

#[derive(Serialize)]
struct Breaker {
    endpoint: String,
    state: &'static str,
}

pub fn router(state: PageState) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/status", get(status))
        .with_state(state)
}

async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

async fn status(State(state): State<PageState>) -> Json<Status> {
    Json(Status {
        version: env!("CARGO_PKG_VERSION"),
        ready: state.readiness.is_ready(),
        not_ready: state.readiness.reasons(),
        backend: state.backend,
        replicas: state.replicas.current(),
        replicas_discovered: state.replicas.is_discovered(),
        breakers: (state.breakers)()
            .into_iter()
            .map(|(endpoint, s)| Breaker {
                endpoint,
                state: s.as_str(),
            })
            .collect(),
    })
}
