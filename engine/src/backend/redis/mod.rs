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
mod call;
mod cluster;
mod heartbeat;
mod inspect;
mod observer;
mod options;
mod script;
mod sentinel;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::algorithm::{BucketParams, Verdict};
use crate::backend::breaker::{BreakerSet, Endpoint};
use crate::backend::{Backend, BackendError, Hit, KeyPeek};
use crate::clock::{MonotonicClock, SharedClock};

pub use self::batch::BatchSettings;
use self::batch::Batcher;
use self::call::{
    Call, Deadline, PROBE_KEY, bounded, classify, config_error, invalid_url, report_repaired,
};
use self::cluster::ClusterLink;
use self::observer::SharedObserver;
pub use self::observer::{RedisObserver, Unobserved};
pub use self::options::{RedisMode, RedisOptions};
use self::sentinel::SentinelLink;

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

#[cfg(test)]
mod tests {
    use redis::{ErrorKind, RedisError};

    use super::*;
    use crate::backend::redis::call::classify;

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
