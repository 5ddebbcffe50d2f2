//! Token bucket in the conformance suite. 10 tokens at 10/s is 0.01 token/ms: one token per
//! 100 ms, full in 1000 ms.

use sluice::backend::Backend;

use super::{Subject, T0, YEAR_MS, key, params, quota, refund, shadow, take, took, v};

pub(super) async fn full_after_idle<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn partial_refill<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn never_above_capacity<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn cost_above_tokens<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn cost_above_capacity<B: Backend>(s: &Subject<B>) {
    let (k, p) = (key("cost_above_capacity", "a"), params(10, 10, 1_000));
    s.clock.set(T0);
    s.expect(&[take(&k, p, 11)], &[v(false, 10, None, 0)]).await;
    s.expect(&[take(&k, p, 10)], &[v(true, 0, Some(0), 1_000)])
        .await;
}

pub(super) async fn check_only<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn multi_key_atomic_rejection<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn shadow_mode<B: Backend>(s: &Subject<B>) {
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
pub(super) async fn quota_mode<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn refund_cap<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn clock_step_back<B: Backend>(s: &Subject<B>) {
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

pub(super) async fn u64_max_demand<B: Backend>(s: &Subject<B>) {
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
pub(super) async fn extreme_rates<B: Backend>(s: &Subject<B>) {
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
