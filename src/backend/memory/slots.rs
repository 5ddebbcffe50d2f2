//! In-flight caps in memory: each key's [`Ledger`] (holder → expiry), beside the shard's
//! buckets. A decision sees it through the deciding holder's [`Slots`] and writes back what
//! [`crate::algorithm::decide`] made of that holder's slot, under the same shard lock, so a cap
//! is decided atomically with the request's other keys (as `lua/limit.lua` does on its ZSET).

use std::collections::HashMap;

use crate::algorithm::{Ledger, Slots, State};

/// The ledgers of one shard; a key whose last slot is released or expired is dropped.
#[derive(Default)]
pub(super) struct Ledgers {
    by_key: HashMap<String, Ledger>,
}

impl Ledgers {
    /// `key`'s slots as `holder` sees them at `now_ms` (expired slots dropped first, as the
    /// script's ZREMRANGEBYSCORE does).
    pub(super) fn view(&mut self, key: &str, holder: Option<u64>, now_ms: u64) -> Slots {
        match self.by_key.get_mut(key) {
            Some(ledger) => {
                ledger.expire(now_ms);
                ledger.view(holder)
            }
            None => Slots::default(),
        }
    }

    /// Writes what the decision made of `holder`'s slot; a new slot expires at `expiry_ms`.
    pub(super) fn apply(
        &mut self,
        key: &str,
        holder: u64,
        (before, after): (&Slots, Option<&State>),
        expiry_ms: u64,
    ) {
        let Some(State::InFlight(after)) = after else {
            return;
        };
        if before.holds == after.holds {
            return;
        }
        let ledger = self.by_key.entry(key.to_owned()).or_default();
        ledger.apply(holder, before, after, expiry_ms);
        if ledger.is_empty() {
            self.by_key.remove(key);
        }
    }

    /// `key`'s slots at `now_ms` without dropping anything (a peek), if it holds any.
    pub(super) fn peek(&self, key: &str, now_ms: u64) -> Option<Slots> {
        let mut ledger = self.by_key.get(key)?.clone();
        ledger.expire(now_ms);
        (!ledger.is_empty()).then(|| ledger.view(None))
    }

    /// Frees every slot of `key`; true when one was held.
    pub(super) fn remove(&mut self, key: &str, now_ms: u64) -> bool {
        self.by_key.remove(key).is_some_and(|mut ledger| {
            ledger.expire(now_ms);
            !ledger.is_empty()
        })
    }

    /// Drops the keys whose every slot has expired; returns how many.
    pub(super) fn sweep(&mut self, now_ms: u64) -> usize {
        let before = self.by_key.len();
        self.by_key.retain(|_, ledger| {
            ledger.expire(now_ms);
            !ledger.is_empty()
        });
        before - self.by_key.len()
    }
}
