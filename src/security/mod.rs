//! Hardening for deployments where the network or the callers are not trusted.
//!
//! - [`tls`]: gRPC over TLS (rustls), optional client certificates (mTLS) and an allow-list of
//!   client identities, with certificate files reloaded when they change.
//! - [`wire`]: the strict request codec of the `RateLimitService` server: malformed protobuf
//!   (invalid UTF-8 in a string field) gets `INVALID_ARGUMENT` naming the field.
//! - [`CallerPolicy`]: neutralises request fields that only a trusted caller should control
//!   (`limit` overrides, `is_negative_hits`). `hits_addend` is bounded for every caller
//!   (`--max-hits-addend`, checked with the other request bounds in [`crate::service`]).
//! - [`grpc_server`]: the gRPC listener with its HTTP/2 limits set explicitly.
//! - [`listener`]: the cap on open connections and the deadline for a connection's handshake
//!   (TLS, the HTTP/2 preface and its SETTINGS).
//!
//! The flags are [`crate::settings::SecurityArgs`]; this module turns them into behaviour.

pub mod listener;
pub mod tls;
pub mod wire;

use envoy_types::pb::google::protobuf::UInt64Value;

use crate::settings::{CallerArgs, Http2Args};
use wire::WireRequest;

impl From<&CallerArgs> for CallerPolicy {
    fn from(args: &CallerArgs) -> Self {
        CallerPolicy {
            ignore_limit_override: args.ignore_limit_override,
            ignore_negative_hits: args.ignore_negative_hits,
        }
    }
}

/// What an untrusted caller may not decide. The default trusts callers fully, as
/// envoyproxy/ratelimit does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallerPolicy {
    /// Drop `RateLimitDescriptor.limit`: a caller cannot pick its own, larger rate (each override
    /// is also a new bucket, so ignoring them also stops bucket creation at will).
    pub ignore_limit_override: bool,
    /// Answer `is_negative_hits` as a refund of zero tokens: the descriptor is reported, nothing
    /// is given back, nothing is taken. A caller cannot refill a bucket it (or others) drained.
    pub ignore_negative_hits: bool,
}

impl CallerPolicy {
    /// Rewrites the fields this policy overrules, before validation: an ignored override is
    /// neither validated nor applied.
    pub fn apply(&self, request: &mut WireRequest) {
        for d in &mut request.descriptors {
            if self.ignore_limit_override {
                d.limit = None;
            }
            if self.ignore_negative_hits && d.is_negative_hits {
                d.hits_addend = Some(UInt64Value { value: 0 });
            }
        }
    }
}

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
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;

    use clap::Parser;

    use super::*;
    use crate::security::wire::{WireDescriptor, WireEntry};
    use crate::settings::{Cli, Command, SecurityArgs};

    fn descriptor(hits: Option<u64>, negative: bool, limit: bool) -> WireDescriptor {
        WireDescriptor {
            entries: vec![WireEntry {
                key: "k".into(),
                value: b"v".to_vec(),
            }],
            limit: limit.then_some(RateLimitOverride {
                requests_per_unit: 1_000_000,
                unit: 1,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        }
    }

    fn request(hits_addend: u32, descriptors: Vec<WireDescriptor>) -> WireRequest {
        WireRequest {
            domain: "d".into(),
            descriptors,
            hits_addend,
        }
    }

    #[test]
    fn default_policy_changes_nothing() {
        let original = request(
            u32::MAX,
            vec![
                descriptor(Some(u64::MAX), true, true),
                descriptor(None, false, false),
            ],
        );
        let mut r = original.clone();
        CallerPolicy::default().apply(&mut r);
        assert_eq!(r, original);
    }

    #[test]
    fn each_rule_of_the_policy() {
        let original = request(
            u32::MAX,
            vec![
                descriptor(Some(u64::MAX), false, true),
                descriptor(Some(5), true, false),
                descriptor(None, true, false),
                descriptor(Some(0), false, false),
            ],
        );

        let mut r = original.clone();
        CallerPolicy {
            ignore_limit_override: true,
            ..Default::default()
        }
        .apply(&mut r);
        assert!(r.descriptors.iter().all(|d| d.limit.is_none()));
        assert_eq!(r.hits_addend, u32::MAX);

        let mut r = original.clone();
        CallerPolicy {
            ignore_negative_hits: true,
            ..Default::default()
        }
        .apply(&mut r);
        let hits: Vec<_> = r
            .descriptors
            .iter()
            .map(|d| d.hits_addend.as_ref().map(|h| h.value))
            .collect();
        assert_eq!(hits, [Some(u64::MAX), Some(0), Some(0), Some(0)]);
    }

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
        assert_eq!(CallerPolicy::from(&s.callers), CallerPolicy::default());
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
        assert_eq!(
            CallerPolicy::from(&s.callers),
            CallerPolicy {
                ignore_limit_override: true,
                ignore_negative_hits: true,
            }
        );
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
