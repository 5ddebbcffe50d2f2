//! In-flight caps: at most `capacity` holders at once per key, each slot named by its holder and
//! freed by that holder's release or, at the latest, `max_hold` after it was taken.
//!
//! The contract shared with `lua/limit.lua` (code 5; keep them in step). `params.capacity` is the
//! cap (`in_flight.max`), `params.unit_ms` the maximum hold; a demand names its holder
//! ([`Demand::holder`], 64 bits of the holder entry's value, [`holder_id`]).
//! 1. A key's [`Ledger`] maps holder → expiry (ms). Brought to `now`, every slot whose expiry is
//!    `<= now` is gone (Redis: `ZREMRANGEBYSCORE key -inf now`).
//! 2. The decision sees the ledger through one holder's [`Slots`]: live slots, whether this
//!    holder holds one, the earliest and latest expiry. A take (hits >= 1) fits when the holder
//!    holds a slot already (idempotent: no second slot) or `live < capacity`; a check-only
//!    demand (hits 0) fits on the same test and takes nothing; a release (`refund`) always fits.
//! 3. Taken only when the whole request is allowed, and only by a holder without a slot: the slot
//!    expires at `now + max_hold`. A release frees the holder's own slot, if it holds one;
//!    the release of a stranger (a refused request, an expired slot) frees nothing.
//! 4. `remaining = capacity - live` after the call; `until_full` = until the latest expiry (every
//!    slot free at the latest); `retry_after` = until the earliest expiry, at most
//!    [`RETRY_HINT_MS`] (a release may free a slot at any time), `granted` 1 for a new slot or a
//!    freed one (a release of the holder's own slot), else 0.
//!
//! The bound: at no time do more than `capacity` holders hold a slot of one key, whatever the
//! replicas and the order of calls, because every take and release of a key is decided in one
//! atomic step against the same ledger.

use std::collections::BTreeMap;

use super::{BucketParams, Demand, Verdict};

/// The longest retry-after an in-flight refusal reports: the earliest expiry may be minutes
/// away while a release can free a slot at any moment.
pub const RETRY_HINT_MS: u64 = 1_000;

/// The 64-bit name of a holder (the descriptor entry's value, e.g. Envoy's `x-request-id`): the
/// first 8 bytes of its SHA-1, so any value, of any length, is one fixed-width ZSET member.
pub fn holder_id(value: &[u8]) -> u64 {
    let digest = sha1_smol::Sha1::from(value).digest().bytes();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// A key's slots as one holder sees them at one `now`: what [`super::decide`] decides with. The
/// state the four algorithms keep in the key itself is, for a cap, the [`Ledger`]; this is the
/// backend's view of it for the deciding holder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slots {
    /// Slots held and not expired.
    pub live: u64,
    /// The demand's holder holds one of them.
    pub holds: bool,
    /// Expiry of the slot that frees first, ms (0 when none is held).
    pub first_expiry_ms: u64,
    /// Expiry of the slot that frees last, ms (0 when none is held): an upper bound after a
    /// release, exact otherwise.
    pub last_expiry_ms: u64,
}

/// Holder → expiry (ms) of one key: a Redis ZSET scored by expiry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    holders: BTreeMap<u64, u64>,
}

impl Ledger {
    /// Drops every slot expired at `now_ms` (expiry `<= now`).
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let before = self.holders.len();
        self.holders.retain(|_, expiry| *expiry > now_ms);
        before - self.holders.len()
    }

    /// The slots as `holder` sees them (expired ones must be dropped first, [`Ledger::expire`]).
    pub fn view(&self, holder: Option<u64>) -> Slots {
        let expiries = self.holders.values();
        Slots {
            live: self.holders.len() as u64,
            holds: holder.is_some_and(|h| self.holders.contains_key(&h)),
            first_expiry_ms: expiries.clone().copied().min().unwrap_or(0),
            last_expiry_ms: expiries.copied().max().unwrap_or(0),
        }
    }

    /// Writes what a decision made of `holder`'s slot: taken (`after.holds` and not
    /// `before.holds`) at `now + max_hold`, or freed.
    pub fn apply(&mut self, holder: u64, before: &Slots, after: &Slots, expiry_ms: u64) {
        match (before.holds, after.holds) {
            (false, true) => {
                self.holders.insert(holder, expiry_ms);
            }
            (true, false) => {
                self.holders.remove(&holder);
            }
            _ => {}
        }
    }

    pub fn is_empty(&self) -> bool {
        self.holders.is_empty()
    }

    /// Slots held (expired ones included until [`Ledger::expire`]).
    pub fn len(&self) -> usize {
        self.holders.len()
    }

    /// When the last slot expires (0 when none is held).
    pub fn settled_at_ms(&self) -> u64 {
        self.holders.values().copied().max().unwrap_or(0)
    }
}

/// Whether `demand` fits the slots: a release always; a take or check when its holder holds a
/// slot already or one is free.
pub fn fits(s: &Slots, demand: &Demand) -> bool {
    demand.refund || s.holds || s.live < demand.params.capacity
}

/// Applies the demand (`take` only when the request is allowed) and answers.
pub fn settle(s: Slots, now_ms: u64, demand: &Demand, fits: bool, take: bool) -> (Slots, Verdict) {
    let p: &BucketParams = &demand.params;
    let mut after = s;
    let mut granted = 0;
    if demand.refund {
        if s.holds {
            after.holds = false;
            after.live -= 1;
            granted = 1;
        }
    } else if take && demand.tokens > 0 && !s.holds {
        let expiry = now_ms.saturating_add(p.unit_ms);
        after.holds = true;
        after.live += 1;
        after.first_expiry_ms = if s.live == 0 {
            expiry
        } else {
            s.first_expiry_ms.min(expiry)
        };
        after.last_expiry_ms = s.last_expiry_ms.max(expiry);
        granted = 1;
    }
    if after.live == 0 {
        after.first_expiry_ms = 0;
        after.last_expiry_ms = 0;
    }
    let retry_after_ms = if fits {
        Some(0)
    } else {
        Some(
            after
                .first_expiry_ms
                .saturating_sub(now_ms)
                .clamp(1, RETRY_HINT_MS),
        )
    };
    let verdict = Verdict {
        allowed: fits,
        remaining: p.capacity.saturating_sub(after.live),
        retry_after_ms,
        until_full_ms: after.last_expiry_ms.saturating_sub(now_ms),
        granted,
    };
    (after, verdict)
}

/// From this time on the key holds no slot.
pub fn settled_at_ms(s: &Slots) -> u64 {
    s.last_expiry_ms
}

#[cfg(test)]
mod tests {
    use super::super::{Algorithm, State, decide};
    use super::*;

    const HOLD: u64 = 2_000;
    const P: BucketParams = BucketParams {
        capacity: 2,
        requests_per_unit: 2,
        unit_ms: HOLD,
    };

    fn demand(holder: u64, tokens: u64, refund: bool) -> Demand {
        Demand {
            refund,
            holder,
            ..Demand::take(Algorithm::InFlight, P, tokens)
        }
    }

    /// One call as a backend makes it: expire, view, decide, apply.
    fn call(ledger: &mut Ledger, now: u64, d: Demand) -> Verdict {
        ledger.expire(now);
        let before = ledger.view(Some(d.holder));
        let mut states = [Some(State::InFlight(before))];
        let verdict = decide(now, &[d], &mut states)[0];
        let Some(State::InFlight(after)) = states[0] else {
            panic!("{states:?}")
        };
        ledger.apply(d.holder, &before, &after, now + HOLD);
        verdict
    }

    #[test]
    fn takes_up_to_the_cap_then_refuses() {
        let mut l = Ledger::default();
        let now = 10_000;
        assert!(call(&mut l, now, demand(1, 1, false)).allowed);
        let second = call(&mut l, now + 5, demand(2, 1, false));
        assert_eq!(
            (second.allowed, second.remaining, second.granted),
            (true, 0, 1)
        );
        assert_eq!(second.until_full_ms, HOLD);
        let third = call(&mut l, now + 10, demand(3, 1, false));
        assert_eq!((third.allowed, third.granted), (false, 0));
        assert_eq!(third.retry_after_ms, Some(RETRY_HINT_MS));
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_holder_taking_again_keeps_its_one_slot() {
        let mut l = Ledger::default();
        assert!(call(&mut l, 0, demand(1, 1, false)).allowed);
        assert!(call(&mut l, 1, demand(2, 1, false)).allowed);
        let again = call(&mut l, 2, demand(1, 1, false));
        assert_eq!(
            (again.allowed, again.granted, again.remaining),
            (true, 0, 0)
        );
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn a_release_frees_the_holders_slot_only() {
        let mut l = Ledger::default();
        call(&mut l, 0, demand(1, 1, false));
        call(&mut l, 0, demand(2, 1, false));
        assert!(!call(&mut l, 0, demand(3, 1, false)).allowed);
        // The refused holder's release frees nothing: the cap stays full.
        let stranger = call(&mut l, 1, demand(3, 1, true));
        assert_eq!((stranger.allowed, stranger.remaining), (true, 0));
        assert!(!call(&mut l, 2, demand(4, 1, false)).allowed);
        assert_eq!(stranger.granted, 0, "freed nothing");
        // A holder's own release frees its slot, once.
        let own = call(&mut l, 3, demand(1, 1, true));
        assert_eq!((own.remaining, own.granted), (1, 1));
        let again = call(&mut l, 3, demand(1, 1, true));
        assert_eq!((again.remaining, again.granted), (1, 0));
        assert!(call(&mut l, 4, demand(4, 1, false)).allowed);
        assert!(!call(&mut l, 4, demand(5, 1, false)).allowed);
    }

    #[test]
    fn slots_expire_after_the_maximum_hold() {
        let mut l = Ledger::default();
        call(&mut l, 0, demand(1, 1, false));
        call(&mut l, 500, demand(2, 1, false));
        let refused = call(&mut l, HOLD - 1, demand(3, 1, false));
        assert_eq!((refused.allowed, refused.retry_after_ms), (false, Some(1)));
        // At the first expiry its slot is gone; the second one lasts until its own.
        assert!(call(&mut l, HOLD, demand(3, 1, false)).allowed);
        assert!(!call(&mut l, HOLD + 499, demand(4, 1, false)).allowed);
        assert!(call(&mut l, HOLD + 500, demand(4, 1, false)).allowed);
        // An expired holder's late release frees nothing of the others.
        assert_eq!(call(&mut l, HOLD + 501, demand(1, 1, true)).remaining, 0);
        assert_eq!(l.expire(10 * HOLD), 2);
        assert!(l.is_empty());
    }

    #[test]
    fn a_check_takes_nothing_and_a_refused_request_takes_no_slot() {
        let mut l = Ledger::default();
        let check = call(&mut l, 0, demand(1, 0, false));
        assert_eq!(
            (check.allowed, check.granted, check.remaining),
            (true, 0, 2)
        );
        assert!(l.is_empty());
        // Beside a key that refuses, the cap's fitting take is not taken.
        let over = Demand::take(Algorithm::TokenBucket, P, 5);
        let before = l.view(Some(7));
        let mut states = [Some(State::InFlight(before)), None];
        let verdicts = decide(0, &[demand(7, 1, false), over], &mut states);
        assert_eq!((verdicts[0].allowed, verdicts[0].granted), (true, 0));
        assert!(!verdicts[1].allowed);
        assert_eq!(states[0], Some(State::InFlight(before)));
    }

    #[test]
    fn holder_ids_are_stable_and_distinct() {
        assert_eq!(holder_id(b"abc"), holder_id(b"abc"));
        assert_ne!(holder_id(b"abc"), holder_id(b"abd"));
        assert_eq!(holder_id(b"abc"), 0xa999_3e36_4706_816a);
    }
}
