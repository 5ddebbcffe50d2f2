//! Reservations in the conformance suite: the same reservations, settlements, overruns and
//! lapses from every backend (a string key in Redis, a state in memory), on a token bucket and
//! on GCRA.

use super::{Subject, T0, key, params, took, v};
use sluice::algorithm::{Algorithm, BucketParams};
use sluice::backend::{Backend, Hit};

const HOLD: u64 = 30_000;

/// 100 per minute: one token per 600 ms.
const BUCKET: BucketParams = BucketParams {
    capacity: 100,
    requests_per_unit: 100,
    unit_ms: 60_000,
};

/// One call of `holder` on the bucket `bucket`: its ledger, then the bucket, `tokens` each.
fn call(bucket: &str, algorithm: Algorithm, holder: u32, tokens: u64) -> [Hit; 2] {
    let ledger = Hit::new(format!("{bucket}~rv{holder}"), params(0, 0, HOLD), tokens)
        .using(Algorithm::Reservation);
    [ledger, Hit::new(bucket, BUCKET, tokens).using(algorithm)]
}

/// What a ledger answers: the reservation it settled, and the hits it reserved.
fn ledger(settled: u64, reserved: u64) -> sluice::algorithm::Verdict {
    took(v(true, settled, Some(0), 0), reserved)
}

/// Reserve 40 and settle at 10 (30 come back); reserve 90 and settle at 150 (60 more, into debt);
/// a reservation that does not fit takes and records nothing; a lapsed one keeps its maximum and
/// the late call reserves anew.
pub(super) async fn reservations_settle<B: Backend>(s: &Subject<B>) {
    let b = key("reserve", "tb");
    let tb = Algorithm::TokenBucket;
    s.clock.set(T0);
    s.expect_granted(
        &call(&b, tb, 1, 40),
        &[ledger(0, 40), took(v(true, 60, Some(0), 24_000), 40)],
    )
    .await;
    s.expect_granted(
        &call(&b, tb, 1, 10),
        &[ledger(40, 0), v(true, 90, Some(0), 6_000)],
    )
    .await;
    s.expect_granted(
        &call(&b, tb, 2, 90),
        &[ledger(0, 90), took(v(true, 0, Some(0), 60_000), 90)],
    )
    .await;
    // Holder 3 finds nothing left: refused, nothing reserved.
    s.expect_granted(
        &call(&b, tb, 3, 30),
        &[ledger(0, 0), v(false, 0, Some(18_000), 60_000)],
    )
    .await;
    // Holder 2's response cost 150: the 60 beyond its reservation land in full.
    s.expect_granted(
        &call(&b, tb, 2, 150),
        &[ledger(90, 0), took(v(false, 0, Some(72_000), 96_000), 60)],
    )
    .await;
    // Holder 3 never reserved: its settle-shaped call is a reservation, refused in debt.
    s.expect_granted(
        &call(&b, tb, 3, 5),
        &[ledger(0, 0), v(false, 0, Some(39_000), 96_000)],
    )
    .await;
    // 96 s later the bucket is full: holder 4 reserves 50, which lapses unsettled after the hold.
    s.clock.set(T0 + 96_000);
    s.expect_granted(
        &call(&b, tb, 4, 50),
        &[ledger(0, 50), took(v(true, 50, Some(0), 30_000), 50)],
    )
    .await;
    s.clock.set(T0 + 96_000 + HOLD);
    s.expect_granted(
        &call(&b, tb, 4, 10),
        &[ledger(0, 10), took(v(true, 90, Some(0), 6_000), 10)],
    )
    .await;
}

/// GCRA settles the same way: the arrival time moves back by the unused part.
pub(super) async fn reservations_settle_on_gcra<B: Backend>(s: &Subject<B>) {
    let b = key("reserve_gcra", "g");
    let g = Algorithm::Gcra;
    s.clock.set(T0);
    s.expect_granted(
        &call(&b, g, 1, 80),
        &[ledger(0, 80), took(v(true, 20, Some(0), 48_000), 80)],
    )
    .await;
    s.expect_granted(
        &call(&b, g, 1, 20),
        &[ledger(80, 0), v(true, 80, Some(0), 12_000)],
    )
    .await;
    s.expect_granted(
        &call(&b, g, 2, 81),
        &[ledger(0, 0), v(false, 80, Some(600), 12_000)],
    )
    .await;
}
