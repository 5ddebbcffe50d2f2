//! sluice itself, started in this process with `sluice::server::start` on loopback port 0 with a
//! config written to a temp dir: [`TestServer`] on the memory backend with its own RLS client,
//! [`Sluice`] against harness Redis processes, so a test can watch its breakers and replica count
//! while it drives it over gRPC.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::resilience::breaker::BreakerState;
use sluice::server::{self, Running};
use sluice::settings::{BackendKind, RedisModeArg, Settings};
use tonic::transport::Channel;

use crate::rls::http_get;

/// A running sluice on loopback ports with a config from a temp dir.
pub struct Sluice {
    running: Option<Running>,
    _dir: tempfile::TempDir,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
}

impl Sluice {
    /// `mode`: standalone, cluster or sentinel; `tweak` sets anything else (failure mode,
    /// timeouts, ...). The Redis timeout defaults to 50 ms here: a shared 2-core machine must
    /// not turn a slow healthy reply into a degraded decision.
    pub async fn start(
        config: &str,
        urls: &[String],
        mode: RedisModeArg,
        tweak: impl FnOnce(&mut Settings),
    ) -> Sluice {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.yaml"), config).unwrap();
        let mut settings = Settings::with_config(dir.path());
        settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
        settings.admin_addr = "127.0.0.1:0".parse().unwrap();
        settings.backend = BackendKind::Redis;
        settings.redis_url = urls.to_vec();
        settings.redis_mode = mode;
        settings.redis_sentinel_master = crate::sentinel::MASTER_NAME.into();
        settings.redis_timeout = Duration::from_millis(50);
        settings.redis_connect_timeout = Duration::from_secs(2);
        settings.drain_timeout = Duration::from_millis(200);
        // Tests stop servers with clients connected; nobody health-checks them.
        settings.drain_delay = Duration::ZERO;
        tweak(&mut settings);
        let running = server::start(settings).await.expect("sluice starts");
        Sluice {
            grpc: running.grpc_addr,
            admin: running.admin_addr,
            running: Some(running),
            _dir: dir,
        }
    }

    pub fn running(&self) -> &Running {
        self.running.as_ref().expect("running")
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("client connects")
    }

    /// Every Redis endpoint and its breaker state.
    pub fn breakers(&self) -> Vec<(String, BreakerState)> {
        self.running()
            .breakers
            .as_ref()
            .map(|b| b.states())
            .unwrap_or_default()
    }

    /// True when some endpoint's breaker is not closed.
    pub fn any_breaker_open(&self) -> bool {
        self.breakers()
            .iter()
            .any(|(_, s)| *s != BreakerState::Closed)
    }

    pub fn replicas(&self) -> u64 {
        self.running().replicas.current()
    }

    /// `GET path` on the admin listener: (status, body).
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        let addr = self.admin;
        let path = path.to_string();
        tokio::task::spawn_blocking(move || http_get(addr, &path))
            .await
            .unwrap()
    }

    /// gRPC health of the rate-limit service name (SERVING = 1, NOT_SERVING = 2).
    pub async fn grpc_health(&self) -> i32 {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap();
        tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest {
                service: "envoy.service.ratelimit.v3.RateLimitService".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status
    }

    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown().await.expect("clean shutdown");
        }
    }
}

/// sluice on the memory backend, with an RLS client connected to it.
pub struct TestServer {
    pub running: Option<Running>,
    pub dir: tempfile::TempDir,
    pub client: RateLimitServiceClient<Channel>,
}

impl TestServer {
    /// Starts sluice (memory backend) on loopback port 0 with `files` as its config directory.
    pub async fn start(files: &[(&str, &str)]) -> TestServer {
        Self::start_with(files, |_| {}).await
    }

    pub async fn start_with(
        files: &[(&str, &str)],
        tweak: impl FnOnce(&mut Settings),
    ) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        let mut settings = Settings::with_config(dir.path());
        settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
        settings.admin_addr = "127.0.0.1:0".parse().unwrap();
        settings.drain_delay = Duration::ZERO;
        tweak(&mut settings);
        let running = server::start(settings).await.expect("server starts");
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
            .await
            .expect("client connects");
        TestServer {
            running: Some(running),
            dir,
            client,
        }
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.running.as_ref().unwrap().grpc_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.running.as_ref().unwrap().admin_addr
    }

    pub async fn call(
        &mut self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .should_rate_limit(request)
            .await
            .map(|r| r.into_inner())
    }

    pub async fn ok(&mut self, request: RateLimitRequest) -> RateLimitResponse {
        self.call(request).await.expect("call succeeds")
    }

    pub async fn stop(mut self) {
        if let Some(r) = self.running.take() {
            r.shutdown().await.expect("clean shutdown");
        }
    }
}
