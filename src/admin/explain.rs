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
use crate::request::Entry;

/// `GET /explain?domain=D&descriptor=k=v,k2=v2`: the [`crate::explain::Report`] as JSON, against the live config;
/// `GET /explain?domain=D&bucket=k=v,...`: the [`crate::explain::BucketReport`] of an RLQS bucket id.
/// The descriptor has the CLI's syntax, URL-encoded like any query value (a `%2C` meant for the
/// descriptor travels as `%252C`).
pub fn router(store: Arc<ConfigStore>, options: ExplainOptions) -> Router {
    Router::new()
        .route("/explain", get(explain_handler))
        .with_state(Arc::new((store, options)))
}

/// The query `/explain` and `/buckets` read: a domain, and a descriptor or an RLQS bucket id.
#[derive(Deserialize)]
pub(super) struct Selector {
    domain: Option<String>,
    descriptor: Option<String>,
    /// An RLQS bucket id instead of a descriptor (same syntax, any order).
    bucket: Option<String>,
}

/// A [`Selector`] read: the domain, the entries, whether they are an RLQS bucket id, and the
/// argument as given (for logs).
pub(super) struct Selected {
    pub domain: String,
    pub entries: Vec<Entry>,
    pub is_bucket: bool,
    pub text: String,
}

impl Selector {
    /// The selection, or why the query cannot be read (a 400's message).
    pub(super) fn read(self) -> Result<Selected, String> {
        let Some(domain) = self.domain.filter(|d| !d.is_empty()) else {
            return Err("missing query parameter `domain`".to_owned());
        };
        let (is_bucket, text) = match (self.descriptor, self.bucket) {
            (Some(_), Some(_)) => return Err("give `descriptor` or `bucket`, not both".to_owned()),
            (Some(descriptor), None) => (false, descriptor),
            (None, Some(bucket)) => (true, bucket),
            (None, None) => {
                return Err(
                    "missing query parameter `descriptor` (key=value[,key=value...]) or `bucket` \
                     (an RLQS bucket id, same syntax)"
                        .to_owned(),
                );
            }
        };
        let name = if is_bucket { "bucket" } else { "descriptor" };
        let entries = parse_descriptor(&text).map_err(|e| format!("{name}: {e}"))?;
        Ok(Selected {
            domain,
            entries,
            is_bucket,
            text,
        })
    }
}

/// A JSON `{"error": message}` with `status`.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

async fn explain_handler(
    State(state): State<Arc<(Arc<ConfigStore>, ExplainOptions)>>,
    Query(query): Query<Selector>,
) -> Response {
    let selected = match query.read() {
        Ok(selected) => selected,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let (store, options) = &*state;
    let config = store.active().load();
    let (domain, entries) = (&selected.domain, &selected.entries);
    if selected.is_bucket {
        return match explain_bucket(&config, domain, entries, options) {
            Ok(report) => Json(report).into_response(),
            Err(e) => error(StatusCode::BAD_REQUEST, format!("bucket: {e}")),
        };
    }
    Json(explain(&config, domain, entries, options)).into_response()
}
