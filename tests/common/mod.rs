//! Shared helpers for in-process end-to-end tests: start the real server on free ports with a
//! config written to a temp dir, and talk to it with Envoy's own RLS client.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use sluice::server::{self, Running};
use sluice::settings::Settings;
use tonic::transport::Channel;

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

/// A descriptor from `k=v` pairs.
pub fn desc(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
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

pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

/// A minimal HTTP/1.0 GET: returns (status code, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
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
