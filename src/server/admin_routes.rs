//! The admin listener's routes over what the server built: health, readiness, config, metrics,
//! explain, buckets, top keys, the page, and the envoyproxy/ratelimit routes.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

use super::ServeError;
use crate::admin::listener::{AdminThread, ListenerLimits};
use crate::admin::{self, AdminState, Readiness};
use crate::backend::Backend;
use crate::config::ConfigStore;
use crate::limiter::Limiter;
use crate::quota::Quotas;
use crate::resilience::local::Replicas;
use crate::settings::{BackendKind, Settings};
use crate::telemetry::Metrics;
use crate::top::TopRecorder;

/// What the admin routes read.
pub(super) struct AdminParts<'a, B> {
    pub settings: &'a Settings,
    pub config: &'a Arc<ConfigStore>,
    pub readiness: &'a Arc<Readiness>,
    pub metrics: &'a Metrics,
    pub limiter: &'a Arc<Limiter<B>>,
    pub quotas: &'a Arc<Quotas<B>>,
    pub replicas: &'a Arc<Replicas>,
    pub top: Option<Arc<TopRecorder>>,
}

/// Every admin route behind the [`admin::guard`]; an error when `--admin-write` has no token or
/// the token file cannot be read.
pub(super) fn router<B: Backend>(parts: &AdminParts<'_, B>) -> Result<axum::Router, ServeError> {
    let admin = &parts.settings.admin;
    let token = match &admin.admin_token_file {
        Some(path) => Some(
            admin::guard::TokenFile::open(path.clone())
                .map_err(|e| ServeError::Setting(format!("--admin-token-file: {e}")))?,
        ),
        None if parts.settings.admin_write => {
            return Err(ServeError::Setting(
                "--admin-write needs --admin-token-file: resets are only for callers holding \
                 the operator token"
                    .to_owned(),
            ));
        }
        None => None,
    };
    let guard = admin::guard::Guard::new(token, &admin.admin_host, parts.metrics.admin());
    Ok(routes(parts).layer(axum::middleware::from_fn_with_state(
        Arc::new(guard),
        admin::guard::guard,
    )))
}

fn routes<B: Backend>(parts: &AdminParts<'_, B>) -> axum::Router {
    let AdminParts {
        settings,
        config,
        readiness,
        metrics,
        limiter,
        quotas,
        replicas,
        top,
    } = parts;
    let page = admin::page::PageState {
        readiness: Arc::clone(readiness),
        replicas: Arc::clone(replicas),
        backend: match settings.backend {
            BackendKind::Memory => "memory",
            BackendKind::Redis => "redis",
        },
        breakers: {
            let limiter = Arc::clone(limiter);
            Arc::new(move || limiter.breaker_states())
        },
    };
    admin::router(AdminState {
        config: Arc::clone(config),
        readiness: Arc::clone(readiness),
        metrics: (*metrics).clone(),
    })
    .merge(admin::explain::router(
        Arc::clone(config),
        explain_options(settings),
    ))
    .merge(admin::buckets::router(admin::buckets::BucketsState {
        config: Arc::clone(config),
        options: explain_options(settings),
        limiter: Arc::clone(limiter),
        quotas: Arc::clone(quotas),
        write: settings.admin_write,
        metrics: metrics.admin(),
        rls: tokio::runtime::Handle::current(),
    }))
    .merge(admin::top::router(top.clone()))
    .merge(admin::page::router(page))
    .merge(crate::compat::router(Arc::clone(readiness)))
}

fn explain_options(settings: &Settings) -> crate::explain::ExplainOptions {
    crate::explain::ExplainOptions {
        key_prefix: settings.key_prefix.clone(),
        default_failure_mode: settings.failure_mode.into(),
    }
}

/// The admin listener's thread and the addresses it serves.
pub(super) struct AdminListening {
    pub thread: AdminThread,
    pub admin_addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
}

/// Binds `--admin-addr` (and `--metrics-addr` when set), and serves the admin router there (and
/// the metrics-only one on the other) on the admin listener's own thread until `stop`.
pub(super) async fn spawn(
    settings: &Settings,
    router: axum::Router,
    (metrics, readiness): (&Metrics, &Arc<Readiness>),
    stop: watch::Receiver<bool>,
) -> Result<AdminListening, ServeError> {
    let unbound = |addr: SocketAddr| move |source| ServeError::Bind { addr, source };
    let admin = super::serving::bind(settings.admin_addr).await?;
    let admin_addr = super::serving::local_addr(&admin, settings.admin_addr)?;
    let mut listeners = vec![(admin.into_std().map_err(unbound(admin_addr))?, router)];
    let mut metrics_addr = None;
    if let Some(addr) = settings.admin.metrics_addr {
        let listener = super::serving::bind(addr).await?;
        metrics_addr = Some(super::serving::local_addr(&listener, addr)?);
        let listener = listener.into_std().map_err(unbound(addr))?;
        let router = admin::metrics_router(metrics.clone(), Arc::clone(readiness));
        listeners.push((listener, router));
    }
    let limits = ListenerLimits {
        max_connections: usize::try_from(settings.admin.admin_max_connections)
            .unwrap_or(usize::MAX),
        header_timeout: settings.admin.admin_header_timeout,
        idle_timeout: settings.admin.admin_idle_timeout,
    };
    let thread = admin::listener::spawn(listeners, limits, metrics.admin(), stop)
        .map_err(unbound(admin_addr))?;
    Ok(AdminListening {
        thread,
        admin_addr,
        metrics_addr,
    })
}
