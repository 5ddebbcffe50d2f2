//! Natural batching on one connection (standalone, or Sentinel mode's current master): checks
//! that arrive while earlier script calls are in flight share the next call.
//!
//! Redis spends about as much on a call itself (reading the command, EVALSHA's lookup, the
//! script's set-up, TIME) as on deciding one key, and sluice spends a command's encoding, reply
//! parsing and socket work per call. Under load those are paid once per batch. Nothing waits for
//! a batch to fill: a check that finds a free call slot goes at once, alone, so an idle server
//! answers as fast as without batching; only when [`BatchSettings::in_flight`] calls are already
//! out do new checks queue, and the next free slot takes as many of them, in order, as fit in
//! [`BatchSettings::max_keys`] keys (a request is never split; one with more keys goes alone).
//! The script decides each request of a batch as its own call would, in order
//! (`lua/limit.lua`), so batching changes no answer.
//!
//! The bound is in keys, not requests, because keys are what a call costs Redis: about 13 µs
//! of script time per fresh key on this project's 2-core machine (1.6 ms for a call of 128),
//! and Redis runs nothing else meanwhile. Requests of eight descriptors at a bound of 32
//! requests made 14 ms calls, as long as the default deadline.
//!
//! Each check keeps its own [`Deadline`] and breaker outcome (the caller wraps
//! [`Batcher::check`] in them): a check whose caller gave up before its batch left is dropped
//! from it, so a queue that outgrew the deadline sheds load instead of spending Redis on answers
//! nobody reads, and a batch's call is bounded by the latest deadline among its checks — past
//! it nobody reads the reply, so a silent server cannot hold a call slot any longer.

use std::sync::Arc;

use redis::aio::ConnectionLike;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::call::{Call, Deadline, classify, collect, report_repaired};
use super::observer::{self, RedisObserver, SharedObserver};
use super::script;
use crate::algorithm::Verdict;
use crate::backend::breaker::Endpoint;
use crate::backend::{BackendError, Hit};

/// How checks share script calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSettings {
    /// Most keys decided by one script call (a request with more goes alone); 1 turns batching
    /// off.
    pub max_keys: usize,
    /// Script calls out at once; checks queue only when this many are.
    pub in_flight: usize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        BatchSettings {
            max_keys: Self::DEFAULT_MAX_KEYS,
            in_flight: Self::DEFAULT_IN_FLIGHT,
        }
    }
}

impl BatchSettings {
    pub const DEFAULT_MAX_KEYS: usize = 128;
    pub const DEFAULT_IN_FLIGHT: usize = 2;

    pub fn enabled(&self) -> bool {
        self.max_keys > 1
    }
}

/// Checks waiting for a call slot, at most. Past it a check waits to be queued (inside its
/// deadline), which bounds the memory a stalled Redis can pin.
const QUEUE: usize = 4096;

struct Job {
    hits: Vec<Hit>,
    /// A batch runs at its first request's arguments (the test clock's now, the TTL jitter).
    args: script::CallArgs,
    deadline: Deadline,
    reply: oneshot::Sender<Result<Vec<Verdict>, BackendError>>,
}

/// The queue in front of one connection. Cheap to clone; the worker stops when the last clone
/// is dropped.
#[derive(Clone)]
pub(super) struct Batcher {
    jobs: mpsc::Sender<Job>,
}

impl Batcher {
    /// Starts the worker on the current Tokio runtime, in front of `conn` (the standalone
    /// connection manager, or the connection to the master Sentinel mode resolved).
    pub fn start<C>(conn: C, settings: BatchSettings, observer: SharedObserver) -> Batcher
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let (jobs, queue) = mpsc::channel(QUEUE);
        tokio::spawn(serve(queue, conn, settings, observer));
        Batcher { jobs }
    }

    /// Decides `hits` (one request) in the next call with a free slot.
    pub async fn check(
        &self,
        hits: &[Hit],
        args: script::CallArgs,
        deadline: Deadline,
    ) -> Result<Vec<Verdict>, BackendError> {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            hits: hits.to_vec(),
            args,
            deadline,
            reply,
        };
        if self.jobs.send(job).await.is_err() {
            return Err(stopped());
        }
        answer.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn stopped() -> BackendError {
    BackendError::Unavailable("the Redis batch worker stopped".into())
}

async fn serve<C>(
    mut queue: mpsc::Receiver<Job>,
    conn: C,
    settings: BatchSettings,
    observer: SharedObserver,
) where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let slots = Arc::new(Semaphore::new(settings.in_flight.max(1)));
    let max_keys = settings.max_keys.max(1);
    // The job that did not fit in the last batch: the first of the next.
    let mut carried: Option<Job> = None;
    loop {
        let Some(job) = (match carried.take() {
            Some(job) => Some(job),
            None => queue.recv().await,
        }) else {
            return;
        };
        // Waiting for a slot is what lets a batch form: checks arriving meanwhile queue up.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = Vec::with_capacity(max_keys.min(queue.len() + 1));
        let mut keys = 0;
        let mut next = Some(job);
        while let Some(job) = next {
            // Its caller gave up (deadline): nobody reads the answer.
            if job.reply.is_closed() {
                next = queue.try_recv().ok();
                continue;
            }
            if !batch.is_empty() && keys + job.hits.len() > max_keys {
                carried = Some(job);
                break;
            }
            keys += job.hits.len();
            batch.push(job);
            next = if keys < max_keys {
                queue.try_recv().ok()
            } else {
                None
            };
        }
        if batch.is_empty() {
            continue;
        }
        observer::current(&observer).batch_sent(batch.len());
        let mut conn = conn.clone();
        let args = batch[0].args;
        let deadline = batch
            .iter()
            .map(|job| job.deadline)
            .fold(batch[0].deadline, Ord::max);
        let observer = observer.clone();
        tokio::spawn(async move {
            let result = deadline
                .bound(async {
                    let requests: Vec<&[Hit]> =
                        batch.iter().map(|job| job.hits.as_slice()).collect();
                    script::run_batch(&mut conn, &requests, args)
                        .await
                        .map_err(classify)
                })
                .await;
            deliver(batch, result, observer::current(&observer));
            drop(slot);
        });
    }
}

/// Splits one call's reply among its requests, in order; a failed call fails each of them. The
/// keys the script repaired are reported to `observer`.
fn deliver(
    batch: Vec<Job>,
    result: Result<redis::Value, BackendError>,
    observer: &dyn RedisObserver,
) {
    let total = batch.iter().map(|job| job.hits.len()).sum();
    let decoded = result.and_then(|reply| {
        script::decode(&reply, total)
            .map(|(verdicts, repaired)| (verdicts.collect::<Vec<_>>(), repaired))
    });
    let decoded = decoded.map(|(verdicts, repaired)| {
        for at in repaired {
            if let Some(hit) = batch.iter().flat_map(|job| job.hits.iter()).nth(at) {
                report_repaired(observer, &hit.key);
            }
        }
        verdicts
    });
    let mut verdicts = match decoded {
        Ok(verdicts) => verdicts.into_iter(),
        Err(error) => {
            for job in batch {
                let _ = job.reply.send(Err(error.clone()));
            }
            return;
        }
    };
    for job in batch {
        // Each request takes exactly its own verdicts, whatever a bad one among them.
        let own: Vec<_> = verdicts.by_ref().take(job.hits.len()).collect();
        // A caller that gave up meanwhile reads nothing; its request was decided all the same,
        // as a timed-out unbatched call is.
        let _ = job.reply.send(own.into_iter().collect());
    }
}

impl Call<'_> {
    /// Decides one request on one connection, guarded (see [`Call::guarded`]): through the
    /// connection's batch queue when batching is on, else in a script call of its own. The
    /// standalone connection and Sentinel mode's master are both decided so.
    pub(super) async fn on_connection<C: ConnectionLike + Clone>(
        self,
        endpoint: &Endpoint,
        conn: &C,
        batcher: Option<&Batcher>,
        hits: &[Hit],
        args: script::CallArgs,
    ) -> Result<Vec<Verdict>, BackendError> {
        if let Some(batcher) = batcher {
            return self
                .guarded(
                    endpoint,
                    hits.len(),
                    None,
                    batcher.check(hits, args, self.deadline),
                )
                .await;
        }
        let mut conn = conn.clone();
        self.guarded(endpoint, hits.len(), None, async move {
            let reply = script::run(&mut conn, hits.iter(), hits.len(), args)
                .await
                .map_err(classify)?;
            collect(&reply, hits.iter().map(|h| h.key.as_str()), self.observer)
        })
        .await
    }
}
