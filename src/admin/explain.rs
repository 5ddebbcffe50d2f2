//! `GET /explain`: [`sluice_core::explain`] against the live config, as JSON.

use std::sync::Arc;

use crate::config::ConfigStore;
use crate::explain::{ExplainOptions, explain, explain_bucket};
use crate::request::Entry;
use crate::value_text;
use axum::Router;
use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;

/// `GET /explain?domain=D&descriptor=k=v,k2=v2`: the [`crate::explain::Report`] as JSON, against the live config;
/// `GET /explain?domain=D&bucket=k=v,...`: the [`crate::explain::BucketReport`] of an RLQS bucket id.
/// The descriptor or bucket id is in [`value_text`]'s form, as it is (`descriptor=tenant=%FF`
/// names the byte 0xFF); the values in the answer are in that form too.
pub fn router(store: Arc<ConfigStore>, options: ExplainOptions) -> Router {
    Router::new()
        .route("/explain", get(explain_handler))
        .with_state(Arc::new((store, options)))
}

/// The query `/explain` and `/buckets` read: a domain, and a descriptor or an RLQS bucket id,
/// each as sent (not URL-decoded).
#[derive(Default)]
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
    /// The parameters of a raw query string (others are ignored).
    pub(super) fn from_query(raw: Option<&str>) -> Selector {
        let mut selector = Selector::default();
        for pair in raw.unwrap_or_default().split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match name {
                "domain" => &mut selector.domain,
                "descriptor" => &mut selector.descriptor,
                "bucket" => &mut selector.bucket,
                _ => continue,
            };
            *slot = Some(value.to_owned());
        }
        selector
    }

    /// The selection, or why the query cannot be read (a 400's message).
    pub(super) fn read(self) -> Result<Selected, String> {
        let Some(domain) = self.domain.filter(|d| !d.is_empty()) else {
            return Err("missing query parameter `domain`".to_owned());
        };
        let domain = percent_encoding::percent_decode_str(&domain)
            .decode_utf8()
            .map_err(|_| "domain: not UTF-8".to_owned())?
            .into_owned();
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
        let entries = value_text::parse_query_value(&text).map_err(|e| format!("{name}: {e}"))?;
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
    RawQuery(query): RawQuery,
) -> Response {
    let selected = match Selector::from_query(query.as_deref()).read() {
        Ok(selected) => selected,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let (store, options) = &*state;
    let config = store.active().load();
    let (domain, entries) = (&selected.domain, &selected.entries);
    if selected.is_bucket {
        return match explain_bucket(&config, domain, entries, options) {
            Ok(report) => {
                let mut report = serde_json::to_value(report).unwrap_or_default();
                show_bucket_values(&mut report, entries);
                Json(report).into_response()
            }
            Err(e) => error(StatusCode::BAD_REQUEST, format!("bucket: {e}")),
        };
    }
    let mut report =
        serde_json::to_value(explain(&config, domain, entries, options)).unwrap_or_default();
    show_values(&mut report, entries);
    Json(report).into_response()
}

/// A bucket report's values — the bucket id's, and the placed descriptor's and its steps' — in
/// [`value_text`]'s form, as `/buckets` shows them. A bucket id's keys are distinct (a repeated
/// key is refused), so each value is found by its key whatever order the entries were placed in.
fn show_bucket_values(report: &mut serde_json::Value, entries: &[Entry]) {
    let by_key = |_: usize, view: &serde_json::Value| {
        let key = view["key"].as_str()?;
        entries.iter().find(|e| e.key == key)
    };
    for path in ["/bucket_id", "/placed/descriptor", "/placed/steps"] {
        if let Some(list) = report.pointer_mut(path) {
            show_list(list, by_key);
        }
    }
}

/// The report's descriptor values and matching steps' values in [`value_text`]'s form: the
/// descriptor's by position, a step's by the entry it names.
fn show_values(report: &mut serde_json::Value, entries: &[Entry]) {
    show_list(&mut report["descriptor"], |i, _| entries.get(i));
    show_list(&mut report["steps"], |_, step| {
        let entry = usize::try_from(step["entry"].as_u64()?).ok()?;
        entries.get(entry.wrapping_sub(1))
    });
}

/// Rewrites the `value` of each view in `list` (a JSON array; anything else is left alone) as
/// the [`value_text`] form of the entry `entry_of(position, view)` names, where it names one.
fn show_list<'e>(
    list: &mut serde_json::Value,
    entry_of: impl Fn(usize, &serde_json::Value) -> Option<&'e Entry>,
) {
    for (i, view) in list.as_array_mut().into_iter().flatten().enumerate() {
        if let Some(entry) = entry_of(i, view) {
            view["value"] = value_text::encode(entry.value.as_bytes()).into();
        }
    }
}
