//! A circuit breaker per backend endpoint (a Redis server, a Sentinel-named master, a Cluster
//! node): after `failure_threshold` consecutive failed or timed-out calls it opens and calls are
//! skipped for `cooldown`; then one call is let through as a probe (half-open); its success
//! closes the breaker, its failure opens it for another cooldown.
//!
//! Time advances lazily: every decision reads the injected clock, so there is no timer per
//! endpoint (or per key) and tests step a [`ManualClock`](crate::clock::ManualClock).
//! [`Breaker`] is the pure state machine; [`BreakerSet`] holds one per endpoint, logs each
//! transition once (warn on open, info on close) and lists their states for readiness and metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde::Serialize;

use crate::backend::BackendError;
use crate::clock::SharedClock;
use crate::settings::Settings;

/// Where an endpoint's breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls are skipped until the cooldown ends.
    Open,
    /// One probe call is under way (or due); everything else is still skipped.
    HalfOpen,
}

impl BreakerState {
    pub const ALL: [BreakerState; 3] = [
        BreakerState::Closed,
        BreakerState::HalfOpen,
        BreakerState::Open,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

impl std::fmt::Display for BreakerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a breaker opens and how long it stays open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive failures (errors or timeouts) that open the breaker; at least 1.
    pub failure_threshold: u32,
    /// How long an open breaker skips the endpoint before it lets one probe through.
    pub cooldown: Duration,
}

impl From<&Settings> for BreakerSettings {
    fn from(settings: &Settings) -> Self {
        BreakerSettings {
            failure_threshold: settings.breaker_failures,
            cooldown: settings.breaker_cooldown,
        }
    }
}

impl Default for BreakerSettings {
    /// `--breaker-failures` and `--breaker-cooldown` at their defaults.
    fn default() -> Self {
        BreakerSettings::from(&Settings::defaults())
    }
}

impl BreakerSettings {
    fn cooldown_ms(&self) -> u64 {
        (self.cooldown.as_millis() as u64).max(1)
    }
}

/// Leave to make one call, handed back with its outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Permit {
    /// An ordinary call while the breaker is closed.
    Call,
    /// The one call a half-open breaker lets through.
    Probe,
}

/// A change of state, for the log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: BreakerState,
    pub to: BreakerState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Closed {
        failures: u32,
    },
    Open {
        until_ms: u64,
    },
    /// A probe was handed out at `since_ms`.
    HalfOpen {
        since_ms: u64,
    },
}

/// The state machine of one endpoint. Pure: time is an argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Breaker {
    phase: Phase,
}

impl Default for Breaker {
    fn default() -> Self {
        Breaker {
            phase: Phase::Closed { failures: 0 },
        }
    }
}

impl Breaker {
    pub fn state(&self) -> BreakerState {
        match self.phase {
            Phase::Closed { .. } => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Closed with no failure counted: recording a success changes nothing.
    fn is_clean(&self) -> bool {
        self.phase == Phase::Closed { failures: 0 }
    }

    /// May a call go to the endpoint at `now_ms`? `None`: skip it.
    pub fn admit(
        &mut self,
        now_ms: u64,
        settings: &BreakerSettings,
    ) -> (Option<Permit>, Option<Transition>) {
        match self.phase {
            Phase::Closed { .. } => (Some(Permit::Call), None),
            Phase::Open { until_ms } if now_ms >= until_ms => {
                self.phase = Phase::HalfOpen { since_ms: now_ms };
                (
                    Some(Permit::Probe),
                    Some(Transition {
                        from: BreakerState::Open,
                        to: BreakerState::HalfOpen,
                    }),
                )
            }
            Phase::Open { .. } => (None, None),
            // A probe that never reported (its request was cancelled) must not wedge the breaker
            // half-open: after another cooldown the next call becomes the probe.
            Phase::HalfOpen { since_ms }
                if now_ms >= since_ms.saturating_add(settings.cooldown_ms()) =>
            {
                self.phase = Phase::HalfOpen { since_ms: now_ms };
                (Some(Permit::Probe), None)
            }
            Phase::HalfOpen { .. } => (None, None),
        }
    }

    /// Records the outcome of a call admitted with `permit`. Outcomes of calls admitted in an
    /// earlier phase (a slow call finishing after the breaker opened) change nothing: only the
    /// probe decides a half-open breaker.
    pub fn record(
        &mut self,
        permit: Permit,
        ok: bool,
        now_ms: u64,
        settings: &BreakerSettings,
    ) -> Option<Transition> {
        let open = Phase::Open {
            until_ms: now_ms.saturating_add(settings.cooldown_ms()),
        };
        match (self.phase, permit, ok) {
            (Phase::Closed { .. }, Permit::Call, true) => {
                self.phase = Phase::Closed { failures: 0 };
                None
            }
            (Phase::Closed { failures }, Permit::Call, false) => {
                let failures = failures.saturating_add(1);
                if failures >= settings.failure_threshold.max(1) {
                    self.phase = open;
                    Some(Transition {
                        from: BreakerState::Closed,
                        to: BreakerState::Open,
                    })
                } else {
                    self.phase = Phase::Closed { failures };
                    None
                }
            }
            (Phase::HalfOpen { .. }, Permit::Probe, true) => {
                self.phase = Phase::Closed { failures: 0 };
                Some(Transition {
                    from: BreakerState::HalfOpen,
                    to: BreakerState::Closed,
                })
            }
            (Phase::HalfOpen { .. }, Permit::Probe, false) => {
                self.phase = open;
                Some(Transition {
                    from: BreakerState::HalfOpen,
                    to: BreakerState::Open,
                })
            }
            _ => None,
        }
    }
}

/// What every endpoint of one set shares.
struct Shared {
    settings: BreakerSettings,
    clock: SharedClock,
}

/// One endpoint's breaker, shared by everything that calls that endpoint. Cheap to clone.
#[derive(Clone)]
pub struct Endpoint(Arc<EndpointInner>);

struct EndpointInner {
    name: Arc<str>,
    shared: Arc<Shared>,
    breaker: Mutex<Breaker>,
    /// Mirrors [`Breaker::is_clean`], so the healthy path (admit, then record a success) takes
    /// no lock. A stale `true` costs at most one extra call to an endpoint that just failed.
    clean: AtomicBool,
}

impl Endpoint {
    pub fn name(&self) -> &str {
        &self.0.name
    }

    pub fn state(&self) -> BreakerState {
        self.lock().state()
    }

    pub fn is_closed(&self) -> bool {
        self.state() == BreakerState::Closed
    }

    /// Leave to call the endpoint now, or `None` while its breaker is open.
    pub fn admit(&self) -> Option<Permit> {
        if self.0.clean.load(Ordering::Acquire) {
            return Some(Permit::Call);
        }
        let now_ms = self.0.shared.clock.now_ms();
        let mut breaker = self.lock();
        let (permit, transition) = breaker.admit(now_ms, &self.0.shared.settings);
        self.publish(&breaker);
        drop(breaker);
        if let Some(transition) = transition {
            self.log(transition, None);
        }
        permit
    }

    /// Records how a call admitted with `permit` ended.
    pub fn record(&self, permit: Permit, outcome: Result<(), &BackendError>) {
        if outcome.is_ok() && permit == Permit::Call && self.0.clean.load(Ordering::Acquire) {
            return;
        }
        let now_ms = self.0.shared.clock.now_ms();
        let mut breaker = self.lock();
        let transition = breaker.record(permit, outcome.is_ok(), now_ms, &self.0.shared.settings);
        self.publish(&breaker);
        drop(breaker);
        if let Some(transition) = transition {
            self.log(transition, outcome.err());
        }
    }

    fn publish(&self, breaker: &Breaker) {
        self.0.clean.store(breaker.is_clean(), Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Breaker> {
        self.0
            .breaker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn log(&self, transition: Transition, error: Option<&BackendError>) {
        let endpoint = &*self.0.name;
        let settings = &self.0.shared.settings;
        match transition.to {
            BreakerState::Open if transition.from == BreakerState::Closed => tracing::warn!(
                endpoint,
                failures = settings.failure_threshold,
                cooldown_ms = settings.cooldown_ms(),
                error = error.map(tracing::field::display),
                "circuit breaker open: Redis endpoint skipped, failure policy answers"
            ),
            BreakerState::Open => tracing::warn!(
                endpoint,
                cooldown_ms = settings.cooldown_ms(),
                error = error.map(tracing::field::display),
                "circuit breaker probe failed: Redis endpoint stays skipped"
            ),
            BreakerState::Closed => {
                tracing::info!(
                    endpoint,
                    "circuit breaker closed: Redis endpoint answers again"
                )
            }
            BreakerState::HalfOpen => {
                tracing::debug!(endpoint, "circuit breaker half-open: probing")
            }
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.0.name)
            .field("state", &self.state())
            .finish()
    }
}

/// The breakers of one backend, one per endpoint name (`host:port`).
pub struct BreakerSet {
    shared: Arc<Shared>,
    endpoints: RwLock<HashMap<Arc<str>, Endpoint>>,
    /// Other backends' sets whose endpoints [`states`](BreakerSet::states) reports too
    /// ([`BreakerSet::joined`]).
    joined: Vec<Arc<BreakerSet>>,
}

impl BreakerSet {
    pub fn new(settings: BreakerSettings, clock: SharedClock) -> Arc<BreakerSet> {
        Arc::new(BreakerSet {
            shared: Arc::new(Shared { settings, clock }),
            endpoints: RwLock::new(HashMap::new()),
            joined: Vec::new(),
        })
    }

    /// One read-only view of the breakers of `first` and `others` (a backend made of several,
    /// each keeping its own set): its [`states`](BreakerSet::states) are all of theirs. The
    /// parts are not merged, because each backend forgets the endpoints that left its own
    /// topology ([`retain`](BreakerSet::retain)) and must not forget another's.
    pub fn joined(first: &Arc<BreakerSet>, others: &[Arc<BreakerSet>]) -> Arc<BreakerSet> {
        Arc::new(BreakerSet {
            shared: first.shared.clone(),
            endpoints: RwLock::new(HashMap::new()),
            joined: std::iter::once(first).chain(others).cloned().collect(),
        })
    }

    pub fn settings(&self) -> BreakerSettings {
        self.shared.settings
    }

    /// The breaker of `name`, created closed on first use; the same one for every caller.
    pub fn endpoint(&self, name: &str) -> Endpoint {
        if let Some(found) = self.read().get(name) {
            return found.clone();
        }
        let mut endpoints = self
            .endpoints
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        endpoints
            .entry(Arc::from(name))
            .or_insert_with(|| {
                Endpoint(Arc::new(EndpointInner {
                    name: Arc::from(name),
                    shared: self.shared.clone(),
                    breaker: Mutex::new(Breaker::default()),
                    clean: AtomicBool::new(true),
                }))
            })
            .clone()
    }

    /// Forgets endpoints that are no longer part of the topology (a failed-over master, a
    /// removed Cluster node), so they do not linger in readiness and metrics.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.endpoints
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name, _| keep(name));
    }

    /// Every endpoint and its breaker's state, sorted by name, joined sets' included. Read-only.
    pub fn states(&self) -> Vec<(String, BreakerState)> {
        let mut out: Vec<(String, BreakerState)> = self
            .read()
            .values()
            .map(|e| (e.name().to_string(), e.state()))
            .collect();
        out.extend(self.joined.iter().flat_map(|set| set.states()));
        // Two joined backends may name one server (the same Redis configured twice): report it
        // once, at its least healthy state, so a metric label is never duplicated.
        out.sort_by(|a, b| a.0.cmp(&b.0).then(health(a.1).cmp(&health(b.1))));
        out.dedup_by(|later, kept| later.0 == kept.0);
        out
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<Arc<str>, Endpoint>> {
        self.endpoints
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Orders states from least to most healthy.
const fn health(state: BreakerState) -> u8 {
    match state {
        BreakerState::Open => 0,
        BreakerState::HalfOpen => 1,
        BreakerState::Closed => 2,
    }
}

impl std::fmt::Debug for BreakerSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BreakerSet")
            .field("settings", &self.shared.settings)
            .field("states", &self.states())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const SETTINGS: BreakerSettings = BreakerSettings {
        failure_threshold: 3,
        cooldown: Duration::from_millis(1_000),
    };

    fn fail(b: &mut Breaker, now: u64) -> Option<Transition> {
        let (permit, _) = b.admit(now, &SETTINGS);
        b.record(permit.expect("admitted"), false, now, &SETTINGS)
    }

    #[test]
    fn opens_after_k_consecutive_failures_only() {
        let mut b = Breaker::default();
        assert_eq!(fail(&mut b, 0), None);
        assert_eq!(fail(&mut b, 1), None);
        // A success in between resets the count: failures must be consecutive.
        let (permit, _) = b.admit(2, &SETTINGS);
        assert_eq!(b.record(permit.unwrap(), true, 2, &SETTINGS), None);
        assert_eq!(fail(&mut b, 3), None);
        assert_eq!(fail(&mut b, 4), None);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(
            fail(&mut b, 5),
            Some(Transition {
                from: BreakerState::Closed,
                to: BreakerState::Open
            })
        );
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn open_skips_for_the_cooldown_then_lets_exactly_one_probe_through() {
        let mut b = Breaker::default();
        for t in 0..3 {
            fail(&mut b, t);
        }
        // Opened at 2: skipped until 1002.
        assert_eq!(b.admit(2, &SETTINGS), (None, None));
        assert_eq!(b.admit(1_001, &SETTINGS), (None, None));
        let (probe, transition) = b.admit(1_002, &SETTINGS);
        assert_eq!(probe, Some(Permit::Probe));
        assert_eq!(transition.unwrap().to, BreakerState::HalfOpen);
        // While the probe is out, everyone else is still skipped.
        assert_eq!(b.admit(1_003, &SETTINGS), (None, None));
        assert_eq!(b.admit(1_500, &SETTINGS), (None, None));
        assert_eq!(
            b.record(Permit::Probe, true, 1_010, &SETTINGS),
            Some(Transition {
                from: BreakerState::HalfOpen,
                to: BreakerState::Closed
            })
        );
        assert_eq!(b.admit(1_011, &SETTINGS), (Some(Permit::Call), None));
        assert!(b.is_clean());
    }

    #[test]
    fn a_failed_probe_opens_for_another_cooldown() {
        let mut b = Breaker::default();
        for t in 0..3 {
            fail(&mut b, t);
        }
        let (probe, _) = b.admit(1_002, &SETTINGS);
        assert_eq!(
            b.record(probe.unwrap(), false, 1_017, &SETTINGS),
            Some(Transition {
                from: BreakerState::HalfOpen,
                to: BreakerState::Open
            })
        );
        assert_eq!(b.admit(2_016, &SETTINGS), (None, None));
        assert_eq!(b.admit(2_017, &SETTINGS).0, Some(Permit::Probe));
    }

    #[test]
    fn a_lost_probe_is_replaced_after_a_cooldown() {
        let mut b = Breaker::default();
        for t in 0..3 {
            fail(&mut b, t);
        }
        assert_eq!(b.admit(1_002, &SETTINGS).0, Some(Permit::Probe));
        // The probe's request was cancelled and never reports.
        assert_eq!(b.admit(2_001, &SETTINGS), (None, None));
        assert_eq!(b.admit(2_002, &SETTINGS), (Some(Permit::Probe), None));
    }

    #[test]
    fn late_outcomes_of_calls_admitted_before_do_not_decide() {
        let mut b = Breaker::default();
        for t in 0..3 {
            fail(&mut b, t);
        }
        // A call admitted while closed succeeds after the breaker opened: still open.
        assert_eq!(b.record(Permit::Call, true, 10, &SETTINGS), None);
        assert_eq!(b.state(), BreakerState::Open);
        let (probe, _) = b.admit(1_002, &SETTINGS);
        assert_eq!(b.record(Permit::Call, true, 1_003, &SETTINGS), None);
        assert_eq!(b.record(Permit::Call, false, 1_004, &SETTINGS), None);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        b.record(probe.unwrap(), true, 1_005, &SETTINGS);
        // A second (replaced) probe reporting after the close changes nothing.
        assert_eq!(b.record(Permit::Probe, false, 1_006, &SETTINGS), None);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn set_shares_one_breaker_per_endpoint_and_steps_with_the_clock() {
        let clock = ManualClock::new(10_000);
        let set = BreakerSet::new(SETTINGS, Arc::new(clock.clone()));
        let a = set.endpoint("127.0.0.1:7000");
        let a_again = set.endpoint("127.0.0.1:7000");
        let b = set.endpoint("127.0.0.1:7001");
        let err = BackendError::Timeout(15);
        for _ in 0..3 {
            let permit = a.admit().unwrap();
            a_again.record(permit, Err(&err));
        }
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
        let clock: SharedClock = Arc::new(ManualClock::new(10_000));
        let main = BreakerSet::new(SETTINGS, clock.clone());
        let per_second = BreakerSet::new(SETTINGS, clock);
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
        for _ in 0..SETTINGS.failure_threshold {
            let permit = shared_name.admit().unwrap();
            shared_name.record(permit, Err(&BackendError::Timeout(15)));
        }
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
}
