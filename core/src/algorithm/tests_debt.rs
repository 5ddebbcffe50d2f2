//! Always-charged takes (`charge: always`): counted whatever the answer, into debt that refill
//! repays, for every algorithm.

use proptest::prelude::*;

use super::testing::{charge, take};
use super::*;

/// 100 per minute: one hit per 600 ms, 100 at once.
const HUNDRED: BucketParams = BucketParams {
    capacity: 100,
    requests_per_unit: 100,
    unit_ms: 60_000,
};
/// A minute boundary, so the windows start here.
const T0: u64 = 1_700_000_040_000;

/// Decides `demands` over one state each, starting from `states`; the verdicts.
fn run(now: u64, demands: &[Demand], states: &mut [Option<State>]) -> Vec<Verdict> {
    decide(now, demands, states)
}

/// Two charges of 60 on one key of `algorithm` at `T0`: the first fits, the second does not and
/// is counted anyway. The state left.
fn in_debt(algorithm: Algorithm) -> (Verdict, Verdict, Option<State>) {
    let mut states = [None];
    let first = run(T0, &[charge(algorithm, HUNDRED, 60)], &mut states)[0];
    let second = run(T0, &[charge(algorithm, HUNDRED, 60)], &mut states)[0];
    (first, second, states[0])
}

#[test]
fn token_bucket_goes_negative_and_refill_repays_it() {
    let (first, second, state) = in_debt(Algorithm::TokenBucket);
    assert!(first.allowed);
    assert_eq!((first.remaining, first.granted), (40, 60));
    // Did not fit: answered over the limit, and taken all the same.
    assert!(!second.allowed);
    assert_eq!(second.granted, 60);
    assert_eq!(second.remaining, 0);
    // 60 needed from -20: 80 tokens at one per 600 ms; full again after 120 tokens.
    assert_eq!(second.retry_after_ms, Some(48_000));
    assert_eq!(second.until_full_ms, 72_000);
    assert_eq!(
        state,
        Some(State::TokenBucket(BucketState {
            tokens: -20.0,
            updated_ms: T0
        }))
    );
    let settled = state.unwrap().settled_at_ms(&HUNDRED);
    assert_eq!(
        settled,
        T0 + 72_000,
        "the key lives until the debt is repaid"
    );
}

#[test]
fn a_window_counts_past_its_limit_until_it_ends() {
    let (_, second, state) = in_debt(Algorithm::FixedWindow);
    assert!(!second.allowed);
    assert_eq!((second.remaining, second.granted), (0, 60));
    assert_eq!(second.retry_after_ms, Some(60_000));
    assert_eq!(
        state,
        Some(State::FixedWindow(WindowState {
            start_ms: T0,
            count: 120
        }))
    );
    assert_eq!(state.unwrap().settled_at_ms(&HUNDRED), T0 + 60_000);
    let mut states = [state];
    let check = run(
        T0 + 59_999,
        &[take(Algorithm::FixedWindow, HUNDRED, 0)],
        &mut states,
    )[0];
    assert!(!check.allowed);
    let check = run(
        T0 + 60_000,
        &[take(Algorithm::FixedWindow, HUNDRED, 0)],
        &mut states,
    )[0];
    assert!(check.allowed && check.remaining == 100);
}

#[test]
fn a_sliding_windows_excess_weighs_on_the_next_window() {
    let (_, second, state) = in_debt(Algorithm::SlidingWindow);
    assert!(!second.allowed);
    assert_eq!((second.remaining, second.granted), (0, 60));
    // One more hit fits once 120 × (1 - e/W) + 1 <= 100: e = 10,500 ms into the next window.
    let mut states = [state];
    let check = run(
        T0,
        &[take(Algorithm::SlidingWindow, HUNDRED, 0)],
        &mut states,
    )[0];
    assert_eq!(check.retry_after_ms, Some(70_500));
    let at = |t: u64, states: &mut [Option<State>]| {
        run(t, &[take(Algorithm::SlidingWindow, HUNDRED, 0)], states)[0].allowed
    };
    assert!(!at(T0 + 70_499, &mut states));
    assert!(at(T0 + 70_500, &mut states));
    assert_eq!(state.unwrap().settled_at_ms(&HUNDRED), T0 + 120_000);
}

#[test]
fn gcra_arrival_time_passes_the_burst() {
    let (first, second, state) = in_debt(Algorithm::Gcra);
    assert!(first.allowed && first.remaining == 40);
    assert!(!second.allowed);
    assert_eq!((second.remaining, second.granted), (0, 60));
    // 120 hits of 600 ms: the arrival time is 72 s ahead, 12 s past the 60 s tolerance.
    assert_eq!(second.until_full_ms, 72_000);
    assert_eq!(state.unwrap().settled_at_ms(&HUNDRED), T0 + 72_000);
    assert_eq!(second.retry_after_ms, Some(48_000));
}

/// In debt, a check-only demand (0 hits, which needs 1) is refused until refill has repaid the
/// debt and one hit more, and `retry_after` says exactly when.
#[test]
fn check_only_is_refused_in_debt_until_repaid() {
    // Token bucket and GCRA repay continuously (21 hits of 600 ms); the fixed window at its end;
    // the sliding window as the excess ages out.
    let expected = [
        (Algorithm::TokenBucket, 12_600),
        (Algorithm::FixedWindow, 60_000),
        (Algorithm::SlidingWindow, 70_500),
        (Algorithm::Gcra, 12_600),
    ];
    for (algorithm, wait) in expected {
        let (_, _, state) = in_debt(algorithm);
        let check = |t: u64| {
            let mut states = [state];
            run(t, &[take(algorithm, HUNDRED, 0)], &mut states)[0]
        };
        let now = check(T0);
        assert!(!now.allowed, "{algorithm}");
        assert_eq!(now.remaining, 0, "{algorithm}");
        assert_eq!(now.retry_after_ms, Some(wait), "{algorithm}");
        assert!(!check(T0 + wait - 1).allowed, "{algorithm}: one ms early");
        assert!(check(T0 + wait).allowed, "{algorithm}: on time");
    }
}

/// A request refused by one descriptor still charges its always-charged demands, and its
/// ordinary ones take nothing.
#[test]
fn a_refused_request_charges_only_its_always_demands() {
    for algorithm in Algorithm::ALL {
        let small = BucketParams {
            capacity: 2,
            requests_per_unit: 2,
            unit_ms: 60_000,
        };
        let demands = [
            take(algorithm, small, 3),
            charge(algorithm, HUNDRED, 5),
            take(algorithm, HUNDRED, 5),
        ];
        let mut states = vec![None; 3];
        let verdicts = run(T0, &demands, &mut states);
        assert!(!allows(
            demands.iter().zip(verdicts.iter().map(|v| v.allowed))
        ));
        assert_eq!(
            verdicts.iter().map(|v| v.granted).collect::<Vec<_>>(),
            [0, 5, 0],
            "{algorithm}"
        );
        let left: Vec<u64> = [small, HUNDRED, HUNDRED]
            .iter()
            .zip(&mut states)
            .map(|(p, s)| {
                let mut one = [*s];
                run(T0, &[take(algorithm, *p, 0)], &mut one)[0].remaining
            })
            .collect();
        assert_eq!(left, [2, 95, 100], "{algorithm}");
    }
}

/// A peek shows the debt: the stored level, not one clamped to empty.
#[test]
fn a_peek_shows_the_debt() {
    let (_, _, state) = in_debt(Algorithm::TokenBucket);
    let seen = peek(T0 + 600, Algorithm::TokenBucket, HUNDRED, state);
    assert_eq!(
        seen.level(&HUNDRED, T0 + 600),
        Level::TokenBucket {
            tokens: -19.0,
            capacity: 100,
            refill_per_second: 100.0 / 60.0
        }
    );
    assert_eq!(seen.verdict.remaining, 0);
    let (_, _, state) = in_debt(Algorithm::FixedWindow);
    let seen = peek(T0, Algorithm::FixedWindow, HUNDRED, state);
    assert!(matches!(
        seen.level(&HUNDRED, T0),
        Level::FixedWindow {
            count: 120,
            limit: 100,
            ..
        }
    ));
    let (_, _, state) = in_debt(Algorithm::Gcra);
    let seen = peek(T0, Algorithm::Gcra, HUNDRED, state);
    assert!(matches!(
        seen.level(&HUNDRED, T0),
        Level::Gcra { arrival_in_ms, hits_left: 0, .. } if arrival_in_ms == 72_000.0
    ));
}

/// The biggest debt stays finite: a charge of `u64::MAX` hits leaves a finite state and answers.
#[test]
fn a_huge_charge_stays_finite() {
    for algorithm in Algorithm::ALL {
        let mut states = [None];
        let v = run(T0, &[charge(algorithm, HUNDRED, u64::MAX)], &mut states)[0];
        assert!(!v.allowed, "{algorithm}");
        assert_eq!(v.retry_after_ms, None, "{algorithm}: never fits");
        let state = states[0].expect("decide stores every state");
        assert!(state.settled_at_ms(&HUNDRED) > T0, "{algorithm}");
        if let State::TokenBucket(s) = state {
            assert!(s.tokens.is_finite());
        }
    }
}

/// A client that sends one request at a time: a check-only call, then, if it passed, the charge
/// of what the request turned out to cost (after `busy` ms). Admitted cost over any span from one
/// admitted check to another is at most `C + r·T` plus one charge.
fn one_at_a_time_stays_within_the_bound(
    algorithm: Algorithm,
    p: BucketParams,
    steps: &[(u64, u64, u64)],
) -> Result<(), TestCaseError> {
    let mut now = T0 + 7;
    let mut states = [None];
    let mut admitted = Vec::new();
    let mut largest = 0;
    for &(idle, busy, cost) in steps {
        now += idle;
        let check = run(now, &[take(algorithm, p, 0)], &mut states)[0];
        if !check.allowed {
            continue;
        }
        admitted.push((now, cost));
        largest = largest.max(cost);
        now += busy;
        run(now, &[charge(algorithm, p, cost)], &mut states);
    }
    for i in 0..admitted.len() {
        let mut total = 0;
        for &(t, cost) in &admitted[i..] {
            total += cost;
            let span = (t - admitted[i].0) as f64;
            // GCRA's tolerance allows its rounding slack (at most 1 ms of refill) on top.
            let bound = p.capacity as f64 + p.tokens_over(span + 1.0) + largest as f64;
            prop_assert!(total as f64 <= bound, "{algorithm}: {total} > {bound}");
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn response_priced_clients_stay_within_the_bound(
        capacity in 1u64..=200,
        per_minute in 1u64..=600,
        steps in prop::collection::vec((0u64..20_000, 0u64..5_000, 0u64..300), 1..80),
    ) {
        let p = BucketParams { capacity, requests_per_unit: per_minute, unit_ms: 60_000 };
        for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
            one_at_a_time_stays_within_the_bound(algorithm, p, &steps)?;
        }
    }

    /// Whatever the demands, always-charged ones are taken in full and ordinary ones only when
    /// the request is allowed and they fit, for every algorithm.
    #[test]
    fn always_demands_are_taken_whatever_the_answer(
        algorithm in prop::sample::select(Algorithm::ALL.to_vec()),
        demands in prop::collection::vec((0u64..150, any::<bool>(), any::<bool>()), 1..5),
        fill in 0u64..150,
    ) {
        let demands: Vec<Demand> = demands
            .iter()
            .map(|&(tokens, always, shadow)| Demand {
                always,
                shadow,
                ..take(algorithm, HUNDRED, tokens)
            })
            .collect();
        let mut states: Vec<Option<State>> = vec![None; demands.len()];
        for state in &mut states {
            let mut one = [None];
            run(T0, &[charge(algorithm, HUNDRED, fill)], &mut one);
            *state = one[0];
        }
        let verdicts = run(T0, &demands, &mut states);
        let allowed = allows(demands.iter().zip(verdicts.iter().map(|v| v.allowed)));
        for (d, v) in demands.iter().zip(&verdicts) {
            let expected = if d.always || (allowed && v.allowed) { d.tokens } else { 0 };
            prop_assert_eq!(v.granted, expected, "{:?} {:?}", d, v);
        }
    }
}
