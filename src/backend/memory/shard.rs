//! One independently locked part of the store: its buckets, their eviction and sweeping, and
//! the per-rule index that bounds each rule's share.

use std::collections::HashMap;

use indexmap::{IndexMap, IndexSet};

use crate::algorithm::State;
use crate::backend::Hit;
use crate::rule::RuleId;

/// Buckets looked at when a shard must evict one that is not yet full again.
const EVICTION_SAMPLE: usize = 8;

/// One stored key.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub(super) state: State,
    /// From this time on the state is as good as missing ([`State::settled_at_ms`]).
    pub(super) full_at_ms: u64,
    /// The rule that created the bucket.
    pub(super) rule: Option<RuleId>,
}

pub(super) struct Shard {
    pub(super) buckets: IndexMap<String, Slot>,
    /// This shard's share of `max_buckets`.
    pub(super) capacity: usize,
    /// No bucket here is full again before this time (a lower bound: updates may raise the true
    /// minimum), so a shard at capacity skips its O(n) sweep when nothing could be swept.
    pub(super) earliest_full_ms: u64,
    /// This shard's share of `max_buckets_per_rule`, if set.
    pub(super) rule_capacity: Option<usize>,
    /// Positions in `buckets` of each rule's buckets (kept only with a `rule_capacity`), so a
    /// rule at its bound finds a victim among its own buckets in O(1).
    pub(super) members: HashMap<Option<RuleId>, IndexSet<usize>>,
}

impl Shard {
    pub(super) fn new(capacity: usize, rule_capacity: Option<usize>) -> Self {
        Shard {
            buckets: IndexMap::new(),
            capacity,
            earliest_full_ms: u64::MAX,
            rule_capacity,
            members: HashMap::new(),
        }
    }

    /// Removes the bucket at `index`; the last bucket moves into its place.
    fn remove_at(&mut self, index: usize) {
        let last = self.buckets.len() - 1;
        let Some((_, removed)) = self.buckets.swap_remove_index(index) else {
            return;
        };
        if self.rule_capacity.is_none() {
            return;
        }
        if let Some(set) = self.members.get_mut(&removed.rule) {
            set.swap_remove(&index);
            if set.is_empty() {
                self.members.remove(&removed.rule);
            }
        }
        if index != last {
            let moved = self.buckets[index].rule;
            if let Some(set) = self.members.get_mut(&moved) {
                set.swap_remove(&last);
                set.insert(index);
            }
        }
    }

    fn rebuild_members(&mut self) {
        if self.rule_capacity.is_none() {
            return;
        }
        self.members.clear();
        for (index, slot) in self.buckets.values().enumerate() {
            self.members.entry(slot.rule).or_default().insert(index);
        }
    }

    /// Frees a place for one more bucket of `rule` if it is at its bound, by evicting the one of
    /// its buckets closest to full (sampled). False when every candidate belongs to `request`.
    fn make_room_for_rule(&mut self, rule: Option<RuleId>, request: &[Hit]) -> bool {
        let Some(cap) = self.rule_capacity else {
            return true;
        };
        let Some(set) = self.members.get(&rule) else {
            return true;
        };
        if set.len() < cap {
            return true;
        }
        let len = set.len();
        let sampled = len > EVICTION_SAMPLE;
        let victim = (0..len.min(EVICTION_SAMPLE))
            .map(|i| {
                if sampled {
                    rand::random_range(0..len)
                } else {
                    i
                }
            })
            .filter_map(|i| set.get_index(i).copied())
            .filter_map(|pos| self.buckets.get_index(pos).map(|(k, s)| (pos, k, s)))
            .filter(|(_, k, _)| !request.iter().any(|hit| hit.key == **k))
            .min_by_key(|(_, _, slot)| slot.full_at_ms)
            .map(|(pos, _, _)| pos);
        match victim {
            Some(pos) => {
                self.remove_at(pos);
                true
            }
            None => false,
        }
    }

    /// The stored state of `key` as of `now_ms`; `None` (nothing counted) when missing or settled.
    pub(super) fn state(&self, key: &str, now_ms: u64) -> Option<State> {
        self.buckets
            .get(key)
            .filter(|slot| slot.full_at_ms > now_ms)
            .map(|slot| slot.state)
    }

    /// Writes back a decided bucket. `request` holds every hit of the deciding request, none of
    /// which may be evicted to make room for another.
    pub(super) fn store(&mut self, key: &str, slot: Slot, now_ms: u64, request: &[Hit]) {
        let full = slot.full_at_ms <= now_ms;
        if let Some((index, _, stored)) = self.buckets.get_full_mut(key) {
            if full {
                self.remove_at(index);
            } else {
                // The bucket stays counted under the rule that created it.
                *stored = Slot {
                    rule: stored.rule,
                    ..slot
                };
                self.earliest_full_ms = self.earliest_full_ms.min(slot.full_at_ms);
            }
            return;
        }
        if full || !self.make_room_for_rule(slot.rule, request) || !self.make_room(now_ms, request)
        {
            return;
        }
        let index = self.buckets.len();
        self.buckets.insert(key.to_owned(), slot);
        if self.rule_capacity.is_some() {
            self.members.entry(slot.rule).or_default().insert(index);
        }
        self.earliest_full_ms = self.earliest_full_ms.min(slot.full_at_ms);
    }

    /// Frees one place if the shard is at capacity. False only when every candidate belongs to
    /// the current request (a shard smaller than one request's keys).
    fn make_room(&mut self, now_ms: u64, request: &[Hit]) -> bool {
        if self.buckets.len() < self.capacity {
            return true;
        }
        self.sweep(now_ms);
        if self.buckets.len() < self.capacity {
            return true;
        }
        // Evicting a bucket resets it to full, so the bucket closest to full loses the least
        // information; sampling keeps this O(1) instead of scanning the shard.
        let len = self.buckets.len();
        let sampled = len > EVICTION_SAMPLE;
        let victim = (0..len.min(EVICTION_SAMPLE))
            .map(|i| {
                if sampled {
                    rand::random_range(0..len)
                } else {
                    i
                }
            })
            .filter_map(|i| {
                self.buckets
                    .get_index(i)
                    .map(|(k, slot)| (i, k, slot.full_at_ms))
            })
            .filter(|(_, k, _)| !request.iter().any(|hit| hit.key == **k))
            .min_by_key(|&(_, _, full_at)| full_at)
            .map(|(i, _, _)| i);
        match victim {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// Drops every bucket that is full again at `now_ms`; returns how many.
    pub(super) fn sweep(&mut self, now_ms: u64) -> usize {
        if now_ms < self.earliest_full_ms {
            return 0;
        }
        let before = self.buckets.len();
        let mut earliest = u64::MAX;
        self.buckets.retain(|_, slot| {
            let live = slot.full_at_ms > now_ms;
            if live {
                earliest = earliest.min(slot.full_at_ms);
            }
            live
        });
        self.earliest_full_ms = earliest;
        let swept = before - self.buckets.len();
        if swept > 0 {
            self.rebuild_members();
        }
        swept
    }
}
