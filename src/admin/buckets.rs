//! `GET /buckets` and `DELETE /buckets`: one descriptor's (or RLQS bucket id's) buckets, read
//! without taking anything, or reset.
//!
//! The keys are [`crate::explain::stored_buckets`]'s (every shard of a sharded rule); the state is
//! [`Backend::peek`]'s, computed by the code that decides (the memory backend's
//! [`crate::algorithm::peek`], the Redis script's read-only mode) and written nowhere. A reset
//! deletes every key ([`Backend::reset`]) and drops what this replica holds of them: the lease,
//! the over-limit cache entry, and the tokens its RLQS pool holds (the pool's members stay; the
//! next push takes what their assignments need from the fresh bucket). Resets are refused (403)
//! unless the server runs with `--admin-write`; each one is logged with the caller's address and
//! counted in `sluice_admin_resets_total{domain}`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::{RawQuery, State};
use axum::http::{Extensions, StatusCode};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::explain::{Selected, Selector, error};
use crate::backend::{Backend, BackendError, Hit, KeyPeek};
use crate::config::ConfigStore;
use crate::explain::{
    EntryView, ExplainOptions, NotStored, Stored, StoredKey, stored_buckets, stored_pool,
};
use crate::limiter::Limiter;
use crate::quota::Quotas;
use crate::telemetry::AdminMetrics;

/// What `/buckets` reads and changes.
pub struct BucketsState<B> {
    pub config: Arc<ConfigStore>,
    pub options: ExplainOptions,
    pub limiter: Arc<Limiter<B>>,
    pub quotas: Arc<Quotas<B>>,
    /// `--admin-write`: `DELETE /buckets` is allowed.
    pub write: bool,
    pub metrics: AdminMetrics,
    /// The RLS runtime: backend calls run there (see [`on_rls`]).
    pub rls: tokio::runtime::Handle,
}

/// Runs a backend call on the RLS runtime and waits for it from the admin thread: the backend's
/// connections, and the tasks a call may start (a Cluster slot-map refresh, the batcher of a
/// master a Sentinel failover found), belong to the runtime that decides, not to the admin
/// listener's. One error per key if that runtime is gone (shutting down).
async fn on_rls<B, T, F>(
    state: &BucketsState<B>,
    keys: usize,
    call: F,
) -> Vec<Result<T, BackendError>>
where
    B: Backend,
    T: Send + 'static,
    F: Future<Output = Vec<Result<T, BackendError>>> + Send + 'static,
{
    match state.rls.spawn(call).await {
        Ok(results) => results,
        Err(e) => (0..keys)
            .map(|_| {
                Err(BackendError::Unavailable(format!(
                    "the RLS runtime is gone: {e}"
                )))
            })
            .collect(),
    }
}

/// `GET|DELETE /buckets?domain=D&descriptor=k=v,...` (or `bucket=k=v,...` for an RLQS bucket
/// id), the query `/explain` reads.
pub fn router<B: Backend>(state: BucketsState<B>) -> Router {
    Router::new()
        .route("/buckets", get(show::<B>).delete(reset::<B>))
        .with_state(Arc::new(state))
}

/// The selection and the buckets it keeps, or the error status and message.
fn locate<B: Backend>(
    state: &BucketsState<B>,
    query: Selector,
) -> Result<(Selected, Stored), (StatusCode, String)> {
    let selected = query
        .read()
        .map_err(|message| (StatusCode::BAD_REQUEST, message))?;
    let config = state.config.active().load();
    let (domain, entries) = (&selected.domain, &selected.entries);
    let stored = if selected.is_bucket {
        stored_pool(&config, domain, entries, &state.options)
    } else {
        stored_buckets(&config, domain, entries, &state.options)
    };
    match stored {
        Ok(stored) => Ok((selected, stored)),
        Err(e @ NotStored::RepeatedKey(_)) => {
            Err((StatusCode::BAD_REQUEST, format!("bucket: {e}")))
        }
        Err(e) => Err((StatusCode::NOT_FOUND, e.to_string())),
    }
}

/// The hits that name each key to the backend (nothing is asked of them).
fn hits(stored: &Stored) -> Vec<Hit> {
    stored
        .keys
        .iter()
        .map(|k| Hit::new(k.key.clone(), k.params, 0).using(k.algorithm))
        .collect()
}

/// The selection as the response names it: `descriptor` or `bucket_id`, the entries in order
/// (a bucket id's sorted by key).
fn selection(selected: &Selected) -> (&'static str, Vec<EntryView>) {
    let mut entries: Vec<EntryView> = selected
        .entries
        .iter()
        .map(|e| EntryView {
            key: e.key.clone(),
            value: crate::value_text::encode(e.value.as_bytes()),
        })
        .collect();
    if selected.is_bucket {
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        ("bucket_id", entries)
    } else {
        ("descriptor", entries)
    }
}

async fn show<B: Backend>(
    State(state): State<Arc<BucketsState<B>>>,
    RawQuery(query): RawQuery,
) -> Response {
    let query = Selector::from_query(query.as_deref());
    let (selected, stored) = match locate(&state, query) {
        Ok(found) => found,
        Err((status, message)) => return error(status, message),
    };
    let (limiter, asked) = (Arc::clone(&state.limiter), hits(&stored));
    let peeks = on_rls(&state, asked.len(), async move {
        limiter.backend().peek(&asked).await
    })
    .await;
    let failed = peeks.iter().any(Result::is_err);
    let cost = stored.rule.bucket.as_ref().map_or(1, |b| b.cost);
    let keys: Vec<Value> = stored
        .keys
        .iter()
        .zip(peeks)
        .map(|(key, peek)| {
            let mut view = match peek {
                Ok(peek) => key_view(key, &peek, cost),
                Err(e) => failure(key, &e),
            };
            view["replica"] = held_here(&state, &key.key);
            view
        })
        .collect();
    let (name, entries) = selection(&selected);
    let body = json!({
        "domain": selected.domain,
        name: entries,
        "rule": stored.rule,
        "keys": keys,
    });
    (status(failed), Json(body)).into_response()
}

/// 503 when the backend failed for some key (its entry says why).
fn status(failed: bool) -> StatusCode {
    if failed {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// One key's state as the backend holds it. `remaining` and `limit` are in hits of the rule's
/// `cost`, as the RLS answer (`limit_remaining`, `x-ratelimit-remaining`) counts them;
/// `remaining_tokens` is the bucket's own count.
fn key_view(key: &StoredKey, peek: &KeyPeek, cost: u64) -> Value {
    let verdict = peek.peek.verdict;
    let cost = cost.max(1);
    let limit = key.params.capacity / cost;
    let mut view = json!({
        "key": key.key,
        "shard": key.shard,
        "stored": peek.stored,
        "ttl_ms": peek.ttl_ms,
        "remaining": (verdict.remaining / cost).min(limit),
        "limit": limit,
        "remaining_tokens": verdict.remaining,
        "cost": cost,
        "until_full_ms": verdict.until_full_ms,
        "retry_after_ms": verdict.retry_after_ms,
        "state": peek.peek.level(&key.params, peek.now_ms),
        "now_ms": peek.now_ms,
    });
    if peek.foreign {
        view["foreign"] = json!(true);
    }
    view
}

fn failure(key: &StoredKey, e: &BackendError) -> Value {
    json!({ "key": key.key, "shard": key.shard, "error": e.to_string() })
}

/// What this replica holds of `key`: its lease, over-limit cache entry and RLQS pool.
fn held_here<B: Backend>(state: &BucketsState<B>, key: &str) -> Value {
    let limiter = &state.limiter;
    let now_ms = limiter.resilience().clock.now_ms();
    let lease = limiter
        .leases()
        .and_then(|store| store.holding(key, now_ms))
        .map(|held| {
            json!({
                "tokens": held.tokens,
                "expires_in_ms": held.expires_in_ms,
                "stale": held.stale,
                "refilling": held.refilling,
            })
        });
    let cached = limiter
        .resilience()
        .over_limit_cache()
        .and_then(|cache| cache.holding(key, now_ms))
        .map(|(need, rejection)| {
            json!({
                "rejects_for_ms": rejection.wait_ms,
                "rejects_demands_of": need,
                "remaining": rejection.remaining,
                "until_full_ms": rejection.until_full_ms,
            })
        });
    let pool = state
        .quotas
        .pool_holding(key)
        .map(|(held, members)| json!({ "held_tokens": held, "members": members }));
    json!({ "lease": lease, "over_limit_cache": cached, "rlqs_pool": pool })
}

async fn reset<B: Backend>(
    State(state): State<Arc<BucketsState<B>>>,
    extensions: Extensions,
    RawQuery(query): RawQuery,
) -> Response {
    let query = Selector::from_query(query.as_deref());
    if !state.write {
        return error(
            StatusCode::FORBIDDEN,
            "resetting buckets is off: start `sluice serve` with --admin-write \
             (SLUICE_ADMIN_WRITE=true) to allow DELETE /buckets",
        );
    }
    let (selected, stored) = match locate(&state, query) {
        Ok(found) => found,
        Err((status, message)) => return error(status, message),
    };
    let (limiter, asked) = (Arc::clone(&state.limiter), hits(&stored));
    let deleted = on_rls(&state, asked.len(), async move {
        limiter.backend().reset(&asked).await
    })
    .await;
    let failed = deleted.iter().any(Result::is_err);
    let mut keys = Vec::with_capacity(deleted.len());
    let mut dropped = Dropped::default();
    for (key, outcome) in stored.keys.iter().zip(deleted) {
        match outcome {
            Ok(existed) => {
                dropped.add(&state, &key.key);
                keys.push(json!({ "key": key.key, "shard": key.shard, "existed": existed }));
            }
            Err(e) => keys.push(failure(key, &e)),
        }
    }
    let caller = extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.to_string())
        .unwrap_or_else(|| "unknown".to_owned());
    let names: Vec<&str> = stored.keys.iter().map(|k| k.key.as_str()).collect();
    let kind = if selected.is_bucket {
        "bucket"
    } else {
        "descriptor"
    };
    if failed {
        tracing::warn!(%caller, domain = %selected.domain, kind, entries = %selected.text,
            keys = ?names, "bucket reset through the admin listener failed for some keys");
    } else {
        tracing::info!(%caller, domain = %selected.domain, kind, entries = %selected.text,
            keys = ?names, "bucket reset through the admin listener");
        state.metrics.reset(&selected.domain);
    }
    let (name, entries) = selection(&selected);
    let body = json!({
        "domain": selected.domain,
        name: entries,
        "reset": keys,
        "replica": {
            "leases_dropped": dropped.leases,
            "over_limit_cache_entries_dropped": dropped.cached,
            "rlqs_pools_emptied": dropped.pools,
        },
    });
    (status(failed), Json(body)).into_response()
}

/// What a reset dropped from this replica.
#[derive(Default)]
struct Dropped {
    leases: usize,
    cached: usize,
    pools: usize,
}

impl Dropped {
    /// Drops this replica's lease, over-limit cache entry and RLQS pool tokens of `key`.
    fn add<B: Backend>(&mut self, state: &BucketsState<B>, key: &str) {
        let limiter = &state.limiter;
        let now_ms = limiter.resilience().clock.now_ms();
        if let Some(store) = limiter.leases()
            && store.forget(key, now_ms).is_some()
        {
            self.leases += 1;
        }
        if let Some(cache) = limiter.resilience().over_limit_cache() {
            if cache.holding(key, now_ms).is_some() {
                self.cached += 1;
            }
            cache.forget(key);
        }
        if state.quotas.forget_held(key).is_some() {
            self.pools += 1;
        }
    }
}
