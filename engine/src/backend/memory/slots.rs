//! In-flight caps in memory: each key's [`Ledger`] (holder → expiry), beside the shard's
//! buckets. A decision sees it through the deciding holder's [`Slots`] and writes back what
//! [`crate::algorithm::decide`] made of that holder's slot, under the same shard lock, so a cap
//! is decided atomically with the request's other keys (as `lua/limit.lua` does on its ZSET).

use std::collections::HashMap;

use crate::algorithm::{Ledger, Slots, State};

/// The ledgers of one shard; a key whose last slot is released or expired is dropped. At most
/// `capacity` keys hold slots (the shard's share of `--memory-max-buckets`, counted apart from
/// its buckets), so a flood of fresh tenants cannot grow the store without bound.
pub(super) struct Ledgers {
    by_key: HashMap<String, Ledger>,
    capacity: usize,
}

impl Ledgers {
    pub(super) fn new(capacity: usize) -> Self {
        Ledgers {
            by_key: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

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
    /// False when the slot's key is new and no room is left for it (nothing is written).
    pub(super) fn apply(
        &mut self,
        key: &str,
        holder: u64,
        (before, after): (&Slots, Option<&State>),
        (now_ms, expiry_ms): (u64, u64),
    ) -> bool {
        let Some(State::InFlight(after)) = after else {
            return true;
        };
        if before.holds == after.holds {
            return true;
        }
        if !self.by_key.contains_key(key)
            && self.by_key.len() >= self.capacity
            && (self.sweep(now_ms) == 0 || self.by_key.len() >= self.capacity)
        {
            return false;
        }
        let ledger = self.by_key.entry(key.to_owned()).or_default();
        ledger.apply(holder, before, after, expiry_ms);
        if ledger.is_empty() {
            self.by_key.remove(key);
        }
        true
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::algorithm::{Algorithm, BucketParams};
    use crate::backend::memory::{MemoryBackend, MemoryOptions};
    use crate::backend::{Backend, BackendError, Hit};
    use crate::clock::ManualClock;

    fn take(key: &str, holder: u64) -> Hit {
        let params = BucketParams {
            capacity: 1,
            requests_per_unit: 1,
            unit_ms: 1_000,
        };
        let mut hit = Hit::new(key, params, 1).using(Algorithm::InFlight);
        hit.demand.holder = holder;
        hit
    }

    /// Keys holding slots are bounded like buckets: a new tenant finds no room while every
    /// stored key still holds a slot (its hit goes to the failure policy), and room again once
    /// one expires.
    #[tokio::test]
    async fn keys_holding_slots_are_bounded() {
        let clock = ManualClock::new(1_000_000);
        let opts = MemoryOptions {
            max_buckets: 1,
            shards: 1,
            max_buckets_per_rule: None,
        };
        let b = MemoryBackend::new(Arc::new(clock.clone()), opts);
        assert!(
            b.check_each(&[take("a", 1)]).await[0]
                .as_ref()
                .unwrap()
                .allowed
        );
        let refused = b.check_each(&[take("b", 2)]).await;
        assert!(
            matches!(refused[0], Err(BackendError::Overloaded(_))),
            "{refused:?}"
        );
        assert_eq!(b.refused_total(), 1);
        clock.advance(1_000);
        assert!(
            b.check_each(&[take("b", 2)]).await[0]
                .as_ref()
                .unwrap()
                .allowed
        );
    }
}
