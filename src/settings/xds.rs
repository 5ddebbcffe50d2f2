//! Flags of `serve` for taking config from an xDS management server.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::flags::{ConfigSourceArg, parse_duration};

/// Flags for taking config from an xDS server. Every one also reads `SLUICE_<FLAG>`; those left
/// unset fall back to envoyproxy/ratelimit's variable named in the help.
#[derive(Clone, Debug, Args)]
pub struct XdsArgs {
    /// Where descriptor configs come from [default: file] (envoyproxy: CONFIG_TYPE=FILE|GRPC_XDS_SOTW).
    #[arg(long, env = "SLUICE_CONFIG_SOURCE", value_enum)]
    pub config_source: Option<ConfigSourceArg>,

    /// The management server: host:port or http(s)://host:port [default: localhost:18000]
    /// (envoyproxy: CONFIG_GRPC_XDS_SERVER_URL).
    #[arg(long, env = "SLUICE_XDS_SERVER")]
    pub xds_server: Option<String>,

    /// Node id the management server keys its snapshot on [default: default]
    /// (envoyproxy: CONFIG_GRPC_XDS_NODE_ID).
    #[arg(long, env = "SLUICE_XDS_NODE_ID")]
    pub xds_node_id: Option<String>,

    /// Node metadata: `k1=v1,k2=v2` (string values) or a JSON object
    /// (envoyproxy: CONFIG_GRPC_XDS_NODE_METADATA).
    #[arg(long, env = "SLUICE_XDS_NODE_METADATA")]
    pub xds_node_metadata: Option<String>,

    /// Use TLS to the management server [default: on for https:// URLs or when a TLS file is
    /// given] (envoyproxy: CONFIG_GRPC_XDS_SERVER_USE_TLS).
    #[arg(long, env = "SLUICE_XDS_TLS", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub xds_tls: Option<bool>,

    /// PEM CA bundle that signs the management server's certificate
    /// (envoyproxy: CONFIG_GRPC_XDS_SERVER_TLS_CACERT).
    #[arg(long, env = "SLUICE_XDS_TLS_CA")]
    pub xds_tls_ca: Option<PathBuf>,

    /// PEM client certificate for mutual TLS (envoyproxy: CONFIG_GRPC_XDS_CLIENT_TLS_CERT).
    #[arg(long, env = "SLUICE_XDS_TLS_CERT")]
    pub xds_tls_cert: Option<PathBuf>,

    /// PEM private key of the client certificate (envoyproxy: CONFIG_GRPC_XDS_CLIENT_TLS_KEY).
    #[arg(long, env = "SLUICE_XDS_TLS_KEY")]
    pub xds_tls_key: Option<PathBuf>,

    /// Name to verify the server certificate against, when not the URL's host
    /// (envoyproxy: CONFIG_GRPC_XDS_SERVER_TLS_SAN).
    #[arg(long, env = "SLUICE_XDS_TLS_SERVER_NAME")]
    pub xds_tls_server_name: Option<String>,

    /// Serve (and report ready) with no domains until the first config arrives, instead of
    /// staying unready (envoyproxy: FORCE_START_WITHOUT_INITIAL_CONFIG).
    #[arg(long, env = "SLUICE_XDS_START_WITHOUT_CONFIG", num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub xds_start_without_config: Option<bool>,

    /// First reconnect delay; doubles per failed attempt (with jitter) up to --xds-backoff-max.
    #[arg(long, env = "SLUICE_XDS_BACKOFF_INITIAL", value_parser = parse_duration, default_value = "500ms")]
    pub xds_backoff_initial: Duration,

    /// Longest reconnect delay.
    #[arg(long, env = "SLUICE_XDS_BACKOFF_MAX", value_parser = parse_duration, default_value = "30s")]
    pub xds_backoff_max: Duration,

    /// Deadline for establishing the connection to the management server.
    #[arg(long, env = "SLUICE_XDS_CONNECT_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub xds_connect_timeout: Duration,

    /// Largest accepted DiscoveryResponse, in bytes.
    #[arg(long, env = "SLUICE_XDS_MAX_MESSAGE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub xds_max_message_bytes: usize,
}
