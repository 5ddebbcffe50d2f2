//! Reservations: take a request's maximum cost up front, settle at stream done.
//!
//! A rule with `reserve` keeps, beside its bucket, one ledger key per holder (the descriptor's
//! holder entry, Envoy's `x-request-id`). The contract shared with `lua/limit.lua` (code 6; keep
//! them in step):
//! 1. A ledger demand ([`super::Algorithm::Reservation`]) comes immediately before the demand on
//!    its bucket, in the same request; `params.unit_ms` is the longest hold, `tokens` the hits of
//!    the descriptor. Its state ([`Reserved`]) is the amount reserved and when the reservation
//!    lapses; a reservation whose expiry is `<= now` is none.
//! 2. **Settle**: when the holder holds a live reservation of `r` hits, this call is its
//!    settlement: the bucket's demand (the call's own `h` hits, netted with any other descriptor
//!    of the request on that bucket) becomes `h - r` — a refund of `r - h` when the response cost
//!    less than was reserved, an always-charged take of `h - r` (into debt, Envoy ignores the
//!    answer) when it cost more, nothing when equal ([`settlement`]). The reservation is removed
//!    whatever the request's answer.
//! 3. **Reserve**: otherwise the call is a reservation: the bucket's demand is an ordinary take
//!    of `h` (it must fit; refused, it takes nothing), and, when the request is allowed and the
//!    bucket took it, the ledger records `h` until `now + max_hold`. A check (`h = 0`) reserves
//!    nothing.
//! 4. The ledger's verdict: always allowed; `remaining` = the reservation settled by this call
//!    (0 when none), `granted` = the hits reserved by this call (0 when none).
//!
//! The bound: every admitted request first took its maximum from the bucket while it had that
//! much, and a settlement gives back only what its own reservation took beyond the real cost, so
//! over any span T the cost admitted on one key is at most C + r·T, whatever the concurrency —
//! plus only what responses cost beyond their reservation (charged in full) or what a
//! reservation that lapsed without settlement kept (the whole maximum, never less).

use super::{Demand, Verdict};

/// One holder's reservation on a bucket. `amount` 0 is no reservation (settled, or never made).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reserved {
    /// Hits taken from the bucket by the reservation.
    pub amount: u64,
    /// When the reservation lapses unsettled, ms: the maximum is then kept.
    pub expires_ms: u64,
}

impl Reserved {
    /// The hits reserved and still live at `now_ms` (0: none).
    pub fn live(&self, now_ms: u64) -> u64 {
        if self.expires_ms > now_ms {
            self.amount
        } else {
            0
        }
    }

    /// When the stored reservation may be dropped: its expiry, or at once when there is none.
    pub fn settled_at_ms(&self) -> u64 {
        if self.amount == 0 { 0 } else { self.expires_ms }
    }
}

/// The bucket's demand once a reservation of `reserved` hits (> 0) settles it: the signed demand
/// less `reserved`, as a refund, an always-charged take, or a refund of nothing.
pub fn settlement(bucket: &Demand, reserved: u64) -> Demand {
    let asked = if bucket.refund {
        -i128::from(bucket.tokens)
    } else {
        i128::from(bucket.tokens)
    };
    let net = asked - i128::from(reserved);
    Demand {
        tokens: net.unsigned_abs().min(u128::from(u64::MAX)) as u64,
        refund: net <= 0,
        always: net > 0,
        lease: 0,
        ..*bucket
    }
}

/// The ledger's new state and verdict: a live reservation (`found` > 0) is settled and removed;
/// otherwise `tokens` are reserved when the bucket took them (`taken`).
pub fn settle(found: u64, now_ms: u64, demand: &Demand, taken: bool) -> (Reserved, Verdict) {
    let reserved = if found == 0 && taken && demand.tokens > 0 {
        Reserved {
            amount: demand.tokens,
            expires_ms: now_ms.saturating_add(demand.params.unit_ms),
        }
    } else {
        Reserved::default()
    };
    let verdict = Verdict {
        allowed: true,
        remaining: found,
        retry_after_ms: Some(0),
        until_full_ms: 0,
        granted: reserved.amount,
    };
    (reserved, verdict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::take;
    use crate::algorithm::{Algorithm, BucketParams, BucketState, State, decide};

    const BUCKET: BucketParams = BucketParams {
        capacity: 100,
        requests_per_unit: 100,
        unit_ms: 60_000,
    };
    const HOLD: BucketParams = BucketParams {
        capacity: 0,
        requests_per_unit: 0,
        unit_ms: 30_000,
    };

    fn call(tokens: u64) -> [Demand; 2] {
        [
            take(Algorithm::Reservation, HOLD, tokens),
            take(Algorithm::TokenBucket, BUCKET, tokens),
        ]
    }

    fn tokens(state: &Option<State>) -> f64 {
        match state {
            Some(State::TokenBucket(BucketState { tokens, .. })) => *tokens,
            other => panic!("not a bucket: {other:?}"),
        }
    }

    /// Reserve 40, settle at 10: 30 come back; a second settle-shaped call is a new reservation.
    #[test]
    fn a_reservation_takes_the_maximum_and_gives_back_the_unused_part() {
        let now = 1_000_000;
        let mut states = [None, None];
        let v = decide(now, &call(40), &mut states);
        assert!(v[1].allowed);
        assert_eq!(v[0].granted, 40);
        assert_eq!(tokens(&states[1]), 60.0);
        assert_eq!(
            states[0],
            Some(State::Reserved(Reserved {
                amount: 40,
                expires_ms: now + 30_000
            }))
        );
        let v = decide(now, &call(10), &mut states);
        assert_eq!((v[0].remaining, v[0].granted), (40, 0));
        assert_eq!(tokens(&states[1]), 90.0);
        assert_eq!(states[0], Some(State::Reserved(Reserved::default())));
    }

    /// A response dearer than its reservation is charged the overrun in full, into debt.
    #[test]
    fn an_overrun_lands_in_full() {
        let now = 1_000_000;
        let mut states = [None, None];
        decide(now, &call(90), &mut states);
        let v = decide(now, &call(150), &mut states);
        assert_eq!(v[0].remaining, 90);
        assert_eq!(tokens(&states[1]), -50.0);
        assert!(!v[1].allowed, "in debt: reported over limit");
    }

    /// A refused reservation records nothing, so a later call is a reservation again.
    #[test]
    fn a_refused_reservation_records_nothing() {
        let now = 1_000_000;
        let mut states = [None, None];
        decide(now, &call(80), &mut states);
        // Another holder's reservation does not fit in the 20 left.
        let mut other = [None, states[1]];
        let v = decide(now, &call(30), &mut other);
        assert!(!v[1].allowed);
        assert_eq!(v[0].granted, 0);
        assert_eq!(other[0], Some(State::Reserved(Reserved::default())));
        assert_eq!(tokens(&other[1]), 20.0);
    }

    /// A lapsed reservation is none: the maximum stays taken and the late call reserves anew.
    #[test]
    fn a_lapsed_reservation_keeps_the_maximum() {
        let now = 1_000_000;
        let mut states = [None, None];
        decide(now, &call(50), &mut states);
        let later = now + 30_000;
        let v = decide(later, &call(10), &mut states);
        assert_eq!(v[0].remaining, 0, "nothing settled");
        assert_eq!(v[0].granted, 10, "reserved anew");
    }

    #[test]
    fn settlement_nets_the_call_against_the_reservation() {
        let d = take(Algorithm::TokenBucket, BUCKET, 10);
        let s = settlement(&d, 40);
        assert_eq!((s.tokens, s.refund, s.always), (30, true, false));
        let s = settlement(&d, 10);
        assert_eq!((s.tokens, s.refund, s.always), (0, true, false));
        let s = settlement(&d, 4);
        assert_eq!((s.tokens, s.refund, s.always), (6, false, true));
        let refund = Demand { refund: true, ..d };
        let s = settlement(&refund, u64::MAX);
        assert_eq!((s.tokens, s.refund), (u64::MAX, true));
    }
}
