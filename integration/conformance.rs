//! One suite of scenarios for every algorithm (token bucket, fixed window, sliding window, GCRA,
//! and requests mixing them), written once over any [`Backend`] whose clock the test holds, run
//! against every backend: memory, Redis standalone and Redis Cluster. Plus a differential test:
//! random request sequences over keys of all four algorithms give identical verdicts (and
//! identical stored state, to the bit) from the Lua script and from the pure `algorithm::decide`.
//!
//! Each backend runs all scenarios on one server (scenarios use disjoint keys); a failing
//! scenario is reported by name and the others still run.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sluice::algorithm::{self, Algorithm, BucketParams, Demand, State, Verdict};
use sluice::backend::memory::{MemoryBackend, MemoryOptions};
use sluice::backend::redis::{RedisBackend, RedisMode, RedisOptions};
use sluice::backend::{Backend, Hit};
use sluice::clock::ManualClock;
use sluice::rule::{RateLimit, Unit};

use sluice_harness as harness;

#[path = "conformance_in_flight.rs"]
mod in_flight;
use in_flight::{a_full_cap_takes_nothing_elsewhere, slots_are_held_released_and_expire};
#[path = "conformance_reserve.rs"]
mod reserve;
use reserve::{reservations_settle, reservations_settle_on_gcra};
use sluice_harness::{RedisCluster, RedisServer};

/// Start of every scenario's timeline: a realistic epoch in ms, so large-number precision counts.
const T0: u64 = 1_700_000_000_000;
const YEAR_MS: u64 = 365 * 86_400_000;

/// A backend under test and the hand that sets its clock.
struct Subject<B> {
    name: &'static str,
    backend: B,
    clock: ManualClock,
}

impl<B: Backend> Subject<B> {
    async fn check(&self, hits: &[Hit]) -> Vec<Verdict> {
        self.backend
            .check(hits)
            .await
            .unwrap_or_else(|err| panic!("{}: check failed: {err}", self.name))
    }

    /// Checks `hits` and requires exactly `expected`, except `granted` (what a take took), which
    /// [`Subject::expect_granted`] and the differential test check.
    async fn expect(&self, hits: &[Hit], expected: &[Verdict]) {
        let mut got = self.check(hits).await;
        for verdict in &mut got {
            verdict.granted = 0;
        }
        assert_eq!(got, expected, "{}: verdicts for {hits:#?}", self.name);
    }

    /// Checks `hits` and requires exactly `expected`, `granted` included.
    async fn expect_granted(&self, hits: &[Hit], expected: &[Verdict]) {
        let got = self.check(hits).await;
        assert_eq!(got, expected, "{}: verdicts for {hits:#?}", self.name);
    }
}

fn params(capacity: u64, requests_per_unit: u64, unit_ms: u64) -> BucketParams {
    BucketParams {
        capacity,
        requests_per_unit,
        unit_ms,
    }
}

fn take(key: &str, params: BucketParams, tokens: u64) -> Hit {
    Hit::new(key, params, tokens)
}

fn refund(key: &str, params: BucketParams, tokens: u64) -> Hit {
    let mut hit = Hit::new(key, params, tokens);
    hit.demand.refund = true;
    hit
}

fn shadow(key: &str, params: BucketParams, tokens: u64) -> Hit {
    let mut hit = Hit::new(key, params, tokens);
    hit.demand.shadow = true;
    hit
}

fn window(key: &str, algorithm: Algorithm, limit: u64, unit_ms: u64, tokens: u64) -> Hit {
    Hit::new(key, params(limit, limit, unit_ms), tokens).using(algorithm)
}

fn fixed(key: &str, limit: u64, unit_ms: u64, tokens: u64) -> Hit {
    window(key, Algorithm::FixedWindow, limit, unit_ms, tokens)
}

fn sliding(key: &str, limit: u64, unit_ms: u64, tokens: u64) -> Hit {
    window(key, Algorithm::SlidingWindow, limit, unit_ms, tokens)
}

/// GCRA: `requests_per_unit` per `unit_ms`, `burst` at once.
fn gcra(key: &str, burst: u64, requests_per_unit: u64, unit_ms: u64, tokens: u64) -> Hit {
    Hit::new(key, params(burst, requests_per_unit, unit_ms), tokens).using(Algorithm::Gcra)
}

fn refunding(mut hit: Hit) -> Hit {
    hit.demand.refund = true;
    hit
}

/// The same hit on a quota-mode rule.
fn quota(mut hit: Hit) -> Hit {
    hit.demand.quota = true;
    hit
}

fn shadowed(mut hit: Hit) -> Hit {
    hit.demand.shadow = true;
    hit
}

/// allowed, remaining, retry_after_ms (None = never), until_full_ms; nothing granted.
fn v(allowed: bool, remaining: u64, retry_after_ms: Option<u64>, until_full_ms: u64) -> Verdict {
    Verdict {
        allowed,
        remaining,
        retry_after_ms,
        until_full_ms,
        granted: 0,
    }
}

/// The same verdict, having taken `granted` tokens.
fn took(verdict: Verdict, granted: u64) -> Verdict {
    Verdict { granted, ..verdict }
}

/// A lease take: `tokens`, and up to `lease` more when they are taken.
fn leasing(mut hit: Hit, lease: u64) -> Hit {
    hit.demand.lease = lease;
    hit
}

/// A key of `scenario`; one hash tag per scenario keeps a request's keys in one Cluster slot.
fn key(scenario: &str, bucket: &str) -> String {
    format!("conformance:{{{scenario}}}:{bucket}")
}

// ---------------------------------------------------------------------------------------------
// Token bucket. 10 tokens at 10/s is 0.01 token/ms: one token per 100 ms, full in 1000 ms.

async fn full_after_idle<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("full_after_idle", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(100), 1_000)])
        .await;
    // Ten seconds would be 100 tokens: the bucket stops at its capacity.
    s.clock.advance(10_000);
    s.expect(&[take(&k, p, 1)], &[v(true, 9, Some(0), 100)])
        .await;
}

async fn partial_refill<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("partial_refill", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
    s.clock.advance(250); // 2.5 tokens
    s.expect(&[take(&k, p, 2)], &[v(true, 0, Some(0), 950)])
        .await;
    // 0.5 left: half a token short, 50 ms away.
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(50), 950)])
        .await;
    s.clock.advance(50);
    s.expect(&[take(&k, p, 1)], &[v(true, 0, Some(0), 1_000)])
        .await;
}

async fn never_above_capacity<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("never_above_capacity", "a"), params(5, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 1)], &[v(true, 4, Some(0), 1_000)])
        .await;
    s.clock.advance(86_400_000);
    s.expect(&[take(&k, p, 0)], &[v(true, 5, Some(0), 0)]).await;
    s.expect(&[take(&k, p, 5)], &[v(true, 0, Some(0), 5_000)])
        .await;
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(1_000), 5_000)])
        .await;
}

async fn cost_above_tokens<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("cost_above_tokens", "a"), params(10, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 8)], &[v(true, 2, Some(0), 8_000)])
        .await;
    // 5 > 2: rejected, nothing taken, 3 tokens (3 s) short.
    s.expect(&[take(&k, p, 5)], &[v(false, 2, Some(3_000), 8_000)])
        .await;
    s.expect(&[take(&k, p, 2)], &[v(true, 0, Some(0), 10_000)])
        .await;
}

async fn cost_above_capacity<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("cost_above_capacity", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 11)], &[v(false, 10, None, 0)]).await;
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
}

async fn check_only<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("check_only", "a"), params(3, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 0)], &[v(true, 3, Some(0), 0)]).await;
    s.expect(&[take(&k, p, 0)], &[v(true, 3, Some(0), 0)]).await;
    s.expect(&[take(&k, p, 3)], &[v(true, 0, Some(0), 3_000)])
        .await;
    // Check-only needs one whole token to pass.
    s.expect(&[take(&k, p, 0)], &[v(false, 0, Some(1_000), 3_000)])
        .await;
}

async fn multi_key_atomic_rejection<B: Backend>(s: &Subject<B>) {
    let (a, pa) = (key("multi_key", "a"), params(10, 1, 1_000));
    let (b, pb) = (key("multi_key", "b"), params(5, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&b, pb, 4)], &[v(true, 1, Some(0), 4_000)])
        .await;
    // `a` could pay, `b` cannot: the request is rejected and `a` keeps its tokens.
    s.expect(
        &[take(&a, pa, 3), take(&b, pb, 3)],
        &[v(true, 10, Some(0), 0), v(false, 1, Some(2_000), 4_000)],
    )
    .await;
    s.expect(
        &[take(&a, pa, 3), take(&b, pb, 1)],
        &[v(true, 7, Some(0), 3_000), v(true, 0, Some(0), 5_000)],
    )
    .await;
}

async fn shadow_mode<B: Backend>(s: &Subject<B>) {
    let (a, pa) = (key("shadow", "a"), params(10, 1, 1_000));
    let (sh, ps) = (key("shadow", "s"), params(1, 1, 1_000));
    let (sh2, ps2) = (key("shadow", "s2"), params(1, 1, 1_000));
    s.clock.set(T0);
    // A shadow bucket that cannot pay does not reject the request.
    s.expect(
        &[take(&a, pa, 2), shadow(&sh, ps, 2)],
        &[v(true, 8, Some(0), 2_000), v(false, 1, None, 0)],
    )
    .await;
    // One that can pay is charged like any other.
    s.expect(
        &[take(&a, pa, 1), shadow(&sh, ps, 1)],
        &[v(true, 7, Some(0), 3_000), v(true, 0, Some(0), 1_000)],
    )
    .await;
    // When a real bucket rejects, the shadow one is not charged either.
    s.expect(
        &[take(&a, pa, 100), shadow(&sh2, ps2, 1)],
        &[v(false, 7, None, 3_000), v(true, 1, Some(0), 0)],
    )
    .await;
}

/// Quota-mode keys: one that fits is enough, one that does not fit takes nothing; all of them
/// short rejects the request, as does an ordinary key short, and then nothing is taken.
async fn quota_mode<B: Backend>(s: &Subject<B>) {
    let (o, q1, q2) = (key("quota", "o"), key("quota", "q1"), key("quota", "q2"));
    let (po, p1, p2) = (
        params(10, 1, 1_000),
        params(1, 1, 1_000),
        params(3, 1, 1_000),
    );
    let request = |ordinary, first, second| {
        [
            take(&o, po, ordinary),
            quota(take(&q1, p1, first)),
            quota(take(&q2, p2, second)),
        ]
    };
    s.clock.set(T0);
    s.expect_granted(
        &request(1, 1, 1),
        &[
            took(v(true, 9, Some(0), 1_000), 1),
            took(v(true, 0, Some(0), 1_000), 1),
            took(v(true, 2, Some(0), 1_000), 1),
        ],
    )
    .await;
    // q1 is short: reported so, takes nothing; q2 fits, so the request is allowed.
    s.expect_granted(
        &request(1, 1, 1),
        &[
            took(v(true, 8, Some(0), 2_000), 1),
            v(false, 0, Some(1_000), 1_000),
            took(v(true, 1, Some(0), 2_000), 1),
        ],
    )
    .await;
    // Every quota key short (q2 never: 5 above its 3): rejected, nothing taken.
    s.expect_granted(
        &request(1, 1, 5),
        &[
            v(true, 8, Some(0), 2_000),
            v(false, 0, Some(1_000), 1_000),
            v(false, 1, None, 2_000),
        ],
    )
    .await;
    // The ordinary key short: rejected though q2 fits, which takes nothing.
    s.expect_granted(
        &request(20, 1, 1),
        &[
            v(false, 8, None, 2_000),
            v(false, 0, Some(1_000), 1_000),
            v(true, 1, Some(0), 2_000),
        ],
    )
    .await;
}

async fn refund_cap<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("refund_cap", "a"), params(10, 1, 1_000));
    let (other, po) = (key("refund_cap", "b"), params(10, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 4)], &[v(true, 6, Some(0), 4_000)])
        .await;
    s.expect(&[refund(&k, p, 3)], &[v(true, 9, Some(0), 1_000)])
        .await;
    s.expect(&[refund(&k, p, 100)], &[v(true, 10, Some(0), 0)])
        .await;
    s.expect(&[take(&k, p, 5)], &[v(true, 5, Some(0), 5_000)])
        .await;
    // A refund is applied even when the request is rejected.
    s.expect(
        &[take(&other, po, 20), refund(&k, p, 2)],
        &[v(false, 10, None, 0), v(true, 7, Some(0), 3_000)],
    )
    .await;
}

async fn clock_step_back<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("clock_step_back", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
    // Back 5 s: no refill (elapsed clamps at 0) and the refill mark stays at T0...
    s.clock.set(T0 - 5_000);
    s.expect(&[take(&k, p, 1)], &[v(false, 0, Some(100), 1_000)])
        .await;
    // ...so 100 ms after T0 there is exactly one token, not 51 ms' worth from T0 - 5 s.
    s.clock.set(T0 + 100);
    s.expect(&[take(&k, p, 1)], &[v(true, 0, Some(0), 1_000)])
        .await;
}

async fn u64_max_demand<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("u64_max", "a"), params(10, 1, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, u64::MAX)], &[v(false, 10, None, 0)])
        .await;
    s.expect(&[take(&k, p, 5)], &[v(true, 5, Some(0), 5_000)])
        .await;
    s.expect(&[refund(&k, p, u64::MAX)], &[v(true, 10, Some(0), 0)])
        .await;
}

/// Counts beyond i64 on the wire: 2^32 - 1 tokens refilled 1 per year.
async fn extreme_rates<B: Backend>(s: &Subject<B>) {
    let (k, p) = (
        key("extreme_rates", "a"),
        params(u32::MAX.into(), 1, YEAR_MS),
    );
    s.clock.set(T0);
    // Full in 1.35e20 ms (past u64): saturates.
    s.expect(
        &[take(&k, p, u32::MAX.into())],
        &[v(true, 0, Some(0), u64::MAX)],
    )
    .await;
    // 4e8 tokens away is 1.26144e19 ms: between 2^63 and 2^64.
    s.expect(
        &[take(&k, p, 400_000_000)],
        &[v(false, 0, Some(12_614_400_000_000_000_000), u64::MAX)],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Fixed window. T0 is a second boundary, 20 s into a minute.

async fn fixed_window_counts_and_resets<B: Backend>(s: &Subject<B>) {
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
async fn fixed_window_reports_reset_as_envoy<B: Backend>(s: &Subject<B>) {
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

async fn fixed_window_clock_step_back<B: Backend>(s: &Subject<B>) {
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

async fn sliding_window_weighs_the_previous_window<B: Backend>(s: &Subject<B>) {
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

async fn sliding_window_refunds<B: Backend>(s: &Subject<B>) {
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

async fn gcra_burst_then_spacing<B: Backend>(s: &Subject<B>) {
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
async fn gcra_fractional_interval<B: Backend>(s: &Subject<B>) {
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

async fn multiplied_windows_token_bucket<B: Backend>(s: &Subject<B>) {
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

async fn multiplied_windows_fixed_window<B: Backend>(s: &Subject<B>) {
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

async fn multiplied_windows_sliding_window<B: Backend>(s: &Subject<B>) {
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

async fn multiplied_windows_gcra<B: Backend>(s: &Subject<B>) {
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

// ---------------------------------------------------------------------------------------------
// Requests over keys of several algorithms: one call, all or nothing.

async fn mixed_algorithms_all_or_nothing<B: Backend>(s: &Subject<B>) {
    let (a, b, c, d) = (
        key("mixed", "tb"),
        key("mixed", "fw"),
        key("mixed", "sw"),
        key("mixed", "gcra"),
    );
    let tb = |tokens| take(&a, params(5, 5, 1_000), tokens);
    let fw = |tokens| fixed(&b, 3, 1_000, tokens);
    let sw = |tokens| sliding(&c, 3, 1_000, tokens);
    let gc = |tokens| gcra(&d, 2, 2, 1_000, tokens);
    s.clock.set(T0);
    // GCRA cannot take 3 (burst 2): nothing is counted anywhere.
    s.expect(
        &[tb(1), fw(1), sw(1), gc(3)],
        &[
            v(true, 5, Some(0), 0),
            v(true, 3, Some(0), 1_000),
            v(true, 3, Some(0), 0),
            v(false, 2, None, 0),
        ],
    )
    .await;
    s.expect(
        &[tb(1), fw(1), sw(1), gc(1)],
        &[
            v(true, 4, Some(0), 200),
            v(true, 2, Some(0), 1_000),
            v(true, 2, Some(0), 2_000),
            v(true, 1, Some(0), 500),
        ],
    )
    .await;
    // A short shadow key does not reject, and is not counted.
    s.expect(
        &[fw(2), shadowed(gc(2))],
        &[v(true, 0, Some(0), 1_000), v(false, 1, Some(500), 500)],
    )
    .await;
    // The full window rejects; the sliding window is not counted, the refund still applies.
    s.expect(
        &[fw(1), sw(1), refunding(tb(1))],
        &[
            v(false, 0, Some(1_000), 1_000),
            v(true, 2, Some(0), 2_000),
            v(true, 5, Some(0), 0),
        ],
    )
    .await;
}

/// A lease take gets the demand plus as many whole tokens as the bucket holds, up to the lease;
/// a bucket short of the demand itself grants nothing; a rejected request grants nothing.
async fn lease_takes<B: Backend>(s: &Subject<B>) {
    let (a, b, g) = (
        key("lease", "tb"),
        key("lease", "other"),
        key("lease", "gcra"),
    );
    // 10 tokens, one per 100 ms.
    let p = params(10, 10, 1_000);
    s.clock.set(T0);
    s.expect_granted(
        &[leasing(take(&a, p, 1), 4)],
        &[took(v(true, 5, Some(0), 500), 5)],
    )
    .await;
    s.expect_granted(
        &[leasing(take(&a, p, 2), 9)],
        &[took(v(true, 0, Some(0), 1_000), 5)],
    )
    .await;
    // 50 ms later half a token: not even the demand fits, nothing is taken.
    s.clock.set(T0 + 50);
    s.expect_granted(&[leasing(take(&a, p, 1), 4)], &[v(false, 0, Some(50), 950)])
        .await;
    // 1.5 tokens: the demand and no whole extra; the half token stays.
    s.clock.set(T0 + 150);
    s.expect_granted(
        &[leasing(take(&a, p, 1), 4)],
        &[took(v(true, 0, Some(0), 950), 1)],
    )
    .await;
    // Another key of the request rejects it: the lease take takes nothing.
    s.clock.set(T0 + 1_150);
    s.expect_granted(
        &[
            leasing(take(&a, p, 1), 4),
            take(&b, params(1, 1, 60_000), 2),
        ],
        &[v(true, 10, Some(0), 0), v(false, 1, None, 0)],
    )
    .await;
    // GCRA, one per 100 ms, burst 4: a lease of 9 gets the rest of the burst.
    s.expect_granted(
        &[leasing(gcra(&g, 4, 10, 1_000, 1), 9)],
        &[took(v(true, 0, Some(0), 400), 4)],
    )
    .await;
    s.clock.set(T0 + 1_350);
    s.expect_granted(
        &[leasing(gcra(&g, 4, 10, 1_000, 1), 9)],
        &[took(v(true, 0, Some(0), 400), 2)],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Descriptor values are bytes (Envoy copies header values unchanged): each value, UTF-8 or not,
// short or 60 KB, is its own bucket under the key the key module writes for it.

async fn byte_values_have_their_own_buckets<B: Backend>(s: &Subject<B>) {
    use sluice::key::{RuleTag, bucket_key};
    use sluice::request::{Entry, Value};
    let long = [vec![b'u'; 60_000], vec![0xff]].concat();
    let mut long_other = long.clone();
    long_other[0] = 0xfe;
    let values: Vec<Value> = vec![
        b"ab\xff".as_slice().into(),
        "ab\u{FFFD}".into(),
        "ab\\xFF".into(),
        "ab%FF".into(),
        b"\xc3\x28".as_slice().into(),
        "".into(),
        long.into(),
        long_other.into(),
    ];
    let p = params(1, 1, 86_400_000);
    let keys: Vec<String> = values
        .into_iter()
        .map(|value| {
            // One hash tag (the first entry) for all: one Cluster slot, one script call.
            let entries = [
                Entry::new("scenario", "byte_values"),
                Entry::new("user", value),
            ];
            bucket_key(
                "",
                "conformance",
                &entries,
                RuleTag::Configured,
                Algorithm::TokenBucket,
            )
        })
        .collect();
    for k in &keys {
        assert!(k.is_ascii() && k.len() < 200, "{k}");
    }
    let hits: Vec<Hit> = keys.iter().map(|k| take(k, p, 1)).collect();
    s.clock.set(T0);
    let full = v(true, 0, Some(0), 86_400_000);
    s.expect(&hits, &vec![full; hits.len()]).await;
    for hit in &hits {
        s.expect(
            std::slice::from_ref(hit),
            &[v(false, 0, Some(86_400_000), 86_400_000)],
        )
        .await;
    }
}

/// The same hit, always charged (`charge: always`): counted whatever the answer, into debt.
fn always(mut hit: Hit) -> Hit {
    hit.demand.always = true;
    hit
}

/// Always-charged hits of every algorithm put their key into debt, which refuses check-only
/// hits until it is repaid; a request refused by another key still charges them.
async fn charges_always_land<B: Backend>(s: &Subject<B>) {
    let p = params(100, 100, 60_000);
    // A minute boundary, where the windows start.
    s.clock.set(T0 + 40_000);
    let k = key("charges", "tb");
    s.expect(&[always(take(&k, p, 60))], &[v(true, 40, Some(0), 36_000)])
        .await;
    s.expect_granted(
        &[always(take(&k, p, 60))],
        &[took(v(false, 0, Some(48_000), 72_000), 60)],
    )
    .await;
    s.expect(&[take(&k, p, 0)], &[v(false, 0, Some(12_600), 72_000)])
        .await;
    let k = key("charges", "fw");
    s.expect(
        &[always(fixed(&k, 100, 60_000, 60))],
        &[v(true, 40, Some(0), 60_000)],
    )
    .await;
    s.expect(
        &[always(fixed(&k, 100, 60_000, 60))],
        &[v(false, 0, Some(60_000), 60_000)],
    )
    .await;
    s.expect(
        &[fixed(&k, 100, 60_000, 0)],
        &[v(false, 0, Some(60_000), 60_000)],
    )
    .await;
    let k = key("charges", "sw");
    s.expect(
        &[always(sliding(&k, 100, 60_000, 120))],
        &[v(false, 0, None, 120_000)],
    )
    .await;
    s.expect(
        &[sliding(&k, 100, 60_000, 0)],
        &[v(false, 0, Some(70_500), 120_000)],
    )
    .await;
    let k = key("charges", "gcra");
    s.expect(
        &[always(gcra(&k, 100, 100, 60_000, 120))],
        &[v(false, 0, None, 72_000)],
    )
    .await;
    s.expect(
        &[gcra(&k, 100, 100, 60_000, 0)],
        &[v(false, 0, Some(12_600), 72_000)],
    )
    .await;
    // Refused by `tight`: the always-charged key pays, the ordinary one does not.
    let (tight, paid, spared) = (
        key("refused", "tight"),
        key("refused", "paid"),
        key("refused", "spared"),
    );
    let one = params(1, 1, 3_600_000);
    s.expect(&[take(&tight, one, 1)], &[v(true, 0, Some(0), 3_600_000)])
        .await;
    s.expect_granted(
        &[
            take(&tight, one, 1),
            always(take(&paid, p, 5)),
            take(&spared, p, 5),
        ],
        &[
            v(false, 0, Some(3_600_000), 3_600_000),
            took(v(true, 95, Some(0), 3_000), 5),
            v(true, 100, Some(0), 0),
        ],
    )
    .await;
}

/// Runs every scenario, each isolated so one failure does not hide the others.
async fn suite<B: Backend>(subject: &Subject<B>) {
    macro_rules! scenarios {
        ($($scenario:ident),* $(,)?) => {{
            let mut failures = Vec::new();
            $(
                if let Err(panic) = AssertUnwindSafe($scenario(subject)).catch_unwind().await {
                    failures.push(format!("{}: {}", stringify!($scenario), panic_text(&*panic)));
                }
            )*
            assert!(failures.is_empty(), "{} failed:\n{}", subject.name, failures.join("\n"));
        }};
    }
    scenarios!(
        full_after_idle,
        partial_refill,
        never_above_capacity,
        cost_above_tokens,
        cost_above_capacity,
        check_only,
        multi_key_atomic_rejection,
        shadow_mode,
        quota_mode,
        refund_cap,
        clock_step_back,
        u64_max_demand,
        extreme_rates,
        fixed_window_counts_and_resets,
        fixed_window_reports_reset_as_envoy,
        fixed_window_clock_step_back,
        sliding_window_weighs_the_previous_window,
        sliding_window_refunds,
        gcra_burst_then_spacing,
        gcra_fractional_interval,
        mixed_algorithms_all_or_nothing,
        lease_takes,
        byte_values_have_their_own_buckets,
        multiplied_windows_token_bucket,
        multiplied_windows_fixed_window,
        multiplied_windows_sliding_window,
        multiplied_windows_gcra,
        charges_always_land,
        slots_are_held_released_and_expire,
        a_full_cap_takes_nothing_elsewhere,
        reservations_settle,
        reservations_settle_on_gcra,
    );
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "non-string panic".into())
}

fn options(urls: Vec<String>, mode: RedisMode) -> RedisOptions {
    RedisOptions {
        urls,
        mode,
        // Generous: these tests check semantics, not latency, on a shared CI machine.
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    }
}

async fn redis_subject(name: &'static str, opts: RedisOptions) -> Subject<RedisBackend> {
    let clock = ManualClock::new(T0);
    let backend = RedisBackend::connect(opts)
        .await
        .unwrap_or_else(|err| panic!("{name}: connect: {err}"))
        .with_test_clock(Arc::new(clock.clone()));
    Subject {
        name,
        backend,
        clock,
    }
}

#[tokio::test]
async fn memory_conforms() {
    let clock = ManualClock::new(T0);
    let backend = MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default());
    suite(&Subject {
        name: "memory",
        backend,
        clock,
    })
    .await;
}

#[tokio::test]
async fn redis_standalone_conforms() {
    let server = RedisServer::start();
    let subject = redis_subject(
        "redis standalone",
        options(vec![server.url()], RedisMode::Standalone),
    )
    .await;
    suite(&subject).await;
}

#[tokio::test]
async fn redis_cluster_conforms() {
    // With replicas: writes must reach the masters (a replica would answer READONLY).
    let cluster = RedisCluster::start(3, 1);
    let subject = redis_subject("redis cluster", options(cluster.urls(), RedisMode::Cluster)).await;
    suite(&subject).await;
}

// ---------------------------------------------------------------------------------------------
// Differential: the Lua script against the pure algorithms.

const SEQUENCES: u64 = 200;
const STEPS: usize = 25;
const BASE_SEED: u64 = 0x5eed_b0c4e7;
const UNITS: [u64; 5] = [1_000, 60_000, 3_600_000, 86_400_000, YEAR_MS];

fn random_algorithm(rng: &mut impl Rng) -> Algorithm {
    Algorithm::ALL[rng.random_range(0..Algorithm::ALL.len())]
}

fn random_params(rng: &mut impl Rng, algorithm: Algorithm) -> BucketParams {
    match algorithm {
        Algorithm::TokenBucket => match rng.random_range(0..10) {
            // Huge buckets with a glacial refill exercise the counts past i64 on the wire.
            0 => params(u32::MAX.into(), rng.random_range(1..=3), YEAR_MS),
            1 => params(
                rng.random_range(1..=1_000),
                rng.random_range(1..=1_000),
                1_000,
            ),
            _ => {
                let unit = [1_000, 60_000, 3_600_000][rng.random_range(0..3)];
                let per_unit = rng.random_range(1..=50);
                // A burst above or below the rate, or none.
                let capacity = match rng.random_range(0..3) {
                    0 => per_unit,
                    _ => rng.random_range(1..=60),
                };
                params(capacity, per_unit, unit)
            }
        },
        Algorithm::FixedWindow | Algorithm::SlidingWindow => {
            let limit = match rng.random_range(0..10) {
                0 => u32::MAX.into(),
                _ => rng.random_range(1..=40),
            };
            params(limit, limit, UNITS[rng.random_range(0..UNITS.len())])
        }
        Algorithm::Gcra => match rng.random_range(0..10) {
            // A huge burst refilled once a year: arrival times far beyond 2^53 ms.
            0 => params(u32::MAX.into(), rng.random_range(1..=3), YEAR_MS),
            // Fast rates: intervals of a fraction of a millisecond.
            1 => params(
                rng.random_range(1..=100),
                rng.random_range(1_000..=100_000),
                1_000,
            ),
            _ => params(
                rng.random_range(1..=60),
                rng.random_range(1..=1_000),
                UNITS[rng.random_range(0..3)],
            ),
        },
        Algorithm::InFlight | Algorithm::Reservation => {
            unreachable!("drawn from Algorithm::ALL, the rate algorithms")
        }
    }
}

fn random_demand(rng: &mut impl Rng, algorithm: Algorithm, params: BucketParams) -> Demand {
    let limit = match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingWindow => params.requests_per_unit,
        _ => params.capacity,
    };
    let tokens = match rng.random_range(0..20) {
        0 => 0,
        1 => u64::MAX,
        2 => limit + rng.random_range(1..=3),
        _ => rng.random_range(1..=limit.min(5).max(limit / 3)),
    };
    // Lease takes for every algorithm: the windows must ignore the lease on both sides.
    let lease = match rng.random_range(0..4) {
        0 => rng.random_range(1..=limit.clamp(1, u32::MAX.into())),
        _ => 0,
    };
    // Always-charged takes (`charge: always`, never leased) put keys into debt; their counts
    // stay below 2^53, where the Lua's doubles and the Rust's integers count alike.
    let always = lease == 0 && tokens != u64::MAX && rng.random_bool(0.25);
    Demand {
        refund: rng.random_bool(0.1),
        shadow: rng.random_bool(0.2),
        quota: rng.random_bool(0.3),
        lease,
        always,
        ..Demand::take(algorithm, params, tokens)
    }
}

/// The next time: mostly forward, sometimes a long idle, sometimes backwards, sometimes onto
/// (or just before) a second or minute boundary, where windows turn over.
fn random_step(rng: &mut impl Rng, now: u64) -> u64 {
    match rng.random_range(0..12) {
        0 => now.saturating_sub(rng.random_range(0..=3_000)),
        1 => now + rng.random_range(0..=10 * YEAR_MS),
        2 => now,
        3 | 4 => {
            let unit = [1_000, 60_000][rng.random_range(0..2)];
            (now / unit + 1) * unit - rng.random_range(0..=1)
        }
        _ => now + rng.random_range(1..=2_000),
    }
}

/// A stored double, compared by its bits.
fn bits(text: &str, context: &str) -> u64 {
    text.parse::<f64>()
        .unwrap_or_else(|_| panic!("{context}: {text:?} is not a number"))
        .to_bits()
}

/// What Redis holds for `key`, checked against the model's state field by field.
fn assert_stored(inspect: &mut redis::Connection, key: &str, state: &State, context: &str) {
    let fields: &[&str] = match state {
        State::TokenBucket(_) => &["t", "u"],
        State::FixedWindow(_) => &["w", "c"],
        State::SlidingWindow(_) => &["w", "c", "p"],
        State::Gcra(_) => &["a", "f"],
        State::InFlight(_) | State::Reserved(_) => {
            unreachable!("the differential test draws rate algorithms only")
        }
    };
    let stored: Vec<String> = redis::cmd("HMGET")
        .arg(key)
        .arg(fields)
        .query(inspect)
        .unwrap_or_else(|e| panic!("{context}: HMGET {key}: {e}"));
    let integer = |text: &str| -> u64 {
        text.parse()
            .unwrap_or_else(|_| panic!("{context}: {text:?} in {key}"))
    };
    match *state {
        State::TokenBucket(s) => {
            assert_eq!(
                bits(&stored[0], context),
                s.tokens.to_bits(),
                "{context}: tokens of {key}: redis {}, model {}",
                stored[0],
                s.tokens
            );
            assert_eq!(
                integer(&stored[1]),
                s.updated_ms,
                "{context}: refill mark of {key}"
            );
        }
        State::FixedWindow(s) => {
            assert_eq!(
                (integer(&stored[0]), integer(&stored[1])),
                (s.start_ms, s.count),
                "{context}: window of {key}"
            );
        }
        State::SlidingWindow(s) => {
            assert_eq!(
                (
                    integer(&stored[0]),
                    integer(&stored[1]),
                    integer(&stored[2])
                ),
                (s.start_ms, s.current, s.previous),
                "{context}: windows of {key}"
            );
        }
        State::Gcra(s) => {
            assert_eq!(
                bits(&stored[0], context),
                s.tat_ms.to_bits(),
                "{context}: arrival time of {key}: redis {}, model {}",
                stored[0],
                s.tat_ms
            );
            assert_eq!(
                bits(&stored[1], context),
                s.tat_frac.to_bits(),
                "{context}: arrival fraction of {key}: redis {}, model {}",
                stored[1],
                s.tat_frac
            );
        }
        State::InFlight(_) | State::Reserved(_) => {}
    }
}

/// One differential sequence's buckets: 1–4 keys under `prefix`, each with a random algorithm
/// and shape, their model state (untouched) and a start time.
struct Sequence {
    keys: Vec<String>,
    algorithms: Vec<Algorithm>,
    shapes: Vec<BucketParams>,
    model: Vec<Option<State>>,
    now: u64,
}

impl Sequence {
    fn random(rng: &mut StdRng, prefix: &str) -> Self {
        let keys: Vec<String> = (0..rng.random_range(1..=4))
            .map(|bucket| format!("{prefix}:{bucket}"))
            .collect();
        let algorithms: Vec<Algorithm> = keys.iter().map(|_| random_algorithm(rng)).collect();
        let shapes = algorithms.iter().map(|&a| random_params(rng, a)).collect();
        Sequence {
            model: vec![None; keys.len()],
            now: T0 + rng.random_range(0..60_000),
            keys,
            algorithms,
            shapes,
        }
    }
}

#[tokio::test]
async fn redis_script_matches_pure_algorithm() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let backend = RedisBackend::connect(options(vec![server.url()], RedisMode::Standalone))
        .await
        .expect("connect")
        .with_test_clock(Arc::new(clock.clone()));
    let mut inspect = server.conn();
    let mut decided = [0usize; 4];

    for sequence in 0..SEQUENCES {
        let seed = BASE_SEED + sequence;
        let mut rng = StdRng::seed_from_u64(seed);
        let Sequence {
            keys,
            algorithms,
            shapes,
            mut model,
            mut now,
        } = Sequence::random(&mut rng, &format!("diff:{{{seed}}}"));

        for step in 0..STEPS {
            now = random_step(&mut rng, now);
            clock.set(now);
            // Every key in every step keeps each key's TTL fresh while the test clock and the
            // real clock drift apart, so expiry never decides anything here.
            let demands: Vec<Demand> = algorithms
                .iter()
                .zip(&shapes)
                .map(|(&a, &shape)| random_demand(&mut rng, a, shape))
                .collect();
            let hits: Vec<Hit> = keys
                .iter()
                .zip(&demands)
                .map(|(key, demand)| Hit {
                    key: key.clone(),
                    demand: *demand,
                    rule: None,
                })
                .collect();
            let expected = algorithm::decide(now, &demands, &mut model);
            let got = backend.check(&hits).await.expect("check");
            assert_eq!(
                got, expected,
                "seed {seed}, step {step}, now {now}: demands {demands:#?}"
            );
            for a in &algorithms {
                decided[usize::from(a.wire_code()) - 1] += 1;
            }
        }

        for (key, state) in keys.iter().zip(&model) {
            let state = state.as_ref().expect("every key was touched");
            assert_stored(&mut inspect, key, state, &format!("seed {seed}"));
        }
    }
    println!(
        "differential: decisions per algorithm (token bucket, fixed, sliding, gcra): {decided:?}"
    );
    assert!(
        decided.iter().all(|&n| n > 500),
        "every algorithm is exercised: {decided:?}"
    );
}

/// Batching: several requests decided by one script call, each as its own call would decide it
/// one after another. Random requests over random subsets of a sequence's keys (so requests of a
/// batch share keys) go out concurrently and must match `algorithm::decide` run request by
/// request in that order, and each step's batch must have been one call.
#[tokio::test]
async fn redis_batches_decide_as_requests_one_by_one() {
    let server = RedisServer::start();
    let clock = ManualClock::new(T0);
    let backend = RedisBackend::connect(options(vec![server.url()], RedisMode::Standalone))
        .await
        .expect("connect")
        .with_test_clock(Arc::new(clock.clone()));
    let mut inspect = server.conn();
    let mut batched = 0u64;
    let mut steps = 0u64;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut inspect)
        .expect("CONFIG RESETSTAT");

    for sequence in 0..SEQUENCES / 2 {
        let seed = BASE_SEED ^ 0xba7c4 ^ sequence;
        let mut rng = StdRng::seed_from_u64(seed);
        let Sequence {
            keys,
            algorithms,
            shapes,
            mut model,
            mut now,
        } = Sequence::random(&mut rng, &format!("batch:{{{seed}}}"));

        for step in 0..STEPS / 2 {
            now = random_step(&mut rng, now);
            clock.set(now);
            // Every key is in the first request, so every TTL stays fresh (see above); the others
            // take random subsets.
            let requests: Vec<Vec<usize>> = (0..rng.random_range(1..=8))
                .map(|request| {
                    let mut picked: Vec<usize> = (0..keys.len())
                        .filter(|_| request == 0 || rng.random_bool(0.5))
                        .collect();
                    if picked.is_empty() {
                        picked.push(rng.random_range(0..keys.len()));
                    }
                    picked
                })
                .collect();
            let mut expected = Vec::new();
            let mut batch: Vec<Vec<Hit>> = Vec::new();
            for picked in &requests {
                let demands: Vec<Demand> = picked
                    .iter()
                    .map(|&i| random_demand(&mut rng, algorithms[i], shapes[i]))
                    .collect();
                let mut states: Vec<Option<State>> = picked.iter().map(|&i| model[i]).collect();
                expected.push(algorithm::decide(now, &demands, &mut states));
                for (&i, state) in picked.iter().zip(states) {
                    model[i] = state;
                }
                batch.push(
                    picked
                        .iter()
                        .zip(&demands)
                        .map(|(&i, demand)| Hit {
                            key: keys[i].clone(),
                            demand: *demand,
                            rule: None,
                        })
                        .collect(),
                );
            }
            // Polled together on this one-thread runtime, all are queued before the batch
            // worker runs, so they share one call.
            let got = futures::future::join_all(batch.iter().map(|hits| backend.check(hits))).await;
            for (request, (got, expected)) in got.into_iter().zip(&expected).enumerate() {
                assert_eq!(
                    &got.expect("check"),
                    expected,
                    "seed {seed}, step {step}, request {request} of {:?}, now {now}",
                    requests
                );
            }
            batched += requests.len() as u64;
            steps += 1;
        }

        for (key, state) in keys.iter().zip(&model) {
            let state = state.as_ref().expect("every key was touched");
            assert_stored(&mut inspect, key, state, &format!("seed {seed}"));
        }
    }
    let calls =
        harness::command_calls(&server, "evalsha") + harness::command_calls(&server, "eval");
    println!("batched differential: {batched} requests in {calls} script calls ({steps} batches)");
    assert_eq!(calls, steps, "one script call per batch");
}
