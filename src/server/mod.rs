//! Wiring: settings → config, backend, limiter, gRPC and admin listeners → serve until shutdown
//! ([`drain`]: the way out).

mod admin_routes;
mod background;
mod drain;
mod serving;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use tonic::server::NamedService;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthService;

use crate::admin::Readiness;
use crate::backend::Backend;
use crate::backend::breaker::BreakerSet;
use crate::backend::memory::{MemoryBackend, MemoryOptions};
use crate::backend::redis::{RedisBackend, RedisOptions};
use crate::backend::split::SplitBackend;
use crate::clock::MonotonicClock;
use crate::config::reload::ReloadOptions;
use crate::config::{self, Config, ConfigErrors, ConfigStore};
use crate::limiter::lease::{LeaseOptions, LeaseStore};
use crate::limiter::{Limiter, LimiterOptions};
use crate::quota::{QuotaHandler, QuotaOptions, Quotas};
use crate::resilience::in_flight::InFlight;
use crate::resilience::local::Replicas;
use crate::resilience::{Resilience, ResilienceOptions};
use crate::rls::{HeaderOptions, RateLimitHandler, RateLimitServer, RequestBounds};
use crate::security;
use crate::security::listener::{ConnectionLimits, ConnectionStats};
use crate::security::tls::{AuthorizeLayer, TlsState};
use crate::settings::{BackendKind, Settings};
use crate::telemetry::{BreakerReading, Metrics, MetricsOptions};
use crate::top::TopRecorder;
use crate::xds::{self, ConfigSource};

use drain::{DrainTimes, GrpcHealth, WindDown};

/// Smallest ceiling tonic enforces (OUT_OF_RANGE, before buffering the body); under it the strict
/// codec holds `--max-message-bytes` against the encoded request and names the message. A larger
/// `--max-message-bytes` raises the ceiling with it.
const TRANSPORT_MAX_MESSAGE_BYTES: usize = 8 * 1024 * 1024;

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
    #[error("cannot start a serving thread: {0}")]
    Thread(std::io::Error),
}

/// A started service: its bound addresses and a handle to stop it.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// `--metrics-addr` as bound, when set.
    pub metrics_addr: Option<SocketAddr>,
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
    let metrics = running
        .metrics_addr
        .map(|addr| format!(" metrics={addr}"))
        .unwrap_or_default();
    println!(
        "sluice ready grpc={} admin={}{metrics}",
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
    check_settings(&settings)?;
    let source = xds::config_source(&settings).map_err(|e| ServeError::Setting(e.to_string()))?;
    let reload = config::args::reload_options(&settings.config_ops, settings.max_entries);
    let (loaded, config_loaded) = match &source {
        ConfigSource::File(path) => {
            let loaded = config::load_path_with(path, &reload.load)?;
            tracing::info!(path = %path.display(), summary = %loaded.summary(), "config loaded");
            (loaded, true)
        }
        ConfigSource::Xds(options) => (Config::default(), options.start_without_config),
    };
    let config = Arc::new(ConfigStore::new(loaded));
    let metrics = Metrics::new(config.clone(), &MetricsOptions::from(&settings))
        .map_err(|e| ServeError::Setting(e.to_string()))?;
    let running = match settings.backend {
        BackendKind::Memory => start_memory(settings, config, config_loaded, metrics).await,
        BackendKind::Redis => start_redis(settings, config, config_loaded, metrics).await,
    }?;
    follow_config_source(source, reload, &running);
    Ok(running)
}

/// Settings that parse one by one but not together.
fn check_settings(settings: &Settings) -> Result<(), ServeError> {
    let fail = |message: String| Err(ServeError::Setting(message));
    if settings.rlqs_push_interval.is_zero() {
        return fail("--rlqs-push-interval must be above 0".into());
    }
    if settings.rlqs_first_report_timeout.is_zero() {
        // A zero wait would end every RLQS stream before its first report could arrive.
        return fail("--rlqs-first-report-timeout must be above 0".into());
    }
    let ttl = settings.rlqs_assignment_ttl;
    if ttl.subsec_nanos() != 0 || ttl.is_zero() {
        // Envoy's rate_limit_quota filter reads only the seconds of assignment_time_to_live.
        return fail(format!(
            "--rlqs-assignment-ttl ({ttl:?}) must be a whole number of seconds, at least 1s: \
             Envoy reads only its seconds"
        ));
    }
    if settings.rlqs_assignment_ttl <= settings.rlqs_push_interval {
        // An assignment must outlive the push that extends it, or every data plane falls to its
        // expired-assignment behaviour between pushes.
        return fail(format!(
            "--rlqs-assignment-ttl ({:?}) must be longer than --rlqs-push-interval ({:?})",
            settings.rlqs_assignment_ttl, settings.rlqs_push_interval
        ));
    }
    if settings.backend == BackendKind::Memory && settings.redis_per_second.enabled() {
        return fail(
            "--redis-per-second-url needs --backend redis (the memory backend keeps every bucket)"
                .into(),
        );
    }
    Ok(())
}

/// Serves on the embedded backend: one process holds every bucket.
async fn start_memory(
    settings: Settings,
    config: Arc<ConfigStore>,
    config_loaded: bool,
    metrics: Metrics,
) -> Result<Running, ServeError> {
    let backend = Arc::new(MemoryBackend::new(
        Arc::new(MonotonicClock::new()),
        MemoryOptions::from(&settings),
    ));
    let sweeper = backend.spawn_sweeper(Duration::from_secs(1));
    let held = Arc::downgrade(&backend);
    metrics.observe_memory_buckets(move || held.upgrade().map_or(0, |b| b.live_buckets() as u64));
    let held = Arc::downgrade(&backend);
    metrics.observe_memory_refusals(move || held.upgrade().map_or(0, |b| b.refused_total()));
    // One process holds every bucket: there is no outage to divide limits for.
    let store = StoreParts {
        replicas: Arc::new(Replicas::fixed(1)),
        over_limit_cache: false,
        local_sweeper: false,
        metrics,
    };
    let built = build(&settings, config, backend.clone(), config_loaded, store).await;
    let served = match built {
        Ok(built) => serve(&settings, built).await,
        Err(e) => Err(e),
    };
    let mut running = served.inspect_err(|_| sweeper.abort())?;
    running.memory_backend = Some(backend);
    Ok(running)
}

/// Serves on Redis, counting the live replicas through a heartbeat unless `--replicas` is set,
/// with per-second rules on a Redis of their own when `--redis-per-second-url` is set.
async fn start_redis(
    settings: Settings,
    config: Arc<ConfigStore>,
    config_loaded: bool,
    metrics: Metrics,
) -> Result<Running, ServeError> {
    let backend = RedisBackend::connect(RedisOptions::from(&settings))
        .await
        .map_err(|e| ServeError::Backend(e.to_string()))?
        .observed_by(Arc::new(metrics.redis_calls()));
    let per_second = match settings.per_second_redis() {
        Some(options) => Some(
            RedisBackend::connect(options)
                .await
                .map_err(|e| ServeError::Backend(format!("per-second Redis: {e}")))?
                .observed_by(Arc::new(metrics.redis_calls())),
        ),
        None => None,
    };
    let replicas = Arc::new(if settings.replicas > 0 {
        Replicas::fixed(settings.replicas)
    } else {
        Replicas::discovered()
    });
    let heartbeat = replicas
        .is_discovered()
        .then(|| background::Heartbeat::new(&backend, &settings.key_prefix, replicas.clone()));
    if let Some(heartbeat) = &heartbeat {
        // Counted before serving, so a Redis loss right after start divides correctly.
        heartbeat.beat().await;
    }
    let store = StoreParts {
        replicas,
        over_limit_cache: settings.over_limit_cache,
        local_sweeper: true,
        metrics,
    };
    // The replica heartbeat stays on the main Redis; per-second rules' hits go to their own.
    let backend = SplitBackend::new(backend, per_second);
    let built = build(&settings, config, backend, config_loaded, store).await?;
    let running = serve(&settings, built).await?;
    if let Some(heartbeat) = heartbeat {
        heartbeat.spawn(running.stop.subscribe());
    }
    Ok(running)
}

/// Keeps the active config in line with its source until the server stops: file changes and
/// SIGHUP for files, pushes for xDS.
fn follow_config_source(source: ConfigSource, reload: ReloadOptions, running: &Running) {
    let stop = running.stop.subscribe();
    match source {
        ConfigSource::File(path) => {
            config::reload::spawn_until_stopped(path, running.config.clone(), reload, stop);
        }
        ConfigSource::Xds(mut options) => {
            options.load = reload.load;
            xds::spawn(
                options,
                running.config.clone(),
                running.readiness.clone(),
                stop,
            );
        }
    }
}

/// What differs between the backends beyond the backend itself.
struct StoreParts {
    replicas: Arc<Replicas>,
    over_limit_cache: bool,
    /// Sweep the `local` policy's buckets (only a shared backend can fail over to them).
    local_sweeper: bool,
    metrics: Metrics,
}

/// The parts of one service, built from the settings before anything listens.
struct Built<B: Backend> {
    config: Arc<ConfigStore>,
    readiness: Arc<Readiness>,
    /// The backend answered its first probe.
    answered: bool,
    limiter: Arc<Limiter<B>>,
    metrics: Metrics,
    /// The `RateLimitService` over `limiter`.
    service: RateLimitHandler<B>,
    /// The RLQS side over the same limiter.
    quotas: Arc<Quotas<B>>,
    /// Every admin route (`admin_routes`).
    admin: axum::Router,
    tls: Option<Arc<TlsState>>,
    breakers: Option<Arc<BreakerSet>>,
    replicas: Arc<Replicas>,
    /// The `local` policy's bucket sweeper, stopped with the server.
    local_sweeper: Option<JoinHandle<()>>,
}

impl<B: Backend> Built<B> {
    fn background(&self) -> background::Background<B> {
        background::Background {
            quotas: self.quotas.clone(),
            limiter: self.limiter.clone(),
            readiness: self.readiness.clone(),
            answered: self.answered,
        }
    }
}

/// Builds the limiter over `backend` (with its resilience and leases), the gRPC service and the
/// admin router, and probes the backend once for readiness.
async fn build<B: Backend>(
    settings: &Settings,
    config: Arc<ConfigStore>,
    backend: B,
    config_loaded: bool,
    store: StoreParts,
) -> Result<Built<B>, ServeError> {
    let tls = match settings.security.tls.settings() {
        None => None,
        Some(tls) => Some(TlsState::load(tls).map_err(|e| ServeError::Setting(e.to_string()))?),
    };
    let readiness = Arc::new(Readiness::default());
    readiness.set_config_loaded(config_loaded);
    let answered = backend.probe().await.is_ok();
    readiness.set_backend_ready(answered);

    let resilience = Resilience::new(
        &resilience_options(settings, store.over_limit_cache),
        Arc::new(MonotonicClock::new()),
        store.replicas.clone(),
    );
    let local_sweeper = store.local_sweeper.then(|| {
        resilience
            .local()
            .store()
            .spawn_sweeper(Duration::from_secs(1))
    });
    let breakers = backend.breakers();
    if let Some(set) = &breakers {
        observe_breakers(&store.metrics, set);
    }
    let metrics = store.metrics;
    let leases = Arc::new(LeaseStore::new(LeaseOptions {
        lifetime_ms: lease_lifetime_ms(settings)?,
        ..LeaseOptions::from(settings)
    }));
    metrics.observe_leases(leases.clone());
    metrics.observe_replicas(store.replicas.clone());
    let limiter = Arc::new(
        Limiter::with_resilience(
            config.active().clone(),
            backend,
            LimiterOptions::from(settings),
            resilience,
        )
        .with_leases(leases),
    );
    metrics.observe_slots(Arc::downgrade(limiter.slot_stats()));
    let (service, top) = rls_service(settings, &limiter, &metrics);
    let quotas = Arc::new(Quotas::new(limiter.clone(), QuotaOptions::from(settings)));
    metrics.observe_quota(quotas.stats().clone());
    let admin = admin_routes::router(&admin_routes::AdminParts {
        settings,
        config: &config,
        readiness: &readiness,
        metrics: &metrics,
        limiter: &limiter,
        quotas: &quotas,
        replicas: &store.replicas,
        top,
    })?;
    Ok(Built {
        config,
        readiness,
        answered,
        limiter,
        metrics,
        service,
        quotas,
        admin,
        tls,
        breakers,
        replicas: store.replicas,
        local_sweeper,
    })
}

/// The `RateLimitService` over `limiter`, counting into `metrics` and into the top-keys summaries
/// it returns (none with `--top-keys 0`).
fn rls_service<B>(
    settings: &Settings,
    limiter: &Arc<Limiter<B>>,
    metrics: &Metrics,
) -> (RateLimitHandler<B>, Option<Arc<TopRecorder>>) {
    let top = TopRecorder::new(
        usize::try_from(settings.telemetry.top_keys).unwrap_or(crate::top::MAX_CAPACITY),
        settings.telemetry.top_window,
        Arc::new(MonotonicClock::new()),
    )
    .map(Arc::new);
    let service = RateLimitHandler::new(
        limiter.clone(),
        RequestBounds::from(settings),
        HeaderOptions::from(settings),
    )
    .with_metrics(metrics.clone())
    .with_top(top.clone());
    (service, top)
}

/// Sizes of the resilience machinery; `over_limit_cache`: keep one (a shared backend, with
/// `--over-limit-cache` on).
fn resilience_options(settings: &Settings, over_limit_cache: bool) -> ResilienceOptions {
    ResilienceOptions {
        over_limit_cache_keys: over_limit_cache
            .then(|| usize::try_from(settings.over_limit_cache_max_keys).unwrap_or(usize::MAX)),
        max_in_flight: usize::try_from(settings.max_in_flight).unwrap_or(usize::MAX),
        local_store: MemoryOptions::from(settings),
    }
}

/// Feeds `sluice_redis_breaker_state` from `set` while it lives.
fn observe_breakers(metrics: &Metrics, set: &Arc<BreakerSet>) {
    let set = Arc::downgrade(set);
    metrics.observe_breakers(move || {
        set.upgrade().map_or_else(Vec::new, |set| {
            set.states()
                .into_iter()
                .map(|(endpoint, state)| BreakerReading { endpoint, state })
                .collect()
        })
    });
}

/// gRPC health for "" and the RLS service's name, starting at the readiness now.
async fn grpc_health<B: Backend>(
    reporter: tonic_health::server::HealthReporter,
    readiness: &Readiness,
) -> GrpcHealth {
    let health = GrpcHealth {
        reporter,
        names: [
            "",
            <RateLimitServiceServer<RateLimitHandler<B>> as NamedService>::NAME,
            <RateLimitQuotaServiceServer<QuotaHandler<B>> as NamedService>::NAME,
        ],
    };
    health.set(readiness.is_ready()).await;
    health
}

/// Binds both listeners and runs the built parts until the stop signal, then drains.
async fn serve<B: Backend>(settings: &Settings, built: Built<B>) -> Result<Running, ServeError> {
    let grpc_listener = serving::bind(settings.grpc_addr).await?;
    let grpc_addr = serving::local_addr(&grpc_listener, settings.grpc_addr)?;

    let health_reporter = tonic_health::server::HealthReporter::new();
    let health_service =
        HealthServer::new(HealthService::from_health_reporter(health_reporter.clone()));
    let grpc_health = grpc_health::<B>(health_reporter, &built.readiness).await;

    let (stop, stop_rx) = watch::channel(false);
    let lease_sweeper = background::spawn(built.background(), settings, &grpc_health, &stop_rx);
    let (closing, closing_rx) = watch::channel(false);
    let parts = (&built.metrics, &built.readiness);
    let admin = admin_routes::spawn(settings, built.admin, parts, closing_rx.clone()).await?;
    if let Some(tls) = &built.tls {
        tls.spawn_reloader();
    }
    let services = GrpcServices {
        rls: built.service,
        quotas: built.quotas,
        health: health_service,
    };
    let serve_share = services.share(settings, built.tls.as_deref());
    let connections = Arc::new(ConnectionStats::default());
    built.metrics.observe_connections(connections.clone());
    let times = DrainTimes {
        delay: settings.drain_delay,
        timeout: settings.drain_timeout,
    };
    let listening = serving::Listening {
        listener: grpc_listener,
        tls: built.tls,
        limits: ConnectionLimits::from(&settings.security.listener),
        stats: connections.clone(),
    };
    let threads = crate::runtime::serving_threads(settings.worker_threads);
    let closed = closing_rx.clone();
    let grpc = serving::start(listening, threads, serve_share, closed, times.timeout)?;
    tokio::spawn(drain::leaving(
        stop_rx,
        built.readiness.clone(),
        grpc_health,
        connections,
        times.delay,
        closing,
    ));
    let wind_down = WindDown {
        admin_thread: admin.thread,
        local_sweeper: built.local_sweeper,
        lease_sweeper,
        limiter: built.limiter.clone(),
        metrics: built.metrics.clone(),
    };
    let task = tokio::spawn(async move {
        let result = grpc.await;
        wind_down.run().await;
        result
    });

    Ok(Running {
        grpc_addr,
        admin_addr: admin.admin_addr,
        metrics_addr: admin.metrics_addr,
        readiness: built.readiness,
        config: built.config,
        memory_backend: None,
        metrics: built.metrics,
        breakers: built.breakers,
        replicas: built.replicas,
        in_flight: built.limiter.resilience().in_flight().clone(),
        stop,
        task,
    })
}

/// The gRPC services one listener serves.
struct GrpcServices<B: Backend> {
    rls: RateLimitHandler<B>,
    quotas: Arc<Quotas<B>>,
    health: HealthServer<HealthService>,
}

impl<B: Backend> GrpcServices<B> {
    /// Health, RLS and RLQS behind the HTTP/2 limits and the caller allow-list (when the TLS
    /// settings enforce one), as each serving thread runs them.
    fn share(self, settings: &Settings, tls: Option<&TlsState>) -> serving::ServeShare {
        let enforces_allow_list = tls.is_some_and(TlsState::enforces_allow_list);
        let max_bytes = settings.max_message_bytes;
        let rls = RateLimitServer::new(self.rls)
            .max_request_bytes(max_bytes)
            .max_decoding_message_size(TRANSPORT_MAX_MESSAGE_BYTES.max(max_bytes));
        let router = security::grpc_server(&settings.security.http2)
            .layer(AuthorizeLayer::new(enforces_allow_list))
            .add_service(self.health)
            .add_service(rls)
            .add_service(QuotaHandler::new(self.quotas).into_server(max_bytes));
        Arc::new(move |incoming, stop_accepting| {
            Box::pin(
                router
                    .clone()
                    .serve_with_incoming_shutdown(incoming, stop_accepting),
            )
        })
    }
}

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
