//! What runs beside the listeners until the stop signal: the RLQS pushes, the health watcher
//! (a heartbeat probe when traffic is quiet, readiness and gRPC health kept in line) and the
//! lease sweeper.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::drain::GrpcHealth;
use crate::admin::Readiness;
use crate::backend::Backend;
use crate::backend::redis::RedisBackend;
use crate::limiter::Limiter;
use crate::quota::Quotas;
use crate::resilience;
use crate::resilience::local::Replicas;
use crate::rule::FailureMode;
use crate::settings::Settings;

/// How often readiness (admin and gRPC health) is re-evaluated, and the backend probed unless live
/// traffic was answered within the interval. The probe is also what closes an open breaker when
/// no traffic arrives.
const HEALTH_INTERVAL: Duration = Duration::from_millis(500);
/// How often each replica refreshes its heartbeat in Redis, and how long a silent one still
/// counts: a stopped replica is forgotten within the TTL, a new one counted within an interval.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
const HEARTBEAT_TTL: Duration = Duration::from_secs(5);

/// What the background tasks work on.
pub(super) struct Background<B: Backend> {
    pub(super) quotas: Arc<Quotas<B>>,
    pub(super) limiter: Arc<Limiter<B>>,
    pub(super) readiness: Arc<Readiness>,
    /// The backend answered its first probe.
    pub(super) answered: bool,
}

/// Starts what runs beside the listeners until `stop`: the RLQS pushes, the health watcher and
/// the lease sweeper (returned: shutdown waits for its last sweep).
pub(super) fn spawn<B: Backend>(
    parts: Background<B>,
    settings: &Settings,
    grpc_health: &GrpcHealth,
    stop: &watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(parts.quotas.run(stop.clone()));
    spawn_health(
        parts.limiter.clone(),
        parts.readiness,
        grpc_health.clone(),
        parts.answered,
        settings.failure_mode.into(),
        stop.clone(),
    );
    tokio::spawn(sweep_leases(
        parts.limiter,
        lease_sweep_interval(settings.lease_lifetime),
        stop.clone(),
    ))
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
pub(super) struct Heartbeat {
    backend: RedisBackend,
    key: String,
    member: String,
    replicas: Arc<Replicas>,
    /// A heartbeat succeeded, or its failure was already reported.
    counted: std::sync::atomic::AtomicBool,
}

impl Heartbeat {
    pub(super) fn new(backend: &RedisBackend, key_prefix: &str, replicas: Arc<Replicas>) -> Self {
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
    pub(super) async fn beat(&self) {
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

    pub(super) fn spawn(self, mut stop: watch::Receiver<bool>) {
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
