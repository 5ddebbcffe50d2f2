//! A circuit breaker per backend endpoint (a Redis server, a Sentinel-named master, a Cluster
//! node). It judges the endpoint over a rolling window (`--breaker-window`) counted in moments
//! of one Redis deadline ([`window`]): it opens when at least `min_failures` moments of the
//! window failed and they are at least `failure_ratio` of its moments. A stall that fails every
//! call in flight is one failed moment per deadline it lasts, not one failure per caller, so a
//! slow moment under heavy concurrency cannot open it; a failing endpoint does. Open, calls are
//! skipped for `cooldown`; then one call is let through as a probe (half-open); its success
//! closes the breaker with an empty window, its failure opens it for another cooldown.
//!
//! Time advances lazily: every decision reads the injected clock, so there is no timer per
//! endpoint (or per key) and tests step a [`ManualClock`](crate::clock::ManualClock).
//! [`Breaker`] is the pure state machine; [`BreakerSet`] holds one per endpoint, logs each
//! transition once (warn on open, info on close) and lists their states for readiness and metrics.

mod window;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use serde::Serialize;

use self::window::{Shape, Window};
use crate::backend::failure::{BackendError, DEFAULT_CALL_DEADLINE};
use crate::clock::SharedClock;

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
    /// Failed moments the window must hold before the ratio can open the breaker; at least 1.
    pub min_failures: u32,
    /// Share of the window's moments that must have failed, in thousandths (1..=1000).
    pub failure_permille: u16,
    /// How far back the breaker looks.
    pub window: Duration,
    /// One moment: calls that end within it count once (the Redis call deadline).
    pub moment: Duration,
    /// How long an open breaker skips the endpoint before it lets one probe through.
    pub cooldown: Duration,
}

impl Default for BreakerSettings {
    /// Opens when at least 10 moments of the last second failed and they are half of its
    /// moments; stays open a second. A moment is the default Redis call deadline.
    fn default() -> Self {
        BreakerSettings {
            min_failures: Self::DEFAULT_MIN_FAILURES,
            failure_permille: Self::DEFAULT_FAILURE_PERMILLE,
            window: Self::DEFAULT_WINDOW,
            moment: DEFAULT_CALL_DEADLINE,
            cooldown: Self::DEFAULT_COOLDOWN,
        }
    }
}

impl BreakerSettings {
    pub const DEFAULT_MIN_FAILURES: u32 = 10;
    pub const DEFAULT_FAILURE_PERMILLE: u16 = 500;
    pub const DEFAULT_WINDOW: Duration = Duration::from_secs(1);
    pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(1);

    /// A failure share (above 0, at most 1) in the thousandths `failure_permille` holds.
    pub fn permille(ratio: f64) -> u16 {
        (ratio * 1000.0).round().clamp(1.0, 1000.0) as u16
    }

    fn cooldown_ms(&self) -> u64 {
        (self.cooldown.as_millis() as u64).max(1)
    }

    fn shape(&self) -> Shape {
        Shape::new(
            self.moment.as_millis() as u64,
            self.window.as_millis() as u64,
        )
    }

    /// Does a window holding `failed` failed moments of `moments` open the breaker?
    fn trips(&self, failed: u32, moments: u32) -> bool {
        failed >= self.min_failures.max(1)
            && u64::from(failed) * 1000 >= u64::from(self.failure_permille) * u64::from(moments)
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
        window: Window,
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
            phase: Phase::Closed {
                window: Window::default(),
            },
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
        match (&mut self.phase, permit, ok) {
            (Phase::Closed { window }, Permit::Call, _) => {
                let tally = window.record(ok, now_ms, settings.shape());
                if ok || !settings.trips(tally.failed, tally.moments) {
                    return None;
                }
                self.phase = open;
                Some(Transition {
                    from: BreakerState::Closed,
                    to: BreakerState::Open,
                })
            }
            (Phase::HalfOpen { .. }, Permit::Probe, true) => {
                *self = Breaker::default();
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
    /// Mirrors "the breaker is closed", so admitting a call takes no lock. A stale `true` lets
    /// at most one extra call through to an endpoint whose breaker just opened; its outcome
    /// changes nothing (see [`Breaker::record`]).
    closed: AtomicBool,
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
        if self.0.closed.load(Ordering::Acquire) {
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

    /// Records how a call admitted with `permit` ended (every outcome: successes are the
    /// window's healthy moments).
    pub fn record(&self, permit: Permit, outcome: Result<(), &BackendError>) {
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
        self.0
            .closed
            .store(breaker.state() == BreakerState::Closed, Ordering::Release);
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
                min_failures = settings.min_failures,
                failure_permille = settings.failure_permille,
                window_ms = settings.window.as_millis() as u64,
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
                    closed: AtomicBool::new(true),
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
mod tests;
