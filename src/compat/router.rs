//! envoyproxy/ratelimit's HTTP endpoints that its deployments probe.

/// envoyproxy/ratelimit's `GET /healthcheck` (what its Kubernetes probes hit): `OK` while the
/// service is ready, 500 otherwise.
pub fn router(readiness: std::sync::Arc<crate::admin::Readiness>) -> axum::Router {
    use axum::http::StatusCode;
    axum::Router::new().route(
        "/healthcheck",
        axum::routing::get(move || async move {
            if readiness.is_ready() {
                (StatusCode::OK, "OK")
            } else {
                (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK")
            }
        }),
    )
}
