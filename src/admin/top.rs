//! `GET /top`: the keys most often over their limit and the most active ones per rule, from this
//! replica's summaries ([`crate::top`]).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::top::TopRecorder;

/// Keys per list when `n` is not given.
const DEFAULT_KEYS: usize = 10;

/// `GET /top?n=N&rule=PATH`: the [`crate::top::TopView`] as JSON, `n` keys per list (at most the
/// summaries' capacity), every rule with a decision in the view's span or only `rule` (its dotted
/// config path, as in the metrics' `rule` label). 404 when the summaries are off.
pub fn router(top: Option<Arc<TopRecorder>>) -> Router {
    Router::new()
        .route("/top", get(top_handler))
        .with_state(top)
}

#[derive(Deserialize)]
struct TopQuery {
    n: Option<usize>,
    rule: Option<String>,
}

async fn top_handler(
    State(top): State<Option<Arc<TopRecorder>>>,
    Query(query): Query<TopQuery>,
) -> Response {
    let Some(top) = top else {
        let error = "top keys are off (--top-keys 0)";
        return (
            StatusCode::NOT_FOUND,
            Json(serde_json::json!({ "error": error })),
        )
            .into_response();
    };
    let n = query.n.unwrap_or(DEFAULT_KEYS);
    if n == 0 {
        let error = "n must be at least 1";
        return (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({ "error": error })),
        )
            .into_response();
    }
    Json(top.view(n, query.rule.as_deref())).into_response()
}
