//! Security flags of `serve`: TLS, what untrusted callers may decide, HTTP/2 limits.

use std::path::PathBuf;
use std::time::Duration;

use super::flags::{duration_text, parse_duration};
use crate::rls::RequestBounds;
use crate::security::listener::ConnectionLimits;

/// Security settings of `sluice serve`; every flag also reads `SLUICE_<FLAG_IN_CAPS>`.
#[derive(Clone, Debug, clap::Args)]
pub struct SecurityArgs {
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub callers: CallerArgs,
    #[command(flatten)]
    pub http2: Http2Args,
    #[command(flatten)]
    pub listener: ListenerArgs,
    /// Most live buckets one rule may hold in the memory backend (and in the `local` policy's
    /// store), so a flood of distinct values for one rule fills only that rule's share; no bucket
    /// that still counts is evicted, a new one past the bound is answered by the rule's failure
    /// policy. Unset: a quarter of --memory-max-buckets.
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
#[derive(Clone, Debug, clap::Args)]
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

    /// Largest `hits_addend` honoured, request- or descriptor-level; larger values count as this
    /// (clamped, not refused: a refused call is let through by Envoy's default
    /// `failure_mode_deny: false`). The default is the range of Envoy's own request-level field
    /// (uint32): no legitimate count of hits or bytes per request reaches it, and it bounds what
    /// one call adds to a hit counter.
    #[arg(long, env = "SLUICE_MAX_HITS_ADDEND", default_value_t = RequestBounds::DEFAULT_MAX_HITS_ADDEND,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_hits_addend: u64,
}

/// What one connection to the gRPC listener may cost before it carries an RPC.
#[derive(Clone, Debug, clap::Args)]
pub struct ListenerArgs {
    /// Most open gRPC connections (pending TLS handshakes included); past it a new connection
    /// is closed as soon as it is accepted.
    #[arg(long, env = "SLUICE_MAX_CONNECTIONS", default_value_t = ConnectionLimits::DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,

    /// A connection that has not completed TLS (when on), the HTTP/2 client preface and its
    /// SETTINGS frame within this after it was accepted is closed.
    #[arg(long, env = "SLUICE_HANDSHAKE_TIMEOUT", value_parser = parse_duration,
          default_value = duration_text(ConnectionLimits::DEFAULT_HANDSHAKE_TIMEOUT))]
    pub handshake_timeout: Duration,
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
    /// Every limit at its flag's default.
    fn default() -> Self {
        super::Settings::defaults().security.http2
    }
}
