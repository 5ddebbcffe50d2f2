use super::*;

const P: BucketParams = BucketParams {
    capacity: 2,
    requests_per_unit: 2,
    unit_ms: 1_000,
};

fn demand(algorithm: Algorithm, tokens: u64) -> Demand {
    Demand::take(algorithm, P, tokens)
}

#[test]
fn names_parse_in_any_case_and_tags_are_distinct() {
    for a in Algorithm::ALL {
        assert_eq!(Algorithm::parse(a.as_str()), Some(a));
        assert_eq!(Algorithm::parse(&a.as_str().to_uppercase()), Some(a));
        assert_eq!(
            serde_json::to_value(a).unwrap(),
            serde_json::json!(a.as_str())
        );
    }
    assert_eq!(Algorithm::parse("leaky_bucket"), None);
    assert_eq!(Algorithm::default(), Algorithm::TokenBucket);
    let tags: Vec<_> = Algorithm::ALL.iter().map(|a| a.key_tag()).collect();
    assert_eq!(tags, [None, Some("fw"), Some("sw"), Some("gcra")]);
    let codes: Vec<_> = Algorithm::ALL.iter().map(|a| a.wire_code()).collect();
    assert_eq!(codes, [1, 2, 3, 4]);
}

/// One request over one key of each algorithm: one short key rejects the request and
/// nothing is counted anywhere; then every key pays.
#[test]
fn a_request_is_all_or_nothing_across_algorithms() {
    let now = 1_700_000_000_000;
    let mut states = vec![None; 4];
    let mut demands: Vec<Demand> = Algorithm::ALL.iter().map(|&a| demand(a, 1)).collect();
    demands[2].tokens = 3; // more than the sliding window's 2
    let verdicts = decide(now, &demands, &mut states);
    assert_eq!(
        verdicts.iter().map(|v| v.allowed).collect::<Vec<_>>(),
        [true, true, false, true]
    );
    assert_eq!(verdicts[2].retry_after_ms, None);
    // Nothing was counted: every key still has its whole limit.
    let checks: Vec<Demand> = Algorithm::ALL.iter().map(|&a| demand(a, 0)).collect();
    let verdicts = decide(now, &checks, &mut states);
    assert!(verdicts.iter().all(|v| v.allowed && v.remaining == 2));

    demands[2].tokens = 1;
    let verdicts = decide(now, &demands, &mut states);
    assert!(verdicts.iter().all(|v| v.allowed && v.remaining == 1));
}

fn quota(algorithm: Algorithm, tokens: u64) -> Demand {
    Demand {
        quota: true,
        ..demand(algorithm, tokens)
    }
}

/// Checks every key of `states` without counting: what each has left.
fn left(now: u64, demands: &[Demand], states: &mut [Option<State>]) -> Vec<u64> {
    let checks: Vec<Demand> = demands
        .iter()
        .map(|d| Demand {
            tokens: 0,
            quota: false,
            shadow: false,
            ..*d
        })
        .collect();
    decide(now, &checks, states)
        .iter()
        .map(|v| v.remaining)
        .collect()
}

/// Quota demands that all fit are all taken, with the ordinary ones.
#[test]
fn quota_demands_that_fit_are_all_taken() {
    for a in Algorithm::ALL {
        let now = 1_700_000_000_000;
        let demands = [demand(a, 1), quota(a, 1), quota(a, 2)];
        let mut states = vec![None; 3];
        let verdicts = decide(now, &demands, &mut states);
        assert!(verdicts.iter().all(|v| v.allowed), "{a}: {verdicts:?}");
        assert_eq!(
            verdicts.iter().map(|v| v.granted).collect::<Vec<_>>(),
            [1, 1, 2],
            "{a}"
        );
        assert_eq!(left(now, &demands, &mut states), [1, 1, 0], "{a}");
    }
}

/// One of two quota demands over its limit: the request is allowed, the other quota key and
/// the ordinary key pay, the one over takes nothing and reports itself over.
#[test]
fn one_quota_demand_fitting_is_enough() {
    for a in Algorithm::ALL {
        let now = 1_700_000_000_000;
        let demands = [demand(a, 1), quota(a, 3), quota(a, 1)];
        let mut states = vec![None; 3];
        assert!(allows(demands.iter().zip([true, false, true])));
        let verdicts = decide(now, &demands, &mut states);
        assert_eq!(
            verdicts
                .iter()
                .map(|v| (v.allowed, v.granted))
                .collect::<Vec<_>>(),
            [(true, 1), (false, 0), (true, 1)],
            "{a}"
        );
        assert_eq!(verdicts[1].retry_after_ms, None, "{a}: 3 never fits in 2");
        assert_eq!(left(now, &demands, &mut states), [1, 2, 1], "{a}");
    }
}

/// Every quota demand over its limit rejects the request: nothing is taken anywhere.
#[test]
fn every_quota_demand_over_rejects_and_takes_nothing() {
    for a in Algorithm::ALL {
        let now = 1_700_000_000_000;
        let demands = [demand(a, 1), quota(a, 3), quota(a, 5)];
        let mut states = vec![None; 3];
        let verdicts = decide(now, &demands, &mut states);
        assert_eq!(
            verdicts
                .iter()
                .map(|v| (v.allowed, v.granted))
                .collect::<Vec<_>>(),
            [(true, 0), (false, 0), (false, 0)],
            "{a}"
        );
        assert_eq!(left(now, &demands, &mut states), [2, 2, 2], "{a}");
    }
}

/// An ordinary demand over its limit rejects the request whatever the quota demands say.
#[test]
fn an_ordinary_demand_over_rejects_despite_quota_demands() {
    for a in Algorithm::ALL {
        let now = 1_700_000_000_000;
        let demands = [demand(a, 3), quota(a, 1), quota(a, 1)];
        let mut states = vec![None; 3];
        let verdicts = decide(now, &demands, &mut states);
        assert_eq!(
            verdicts
                .iter()
                .map(|v| (v.allowed, v.granted))
                .collect::<Vec<_>>(),
            [(false, 0), (true, 0), (true, 0)],
            "{a}"
        );
        assert_eq!(left(now, &demands, &mut states), [2, 2, 2], "{a}");
    }
}

/// A shadow quota demand passes whatever it holds (its status never says over limit), so
/// beside it a quota demand over its limit does not reject; it still takes only if it fits.
#[test]
fn a_shadow_quota_demand_passes_the_quota_group() {
    let now = 1_700_000_000_000;
    let a = Algorithm::TokenBucket;
    let shadow_over = Demand {
        shadow: true,
        ..quota(a, 3)
    };
    let demands = [shadow_over, quota(a, 3)];
    let mut states = vec![None; 2];
    let verdicts = decide(now, &demands, &mut states);
    assert_eq!(
        verdicts
            .iter()
            .map(|v| (v.allowed, v.granted))
            .collect::<Vec<_>>(),
        [(false, 0), (false, 0)]
    );
    assert!(allows(demands.iter().zip([false, false])));
    // Without the shadow one, the same quota demand alone rejects.
    assert!(!allows([(&demands[1], false)]));
    assert!(allows([]), "a request without demands is allowed");
}

#[test]
fn a_state_of_another_algorithm_reads_as_none() {
    let now = 5_000;
    let mut states = [Some(State::TokenBucket(BucketState {
        tokens: 0.0,
        updated_ms: now,
    }))];
    let v = decide(now, &[demand(Algorithm::FixedWindow, 1)], &mut states);
    assert!(v[0].allowed);
    assert_eq!(v[0].remaining, 1);
    assert!(matches!(states[0], Some(State::FixedWindow(_))));
}

#[test]
fn searches_find_the_exact_boundary() {
    for target in [1.0, 2.0, 7.0, 1_000.0] {
        for guess in [
            target - 3.0,
            target - 1.0,
            target,
            target + 2.0,
            target + 4.0,
        ] {
            assert_eq!(first_fit(guess, |d| d >= target), target, "guess {guess}");
        }
    }
    assert_eq!(first_fit(-5.0, |_| true), 1.0);
    assert_eq!(first_fit(f64::NAN, |d| d >= 3.0), 3.0);
    for most in [0.0, 1.0, 5.0, 10.0] {
        for guess in [most - 2.0, most, most + 3.0] {
            assert_eq!(
                most_that_fit(guess, 10.0, |n| n <= most),
                most,
                "guess {guess}"
            );
        }
    }
    assert_eq!(most_that_fit(f64::NAN, 10.0, |n| n <= 2.0), 2.0);
    assert_eq!(most_that_fit(99.0, 10.0, |_| true), 10.0);
}
