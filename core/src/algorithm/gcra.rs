//! GCRA, the generic cell rate algorithm: one theoretical arrival time (TAT) per key.
//!
//! The contract shared with `lua/limit.lua` (keep them in step). `T = unit_ms /
//! requests_per_unit` (the emission interval: one request per `T` ms), `B = capacity` (`burst`,
//! else `requests_per_unit`), the tolerance `τ = T × B`, all in doubles:
//! 1. The backlog `D = max(0, TAT - now)`: how far ahead of now the schedule runs. No state (or a
//!    TAT in the past) is `D = 0`: the full burst is available.
//! 2. `need = max(hits, 1)`; a take fits when `need <= B` and `D + need × T <= τ + ε`, where
//!    `ε = min(T / 2^20, 1 ms)` absorbs the rounding of the doubles (so `B` requests at one
//!    instant all fit); taken (`D += hits × T`) only when the whole request is allowed, or
//!    always when always-charged (`charge: always`): then `D` may pass `τ` (debt) and nothing
//!    fits until time has caught up. A refund moves the TAT back by `hits × T`, never before now.
//! 3. A lease take (`lease > 0`) that is taken then takes `extra` more: the most `n <= lease`
//!    with `D + n × T <= τ + ε` (the same search as `remaining`), `D += extra × T`;
//!    `granted = hits + extra`.
//! 4. `remaining` = the most hits `n <= B` with `D_after + n × T <= τ + ε`; `retry_after` = the
//!    first millisecond at which the demand fits (`None` when `need > B`), both found by a short
//!    search from their closed form so they agree with the fit test exactly; `until_full` = until
//!    the TAT has passed (the whole burst is available again).
//!
//! Stored as `HSET key a <TAT, whole ms> f <TAT, fraction of a ms>`: one arrival time, split so
//! that it keeps full precision (a single double holding epoch milliseconds would round every
//! step to 1/4096 ms, and those errors add up over a burst).
//!
//! Spacing: over any span from `t0` to `t1`, at most `B + (t1 - t0 + ε) / T` hits are allowed;
//! after the burst is used, one per `T`. A clock stepping back makes the schedule look further
//! ahead, never behind: it limits more, never less.

use super::{BucketParams, Demand, Verdict, first_fit, most_that_fit, need};

/// The theoretical arrival time, `tat_ms + tat_frac` ms. No state is a TAT in the past.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GcraState {
    /// Whole ms (a whole number, kept as a double as the Lua keeps it).
    pub tat_ms: f64,
    /// Fraction of a ms, in `[0, 1)`.
    pub tat_frac: f64,
}

impl GcraState {
    /// The state whose TAT lies `backlog` ms after `now_ms`.
    fn at(now_ms: u64, backlog: f64) -> GcraState {
        let whole = backlog.floor();
        GcraState {
            tat_ms: now_ms as f64 + whole,
            tat_frac: backlog - whole,
        }
    }
}

/// Emission interval, tolerance and rounding allowance, in ms.
struct Shape {
    interval: f64,
    tolerance: f64,
    slack: f64,
    burst: f64,
}

fn shape(params: &BucketParams) -> Shape {
    let interval = params.unit_ms.max(1) as f64 / params.requests_per_unit.max(1) as f64;
    let burst = params.capacity as f64;
    let mut slack = interval / 1_048_576.0;
    if slack > 1.0 {
        slack = 1.0;
    }
    Shape {
        interval,
        tolerance: interval * burst,
        slack,
        burst,
    }
}

/// `max(0, TAT - now)` in ms.
pub fn backlog(state: Option<GcraState>, now_ms: u64) -> f64 {
    match state {
        None => 0.0,
        Some(s) => {
            let d = (s.tat_ms - now_ms as f64) + s.tat_frac;
            if d < 0.0 { 0.0 } else { d }
        }
    }
}

fn fits_backlog(backlog: f64, needed: f64, s: &Shape) -> bool {
    needed <= s.burst && backlog + needed * s.interval <= s.tolerance + s.slack
}

pub(super) fn fits(backlog: f64, demand: &Demand) -> bool {
    demand.refund || fits_backlog(backlog, need(demand), &shape(&demand.params))
}

pub(super) fn settle(
    backlog: f64,
    now_ms: u64,
    demand: &Demand,
    fits: bool,
    take: bool,
) -> (GcraState, Verdict) {
    let s = shape(&demand.params);
    let hits = demand.tokens as f64;
    let mut after = backlog;
    let mut granted = 0;
    if demand.refund {
        after = backlog - hits * s.interval;
        if after < 0.0 {
            after = 0.0;
        }
    } else if take {
        after = backlog + hits * s.interval;
        let mut extra = 0.0;
        if demand.lease > 0 {
            let room = demand.lease as f64;
            extra = most_that_fit((s.tolerance + s.slack - after) / s.interval, room, |n| {
                after + n * s.interval <= s.tolerance + s.slack
            });
            after += extra * s.interval;
        }
        granted = demand.tokens.saturating_add(extra as u64);
    }
    let state = GcraState::at(now_ms, after);
    let remaining = most_that_fit((s.tolerance + s.slack - after) / s.interval, s.burst, |n| {
        after + n * s.interval <= s.tolerance + s.slack
    });
    let needed = need(demand);
    let retry_after_ms = if fits {
        Some(0)
    } else if needed > s.burst {
        None
    } else {
        let now = now_ms as f64;
        let fits_at = |d: f64| {
            let mut ahead = (state.tat_ms - (now + d)) + state.tat_frac;
            if ahead < 0.0 {
                ahead = 0.0;
            }
            fits_backlog(ahead, needed, &s)
        };
        let guess = (after + needed * s.interval - s.tolerance - s.slack).ceil();
        Some(first_fit(guess, fits_at) as u64)
    };
    let mut until_full = state.tat_ms - now_ms as f64;
    if state.tat_frac > 0.0 {
        until_full += 1.0;
    }
    let verdict = Verdict {
        allowed: fits,
        remaining: remaining as u64,
        retry_after_ms,
        until_full_ms: until_full as u64,
        granted,
    };
    (state, verdict)
}

/// The TAT, rounded up to a whole ms: from then on the whole burst is available.
pub(super) fn settled_at_ms(state: &GcraState) -> u64 {
    let mut at = state.tat_ms;
    if state.tat_frac > 0.0 {
        at += 1.0;
    }
    at as u64
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::algorithm::{Algorithm, testing};

    /// 10 per second (one per 100 ms), burst 3.
    const SPACED: BucketParams = BucketParams {
        capacity: 3,
        requests_per_unit: 10,
        unit_ms: 1_000,
    };
    const T0: u64 = 1_700_000_000_000;

    fn take(params: BucketParams, tokens: u64) -> Demand {
        testing::take(Algorithm::Gcra, params, tokens)
    }

    fn one(now: u64, demand: Demand, state: Option<GcraState>) -> (Verdict, GcraState) {
        testing::decide_one(now, demand, state)
    }

    #[test]
    fn the_burst_then_one_per_interval() {
        let mut state = None;
        for left in [2, 1, 0] {
            let (v, s) = one(T0, take(SPACED, 1), state);
            assert!(v.allowed);
            assert_eq!(v.remaining, left);
            state = Some(s);
        }
        assert_eq!(
            state,
            Some(GcraState {
                tat_ms: (T0 + 300) as f64,
                tat_frac: 0.0
            })
        );
        let (v, _) = one(T0, take(SPACED, 1), state);
        assert!(!v.allowed);
        assert_eq!((v.retry_after_ms, v.until_full_ms), (Some(100), 300));
        assert!(!one(T0 + 99, take(SPACED, 1), state).0.allowed);
        let (v, s) = one(T0 + 100, take(SPACED, 1), state);
        assert!(v.allowed && v.remaining == 0);
        // Evenly spaced from then on.
        let (v, _) = one(T0 + 150, take(SPACED, 1), Some(s));
        assert_eq!(v.retry_after_ms, Some(50));
    }

    #[test]
    fn a_whole_burst_fits_at_one_instant_even_with_a_fractional_interval() {
        // One per 333.33 ms: the TAT is never a whole number of ms.
        for burst in [3u64, 7, 50, 1_000] {
            let p = BucketParams {
                capacity: burst,
                requests_per_unit: 3,
                unit_ms: 1_000,
            };
            let mut state = None;
            for i in 0..burst {
                let (v, s) = one(T0 + 1, take(p, 1), state);
                assert!(v.allowed, "hit {i} of a burst of {burst}");
                assert_eq!(v.remaining, burst - 1 - i);
                state = Some(s);
            }
            assert!(!one(T0 + 1, take(p, 1), state).0.allowed);
            let (v, _) = one(T0 + 1, take(p, burst), None);
            assert!(v.allowed, "the whole burst in one request");
        }
    }

    #[test]
    fn weighted_check_only_refund_and_never() {
        let (v, s) = one(T0, take(SPACED, 2), None);
        assert!(v.allowed && v.remaining == 1);
        let (v, s2) = one(T0, take(SPACED, 2), Some(s));
        assert!(!v.allowed);
        assert_eq!(s2, s, "nothing taken");
        assert_eq!(v.retry_after_ms, Some(100));
        assert_eq!(one(T0, take(SPACED, 4), None).0.retry_after_ms, None);
        // Check-only: needs room for one, takes nothing.
        let (v, s3) = one(T0, take(SPACED, 0), Some(s));
        assert!(v.allowed && s3 == s);
        // A refund moves the TAT back, never before now.
        let mut refund = take(SPACED, 1);
        refund.refund = true;
        let (v, s4) = one(T0 + 50, refund, Some(s));
        assert!(v.allowed);
        assert_eq!(s4.tat_ms, (T0 + 100) as f64);
        refund.tokens = u64::MAX;
        let (v, s5) = one(T0 + 50, refund, Some(s));
        assert_eq!(s5.tat_ms, (T0 + 50) as f64);
        assert_eq!((v.remaining, v.until_full_ms), (3, 0));
        assert_eq!(settled_at_ms(&s5), T0 + 50);
    }

    #[test]
    fn a_clock_stepping_back_limits_more_not_less() {
        let (_, s) = one(T0, take(SPACED, 3), None);
        let (v, _) = one(T0 - 1_000, take(SPACED, 1), Some(s));
        assert!(!v.allowed);
        assert_eq!(v.retry_after_ms, Some(1_100));
    }

    #[test]
    fn huge_demands_and_shapes_do_not_panic() {
        let (v, s) = one(T0, take(SPACED, u64::MAX), None);
        assert!(!v.allowed && v.retry_after_ms.is_none());
        assert_eq!(s.tat_ms, T0 as f64);
        let widest = BucketParams {
            capacity: u64::MAX,
            requests_per_unit: u64::MAX,
            unit_ms: u64::MAX,
        };
        let (v, _) = one(u64::MAX, take(widest, u64::MAX), None);
        assert!(v.allowed);
        let slowest = BucketParams {
            capacity: 1,
            requests_per_unit: 1,
            unit_ms: u64::MAX,
        };
        let (_, s) = one(T0, take(slowest, 1), None);
        let (v, _) = one(T0, take(slowest, 1), Some(s));
        assert!(!v.allowed);
        assert_eq!(
            v.retry_after_ms,
            Some(u64::MAX),
            "saturates rather than wraps"
        );
    }

    fn any_params() -> impl Strategy<Value = BucketParams> {
        (
            1u64..=60,
            1u64..=1_000,
            prop::sample::select(vec![1_000u64, 60_000, 3_600_000]),
        )
            .prop_map(|(capacity, requests_per_unit, unit_ms)| BucketParams {
                capacity,
                requests_per_unit,
                unit_ms,
            })
    }

    proptest! {
        /// From any allowed hit on, at most `B + span / T` hits are allowed over any span.
        #[test]
        fn spacing_holds_after_the_burst(
            p in any_params(),
            steps in prop::collection::vec((0u64..3_000, 0u64..4), 1..120),
        ) {
            let s = shape(&p);
            let mut now = T0 + 11;
            let mut state = None;
            let mut grants = Vec::new();
            for (dt, hits) in steps {
                now += dt;
                let (v, st) = one(now, take(p, hits), state);
                state = Some(st);
                if v.allowed && hits > 0 {
                    grants.push((now, hits));
                }
            }
            for i in 0..grants.len() {
                let mut granted = 0;
                for &(t, h) in &grants[i..] {
                    granted += h;
                    let bound = s.burst + ((t - grants[i].0) as f64 + s.slack) / s.interval;
                    prop_assert!(granted as f64 <= bound + 1e-9, "{granted} > {bound}");
                }
            }
        }

        /// `remaining` hits fit right now and one more does not; a rejected demand that can fit
        /// is allowed after exactly `retry_after_ms`; the whole burst is back after
        /// `until_full_ms` — also after an always-charged demand that did not fit and put the
        /// arrival time past the burst.
        #[test]
        fn remaining_retry_after_and_reset_are_exact(
            p in any_params(),
            ahead in 0.0f64..=1.0,
            offset in 0u64..10_000,
            hits in 0u64..70,
            always in any::<bool>(),
        ) {
            let now = T0 + offset;
            let start = GcraState::at(now, ahead * shape(&p).tolerance);
            let (v, s) = one(now, Demand { always, ..take(p, hits) }, Some(start));
            if v.remaining > 0 {
                prop_assert!(one(now, take(p, v.remaining), Some(s)).0.allowed);
            }
            prop_assert!(!one(now, take(p, v.remaining + 1), Some(s)).0.allowed);
            if !v.allowed {
                match v.retry_after_ms {
                    None => prop_assert!(hits > p.capacity),
                    Some(wait) => {
                        prop_assert!(wait > 0);
                        prop_assert!(one(now + wait, take(p, hits), Some(s)).0.allowed, "wait {wait} too short");
                        prop_assert!(!one(now + wait - 1, take(p, hits), Some(s)).0.allowed, "wait {wait} too long");
                    }
                }
            }
            let later = now + v.until_full_ms;
            prop_assert_eq!(backlog(Some(s), later), 0.0);
            if v.until_full_ms > 0 {
                prop_assert!(backlog(Some(s), later - 1) > 0.0);
            }
            prop_assert_eq!(one(later, take(p, 0), Some(s)).0.remaining, p.capacity);
        }
    }
}
