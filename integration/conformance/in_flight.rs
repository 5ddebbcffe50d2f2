//! In-flight caps in the conformance suite: the same slots, answers and expiry from every
//! backend (a ZSET in Redis, a ledger in memory).

use super::{Subject, T0, key, params, take, took, v};
use sluice::algorithm::Algorithm;
use sluice::backend::{Backend, Hit};

const HOLD: u64 = 2_000;

/// A take (`tokens` 1), check (0) or, `refunding`, release of a slot of a cap of `max` by `holder`.
fn slot(key: &str, max: u64, holder: u64, tokens: u64) -> Hit {
    let mut hit = Hit::new(key, params(max, max, HOLD), tokens).using(Algorithm::InFlight);
    hit.demand.holder = holder;
    hit
}

fn release(key: &str, max: u64, holder: u64) -> Hit {
    let mut hit = slot(key, max, holder, 1);
    hit.demand.refund = true;
    hit
}

/// Takes up to the cap, refuses, frees nothing for a stranger's release, keeps one slot per
/// holder, frees a holder's own slot, and expires slots after the hold.
pub(super) async fn slots_are_held_released_and_expire<B: Backend>(s: &Subject<B>) {
    let k = key("in_flight", "cap");
    s.clock.set(T0);
    s.expect_granted(&[slot(&k, 2, 1, 1)], &[took(v(true, 1, Some(0), HOLD), 1)])
        .await;
    s.clock.set(T0 + 100);
    s.expect_granted(&[slot(&k, 2, 2, 1)], &[took(v(true, 0, Some(0), HOLD), 1)])
        .await;
    s.clock.set(T0 + 200);
    // Full: the first slot frees in 1800 ms, reported as at most a second.
    s.expect_granted(&[slot(&k, 2, 3, 1)], &[v(false, 0, Some(1_000), 1_900)])
        .await;
    s.clock.set(T0 + 300);
    // The refused holder's release frees nothing; a holder taking again keeps its one slot.
    s.expect_granted(&[release(&k, 2, 3)], &[v(true, 0, Some(0), 1_800)])
        .await;
    s.expect_granted(&[slot(&k, 2, 1, 1)], &[v(true, 0, Some(0), 1_800)])
        .await;
    s.clock.set(T0 + 400);
    s.expect_granted(&[release(&k, 2, 1)], &[took(v(true, 1, Some(0), 1_700), 1)])
        .await;
    s.clock.set(T0 + 500);
    s.expect_granted(&[slot(&k, 2, 3, 1)], &[took(v(true, 0, Some(0), HOLD), 1)])
        .await;
    // Holder 2's slot expires at T0 + 2100 (its expiry is not after now): room for holder 4.
    s.clock.set(T0 + 2_100);
    s.expect_granted(&[slot(&k, 2, 4, 1)], &[took(v(true, 0, Some(0), HOLD), 1)])
        .await;
    s.clock.set(T0 + 2_200);
    s.expect_granted(&[slot(&k, 2, 5, 1)], &[v(false, 0, Some(300), 1_900)])
        .await;
    // A check takes nothing and is judged like a take.
    s.expect_granted(&[slot(&k, 2, 6, 0)], &[v(false, 0, Some(300), 1_900)])
        .await;
    s.clock.set(T0 + 4_100);
    s.expect_granted(&[slot(&k, 2, 6, 0)], &[v(true, 2, Some(0), 0)])
        .await;
}

/// A request with a cap and a token bucket is all or nothing: a full cap takes no tokens, a
/// refusing bucket takes no slot.
pub(super) async fn a_full_cap_takes_nothing_elsewhere<B: Backend>(s: &Subject<B>) {
    let (c, t) = (key("in_flight_mixed", "cap"), key("in_flight_mixed", "tb"));
    let tb = |tokens| take(&t, params(5, 5, 1_000), tokens);
    s.clock.set(T0);
    s.expect_granted(
        &[slot(&c, 1, 1, 1), tb(1)],
        &[
            took(v(true, 0, Some(0), HOLD), 1),
            took(v(true, 4, Some(0), 200), 1),
        ],
    )
    .await;
    s.expect_granted(
        &[slot(&c, 1, 2, 1), tb(1)],
        &[v(false, 0, Some(1_000), HOLD), v(true, 4, Some(0), 200)],
    )
    .await;
    s.expect_granted(&[release(&c, 1, 1)], &[took(v(true, 1, Some(0), 0), 1)])
        .await;
    s.expect_granted(
        &[slot(&c, 1, 2, 1), tb(9)],
        &[v(true, 1, Some(0), 0), v(false, 4, None, 200)],
    )
    .await;
    s.expect_granted(&[slot(&c, 1, 3, 0)], &[v(true, 1, Some(0), 0)])
        .await;
}
