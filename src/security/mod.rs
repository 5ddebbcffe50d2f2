//! Hardening for deployments where the network or the callers are not trusted.
//!
//! - [`tls`]: gRPC over TLS (rustls), optional client certificates (mTLS) and an allow-list of
//!   client identities, with certificate files reloaded when they change.
//! - The RLS edge's own guards, [`crate::rls::wire`] (the strict request codec) and
//!   [`crate::rls::caller::CallerPolicy`] (request fields only a trusted caller may set), live
//!   with that edge.
//! - [`grpc_server`]: the gRPC listener with its HTTP/2 limits set explicitly.
//! - [`listener`]: the cap on open connections and the deadline for a connection's handshake
//!   (TLS, the HTTP/2 preface and its SETTINGS).
//!
//! The flags are [`crate::settings::SecurityArgs`]; this module turns them into behaviour.

pub mod listener;
pub mod tls;

use crate::settings::Http2Args;

/// A tonic server builder with the HTTP/2 `limits`, set explicitly rather than left to library
/// defaults, so a version bump cannot silently change what one connection may cost. HTTP/1 is
/// refused (gRPC needs HTTP/2).
pub fn grpc_server(limits: &Http2Args) -> tonic::transport::Server {
    let l = limits;
    tonic::transport::Server::builder()
        .accept_http1(false)
        .max_concurrent_streams(l.grpc_max_concurrent_streams)
        .http2_keepalive_interval(Some(l.grpc_keepalive_interval))
        .http2_keepalive_timeout(Some(l.grpc_keepalive_timeout))
        .http2_max_header_list_size(l.grpc_max_header_list_bytes)
        .initial_stream_window_size(l.grpc_initial_stream_window_bytes)
        .initial_connection_window_size(l.grpc_initial_connection_window_bytes)
        .http2_adaptive_window(Some(false))
        .max_frame_size(l.grpc_max_frame_bytes)
        .http2_max_pending_accept_reset_streams(Some(l.grpc_max_pending_resets))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::settings::{Cli, Command, SecurityArgs};

    fn parse(args: &[&str]) -> Result<SecurityArgs, clap::Error> {
        let mut all = vec!["sluice", "serve", "--config", "c"];
        all.extend_from_slice(args);
        Cli::try_parse_from(all).map(|cli| match cli.command {
            Command::Serve(s) => s.security.clone(),
            _ => unreachable!("parsed serve"),
        })
    }

    #[test]
    fn flags_parse_and_tls_flags_require_each_other() {
        let s = parse(&[]).unwrap();
        assert!(s.tls.tls_cert.is_none());
        assert!(!s.callers.ignore_limit_override && !s.callers.ignore_negative_hits);
        assert_eq!(s.callers.max_hits_addend, u64::from(u32::MAX));
        assert_eq!(s.http2.grpc_max_concurrent_streams, 1024);

        let s = parse(&[
            "--ignore-limit-override",
            "--ignore-negative-hits",
            "true",
            "--max-hits-addend",
            "100",
            "--memory-max-buckets-per-rule",
            "5000",
        ])
        .unwrap();
        assert!(s.callers.ignore_limit_override && s.callers.ignore_negative_hits);
        assert_eq!(s.callers.max_hits_addend, 100);
        assert_eq!(s.memory_max_buckets_per_rule, Some(5000));

        assert!(parse(&["--max-hits-addend", "0"]).is_err());
        assert!(parse(&["--tls-cert", "c.pem"]).is_err(), "needs a key");
        assert!(parse(&["--tls-key", "k.pem"]).is_err(), "needs a cert");
        assert!(
            parse(&["--tls-client-ca", "ca.pem"]).is_err(),
            "needs a cert"
        );
        assert!(
            parse(&[
                "--tls-cert",
                "c",
                "--tls-key",
                "k",
                "--tls-allowed-sans",
                "a"
            ])
            .is_err(),
            "an allow-list needs client certificates"
        );
        let s = parse(&[
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--tls-client-ca",
            "ca",
            "--tls-allowed-sans",
            "spiffe://a,b.example",
        ])
        .unwrap();
        assert_eq!(s.tls.tls_allowed_sans, ["spiffe://a", "b.example"]);
        assert!(parse(&["--grpc-max-frame-bytes", "1000"]).is_err());
    }
}
