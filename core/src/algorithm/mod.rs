//! Pure rate-limit arithmetic: `(state, now, params, demand) -> (state, verdict)`, for four
//! algorithms chosen per rule.
//!
//! Nothing here reads a clock or touches I/O, so every edge case is a unit test with time as an
//! argument. The memory backend calls [`decide`] directly; `lua/limit.lua` performs the same
//! operations in the same order (the same doubles where the arithmetic is fractional), so both
//! backends give bit-identical answers (checked by the conformance suite's differential test).
//!
//! Every algorithm is decided in two phases so that one request over several keys is
//! all-or-nothing whatever the keys' algorithms: first each key's state is brought to `now` and
//! asked whether its demand fits; then, only if the request is allowed, the takes that fit are
//! applied. Refunds are always applied, and so are always-charged takes ([`Demand::always`],
//! a rule's `charge: always`): counted in full whatever the answer, they put a key into debt
//! (tokens below zero, a window's count past its limit, an arrival time past the burst) that
//! refill repays; the key refuses every demand, check-only ones included, until it is repaid.
//!
//! A request is allowed when every ordinary demand passes and, if it has quota-mode demands
//! (envoyproxy/ratelimit's `quota_mode`), at least one of those passes; a demand passes when it
//! fits or is in shadow mode. So an allowed request takes from every key its demand fits, and a
//! quota key it does not fit takes nothing.
//!
//! | algorithm | state | limit | `burst` |
//! | --- | --- | --- | --- |
//! | [`token_bucket`] | tokens, refill time | `capacity` tokens, refilled at `requests_per_unit / unit` | capacity |
//! | [`fixed_window`] | window start, count | `requests_per_unit` per clock-aligned window | not allowed |
//! | [`sliding_window`] | window start, count, previous count | `requests_per_unit` per sliding window (estimated) | not allowed |
//! | [`gcra`] | theoretical arrival time | one request per `unit / requests_per_unit`, `capacity` at once | tolerance |

pub mod fixed_window;
pub mod gcra;
pub mod in_flight;
pub mod peek;
pub mod reservation;
pub mod sliding_window;
pub mod token_bucket;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use fixed_window::WindowState;
pub use gcra::GcraState;
pub use in_flight::{Ledger, Slots};
pub use peek::{Level, Peek, peek};
pub use reservation::Reserved;
pub use sliding_window::SlidingState;

/// How a rule counts hits. The default is the token bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    #[default]
    TokenBucket,
    FixedWindow,
    SlidingWindow,
    Gcra,
    /// An in-flight cap (`in_flight` on a descriptor, not a `rate_limit.algorithm`): at most
    /// `capacity` holders at once, see [`in_flight`].
    InFlight,
    /// A reservation's ledger key (a rule's `reserve`, not a `rate_limit.algorithm`): the hits
    /// one holder reserved on the bucket decided right after it, see [`reservation`].
    Reservation,
}

impl Algorithm {
    /// The rate algorithms a `rate_limit.algorithm` may name ([`Algorithm::InFlight`] is a
    /// descriptor's `in_flight`, not one of them).
    pub const ALL: [Algorithm; 4] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
    ];

    /// The config and command-line spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::Gcra => "gcra",
            Algorithm::InFlight => "in_flight",
            Algorithm::Reservation => "reservation",
        }
    }

    /// Parses a config spelling, any case (as units and failure modes are).
    pub fn parse(s: &str) -> Option<Algorithm> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str().eq_ignore_ascii_case(s))
    }

    /// `token_bucket, fixed_window, sliding_window, gcra`, for messages.
    pub fn names() -> String {
        Algorithm::ALL.map(Algorithm::as_str).join(", ")
    }

    /// The number `lua/limit.lua` dispatches on.
    pub const fn wire_code(self) -> u8 {
        match self {
            Algorithm::TokenBucket => 1,
            Algorithm::FixedWindow => 2,
            Algorithm::SlidingWindow => 3,
            Algorithm::Gcra => 4,
            Algorithm::InFlight => 5,
            Algorithm::Reservation => 6,
        }
    }

    /// What the storage key carries after `~` to keep this algorithm's state apart from the
    /// others' (`None` for the token bucket, whose keys predate the other algorithms and stay as
    /// they were so an upgrade keeps every bucket).
    pub const fn key_tag(self) -> Option<&'static str> {
        match self {
            Algorithm::TokenBucket => None,
            Algorithm::FixedWindow => Some("fw"),
            Algorithm::SlidingWindow => Some("sw"),
            Algorithm::Gcra => Some("gcra"),
            Algorithm::InFlight => Some("if"),
            Algorithm::Reservation => Some("rv"),
        }
    }

    /// Whether `burst` means something: the bucket's capacity, GCRA's tolerance. A window
    /// admits `requests_per_unit` per window and has nothing a burst could set.
    pub const fn takes_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }

    /// Whether a rule may lease tokens (`lease`): only where a token taken now and spent a little
    /// later is still a token of the same limit. A window's count belongs to its window.
    pub const fn takes_lease(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::Gcra)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limit's shape: `requests_per_unit` per `unit_ms`, and `capacity` — the token bucket's size
/// and GCRA's burst (`burst`, else `requests_per_unit`). Windows use `requests_per_unit` only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct BucketParams {
    pub capacity: u64,
    pub requests_per_unit: u64,
    pub unit_ms: u64,
}

impl BucketParams {
    /// Tokens the token bucket refills over `ms` milliseconds: `ms * requests_per_unit / unit_ms`,
    /// multiplied before dividing, exactly as `lua/limit.lua` does. The one rounding is the
    /// division's (the product of whole ms and whole requests is exact below 2^53), so a whole
    /// number of tokens comes out exactly: 2 per hour over 1,800,000 ms is 1.0, where a rate per
    /// ms, `2 / 3_600_000`, gave 0.9999999999999999.
    pub fn tokens_over(&self, ms: f64) -> f64 {
        ms * self.requests_per_unit as f64 / self.unit_ms as f64
    }
}

/// Stored state of one token bucket. A bucket with no state is full.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketState {
    /// Fractional tokens are kept so slow refill rates are exact over time.
    pub tokens: f64,
    /// Time of the last refill, ms on the deciding clock.
    pub updated_ms: u64,
}

/// Stored state of one key, of whichever algorithm owns it. No state means nothing counted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum State {
    TokenBucket(BucketState),
    FixedWindow(WindowState),
    SlidingWindow(SlidingState),
    Gcra(GcraState),
    /// An in-flight cap's slots as the deciding holder sees them (the backend keeps the
    /// [`Ledger`] itself and writes back what the decision made of the holder's slot).
    InFlight(Slots),
    /// One holder's reservation ([`reservation`]).
    Reserved(Reserved),
}

impl State {
    /// From this time on (ms) the state is indistinguishable from no state at all (the bucket is
    /// full, the windows are over, the arrival time has passed), so it may be dropped.
    pub fn settled_at_ms(&self, params: &BucketParams) -> u64 {
        match self {
            State::TokenBucket(s) => token_bucket::settled_at_ms(s, params),
            State::FixedWindow(s) => fixed_window::settled_at_ms(s, params),
            State::SlidingWindow(s) => sliding_window::settled_at_ms(s, params),
            State::Gcra(s) => gcra::settled_at_ms(s),
            State::InFlight(s) => in_flight::settled_at_ms(s),
            State::Reserved(r) => r.settled_at_ms(),
        }
    }
}

/// What one request asks of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demand {
    pub algorithm: Algorithm,
    pub params: BucketParams,
    /// Hits to count (tokens to take), or to give back when `refund`. 0 checks without
    /// counting: allowed while one more hit would be.
    pub tokens: u64,
    /// Give `tokens` back (never below an empty count) instead of counting them. Never rejected.
    pub refund: bool,
    /// Shadow-mode rule: reported, never the reason a request is rejected.
    pub shadow: bool,
    /// Quota-mode rule: one of the request's quota demands passing is enough; the request is
    /// rejected for its quota demands only when every one of them fails. A quota demand that
    /// does not fit takes nothing from its key, even when the request is allowed.
    pub quota: bool,
    /// A lease take (token bucket and GCRA only; the windows ignore it): when `tokens` fit and
    /// are taken, also take up to this many more whole tokens, as many as the key holds, for the
    /// caller to spend locally. 0 is an exact take. Never makes a demand fit that would not.
    pub lease: u64,
    /// A `charge: always` take: its `tokens` are counted whether or not they fit and whether or
    /// not the request is allowed, so the key may go into debt. Its verdict still says whether
    /// it fit. Never leased (`lease` is 0).
    pub always: bool,
    /// An in-flight cap's holder ([`in_flight::holder_id`] of the holder entry's value); 0 for
    /// the other algorithms, which ignore it.
    pub holder: u64,
}

impl Demand {
    /// A take of `tokens` hits by `algorithm` (0: a check that counts nothing): counted when it
    /// fits and the request is allowed, with every other field at its plain value (no refund,
    /// shadow, quota, lease, always-charge or holder). Set the others with struct update syntax.
    pub const fn take(algorithm: Algorithm, params: BucketParams, tokens: u64) -> Demand {
        Demand {
            algorithm,
            params,
            tokens,
            refund: false,
            shadow: false,
            quota: false,
            lease: 0,
            always: false,
            holder: 0,
        }
    }
}

/// The answer for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// This key alone could take the demand (always true for a refund). The request as a whole
    /// is allowed by [`allows`] over the keys' verdicts.
    pub allowed: bool,
    /// Hits that would still be allowed right now, after this request (whole, rounded down).
    pub remaining: u64,
    /// 0 when allowed; otherwise ms until the demand would be allowed (rounded up, the exact
    /// first millisecond); `None` when the demand exceeds the limit and never can be met.
    pub retry_after_ms: Option<u64>,
    /// ms until the limit resets (Envoy's `duration_until_reset`): the bucket is full again, the
    /// fixed window ends (in whole seconds, as envoyproxy/ratelimit reports it), nothing is left
    /// in the sliding windows, the arrival time has passed.
    pub until_full_ms: u64,
    /// Tokens this call took from the key: `tokens` plus the extra a lease take got, or 0 when
    /// nothing was taken (a rejected request, a refund, a check-only demand). For an in-flight
    /// cap: 1 for a slot taken, or freed by its holder's release.
    pub granted: u64,
}

/// `retry_after_ms` value the backends use on the wire for "never" (cost above capacity).
pub const NEVER: u64 = u64::MAX;

/// Decides one request over its keys (distinct), whatever their algorithms, and updates
/// `states` in place: `states[i]` belongs to `demands[i]`, and on return every entry is `Some`
/// (the state to store). A state of another algorithm than its demand's is read as no state.
pub fn decide(now_ms: u64, demands: &[Demand], states: &mut [Option<State>]) -> Vec<Verdict> {
    assert_eq!(demands.len(), states.len(), "one state per demand");
    let demands = settle_reservations(now_ms, demands, states);
    let current: Vec<(Current, bool)> = demands
        .iter()
        .zip(states.iter())
        .map(|(demand, state)| refresh(*state, now_ms, demand))
        .collect();
    let allowed = allows(
        demands
            .iter()
            .zip(&current)
            .map(|(d, (_, fits))| (d, *fits)),
    );
    let takes: Vec<bool> = demands
        .iter()
        .zip(&current)
        .map(|(d, (_, fits))| !d.refund && (d.always || (allowed && *fits)))
        .collect();
    demands
        .iter()
        .zip(states.iter_mut())
        .zip(current)
        .enumerate()
        .map(|(i, ((demand, slot), (state, fits)))| {
            // A ledger records what its bucket, the next demand, took.
            let take = match state {
                Current::Reserved(_) => takes.get(i + 1).copied().unwrap_or(false),
                _ => takes[i],
            };
            let (after, verdict) = settle(state, now_ms, demand, fits, take);
            *slot = Some(after);
            verdict
        })
        .collect()
}

/// The demands as decided: where a ledger holds a live reservation, the bucket after it is
/// settled against it ([`reservation::settlement`]).
fn settle_reservations<'a>(
    now_ms: u64,
    demands: &'a [Demand],
    states: &[Option<State>],
) -> std::borrow::Cow<'a, [Demand]> {
    if !demands
        .iter()
        .any(|d| d.algorithm == Algorithm::Reservation)
    {
        return std::borrow::Cow::Borrowed(demands);
    }
    let mut settled = demands.to_vec();
    for i in 0..settled.len().saturating_sub(1) {
        if settled[i].algorithm != Algorithm::Reservation {
            continue;
        }
        let live = match states[i] {
            Some(State::Reserved(r)) => r.live(now_ms),
            _ => 0,
        };
        if live > 0 {
            settled[i + 1] = reservation::settlement(&settled[i + 1], live);
        }
    }
    std::borrow::Cow::Owned(settled)
}

/// Whether a request is allowed, given each demand and whether it fits: every ordinary demand
/// passes, and one quota demand does if there are any (a demand passes when it fits or is in
/// shadow mode, whose status never says over limit). The rule of envoyproxy/ratelimit's
/// `quota_mode`: OVER_LIMIT when an ordinary descriptor is over, or when every quota descriptor
/// is.
pub fn allows<'a>(demands: impl IntoIterator<Item = (&'a Demand, bool)>) -> bool {
    let (mut quota_seen, mut quota_passed) = (false, false);
    for (demand, fits) in demands {
        let passes = demand.shadow || fits;
        if demand.quota {
            quota_seen = true;
            quota_passed |= passes;
        } else if !passes {
            return false;
        }
    }
    !quota_seen || quota_passed
}

/// A key's state brought to `now`, between the two phases.
enum Current {
    TokenBucket(BucketState),
    FixedWindow(WindowState),
    SlidingWindow(SlidingState),
    /// GCRA's backlog: how far the theoretical arrival time is ahead of now, in ms.
    Gcra(f64),
    InFlight(Slots),
    /// A ledger's live reservation (0: none).
    Reserved(u64),
}

/// Phase one: the state as of `now`, and whether the demand fits it.
fn refresh(state: Option<State>, now_ms: u64, demand: &Demand) -> (Current, bool) {
    let p = &demand.params;
    match demand.algorithm {
        Algorithm::TokenBucket => {
            let own = match state {
                Some(State::TokenBucket(s)) => Some(s),
                _ => None,
            };
            let (tokens, updated_ms) = token_bucket::refill(own, now_ms, p);
            let s = BucketState { tokens, updated_ms };
            (Current::TokenBucket(s), token_bucket::fits(&s, demand))
        }
        Algorithm::FixedWindow => {
            let own = match state {
                Some(State::FixedWindow(s)) => Some(s),
                _ => None,
            };
            let s = fixed_window::current(own, now_ms, p);
            (Current::FixedWindow(s), fixed_window::fits(&s, demand))
        }
        Algorithm::SlidingWindow => {
            let own = match state {
                Some(State::SlidingWindow(s)) => Some(s),
                _ => None,
            };
            let s = sliding_window::current(own, now_ms, p);
            let fits = sliding_window::fits(&s, now_ms, demand);
            (Current::SlidingWindow(s), fits)
        }
        Algorithm::Gcra => {
            let own = match state {
                Some(State::Gcra(s)) => Some(s),
                _ => None,
            };
            let backlog = gcra::backlog(own, now_ms);
            (Current::Gcra(backlog), gcra::fits(backlog, demand))
        }
        Algorithm::InFlight => {
            let own = match state {
                Some(State::InFlight(s)) => s,
                _ => Slots::default(),
            };
            (Current::InFlight(own), in_flight::fits(&own, demand))
        }
        Algorithm::Reservation => {
            let live = match state {
                Some(State::Reserved(r)) => r.live(now_ms),
                _ => 0,
            };
            (Current::Reserved(live), true)
        }
    }
}

/// Phase two: apply the demand (`take` only when the whole request is allowed; for a ledger,
/// whether its bucket took) and answer.
fn settle(
    current: Current,
    now_ms: u64,
    demand: &Demand,
    fits: bool,
    take: bool,
) -> (State, Verdict) {
    match current {
        Current::TokenBucket(s) => {
            let (s, v) = token_bucket::settle(s, demand, fits, take);
            (State::TokenBucket(s), v)
        }
        Current::FixedWindow(s) => {
            let (s, v) = fixed_window::settle(s, now_ms, demand, fits, take);
            (State::FixedWindow(s), v)
        }
        Current::SlidingWindow(s) => {
            let (s, v) = sliding_window::settle(s, now_ms, demand, fits, take);
            (State::SlidingWindow(s), v)
        }
        Current::Gcra(backlog) => {
            let (s, v) = gcra::settle(backlog, now_ms, demand, fits, take);
            (State::Gcra(s), v)
        }
        Current::InFlight(s) => {
            let (s, v) = in_flight::settle(s, now_ms, demand, fits, take);
            (State::InFlight(s), v)
        }
        Current::Reserved(found) => {
            let (r, v) = reservation::settle(found, now_ms, demand, take);
            (State::Reserved(r), v)
        }
    }
}

/// Hits a demand needs to fit: what it takes, and at least one (a check-only demand asks whether
/// one more hit would be allowed). A double, as the Lua computes it.
fn need(demand: &Demand) -> f64 {
    demand.tokens.max(1) as f64
}

/// Steps a search takes from its estimate. Estimates are off by at most one or two ms or hits
/// (the rounding of the doubles they are computed with), so four steps each way always reach
/// the exact answer; the bound only keeps the loop finite where doubles stop counting (values
/// beyond 2^53, where the answer saturates anyway).
const SEARCH_STEPS: usize = 4;

/// The smallest `d >= 1` near `guess` with `ok(d)`, for a monotone `ok` (false, then true
/// forever): the exact first millisecond at which a rejected demand fits. The same search runs in
/// `lua/limit.lua`.
fn first_fit(guess: f64, ok: impl Fn(f64) -> bool) -> f64 {
    let mut d = if guess >= 1.0 { guess } else { 1.0 };
    for _ in 0..SEARCH_STEPS {
        if ok(d) {
            break;
        }
        d += 1.0;
    }
    for _ in 0..SEARCH_STEPS {
        if d > 1.0 && ok(d - 1.0) {
            d -= 1.0;
        } else {
            break;
        }
    }
    d
}

/// The largest `n` in `0..=cap` near `guess` with `ok(n)`, for an `ok` that holds up to some `n`
/// and not beyond: how many hits would still fit right now.
fn most_that_fit(guess: f64, cap: f64, ok: impl Fn(f64) -> bool) -> f64 {
    let mut n = guess.floor();
    if n.is_nan() || n < 0.0 {
        n = 0.0;
    }
    if n > cap {
        n = cap;
    }
    for _ in 0..SEARCH_STEPS {
        if n > 0.0 && !ok(n) {
            n -= 1.0;
        } else {
            break;
        }
    }
    for _ in 0..SEARCH_STEPS {
        if n < cap && ok(n + 1.0) {
            n += 1.0;
        } else {
            break;
        }
    }
    n
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests_debt;

#[cfg(test)]
mod tests;
