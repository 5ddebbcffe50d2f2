use super::*;
use crate::clock::ManualClock;

/// The defaults: 10 failed moments and half the window's, a window of 1 s in moments of 15 ms.
const SETTINGS: BreakerSettings = BreakerSettings {
    min_failures: 10,
    failure_permille: 500,
    window: Duration::from_millis(1_000),
    moment: Duration::from_millis(15),
    cooldown: Duration::from_millis(1_000),
};

const OPENED: Option<Transition> = Some(Transition {
    from: BreakerState::Closed,
    to: BreakerState::Open,
});

fn call(b: &mut Breaker, now: u64, ok: bool) -> Option<Transition> {
    let (permit, _) = b.admit(now, &SETTINGS);
    b.record(permit.expect("admitted"), ok, now, &SETTINGS)
}

fn fail(b: &mut Breaker, now: u64) -> Option<Transition> {
    call(b, now, false)
}

/// `per_ms` calls ending every ms of `from..to`, each failing when `fails(t, i)`; the time the
/// breaker opened, if it did.
fn traffic(
    b: &mut Breaker,
    from: u64,
    to: u64,
    per_ms: u32,
    fails: impl Fn(u64, u32) -> bool,
) -> Option<u64> {
    for t in from..to {
        for i in 0..per_ms {
            if call(b, t, !fails(t, i)) == OPENED {
                return Some(t);
            }
        }
    }
    None
}

/// Fails one call per ms from `from` until the breaker opens; when it did.
fn open(b: &mut Breaker, from: u64) -> u64 {
    traffic(b, from, from + 10_000, 1, |_, _| true).expect("a dead endpoint opens the breaker")
}

#[test]
fn a_wave_of_32_simultaneous_timeouts_after_a_healthy_period_does_not_open() {
    let mut b = Breaker::default();
    assert_eq!(traffic(&mut b, 0, 5_000, 2, |_, _| false), None);
    // 32 callers' calls all time out together, and again one deadline later (a 30 ms stall).
    for wave in [5_000, 5_015] {
        for i in 0..32 {
            assert_eq!(fail(&mut b, wave + i % 2), None);
        }
    }
    assert_eq!(traffic(&mut b, 5_016, 6_000, 2, |_, _| false), None);
    assert_eq!(b.state(), BreakerState::Closed);
    // Nor does a 100 ms stall (every call in it failing) three times a second: stalls take a
    // third of the time, so at most a little over a third of the window's moments.
    let stalls = |t: u64, _| t % 333 < 100;
    assert_eq!(traffic(&mut b, 6_000, 9_000, 4, stalls), None);
    assert_eq!(b.state(), BreakerState::Closed);
}

#[test]
fn many_failed_calls_within_one_moment_are_one_failed_moment() {
    // Fifty failures in a row within one moment: one failed moment, below the minimum of 10.
    let mut b = Breaker::default();
    for _ in 0..50 {
        assert_eq!(fail(&mut b, 100), None);
    }
    assert_eq!(b.state(), BreakerState::Closed);
}

#[test]
fn an_endpoint_failing_most_calls_over_the_window_opens() {
    let mut b = Breaker::default();
    assert_eq!(traffic(&mut b, 0, 2_000, 3, |_, _| false), None);
    // Two of every three calls fail, spread over every moment.
    let opened = traffic(&mut b, 2_000, 4_000, 3, |_, i| i < 2).expect("opens");
    // Once the failing moments make half the window (about half a window after it began).
    assert!((2_400..=2_700).contains(&opened), "opened at {opened}");
}

#[test]
fn failing_fewer_than_half_the_moments_does_not_open() {
    let mut b = Breaker::default();
    // One moment of every three fails entirely; the rest are healthy.
    let fails = |t: u64, _| (t / 15).is_multiple_of(3);
    assert_eq!(traffic(&mut b, 0, 5_000, 2, fails), None);
}

#[test]
fn a_dead_endpoint_under_steady_traffic_opens_within_half_a_window() {
    let mut b = Breaker::default();
    assert_eq!(traffic(&mut b, 0, 3_000, 8, |_, _| false), None);
    let opened = open(&mut b, 3_000);
    assert!(
        (3_400..=3_600).contains(&opened),
        "opened {} ms after the endpoint died",
        opened - 3_000
    );
    // From a quiet start, the minimum decides: 10 failed moments, 9 deadlines after the first.
    let mut fresh = Breaker::default();
    assert_eq!(open(&mut fresh, 10_000), 10_000 - 10_000 % 15 + 9 * 15);
}

#[test]
fn failures_leave_the_window() {
    let mut b = Breaker::default();
    // Nine failed moments, then quiet for a window: the next nine do not add up to eighteen.
    for m in 0..9 {
        assert_eq!(fail(&mut b, m * 15), None);
    }
    for m in 0..9 {
        assert_eq!(fail(&mut b, 1_100 + m * 15), None);
    }
    assert_eq!(b.state(), BreakerState::Closed);
    assert_eq!(fail(&mut b, 1_235), OPENED, "the tenth within one window");
}

/// Opens `b` at `t` (at least 135): ten failed moments ending at `t`.
fn opened_at(b: &mut Breaker, t: u64) {
    for m in (0..u64::from(SETTINGS.min_failures)).rev() {
        let transition = fail(b, t - m * 15);
        assert_eq!(transition, if m == 0 { OPENED } else { None });
    }
}

#[test]
fn open_skips_for_the_cooldown_then_lets_exactly_one_probe_through() {
    let mut b = Breaker::default();
    opened_at(&mut b, 200);
    assert_eq!(b.admit(200, &SETTINGS), (None, None));
    assert_eq!(b.admit(1_199, &SETTINGS), (None, None));
    let (probe, transition) = b.admit(1_200, &SETTINGS);
    assert_eq!(probe, Some(Permit::Probe));
    assert_eq!(transition.unwrap().to, BreakerState::HalfOpen);
    // While the probe is out, everyone else is still skipped.
    assert_eq!(b.admit(1_201, &SETTINGS), (None, None));
    assert_eq!(b.admit(1_600, &SETTINGS), (None, None));
    assert_eq!(
        b.record(Permit::Probe, true, 1_210, &SETTINGS),
        Some(Transition {
            from: BreakerState::HalfOpen,
            to: BreakerState::Closed
        })
    );
    assert_eq!(b.admit(1_211, &SETTINGS), (Some(Permit::Call), None));
    // Closed with an empty window: the failures before the cooldown are forgotten.
    assert_eq!(b, Breaker::default());
}

#[test]
fn a_failed_probe_opens_for_another_cooldown() {
    let mut b = Breaker::default();
    opened_at(&mut b, 200);
    let (probe, _) = b.admit(1_200, &SETTINGS);
    assert_eq!(
        b.record(probe.unwrap(), false, 1_215, &SETTINGS),
        Some(Transition {
            from: BreakerState::HalfOpen,
            to: BreakerState::Open
        })
    );
    assert_eq!(b.admit(2_214, &SETTINGS), (None, None));
    assert_eq!(b.admit(2_215, &SETTINGS).0, Some(Permit::Probe));
}

#[test]
fn a_lost_probe_is_replaced_after_a_cooldown() {
    let mut b = Breaker::default();
    opened_at(&mut b, 200);
    assert_eq!(b.admit(1_200, &SETTINGS).0, Some(Permit::Probe));
    // The probe's request was cancelled and never reports.
    assert_eq!(b.admit(2_199, &SETTINGS), (None, None));
    assert_eq!(b.admit(2_200, &SETTINGS), (Some(Permit::Probe), None));
}

#[test]
fn late_outcomes_of_calls_admitted_before_do_not_decide() {
    let mut b = Breaker::default();
    opened_at(&mut b, 200);
    // A call admitted while closed succeeds after the breaker opened: still open.
    assert_eq!(b.record(Permit::Call, true, 210, &SETTINGS), None);
    assert_eq!(b.state(), BreakerState::Open);
    let (probe, _) = b.admit(1_200, &SETTINGS);
    assert_eq!(b.record(Permit::Call, true, 1_201, &SETTINGS), None);
    assert_eq!(b.record(Permit::Call, false, 1_202, &SETTINGS), None);
    assert_eq!(b.state(), BreakerState::HalfOpen);
    b.record(probe.unwrap(), true, 1_205, &SETTINGS);
    // A second (replaced) probe reporting after the close changes nothing.
    assert_eq!(b.record(Permit::Probe, false, 1_206, &SETTINGS), None);
    assert_eq!(b.state(), BreakerState::Closed);
}

/// Fails calls through `endpoint`, one moment apart, until its breaker opens.
fn trip(endpoint: &Endpoint, clock: &ManualClock) {
    let err = BackendError::Timeout(15);
    for _ in 0..SETTINGS.min_failures {
        let permit = endpoint.admit().unwrap();
        endpoint.record(permit, Err(&err));
        clock.advance(15);
    }
    assert_eq!(endpoint.state(), BreakerState::Open);
}

#[test]
fn set_shares_one_breaker_per_endpoint_and_steps_with_the_clock() {
    let clock = ManualClock::new(10_000);
    let set = BreakerSet::new(SETTINGS, Arc::new(clock.clone()));
    let a = set.endpoint("127.0.0.1:7000");
    let a_again = set.endpoint("127.0.0.1:7000");
    let b = set.endpoint("127.0.0.1:7001");
    // Through either handle: one breaker.
    for _ in 0..SETTINGS.min_failures - 1 {
        let permit = a.admit().unwrap();
        a_again.record(permit, Err(&BackendError::Timeout(15)));
        clock.advance(15);
    }
    assert_eq!(a.state(), BreakerState::Closed);
    let permit = a_again.admit().unwrap();
    a.record(permit, Err(&BackendError::Timeout(15)));
    assert_eq!(a_again.state(), BreakerState::Open);
    assert_eq!(a.admit(), None);
    // Another endpoint is not affected.
    assert_eq!(b.admit(), Some(Permit::Call));
    assert_eq!(
        set.states(),
        vec![
            ("127.0.0.1:7000".to_string(), BreakerState::Open),
            ("127.0.0.1:7001".to_string(), BreakerState::Closed)
        ]
    );
    clock.advance(999);
    assert_eq!(a.admit(), None);
    clock.advance(1);
    let probe = a.admit();
    assert_eq!(probe, Some(Permit::Probe));
    assert_eq!(a.admit(), None);
    a.record(Permit::Probe, Ok(()));
    assert_eq!(a.state(), BreakerState::Closed);
    assert_eq!(a.admit(), Some(Permit::Call));

    set.retain(|name| name.ends_with(":7001"));
    assert_eq!(set.states().len(), 1);
}

#[test]
fn a_joined_set_reports_every_part_and_each_server_once() {
    let clock = ManualClock::new(10_000);
    let main = BreakerSet::new(SETTINGS, Arc::new(clock.clone()));
    let per_second = BreakerSet::new(SETTINGS, Arc::new(clock.clone()));
    main.endpoint("10.0.0.1:6379");
    main.endpoint("10.0.0.3:6379");
    let shared_name = per_second.endpoint("10.0.0.3:6379");
    per_second.endpoint("10.0.0.2:6379");
    let joined = BreakerSet::joined(&main, std::slice::from_ref(&per_second));
    let closed = |name: &str| (name.to_string(), BreakerState::Closed);
    assert_eq!(
        joined.states(),
        [
            closed("10.0.0.1:6379"),
            closed("10.0.0.2:6379"),
            closed("10.0.0.3:6379")
        ]
    );
    // One part's open breaker shows through, also where the other part names the same
    // server healthy.
    trip(&shared_name, &clock);
    assert_eq!(
        joined.states()[2],
        ("10.0.0.3:6379".to_string(), BreakerState::Open)
    );
    // A part forgetting its endpoints leaves the other's alone.
    per_second.retain(|_| false);
    assert_eq!(
        joined.states(),
        [closed("10.0.0.1:6379"), closed("10.0.0.3:6379")]
    );
}
