//! Token bucket: refill against elapsed time, take only when every key of the request can pay.
//!
//! The contract shared with `lua/limit.lua` (keep them in step):
//! 1. `refill`: missing state is a full bucket; `elapsed = max(0, now - updated)`;
//!    `tokens = min(capacity, tokens + elapsed * requests_per_unit / unit_ms)`; the new `updated`
//!    is `max(updated, now)` so a clock that steps back never refills twice.
//! 2. `need = max(tokens_demanded, 1)` for takes; a take fits when `tokens >= need`.
//! 3. The request is allowed when every non-shadow key fits; only then are takes deducted (a
//!    shadow take is deducted only when it alone can pay). Refunds are always applied, capped at
//!    capacity. An always-charged take (`charge: always`) is always deducted, fitting or not:
//!    the bucket goes into debt (negative tokens), nothing fits until refill brings it back to
//!    `need`, `remaining` is 0 and `until_full` counts the repayment.
//! 4. A lease take (`lease > 0`) that is taken also takes
//!    `extra = max(0, min(lease, floor(tokens - tokens_demanded)))` whole tokens: as many as the bucket
//!    holds beyond the demand, up to the lease. `granted = tokens_demanded + extra` when taken.
//! 5. `remaining = max(0, floor(tokens_after))`; for a rejected take
//!    `retry_after` is the first ms `d >= 1` at which `min(capacity, tokens_after + d *
//!    requests_per_unit / unit_ms) >= need`, searched from `ceil((need - tokens_after) * unit_ms /
//!    requests_per_unit)`; `None` when
//!    `need > capacity`; `until_full = ceil((capacity - tokens_after) * unit_ms / requests_per_unit)`.
//!
//! All in doubles, left to right: each product before its division, never through a rate per
//! ms. A rate `requests_per_unit / unit_ms` is itself rounded, and rounded again when multiplied
//! or divided by, so exact cases came out wrong: at 2 per hour, 1,800,000 ms times
//! `2 / 3_600_000` is 0.9999999999999999 tokens, and the wait for one token was 1,800,001 ms.
//! Multiplied first, the only rounding is the division's: the product of whole numbers (ms times
//! requests per unit, whole tokens times the unit) is exact while it is below 2^53, so a quotient
//! that is a whole number comes out exactly and any other is correctly rounded. A fractional
//! token count still rounds in `need - tokens` and in the refill's addition, so a wait estimated
//! from such a state can be a millisecond off the first one the refill admits; the retry-after is
//! therefore the estimate corrected by `first_fit` against the refill itself (as the GCRA and the
//! sliding window do), and is exact.
//!
//! Stored as `HSET key t <tokens> u <updated_ms>` in Redis; this layout predates the other
//! algorithms and is kept as it was, so upgrading sluice keeps every bucket.

use super::{BucketParams, BucketState, Demand, Verdict, first_fit, need};

/// Tokens in the bucket at `now_ms`, and the refill timestamp to store.
pub fn refill(state: Option<BucketState>, now_ms: u64, params: &BucketParams) -> (f64, u64) {
    let capacity = params.capacity as f64;
    match state {
        None => (capacity, now_ms),
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.updated_ms) as f64;
            let tokens = (s.tokens + params.tokens_over(elapsed)).min(capacity);
            (tokens, s.updated_ms.max(now_ms))
        }
    }
}

/// Whether the demand fits a bucket refilled to now.
pub(super) fn fits(state: &BucketState, demand: &Demand) -> bool {
    demand.refund || state.tokens >= need(demand)
}

/// Applies the demand to a bucket refilled to now (`take` when the whole request is allowed).
pub(super) fn settle(
    state: BucketState,
    demand: &Demand,
    fits: bool,
    take: bool,
) -> (BucketState, Verdict) {
    let capacity = demand.params.capacity as f64;
    let tokens = state.tokens;
    let mut granted = 0;
    let after = if demand.refund {
        (tokens + demand.tokens as f64).min(capacity)
    } else if take {
        let left = tokens - demand.tokens as f64;
        // Never negative: an always-charged take may leave the bucket in debt, which no lease
        // may round back up.
        let extra = left.floor().min(demand.lease as f64).max(0.0);
        granted = demand.tokens.saturating_add(extra as u64);
        left - extra
    } else {
        tokens
    };
    let needed = need(demand);
    let retry_after_ms = if fits {
        Some(0)
    } else if needed > capacity {
        None
    } else {
        // The estimate can be a ms off where the bucket holds a fraction (`needed - tokens` and
        // the refill's addition each round); the search lands on the first ms the refill admits.
        // From the bucket as left: a demand that did not fit took nothing, unless it was
        // always-charged, whose repeat waits for its debt to be repaid as well.
        let fits_at = |d: f64| (after + demand.params.tokens_over(d)).min(capacity) >= needed;
        Some(first_fit(wait_ms(needed - after, &demand.params), fits_at) as u64)
    };
    let verdict = Verdict {
        allowed: fits,
        remaining: after.floor() as u64,
        retry_after_ms,
        until_full_ms: wait_ms(capacity - after, &demand.params) as u64,
        granted,
    };
    let state = BucketState {
        tokens: after,
        updated_ms: state.updated_ms,
    };
    (state, verdict)
}

/// When the bucket is full again.
pub(super) fn settled_at_ms(state: &BucketState, params: &BucketParams) -> u64 {
    let until_full = wait_ms(params.capacity as f64 - state.tokens, params) as u64;
    state.updated_ms.saturating_add(until_full)
}

/// Whole ms until `tokens` more have refilled: `ceil(tokens * unit_ms / requests_per_unit)`, the
/// inverse of [`BucketParams::tokens_over`] with the product again first. NaN (0 tokens at a
/// zero rate) becomes 0 and anything past `u64::MAX` saturates under `as u64`, as `wire` does in
/// the Lua.
fn wait_ms(tokens: f64, params: &BucketParams) -> f64 {
    (tokens * params.unit_ms as f64 / params.requests_per_unit as f64).ceil()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::{Algorithm, State};

    /// The real two-phase decision, over token buckets only.
    fn decide(now_ms: u64, demands: &[Demand], states: &mut [Option<BucketState>]) -> Vec<Verdict> {
        let mut wrapped: Vec<Option<State>> =
            states.iter().map(|s| s.map(State::TokenBucket)).collect();
        let verdicts = crate::algorithm::decide(now_ms, demands, &mut wrapped);
        for (slot, state) in states.iter_mut().zip(wrapped) {
            *slot = match state {
                Some(State::TokenBucket(s)) => Some(s),
                other => panic!("a token bucket demand stored {other:?}"),
            };
        }
        verdicts
    }

    /// `requests_per_unit` per `unit_ms`; tests pick rates that are exact binary fractions per ms
    /// so expected values can be written exactly.
    fn params(capacity: u64, requests_per_unit: u64, unit_ms: u64) -> BucketParams {
        BucketParams {
            capacity,
            requests_per_unit,
            unit_ms,
        }
    }

    fn take(params: BucketParams, tokens: u64) -> Demand {
        crate::algorithm::testing::take(Algorithm::TokenBucket, params, tokens)
    }

    fn shadow(params: BucketParams, tokens: u64) -> Demand {
        Demand {
            shadow: true,
            ..take(params, tokens)
        }
    }

    fn refund(params: BucketParams, tokens: u64) -> Demand {
        Demand {
            refund: true,
            ..take(params, tokens)
        }
    }

    fn at(tokens: f64, updated_ms: u64) -> Option<BucketState> {
        Some(BucketState { tokens, updated_ms })
    }

    /// Decides one demand against one state; returns the verdict and the state to store.
    fn decide_one(
        now_ms: u64,
        demand: Demand,
        state: Option<BucketState>,
    ) -> (Verdict, BucketState) {
        let mut states = [state];
        let verdicts = decide(now_ms, &[demand], &mut states);
        (verdicts[0], states[0].expect("decide stores every state"))
    }

    // 10 tokens, 1 token per 4 ms.
    const QUARTER: BucketParams = BucketParams {
        capacity: 10,
        requests_per_unit: 250,
        unit_ms: 1_000,
    };

    #[test]
    fn missing_state_is_a_full_bucket() {
        assert_eq!(refill(None, 7_000, &QUARTER), (10.0, 7_000));
        let (v, s) = decide_one(7_000, take(QUARTER, 1), None);
        assert!(v.allowed);
        assert_eq!(v.remaining, 9);
        assert_eq!(v.retry_after_ms, Some(0));
        assert_eq!(v.until_full_ms, 4);
        assert_eq!(
            s,
            BucketState {
                tokens: 9.0,
                updated_ms: 7_000
            }
        );
    }

    #[test]
    fn empty_bucket_is_full_again_after_idle() {
        assert_eq!(refill(at(0.0, 1_000), 1_040, &QUARTER), (10.0, 1_040));
        assert_eq!(refill(at(0.0, 1_000), 1_000 + 86_400_000, &QUARTER).0, 10.0);
        let (v, _) = decide_one(1_000_000, take(QUARTER, 10), at(0.0, 1_000));
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
    }

    #[test]
    fn partial_refill_keeps_fractional_tokens() {
        // 3 ms at 0.25/ms = 0.75 tokens: not enough for one, and the fraction is kept.
        let (v, s) = decide_one(1_003, take(QUARTER, 1), at(0.0, 1_000));
        assert!(!v.allowed);
        assert_eq!(v.remaining, 0);
        assert_eq!(v.retry_after_ms, Some(1));
        assert_eq!(
            s,
            BucketState {
                tokens: 0.75,
                updated_ms: 1_003
            }
        );
        // One more ms completes the token; nothing was lost to rounding.
        let (v, s) = decide_one(1_004, take(QUARTER, 1), Some(s));
        assert!(v.allowed);
        assert_eq!(
            s,
            BucketState {
                tokens: 0.0,
                updated_ms: 1_004
            }
        );
        // Slow rates accumulate exactly: 1 token per minute, 20 s three times.
        let per_minute = params(5, 1, 60_000);
        let mut state = at(0.0, 0);
        for now in [20_000, 40_000] {
            let (v, s) = decide_one(now, take(per_minute, 1), state);
            assert!(!v.allowed, "at {now}");
            state = Some(s);
        }
        let (v, _) = decide_one(60_000, take(per_minute, 1), state);
        assert!(v.allowed);
    }

    #[test]
    fn remaining_is_rounded_down() {
        let (v, s) = decide_one(1_011, take(QUARTER, 1), at(0.0, 1_000));
        // 2.75 tokens, one taken.
        assert!(v.allowed);
        assert_eq!(s.tokens, 1.75);
        assert_eq!(v.remaining, 1);
    }

    #[test]
    fn never_above_capacity() {
        assert_eq!(refill(at(10.0, 0), 1_000_000, &QUARTER).0, 10.0);
        assert_eq!(refill(at(9.5, 0), 4, &QUARTER).0, 10.0);
        assert_eq!(refill(at(9.5, 0), u64::MAX, &QUARTER).0, 10.0);
        let (v, s) = decide_one(5, refund(QUARTER, 3), at(9.0, 0));
        assert_eq!(s.tokens, 10.0);
        assert_eq!(v.remaining, 10);
        assert_eq!(v.until_full_ms, 0);
    }

    #[test]
    fn cost_above_tokens_is_rejected_with_nothing_taken() {
        // 3 tokens, 5 wanted, 3 tokens per 8 ms: 2 missing / 0.375 = 5.33 ms, rounded up to 6.
        let p = params(10, 375, 1_000);
        let (v, s) = decide_one(100, take(p, 5), at(3.0, 100));
        assert!(!v.allowed);
        assert_eq!(v.remaining, 3);
        assert_eq!(v.retry_after_ms, Some(6));
        assert_eq!(
            s,
            BucketState {
                tokens: 3.0,
                updated_ms: 100
            }
        );
        // Five ms later still short, six ms later enough: the retry-after is the exact ceiling.
        assert!(!decide_one(105, take(p, 5), Some(s)).0.allowed);
        assert!(decide_one(106, take(p, 5), Some(s)).0.allowed);
    }

    #[test]
    fn retry_after_is_not_rounded_past_an_exact_value() {
        // 2 missing at 0.25/ms is exactly 8 ms.
        let (v, _) = decide_one(0, take(QUARTER, 5), at(3.0, 0));
        assert_eq!(v.retry_after_ms, Some(8));
    }

    #[test]
    fn slow_rates_wait_exactly_whole_intervals() {
        // 2 per hour: one token every 1,800,000 ms. Through a rate per ms the refill over that
        // time is just under one token (two roundings), and the wait came out 1,800,001 ms.
        let p = params(2, 2, 3_600_000);
        let rate_per_ms = p.requests_per_unit as f64 / p.unit_ms as f64;
        assert_eq!(1_800_000.0 * rate_per_ms, 0.9999999999999999);
        let (_, s) = decide_one(0, take(p, 1), None);
        let (v, s) = decide_one(0, take(p, 1), Some(s));
        assert!(v.allowed);
        assert_eq!(s.tokens, 0.0);
        let (v, s) = decide_one(0, take(p, 1), Some(s));
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ms, Some(1_800_000));
        assert_eq!(v.until_full_ms, 3_600_000);
        assert_eq!(settled_at_ms(&s, &p), 3_600_000);
        // One ms early is still short; on time one whole token is back.
        assert!(!decide_one(1_799_999, take(p, 1), Some(s)).0.allowed);
        assert_eq!(refill(Some(s), 1_800_000, &p), (1.0, 1_800_000));
        let (v, s) = decide_one(1_800_000, take(p, 1), Some(s));
        assert!(v.allowed);
        assert_eq!((v.remaining, v.until_full_ms), (0, 3_600_000));
        assert_eq!(s.tokens, 0.0);
    }

    #[test]
    fn retry_after_from_a_partial_refill_is_exact() {
        // Fractions of a token come from refills of part of an interval, and there
        // `need - tokens` and the refill's own addition round: the estimated wait can be a ms off
        // the first ms the refill admits. Every state an empty bucket refills to in its first
        // 2,000 ms, at rates whose intervals are not whole ms, must wait exactly.
        let mut checked = 0;
        for unit_ms in [1_000, 60_000, 3_600_000] {
            for requests_per_unit in [3, 7, 9, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47] {
                for capacity in [1, 2, 5, 50] {
                    let p = params(capacity, requests_per_unit, unit_ms);
                    for elapsed in 1..2_000 {
                        let (v, s) = decide_one(elapsed, take(p, capacity), at(0.0, 0));
                        if v.allowed {
                            continue;
                        }
                        let wait = v.retry_after_ms.expect("capacity can always fit");
                        let need = capacity as f64;
                        assert!(
                            refill(Some(s), elapsed + wait, &p).0 >= need,
                            "{p:?} after {elapsed} ms: wait {wait} too short"
                        );
                        assert!(
                            refill(Some(s), elapsed + wait - 1, &p).0 < need,
                            "{p:?} after {elapsed} ms: wait {wait} too long"
                        );
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked}");
    }

    #[test]
    fn cost_above_capacity_is_never_allowed() {
        for state in [None, at(10.0, 0), at(0.0, 0)] {
            let (v, s) = decide_one(0, take(QUARTER, 11), state);
            assert!(!v.allowed);
            assert_eq!(v.retry_after_ms, None);
            assert_eq!(s.tokens, state.map_or(10.0, |s| s.tokens), "nothing taken");
        }
        // Exactly the capacity is possible once full.
        let (v, _) = decide_one(0, take(QUARTER, 10), at(0.0, 0));
        assert_eq!(v.retry_after_ms, Some(40));
    }

    #[test]
    fn check_only_needs_one_token_and_takes_nothing() {
        let (v, s) = decide_one(0, take(QUARTER, 0), at(1.0, 0));
        assert!(v.allowed);
        assert_eq!(v.remaining, 1);
        assert_eq!(s.tokens, 1.0);

        let (v, s) = decide_one(0, take(QUARTER, 0), at(0.5, 0));
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ms, Some(2));
        assert_eq!(s.tokens, 0.5);

        let (v, s) = decide_one(0, take(QUARTER, 0), None);
        assert!(v.allowed);
        assert_eq!((v.remaining, v.until_full_ms), (10, 0));
        assert_eq!(s.tokens, 10.0);
    }

    #[test]
    fn one_short_bucket_rejects_the_request_and_nothing_is_taken_anywhere() {
        let big = params(100, 100, 1_000);
        let demands = [take(big, 1), take(QUARTER, 5), take(big, 2)];
        let mut states = [at(50.0, 0), at(2.0, 0), None];
        let verdicts = decide(0, &demands, &mut states);
        assert_eq!(
            verdicts.iter().map(|v| v.allowed).collect::<Vec<_>>(),
            [true, false, true],
            "each verdict says whether that bucket alone could pay"
        );
        assert_eq!(verdicts[0].remaining, 50);
        assert_eq!(verdicts[2].remaining, 100);
        assert_eq!(verdicts[1].retry_after_ms, Some(12));
        let tokens: Vec<f64> = states.iter().map(|s| s.unwrap().tokens).collect();
        assert_eq!(tokens, [50.0, 2.0, 100.0]);
    }

    #[test]
    fn short_shadow_bucket_does_not_reject_and_is_not_taken_from() {
        let demands = [take(QUARTER, 3), shadow(QUARTER, 5), shadow(QUARTER, 1)];
        let mut states = [at(10.0, 0), at(2.0, 0), at(4.0, 0)];
        let verdicts = decide(0, &demands, &mut states);
        assert!(verdicts[0].allowed);
        assert!(!verdicts[1].allowed);
        assert!(verdicts[2].allowed);
        let tokens: Vec<f64> = states.iter().map(|s| s.unwrap().tokens).collect();
        // The short shadow bucket never goes negative; a shadow bucket that can pay does pay.
        assert_eq!(tokens, [7.0, 2.0, 3.0]);
    }

    #[test]
    fn shadow_bucket_is_not_taken_from_when_the_request_is_rejected() {
        let demands = [take(QUARTER, 5), shadow(QUARTER, 1)];
        let mut states = [at(1.0, 0), at(4.0, 0)];
        let verdicts = decide(0, &demands, &mut states);
        assert!(!verdicts[0].allowed);
        assert!(verdicts[1].allowed);
        assert_eq!(states[1].unwrap().tokens, 4.0);
    }

    #[test]
    fn refund_is_capped_and_applied_even_when_the_request_is_rejected() {
        let demands = [take(QUARTER, 5), refund(QUARTER, 3), refund(QUARTER, 7)];
        let mut states = [at(1.0, 0), at(2.0, 0), at(6.0, 0)];
        let verdicts = decide(0, &demands, &mut states);
        assert!(!verdicts[0].allowed);
        assert!(verdicts[1].allowed && verdicts[2].allowed);
        assert_eq!(verdicts[1].retry_after_ms, Some(0));
        let tokens: Vec<f64> = states.iter().map(|s| s.unwrap().tokens).collect();
        assert_eq!(tokens, [1.0, 5.0, 10.0]);
        assert_eq!((verdicts[1].remaining, verdicts[2].remaining), (5, 10));
        assert_eq!(
            (verdicts[1].until_full_ms, verdicts[2].until_full_ms),
            (20, 0)
        );
    }

    #[test]
    fn clock_stepping_back_refills_nothing_and_never_twice() {
        let (v, s) = decide_one(600, take(QUARTER, 1), at(2.0, 1_000));
        assert!(v.allowed);
        assert_eq!(
            s,
            BucketState {
                tokens: 1.0,
                updated_ms: 1_000
            }
        );
        // Back at the stored time: the 400 ms "lived twice" are not refilled again.
        let (_, s) = decide_one(1_000, take(QUARTER, 0), Some(s));
        assert_eq!(
            s,
            BucketState {
                tokens: 1.0,
                updated_ms: 1_000
            }
        );
        let (_, s) = decide_one(1_004, take(QUARTER, 0), Some(s));
        assert_eq!(
            s,
            BucketState {
                tokens: 2.0,
                updated_ms: 1_004
            }
        );
    }

    #[test]
    fn huge_demands_do_not_overflow_or_panic() {
        for tokens in [u32::MAX as u64, u64::MAX] {
            let (v, s) = decide_one(0, take(QUARTER, tokens), at(3.0, 0));
            assert!(!v.allowed);
            assert_eq!(v.retry_after_ms, None);
            assert_eq!(s.tokens, 3.0);

            let (v, s) = decide_one(0, refund(QUARTER, tokens), at(3.0, 0));
            assert!(v.allowed);
            assert_eq!(s.tokens, 10.0);

            let (v, _) = decide_one(u64::MAX, shadow(QUARTER, tokens), at(3.0, 0));
            assert!(!v.allowed);
        }
        // Extreme shapes: capacity and rate at the integer limits.
        let widest = params(u64::MAX, u64::MAX, 1);
        let (v, s) = decide_one(u64::MAX, take(widest, u64::MAX), None);
        assert!(v.allowed);
        assert_eq!(s.tokens, 0.0);
        assert_eq!(v.until_full_ms, 1);
        let slowest = params(u64::MAX, 1, u64::MAX);
        let (v, _) = decide_one(0, take(slowest, u64::MAX), at(0.0, 0));
        assert!(!v.allowed);
        assert_eq!(
            v.retry_after_ms,
            Some(u64::MAX),
            "saturates rather than wraps"
        );
        assert_eq!(v.until_full_ms, u64::MAX);
    }

    #[test]
    fn until_full_is_exact_and_rounded_up() {
        let (v, _) = decide_one(0, take(QUARTER, 0), at(0.0, 0));
        assert_eq!(v.until_full_ms, 40);
        let (v, _) = decide_one(0, take(QUARTER, 1), at(8.5, 0));
        assert_eq!(v.until_full_ms, 10);
        // 1 token missing at 0.375/ms = 2.67 ms -> 3.
        let p = params(10, 375, 1_000);
        let (v, s) = decide_one(0, take(p, 1), None);
        assert_eq!(v.until_full_ms, 3);
        assert!(refill(Some(s), 2, &p).0 < 10.0);
        assert_eq!(refill(Some(s), 3, &p).0, 10.0);
    }

    fn any_params() -> impl Strategy<Value = BucketParams> {
        (
            1u64..=1_000,
            1u64..=1_000,
            prop::sample::select(vec![1_000u64, 60_000, 3_600_000, 86_400_000]),
        )
            .prop_map(|(capacity, requests_per_unit, unit_ms)| {
                params(capacity, requests_per_unit, unit_ms)
            })
    }

    proptest! {
        #[test]
        fn tokens_stay_within_zero_and_capacity(
            p in any_params(),
            steps in prop::collection::vec(
                (-2_000i64..20_000, 0u64..2_500, any::<bool>(), any::<bool>()),
                1..80,
            ),
        ) {
            let mut now: u64 = 1_000_000;
            let mut state = None;
            for (dt, tokens, is_refund, is_shadow) in steps {
                now = now.saturating_add_signed(dt);
                let demand = Demand { refund: is_refund, shadow: is_shadow, ..Demand::take(Algorithm::TokenBucket, p, tokens) };
                let (v, s) = decide_one(now, demand, state);
                prop_assert!(s.tokens >= 0.0 && s.tokens <= p.capacity as f64, "{s:?}");
                prop_assert!(v.remaining <= p.capacity);
                state = Some(s);
            }
        }

        #[test]
        fn granted_over_any_window_is_at_most_capacity_plus_refill(
            p in any_params(),
            steps in prop::collection::vec((0u64..5_000, 0u64..200), 1..100),
        ) {
            let mut now: u64 = 1_000_000;
            let mut state = None;
            // (time, tokens granted) per decision.
            let mut grants = Vec::with_capacity(steps.len());
            for (dt, tokens) in steps {
                now += dt;
                let (v, s) = decide_one(now, take(p, tokens), state);
                state = Some(s);
                grants.push((now, if v.allowed { tokens } else { 0 }));
            }
            for i in 0..grants.len() {
                let mut granted = 0u64;
                for &(t, g) in &grants[i..] {
                    granted += g;
                    let bound = p.capacity as f64 + p.tokens_over((t - grants[i].0) as f64);
                    prop_assert!(granted as f64 <= bound + 1e-9, "{granted} > {bound}");
                }
            }
        }

        /// One request over several buckets: either every non-shadow bucket can pay and each
        /// paying bucket loses exactly its tokens, or nothing is taken anywhere but from the
        /// always-charged buckets, which pay whatever the answer; refunds apply either way,
        /// capped at capacity.
        #[test]
        fn requests_are_all_or_nothing(
            buckets in prop::collection::vec(
                (any_params(), 0.0f64..=1.0, 0u64..1_500, any::<bool>(), any::<bool>(), any::<bool>()),
                1..6,
            ),
            dt in 0u64..10_000,
        ) {
            let now = 1_000_000 + dt;
            let demands: Vec<Demand> = buckets
                .iter()
                .map(|&(p, _, tokens, refund, shadow, always)| Demand { refund, shadow, always, ..Demand::take(Algorithm::TokenBucket, p, tokens) })
                .collect();
            let mut states: Vec<Option<BucketState>> = buckets
                .iter()
                .map(|&(p, fill, ..)| at(fill * p.capacity as f64, 1_000_000))
                .collect();
            let before: Vec<f64> = states
                .iter()
                .zip(&demands)
                .map(|(s, d)| refill(*s, now, &d.params).0)
                .collect();
            let verdicts = decide(now, &demands, &mut states);
            let fits = |i: usize| demands[i].refund || before[i] >= demands[i].tokens.max(1) as f64;
            let request_allowed = (0..demands.len()).all(|i| demands[i].shadow || fits(i));
            for (i, (d, v)) in demands.iter().zip(&verdicts).enumerate() {
                prop_assert_eq!(v.allowed, fits(i));
                let after = states[i].unwrap().tokens;
                let capacity = d.params.capacity as f64;
                let expected = if d.refund {
                    (before[i] + d.tokens as f64).min(capacity)
                } else if d.always || (request_allowed && fits(i)) {
                    before[i] - d.tokens as f64
                } else {
                    before[i]
                };
                prop_assert_eq!(after, expected, "bucket {} of {:?}", i, demands);
            }
        }

        /// A rejected demand that can ever fit fits after exactly `retry_after_ms`, not before.
        #[test]
        fn retry_after_is_the_exact_wait(
            p in any_params(),
            fill in 0.0f64..=1.0,
            tokens in 0u64..1_000,
        ) {
            let start = at(fill * p.capacity as f64, 5_000);
            let (v, s) = decide_one(5_000, take(p, tokens), start);
            prop_assume!(!v.allowed);
            let need = tokens.max(1) as f64;
            match v.retry_after_ms {
                None => prop_assert!(need > p.capacity as f64),
                Some(wait) => {
                    prop_assert!(wait > 0);
                    prop_assert!(refill(Some(s), 5_000 + wait, &p).0 >= need, "wait {wait} too short");
                    prop_assert!(refill(Some(s), 5_000 + wait - 1, &p).0 < need, "wait {wait} too long");
                }
            }
        }

        /// From a whole number of tokens, a wait that is a whole number of ms is reported
        /// exactly and refills exactly: the products are of whole numbers below 2^53, so the
        /// only rounding is the division's, which has nothing to round.
        #[test]
        fn whole_waits_are_exact(
            requests_per_unit in 1u64..=1_000,
            unit_ms in prop::sample::select(vec![1_000u64, 60_000, 3_600_000, 86_400_000]),
            wholes in 1u64..=20,
            start_tokens in 0u64..1_000,
            room in 0u64..1_000,
        ) {
            // `missing` tokens refill in a whole number of ms: a multiple of rpu / gcd(rpu, unit).
            let (mut a, mut b) = (requests_per_unit, unit_ms);
            while b != 0 {
                (a, b) = (b, a % b);
            }
            let missing = requests_per_unit / a * wholes;
            let tokens = start_tokens + missing;
            let p = params(tokens + room, requests_per_unit, unit_ms);
            let wait = missing * unit_ms / requests_per_unit;
            let (v, s) = decide_one(5_000, take(p, tokens), at(start_tokens as f64, 5_000));
            prop_assert!(!v.allowed);
            prop_assert_eq!(v.retry_after_ms, Some(wait));
            prop_assert_eq!(refill(Some(s), 5_000 + wait, &p).0, tokens as f64);
            prop_assert!(refill(Some(s), 5_000 + wait - 1, &p).0 < tokens as f64);
        }

        #[test]
        fn bucket_is_full_once_until_full_has_elapsed(
            p in any_params(),
            tokens in 0u64..1_000,
            start_tokens in 0.0f64..1.0,
        ) {
            let start = at(start_tokens * p.capacity as f64, 5_000);
            let (v, s) = decide_one(5_000, take(p, tokens), start);
            prop_assert_eq!(refill(Some(s), s.updated_ms + v.until_full_ms, &p).0, p.capacity as f64);
        }
    }
}
