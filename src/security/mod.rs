//! Hardening for deployments where the network or the callers are not trusted.
//!
//! - [`tls`]: gRPC over TLS (rustls), optional client certificates (mTLS) and an allow-list of
//!   client identities, with certificate files reloaded when they change.
//! - [`wire`]: the strict request codec of the `RateLimitService` server: malformed protobuf
//!   (invalid UTF-8 in a string field) gets `INVALID_ARGUMENT` naming the field.
//! - [`CallerPolicy`]: neutralises request fields that only a trusted caller should control
//!   (`limit` overrides, `is_negative_hits`, huge `hits_addend`).
//! - [`Http2Args`]: the HTTP/2 limits of the gRPC listener, set explicitly.
//!
//! Every setting lives in [`SecurityArgs`], flattened into [`crate::settings::Settings`].

pub mod tls;
pub mod wire;

use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;

use crate::settings::parse_duration;

/// Security settings of `sluice serve`; every flag also reads `SLUICE_<FLAG_IN_CAPS>`.
#[derive(Clone, Debug, clap::Args)]
pub struct SecurityArgs {
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub callers: CallerArgs,
    #[command(flatten)]
    pub http2: Http2Args,
    /// Most live buckets one rule may hold in the memory backend, so a flood of distinct values
    /// for one rule evicts only that rule's buckets, never another rule's. Unset: only
    /// --memory-max-buckets bounds the store.
    #[arg(long, env = "SLUICE_MEMORY_MAX_BUCKETS_PER_RULE", value_parser = clap::value_parser!(u64).range(1..))]
    pub memory_max_buckets_per_rule: Option<u64>,
}

/// gRPC transport security. Without `--tls-cert` the listener speaks plaintext HTTP/2.
#[derive(Clone, Debug, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain the gRPC listener presents (leaf first). Enables TLS.
    #[arg(long, env = "SLUICE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert.
    #[arg(long, env = "SLUICE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle: clients must present a certificate issued by one of these (mTLS).
    #[arg(long, env = "SLUICE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Client certificate names (DNS, URI such as spiffe://..., or IP SANs) allowed to call;
    /// comma-separated, a trailing `*` matches a prefix. Others get PERMISSION_DENIED.
    #[arg(
        long,
        env = "SLUICE_TLS_ALLOWED_SANS",
        value_delimiter = ',',
        requires = "tls_client_ca"
    )]
    pub tls_allowed_sans: Vec<String>,

    /// How often the certificate, key and CA files are checked for changes.
    #[arg(long, env = "SLUICE_TLS_RELOAD_INTERVAL", value_parser = parse_duration, default_value = "10s")]
    pub tls_reload_interval: Duration,

    /// A client that has not finished its TLS handshake by then is disconnected.
    #[arg(long, env = "SLUICE_TLS_HANDSHAKE_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub tls_handshake_timeout: Duration,
}

/// Settings for callers that are not trusted to size their own hits.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct CallerArgs {
    /// Ignore a descriptor's `limit` override: the configured rule applies.
    #[arg(
        long,
        env = "SLUICE_IGNORE_LIMIT_OVERRIDE",
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub ignore_limit_override: bool,

    /// Ignore `is_negative_hits`: a refund request gives back nothing (and takes nothing).
    #[arg(
        long,
        env = "SLUICE_IGNORE_NEGATIVE_HITS",
        num_args = 0..=1,
        default_value_t = false,
        default_missing_value = "true",
        action = clap::ArgAction::Set
    )]
    pub ignore_negative_hits: bool,

    /// Largest `hits_addend` honoured, request- or descriptor-level; larger values count as this.
    #[arg(long, env = "SLUICE_MAX_HITS_ADDEND", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_hits_addend: Option<u64>,
}

impl CallerArgs {
    pub fn policy(&self) -> CallerPolicy {
        CallerPolicy {
            ignore_limit_override: self.ignore_limit_override,
            ignore_negative_hits: self.ignore_negative_hits,
            max_hits_addend: self.max_hits_addend,
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
    /// Clamp the request's and every descriptor's `hits_addend` to this.
    pub max_hits_addend: Option<u64>,
}

impl CallerPolicy {
    /// Rewrites the fields this policy overrules, before validation: an ignored override is
    /// neither validated nor applied.
    pub fn apply(&self, request: &mut RateLimitRequest) {
        if let Some(max) = self.max_hits_addend {
            request.hits_addend = u64::from(request.hits_addend).min(max) as u32;
        }
        for d in &mut request.descriptors {
            if self.ignore_limit_override {
                d.limit = None;
            }
            if self.ignore_negative_hits && d.is_negative_hits {
                d.hits_addend = Some(UInt64Value { value: 0 });
            }
            if let (Some(max), Some(h)) = (self.max_hits_addend, d.hits_addend.as_mut()) {
                h.value = h.value.min(max);
            }
        }
    }
}

/// HTTP/2 limits of the gRPC listener. Set explicitly rather than left to library defaults, so a
/// version bump cannot silently change what one connection may cost.
#[derive(Clone, Debug, clap::Args)]
pub struct Http2Args {
    /// Concurrent RPCs on one connection.
    #[arg(
        long,
        env = "SLUICE_GRPC_MAX_CONCURRENT_STREAMS",
        default_value_t = 1024
    )]
    pub grpc_max_concurrent_streams: u32,

    /// HTTP/2 PING interval on idle connections (dead peers are found and closed).
    #[arg(long, env = "SLUICE_GRPC_KEEPALIVE_INTERVAL", value_parser = parse_duration, default_value = "30s")]
    pub grpc_keepalive_interval: Duration,

    /// A PING not answered within this closes the connection.
    #[arg(long, env = "SLUICE_GRPC_KEEPALIVE_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub grpc_keepalive_timeout: Duration,

    /// Largest header list (all request headers of one RPC, uncompressed) accepted.
    #[arg(long, env = "SLUICE_GRPC_MAX_HEADER_LIST_BYTES", default_value_t = 16 * 1024)]
    pub grpc_max_header_list_bytes: u32,

    /// Flow-control window of one stream: what one RPC may send before the server reads.
    #[arg(long, env = "SLUICE_GRPC_INITIAL_STREAM_WINDOW_BYTES", default_value_t = 256 * 1024)]
    pub grpc_initial_stream_window_bytes: u32,

    /// Flow-control window of one connection, shared by its streams.
    #[arg(long, env = "SLUICE_GRPC_INITIAL_CONNECTION_WINDOW_BYTES", default_value_t = 1024 * 1024)]
    pub grpc_initial_connection_window_bytes: u32,

    /// Largest HTTP/2 frame payload accepted (16384 to 16777215).
    #[arg(long, env = "SLUICE_GRPC_MAX_FRAME_BYTES", default_value_t = 16 * 1024,
          value_parser = clap::value_parser!(u32).range(16_384..=16_777_215))]
    pub grpc_max_frame_bytes: u32,

    /// Streams a client may open and reset before the server has accepted them (the HTTP/2
    /// "rapid reset" attack); beyond it the connection is closed.
    #[arg(long, env = "SLUICE_GRPC_MAX_PENDING_RESETS", default_value_t = 20)]
    pub grpc_max_pending_resets: usize,
}

impl Default for Http2Args {
    fn default() -> Self {
        Http2Args {
            grpc_max_concurrent_streams: 1024,
            grpc_keepalive_interval: Duration::from_secs(30),
            grpc_keepalive_timeout: Duration::from_secs(10),
            grpc_max_header_list_bytes: 16 * 1024,
            grpc_initial_stream_window_bytes: 256 * 1024,
            grpc_initial_connection_window_bytes: 1024 * 1024,
            grpc_max_frame_bytes: 16 * 1024,
            grpc_max_pending_resets: 20,
        }
    }
}

impl Http2Args {
    /// A tonic server builder with these limits; HTTP/1 is refused (gRPC needs HTTP/2).
    pub fn server(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .accept_http1(false)
            .max_concurrent_streams(self.grpc_max_concurrent_streams)
            .http2_keepalive_interval(Some(self.grpc_keepalive_interval))
            .http2_keepalive_timeout(Some(self.grpc_keepalive_timeout))
            .http2_max_header_list_size(self.grpc_max_header_list_bytes)
            .initial_stream_window_size(self.grpc_initial_stream_window_bytes)
            .initial_connection_window_size(self.grpc_initial_connection_window_bytes)
            .http2_adaptive_window(Some(false))
            .max_frame_size(self.grpc_max_frame_bytes)
            .http2_max_pending_accept_reset_streams(Some(self.grpc_max_pending_resets))
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };

    use clap::Parser;

    use super::*;
    use crate::settings::{Cli, Command};

    fn descriptor(hits: Option<u64>, negative: bool, limit: bool) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            limit: limit.then_some(RateLimitOverride {
                requests_per_unit: 1_000_000,
                unit: 1,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        }
    }

    fn request(hits_addend: u32, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
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
            max_hits_addend: Some(10),
            ..Default::default()
        }
        .apply(&mut r);
        assert_eq!(r.hits_addend, 10);
        let hits: Vec<_> = r
            .descriptors
            .iter()
            .map(|d| d.hits_addend.as_ref().map(|h| h.value))
            .collect();
        assert_eq!(hits, [Some(10), Some(5), None, Some(0)]);
        assert!(r.descriptors[0].limit.is_some());

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

    #[test]
    fn request_cap_above_u32_keeps_the_request_value() {
        let mut r = request(7, vec![]);
        CallerPolicy {
            max_hits_addend: Some(u64::MAX),
            ..Default::default()
        }
        .apply(&mut r);
        assert_eq!(r.hits_addend, 7);
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
        assert_eq!(s.callers.policy(), CallerPolicy::default());
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
            s.callers.policy(),
            CallerPolicy {
                ignore_limit_override: true,
                ignore_negative_hits: true,
                max_hits_addend: Some(100),
            }
        );
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
