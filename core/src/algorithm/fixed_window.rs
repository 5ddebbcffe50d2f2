//! Fixed window: a counter per window aligned to the unit on the clock, as envoyproxy/ratelimit
//! counts.
//!
//! The contract shared with `lua/limit.lua` (keep them in step). `L = requests_per_unit`,
//! `W = unit_ms`, times in ms on the deciding clock (Redis `TIME` in production):
//! 1. The window of `now` starts at `now - now % W`: aligned to the Unix epoch like
//!    envoyproxy/ratelimit's `(now / divider) * divider`, so a minute starts at :00 and a day at
//!    00:00 UTC (a week on a Thursday, a month every 30 days, a year every 365, as there).
//! 2. A stored window older than now's counts nothing; a stored window *later* than now's (the
//!    clock stepped back) stays the current one, so stepping back never opens a second window.
//! 3. `need = max(hits, 1)`; a take fits when `count + need <= L`. Taken only when the whole
//!    request is allowed: a rejected hit is not counted (envoyproxy/ratelimit counts it unless
//!    `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`), unless it is always-charged (`charge: always`,
//!    envoyproxy/ratelimit's default): then it is counted whatever the answer and the count may
//!    pass `L` until the window ends. A refund lowers the count, never below 0.
//! 4. `remaining = L - count_after`; `retry_after` = the window's end − now for a rejected take
//!    (`None` when `need > L`); `until_full` (Envoy's `duration_until_reset`) = the window's end −
//!    now in whole seconds, `W - (now_s % W)` exactly as envoyproxy/ratelimit computes it.
//!
//! Stored as `HSET key w <window start> c <count>`, expiring at the window's end (plus the
//! expiry margin and jitter): the key is per descriptor, not per window, and the window start
//! in it tells an old window from the current one, so a late expiry never misreads a count.
//!
//! Over any span of one window length at most `2 × L` hits are allowed (`L` at the end of one
//! window, `L` at the start of the next); within one aligned window at most `L`.

use super::{BucketParams, Demand, Verdict, need};

/// A window's count. No state is an empty window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowState {
    /// Start of the window the count belongs to, ms.
    pub start_ms: u64,
    pub count: u64,
}

fn window_ms(params: &BucketParams) -> u64 {
    params.unit_ms.max(1)
}

/// Start of the window holding `now_ms`.
pub fn window_start(now_ms: u64, window_ms: u64) -> u64 {
    now_ms - now_ms % window_ms
}

/// The window as of `now_ms`: the stored one if it is still current (or later), else an empty one.
pub fn current(state: Option<WindowState>, now_ms: u64, params: &BucketParams) -> WindowState {
    let start_ms = window_start(now_ms, window_ms(params));
    match state {
        Some(s) if s.start_ms >= start_ms => s,
        _ => WindowState { start_ms, count: 0 },
    }
}

pub(super) fn fits(state: &WindowState, demand: &Demand) -> bool {
    demand.refund || state.count as f64 + need(demand) <= demand.params.requests_per_unit as f64
}

pub(super) fn settle(
    state: WindowState,
    now_ms: u64,
    demand: &Demand,
    fits: bool,
    take: bool,
) -> (WindowState, Verdict) {
    let limit = demand.params.requests_per_unit;
    let end_ms = state.start_ms.saturating_add(window_ms(&demand.params));
    let count = if demand.refund {
        state.count.saturating_sub(demand.tokens)
    } else if take {
        state.count.saturating_add(demand.tokens)
    } else {
        state.count
    };
    let retry_after_ms = if fits {
        Some(0)
    } else if need(demand) > limit as f64 {
        None
    } else {
        Some(end_ms - now_ms)
    };
    let verdict = Verdict {
        allowed: fits,
        remaining: limit.saturating_sub(count),
        retry_after_ms,
        // From the start of now's second: envoyproxy/ratelimit's whole-second reset.
        until_full_ms: end_ms - (now_ms - now_ms % 1_000),
        granted: if take { demand.tokens } else { 0 },
    };
    (
        WindowState {
            start_ms: state.start_ms,
            count,
        },
        verdict,
    )
}

/// An empty window is no state; a counted one is forgotten when it ends.
pub(super) fn settled_at_ms(state: &WindowState, params: &BucketParams) -> u64 {
    if state.count == 0 {
        0
    } else {
        state.start_ms.saturating_add(window_ms(params))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::{Algorithm, testing};

    /// 5 per minute.
    const FIVE: BucketParams = BucketParams {
        capacity: 5,
        requests_per_unit: 5,
        unit_ms: 60_000,
    };
    /// A minute boundary: 2023-11-14T22:14:00Z.
    const T0: u64 = 1_700_000_040_000;

    fn take(params: BucketParams, tokens: u64) -> Demand {
        testing::take(Algorithm::FixedWindow, params, tokens)
    }

    fn one(now: u64, demand: Demand, state: Option<WindowState>) -> (Verdict, WindowState) {
        testing::decide_one(now, demand, state)
    }

    fn at(start_ms: u64, count: u64) -> Option<WindowState> {
        Some(WindowState { start_ms, count })
    }

    #[test]
    fn windows_align_to_the_unit_on_the_clock() {
        assert_eq!(T0 % 60_000, 0);
        assert_eq!(window_start(T0 + 59_999, 60_000), T0);
        assert_eq!(window_start(T0 + 60_000, 60_000), T0 + 60_000);
        // A day starts at 00:00 UTC: 2023-11-14T00:00:00Z.
        assert_eq!(window_start(T0, 86_400_000), 1_699_920_000_000);
    }

    #[test]
    fn counts_up_to_the_limit_within_a_window_then_resets_at_its_end() {
        let mut state = None;
        for i in 0..5 {
            let (v, s) = one(T0 + 10_000 + i, take(FIVE, 1), state);
            assert!(v.allowed);
            assert_eq!(v.remaining, 4 - i);
            assert_eq!(v.retry_after_ms, Some(0));
            state = Some(s);
        }
        let (v, s) = one(T0 + 59_999, take(FIVE, 1), state);
        assert!(!v.allowed);
        assert_eq!((v.remaining, v.retry_after_ms), (0, Some(1)));
        assert_eq!(s.count, 5, "a rejected hit is not counted");
        // The next window starts empty.
        let (v, s) = one(T0 + 60_000, take(FIVE, 1), Some(s));
        assert!(v.allowed);
        assert_eq!(v.remaining, 4);
        assert_eq!(
            s,
            WindowState {
                start_ms: T0 + 60_000,
                count: 1
            }
        );
    }

    /// envoyproxy/ratelimit: `duration_until_reset = unit - now_s % unit`, whole seconds.
    #[test]
    fn reset_is_the_window_end_in_whole_seconds_as_envoyproxy_reports_it() {
        for (offset_ms, reset_s) in [(0, 60), (1, 60), (999, 60), (1_000, 59), (59_001, 1)] {
            let (v, _) = one(T0 + offset_ms, take(FIVE, 1), None);
            let now_s = (T0 + offset_ms) / 1_000;
            assert_eq!(60 - now_s % 60, reset_s);
            assert_eq!(v.until_full_ms, reset_s * 1_000, "at +{offset_ms} ms");
        }
        // The retry-after is exact to the millisecond.
        let (v, _) = one(T0 + 59_001, take(FIVE, 6), None);
        assert_eq!(v.retry_after_ms, None, "6 hits never fit a limit of 5");
        let (v, _) = one(T0 + 59_001, take(FIVE, 1), at(T0, 5));
        assert_eq!(v.retry_after_ms, Some(999));
    }

    #[test]
    fn weighted_hits_check_only_and_refunds() {
        let (v, s) = one(T0, take(FIVE, 3), None);
        assert!(v.allowed && v.remaining == 2);
        let (v, s) = one(T0 + 1, take(FIVE, 3), Some(s));
        assert!(!v.allowed);
        assert_eq!(
            (v.remaining, s.count),
            (2, 3),
            "nothing taken, what is left reported"
        );
        // Check-only: allowed while one more hit fits, counts nothing.
        let (v, s) = one(T0 + 2, take(FIVE, 0), Some(s));
        assert!(v.allowed && s.count == 3);
        let (v, _) = one(T0 + 2, take(FIVE, 0), at(T0, 5));
        assert!(!v.allowed && v.retry_after_ms == Some(59_998));
        // Refunds lower the count, never below zero.
        let mut refund = take(FIVE, 2);
        refund.refund = true;
        let (v, s) = one(T0 + 3, refund, Some(s));
        assert!(v.allowed && s.count == 1 && v.remaining == 4);
        refund.tokens = u64::MAX;
        let (_, s) = one(T0 + 4, refund, Some(s));
        assert_eq!(s.count, 0);
        assert_eq!(settled_at_ms(&s, &FIVE), 0, "an empty window is no state");
        // A refund in a later window does not touch the old count.
        let (_, s) = one(T0 + 60_000, refund, at(T0, 4));
        assert_eq!((s.start_ms, s.count), (T0 + 60_000, 0));
    }

    #[test]
    fn a_clock_stepping_back_does_not_open_another_window() {
        let (_, s) = one(T0 + 60_000, take(FIVE, 5), None);
        // One second back, into the previous window: still the later window, still full.
        let (v, s) = one(T0 + 59_000, take(FIVE, 1), Some(s));
        assert!(!v.allowed);
        assert_eq!(s.start_ms, T0 + 60_000);
        assert_eq!(v.retry_after_ms, Some(61_000));
        assert_eq!(v.until_full_ms, 61_000);
    }

    #[test]
    fn huge_demands_and_limits_do_not_overflow() {
        let (v, s) = one(u64::MAX, take(FIVE, u64::MAX), at(u64::MAX - 5, 5));
        assert!(!v.allowed && v.retry_after_ms.is_none() && s.count == 5);
        let widest = BucketParams {
            capacity: u64::MAX,
            requests_per_unit: u64::MAX,
            unit_ms: u64::MAX,
        };
        let (v, _) = one(T0, take(widest, 1), None);
        assert!(v.allowed);
        assert_eq!(v.remaining, u64::MAX - 1);
    }

    fn any_params() -> impl Strategy<Value = BucketParams> {
        (
            1u64..=50,
            prop::sample::select(vec![1_000u64, 60_000, 3_600_000]),
        )
            .prop_map(|(limit, unit_ms)| BucketParams {
                capacity: limit,
                requests_per_unit: limit,
                unit_ms,
            })
    }

    proptest! {
        /// Any span of one window length holds at most two windows' worth of admitted hits (the
        /// boundary effect), and any aligned window at most one — always-charged hits that did
        /// not fit, counted past the limit, included among the takes.
        #[test]
        fn at_most_twice_the_limit_over_any_window_length(
            p in any_params(),
            steps in prop::collection::vec((0u64..2_500, 0u64..4, any::<bool>()), 1..150),
        ) {
            let mut now = T0 - 7;
            let mut state = None;
            let mut grants = Vec::new();
            for (dt, hits, always) in steps {
                now += dt * p.unit_ms / 1_000;
                let (v, s) = one(now, Demand { always, ..take(p, hits) }, state);
                state = Some(s);
                if v.allowed {
                    grants.push((now, hits));
                }
            }
            for (i, &(t0, _)) in grants.iter().enumerate() {
                let span: u64 = grants[i..]
                    .iter()
                    .take_while(|(t, _)| *t < t0 + p.unit_ms)
                    .map(|(_, h)| h)
                    .sum();
                prop_assert!(span <= 2 * p.requests_per_unit, "{span} in a window length from {t0}");
            }
            let mut per_window = std::collections::HashMap::new();
            for &(t, h) in &grants {
                *per_window.entry(window_start(t, p.unit_ms)).or_insert(0) += h;
            }
            for (start, count) in per_window {
                prop_assert!(count <= p.requests_per_unit, "{count} in the window at {start}");
            }
        }

        /// `remaining` hits are allowed right now and one more is not; a rejected demand
        /// that can fit is allowed after exactly `retry_after_ms` (also when it was
        /// always-charged and counted past the limit).
        #[test]
        fn remaining_and_retry_after_are_exact(
            p in any_params(),
            count in 0u64..=50,
            offset in 0u64..3_600_000,
            hits in 0u64..60,
            always in any::<bool>(),
        ) {
            let now = T0 + offset;
            let state = Some(WindowState { start_ms: window_start(now, p.unit_ms), count: count.min(p.requests_per_unit) });
            let (v, s) = one(now, Demand { always, ..take(p, hits) }, state);
            if v.remaining > 0 {
                prop_assert!(one(now, take(p, v.remaining), Some(s)).0.allowed);
            }
            prop_assert!(!one(now, take(p, v.remaining + 1), Some(s)).0.allowed);
            if !v.allowed {
                match v.retry_after_ms {
                    None => prop_assert!(hits > p.requests_per_unit),
                    Some(wait) => {
                        prop_assert!(one(now + wait, take(p, hits), Some(s)).0.allowed);
                        prop_assert!(!one(now + wait - 1, take(p, hits), Some(s)).0.allowed);
                    }
                }
            }
        }
    }
}
