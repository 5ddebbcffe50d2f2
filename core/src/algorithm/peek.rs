//! Reading a key without counting: the state the next decision would start from, and the answer a
//! check-only hit would get, computed by [`decide`](super::decide)'s own two phases (a demand of
//! zero hits that takes nothing) and written nowhere. `lua/limit.lua`'s peek mode runs the same
//! phases; [`Level`] states either result in the rule's terms.

use serde::Serialize;

use super::{Algorithm, BucketParams, Demand, State, Verdict, refresh, settle, sliding_window};

/// A key read at some `now` without counting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Peek {
    /// The state brought to now: refilled, windows rolled, the arrival time as stored.
    pub state: State,
    /// A check-only hit's verdict: `remaining` hits would be allowed now, `until_full_ms` until
    /// the limit resets (what Envoy would be told), `retry_after_ms` until one more hit fits.
    pub verdict: Verdict,
}

/// `state` (`None`: nothing stored) as the decision path reads it at `now_ms`; nothing is counted
/// and the caller stores nothing.
pub fn peek(now_ms: u64, algorithm: Algorithm, params: BucketParams, state: Option<State>) -> Peek {
    let demand = Demand::take(algorithm, params, 0);
    let (current, fits) = refresh(state, now_ms, &demand);
    let (state, verdict) = settle(current, now_ms, &demand, fits, false);
    Peek { state, verdict }
}

/// A key's state in its rule's terms. Times ending in `_ms` are on the deciding clock (Redis
/// `TIME` or the memory backend's, both Unix epoch ms); `_in_ms` ones are from the peek's now.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "algorithm", rename_all = "snake_case")]
pub enum Level {
    TokenBucket {
        /// Tokens in the bucket now (fractional: the refill is exact).
        tokens: f64,
        capacity: u64,
        refill_per_second: f64,
    },
    FixedWindow {
        /// Hits counted in the current window.
        count: u64,
        limit: u64,
        window_start_ms: u64,
        window_end_ms: u64,
        window_ends_in_ms: u64,
    },
    SlidingWindow {
        /// Hits counted in the current window, and in the one before it.
        count: u64,
        previous_count: u64,
        /// The weighted count the next hit is judged against.
        estimated: f64,
        limit: u64,
        window_start_ms: u64,
        window_end_ms: u64,
        window_ends_in_ms: u64,
    },
    Gcra {
        /// The theoretical arrival time: never earlier than now (a TAT in the past reads as now).
        theoretical_arrival_ms: f64,
        /// How far the TAT is ahead of now.
        arrival_in_ms: f64,
        /// Hits that would be allowed at once now.
        hits_left: u64,
        burst: u64,
        emission_interval_ms: f64,
    },
    InFlight {
        /// Slots held (not expired).
        held: u64,
        max: u64,
        /// Until the slot that frees first, and the last one, expire (0: none held).
        next_expiry_in_ms: u64,
        last_expiry_in_ms: u64,
    },
    /// A holder's reservation ledger key ([`super::reservation`]).
    Reservation {
        /// Hits reserved and not settled (0: none).
        reserved: u64,
        /// Until the reservation lapses unsettled.
        lapses_in_ms: u64,
    },
}

impl Peek {
    /// The state in the rule's terms, for a key of shape `params` peeked at `now_ms`.
    pub fn level(&self, params: &BucketParams, now_ms: u64) -> Level {
        let window = params.unit_ms.max(1);
        match self.state {
            State::TokenBucket(s) => Level::TokenBucket {
                tokens: s.tokens,
                capacity: params.capacity,
                refill_per_second: params.tokens_over(1_000.0),
            },
            State::FixedWindow(s) => Level::FixedWindow {
                count: s.count,
                limit: params.requests_per_unit,
                window_start_ms: s.start_ms,
                window_end_ms: s.start_ms.saturating_add(window),
                window_ends_in_ms: s.start_ms.saturating_add(window).saturating_sub(now_ms),
            },
            State::SlidingWindow(s) => Level::SlidingWindow {
                count: s.current,
                previous_count: s.previous,
                estimated: sliding_window::estimate(&s, now_ms, params),
                limit: params.requests_per_unit,
                window_start_ms: s.start_ms,
                window_end_ms: s.start_ms.saturating_add(window),
                window_ends_in_ms: s.start_ms.saturating_add(window).saturating_sub(now_ms),
            },
            State::Gcra(s) => {
                let tat = s.tat_ms + s.tat_frac;
                Level::Gcra {
                    theoretical_arrival_ms: tat,
                    arrival_in_ms: (tat - now_ms as f64).max(0.0),
                    hits_left: self.verdict.remaining,
                    burst: params.capacity,
                    emission_interval_ms: window as f64 / params.requests_per_unit.max(1) as f64,
                }
            }
            State::InFlight(s) => Level::InFlight {
                held: s.live,
                max: params.capacity,
                next_expiry_in_ms: s.first_expiry_ms.saturating_sub(now_ms),
                last_expiry_in_ms: s.last_expiry_ms.saturating_sub(now_ms),
            },
            State::Reserved(r) => Level::Reservation {
                reserved: r.live(now_ms),
                lapses_in_ms: r.expires_ms.saturating_sub(now_ms),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::testing::take;
    use crate::algorithm::{BucketState, GcraState, SlidingState, WindowState, decide};

    const NOW: u64 = 1_700_000_000_500;

    fn params(capacity: u64, per_unit: u64, unit_ms: u64) -> BucketParams {
        BucketParams {
            capacity,
            requests_per_unit: per_unit,
            unit_ms,
        }
    }

    /// Spends `hits` one at a time at `NOW` from no state; the state left.
    fn spent(algorithm: Algorithm, p: BucketParams, hits: u64) -> Option<State> {
        let mut states = [None];
        for _ in 0..hits {
            decide(NOW, &[take(algorithm, p, 1)], &mut states);
        }
        states[0]
    }

    /// A peek answers what a check-only decision answers, and leaves nothing changed: peeking
    /// twice reads the same, and the next take is decided as if no peek had happened.
    #[test]
    fn a_peek_is_a_check_that_counts_nothing() {
        for algorithm in Algorithm::ALL {
            let p = params(10, 10, 60_000);
            let stored = spent(algorithm, p, 3);
            let later = NOW + 1_500;
            let first = peek(later, algorithm, p, stored);
            assert_eq!(first, peek(later, algorithm, p, stored), "{algorithm}");
            let mut states = [stored];
            let check = decide(later, &[take(algorithm, p, 0)], &mut states);
            assert_eq!(first.verdict, check[0], "{algorithm}");
            assert_eq!(
                Some(first.state),
                states[0],
                "{algorithm}: the check stored the same"
            );
            assert_eq!(first.verdict.remaining, 7, "{algorithm}");
        }
    }

    #[test]
    fn a_token_bucket_level_is_tokens_of_its_capacity() {
        let p = params(10, 5, 1_000);
        let bucket = peek(
            NOW,
            Algorithm::TokenBucket,
            p,
            spent(Algorithm::TokenBucket, p, 4),
        );
        assert_eq!(
            bucket.level(&p, NOW),
            Level::TokenBucket {
                tokens: 6.0,
                capacity: 10,
                refill_per_second: 5.0
            }
        );
        assert_eq!(bucket.verdict.until_full_ms, 800);
        // 300 ms later, 1.5 tokens have come back.
        let refilled = peek(NOW + 300, Algorithm::TokenBucket, p, Some(bucket.state));
        assert_eq!(
            refilled.state,
            State::TokenBucket(BucketState {
                tokens: 7.5,
                updated_ms: NOW + 300
            })
        );
        assert_eq!(refilled.verdict.remaining, 7);
    }

    #[test]
    fn window_levels_are_counts_in_their_windows() {
        let w = params(10, 10, 60_000);
        let start = NOW - NOW % 60_000;
        let fixed = peek(
            NOW,
            Algorithm::FixedWindow,
            w,
            Some(State::FixedWindow(WindowState {
                start_ms: start,
                count: 4,
            })),
        );
        assert_eq!(
            fixed.level(&w, NOW),
            Level::FixedWindow {
                count: 4,
                limit: 10,
                window_start_ms: start,
                window_end_ms: start + 60_000,
                window_ends_in_ms: start + 60_000 - NOW,
            }
        );
        // A count of an earlier window reads as an empty one.
        let stale = peek(start + 60_000, Algorithm::FixedWindow, w, Some(fixed.state));
        assert_eq!(stale.verdict.remaining, 10);

        let sliding = peek(
            start + 30_000,
            Algorithm::SlidingWindow,
            w,
            Some(State::SlidingWindow(SlidingState {
                start_ms: start - 60_000,
                current: 6,
                previous: 0,
            })),
        );
        let Level::SlidingWindow {
            count,
            previous_count,
            estimated,
            ..
        } = sliding.level(&w, start + 30_000)
        else {
            panic!("{sliding:?}");
        };
        assert_eq!((count, previous_count, estimated), (0, 6, 3.0));
        assert_eq!(sliding.verdict.remaining, 7);
    }

    #[test]
    fn a_gcra_level_is_its_theoretical_arrival() {
        let g = params(4, 10, 1_000);
        let gcra = peek(
            NOW,
            Algorithm::Gcra,
            g,
            Some(State::Gcra(GcraState {
                tat_ms: (NOW + 250) as f64,
                tat_frac: 0.0,
            })),
        );
        assert_eq!(
            gcra.level(&g, NOW),
            Level::Gcra {
                theoretical_arrival_ms: (NOW + 250) as f64,
                arrival_in_ms: 250.0,
                hits_left: 1,
                burst: 4,
                emission_interval_ms: 100.0,
            }
        );
    }

    #[test]
    fn nothing_stored_reads_as_a_fresh_key() {
        for algorithm in Algorithm::ALL {
            let p = params(3, 3, 1_000);
            let fresh = peek(NOW, algorithm, p, None);
            assert_eq!(fresh.verdict.remaining, 3, "{algorithm}");
            assert!(fresh.verdict.allowed, "{algorithm}");
        }
        let level =
            peek(NOW, Algorithm::Gcra, params(3, 3, 1_000), None).level(&params(3, 3, 1_000), NOW);
        let json = serde_json::to_value(level).unwrap();
        assert_eq!(json["algorithm"], "gcra");
        assert_eq!(json["hits_left"], 3);
    }
}
