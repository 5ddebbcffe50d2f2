//! A stream's assignments on their way to its data plane, and how the stream ends.
//!
//! The outbox holds the newest action per bucket: a newer one replaces one the data plane has
//! not read yet (counted as superseded), so a reader that falls behind costs one action per
//! subscribed bucket, never a growing queue, and loses nothing but time — when it reads again it
//! gets every bucket's current assignment in one message. An action is counted as sent when the
//! stream's transport takes it. Once ended, the outbox delivers what it still holds, then the
//! end; every end is logged once and counted by reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, watch};

use super::stats::{EndReason, QuotaStats};
use super::{Action, BucketId};

/// How and why a stream ended; the gRPC edge turns it into the stream's last status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct End {
    pub reason: EndReason,
    /// Said to the data plane (as the status message) and logged.
    pub detail: String,
}

/// What the stream sends next.
#[derive(Debug)]
pub enum Next {
    Actions(Vec<Action>),
    End(End),
}

#[derive(Default)]
struct Pending {
    actions: HashMap<BucketId, Action>,
    end: Option<End>,
}

/// One stream's outbox.
pub struct Outbox {
    domain: String,
    pending: Mutex<Pending>,
    ready: Notify,
    ended: watch::Sender<bool>,
    stats: Arc<QuotaStats>,
}

fn bucket_of(action: &Action) -> &BucketId {
    match action {
        Action::Assign { bucket, .. } | Action::Abandon { bucket } => bucket,
    }
}

impl Outbox {
    pub fn new(domain: &str, stats: Arc<QuotaStats>) -> Self {
        Outbox {
            domain: domain.to_owned(),
            pending: Mutex::new(Pending::default()),
            ready: Notify::new(),
            ended: watch::Sender::new(false),
            stats,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `actions`, each replacing an unread one for the same bucket. Ignored once ended.
    pub fn push(&self, actions: impl IntoIterator<Item = Action>) {
        let mut pending = self.lock();
        if pending.end.is_some() {
            return;
        }
        let mut any = false;
        for action in actions {
            any = true;
            if pending
                .actions
                .insert(bucket_of(&action).clone(), action)
                .is_some()
            {
                self.stats.count_superseded();
            }
        }
        drop(pending);
        if any {
            self.ready.notify_one();
        }
    }

    /// Ends the stream for `reason` (the first end wins; later ones are no-ops): logged and
    /// counted here. Returns whether this call ended it.
    pub fn end(&self, reason: EndReason, detail: String) -> bool {
        let mut pending = self.lock();
        if pending.end.is_some() {
            return false;
        }
        log_end(&self.stats, &self.domain, reason, &detail);
        pending.end = Some(End { reason, detail });
        drop(pending);
        self.ended.send_replace(true);
        self.ready.notify_one();
        true
    }

    pub fn is_ended(&self) -> bool {
        *self.ended.borrow()
    }

    /// Resolves once the stream has ended.
    pub async fn ended(&self) {
        let mut ended = self.ended.subscribe();
        let _ = ended.wait_for(|e| *e).await;
    }

    /// Waits for what the stream sends next: every queued action (counted as sent), or, with
    /// nothing queued, the end. Called by the stream's single reader.
    pub async fn next(&self) -> Next {
        loop {
            {
                let mut pending = self.lock();
                if !pending.actions.is_empty() {
                    let actions: Vec<Action> = pending.actions.drain().map(|(_, a)| a).collect();
                    // The map keeps its capacity; a stream whose buckets went away gives it back.
                    pending.actions.shrink_to(actions.len());
                    for action in &actions {
                        self.stats.count_sent(action);
                    }
                    return Next::Actions(actions);
                }
                if let Some(end) = &pending.end {
                    return Next::End(end.clone());
                }
            }
            // One reader: a notification sent while it was not waiting is kept as a permit.
            self.ready.notified().await;
        }
    }
}

/// Logs and counts one stream end: a warning where the data plane (or its operator) has
/// something to fix, info for ordinary ends.
pub fn log_end(stats: &QuotaStats, domain: &str, reason: EndReason, detail: &str) {
    stats.count_end(reason);
    let label = reason.as_str();
    match reason {
        EndReason::TooLarge | EndReason::InvalidReport | EndReason::NoFirstReport => {
            tracing::warn!(domain, reason = label, detail, "RLQS stream ended");
        }
        EndReason::HalfClosed | EndReason::Cancelled | EndReason::Stopping => {
            tracing::info!(domain, reason = label, detail, "RLQS stream ended");
        }
    }
}
