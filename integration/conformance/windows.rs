//! Window algorithms in the conformance suite: fixed and sliding windows, GCRA, and windows of
//! several units (`unit_multiplier`).

use sluice::algorithm::{Algorithm, BucketParams};
use sluice::backend::Backend;
use sluice::rule::{RateLimit, Unit};

use super::{Subject, T0, fixed, gcra, key, refunding, sliding, take, v};

// ---------------------------------------------------------------------------------------------
// Fixed window. T0 is a second boundary, 20 s into a minute.

pub(super) async fn fixed_window_counts_and_resets<B: Backend>(s: &Subject<B>) {
    let k = key("fw_counts", "a");
    let hit = |tokens| fixed(&k, 3, 1_000, tokens);
    s.clock.set(T0 + 250);
    s.expect(&[hit(1)], &[v(true, 2, Some(0), 1_000)]).await;
    s.expect(&[hit(2)], &[v(true, 0, Some(0), 1_000)]).await;
    // Full: rejected, not counted, free again when the window ends.
    s.expect(&[hit(1)], &[v(false, 0, Some(750), 1_000)]).await;
    s.clock.set(T0 + 999);
    s.expect(&[hit(1)], &[v(false, 0, Some(1), 1_000)]).await;
    s.clock.set(T0 + 1_000);
    s.expect(&[hit(1)], &[v(true, 2, Some(0), 1_000)]).await;
    s.expect(&[hit(0)], &[v(true, 2, Some(0), 1_000)]).await;
}

/// envoyproxy/ratelimit's `duration_until_reset`: `unit - now_s % unit`, whole seconds.
pub(super) async fn fixed_window_reports_reset_as_envoy<B: Backend>(s: &Subject<B>) {
    let k = key("fw_envoy", "a");
    let hit = |tokens| fixed(&k, 5, 60_000, tokens);
    s.clock.set(T0);
    s.expect(&[hit(1)], &[v(true, 4, Some(0), 40_000)]).await;
    s.clock.set(T0 + 999);
    s.expect(&[hit(1)], &[v(true, 3, Some(0), 40_000)]).await;
    s.clock.set(T0 + 1_000);
    s.expect(&[hit(1)], &[v(true, 2, Some(0), 39_000)]).await;
    // A weighted hit that does not fit waits for the window's end, to the millisecond.
    s.clock.set(T0 + 39_500);
    s.expect(&[hit(3)], &[v(false, 2, Some(500), 1_000)]).await;
    s.expect(&[hit(6)], &[v(false, 2, None, 1_000)]).await;
    s.expect(&[refunding(hit(2))], &[v(true, 4, Some(0), 1_000)])
        .await;
    s.clock.set(T0 + 40_000);
    s.expect(&[hit(5)], &[v(true, 0, Some(0), 60_000)]).await;
}

pub(super) async fn fixed_window_clock_step_back<B: Backend>(s: &Subject<B>) {
    let k = key("fw_step_back", "a");
    let hit = |tokens| fixed(&k, 2, 1_000, tokens);
    s.clock.set(T0 + 1_000);
    s.expect(&[hit(2)], &[v(true, 0, Some(0), 1_000)]).await;
    // Back into the previous window: the later window stays current (and full).
    s.clock.set(T0 + 500);
    s.expect(&[hit(1)], &[v(false, 0, Some(1_500), 2_000)])
        .await;
    s.clock.set(T0 + 2_000);
    s.expect(&[hit(1)], &[v(true, 1, Some(0), 1_000)]).await;
}

// ---------------------------------------------------------------------------------------------
// Sliding window: previous * (W - elapsed) / W + current.

pub(super) async fn sliding_window_weighs_the_previous_window<B: Backend>(s: &Subject<B>) {
    let k = key("sw_weighs", "a");
    let hit = |tokens| sliding(&k, 10, 1_000, tokens);
    s.clock.set(T0 + 500);
    s.expect(&[hit(8)], &[v(true, 2, Some(0), 1_500)]).await;
    // 250 ms into the next window 3/4 of the previous 8 still count: 6, so 4 fit.
    s.clock.set(T0 + 1_250);
    s.expect(&[hit(4)], &[v(true, 0, Some(0), 1_750)]).await;
    // One more fits once the previous window weighs one hit less: 1/8 of a window later.
    s.expect(&[hit(1)], &[v(false, 0, Some(125), 1_750)]).await;
    s.clock.set(T0 + 1_375);
    s.expect(&[hit(1)], &[v(true, 0, Some(0), 1_625)]).await;
    s.expect(&[hit(11)], &[v(false, 0, None, 1_625)]).await;
    // The window after: the 5 of the last one count fully at its start.
    s.clock.set(T0 + 2_000);
    s.expect(&[hit(0)], &[v(true, 5, Some(0), 1_000)]).await;
    s.clock.set(T0 + 3_000);
    s.expect(&[hit(0)], &[v(true, 10, Some(0), 0)]).await;
}

pub(super) async fn sliding_window_refunds<B: Backend>(s: &Subject<B>) {
    let k = key("sw_refunds", "a");
    let hit = |tokens| sliding(&k, 4, 1_000, tokens);
    s.clock.set(T0);
    s.expect(&[hit(3)], &[v(true, 1, Some(0), 2_000)]).await;
    s.clock.set(T0 + 1_000);
    s.expect(&[hit(1)], &[v(true, 0, Some(0), 2_000)]).await;
    // Off the current window's count first, then the previous one's.
    s.expect(&[refunding(hit(2))], &[v(true, 2, Some(0), 1_000)])
        .await;
    s.expect(&[refunding(hit(u64::MAX))], &[v(true, 4, Some(0), 0)])
        .await;
}

// ---------------------------------------------------------------------------------------------
// GCRA: one per T = unit / requests_per_unit, burst at once.

pub(super) async fn gcra_burst_then_spacing<B: Backend>(s: &Subject<B>) {
    let k = key("gcra_spacing", "a");
    let hit = |tokens| gcra(&k, 3, 10, 1_000, tokens);
    s.clock.set(T0);
    s.expect(&[hit(1)], &[v(true, 2, Some(0), 100)]).await;
    s.expect(&[hit(1)], &[v(true, 1, Some(0), 200)]).await;
    s.expect(&[hit(1)], &[v(true, 0, Some(0), 300)]).await;
    s.expect(&[hit(1)], &[v(false, 0, Some(100), 300)]).await;
    s.clock.set(T0 + 150);
    s.expect(&[hit(1)], &[v(true, 0, Some(0), 250)]).await;
    s.expect(&[hit(1)], &[v(false, 0, Some(50), 250)]).await;
    s.expect(&[hit(4)], &[v(false, 0, None, 250)]).await;
    s.expect(&[refunding(hit(2))], &[v(true, 2, Some(0), 50)])
        .await;
    s.clock.set(T0 + 10_000);
    s.expect(&[hit(0)], &[v(true, 3, Some(0), 0)]).await;
}

/// One per 333.33 ms: the arrival time is never a whole ms, and a whole burst still fits at one
/// instant.
pub(super) async fn gcra_fractional_interval<B: Backend>(s: &Subject<B>) {
    let k = key("gcra_fraction", "a");
    let hit = |tokens| gcra(&k, 7, 3, 1_000, tokens);
    s.clock.set(T0 + 1);
    s.expect(&[hit(7)], &[v(true, 0, Some(0), 2_334)]).await;
    s.expect(&[hit(1)], &[v(false, 0, Some(334), 2_334)]).await;
    s.clock.set(T0 + 1 + 333);
    s.expect(&[hit(1)], &[v(false, 0, Some(1), 2_001)]).await;
    s.clock.set(T0 + 1 + 334);
    s.expect(&[hit(1)], &[v(true, 0, Some(0), 2_333)]).await;
    // Seven single hits at one instant: all allowed, each leaving one fewer.
    let k2 = key("gcra_fraction", "b");
    for left in (0..7).rev() {
        let got = s.check(&[gcra(&k2, 7, 3, 1_000, 1)]).await;
        assert!(got[0].allowed, "{}: {left} left: {got:?}", s.name);
        assert_eq!(got[0].remaining, left, "{}", s.name);
    }
    assert!(!s.check(&[gcra(&k2, 7, 3, 1_000, 1)]).await[0].allowed);
}

// ---------------------------------------------------------------------------------------------
// Windows of several units (`unit_multiplier`): "60 per 30 seconds" and "100 per 5 minutes",
// the parameters made by the rule itself. T0 is 20 s into a 30 s window of the epoch and 200 s
// into a 5-minute one (windows are aligned to multiples of their length).

fn windowed(requests_per_unit: u32, unit: Unit, unit_multiplier: u32) -> BucketParams {
    RateLimit {
        requests_per_unit,
        unit,
        unit_multiplier,
        burst: None,
    }
    .bucket()
}

pub(super) async fn multiplied_windows_token_bucket<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("mw_tb", "a"), windowed(60, Unit::Second, 30));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 60)], &[v(true, 0, Some(0), 30_000)])
        .await;
    // 2 tokens a second: one more in 500 ms, half the bucket back in 15 s.
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(500), 30_000)])
        .await;
    s.clock.advance(15_000);
    s.expect(&[take(&k, p, 30)], &[v(true, 0, Some(0), 30_000)])
        .await;
    let (k, p) = (key("mw_tb", "b"), windowed(100, Unit::Minute, 5));
    s.expect(&[take(&k, p, 100)], &[v(true, 0, Some(0), 300_000)])
        .await;
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(3_000), 300_000)])
        .await;
    s.clock.advance(30_000);
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 300_000)])
        .await;
}

pub(super) async fn multiplied_windows_fixed_window<B: Backend>(s: &Subject<B>) {
    let hit = |k: &str, p: BucketParams, tokens| take(k, p, tokens).using(Algorithm::FixedWindow);
    let (k, p) = (key("mw_fw", "a"), windowed(60, Unit::Second, 30));
    s.clock.set(T0);
    s.expect(&[hit(&k, p, 60)], &[v(true, 0, Some(0), 10_000)])
        .await;
    s.expect(&[hit(&k, p, 1)], &[v(false, 0, Some(10_000), 10_000)])
        .await;
    s.clock.set(T0 + 10_000);
    s.expect(&[hit(&k, p, 1)], &[v(true, 59, Some(0), 30_000)])
        .await;
    let (k, p) = (key("mw_fw", "b"), windowed(100, Unit::Minute, 5));
    s.clock.set(T0);
    s.expect(&[hit(&k, p, 100)], &[v(true, 0, Some(0), 100_000)])
        .await;
    s.expect(&[hit(&k, p, 1)], &[v(false, 0, Some(100_000), 100_000)])
        .await;
    s.clock.set(T0 + 100_000);
    s.expect(&[hit(&k, p, 1)], &[v(true, 99, Some(0), 300_000)])
        .await;
}

pub(super) async fn multiplied_windows_sliding_window<B: Backend>(s: &Subject<B>) {
    let hit = |k: &str, p: BucketParams, tokens| take(k, p, tokens).using(Algorithm::SlidingWindow);
    let (k, p) = (key("mw_sw", "a"), windowed(60, Unit::Second, 30));
    s.clock.set(T0);
    // Counted fully for the 10 s left of this window, then fading over the next 30 s.
    s.expect(&[hit(&k, p, 60)], &[v(true, 0, Some(0), 40_000)])
        .await;
    s.expect(&[hit(&k, p, 1)], &[v(false, 0, Some(10_500), 40_000)])
        .await;
    s.clock.set(T0 + 10_000 + 15_000);
    s.expect(&[hit(&k, p, 30)], &[v(true, 0, Some(0), 45_000)])
        .await;
    let (k, p) = (key("mw_sw", "b"), windowed(100, Unit::Minute, 5));
    s.clock.set(T0);
    s.expect(&[hit(&k, p, 100)], &[v(true, 0, Some(0), 400_000)])
        .await;
    s.expect(&[hit(&k, p, 1)], &[v(false, 0, Some(103_000), 400_000)])
        .await;
}

pub(super) async fn multiplied_windows_gcra<B: Backend>(s: &Subject<B>) {
    let hit = |k: &str, p: BucketParams, tokens| take(k, p, tokens).using(Algorithm::Gcra);
    // One every 500 ms, 60 at once.
    let (k, p) = (key("mw_gcra", "a"), windowed(60, Unit::Second, 30));
    s.clock.set(T0);
    s.expect(&[hit(&k, p, 60)], &[v(true, 0, Some(0), 30_000)])
        .await;
    s.expect(&[hit(&k, p, 1)], &[v(false, 0, Some(500), 30_000)])
        .await;
    // One every 3 s, 100 at once.
    let (k, p) = (key("mw_gcra", "b"), windowed(100, Unit::Minute, 5));
    s.expect(&[hit(&k, p, 100)], &[v(true, 0, Some(0), 300_000)])
        .await;
    s.expect(&[hit(&k, p, 1)], &[v(false, 0, Some(3_000), 300_000)])
        .await;
    s.clock.advance(6_000);
    s.expect(&[hit(&k, p, 2)], &[v(true, 0, Some(0), 300_000)])
        .await;
}
