//! The replica's top-keys summaries (`sluice_core::top`), fed by every `ShouldRateLimit`
//! decision and read by `GET /top`.
//!
//! Recording must never slow a decision: each runtime thread counts into its own summaries (one
//! set per available CPU, merged when read), so two workers do not pass one lock back and forth;
//! the sets share one [`TopBounds`], so the replica tracks at most `max_rules` rules and holds at
//! most `4 × capacity × max_rules` counters whatever the number of sets;
//! the lock is only tried, and a decision that finds it held (a read in progress) is skipped
//! (counted in [`TopView::skipped`]). A descriptor is recorded when a rule with a limit decided it.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use sluice_core::clock::SharedClock;
use sluice_core::decision::{Decision, Status};
use sluice_core::holder;
use sluice_core::request::{Entry, LimitRequest, RequestDescriptor};
use sluice_core::top::{RuleView, Seen, TopBounds, TopKeys, TopOptions, merged_view};

/// Descriptors of a request hashed before taking the lock (the rest, rare, under it).
const HASHED_AHEAD: usize = 8;

/// Longest key label kept (bytes of `k=v, …`); longer ones end in `…`.
const MAX_LABEL_BYTES: usize = 160;

/// Threads get summary sets in turn: the `n`th thread to record uses set `n % sets`.
static NEXT_THREAD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static THREAD: Cell<Option<usize>> = const { Cell::new(None) };
}

fn thread_number() -> usize {
    THREAD.with(|slot| {
        slot.get().unwrap_or_else(|| {
            let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            slot.set(Some(n));
            n
        })
    })
}

/// Most keys per list a view shows (`GET /top?n=`).
pub const MAX_KEYS: usize = 100;

/// Most rules one view shows (`GET /top?limit=`); the rest are on the next pages.
pub const MAX_RULES_PER_VIEW: usize = 50;

/// Largest `--top-keys`.
pub const MAX_CAPACITY: usize = 1024;

/// One replica's summaries: a set per available CPU, within one [`TopBounds`].
pub struct TopRecorder {
    sets: Box<[Mutex<TopKeys>]>,
    bounds: TopBounds,
    hasher: RandomState,
    clock: SharedClock,
    skipped: AtomicU64,
}

/// Which rules of a view to show: `limit` (at most [`MAX_RULES_PER_VIEW`]) from `offset`, in
/// the view's order.
#[derive(Clone, Copy, Debug)]
pub struct Page {
    pub offset: usize,
    pub limit: usize,
}

/// What `GET /top` answers.
#[derive(Clone, Debug, Serialize)]
pub struct TopView {
    /// Counters per summary: a count is within its `error` of the truth, and `error` is at most
    /// the summary's decisions / `capacity`.
    pub capacity: usize,
    /// A view covers the current window and the one before.
    pub window_seconds: u64,
    /// Most rules tracked at once by this replica (decisions of others are `untracked`).
    pub max_rules: usize,
    /// The view's rules from `offset` on, at most the view's `limit`.
    pub rules: Vec<RuleView>,
    /// Rules in the whole view; `next_offset` asks for the next page (`None`: this is the last).
    pub rules_total: usize,
    pub offset: usize,
    pub next_offset: Option<usize>,
    /// Decisions of rules past the tracked bound, not summarized.
    pub untracked: u64,
    /// Decisions not recorded because the summaries were busy (since start).
    pub skipped: u64,
}

impl TopRecorder {
    /// `None` when `capacity` is 0 (summaries off).
    pub fn new(capacity: usize, window: Duration, clock: SharedClock) -> Option<Self> {
        let options = TopOptions {
            capacity,
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1),
            ..TopOptions::default()
        };
        let sets = std::thread::available_parallelism().map_or(1, usize::from);
        let bounds = TopBounds::for_options(&options);
        (capacity > 0).then(|| TopRecorder {
            sets: (0..sets)
                .map(|_| Mutex::new(TopKeys::sharing(options, bounds.clone())))
                .collect(),
            bounds,
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
                *hash = self.hash(keyed(descriptor, status));
            }
        }
        let now_ms = self.clock.now_ms();
        let set = &self.sets[thread_number() % self.sets.len()];
        let Ok(mut keys) = set.try_lock() else {
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
                .unwrap_or_else(|| self.hash(keyed(descriptor, status)));
            let seen = Seen {
                hash,
                over: status.over,
            };
            keys.record(now_ms, &rule.path, seen, || {
                label(keyed(descriptor, status))
            });
        }
    }

    /// The `n` top keys (at most [`MAX_KEYS`]) of `page`'s rules (or of `rule` only), every
    /// thread's counts merged.
    pub fn view(&self, n: usize, rule: Option<&str>, page: Page) -> TopView {
        let mut guards: Vec<_> = self
            .sets
            .iter()
            .map(|set| set.lock().unwrap_or_else(|e| e.into_inner()))
            .collect();
        let options = guards[0].options();
        let untracked = guards.iter().map(|g| g.untracked()).sum();
        let mut sets: Vec<&mut TopKeys> = guards.iter_mut().map(|g| &mut **g).collect();
        let mut rules = merged_view(&mut sets, self.clock.now_ms(), n.min(MAX_KEYS), rule);
        drop(guards);
        let rules_total = rules.len();
        let limit = page.limit.clamp(1, MAX_RULES_PER_VIEW);
        let end = page.offset.saturating_add(limit).min(rules_total);
        let rules: Vec<RuleView> = rules.drain(page.offset.min(end)..end).collect();
        TopView {
            capacity: options.capacity,
            window_seconds: options.window_ms / 1000,
            max_rules: options.max_rules,
            rules,
            rules_total,
            offset: page.offset,
            next_offset: (end < rules_total).then_some(end),
            untracked,
            skipped: self.skipped.load(Ordering::Relaxed),
        }
    }

    /// Rules tracked and counters held now, every set together.
    pub fn held(&self) -> (usize, usize) {
        (self.bounds.rules(), self.bounds.counters())
    }

    fn hash(&self, entries: &[Entry]) -> u64 {
        let mut h = self.hasher.build_hasher();
        for entry in entries {
            h.write(entry.key.as_bytes());
            h.write_u8(0xff);
            h.write(entry.value.as_bytes());
            h.write_u8(0xfe);
        }
        h.finish()
    }
}

/// The entries that name a descriptor's key: the holder entry of an in-flight cap or of
/// reservations left out, so a tenant is one key however many requests it holds.
fn keyed<'a>(descriptor: &'a RequestDescriptor, status: &Status) -> &'a [Entry] {
    match status.rule.as_ref().and_then(|r| r.holding()) {
        Some(holding) => holder::split(holding, &descriptor.entries).0,
        None => &descriptor.entries,
    }
}

/// `k=v,k2=v2` in [`crate::value_text`]'s form (typed back into `/buckets` or `sluice bucket`, it
/// names the same bytes), cut at [`MAX_LABEL_BYTES`] with a `…` (never part of that form).
fn label(entries: &[Entry]) -> Arc<str> {
    let mut text = String::new();
    for (i, entry) in entries.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&crate::value_text::encode(entry.key.as_bytes()));
        text.push('=');
        text.push_str(&crate::value_text::encode(entry.value.as_bytes()));
        if text.len() > MAX_LABEL_BYTES {
            break;
        }
    }
    if text.len() > MAX_LABEL_BYTES {
        // The form is ASCII: any byte is a char boundary.
        text.truncate(MAX_LABEL_BYTES);
        text.push('…');
    }
    Arc::from(text)
}
