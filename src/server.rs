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
use crate::backend::redis::{RedisBackend, RedisMode, RedisOptions};
use crate::clock::MonotonicClock;
use crate::config::{self, Config, ConfigErrors, ConfigStore};
use crate::limiter::{Limiter, LimiterOptions};
use crate::security::tls::{AuthorizeLayer, GrpcIncoming, TlsState};
use crate::security::wire::RateLimitServer;
use crate::service::{HeaderOptions, RateLimitGrpc, RequestBounds};
use crate::settings::{BackendKind, RedisModeArg, Settings};
use crate::xds::{self, ConfigSource};

/// Hard ceiling tonic enforces before our own `max_message_bytes` check can name the field.
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
}

/// A started service: its bound addresses and a handle to stop it.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub readiness: Arc<Readiness>,
    pub config: Arc<ConfigStore>,
    /// The embedded backend, when it is the one serving (tests watch its bounds).
    pub memory_backend: Option<Arc<MemoryBackend>>,
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

    let running = match settings.backend {
        BackendKind::Memory => {
            let backend = Arc::new(MemoryBackend::new(
                Arc::new(MonotonicClock::new()),
                MemoryOptions {
                    max_buckets: settings.memory_max_buckets,
                    max_buckets_per_rule: settings
                        .security
                        .memory_max_buckets_per_rule
                        .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                    ..MemoryOptions::default()
                },
            ));
            let sweeper = backend.spawn_sweeper(Duration::from_secs(1));
            let running = serve(settings, config, backend.clone(), config_loaded).await;
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
                .map_err(|e| ServeError::Backend(e.to_string()))?;
            serve(settings, config, backend, config_loaded).await
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

async fn serve<B: Backend>(
    settings: Settings,
    config: Arc<ConfigStore>,
    backend: B,
    config_loaded: bool,
) -> Result<Running, ServeError> {
    let tls = match settings.security.tls.settings() {
        None => None,
        Some(tls) => Some(TlsState::load(tls).map_err(|e| ServeError::Setting(e.to_string()))?),
    };
    let readiness = Arc::new(Readiness::default());
    readiness.set_config_loaded(config_loaded);
    readiness.set_backend_ready(backend.probe().await.is_ok());

    let limiter = Arc::new(Limiter::new(
        config.active().clone(),
        backend,
        LimiterOptions {
            key_prefix: settings.key_prefix.clone(),
            default_failure_mode: settings.failure_mode.into(),
        },
    ));
    let service = RateLimitGrpc::new(
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
        },
    );

    let grpc_listener = bind(settings.grpc_addr).await?;
    let admin_listener = bind(settings.admin_addr).await?;
    let grpc_addr = local_addr(&grpc_listener, settings.grpc_addr)?;
    let admin_addr = local_addr(&admin_listener, settings.admin_addr)?;

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let rls_name = <RateLimitServiceServer<RateLimitGrpc<B>> as tonic::server::NamedService>::NAME;
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    health_reporter
        .set_service_status(rls_name, tonic_health::ServingStatus::Serving)
        .await;

    let (stop_tx, stop_rx) = watch::channel(false);

    let admin_router = admin::router(AdminState {
        config: config.clone(),
        readiness: readiness.clone(),
    })
    .merge(crate::explain::router(
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
        result
    });

    Ok(Running {
        grpc_addr,
        admin_addr,
        readiness,
        config,
        memory_backend: None,
        stop: stop_tx,
        task,
    })
}

fn explain_options(settings: &Settings) -> crate::explain::ExplainOptions {
    crate::explain::ExplainOptions {
        key_prefix: settings.key_prefix.clone(),
        default_failure_mode: settings.failure_mode.into(),
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
        expiry_jitter_max: settings.expiry_jitter_max,
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
