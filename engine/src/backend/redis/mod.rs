//! The Redis backend: one atomic Lua script call per request (per slot in Cluster mode).
//!
//! Every replica runs `lua/limit.lua`, which decides every key of a request (token buckets,
//! windows, GCRA alike) against Redis's own `TIME`, so the limit is one limit however many
//! replicas share the server. The script is loaded with
//! `SCRIPT LOAD` at start (on every master in Cluster mode) and called with `EVALSHA`; a
//! `NOSCRIPT` reply (restart, failover, `SCRIPT FLUSH`) costs one `EVAL`, which re-caches it.
//!
//! Connections are multiplexed: a [`ConnectionManager`] that reconnects on its own
//! (standalone), one connection per master routed by sluice's own view of the slot map, which
//! follows MOVED, ASK and TRYAGAIN itself (Cluster, `cluster.rs`), or a master resolved through
//! the sentinels and re-resolved after errors so a failover is followed (Sentinel). Every call is
//! bounded by [`RedisOptions::command_timeout`] and goes through the circuit breaker of its
//! endpoint ([`crate::backend::breaker`]): the server in standalone mode, the current master in
//! Sentinel mode, the node owning the slot in Cluster mode. An open
//! breaker fails the call at once with [`BackendError::CircuitOpen`].
//!
//! In Cluster mode the hits of one slot are decided atomically together; hits in different
//! slots are separate calls (issued concurrently), each all-or-nothing on its own. Keys of one
//! request that share domain and first entry share a hash tag, hence a slot.

mod batch;
mod cluster;
mod heartbeat;
mod inspect;
mod observer;
mod script;
mod sentinel;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, ServerErrorKind};
use tracing::Instrument as _;

use crate::algorithm::{BucketParams, Verdict};
use crate::backend::breaker::{BreakerSet, BreakerSettings, Endpoint};
use crate::backend::{Backend, BackendError, Hit, KeyPeek};
use crate::clock::{MonotonicClock, SharedClock};

pub use self::batch::BatchSettings;
use self::batch::Batcher;
use self::cluster::ClusterLink;
use self::observer::SharedObserver;
pub use self::observer::{RedisObserver, Unobserved};
use self::sentinel::SentinelLink;

/// How sluice finds its Redis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RedisMode {
    /// One server (or a proxy); exactly one URL.
    #[default]
    Standalone,
    /// Redis Cluster; the URLs are seed nodes, the topology is discovered.
    Cluster,
    /// The URLs are sentinels; [`RedisOptions::sentinel_master`] names the monitored master.
    Sentinel,
}

impl RedisMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            RedisMode::Standalone => "standalone",
            RedisMode::Cluster => "cluster",
            RedisMode::Sentinel => "sentinel",
        }
    }
}

impl std::fmt::Display for RedisMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Connection settings for [`RedisBackend::connect`]. `Debug` hides URL passwords.
#[derive(Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]`, `rediss://` for TLS. Credentials in the URL are
    /// sent with `AUTH` (ACL user or the default user); in Sentinel mode they are used for the
    /// sentinels and for the master alike.
    pub urls: Vec<String>,
    pub mode: RedisMode,
    /// Master name the sentinels monitor (Sentinel mode only).
    pub sentinel_master: Option<String>,
    /// Bound on establishing a connection: each startup step and each reconnect attempt.
    pub connect_timeout: Duration,
    /// Bound on one check (all of its round trips); well under Envoy's 20 ms filter timeout.
    pub command_timeout: Duration,
    /// When an endpoint's circuit breaker opens and for how long.
    pub breaker: BreakerSettings,
    /// Each call adds a random `0..expiry_jitter_max` to the TTL of the keys it writes, so keys
    /// written together (a fixed window's counters) do not all expire at once. Expiry only
    /// drops settled state, so the jitter never changes a decision. Zero: no jitter.
    pub expiry_jitter_max: Duration,
    /// How concurrent checks share script calls (standalone and Sentinel modes; Cluster calls
    /// go one per request and slot).
    pub batch: BatchSettings,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|url| redact(url)).collect();
        f.debug_struct("RedisOptions")
            .field("urls", &urls)
            .field("mode", &self.mode)
            .field("sentinel_master", &self.sentinel_master)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("breaker", &self.breaker)
            .field("expiry_jitter_max", &self.expiry_jitter_max)
            .field("batch", &self.batch)
            .finish()
    }
}

/// `scheme://user:secret@host` → `scheme://user:***@host`, for logs.
fn redact(url: &str) -> String {
    let Some(authority_at) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[authority_at..]
        .find('/')
        .map_or(url.len(), |i| authority_at + i);
    let authority = &url[authority_at..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let user = authority[..at].split(':').next().unwrap_or_default();
            let hidden = if authority[..at].contains(':') {
                ":***"
            } else {
                ""
            };
            format!(
                "{}{user}{hidden}{}{}",
                &url[..authority_at],
                &authority[at..],
                &url[authority_end..]
            )
        }
        None => url.to_string(),
    }
}

impl RedisOptions {
    pub const DEFAULT_URL: &'static str = "redis://127.0.0.1:6379";
    pub const DEFAULT_SENTINEL_MASTER: &'static str = "mymaster";
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
}

impl Default for RedisOptions {
    /// A standalone Redis on 127.0.0.1:6379, calls bounded by
    /// [`DEFAULT_CALL_DEADLINE`](crate::backend::DEFAULT_CALL_DEADLINE), breakers and batching
    /// at their defaults, no expiry jitter.
    fn default() -> Self {
        RedisOptions {
            urls: vec![Self::DEFAULT_URL.to_owned()],
            mode: RedisMode::Standalone,
            sentinel_master: Some(Self::DEFAULT_SENTINEL_MASTER.to_owned()),
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            command_timeout: crate::backend::DEFAULT_CALL_DEADLINE,
            breaker: BreakerSettings::default(),
            expiry_jitter_max: Duration::ZERO,
            batch: BatchSettings::default(),
        }
    }
}

/// Shared rate-limit state in Redis. Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct RedisBackend {
    link: Link,
    command_timeout: Duration,
    breakers: Arc<BreakerSet>,
    /// Exclusive upper bound of the per-call TTL jitter, ms (0: none).
    jitter_max_ms: u64,
    /// Test-only override of Redis's clock (see [`RedisBackend::with_test_clock`]).
    test_clock: Option<SharedClock>,
    /// Who is told about every call ([`RedisBackend::observed_by`]; nobody by default), shared
    /// with the batch workers.
    observer: SharedObserver,
}

#[derive(Clone)]
enum Link {
    /// The connection, its breaker, and the batch queue in front of it (none: batching off).
    Standalone(ConnectionManager, Endpoint, Option<Batcher>),
    Sentinel(Arc<SentinelLink>),
    Cluster(Arc<ClusterLink>),
}

/// Key of the bucket [`Backend::probe`] checks (check-only, so it never limits anything).
const PROBE_KEY: &str = "sluice:probe";

/// Reconnect backoff of the standalone connection: first retry soon (a restarted server is
/// back within a few hundred ms), then at most every half second, and never give up — a check
/// in the meantime fails by its own timeout and the failure policy answers.
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(10);
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(500);
const RECONNECT_ATTEMPTS: usize = usize::MAX;

impl RedisBackend {
    /// Connects and loads the script. Fails when the options are inconsistent or Redis cannot
    /// be reached within [`RedisOptions::connect_timeout`] per step.
    pub async fn connect(opts: RedisOptions) -> Result<RedisBackend, BackendError> {
        if opts.urls.is_empty() {
            return Err(config_error("no Redis URL given"));
        }
        let clock: SharedClock = Arc::new(MonotonicClock::new());
        let observer = SharedObserver::default();
        let breakers = BreakerSet::new(opts.breaker, clock.clone());
        let link = match opts.mode {
            RedisMode::Standalone => {
                let [url] = opts.urls.as_slice() else {
                    return Err(config_error("standalone mode takes exactly one Redis URL"));
                };
                let (manager, address) = connect_standalone(url, &opts).await?;
                let batcher = opts
                    .batch
                    .enabled()
                    .then(|| Batcher::start(manager.clone(), opts.batch, observer.clone()));
                Link::Standalone(manager, breakers.endpoint(&address), batcher)
            }
            RedisMode::Cluster => {
                Link::Cluster(ClusterLink::connect(&opts, breakers.clone(), clock).await?)
            }
            RedisMode::Sentinel => {
                let Some(master) = opts.sentinel_master.as_deref() else {
                    return Err(config_error("sentinel mode needs a sentinel master name"));
                };
                Link::Sentinel(
                    SentinelLink::connect(
                        &opts.urls,
                        master,
                        &opts,
                        breakers.clone(),
                        observer.clone(),
                    )
                    .await?,
                )
            }
        };
        Ok(RedisBackend {
            link,
            command_timeout: opts.command_timeout,
            breakers,
            jitter_max_ms: u64::try_from(opts.expiry_jitter_max.as_millis()).unwrap_or(u64::MAX),
            test_clock: None,
            observer,
        })
    }

    /// Reports every call (its span, latency, outcome, batch size) to `observer`. Set once, for
    /// this backend and its clones alike: a second observer is ignored.
    pub fn observed_by(self, observer: Arc<dyn RedisObserver>) -> Self {
        let _ = self.observer.set(observer);
        self
    }

    /// Refreshes this replica's heartbeat in the replica set at `key` and returns how many
    /// replicas are live (heard from within `ttl`); see `lua/heartbeat.lua`. Not subject to
    /// the breakers: it is background work, bounded by the command timeout.
    pub async fn heartbeat(
        &self,
        key: &str,
        member: &str,
        ttl: Duration,
    ) -> Result<u64, BackendError> {
        let cmd = heartbeat::command(key, member, ttl);
        let timeout = self.command_timeout;
        let beat = match &self.link {
            Link::Standalone(manager, _, _) => {
                let mut conn = manager.clone();
                bounded(timeout, heartbeat::run(&mut conn, &cmd)).await
            }
            Link::Sentinel(link) => link.heartbeat(&cmd, timeout).await,
            Link::Cluster(link) => link.heartbeat(key, &cmd, timeout).await,
        }?;
        if beat.repaired {
            report_repaired(observer::current(&self.observer), key);
        }
        Ok(beat.live)
    }

    /// Makes the script use `clock` instead of Redis's `TIME`, so a test can step time.
    /// Production never calls this: Redis's clock is the only clock.
    #[doc(hidden)]
    pub fn with_test_clock(mut self, clock: SharedClock) -> Self {
        self.test_clock = Some(clock);
        self
    }

    /// Decides `hits` with one outcome per hit (they differ only in Cluster mode, where each
    /// node answers or fails on its own). `timed`: the calls are a decision's, reported to the
    /// observer with their latency (a probe's are not).
    async fn decide_each(&self, hits: &[Hit], timed: bool) -> Vec<Result<Verdict, BackendError>> {
        if hits.is_empty() {
            return Vec::new();
        }
        let call = Call {
            deadline: Deadline::after(self.command_timeout),
            observer: observer::current(&self.observer),
            timed,
        };
        let args = script::CallArgs {
            now_ms: self.test_clock.as_ref().map(|clock| clock.now_ms()),
            jitter_ms: match self.jitter_max_ms {
                0 => 0,
                max => rand::random_range(0..max),
            },
            peek: false,
        };
        match &self.link {
            Link::Standalone(manager, endpoint, batcher) => spread(
                call.on_connection(endpoint, manager, batcher.as_ref(), hits, args)
                    .await,
                hits.len(),
            ),
            Link::Sentinel(link) => spread(link.check(hits, args, call).await, hits.len()),
            Link::Cluster(link) => link.check_each(hits, args, call).await,
        }
    }

    /// All-or-nothing: the verdicts, or the first failure.
    async fn decide(&self, hits: &[Hit], timed: bool) -> Result<Vec<Verdict>, BackendError> {
        self.decide_each(hits, timed).await.into_iter().collect()
    }
}

impl Backend for RedisBackend {
    fn check_each(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Vec<Result<Verdict, BackendError>>> + Send {
        self.decide_each(hits, true)
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    /// Runs the script itself on a check-only demand, so a lost script cache, a read-only
    /// replica or a refused `EVALSHA` (ACL) shows up, not just a dead socket. It goes through
    /// the breakers like any call, so while an endpoint is open the probe is the half-open
    /// call that closes it again once Redis answers, even with no traffic. In Cluster mode
    /// every master is probed.
    async fn probe(&self) -> Result<(), BackendError> {
        let keys = match &self.link {
            Link::Cluster(link) => link.probe_keys(),
            _ => vec![PROBE_KEY.to_string()],
        };
        let hits: Vec<Hit> = keys
            .into_iter()
            .map(|key| Hit::new(key, PROBE_PARAMS, 0))
            .collect();
        // A probe is not a decision: its calls are not timed or counted.
        self.decide(&hits, false).await.map(drop)
    }

    fn breakers(&self) -> Option<Arc<BreakerSet>> {
        Some(self.breakers.clone())
    }

    fn peek(
        &self,
        hits: &[Hit],
    ) -> impl Future<Output = Vec<Result<KeyPeek, BackendError>>> + Send {
        self.peek_each(hits)
    }

    fn reset(&self, hits: &[Hit]) -> impl Future<Output = Vec<Result<bool, BackendError>>> + Send {
        self.reset_each(hits)
    }
}

/// The probe's bucket: check-only, so it never limits anything.
const PROBE_PARAMS: BucketParams = BucketParams {
    capacity: 1,
    requests_per_unit: 1,
    unit_ms: 1_000,
};

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = match self.link {
            Link::Standalone(..) => RedisMode::Standalone,
            Link::Sentinel(_) => RedisMode::Sentinel,
            Link::Cluster(_) => RedisMode::Cluster,
        };
        f.debug_struct("RedisBackend")
            .field("mode", &mode)
            .field("command_timeout", &self.command_timeout)
            .field("breakers", &self.breakers)
            .field("jitter_max_ms", &self.jitter_max_ms)
            .field("test_clock", &self.test_clock.is_some())
            .finish()
    }
}

/// Connects to one server; returns the connection and the server's `host:port` (its breaker's
/// name).
async fn connect_standalone(
    url: &str,
    opts: &RedisOptions,
) -> Result<(ConnectionManager, String), BackendError> {
    let client = redis::Client::open(url).map_err(|err| invalid_url(0, &err))?;
    let address = client.get_connection_info().addr().to_string();

    // A first, plain connection loads the script and reports a refused port, a wrong password
    // or an untrusted certificate as such; the manager below would retry those quietly until
    // the deadline and leave only "timed out".
    let direct_config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(opts.connect_timeout))
        .set_response_timeout(None);
    let mut direct = bounded(opts.connect_timeout, async {
        client
            .get_multiplexed_async_connection_with_config(&direct_config)
            .await
            .map_err(classify)
    })
    .await?;
    let reply = bounded(opts.connect_timeout, async {
        script::load_command()
            .query_async::<redis::Value>(&mut direct)
            .await
            .map_err(classify)
    })
    .await?;
    script::check_loaded(&reply)?;
    drop(direct);

    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(opts.connect_timeout))
        // The caller bounds every call itself (command_timeout), including waits for a reconnect.
        .set_response_timeout(None)
        .set_min_delay(RECONNECT_MIN_DELAY)
        .set_max_delay(RECONNECT_MAX_DELAY)
        .set_number_of_retries(RECONNECT_ATTEMPTS);
    let mut manager = ConnectionManager::new_lazy_with_config(client, config).map_err(classify)?;
    // Connect now, so the first check does not pay for it.
    bounded(opts.connect_timeout, async {
        redis::cmd("PING")
            .query_async::<()>(&mut manager)
            .await
            .map_err(classify)
    })
    .await?;
    Ok((manager, address))
}

/// Decodes a whole reply into verdicts in hit order (`keys` are the call's keys, in order), and
/// reports the keys the script repaired.
fn collect<'k>(
    reply: &redis::Value,
    keys: impl ExactSizeIterator<Item = &'k str> + Clone,
    observer: &dyn RedisObserver,
) -> Result<Vec<Verdict>, BackendError> {
    let count = keys.len();
    let (decoded, repaired) = script::decode(reply, count)?;
    let mut verdicts = Vec::with_capacity(count);
    for verdict in decoded {
        verdicts.push(verdict?);
    }
    for at in repaired {
        if let Some(key) = keys.clone().nth(at) {
            report_repaired(observer, key);
        }
    }
    Ok(verdicts)
}

/// A key held foreign data (another type than sluice writes there) and a script replaced it:
/// that key's problem, logged and counted, never a failure of the call or of the endpoint.
fn report_repaired(observer: &dyn RedisObserver, key: &str) {
    tracing::warn!(
        key,
        "Redis key held data of another type; deleted and started afresh"
    );
    observer.key_repaired(key);
}

/// Runs `call` within `limit`; past it the call is dropped (a multiplexed connection discards the
/// late reply) and the check fails with [`BackendError::Timeout`].
async fn bounded<T>(
    limit: Duration,
    call: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(BackendError::Timeout(limit.as_millis() as u64)),
    }
}

/// The one deadline of a decision's Redis calls: set once, when the decision reaches the
/// backend (`command_timeout` from then), and shared by every step — the wait for a batch,
/// the batch's call, a Cluster node's call and its redirects — so no step restarts the clock.
/// Past it the call is dropped (a multiplexed connection discards the late reply) and the check
/// fails with [`BackendError::Timeout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Deadline {
    at: tokio::time::Instant,
    budget: Duration,
}

impl Deadline {
    fn after(budget: Duration) -> Deadline {
        Deadline {
            at: tokio::time::Instant::now() + budget,
            budget,
        }
    }

    async fn bound<T>(
        self,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        match tokio::time::timeout_at(self.at, call).await {
            Ok(result) => result,
            Err(_) => Err(BackendError::Timeout(self.budget.as_millis() as u64)),
        }
    }
}

/// What every Redis call of one decision shares: its deadline and who is told about it.
#[derive(Clone, Copy)]
struct Call<'a> {
    deadline: Deadline,
    observer: &'a dyn RedisObserver,
    /// A decision's call (reported with its latency), not a probe's.
    timed: bool,
}

impl Call<'_> {
    /// Runs `call` (the script over `keys` keys, on `endpoint`, in `slot` when known) through
    /// the endpoint's breaker and within the deadline: skipped at once while the breaker is
    /// open, and its outcome (a timeout is a failure) reported back. A call that is made is
    /// timed, counted and traced; a skipped one is none of these, as no Redis call happened.
    async fn guarded<T>(
        self,
        endpoint: &Endpoint,
        keys: usize,
        slot: Option<u16>,
        call: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        let Some(permit) = endpoint.admit() else {
            return Err(BackendError::CircuitOpen);
        };
        let span = self.observer.call_span(keys, endpoint.name(), slot);
        let result = observer::timed(self.observer, self.timed, self.deadline.bound(call))
            .instrument(span.clone())
            .await;
        if let Err(e) = &result {
            self.observer.call_failed(&span, e);
        }
        endpoint.record(permit, result.as_ref().map(drop));
        result
    }
}

impl Call<'_> {
    /// Decides one request on one connection, guarded (see [`Call::guarded`]): through the
    /// connection's batch queue when batching is on, else in a script call of its own. The
    /// standalone connection and Sentinel mode's master are both decided so.
    async fn on_connection<C: ConnectionLike + Clone>(
        self,
        endpoint: &Endpoint,
        conn: &C,
        batcher: Option<&Batcher>,
        hits: &[Hit],
        args: script::CallArgs,
    ) -> Result<Vec<Verdict>, BackendError> {
        if let Some(batcher) = batcher {
            return self
                .guarded(
                    endpoint,
                    hits.len(),
                    None,
                    batcher.check(hits, args, self.deadline),
                )
                .await;
        }
        let mut conn = conn.clone();
        self.guarded(endpoint, hits.len(), None, async move {
            let reply = script::run(&mut conn, hits.iter(), hits.len(), args)
                .await
                .map_err(classify)?;
            collect(&reply, hits.iter().map(|h| h.key.as_str()), self.observer)
        })
        .await
    }
}

/// One outcome for every hit of a call that decided them together.
fn spread(
    result: Result<Vec<Verdict>, BackendError>,
    count: usize,
) -> Vec<Result<Verdict, BackendError>> {
    match result {
        Ok(verdicts) => verdicts.into_iter().map(Ok).collect(),
        Err(error) => vec![Err(error); count],
    }
}

/// Maps a redis-rs error: the server cannot serve now → `Unavailable`; it answered something
/// sluice did not expect (script error, bad reply) → `Protocol`.
fn classify(err: RedisError) -> BackendError {
    match err.kind() {
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            BackendError::Protocol(err.to_string())
        }
        ErrorKind::Server(
            ServerErrorKind::ResponseError
            | ServerErrorKind::ExecAbort
            | ServerErrorKind::CrossSlot
            | ServerErrorKind::NotBusy
            | ServerErrorKind::NoSub,
        ) => BackendError::Protocol(err.to_string()),
        _ => BackendError::Unavailable(err.to_string()),
    }
}

/// True when an error means the current connection (or master) should be replaced.
fn is_connection_error(err: &BackendError) -> bool {
    matches!(err, BackendError::Unavailable(_))
}

fn config_error(message: &str) -> BackendError {
    BackendError::Unavailable(format!("Redis configuration: {message}"))
}

/// The URL itself is left out of the message: it may carry a password.
fn invalid_url(index: usize, err: &RedisError) -> BackendError {
    BackendError::Unavailable(format!("Redis URL #{} is invalid: {err}", index + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_separates_unavailable_from_protocol() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(classify(refused), BackendError::Unavailable(_)));
        let parse = RedisError::from((ErrorKind::Parse, "bad"));
        assert!(matches!(classify(parse), BackendError::Protocol(_)));
    }

    #[test]
    fn debug_hides_passwords() {
        let opts = RedisOptions {
            urls: vec![
                "redis://sluice:s3cret@10.0.0.1:6379/2".into(),
                "rediss://:s3cret@host".into(),
                "redis://host:6379".into(),
                "redis://user@host".into(),
            ],
            ..RedisOptions::default()
        };
        let text = format!("{opts:?}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(
            text.contains("redis://sluice:***@10.0.0.1:6379/2"),
            "{text}"
        );
        assert!(text.contains("rediss://:***@host"), "{text}");
        assert!(text.contains("redis://host:6379"), "{text}");
        assert!(text.contains("redis://user@host"), "{text}");
    }

    #[test]
    fn default_options_are_a_local_standalone_redis() {
        let opts = RedisOptions::default();
        assert_eq!(opts.urls, ["redis://127.0.0.1:6379"]);
        assert_eq!(opts.mode, RedisMode::Standalone);
        assert_eq!(opts.command_timeout, Duration::from_millis(15));
        assert_eq!(opts.connect_timeout, Duration::from_millis(250));
        assert_eq!(opts.breaker.min_failures, 10);
        assert_eq!(opts.breaker.cooldown, Duration::from_secs(1));
        assert_eq!(opts.batch.max_keys, 128);
        assert_eq!(opts.batch.in_flight, 2);
        assert_eq!(opts.expiry_jitter_max, Duration::ZERO);
    }

    #[tokio::test]
    async fn connect_rejects_inconsistent_options() {
        let none = RedisOptions {
            urls: Vec::new(),
            ..RedisOptions::default()
        };
        assert!(RedisBackend::connect(none).await.is_err());
        let two = RedisOptions {
            urls: vec!["redis://127.0.0.1:1".into(), "redis://127.0.0.1:2".into()],
            ..RedisOptions::default()
        };
        assert!(RedisBackend::connect(two).await.is_err());
        let nameless = RedisOptions {
            urls: vec!["redis://127.0.0.1:1".into()],
            mode: RedisMode::Sentinel,
            sentinel_master: None,
            ..RedisOptions::default()
        };
        assert!(RedisBackend::connect(nameless).await.is_err());
        let garbage = RedisOptions {
            urls: vec!["http://user:secret@host".into()],
            ..RedisOptions::default()
        };
        let err = RedisBackend::connect(garbage).await.unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
