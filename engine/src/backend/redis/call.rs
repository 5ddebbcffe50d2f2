//! What every Redis call shares: one [`Deadline`] per decision, the breaker-guarded [`Call`],
//! and the mapping of redis-rs errors and script replies. A leaf of the Redis backend: its other
//! files import it, it imports none of them but the script's decoder and the observer.

use std::future::Future;
use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use tracing::Instrument as _;

use super::observer::{self, RedisObserver};
use super::script;
use crate::algorithm::Verdict;
use crate::backend::BackendError;
use crate::backend::breaker::Endpoint;

/// Key of the bucket [`Backend::probe`] checks (check-only, so it never limits anything).
pub(super) const PROBE_KEY: &str = "sluice:probe";

/// Decodes a whole reply into verdicts in hit order (`keys` are the call's keys, in order), and
/// reports the keys the script repaired.
pub(super) fn collect<'k>(
    reply: &redis::Value,
    keys: impl ExactSizeIterator<Item = &'k str> + Clone,
    observer: &dyn RedisObserver,
) -> Result<Vec<Verdict>, BackendError> {
    let count = keys.len();
    let (decoded, repaired) = script::decode(reply, count)?;
    let mut verdicts = Vec::with_capacity(count);
    for verdict in decoded {
        verdicts.push(verdict?);
    }
    for at in repaired {
        if let Some(key) = keys.clone().nth(at) {
            report_repaired(observer, key);
        }
    }
    Ok(verdicts)
}

/// A key held foreign data (another type than sluice writes there) and a script replaced it:
/// that key's problem, logged and counted, never a failure of the call or of the endpoint.
pub(super) fn report_repaired(observer: &dyn RedisObserver, key: &str) {
    tracing::warn!(
        key,
        "Redis key held data of another type; deleted and started afresh"
    );
    observer.key_repaired(key);
}

/// Runs `call` within `limit`; past it the call is dropped (a multiplexed connection discards the
/// late reply) and the check fails with [`BackendError::Timeout`].
pub(super) async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(BackendError::Timeout(limit.as_millis() as u64)),
    }
}

/// The one deadline of a decision's Redis calls: set once, when the decision reaches the
/// backend (`command_timeout` from then), and shared by every step — the wait for a batch,
/// the batch's call, a Cluster node's call and its redirects — so no step restarts the clock.
/// Past it the call is dropped (a multiplexed connection discards the late reply) and the check
/// fails with [`BackendError::Timeout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Deadline {
    at: tokio::time::Instant,
    budget: Duration,
}

impl Deadline {
    pub(super) fn after(budget: Duration) -> Deadline {
        Deadline {
            at: tokio::time::Instant::now() + budget,
            budget,
        }
    }

    pub(super) async fn bound<T>(
        self,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout_at(self.at, call).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::Timeout(self.budget.as_millis() as u64)),
        }
    }
}

/// What every Redis call of one decision shares: its deadline and who is told about it.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub(super) deadline: Deadline,
    pub(super) observer: &'a dyn RedisObserver,
    /// A decision's call (reported with its latency), not a probe's.
    pub(super) timed: bool,
}

impl Call<'_> {
    /// Runs `call` (the script over `keys` keys, on `endpoint`, in `slot` when known) through
    /// the endpoint's breaker and within the deadline: skipped at once while the breaker is
    /// open, and its outcome (a timeout is a failure) reported back. A call that is made is
    /// timed, counted and traced; a skipped one is only counted (no Redis call happened).
    pub(super) async fn guarded<T>(
        self,
        endpoint: &Endpoint,
        keys: usize,
        slot: Option<u16>,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let Some(permit) = endpoint.admit() else {
            if self.timed {
                self.observer.call_skipped();
            }
            return Err(BackendError::CircuitOpen);
        };
        let span = self.observer.call_span(keys, endpoint.name(), slot);
        let result = observer::timed(self.observer, self.timed, self.deadline.bound(call))
            .instrument(span.clone())
            .await;
        if let Err(e) = &result {
            self.observer.call_failed(&span, e);
        }
        endpoint.record(permit, result.as_ref().map(drop));
        result
    }
}

/// Maps a redis-rs error: the server cannot serve now → `Unavailable`; it answered something
/// sluice did not expect (script error, bad reply) → `Protocol`.
pub(super) fn classify(err: RedisError) -> BackendError {
    match err.kind() {
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            BackendError::Protocol(err.to_string())
        }
        ErrorKind::Server(
            ServerErrorKind::ResponseError
            | ServerErrorKind::ExecAbort
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::NotBusy
            | ServerErrorKind::NoSub,
        ) => BackendError::Protocol(err.to_string()),
        _ => BackendError::Unavailable(err.to_string()),
    }
}

/// True when an error means the current connection (or master) should be replaced.
pub(super) fn is_connection_error(err: &BackendError) -> bool {
    matches!(err, BackendError::Unavailable(_))
}

pub(super) fn config_error(message: &str) -> BackendError {
    BackendError::Unavailable(format!("Redis configuration: {message}"))
}

/// The URL itself is left out of the message: it may carry a password.
pub(super) fn invalid_url(index: usize, err: &RedisError) -> BackendError {
    BackendError::Unavailable(format!("Redis URL #{} is invalid: {err}", index + 1))
}
