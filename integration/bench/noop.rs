//! The floor: an RLS server that answers OK without doing anything, on the same tonic stack and
//! HTTP/2 settings as sluice (`sluice::security` defaults), so the difference is sluice's work.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

pub struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        _request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

/// Serves until SIGTERM/SIGINT; prints `noop ready grpc=ADDR` once bound.
pub async fn serve(addr: SocketAddr) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("bind {addr}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    println!("noop ready grpc={bound}");
    // sluice's own accept loop (TCP_NODELAY, no TLS), so both servers see the same sockets.
    let incoming = sluice::security::tls::GrpcIncoming::new(listener, None);
    sluice::security::grpc_server(&sluice::settings::Http2Args::default())
        .add_service(RateLimitServiceServer::new(Noop))
        .serve_with_incoming_shutdown(incoming, sluice::server::shutdown_signal())
        .await
        .map_err(|e| format!("serve: {e}"))
}
