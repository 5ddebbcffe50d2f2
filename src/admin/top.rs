//! `GET /top`: the keys most often over their limit and the most active ones per rule, from this
//! replica's summaries ([`crate::top`]).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde::Deserialize;

use crate::top::{MAX_KEYS, MAX_RULES_PER_VIEW, Page, TopRecorder};

/// Keys per list when `n` is not given.
const DEFAULT_KEYS: usize = 10;

/// Rules per answer when `limit` is not given.
const DEFAULT_RULES: usize = 20;

/// `GET /top?n=N&rule=PATH&offset=O&limit=L`: the [`crate::top::TopView`] as JSON, `n` keys per
/// list (1 to [`MAX_KEYS`]), `limit` rules (1 to [`MAX_RULES_PER_VIEW`]) from `offset` among
/// every rule with a decision in the view's span, or only `rule` (its dotted config path, as in
/// the metrics' `rule` label). 404 when the summaries are off.
pub fn router(top: Option<Arc<TopRecorder>>) -> Router {
    Router::new()
        .route("/top", get(top_handler))
        .with_state(top)
}

#[derive(Deserialize)]
struct TopQuery {
    n: Option<usize>,
    rule: Option<String>,
    offset: Option<usize>,
    limit: Option<usize>,
}

async fn top_handler(
    State(top): State<Option<Arc<TopRecorder>>>,
    Query(query): Query<TopQuery>,
) -> Response {
    let Some(top) = top else {
        return error(StatusCode::NOT_FOUND, "top keys are off (--top-keys 0)");
    };
    let n = query.n.unwrap_or(DEFAULT_KEYS);
    if !(1..=MAX_KEYS).contains(&n) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("n must be from 1 to {MAX_KEYS}, got {n}"),
        );
    }
    let limit = query.limit.unwrap_or(DEFAULT_RULES);
    if !(1..=MAX_RULES_PER_VIEW).contains(&limit) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("limit must be from 1 to {MAX_RULES_PER_VIEW} rules, got {limit}"),
        );
    }
    let page = Page {
        offset: query.offset.unwrap_or(0),
        limit,
    };
    Json(top.view(n, query.rule.as_deref(), page)).into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({ "error": message.into() });
    (status, Json(body)).into_response()
}
