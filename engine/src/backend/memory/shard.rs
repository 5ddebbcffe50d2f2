//! One independently locked part of the store: its buckets, their sweeping, and the per-rule
//! index that bounds each rule's share. Nothing that still counts is ever evicted: a bucket
//! leaves only once it is full again.

use std::collections::HashMap;

use indexmap::{IndexMap, IndexSet};

use super::slots::Ledgers;
use crate::algorithm::State;
use crate::rule::RuleId;

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
    /// minimum), so a shard at capacity skips its O(n) sweep when nothing could be swept: a
    /// flood against a full shard costs O(1) per refused key.
    pub(super) earliest_full_ms: u64,
    /// This shard's share of `max_buckets_per_rule`, if set.
    pub(super) rule_capacity: Option<usize>,
    /// Positions in `buckets` of each rule's buckets (kept only with a `rule_capacity`), so a
    /// rule's share is known in O(1).
    pub(super) members: HashMap<Option<RuleId>, IndexSet<usize>>,
    /// In-flight caps' slots, by key.
    pub(super) ledgers: Ledgers,
}

impl Shard {
    pub(super) fn new(capacity: usize, rule_capacity: Option<usize>) -> Self {
        Shard {
            buckets: IndexMap::new(),
            capacity,
            earliest_full_ms: u64::MAX,
            rule_capacity,
            members: HashMap::new(),
            ledgers: Ledgers::new(capacity),
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

    /// Whether one more bucket of `rule` fits under its bound, after dropping the buckets that
    /// are full again if it is at it.
    fn room_for_rule(&mut self, rule: Option<RuleId>, now_ms: u64) -> bool {
        let Some(cap) = self.rule_capacity else {
            return true;
        };
        let held = |shard: &Self| shard.members.get(&rule).map_or(0, IndexSet::len);
        if held(self) < cap {
            return true;
        }
        self.sweep(now_ms);
        held(self) < cap
    }

    /// The stored state of `key` as of `now_ms`; `None` (nothing counted) when missing or settled.
    pub(super) fn state(&self, key: &str, now_ms: u64) -> Option<State> {
        self.buckets
            .get(key)
            .filter(|slot| slot.full_at_ms > now_ms)
            .map(|slot| slot.state)
    }

    /// When the stored state of `key` settles, if it is stored and has not settled by `now_ms`.
    pub(super) fn settles_at(&self, key: &str, now_ms: u64) -> Option<u64> {
        self.buckets
            .get(key)
            .map(|slot| slot.full_at_ms)
            .filter(|&at| at > now_ms)
    }

    /// Drops `key`, whatever its state; false when it was not stored.
    pub(super) fn remove(&mut self, key: &str) -> bool {
        match self.buckets.get_index_of(key) {
            Some(index) => {
                self.remove_at(index);
                true
            }
            None => false,
        }
    }

    /// Writes back the decided state of a stored key (dropping it if it is full again); false
    /// when `key` is not stored, so nothing was written.
    pub(super) fn update(&mut self, key: &str, slot: Slot, now_ms: u64) -> bool {
        let Some((index, _, stored)) = self.buckets.get_full_mut(key) else {
            return false;
        };
        if slot.full_at_ms <= now_ms {
            self.remove_at(index);
        } else {
            // The bucket stays counted under the rule that created it.
            *stored = Slot {
                rule: stored.rule,
                ..slot
            };
            self.earliest_full_ms = self.earliest_full_ms.min(slot.full_at_ms);
        }
        true
    }

    /// Stores the decided state of a key that is not stored; a state that is full again needs
    /// no place. Room is made only by dropping buckets that are full again (dropping one that
    /// still counts would reset its client), so this is false, and nothing is stored, when the
    /// shard or the rule's share of it is at its bound with every bucket still counting.
    pub(super) fn insert(&mut self, key: &str, slot: Slot, now_ms: u64) -> bool {
        if slot.full_at_ms <= now_ms {
            return true;
        }
        if !self.room_for_rule(slot.rule, now_ms) || !self.room(now_ms) {
            return false;
        }
        let index = self.buckets.len();
        self.buckets.insert(key.to_owned(), slot);
        if self.rule_capacity.is_some() {
            self.members.entry(slot.rule).or_default().insert(index);
        }
        self.earliest_full_ms = self.earliest_full_ms.min(slot.full_at_ms);
        true
    }

    /// Whether one more bucket fits in the shard, after dropping the buckets that are full
    /// again if it is at capacity.
    fn room(&mut self, now_ms: u64) -> bool {
        if self.buckets.len() < self.capacity {
            return true;
        }
        self.sweep(now_ms);
        self.buckets.len() < self.capacity
    }

    /// Drops every bucket that is full again at `now_ms`; returns how many.
    pub(super) fn sweep(&mut self, now_ms: u64) -> usize {
        let expired = self.ledgers.sweep(now_ms);
        if now_ms < self.earliest_full_ms {
            return expired;
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
        swept + expired
    }
}
