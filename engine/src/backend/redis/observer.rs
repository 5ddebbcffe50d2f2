//! What the Redis backend reports about its script calls, to whoever watches them: telemetry
//! implements [`RedisObserver`] (latency and error metrics, batch sizes, client spans), so the
//! backend depends on no metrics or tracing exporter.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tracing::Span;

use crate::backend::BackendError;
use crate::clock::Stopwatch;

/// Receives the backend's call reports. Called on the request path: every method must be cheap
/// and must not block. The defaults observe nothing.
pub trait RedisObserver: Send + Sync + 'static {
    /// The span one script call over `keys` keys on `server` (`host:port`; the Cluster `slot`
    /// when known) runs in. Made for every call, the health probe's included.
    fn call_span(&self, keys: usize, server: &str, slot: Option<u16>) -> Span {
        let _ = (keys, server, slot);
        Span::none()
    }

    /// Marks a failed call on its span.
    fn call_failed(&self, span: &Span, error: &BackendError) {
        let _ = (span, error);
    }

    /// Whether [`call_timed`](RedisObserver::call_timed) wants reports; `false`: no clock is
    /// read for them.
    fn times_calls(&self) -> bool {
        false
    }

    /// A decision's call (not a health probe's) took `elapsed` and ended with `outcome`.
    fn call_timed(&self, elapsed: Duration, outcome: Result<(), &BackendError>) {
        let _ = (elapsed, outcome);
    }

    /// A decision's call (not a health probe's) was not made: the endpoint's breaker is open
    /// and the call failed at once with [`BackendError::CircuitOpen`].
    fn call_skipped(&self) {}

    /// One batched script call is sent for `requests` requests.
    fn batch_sent(&self, requests: usize) {
        let _ = requests;
    }

    /// A script found `key` holding data of another type than sluice writes there (a bucket's
    /// hash, the heartbeat's sorted set), deleted it and went on as if it were missing. Not a
    /// failure: the call succeeded, and the endpoint's breaker was not told otherwise.
    fn key_repaired(&self, key: &str) {
        let _ = key;
    }
}

/// Observes nothing: a backend nobody watches.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unobserved;

impl RedisObserver for Unobserved {}

/// The observer of one backend. Set once: the batch workers read it, and may start before the
/// backend is given its observer (Sentinel mode starts one per resolved master).
pub(super) type SharedObserver = Arc<OnceLock<Arc<dyn RedisObserver>>>;

/// The observer in `shared`, or [`Unobserved`].
pub(super) fn current(shared: &SharedObserver) -> &dyn RedisObserver {
    match shared.get() {
        Some(observer) => observer.as_ref(),
        None => &Unobserved,
    }
}

/// Runs `call`, reporting its duration and outcome to `observer` when it times calls (`timed`:
/// a decision's call, not a probe's).
pub(super) async fn timed<T>(
    observer: &dyn RedisObserver,
    timed: bool,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    if !(timed && observer.times_calls()) {
        return call.await;
    }
    let started = Stopwatch::start();
    let result = call.await;
    observer.call_timed(started.elapsed(), result.as_ref().map(drop));
    result
}
