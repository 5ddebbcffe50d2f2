//! The example's service: one HTTP route whose callers are limited per API key by the engine.
//! Kept apart from `main.rs` so `integration/embedded.rs` drives this same code over HTTP.

use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use sluice_engine::backend::Backend;
use sluice_engine::config::{Config, ConfigErrors, load_sources};
use sluice_engine::decision::Code;
use sluice_engine::limiter::{Limiter, LimiterOptions};
use sluice_engine::request::{Entry, LimitRequest, RequestDescriptor};

/// The limits, in the descriptor format sluice and envoyproxy/ratelimit read: 3 requests a
/// minute per API key, 100 a minute for the whole service.
pub const RULES: &str = "
domain: example
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: service
    rate_limit: {unit: minute, requests_per_unit: 100}
";

/// [`RULES`], checked (a mistake is reported with its line, as `sluice check-config` does).
pub fn rules() -> Result<Config, ConfigErrors> {
    load_sources(&[("example.yaml".to_owned(), RULES.to_owned())])
}

/// A limiter over `backend` with every option at its default (keys under `sluice:`).
pub fn limiter<B: Backend>(backend: B) -> Result<Arc<Limiter<B>>, ConfigErrors> {
    let config = Arc::new(ArcSwap::from_pointee(rules()?));
    Ok(Arc::new(Limiter::new(
        config,
        backend,
        LimiterOptions::default(),
    )))
}

/// `GET /hello` with an `x-api-key` header: 200 while the key and the service are under their
/// limits, else 429 with `retry-after`; `x-ratelimit-remaining` is the key's.
pub fn router<B: Backend>(limiter: Arc<Limiter<B>>) -> Router {
    Router::new()
        .route("/hello", get(hello::<B>))
        .with_state(limiter)
}

async fn hello<B: Backend>(
    State(limiter): State<Arc<Limiter<B>>>,
    headers: HeaderMap,
) -> impl IntoResponse {
    let Some(key) = headers.get("x-api-key").map(HeaderValue::as_bytes) else {
        return (StatusCode::UNAUTHORIZED, HeaderMap::new(), "no x-api-key\n");
    };
    let request = LimitRequest {
        domain: "example".to_owned(),
        descriptors: vec![
            RequestDescriptor::new(vec![Entry::new("api_key", key.to_vec())]),
            RequestDescriptor::new(vec![Entry::new("service", "hello")]),
        ],
        hits_addend: 0,
    };
    let decision = match limiter.decide(&request).await {
        Ok(decision) => decision,
        // The backend is gone and the rules' failure mode is `error`: this service chooses to
        // serve (fail open), as Envoy does by default.
        Err(_) => return (StatusCode::OK, HeaderMap::new(), "hello (unlimited)\n"),
    };
    let mut out = HeaderMap::new();
    let own = &decision.statuses[0];
    out.insert("x-ratelimit-remaining", own.remaining.into());
    if decision.overall == Code::OverLimit {
        let wait_ms = decision
            .statuses
            .iter()
            .filter_map(|s| s.retry_after_ms.flatten())
            .max()
            .unwrap_or(0);
        out.insert("retry-after", wait_ms.div_ceil(1000).into());
        return (StatusCode::TOO_MANY_REQUESTS, out, "slow down\n");
    }
    (StatusCode::OK, out, "hello\n")
}
