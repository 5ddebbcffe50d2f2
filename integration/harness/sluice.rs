//! sluice itself, started in this process with `sluice::server::start` against harness Redis
//! processes, so a test can watch its breakers and replica count while it drives it over gRPC.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::resilience::breaker::BreakerState;
use sluice::server::{self, Running};
use sluice::settings::{BackendKind, RedisModeArg, Settings};
use tonic::transport::Channel;

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

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
        settings.redis_sentinel_master = super::sentinel::MASTER_NAME.into();
        settings.redis_timeout = Duration::from_millis(50);
        settings.redis_connect_timeout = Duration::from_secs(2);
        settings.drain_timeout = Duration::from_millis(200);
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

/// A request of one descriptor per `(key, value)`.
pub fn request(domain: &str, descriptors: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|(k, v)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// The value of a response header, if present.
pub fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

/// A minimal HTTP/1.0 GET: (status code, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
