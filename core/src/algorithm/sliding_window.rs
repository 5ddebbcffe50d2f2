//! Sliding window counter: the current window's count plus the previous window's, weighted by
//! how much of the previous window the sliding window still overlaps.
//!
//! The contract shared with `lua/limit.lua` (keep them in step). `L = requests_per_unit`,
//! `W = unit_ms`, windows aligned as the fixed window's (`now - now % W`):
//! 1. Rolling to `now`: a stored window that is now's (or later: the clock stepped back) is kept;
//!    the one just before now's becomes the previous count with an empty current one; anything
//!    older counts nothing.
//! 2. `elapsed = max(0, now - start)`; `estimate = previous * (W - elapsed) / W + current`, in
//!    doubles, in that order.
//! 3. `need = max(hits, 1)`; a take fits when `estimate + need <= L`. Taken (added to the current
//!    count) only when the whole request is allowed, or always when always-charged (`charge:
//!    always`): then the count may pass `L`, and the excess weighs on the next window too. A refund comes off the current count first,
//!    then the previous one, never below 0.
//! 4. `remaining` = the most hits `n <= L` with `estimate_after + n <= L`; `retry_after` = the
//!    first millisecond at which the demand fits (`None` when `need > L`), both found by a short
//!    search from their closed form so they agree with the fit test exactly; `until_full` = until
//!    nothing is counted: the end of the next window when the current window counts anything,
//!    else the end of this one when the previous does, else 0.
//!
//! Stored as `HSET key w <window start> c <current> p <previous>`.
//!
//! **The approximation.** The estimate assumes the previous window's hits were spread evenly
//! over it. They need not be: over a span of one window length that starts a fraction `f` into
//! window `k-1`, at most `L + previous × f` hits are allowed (`previous` = window `k-1`'s count),
//! less than `2 × L`; when the previous window's hits were spread evenly, at most `L`. Within
//! one aligned window at most `L`. Unlike the fixed window there is no reset at the boundary: a
//! client that used its limit at the end of one window gets it back gradually over the next.

use super::{BucketParams, Demand, Verdict, first_fit, most_that_fit, need};

/// Counts of the current and previous window. No state is two empty windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingState {
    /// Start of the current window, ms.
    pub start_ms: u64,
    pub current: u64,
    pub previous: u64,
}

fn window_ms(params: &BucketParams) -> u64 {
    params.unit_ms.max(1)
}

/// The windows as of `now_ms`.
pub fn current(state: Option<SlidingState>, now_ms: u64, params: &BucketParams) -> SlidingState {
    let w = window_ms(params);
    let start_ms = now_ms - now_ms % w;
    match state {
        Some(s) if s.start_ms >= start_ms => s,
        Some(s) if s.start_ms.saturating_add(w) == start_ms => SlidingState {
            start_ms,
            current: 0,
            previous: s.current,
        },
        _ => SlidingState {
            start_ms,
            current: 0,
            previous: 0,
        },
    }
}

/// The weighted count at `now_ms` of windows already rolled to it.
pub fn estimate(state: &SlidingState, now_ms: u64, params: &BucketParams) -> f64 {
    let w = window_ms(params);
    let elapsed = now_ms.saturating_sub(state.start_ms);
    state.previous as f64 * (w - elapsed.min(w)) as f64 / w as f64 + state.current as f64
}

pub(super) fn fits(state: &SlidingState, now_ms: u64, demand: &Demand) -> bool {
    demand.refund
        || estimate(state, now_ms, &demand.params) + need(demand)
            <= demand.params.requests_per_unit as f64
}

pub(super) fn settle(
    state: SlidingState,
    now_ms: u64,
    demand: &Demand,
    fits: bool,
    take: bool,
) -> (SlidingState, Verdict) {
    let p = &demand.params;
    let w = window_ms(p);
    let limit = p.requests_per_unit as f64;
    let mut after = state;
    if demand.refund {
        let from_current = demand.tokens.min(state.current);
        after.current = state.current - from_current;
        after.previous = state.previous.saturating_sub(demand.tokens - from_current);
    } else if take {
        after.current = state.current.saturating_add(demand.tokens);
    }
    let estimated = estimate(&after, now_ms, p);
    let remaining = most_that_fit(limit - estimated, limit, |n| estimated + n <= limit);

    let needed = need(demand);
    let retry_after_ms = if fits {
        Some(0)
    } else if needed > limit {
        None
    } else {
        let fits_at = |d: f64| {
            let t = now_ms.saturating_add(d as u64);
            estimate(&current(Some(after), t, p), t, p) + needed <= limit
        };
        let (wf, current_f, previous_f) = (w as f64, after.current as f64, after.previous as f64);
        let elapsed = now_ms.saturating_sub(after.start_ms) as f64;
        let guess = if current_f + needed <= limit && previous_f > 0.0 {
            // Later in this window, once the previous window's weight has dropped enough.
            ((wf - elapsed) - (limit - needed - current_f) * wf / previous_f).ceil()
        } else {
            // In the next window, where this window's count is the previous one.
            let mut into_next = 0.0;
            if current_f > 0.0 {
                into_next = wf - (limit - needed) * wf / current_f;
            }
            if into_next < 0.0 {
                into_next = 0.0;
            }
            (after.start_ms.saturating_add(w) - now_ms) as f64 + into_next.ceil()
        };
        Some(first_fit(guess, fits_at) as u64)
    };
    let until_full_ms = if after.current > 0 {
        after.start_ms.saturating_add(w.saturating_mul(2)) - now_ms
    } else if after.previous > 0 {
        after.start_ms.saturating_add(w) - now_ms
    } else {
        0
    };
    let verdict = Verdict {
        allowed: fits,
        remaining: remaining as u64,
        retry_after_ms,
        until_full_ms,
        granted: if take { demand.tokens } else { 0 },
    };
    (after, verdict)
}

/// Nothing is counted once the current window's hits have aged out of the next window.
pub(super) fn settled_at_ms(state: &SlidingState, params: &BucketParams) -> u64 {
    let w = window_ms(params);
    if state.current > 0 {
        state.start_ms.saturating_add(w.saturating_mul(2))
    } else if state.previous > 0 {
        state.start_ms.saturating_add(w)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::{Algorithm, testing};

    /// 10 per second.
    const TEN: BucketParams = BucketParams {
        capacity: 10,
        requests_per_unit: 10,
        unit_ms: 1_000,
    };
    /// A second boundary.
    const T0: u64 = 1_700_000_000_000;

    fn take(params: BucketParams, tokens: u64) -> Demand {
        testing::take(Algorithm::SlidingWindow, params, tokens)
    }

    fn one(now: u64, demand: Demand, state: Option<SlidingState>) -> (Verdict, SlidingState) {
        testing::decide_one(now, demand, state)
    }

    fn at(start_ms: u64, current: u64, previous: u64) -> Option<SlidingState> {
        Some(SlidingState {
            start_ms,
            current,
            previous,
        })
    }

    #[test]
    fn windows_roll_forward() {
        let s = at(T0, 4, 9);
        assert_eq!(current(s, T0 + 999, &TEN), s.unwrap());
        assert_eq!(current(s, T0 + 1_000, &TEN), at(T0 + 1_000, 0, 4).unwrap());
        assert_eq!(current(s, T0 + 2_000, &TEN), at(T0 + 2_000, 0, 0).unwrap());
        assert_eq!(
            current(None, T0 + 1_500, &TEN),
            at(T0 + 1_000, 0, 0).unwrap()
        );
        // A clock stepping back keeps the later window.
        assert_eq!(current(s, T0 - 1, &TEN), s.unwrap());
    }

    #[test]
    fn the_previous_window_counts_by_its_remaining_overlap() {
        // 8 in the previous window; 250 ms into this one 3/4 of it still counts: 6.
        let s = at(T0, 0, 8);
        assert_eq!(estimate(&s.unwrap(), T0 + 250, &TEN), 6.0);
        let (v, s) = one(T0 + 250, take(TEN, 4), s);
        assert!(v.allowed);
        assert_eq!((v.remaining, s.current), (0, 4));
        // 6 + 4 = 10: one more is rejected until the previous window's weight drops by one hit,
        // 1/8 of the window later (125 ms).
        let (v, _) = one(T0 + 250, take(TEN, 1), Some(s));
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ms, Some(125));
        assert!(!one(T0 + 374, take(TEN, 1), Some(s)).0.allowed);
        assert!(one(T0 + 375, take(TEN, 1), Some(s)).0.allowed);
        // Until nothing is counted: the end of the next window.
        assert_eq!(v.until_full_ms, 2_000 - 250);
    }

    #[test]
    fn no_reset_at_the_boundary() {
        // The whole limit used at the end of a window...
        let (_, s) = one(T0 + 999, take(TEN, 10), None);
        // ...is still almost all counted just after the boundary.
        let (v, s2) = one(T0 + 1_000, take(TEN, 1), Some(s));
        assert!(!v.allowed);
        assert_eq!(s2, at(T0 + 1_000, 0, 10).unwrap());
        // One hit frees up per 100 ms of the new window.
        assert_eq!(v.retry_after_ms, Some(100));
        let (v, _) = one(T0 + 1_500, take(TEN, 5), Some(s2));
        assert!(v.allowed);
        assert_eq!(v.remaining, 0);
    }

    #[test]
    fn a_rejection_that_must_wait_for_the_next_window() {
        // 9 in this window, nothing before: 2 more fit only once those 9 weigh at most 8.
        let (v, _) = one(T0 + 900, take(TEN, 2), at(T0, 9, 0));
        assert!(!v.allowed);
        // Next window at +100 ms, then 1/9 of it (111.1 ms, so 112).
        assert_eq!(v.retry_after_ms, Some(100 + 112));
        assert_eq!(v.until_full_ms, 1_100);
        assert_eq!(one(T0 + 900, take(TEN, 11), None).0.retry_after_ms, None);
    }

    #[test]
    fn refunds_come_off_the_current_count_then_the_previous() {
        let mut refund = take(TEN, 5);
        refund.refund = true;
        let (v, s) = one(T0 + 500, refund, at(T0, 3, 6));
        assert!(v.allowed);
        assert_eq!(s, at(T0, 0, 4).unwrap());
        refund.tokens = u64::MAX;
        let (v, s) = one(T0 + 500, refund, Some(s));
        assert_eq!(s, at(T0, 0, 0).unwrap());
        assert_eq!((v.remaining, v.until_full_ms), (10, 0));
        assert_eq!(settled_at_ms(&s, &TEN), 0);
    }

    #[test]
    fn check_only_counts_nothing() {
        let (v, s) = one(T0, take(TEN, 0), at(T0, 9, 0));
        assert!(v.allowed && s.current == 9 && v.remaining == 1);
        let (v, _) = one(T0, take(TEN, 0), at(T0, 10, 0));
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ms, Some(1_100));
    }

    fn any_params() -> impl Strategy<Value = BucketParams> {
        (
            1u64..=40,
            prop::sample::select(vec![1_000u64, 7_000, 60_000]),
        )
            .prop_map(|(limit, unit_ms)| BucketParams {
                capacity: limit,
                requests_per_unit: limit,
                unit_ms,
            })
    }

    proptest! {
        /// Over any span of one window length starting a fraction `f` into an aligned window
        /// holding `c` hits, at most `L + c × f` hits pass (so fewer than `2 L`); within an
        /// aligned window at most `L`.
        #[test]
        fn the_approximation_stays_within_its_bound(
            p in any_params(),
            steps in prop::collection::vec((0u64..400, 0u64..4), 1..150),
        ) {
            let w = p.unit_ms;
            let mut now = T0 + 3;
            let mut state = None;
            let mut grants = Vec::new();
            for (dt, hits) in steps {
                now += dt * w / 1_000;
                let (v, s) = one(now, take(p, hits), state);
                state = Some(s);
                if v.allowed && hits > 0 {
                    grants.push((now, hits));
                }
            }
            let window_count = |start: u64| -> u64 {
                grants.iter().filter(|(t, _)| t - t % w == start).map(|(_, h)| h).sum()
            };
            for (start, _) in grants.iter().map(|(t, h)| (t - t % w, h)) {
                prop_assert!(window_count(start) <= p.requests_per_unit);
            }
            for &(t0, _) in &grants {
                let span: u64 = grants.iter()
                    .filter(|(t, _)| *t >= t0 && *t < t0 + w)
                    .map(|(_, h)| h)
                    .sum();
                let start = t0 - t0 % w;
                let f = (t0 - start) as f64 / w as f64;
                let bound = p.requests_per_unit as f64 + window_count(start) as f64 * f;
                prop_assert!(span as f64 <= bound + 1e-9, "{span} > {bound} from {t0}");
                prop_assert!(span < 2 * p.requests_per_unit);
            }
        }

        /// `remaining` hits are allowed right now and one more is not; a rejected demand that
        /// can fit is allowed after exactly `retry_after_ms` and not a millisecond before;
        /// nothing is counted once `until_full_ms` has passed.
        #[test]
        fn remaining_retry_after_and_reset_are_exact(
            p in any_params(),
            current_count in 0u64..=40,
            previous in 0u64..=40,
            offset in 0u64..60_000,
            hits in 0u64..45,
            always in any::<bool>(),
        ) {
            let now = T0 + offset;
            let start = now - now % p.unit_ms;
            let state = at(start, current_count.min(p.requests_per_unit), previous.min(p.requests_per_unit));
            // An always-charged demand that does not fit is counted past the limit; the answers
            // stay exact from the state it leaves.
            let (v, s) = one(now, Demand { always, ..take(p, hits) }, state);
            if v.remaining > 0 {
                prop_assert!(one(now, take(p, v.remaining), Some(s)).0.allowed);
            }
            prop_assert!(!one(now, take(p, v.remaining + 1), Some(s)).0.allowed);
            if !v.allowed {
                match v.retry_after_ms {
                    None => prop_assert!(hits > p.requests_per_unit),
                    Some(wait) => {
                        prop_assert!(wait > 0);
                        prop_assert!(one(now + wait, take(p, hits), Some(s)).0.allowed, "wait {wait} too short");
                        prop_assert!(!one(now + wait - 1, take(p, hits), Some(s)).0.allowed, "wait {wait} too long");
                    }
                }
            }
            let later = now + v.until_full_ms;
            prop_assert_eq!(estimate(&current(Some(s), later, &p), later, &p), 0.0);
            prop_assert_eq!(settled_at_ms(&s, &p).max(now), later);
        }
    }
}
