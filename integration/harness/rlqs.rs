//! A data-plane simulator for the Rate Limit Quota Service (RLQS): a client of
//! `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas` that behaves
//! as Envoy's `envoy.filters.http.rate_limit_quota` filter does, so tests can put several
//! "Envoys" in front of sluice without an Envoy binary.
//!
//! What it reproduces (Envoy's global RLQS client):
//! - The first request matched into an unknown bucket is decided by the `no_assignment`
//!   strategy and triggers an immediate report of that bucket alone: the subscription.
//! - Every reporting interval one message reports every tracked bucket: requests allowed and
//!   denied since the bucket's last report, and the time elapsed in whole seconds (Envoy drops
//!   the fraction, so it may be 0).
//! - The stream's first message carries the domain; later ones leave it empty.
//! - A quota assignment replaces the bucket's strategy. A token bucket starts full, except that
//!   an assignment identical to the current token bucket (max_tokens, tokens_per_fill,
//!   fill_interval) keeps the existing bucket and its tokens and only moves the expiry. The refill
//!   rate is tokens_per_fill / fill_interval in whole seconds, as Envoy computes it.
//!   `requests_per_time_unit` is not supported by Envoy: such an action is ignored (counted).
//! - `assignment_time_to_live` unset: no expiry; set: the assignment expires at receipt + ttl and
//!   the `expired` behaviour decides until the next assignment.
//! - An abandon action erases the bucket (its unreported usage too); the next request matched
//!   into it starts over in the no-assignment state and subscribes again.
//! - When the stream fails, assignments keep being enforced until they expire, and the next
//!   report opens a new stream.
//!
//! Actions for buckets the data plane does not track are ignored (counted), as Envoy ignores
//! them. Every decision reads Tokio's clock, so a test may pause or advance time.

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy as StrategyPb};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as ActionPb;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::QuotaAssignmentAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId as BucketIdPb, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as DurationPb, UInt32Value};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A bucket id as the filter's `bucket_id_builder` produces it. Key order does not matter to
/// Envoy; a BTreeMap makes equal ids equal values.
pub type BucketId = BTreeMap<String, String>;

/// A bucket id from `key=value` pairs.
pub fn bucket(pairs: &[(&str, &str)]) -> BucketId {
    pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// Envoy refuses a reporting interval of 100 ms or less.
const MIN_REPORTING_INTERVAL: Duration = Duration::from_millis(100);
/// How long opening a stream may take before the report it carries is counted lost: a dead
/// server must not stall the reporting loop for long.
const OPEN_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `close` waits for the server to end its half of the stream.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Granularity of the load helper: requests due since the last tick are issued together.
const LOAD_TICK: Duration = Duration::from_millis(5);

/// A token bucket as the RLQS `TokenBucket` message states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketSpec {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    /// As received; the refill uses its whole seconds only (see [`TokenBucketSpec::fill_rate`]).
    pub fill_interval: Duration,
}

impl TokenBucketSpec {
    /// Tokens per second as Envoy computes it: tokens_per_fill divided by the fill interval
    /// truncated to whole seconds. A sub-second interval truncates to 0 and the rate is
    /// unbounded (the bucket is full at every request): servers must send whole seconds.
    pub fn fill_rate(&self) -> f64 {
        match self.fill_interval.as_secs() {
            0 => f64::INFINITY,
            seconds => f64::from(self.tokens_per_fill) / seconds as f64,
        }
    }

    fn from_proto(bucket: &TokenBucket) -> Self {
        Self {
            max_tokens: bucket.max_tokens,
            // The proto documents an unset tokens_per_fill as a single token.
            tokens_per_fill: bucket.tokens_per_fill.map_or(1, |fill| fill.value),
            fill_interval: bucket.fill_interval.map_or(Duration::ZERO, to_std),
        }
    }

    fn to_proto(self) -> TokenBucket {
        TokenBucket {
            max_tokens: self.max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: self.tokens_per_fill,
            }),
            fill_interval: Some(to_proto_duration(self.fill_interval)),
        }
    }
}

/// A rate-limit strategy the simulator can enforce (Envoy's `RateLimitStrategy` without
/// `requests_per_time_unit`, which Envoy does not implement).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    AllowAll,
    DenyAll,
    TokenBucket(TokenBucketSpec),
}

impl Strategy {
    /// The strategy an assignment carries; None for one Envoy cannot enforce (unset, an unknown
    /// blanket rule, or requests_per_time_unit).
    fn from_proto(strategy: Option<&RateLimitStrategy>) -> Option<Self> {
        match strategy?.strategy.as_ref()? {
            StrategyPb::BlanketRule(rule) => match BlanketRule::try_from(*rule).ok()? {
                BlanketRule::AllowAll => Some(Self::AllowAll),
                BlanketRule::DenyAll => Some(Self::DenyAll),
            },
            StrategyPb::TokenBucket(bucket) => {
                Some(Self::TokenBucket(TokenBucketSpec::from_proto(bucket)))
            }
            StrategyPb::RequestsPerTimeUnit(_) => None,
        }
    }

    /// The `RateLimitStrategy` message for this strategy (for fake servers in tests).
    pub fn to_proto(self) -> RateLimitStrategy {
        let strategy = match self {
            Self::AllowAll => StrategyPb::BlanketRule(BlanketRule::AllowAll as i32),
            Self::DenyAll => StrategyPb::BlanketRule(BlanketRule::DenyAll as i32),
            Self::TokenBucket(spec) => StrategyPb::TokenBucket(spec.to_proto()),
        };
        RateLimitStrategy {
            strategy: Some(strategy),
        }
    }
}

/// What decides once an assignment has expired (the filter's `expired_assignment_behavior`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpiredBehavior {
    /// Decide with this strategy (a token bucket starts full when the assignment expires).
    Fallback(Strategy),
    /// Keep enforcing the expired assignment, token bucket state included.
    ReuseLastAssignment,
}

/// The per-bucket settings of the filter, shared by every bucket of this data plane.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// More than 100 ms, as Envoy's config validation requires.
    pub reporting_interval: Duration,
    pub no_assignment: Strategy,
    pub expired: ExpiredBehavior,
}

impl Default for Settings {
    /// Envoy's defaults where it has them (no assignment: allow all), reporting every second,
    /// and allow all after expiry.
    fn default() -> Self {
        Self {
            reporting_interval: Duration::from_secs(1),
            no_assignment: Strategy::AllowAll,
            expired: ExpiredBehavior::Fallback(Strategy::AllowAll),
        }
    }
}

/// What currently decides a bucket's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AssignmentKind {
    /// Subscribed, no assignment received yet: the no-assignment strategy decides.
    NoAssignment,
    AllowAll,
    DenyAll,
    TokenBucket(TokenBucketSpec),
    /// The last assignment's time to live ran out: the expired behaviour decides.
    Expired,
}

/// What happened to one bucket over the data plane's life. Survives abandons (the bucket's
/// enforcement state does not).
#[derive(Clone, Debug, Default)]
pub struct BucketStats {
    pub admitted: u64,
    pub denied: u64,
    /// When each admitted request was decided, in order.
    pub admitted_at: Vec<Instant>,
    /// Immediate reports sent because a request found the bucket untracked.
    pub subscriptions: u64,
    pub assignments: u64,
    pub abandons: u64,
}

impl BucketStats {
    /// Admitted requests decided in `[from, to)`.
    pub fn admitted_between(&self, from: Instant, to: Instant) -> u64 {
        let start = self.admitted_at.partition_point(|at| *at < from);
        let end = self.admitted_at.partition_point(|at| *at < to);
        end.saturating_sub(start) as u64
    }

    /// The most requests admitted within any closed window of length `span`: what a bound
    /// "at most C + r·T over any span T" is checked against.
    pub fn max_admitted_within(&self, span: Duration) -> u64 {
        let times = &self.admitted_at;
        let mut best = 0;
        let mut end = 0;
        for (start, first) in times.iter().enumerate() {
            let limit = *first + span;
            end = end.max(start);
            while end < times.len() && times[end] <= limit {
                end += 1;
            }
            best = best.max(end - start);
        }
        best as u64
    }
}

/// Stream-level counts of one data plane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub streams_opened: u64,
    /// Streams that ended or failed other than by `close`, and opens that failed.
    pub stream_failures: u64,
    /// Report messages handed to an open stream (subscriptions included).
    pub reports_sent: u64,
    /// Reports built while no stream could be opened: their counts are gone, as in Envoy.
    pub reports_lost: u64,
    pub assignments: u64,
    pub abandons: u64,
    /// Actions without a bucket id or action, for untracked buckets, or with a strategy Envoy
    /// cannot enforce.
    pub ignored_actions: u64,
}

/// Requests offered by [`DataPlane::offer`] and how they were decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    pub offered: u64,
    pub admitted: u64,
    pub denied: u64,
}

/// A local token bucket as Envoy's TokenBucketImpl keeps it: starts full, refills continuously.
#[derive(Debug)]
struct LocalBucket {
    spec: TokenBucketSpec,
    tokens: f64,
    refilled_at: Instant,
}

impl LocalBucket {
    fn full(spec: TokenBucketSpec, now: Instant) -> Self {
        Self {
            spec,
            tokens: f64::from(spec.max_tokens),
            refilled_at: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let max = f64::from(self.spec.max_tokens);
        let rate = self.spec.fill_rate();
        if rate.is_infinite() {
            self.tokens = max;
        } else {
            let elapsed = now
                .saturating_duration_since(self.refilled_at)
                .as_secs_f64();
            self.tokens = (self.tokens + elapsed * rate).min(max);
        }
        self.refilled_at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// A strategy with its state.
#[derive(Debug)]
enum Decider {
    Allow,
    Deny,
    Bucket(LocalBucket),
}

impl Decider {
    fn new(strategy: Strategy, now: Instant) -> Self {
        match strategy {
            Strategy::AllowAll => Self::Allow,
            Strategy::DenyAll => Self::Deny,
            Strategy::TokenBucket(spec) => Self::Bucket(LocalBucket::full(spec, now)),
        }
    }

    fn decide(&mut self, now: Instant) -> bool {
        match self {
            Self::Allow => true,
            Self::Deny => false,
            Self::Bucket(bucket) => bucket.take(now),
        }
    }
}

#[derive(Debug)]
struct Assignment {
    strategy: Strategy,
    decider: Decider,
    expires_at: Option<Instant>,
}

impl Assignment {
    fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|at| now >= at)
    }
}

/// A bucket in the data plane's cache: erased by an abandon.
#[derive(Debug)]
struct Tracked {
    no_assignment: Decider,
    assignment: Option<Assignment>,
    /// The expired behaviour's fallback, created at the first decision after expiry.
    expired_fallback: Option<Decider>,
    allowed_since_report: u64,
    denied_since_report: u64,
    reported_at: Instant,
}

impl Tracked {
    fn new(settings: &Settings, now: Instant) -> Self {
        Self {
            no_assignment: Decider::new(settings.no_assignment, now),
            assignment: None,
            expired_fallback: None,
            allowed_since_report: 0,
            denied_since_report: 0,
            reported_at: now,
        }
    }

    fn kind(&self, now: Instant) -> AssignmentKind {
        match &self.assignment {
            None => AssignmentKind::NoAssignment,
            Some(assignment) if assignment.expired(now) => AssignmentKind::Expired,
            Some(assignment) => match assignment.strategy {
                Strategy::AllowAll => AssignmentKind::AllowAll,
                Strategy::DenyAll => AssignmentKind::DenyAll,
                Strategy::TokenBucket(spec) => AssignmentKind::TokenBucket(spec),
            },
        }
    }

    fn decide(&mut self, expired: ExpiredBehavior, now: Instant) -> bool {
        let allowed = match &mut self.assignment {
            None => self.no_assignment.decide(now),
            Some(assignment) if assignment.expired(now) => match expired {
                ExpiredBehavior::ReuseLastAssignment => assignment.decider.decide(now),
                ExpiredBehavior::Fallback(strategy) => self
                    .expired_fallback
                    .get_or_insert_with(|| Decider::new(strategy, now))
                    .decide(now),
            },
            Some(assignment) => assignment.decider.decide(now),
        };
        if allowed {
            self.allowed_since_report += 1;
        } else {
            self.denied_since_report += 1;
        }
        allowed
    }

    fn assign(&mut self, strategy: Strategy, expires_at: Option<Instant>, now: Instant) {
        self.expired_fallback = None;
        if let Some(current) = &mut self.assignment
            && matches!(strategy, Strategy::TokenBucket(_))
            && current.strategy == strategy
        {
            current.expires_at = expires_at;
            return;
        }
        self.assignment = Some(Assignment {
            strategy,
            decider: Decider::new(strategy, now),
            expires_at,
        });
    }

    /// The bucket's usage since its last report; starts the next period.
    fn usage(&mut self, id: &BucketId, now: Instant) -> BucketQuotaUsage {
        let elapsed = now.saturating_duration_since(self.reported_at);
        let usage = BucketQuotaUsage {
            bucket_id: Some(to_proto_id(id)),
            time_elapsed: Some(DurationPb {
                seconds: i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            num_requests_allowed: self.allowed_since_report,
            num_requests_denied: self.denied_since_report,
        };
        self.allowed_since_report = 0;
        self.denied_since_report = 0;
        self.reported_at = now;
        usage
    }
}

#[derive(Default)]
struct State {
    tracked: BTreeMap<BucketId, Tracked>,
    stats: BTreeMap<BucketId, BucketStats>,
    counters: Counters,
}

struct Shared {
    settings: Settings,
    state: Mutex<State>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("data plane state lock")
    }

    fn periodic_report(&self, now: Instant) -> Vec<BucketQuotaUsage> {
        let mut state = self.lock();
        state
            .tracked
            .iter_mut()
            .map(|(id, tracked)| tracked.usage(id, now))
            .collect()
    }

    /// The subscription of a bucket a request just created; empty if an abandon erased it
    /// again before the report went out.
    fn subscription_report(&self, id: &BucketId, now: Instant) -> Vec<BucketQuotaUsage> {
        let mut state = self.lock();
        state
            .tracked
            .get_mut(id)
            .map(|tracked| vec![tracked.usage(id, now)])
            .unwrap_or_default()
    }

    fn apply(&self, response: RateLimitQuotaResponse, now: Instant) {
        let mut state = self.lock();
        let state = &mut *state;
        for action in response.bucket_action {
            let id: Option<BucketId> = action.bucket_id.map(|id| id.bucket.into_iter().collect());
            let applied = match (id, action.bucket_action) {
                (Some(id), Some(ActionPb::AbandonAction(_))) => {
                    let erased = state.tracked.remove(&id).is_some();
                    if erased {
                        state.counters.abandons += 1;
                        state.stats.entry(id).or_default().abandons += 1;
                    }
                    erased
                }
                (Some(id), Some(ActionPb::QuotaAssignmentAction(assignment))) => {
                    assign(state, id, &assignment, now)
                }
                _ => false,
            };
            if !applied {
                state.counters.ignored_actions += 1;
            }
        }
    }
}

/// Applies an assignment to a tracked bucket; false if it cannot be applied.
fn assign(state: &mut State, id: BucketId, action: &QuotaAssignmentAction, now: Instant) -> bool {
    let Some(tracked) = state.tracked.get_mut(&id) else {
        return false;
    };
    let Some(strategy) = Strategy::from_proto(action.rate_limit_strategy.as_ref()) else {
        return false;
    };
    let expires_at = action.assignment_time_to_live.map(|ttl| now + to_std(ttl));
    tracked.assign(strategy, expires_at, now);
    state.counters.assignments += 1;
    state.stats.entry(id).or_default().assignments += 1;
    true
}

/// One simulated Envoy: a stream to an RLQS server, a bucket cache, local enforcement.
///
/// Dropping it without [`DataPlane::close`] is a crash: the reporting task is aborted and its
/// connections are closed with the stream still open, as when an Envoy process dies.
pub struct DataPlane {
    shared: Arc<Shared>,
    /// Dropped with the data plane: every connection of [`DataPlane::connect`] then fails.
    _alive: watch::Sender<()>,
    subscribe: mpsc::UnboundedSender<BucketId>,
    close: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl DataPlane {
    /// A data plane for `domain` reporting to the RLQS server at `addr` (plaintext HTTP/2).
    /// The stream opens with the first report. Call inside a Tokio runtime.
    pub fn connect(addr: SocketAddr, domain: &str, settings: Settings) -> Self {
        Self::connect_any(&[addr], domain, settings)
    }

    /// As [`DataPlane::connect`], to the first of `addrs` that accepts a connection, tried in
    /// order each time a connection is opened: as an Envoy whose RLQS cluster lists several
    /// sluice replicas, a data plane whose replica died opens its next stream on another one.
    pub fn connect_any(addrs: &[SocketAddr], domain: &str, settings: Settings) -> Self {
        let first = *addrs.first().expect("at least one RLQS server address");
        let (alive, watched) = watch::channel(());
        let channel = Endpoint::from_shared(format!("http://{first}"))
            .expect("a loopback address is a valid URI")
            .connect_timeout(OPEN_TIMEOUT)
            .connect_with_connector_lazy(Connector {
                addrs: addrs.into(),
                watched,
            });
        Self::start(channel, alive, domain, settings)
    }

    /// As [`DataPlane::connect`], over a channel the caller built (e.g. with TLS). A crash then
    /// aborts the reporting task only; the channel's connections close when it is dropped.
    pub fn over(channel: Channel, domain: &str, settings: Settings) -> Self {
        Self::start(channel, watch::channel(()).0, domain, settings)
    }

    fn start(channel: Channel, alive: watch::Sender<()>, domain: &str, settings: Settings) -> Self {
        assert!(
            settings.reporting_interval > MIN_REPORTING_INTERVAL,
            "Envoy requires a reporting interval above {MIN_REPORTING_INTERVAL:?}"
        );
        assert!(!domain.is_empty(), "the RLQS domain must not be empty");
        let shared = Arc::new(Shared {
            settings,
            state: Mutex::new(State::default()),
        });
        let (subscribe, subscriptions) = mpsc::unbounded_channel();
        let (close, closed) = oneshot::channel();
        let reporter = Reporter {
            shared: Arc::clone(&shared),
            client: RateLimitQuotaServiceClient::new(channel),
            domain: domain.to_string(),
            stream: None,
        };
        let task = tokio::spawn(reporter.run(subscriptions, closed));
        Self {
            shared,
            _alive: alive,
            subscribe,
            close: Some(close),
            task: Some(task),
        }
    }

    /// Decides one request matched into `bucket` now, as the filter would, and counts it.
    pub fn try_request(&self, bucket: &BucketId) -> bool {
        assert!(
            !bucket.is_empty() && bucket.iter().all(|(k, v)| !k.is_empty() && !v.is_empty()),
            "a BucketId needs at least one entry, with non-empty keys and values"
        );
        let settings = self.shared.settings;
        let mut state = self.shared.lock();
        // Read under the lock so admitted_at stays ordered across concurrent callers.
        let now = Instant::now();
        let state = &mut *state;
        let mut subscribed = false;
        let tracked = state.tracked.entry(bucket.clone()).or_insert_with(|| {
            subscribed = true;
            Tracked::new(&settings, now)
        });
        let allowed = tracked.decide(settings.expired, now);
        let stats = state.stats.entry(bucket.clone()).or_default();
        if allowed {
            stats.admitted += 1;
            stats.admitted_at.push(now);
        } else {
            stats.denied += 1;
        }
        if subscribed {
            stats.subscriptions += 1;
            // The reporter outlives every send unless the data plane is being dropped.
            let _ = self.subscribe.send(bucket.clone());
        }
        allowed
    }

    /// Offers requests for `bucket` at `per_second` for `duration` (evenly paced, in batches of
    /// a few milliseconds) and returns how they were decided.
    pub async fn offer(&self, bucket: &BucketId, per_second: f64, duration: Duration) -> Load {
        assert!(per_second > 0.0, "offered rate must be positive");
        let start = Instant::now();
        let mut ticker = tokio::time::interval(LOAD_TICK);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut load = Load::default();
        loop {
            ticker.tick().await;
            let elapsed = start.elapsed().min(duration);
            let due = (elapsed.as_secs_f64() * per_second) as u64;
            while load.offered < due {
                load.offered += 1;
                if self.try_request(bucket) {
                    load.admitted += 1;
                } else {
                    load.denied += 1;
                }
            }
            if elapsed >= duration {
                return load;
            }
        }
    }

    /// What decides `bucket`'s requests now; None if it is not tracked (never seen, or
    /// abandoned since).
    pub fn assignment(&self, bucket: &BucketId) -> Option<AssignmentKind> {
        let now = Instant::now();
        self.shared
            .lock()
            .tracked
            .get(bucket)
            .map(|tracked| tracked.kind(now))
    }

    /// Everything counted for `bucket` (zeros if never seen).
    pub fn stats(&self, bucket: &BucketId) -> BucketStats {
        self.shared
            .lock()
            .stats
            .get(bucket)
            .cloned()
            .unwrap_or_default()
    }

    /// Admitted requests of `bucket` decided in `[from, to)`.
    pub fn admitted_between(&self, bucket: &BucketId, from: Instant, to: Instant) -> u64 {
        let state = self.shared.lock();
        state
            .stats
            .get(bucket)
            .map_or(0, |stats| stats.admitted_between(from, to))
    }

    /// The buckets currently tracked (subscribed and not abandoned).
    pub fn tracked(&self) -> Vec<BucketId> {
        self.shared.lock().tracked.keys().cloned().collect()
    }

    pub fn counters(&self) -> Counters {
        self.shared.lock().counters
    }

    /// Polls `ready` every 10 ms of Tokio time; panics with `what` after `deadline`.
    pub async fn wait_until(
        &self,
        what: &str,
        deadline: Duration,
        mut ready: impl FnMut(&Self) -> bool,
    ) {
        let give_up = Instant::now() + deadline;
        while !ready(self) {
            assert!(
                Instant::now() < give_up,
                "timed out after {deadline:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Ends the stream cleanly: no more reports, the request half is closed and the server's
    /// end of the stream awaited (bounded).
    pub async fn close(mut self) {
        if let Some(close) = self.close.take() {
            let _ = close.send(());
        }
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
            && error.is_panic()
        {
            std::panic::resume_unwind(error.into_panic());
        }
    }

    /// Drops the data plane as a crashed Envoy would go: no clean end of stream.
    pub fn crash(self) {
        drop(self);
    }
}

impl Drop for DataPlane {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Connects plainly over TCP, wrapping each connection so that it fails once the data plane is
/// dropped. Without this, a crashed data plane's stream would stay open: the request half is
/// owned by the connection task, which outlives the reporting task.
#[derive(Clone)]
struct Connector {
    /// Tried in order; the first that accepts wins.
    addrs: Arc<[SocketAddr]>,
    watched: watch::Receiver<()>,
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Mortal>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let addrs = Arc::clone(&self.addrs);
        let mut watched = self.watched.clone();
        Box::pin(async move {
            let mut last_error = io::Error::from(io::ErrorKind::AddrNotAvailable);
            let mut connected = None;
            for addr in addrs.iter() {
                match TcpStream::connect(addr).await {
                    Ok(stream) => {
                        connected = Some(stream);
                        break;
                    }
                    Err(error) => last_error = error,
                }
            }
            let stream = connected.ok_or(last_error)?;
            stream.set_nodelay(true)?;
            let died = Box::pin(async move {
                // Nothing is ever sent: this returns when the sender (the data plane) is gone.
                while watched.changed().await.is_ok() {}
            });
            Ok(TokioIo::new(Mortal { stream, died }))
        })
    }
}

/// A connection that fails every read and write once its data plane is dropped.
struct Mortal {
    stream: TcpStream,
    died: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl Mortal {
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.died.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::ErrorKind::ConnectionAborted.into()),
            Poll::Pending => Ok(()),
        }
    }
}

impl AsyncRead for Mortal {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Mortal {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What the reporter queues on a stream's request half.
enum Outbound {
    Report(RateLimitQuotaUsageReports),
    /// Ends the request half cleanly (`close`). Without it the request half never ends, so a
    /// crash resets the stream instead of ending it.
    HalfClose,
}

struct OpenStream {
    outbound: mpsc::UnboundedSender<Outbound>,
    inbound: tonic::Streaming<RateLimitQuotaResponse>,
}

/// The background half of a data plane: reports, opens streams, applies responses.
struct Reporter {
    shared: Arc<Shared>,
    client: RateLimitQuotaServiceClient<Channel>,
    domain: String,
    stream: Option<OpenStream>,
}

impl Reporter {
    async fn run(
        mut self,
        mut subscriptions: mpsc::UnboundedReceiver<BucketId>,
        mut closed: oneshot::Receiver<()>,
    ) {
        let interval = self.shared.settings.reporting_interval;
        let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut closed => {
                    self.close().await;
                    return;
                }
                _ = ticker.tick() => {
                    let usages = self.shared.periodic_report(Instant::now());
                    self.send(usages).await;
                }
                Some(id) = subscriptions.recv() => {
                    let usages = self.shared.subscription_report(&id, Instant::now());
                    self.send(usages).await;
                }
                message = next_response(&mut self.stream) => match message {
                    Some(Ok(response)) => self.shared.apply(response, Instant::now()),
                    // The server ended or broke the stream: enforcement goes on with what was
                    // assigned, and the next report opens a new stream.
                    Some(Err(_)) | None => {
                        self.stream = None;
                        self.shared.lock().counters.stream_failures += 1;
                    }
                },
            }
        }
    }

    /// Sends one report message, opening a stream first if none is open (the first message of
    /// a stream names the domain). An empty report is not sent: the proto requires one usage.
    async fn send(&mut self, usages: Vec<BucketQuotaUsage>) {
        if usages.is_empty() {
            return;
        }
        if let Some(stream) = &self.stream {
            let report = RateLimitQuotaUsageReports {
                domain: String::new(),
                bucket_quota_usages: usages,
            };
            if stream.outbound.send(Outbound::Report(report)).is_ok() {
                self.shared.lock().counters.reports_sent += 1;
                return;
            }
            // The request half is gone; the inbound branch notices the end of the stream.
            self.shared.lock().counters.reports_lost += 1;
            return;
        }
        let (outbound, requests) = mpsc::unbounded_channel();
        let first = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages,
        };
        outbound
            .send(Outbound::Report(first))
            .expect("the receiver is held below");
        let requests = UnboundedReceiverStream::new(requests)
            .chain(tokio_stream::pending())
            .map_while(|message| match message {
                Outbound::Report(report) => Some(report),
                Outbound::HalfClose => None,
            });
        let opened =
            tokio::time::timeout(OPEN_TIMEOUT, self.client.stream_rate_limit_quotas(requests))
                .await;
        let mut state = self.shared.lock();
        match opened {
            Ok(Ok(response)) => {
                state.counters.streams_opened += 1;
                state.counters.reports_sent += 1;
                self.stream = Some(OpenStream {
                    outbound,
                    inbound: response.into_inner(),
                });
            }
            Ok(Err(_)) | Err(_) => {
                state.counters.stream_failures += 1;
                state.counters.reports_lost += 1;
            }
        }
    }

    /// Half-closes the stream and reads the server's remaining responses until it ends it.
    async fn close(&mut self) {
        let Some(OpenStream { outbound, inbound }) = self.stream.take() else {
            return;
        };
        let _ = outbound.send(Outbound::HalfClose);
        let shared = Arc::clone(&self.shared);
        let drain = async move {
            let mut inbound = inbound;
            while let Some(Ok(response)) = inbound.next().await {
                shared.apply(response, Instant::now());
            }
        };
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, drain).await;
    }
}

/// The next response of the open stream; never resolves while none is open.
async fn next_response(
    stream: &mut Option<OpenStream>,
) -> Option<Result<RateLimitQuotaResponse, tonic::Status>> {
    match stream {
        Some(stream) => stream.inbound.next().await,
        None => std::future::pending().await,
    }
}

/// The proto form of a bucket id.
pub fn to_proto_id(id: &BucketId) -> BucketIdPb {
    BucketIdPb {
        bucket: id.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

fn to_std(duration: DurationPb) -> Duration {
    // Negative durations are invalid in these messages; they count as zero.
    Duration::new(
        u64::try_from(duration.seconds).unwrap_or(0),
        u32::try_from(duration.nanos).unwrap_or(0),
    )
}

fn to_proto_duration(duration: Duration) -> DurationPb {
    DurationPb {
        seconds: i64::try_from(duration.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(duration.subsec_nanos()).expect("below one billion"),
    }
}
