//! Wiring: settings → config, backend, limiter, gRPC and admin listeners → serve until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admin::{self, AdminState, Readiness};
use crate::backend::Backend;
use crate::backend::memory::{MemoryBackend, MemoryOptions};
use crate::backend::redis::{BatchSettings, RedisBackend, RedisMode, RedisOptions};
use crate::clock::MonotonicClock;
use crate::config::{self, Config, ConfigErrors, ConfigStore};
use crate::lease::{LeaseOptions, LeaseStore};
use crate::limiter::{Limiter, LimiterOptions};
use crate::resilience::breaker::{BreakerSet, BreakerSettings};
use crate::resilience::in_flight::InFlight;
use crate::resilience::local::Replicas;
use crate::resilience::{self, Resilience, ResilienceOptions};
use crate::rule::FailureMode;
use crate::security::tls::{AuthorizeLayer, GrpcIncoming, TlsState};
use crate::service::{HeaderOptions, RateLimitHandler, RateLimitServer, RequestBounds};
use crate::settings::{BackendKind, RedisModeArg, Settings};
use crate::telemetry::{BreakerReading, Metrics, MetricsOptions};
use crate::xds::{self, ConfigSource};

/// Hard ceiling tonic enforces before our own `max_message_bytes` check can name the field.
const TRANSPORT_MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

/// How often readiness (admin and gRPC health) is re-evaluated, and the backend probed unless live
/// traffic was answered within the interval. The probe is also what closes an open breaker when
/// no traffic arrives.
const HEALTH_INTERVAL: Duration = Duration::from_millis(500);
/// How often each replica refreshes its heartbeat in Redis, and how long a silent one still
/// counts: a stopped replica is forgotten within the TTL, a new one counted within an interval.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
const HEARTBEAT_TTL: Duration = Duration::from_secs(5);

/// Why the service could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid config:\n{0}")]
    Config(#[from] ConfigErrors),
    #[error("invalid setting: {0}")]
    Setting(String),
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("backend: {0}")]
    Backend(String),
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
}

/// A started service: its bound addresses and a handle to stop it.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub readiness: Arc<Readiness>,
    pub config: Arc<ConfigStore>,
    /// The embedded backend, when it is the one serving (tests watch its bounds).
    pub memory_backend: Option<Arc<MemoryBackend>>,
    /// This server's metrics (sources such as circuit breakers register here).
    pub metrics: Metrics,
    /// The circuit breakers of the Redis endpoints (`None` on the memory backend); read-only:
    /// `states()` for readiness, metrics and tests.
    pub breakers: Option<Arc<BreakerSet>>,
    /// How many replicas the `local` failure policy divides limits by (configured or counted).
    pub replicas: Arc<Replicas>,
    /// Decisions in progress and their bound (`--max-in-flight`).
    pub in_flight: Arc<InFlight>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), ServeError>>,
}

impl Running {
    /// Stops accepting, lets in-flight calls finish (up to the drain timeout), and waits.
    pub async fn shutdown(self) -> Result<(), ServeError> {
        let _ = self.stop.send(true);
        self.wait().await
    }

    /// Waits until the service stops by itself or through [`Running::shutdown`].
    pub async fn wait(self) -> Result<(), ServeError> {
        match self.task.await {
            Ok(result) => result,
            Err(join) => Err(ServeError::Backend(format!("server task failed: {join}"))),
        }
    }
}

/// Runs the service until `shutdown` resolves, then drains.
pub async fn run(settings: Settings, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    let running = start(settings).await?;
    println!(
        "sluice ready grpc={} admin={}",
        running.grpc_addr, running.admin_addr
    );
    let Running { stop, mut task, .. } = running;
    let joined = tokio::select! {
        joined = &mut task => joined,
        () = shutdown => {
            let _ = stop.send(true);
            task.await
        }
    };
    joined.map_err(|e| ServeError::Backend(format!("server task failed: {e}")))?
}

/// Loads the config, connects the backend, binds both listeners and starts serving.
pub async fn start(settings: Settings) -> Result<Running, ServeError> {
    if settings.key_prefix.contains(['{', '}']) {
        return Err(ServeError::Setting(
            "--key-prefix must not contain `{` or `}` (they would move the Redis Cluster hash tag)"
                .into(),
        ));
    }
    let source = xds::config_source(&settings).map_err(|e| ServeError::Setting(e.to_string()))?;
    let reload_options = settings.config_ops.reload_options(settings.max_entries);
    let (loaded, config_loaded) = match &source {
        ConfigSource::File(path) => {
            let loaded = config::load_path_with(path, &reload_options.load)?;
            tracing::info!(path = %path.display(), summary = %loaded.summary(), "config loaded");
            (loaded, true)
        }
        ConfigSource::Xds(options) => (Config::default(), options.start_without_config),
    };
    let config = Arc::new(ConfigStore::new(loaded));
    let metrics = Metrics::new(config.clone(), &metrics_options(&settings))
        .map_err(|e| ServeError::Setting(e.to_string()))?;

    let running = match settings.backend {
        BackendKind::Memory => {
            let backend = Arc::new(MemoryBackend::new(
                Arc::new(MonotonicClock::new()),
                memory_options(&settings),
            ));
            let sweeper = backend.spawn_sweeper(Duration::from_secs(1));
            let held = Arc::downgrade(&backend);
            metrics.observe_memory_buckets(move || {
                held.upgrade().map_or(0, |b| b.live_buckets() as u64)
            });
            // One process holds every bucket: there is no outage to divide limits for.
            let parts = Parts {
                replicas: Arc::new(Replicas::fixed(1)),
                over_limit_cache: false,
                local_sweeper: false,
                metrics,
            };
            let running = serve(settings, config, backend.clone(), config_loaded, parts).await;
            if running.is_err() {
                sweeper.abort();
            }
            running.map(|mut r| {
                r.memory_backend = Some(backend);
                r
            })
        }
        BackendKind::Redis => {
            let backend = RedisBackend::connect(redis_options(&settings))
                .await
                .map_err(|e| ServeError::Backend(e.to_string()))?
                .with_metrics(metrics.redis_calls());
            let replicas = Arc::new(if settings.replicas > 0 {
                Replicas::fixed(settings.replicas)
            } else {
                Replicas::discovered()
            });
            let heartbeat = replicas
                .is_discovered()
                .then(|| Heartbeat::new(&backend, &settings.key_prefix, replicas.clone()));
            if let Some(heartbeat) = &heartbeat {
                // Counted before serving, so a Redis loss right after start divides correctly.
                heartbeat.beat().await;
            }
            let parts = Parts {
                replicas,
                over_limit_cache: settings.over_limit_cache,
                local_sweeper: true,
                metrics,
            };
            let running = serve(settings, config, backend, config_loaded, parts).await?;
            if let Some(heartbeat) = heartbeat {
                heartbeat.spawn(running.stop.subscribe());
            }
            Ok(running)
        }
    }?;
    if let ConfigSource::File(path) = &source {
        let stop = running.stop.subscribe();
        config::reload::spawn_until_stopped(
            path.clone(),
            running.config.clone(),
            reload_options.clone(),
            stop,
        );
    }
    if let ConfigSource::Xds(mut options) = source {
        options.load = reload_options.load;
        let stop = running.stop.subscribe();
        xds::spawn(
            options,
            running.config.clone(),
            running.readiness.clone(),
            stop,
        );
    }
    Ok(running)
}

/// What differs between the backends beyond the backend itself.
struct Parts {
    replicas: Arc<Replicas>,
    over_limit_cache: bool,
    /// Sweep the `local` policy's buckets (only a shared backend can fail over to them).
    local_sweeper: bool,
    metrics: Metrics,
}

async fn serve<B: Backend>(
    settings: Settings,
    config: Arc<ConfigStore>,
    backend: B,
    config_loaded: bool,
    parts: Parts,
) -> Result<Running, ServeError> {
    let tls = match settings.security.tls.settings() {
        None => None,
        Some(tls) => Some(TlsState::load(tls).map_err(|e| ServeError::Setting(e.to_string()))?),
    };
    let readiness = Arc::new(Readiness::default());
    readiness.set_config_loaded(config_loaded);
    let answered = backend.probe().await.is_ok();
    readiness.set_backend_ready(answered);

    let resilience = Resilience::new(
        &ResilienceOptions {
            over_limit_cache_keys: parts
                .over_limit_cache
                .then(|| usize::try_from(settings.over_limit_cache_max_keys).unwrap_or(usize::MAX)),
            max_in_flight: usize::try_from(settings.max_in_flight).unwrap_or(usize::MAX),
            local_store: memory_options(&settings),
        },
        Arc::new(MonotonicClock::new()),
        parts.replicas.clone(),
    );
    let local_sweeper = parts.local_sweeper.then(|| {
        resilience
            .local()
            .store()
            .spawn_sweeper(Duration::from_secs(1))
    });
    let breakers = backend.breakers();
    if let Some(set) = &breakers {
        let set = Arc::downgrade(set);
        parts.metrics.observe_breakers(move || {
            set.upgrade().map_or_else(Vec::new, |set| {
                set.states()
                    .into_iter()
                    .map(|(endpoint, state)| BreakerReading { endpoint, state })
                    .collect()
            })
        });
    }
    let metrics = parts.metrics;
    let in_flight = resilience.in_flight().clone();
    let leases = Arc::new(LeaseStore::new(LeaseOptions {
        max_keys: usize::try_from(settings.lease_max_keys).unwrap_or(usize::MAX),
        lifetime_ms: lease_lifetime_ms(&settings)?,
    }));
    metrics.observe_leases(leases.clone());
    let limiter = Arc::new(
        Limiter::with_resilience(
            config.active().clone(),
            backend,
            LimiterOptions {
                key_prefix: settings.key_prefix.clone(),
                default_failure_mode: settings.failure_mode.into(),
            },
            resilience,
        )
        .with_leases(leases),
    );
    let lease_limiter = limiter.clone();
    let health_limiter = limiter.clone();
    let service = RateLimitHandler::new(
        limiter,
        RequestBounds {
            max_message_bytes: settings.max_message_bytes,
            max_descriptors: settings.max_descriptors,
            max_entries: settings.max_entries,
            max_key_bytes: settings.max_key_bytes,
            max_value_bytes: settings.max_value_bytes,
            policy: settings.security.callers.policy(),
        },
        HeaderOptions {
            enabled: settings.response_headers,
            limit: settings.header_limit.clone(),
            remaining: settings.header_remaining.clone(),
            reset: settings.header_reset.clone(),
            retry_after: settings.header_retry_after.clone(),
            degraded: settings.header_degraded.clone(),
        },
    )
    .with_metrics(metrics.clone());

    let grpc_listener = bind(settings.grpc_addr).await?;
    let admin_listener = bind(settings.admin_addr).await?;
    let grpc_addr = local_addr(&grpc_listener, settings.grpc_addr)?;
    let admin_addr = local_addr(&admin_listener, settings.admin_addr)?;

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let rls_name =
        <RateLimitServiceServer<RateLimitHandler<B>> as tonic::server::NamedService>::NAME;
    let grpc_health = GrpcHealth {
        reporter: health_reporter.clone(),
        names: ["", rls_name],
    };
    grpc_health.set(readiness.is_ready()).await;

    let (stop_tx, stop_rx) = watch::channel(false);
    let lease_sweeper = tokio::spawn(sweep_leases(
        lease_limiter.clone(),
        lease_sweep_interval(settings.lease_lifetime),
        stop_rx.clone(),
    ));
    spawn_health(
        health_limiter,
        readiness.clone(),
        grpc_health,
        answered,
        settings.failure_mode.into(),
        stop_rx.clone(),
    );

    let admin_router = admin::router(AdminState {
        config: config.clone(),
        readiness: readiness.clone(),
        metrics: metrics.clone(),
    })
    .merge(crate::admin::explain::router(
        config.clone(),
        explain_options(&settings),
    ))
    .merge(crate::compat::router(readiness.clone()));
    let mut admin_stop = stop_rx.clone();
    let admin_task = tokio::spawn(async move {
        let result = axum::serve(admin_listener, admin_router)
            .with_graceful_shutdown(async move {
                let _ = admin_stop.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "admin server failed");
        }
    });

    let rls = RateLimitServer::new(service).max_decoding_message_size(TRANSPORT_MAX_MESSAGE_BYTES);
    let mut grpc_server = settings.security.http2.server().layer(AuthorizeLayer::new(
        tls.as_ref().is_some_and(|t| t.enforces_allow_list()),
    ));
    if let Some(tls) = &tls {
        tls.spawn_reloader();
    }
    let incoming = GrpcIncoming::new(grpc_listener, tls);
    let drain = settings.drain_timeout;
    let flushed = metrics.clone();
    let drain_readiness = readiness.clone();
    let mut grpc_stop = stop_rx.clone();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = grpc_stop.wait_for(|s| *s).await;
            drain_readiness.set_draining(true);
            health_reporter
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            health_reporter
                .set_service_status(rls_name, tonic_health::ServingStatus::NotServing)
                .await;
            tracing::info!("shutting down: no new connections, draining in-flight calls");
        };
        let server = grpc_server
            .add_service(health_service)
            .add_service(rls)
            .serve_with_incoming_shutdown(incoming, shutdown);
        let mut drain_stop = stop_rx.clone();
        let result = tokio::select! {
            r = server => r.map_err(ServeError::from),
            () = async move {
                let _ = drain_stop.wait_for(|s| *s).await;
                tokio::time::sleep(drain).await;
            } => {
                tracing::warn!(?drain, "drain timeout reached; closing remaining calls");
                Ok(())
            }
        };
        let _ = admin_task.await;
        if let Some(sweeper) = local_sweeper {
            sweeper.abort();
        }
        // Calls have drained: no lease is spent any more, so every leased token goes back.
        let _ = lease_sweeper.await;
        match tokio::time::timeout(LEASE_RETURN_DEADLINE, lease_limiter.return_all_leases()).await {
            Ok(0) => {}
            Ok(tokens) => tracing::info!(tokens, "leased tokens handed back"),
            Err(_) => tracing::warn!(
                deadline = ?LEASE_RETURN_DEADLINE,
                "leased tokens not handed back in time; the buckets refill them"
            ),
        }
        // Pushes the last OTLP batch; blocks on the exporter, so off the async workers.
        let _ = tokio::task::spawn_blocking(move || flushed.shutdown()).await;
        result
    });

    Ok(Running {
        grpc_addr,
        admin_addr,
        readiness,
        config,
        memory_backend: None,
        metrics,
        breakers,
        replicas: parts.replicas,
        in_flight,
        stop: stop_tx,
        task,
    })
}

/// How long shutdown waits for the backend to take the unused leased tokens back.
const LEASE_RETURN_DEADLINE: Duration = Duration::from_secs(2);

/// `--lease-lifetime` in whole ms, at least one (a lease that can never be spent is an error).
fn lease_lifetime_ms(settings: &Settings) -> Result<u64, ServeError> {
    match u64::try_from(settings.lease_lifetime.as_millis()) {
        Ok(ms) if ms >= 1 => Ok(ms),
        _ => Err(ServeError::Setting(format!(
            "--lease-lifetime must be from 1ms to 2^64 ms, got {:?}",
            settings.lease_lifetime
        ))),
    }
}

/// Expired leases go back a few times per lifetime, at most every 10 ms and at least every
/// second, so a returned token is back in the bucket soon after it stopped being spendable.
fn lease_sweep_interval(lifetime: Duration) -> Duration {
    (lifetime / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// Hands expired leases back until the server stops.
async fn sweep_leases<B: Backend>(
    limiter: Arc<Limiter<B>>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                limiter.return_expired_leases().await;
            }
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}

/// The statuses gRPC health reports for the service names sluice serves.
struct GrpcHealth {
    reporter: tonic_health::server::HealthReporter,
    names: [&'static str; 2],
}

impl GrpcHealth {
    async fn set(&self, ready: bool) {
        let status = if ready {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        for name in self.names {
            self.reporter.set_service_status(name, status).await;
        }
    }
}

/// Probes the backend every [`HEALTH_INTERVAL`] unless traffic just did (through the breakers, so
/// the probe is also the half-open call that closes one) and keeps `/readyz` and gRPC health in line with
/// [`resilience::backend_ready`]. A backend that never answered a probe stays not ready.
fn spawn_health<B: Backend>(
    limiter: Arc<Limiter<B>>,
    readiness: Arc<Readiness>,
    grpc: GrpcHealth,
    mut answered: bool,
    default_mode: FailureMode,
    mut stop: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(HEALTH_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut reported = readiness.is_ready();
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let traffic = limiter
                .resilience()
                .answered_within(HEALTH_INTERVAL.as_millis() as u64);
            answered |= traffic || limiter.backend().probe().await.is_ok();
            let only_error = resilience::only_error_policy(&limiter.config().load(), default_mode);
            let backend_ready =
                answered && resilience::backend_ready(&limiter.breaker_states(), only_error);
            readiness.set_backend_ready(backend_ready);
            let ready = readiness.is_ready();
            if *stop.borrow() {
                return;
            }
            if ready != reported {
                if ready {
                    tracing::info!("ready: serving");
                } else {
                    tracing::warn!(
                        "not ready: Redis unreachable and the failure policy is `error`"
                    );
                }
                grpc.set(ready).await;
                reported = ready;
            }
        }
    });
}

/// This replica's heartbeat in Redis, for the `local` policy's replica count.
struct Heartbeat {
    backend: RedisBackend,
    key: String,
    member: String,
    replicas: Arc<Replicas>,
    /// A heartbeat succeeded, or its failure was already reported.
    counted: std::sync::atomic::AtomicBool,
}

impl Heartbeat {
    fn new(backend: &RedisBackend, key_prefix: &str, replicas: Arc<Replicas>) -> Self {
        // The pod name when there is one (Kubernetes sets HOSTNAME), so an operator can read the
        // set; the random part keeps two processes on one host apart.
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "sluice".into());
        Heartbeat {
            backend: backend.clone(),
            // No `{` follows the prefix, so this can never be a bucket key.
            key: format!("{key_prefix}replicas"),
            member: format!("{host}-{:016x}", rand::random::<u64>()),
            replicas,
            counted: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// One heartbeat; a failure keeps the last count (that is the point while Redis is away).
    async fn beat(&self) {
        match self
            .backend
            .heartbeat(&self.key, &self.member, HEARTBEAT_TTL)
            .await
        {
            Ok(live) => {
                self.counted
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                let before = self.replicas.current();
                self.replicas.observe(live);
                if live.max(1) != before {
                    tracing::info!(replicas = live, "live replica count changed");
                }
            }
            // Never counted (the ACL lacks the heartbeat's commands, say): say so once.
            Err(error)
                if !self
                    .counted
                    .swap(true, std::sync::atomic::Ordering::Relaxed) =>
            {
                tracing::warn!(%error, "cannot count replicas through Redis; the `local` policy assumes 1 until a heartbeat succeeds (or set --replicas)")
            }
            Err(error) => {
                tracing::debug!(%error, replicas = self.replicas.current(), "heartbeat failed; keeping the last replica count")
            }
        }
    }

    fn spawn(self, mut stop: watch::Receiver<bool>) {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(HEARTBEAT_INTERVAL);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                tokio::select! {
                    _ = ticks.tick() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                self.beat().await;
            }
        });
    }
}

/// Bounds of an in-process bucket store: the memory backend, or the `local` policy's buckets.
fn memory_options(settings: &Settings) -> MemoryOptions {
    MemoryOptions {
        max_buckets: settings.memory_max_buckets,
        max_buckets_per_rule: settings
            .security
            .memory_max_buckets_per_rule
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        ..MemoryOptions::default()
    }
}

fn explain_options(settings: &Settings) -> crate::explain::ExplainOptions {
    crate::explain::ExplainOptions {
        key_prefix: settings.key_prefix.clone(),
        default_failure_mode: settings.failure_mode.into(),
    }
}

fn metrics_options(settings: &Settings) -> MetricsOptions {
    let telemetry = &settings.telemetry;
    MetricsOptions {
        enabled: telemetry.metrics,
        near_limit_ratio: telemetry.near_limit_ratio,
        detailed_max_values: telemetry.metrics_detailed_max_values,
        otlp: telemetry.otlp.clone(),
        redis_timeout: (settings.backend == BackendKind::Redis).then_some(settings.redis_timeout),
    }
}

fn redis_options(settings: &Settings) -> RedisOptions {
    RedisOptions {
        urls: settings.redis_url.clone(),
        mode: match settings.redis_mode {
            RedisModeArg::Standalone => RedisMode::Standalone,
            RedisModeArg::Cluster => RedisMode::Cluster,
            RedisModeArg::Sentinel => RedisMode::Sentinel,
        },
        sentinel_master: Some(settings.redis_sentinel_master.clone()),
        connect_timeout: settings.redis_connect_timeout,
        command_timeout: settings.redis_timeout,
        breaker: BreakerSettings {
            failure_threshold: settings.breaker_failures,
            cooldown: settings.breaker_cooldown,
        },
        expiry_jitter_max: settings.expiry_jitter_max,
        batch: BatchSettings {
            max_keys: usize::try_from(settings.redis_max_batch).unwrap_or(usize::MAX),
            in_flight: usize::try_from(settings.redis_batch_calls).unwrap_or(usize::MAX),
        },
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

fn local_addr(listener: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, ServeError> {
    listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C). The handlers are installed when this is called, not
/// when the future is first polled, so a signal that arrives right after the ready line is seen.
pub fn shutdown_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| tracing::warn!(error = %e, "cannot listen for SIGTERM"))
        .ok();
    #[cfg(unix)]
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|e| tracing::warn!(error = %e, "cannot listen for SIGINT"))
        .ok();
    async move {
        #[cfg(unix)]
        {
            let term = async {
                match term.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let int = async {
                match int.as_mut() {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = term => tracing::info!("SIGTERM received"),
                () = int => tracing::info!("SIGINT received"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
