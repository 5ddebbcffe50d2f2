//! Leaving: the shutdown sequence after SIGTERM/SIGINT or [`super::Running::shutdown`].
//!
//! 1. Readiness (`/readyz`) and gRPC health turn NOT_SERVING at once.
//! 2. While any gRPC connection is open, sluice keeps accepting and answering for
//!    `--drain-delay`: a caller that health-checks it (Envoy's active gRPC health check, a
//!    Kubernetes readiness probe) takes it out of rotation first. A call that reached a closed
//!    listener instead would be an error, which Envoy's default `failure_mode_deny: false` turns
//!    into an unlimited request. With no connection open there is nobody to warn: no delay.
//! 3. The gRPC listener closes (HTTP/2 GOAWAY on open connections) and in-flight calls finish,
//!    for at most `--drain-timeout`; the admin listener closes with it.
//! 4. [`WindDown`]: sweepers stop, leased tokens go back to their buckets, metrics flush.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::ServeError;
use crate::admin::Readiness;
use crate::backend::Backend;
use crate::limiter::Limiter;
use crate::security::listener::ConnectionStats;
use crate::telemetry::Metrics;

/// The statuses gRPC health reports for the service names sluice serves.
#[derive(Clone)]
pub(super) struct GrpcHealth {
    pub(super) reporter: tonic_health::server::HealthReporter,
    pub(super) names: [&'static str; 3],
}

impl GrpcHealth {
    pub(super) async fn set(&self, ready: bool) {
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

/// What leaving takes (`--drain-delay`, `--drain-timeout`).
#[derive(Clone, Copy, Debug)]
pub(super) struct DrainTimes {
    pub delay: Duration,
    pub timeout: Duration,
}

/// Steps 1 and 2: resolves when the gRPC server should stop accepting (it then drains), after
/// sending `closing`, which also closes the admin listener.
pub(super) async fn leaving(
    mut stop: watch::Receiver<bool>,
    readiness: Arc<Readiness>,
    health: GrpcHealth,
    connections: Arc<ConnectionStats>,
    delay: Duration,
    closing: watch::Sender<bool>,
) {
    let _ = stop.wait_for(|s| *s).await;
    readiness.set_draining(true);
    health.set(false).await;
    let open = connections.open();
    if open > 0 && !delay.is_zero() {
        tracing::info!(
            ?delay,
            connections = open,
            "leaving: NOT_SERVING, still answering for the drain delay"
        );
        tokio::time::sleep(delay).await;
    }
    tracing::info!("shutting down: no new connections, draining in-flight calls");
    let _ = closing.send(true);
}

/// Step 3: runs the gRPC server until it has drained after `closing`, or until `timeout` has
/// passed since (the remaining calls are then closed).
pub(super) async fn drained(
    server: impl Future<Output = Result<(), tonic::transport::Error>>,
    mut closing: watch::Receiver<bool>,
    timeout: Duration,
) -> Result<(), ServeError> {
    tokio::select! {
        r = server => r.map_err(ServeError::from),
        () = async move {
            let _ = closing.wait_for(|s| *s).await;
            tokio::time::sleep(timeout).await;
        } => {
            tracing::warn!(?timeout, "drain timeout reached; closing remaining calls");
            Ok(())
        }
    }
}

/// What is left to stop once the gRPC server has: the admin listener, the sweepers, the leases
/// and the metric exporter.
pub(super) struct WindDown<B> {
    pub(super) admin_thread: crate::admin::listener::AdminThread,
    pub(super) local_sweeper: Option<JoinHandle<()>>,
    pub(super) lease_sweeper: JoinHandle<()>,
    pub(super) limiter: Arc<Limiter<B>>,
    pub(super) metrics: Metrics,
}

impl<B: Backend> WindDown<B> {
    pub(super) async fn run(self) {
        self.admin_thread.join().await;
        if let Some(sweeper) = self.local_sweeper {
            sweeper.abort();
        }
        // Calls have drained: no lease is spent any more, so every leased token goes back.
        let _ = self.lease_sweeper.await;
        match tokio::time::timeout(LEASE_RETURN_DEADLINE, self.limiter.return_all_leases()).await {
            Ok(0) => {}
            Ok(tokens) => tracing::info!(tokens, "leased tokens handed back"),
            Err(_) => tracing::warn!(
                deadline = ?LEASE_RETURN_DEADLINE,
                "leased tokens not handed back in time; the buckets refill them"
            ),
        }
        // Pushes the last OTLP batch; blocks on the exporter, so off the async workers.
        let metrics = self.metrics;
        let _ = tokio::task::spawn_blocking(move || metrics.shutdown()).await;
    }
}

/// How long shutdown waits for the backend to take the unused leased tokens back.
const LEASE_RETURN_DEADLINE: Duration = Duration::from_secs(2);
