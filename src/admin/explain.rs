//! `GET /explain`: [`sluice_core::explain`] against the live config, as JSON.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::config::ConfigStore;
use crate::explain::{ExplainOptions, explain, explain_bucket, parse_descriptor};

/// `GET /explain?domain=D&descriptor=k=v,k2=v2`: the [`crate::explain::Report`] as JSON, against the live config;
/// `GET /explain?domain=D&bucket=k=v,...`: the [`crate::explain::BucketReport`] of an RLQS bucket id.
/// The descriptor has the CLI's syntax, URL-encoded like any query value (a `%2C` meant for the
/// descriptor travels as `%252C`).
pub fn router(store: Arc<ConfigStore>, options: ExplainOptions) -> Router {
    Router::new()
        .route("/explain", get(explain_handler))
        .with_state(Arc::new((store, options)))
}

#[derive(Deserialize)]
struct ExplainQuery {
    domain: Option<String>,
    descriptor: Option<String>,
    /// An RLQS bucket id instead of a descriptor (same syntax, any order).
    bucket: Option<String>,
}

async fn explain_handler(
    State(state): State<Arc<(Arc<ConfigStore>, ExplainOptions)>>,
    Query(query): Query<ExplainQuery>,
) -> Response {
    let bad = |message: String| {
        (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "error": message })),
        )
            .into_response()
    };
    let Some(domain) = query.domain.filter(|d| !d.is_empty()) else {
        return bad("missing query parameter `domain`".to_owned());
    };
    let (name, text) = match (query.descriptor, query.bucket) {
        (Some(_), Some(_)) => {
            return bad("give `descriptor` or `bucket`, not both".to_owned());
        }
        (Some(descriptor), None) => ("descriptor", descriptor),
        (None, Some(bucket)) => ("bucket", bucket),
        (None, None) => {
            return bad(
                "missing query parameter `descriptor` (key=value[,key=value...]) or `bucket` \
                 (an RLQS bucket id, same syntax)"
                    .to_owned(),
            );
        }
    };
    let entries = match parse_descriptor(&text) {
        Ok(entries) => entries,
        Err(e) => return bad(format!("{name}: {e}")),
    };
    let (store, options) = &*state;
    let config = store.active().load();
    if name == "bucket" {
        return match explain_bucket(&config, &domain, &entries, options) {
            Ok(report) => Json(report).into_response(),
            Err(e) => bad(format!("bucket: {e}")),
        };
    }
    Json(explain(&config, &domain, &entries, options)).into_response()
}
