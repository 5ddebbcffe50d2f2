//! Who is limited now: per rule, a fixed-memory summary of the keys most often over their limit
//! and of the most requested ones over the last minutes.
//!
//! Each summary is a Space-Saving sketch (Metwally, Agrawal, El Abbadi, 2005) of `capacity`
//! counters: a key already counted adds to its counter; a new key takes a free counter, or
//! replaces the smallest one and inherits its count as its `error`. For a stream of N offers,
//! every counter overestimates its key by at most its `error` ≤ N / capacity, and every key
//! offered more than N / capacity times holds a counter. Memory is `capacity` counters per summary
//! whatever the number of keys.
//!
//! "The last minutes" are two windows of `window_ms`: the current one and the one before it,
//! merged when read, so a view covers between one and two windows of history. Time is an
//! argument (ms on any monotonic clock).

mod bounds;

use std::collections::HashMap;
use std::sync::Arc;

pub use self::bounds::TopBounds;

/// One key's counter in a [`SpaceSaving`] summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    /// The key's identity (a hash of its descriptor entries).
    pub hash: u64,
    /// What an operator reads: `key=value, …`.
    pub label: Arc<str>,
    /// Offers counted, including `error`.
    pub count: u64,
    /// How much of `count` may belong to keys this counter replaced.
    pub error: u64,
}

/// A Space-Saving summary of at most `capacity` counters, each taken from the replica's
/// [`TopBounds`] when it has some: a summary denied one counts as full at the counters it has.
#[derive(Debug)]
pub struct SpaceSaving {
    capacity: usize,
    counters: Vec<Counter>,
    /// `counters[i].hash`, packed: a lookup scans 8 bytes per counter, not the whole counter.
    hashes: Vec<u64>,
    offered: u64,
    bounds: Option<TopBounds>,
    /// A counter was denied (the replica's counters were all held).
    starved: bool,
}

impl SpaceSaving {
    pub fn new(capacity: usize) -> Self {
        SpaceSaving::within(capacity, None)
    }

    fn within(capacity: usize, bounds: Option<TopBounds>) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            counters: Vec::new(),
            hashes: Vec::new(),
            offered: 0,
            bounds,
            starved: false,
        }
    }

    /// An empty summary of the same capacity, taking its counters from the same bounds.
    fn fresh(&self) -> Self {
        SpaceSaving::within(self.capacity, self.bounds.clone())
    }

    fn take_counter(&mut self) -> bool {
        let taken = self.bounds.as_ref().is_none_or(TopBounds::take_counter);
        self.starved |= !taken;
        taken
    }

    /// Counts `weight` offers of the key `hash`; `label` is called only when the key takes a
    /// counter.
    pub fn offer(&mut self, hash: u64, label: impl FnOnce() -> Arc<str>, weight: u64) {
        self.offered = self.offered.saturating_add(weight);
        if let Some(i) = self.hashes.iter().position(|h| *h == hash) {
            let counter = &mut self.counters[i];
            counter.count = counter.count.saturating_add(weight);
            return;
        }
        if self.counters.len() < self.capacity && self.take_counter() {
            self.hashes.push(hash);
            self.counters.push(Counter {
                hash,
                label: label(),
                count: weight,
                error: 0,
            });
            return;
        }
        // Denied its first counter: the offer is counted in `offered` only (see `floor`).
        let Some((i, smallest)) = self
            .counters
            .iter_mut()
            .enumerate()
            .min_by_key(|(_, c)| c.count)
        else {
            return;
        };
        self.hashes[i] = hash;
        *smallest = Counter {
            hash,
            label: label(),
            count: smallest.count.saturating_add(weight),
            error: smallest.count,
        };
    }

    /// Offers counted since the summary was made.
    pub fn offered(&self) -> u64 {
        self.offered
    }

    pub fn counters(&self) -> &[Counter] {
        &self.counters
    }

    /// The smallest count when every counter is taken (a key without a counter was offered at
    /// most this often), else 0; every offer when the summary was denied its first counter.
    pub fn floor(&self) -> u64 {
        if self.counters.len() < self.capacity && !self.starved {
            return 0;
        }
        self.counters
            .iter()
            .map(|c| c.count)
            .min()
            .unwrap_or(self.offered)
    }
}

impl Drop for SpaceSaving {
    fn drop(&mut self) {
        if let Some(bounds) = &self.bounds {
            bounds.give_counters(self.counters.len());
        }
    }
}

/// A key in a read view: `count` offers over the view's span, within ± `error` of the truth.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Ranked {
    pub key: Arc<str>,
    pub count: u64,
    pub error: u64,
}

/// A [`SpaceSaving`] summary over the current window and the one before it.
#[derive(Debug)]
pub struct Windowed {
    current: SpaceSaving,
    previous: Option<SpaceSaving>,
    started_ms: u64,
}

impl Windowed {
    /// Windows start at multiples of `window_ms`, so summaries made apart line up.
    fn new(capacity: usize, now_ms: u64, window_ms: u64, bounds: &TopBounds) -> Self {
        Windowed {
            current: SpaceSaving::within(capacity, Some(bounds.clone())),
            previous: None,
            started_ms: now_ms - now_ms % window_ms.max(1),
        }
    }

    /// The current window's summary and the previous one's, if any.
    fn parts(&self) -> impl Iterator<Item = &SpaceSaving> {
        std::iter::once(&self.current).chain(self.previous.as_ref())
    }

    /// Starts a new window when `now_ms` is past the current one (dropping the previous one, and
    /// the current one too when a whole window passed without offers).
    fn roll(&mut self, now_ms: u64, window_ms: u64) {
        let window_ms = window_ms.max(1);
        if now_ms < self.started_ms + window_ms {
            return;
        }
        let fresh = self.current.fresh();
        let ended = std::mem::replace(&mut self.current, fresh);
        let windows = (now_ms - self.started_ms) / window_ms;
        self.previous = (windows == 1).then_some(ended);
        self.started_ms += windows * window_ms;
    }

    fn offer(&mut self, now_ms: u64, window_ms: u64, hash: u64, label: impl FnOnce() -> Arc<str>) {
        self.roll(now_ms, window_ms);
        self.current.offer(hash, label, 1);
    }
}

/// The `n` keys offered most over `parts` (summaries of the same span's windows or of several
/// summaries of one span), most first, and the offers counted. A key counted in some parts only
/// may have been offered in each other one up to that part's [`SpaceSaving::floor`]; that is
/// added to its `error`.
fn top_of(parts: &[&SpaceSaving], n: usize) -> (Vec<Ranked>, u64) {
    let mut merged: HashMap<u64, Ranked> = HashMap::new();
    for part in parts {
        for c in part.counters() {
            let entry = merged.entry(c.hash).or_insert_with(|| Ranked {
                key: c.label.clone(),
                count: 0,
                error: 0,
            });
            entry.count += c.count;
            entry.error += c.error;
        }
    }
    for (hash, ranked) in merged.iter_mut() {
        for part in parts {
            if !part.counters().iter().any(|c| c.hash == *hash) {
                ranked.error += part.floor();
            }
        }
    }
    let mut ranked: Vec<Ranked> = merged.into_values().collect();
    ranked.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    ranked.truncate(n);
    let offered = parts.iter().map(|p| p.offered()).sum();
    (ranked, offered)
}

impl TopBounds {
    /// The bounds `options` describe: `max_rules` rules of `2 × 2 × capacity` counters.
    pub fn for_options(options: &TopOptions) -> Self {
        let per_rule = options.capacity.max(1).saturating_mul(4);
        TopBounds::new(
            options.max_rules,
            options.max_rules.saturating_mul(per_rule),
        )
    }
}

/// Shape of a replica's [`TopKeys`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopOptions {
    /// Counters per summary.
    pub capacity: usize,
    /// Length of one window; a view covers one to two.
    pub window_ms: u64,
    /// Rules tracked at once; the offers of further rules are counted in
    /// [`TopKeys::untracked`] only.
    pub max_rules: usize,
}

impl Default for TopOptions {
    fn default() -> Self {
        TopOptions {
            capacity: 64,
            window_ms: 60_000,
            max_rules: 1_000,
        }
    }
}

#[derive(Debug)]
struct RuleTop {
    limited: Windowed,
    active: Windowed,
}

/// One decision of one descriptor, as [`TopKeys::record`] counts it.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// Hash of the descriptor's entries.
    pub hash: u64,
    /// The bucket could not pay (shadow rules included).
    pub over: bool,
}

/// One rule's read view.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RuleView {
    /// The rule's dotted config path (its metric label).
    pub rule: Arc<str>,
    /// Keys most often over the limit.
    pub limited: Vec<Ranked>,
    /// Over-limit decisions counted over the view's span.
    pub limited_total: u64,
    /// Keys most often decided.
    pub active: Vec<Ranked>,
    /// Decisions counted over the view's span.
    pub active_total: u64,
}

/// Per rule (by config path), the keys most often limited and most active over the last one to
/// two windows, in fixed memory: `2 × 2 × capacity` counters per rule, at most `max_rules` rules.
/// Several `TopKeys` sharing one [`TopBounds`] hold that much together.
#[derive(Debug)]
pub struct TopKeys {
    options: TopOptions,
    rules: HashMap<Arc<str>, RuleTop>,
    untracked: u64,
    bounds: TopBounds,
}

impl TopKeys {
    /// A replica's only set: bounds of its own.
    pub fn new(options: TopOptions) -> Self {
        TopKeys::sharing(options, TopBounds::for_options(&options))
    }

    /// One of a replica's sets, every set holding at most `bounds` together.
    pub fn sharing(options: TopOptions, bounds: TopBounds) -> Self {
        TopKeys {
            options,
            rules: HashMap::new(),
            untracked: 0,
            bounds,
        }
    }

    pub fn options(&self) -> TopOptions {
        self.options
    }

    /// Counts one decision of `rule` at `now_ms`; `label` names the key (called only when the
    /// key takes a counter).
    pub fn record(
        &mut self,
        now_ms: u64,
        rule: &Arc<str>,
        seen: Seen,
        label: impl Fn() -> Arc<str>,
    ) {
        let TopOptions {
            capacity,
            window_ms,
            ..
        } = self.options;
        if !self.rules.contains_key(rule) {
            if !self.bounds.admit_rule(rule) {
                self.untracked = self.untracked.saturating_add(1);
                return;
            }
            let fresh = || Windowed::new(capacity, now_ms, window_ms, &self.bounds);
            self.rules.insert(
                rule.clone(),
                RuleTop {
                    limited: fresh(),
                    active: fresh(),
                },
            );
        }
        let top = self.rules.get_mut(rule).expect("inserted above");
        top.active.offer(now_ms, window_ms, seen.hash, &label);
        if seen.over {
            top.limited.offer(now_ms, window_ms, seen.hash, &label);
        } else {
            top.limited.roll(now_ms, window_ms);
        }
    }

    /// Decisions of rules beyond `max_rules`, not summarized.
    pub fn untracked(&self) -> u64 {
        self.untracked
    }

    /// Every rule with a decision in the last two windows, the `n` top keys of each, rules with
    /// the most over-limit decisions first. `rule` keeps only that rule.
    pub fn view(&mut self, now_ms: u64, n: usize, rule: Option<&str>) -> Vec<RuleView> {
        merged_view(&mut [self], now_ms, n, rule)
    }

    /// Rolls every rule's windows to `now_ms` and forgets the rules with no decision in them.
    fn roll(&mut self, now_ms: u64) {
        let window_ms = self.options.window_ms;
        let bounds = &self.bounds;
        self.rules.retain(|rule, top| {
            top.active.roll(now_ms, window_ms);
            top.limited.roll(now_ms, window_ms);
            let kept = top.active.parts().any(|p| p.offered() > 0);
            if !kept {
                bounds.release_rule(rule);
            }
            kept
        });
    }
}

impl Drop for TopKeys {
    fn drop(&mut self) {
        for rule in self.rules.keys() {
            self.bounds.release_rule(rule);
        }
    }
}

/// [`TopKeys::view`] over several summaries of the same decisions' stream split between them (a
/// replica's runtime workers each count into their own): a rule's parts are merged as its two
/// windows are.
pub fn merged_view(
    shards: &mut [&mut TopKeys],
    now_ms: u64,
    n: usize,
    rule: Option<&str>,
) -> Vec<RuleView> {
    let mut paths: Vec<Arc<str>> = Vec::new();
    for shard in shards.iter_mut() {
        shard.roll(now_ms);
        paths.extend(shard.rules.keys().cloned());
    }
    paths.sort();
    paths.dedup();
    paths.retain(|p| rule.is_none_or(|r| r == &**p));
    let mut views: Vec<RuleView> = paths
        .into_iter()
        .map(|path| {
            let tops: Vec<&RuleTop> = shards.iter().filter_map(|s| s.rules.get(&path)).collect();
            let active: Vec<&SpaceSaving> = tops.iter().flat_map(|t| t.active.parts()).collect();
            let limited: Vec<&SpaceSaving> = tops.iter().flat_map(|t| t.limited.parts()).collect();
            let (active, active_total) = top_of(&active, n);
            let (limited, limited_total) = top_of(&limited, n);
            RuleView {
                rule: path,
                limited,
                limited_total,
                active,
                active_total,
            }
        })
        .collect();
    views.sort_by(|a, b| {
        b.limited_total
            .cmp(&a.limited_total)
            .then_with(|| b.active_total.cmp(&a.active_total))
            .then_with(|| a.rule.cmp(&b.rule))
    });
    views
}

#[cfg(test)]
mod tests;
