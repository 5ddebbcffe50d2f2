//! The replica's top-keys summaries (`sluice_core::top`), fed by every `ShouldRateLimit`
//! decision and read by `GET /top`.
//!
//! Recording must never slow a decision: it takes the summaries' lock only if it is free and
//! otherwise skips the decision (counted in [`TopView::skipped`]), so the summaries are a sample
//! when the lock is contended. A descriptor is recorded when a rule with a limit decided it.

use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use sluice_core::clock::SharedClock;
use sluice_core::decision::{Decision, Status};
use sluice_core::request::{LimitRequest, RequestDescriptor};
use sluice_core::top::{RuleView, Seen, TopKeys, TopOptions};

/// Descriptors of a request hashed before taking the lock (the rest, rare, under it).
const HASHED_AHEAD: usize = 8;

/// Longest key label kept (bytes of `k=v, …`); longer ones end in `…`.
const MAX_LABEL_BYTES: usize = 160;

/// One replica's summaries.
pub struct TopRecorder {
    keys: Mutex<TopKeys>,
    hasher: RandomState,
    clock: SharedClock,
    skipped: AtomicU64,
}

/// What `GET /top` answers.
#[derive(Clone, Debug, Serialize)]
pub struct TopView {
    /// Counters per summary: a count is within its `error` of the truth, and `error` is at most
    /// the summary's decisions / `capacity`.
    pub capacity: usize,
    /// A view covers the current window and the one before.
    pub window_seconds: u64,
    pub rules: Vec<RuleView>,
    /// Decisions of rules past the tracked bound, not summarized.
    pub untracked: u64,
    /// Decisions not recorded because the summaries were busy (since start).
    pub skipped: u64,
}

impl TopRecorder {
    /// `None` when `capacity` is 0 (summaries off).
    pub fn new(capacity: usize, window: Duration, clock: SharedClock) -> Option<Self> {
        (capacity > 0).then(|| TopRecorder {
            keys: Mutex::new(TopKeys::new(TopOptions {
                capacity,
                window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1),
                ..TopOptions::default()
            })),
            hasher: RandomState::new(),
            clock,
            skipped: AtomicU64::new(0),
        })
    }

    /// Counts each descriptor of `request` that a rule with a limit decided.
    pub fn record(&self, request: &LimitRequest, decision: &Decision) {
        let limited = |s: &Status| s.rule.is_some() && s.limit.is_some();
        if !decision.statuses.iter().any(limited) {
            return;
        }
        // The first descriptors are hashed before the lock, so it is held only to count.
        let mut hashes = [0u64; HASHED_AHEAD];
        for ((hash, descriptor), status) in hashes
            .iter_mut()
            .zip(&request.descriptors)
            .zip(&decision.statuses)
        {
            if limited(status) {
                *hash = self.hash(descriptor);
            }
        }
        let now_ms = self.clock.now_ms();
        let Ok(mut keys) = self.keys.try_lock() else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let pairs = request.descriptors.iter().zip(&decision.statuses);
        for (i, (descriptor, status)) in pairs.enumerate() {
            let (Some(rule), Some(_)) = (&status.rule, &status.limit) else {
                continue;
            };
            let hash = hashes
                .get(i)
                .copied()
                .unwrap_or_else(|| self.hash(descriptor));
            let seen = Seen {
                hash,
                over: status.over,
            };
            keys.record(now_ms, &rule.path, seen, || label(descriptor));
        }
    }

    /// The `n` top keys of every rule (or of `rule` only).
    pub fn view(&self, n: usize, rule: Option<&str>) -> TopView {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let options = keys.options();
        TopView {
            capacity: options.capacity,
            window_seconds: options.window_ms / 1000,
            rules: keys.view(self.clock.now_ms(), n, rule),
            untracked: keys.untracked(),
            skipped: self.skipped.load(Ordering::Relaxed),
        }
    }

    fn hash(&self, descriptor: &RequestDescriptor) -> u64 {
        let mut h = self.hasher.build_hasher();
        for entry in &descriptor.entries {
            h.write(entry.key.as_bytes());
            h.write_u8(0xff);
            h.write(entry.value.as_bytes());
            h.write_u8(0xfe);
        }
        h.finish()
    }
}

/// `k=v, k2=v2`, cut at [`MAX_LABEL_BYTES`].
fn label(descriptor: &RequestDescriptor) -> Arc<str> {
    let mut text = String::new();
    for (i, entry) in descriptor.entries.iter().enumerate() {
        if i > 0 {
            text.push_str(", ");
        }
        text.push_str(&entry.key);
        text.push('=');
        text.push_str(&entry.value.to_text());
        if text.len() > MAX_LABEL_BYTES {
            break;
        }
    }
    if text.len() > MAX_LABEL_BYTES {
        let mut cut = MAX_LABEL_BYTES;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    Arc::from(text)
}
