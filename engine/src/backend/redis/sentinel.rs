//! Sentinel mode: the master is resolved through the sentinels, and resolved again after a
//! failed or timed-out call, so checks follow a failover to the new master.
//!
//! The breaker is the current master's (named by its address): a failover brings a new master
//! with a fresh, closed breaker, and the old one is forgotten. While the master's breaker is
//! open the sentinels are still asked (at most every [`REFRESH_COOLDOWN`]), so a promotion is
//! followed without waiting for the cooldown.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, IntoConnectionInfo, TlsMode, Value};

use super::batch::{BatchSettings, Batcher};
use super::call::{Call, bounded, classify, invalid_url, is_connection_error};
use super::heartbeat;
use super::observer::SharedObserver;
use super::options::RedisOptions;
use super::script;
use crate::algorithm::Verdict;
use crate::backend::breaker::{BreakerSet, Endpoint};
use crate::backend::{BackendError, Hit};

/// After a resolution, the next one waits this long, so a master that stays down costs the
/// sentinels a few queries per second, not one per request.
const REFRESH_COOLDOWN: Duration = Duration::from_millis(100);

pub(super) struct SentinelLink {
    /// Asks the sentinels for the master (and checks it says it is one). One resolution at a time.
    resolver: tokio::sync::Mutex<SentinelClient>,
    master: ArcSwapOption<Master>,
    /// A background resolution (or its cooldown) is under way.
    refreshing: AtomicBool,
    connect_timeout: Duration,
    conn_config: AsyncConnectionConfig,
    breakers: Arc<BreakerSet>,
    /// Each master's batch queue is started with these; its worker stops once a failover has
    /// replaced the master and the last check on it is done.
    batch: BatchSettings,
    observer: SharedObserver,
}

struct Master {
    addr: ConnectionAddr,
    conn: MultiplexedConnection,
    endpoint: Endpoint,
    /// The batch queue in front of `conn` (none: batching off).
    batcher: Option<Batcher>,
}

impl SentinelLink {
    pub(super) async fn connect(
        urls: &[String],
        master_name: &str,
        opts: &RedisOptions,
        breakers: Arc<BreakerSet>,
        observer: SharedObserver,
    ) -> Result<Arc<SentinelLink>, BackendError> {
        let mut sentinels = Vec::with_capacity(urls.len());
        for (index, url) in urls.iter().enumerate() {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|err| invalid_url(index, &err))?;
            sentinels.push(info);
        }
        // The master is reached like the sentinels: same TLS mode, same credentials and db.
        let first = &sentinels[0];
        let mut node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(first.redis_settings().clone());
        if let ConnectionAddr::TcpTls { insecure, .. } = first.addr() {
            node = node.set_tls_mode(if *insecure {
                TlsMode::Insecure
            } else {
                TlsMode::Secure
            });
        }
        let resolver = SentinelClient::build(
            sentinels,
            master_name,
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|err| BackendError::Unavailable(format!("Redis Sentinel client: {err}")))?;
        let link = Arc::new(SentinelLink {
            resolver: tokio::sync::Mutex::new(resolver),
            master: ArcSwapOption::empty(),
            refreshing: AtomicBool::new(false),
            connect_timeout: opts.connect_timeout,
            conn_config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(opts.connect_timeout))
                .set_response_timeout(None),
            breakers,
            batch: opts.batch,
            observer,
        });
        link.resolve(true).await?;
        Ok(link)
    }

    /// One script call on the current master (shared with concurrent checks when batching is
    /// on); an error schedules a re-resolution.
    pub(super) async fn check(
        self: &Arc<Self>,
        hits: &[Hit],
        args: script::CallArgs,
        call: Call<'_>,
    ) -> Result<Vec<Verdict>, BackendError> {
        let Some(master) = self.master.load_full() else {
            self.refresh(true);
            return Err(BackendError::Unavailable(
                "no Redis master resolved through the sentinels yet".into(),
            ));
        };
        let result = call
            .on_connection(
                &master.endpoint,
                &master.conn,
                master.batcher.as_ref(),
                hits,
                args,
            )
            .await;
        match &result {
            Err(err) if is_connection_error(err) => self.refresh(true),
            // A stalled master keeps its socket open, and a skipped one may have been replaced:
            // reconnect only if the sentinels moved on.
            Err(BackendError::Timeout(_) | BackendError::CircuitOpen) => self.refresh(false),
            _ => {}
        }
        result
    }

    /// The heartbeat on the current master (not subject to its breaker).
    pub(super) async fn heartbeat(
        &self,
        cmd: &Cmd,
        timeout: Duration,
    ) -> Result<heartbeat::Beat, BackendError> {
        let Some(master) = self.master.load_full() else {
            return Err(BackendError::Unavailable(
                "no Redis master resolved yet".into(),
            ));
        };
        let mut conn = master.conn.clone();
        bounded(timeout, heartbeat::run(&mut conn, cmd)).await
    }

    /// The current master's connection (admin calls, not subject to its breaker).
    pub(super) fn master_connection(&self) -> Result<MultiplexedConnection, BackendError> {
        self.master
            .load_full()
            .map(|master| master.conn.clone())
            .ok_or_else(|| BackendError::Unavailable("no Redis master resolved yet".into()))
    }

    /// Starts a background resolution unless one (or its cooldown) is running.
    fn refresh(self: &Arc<Self>, reconnect: bool) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let link = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(err) = link.resolve(reconnect).await {
                tracing::warn!(error = %err, "resolving the Redis master through the sentinels failed");
            }
            tokio::time::sleep(REFRESH_COOLDOWN).await;
            link.refreshing.store(false, Ordering::Release);
        });
    }

    /// Asks the sentinels for the master; connects to it and loads the script when it changed
    /// (or always, with `reconnect`). Each step is bounded by the connect timeout.
    async fn resolve(&self, reconnect: bool) -> Result<(), BackendError> {
        let limit = self.connect_timeout;
        let client = bounded(limit, async {
            let mut resolver = self.resolver.lock().await;
            resolver.async_get_client().await.map_err(classify)
        })
        .await?;
        let addr = client.get_connection_info().addr().clone();
        if !reconnect
            && self
                .master
                .load()
                .as_ref()
                .is_some_and(|current| current.addr == addr)
        {
            return Ok(());
        }
        let mut conn = bounded(limit, async {
            client
                .get_multiplexed_async_connection_with_config(&self.conn_config)
                .await
                .map_err(classify)
        })
        .await?;
        let reply = bounded(limit, async {
            script::load_command()
                .query_async::<Value>(&mut conn)
                .await
                .map_err(classify)
        })
        .await?;
        script::check_loaded(&reply)?;
        tracing::info!(master = %addr, "using the Redis master named by the sentinels");
        let name = addr.to_string();
        let endpoint = self.breakers.endpoint(&name);
        self.breakers.retain(|endpoint| endpoint == name);
        let batcher = self
            .batch
            .enabled()
            .then(|| Batcher::start(conn.clone(), self.batch, self.observer.clone()));
        self.master.store(Some(Arc::new(Master {
            addr,
            conn,
            endpoint,
            batcher,
        })));
        Ok(())
    }
}
