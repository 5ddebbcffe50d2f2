//! Flags of `serve` for the admin listener: its credential, the names it answers to, its
//! connection bounds and the separate metrics listener.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::flags::parse_duration;

/// Admin listener settings; every flag also reads `SLUICE_<FLAG_IN_CAPS>`.
#[derive(Clone, Debug, Args)]
pub struct AdminArgs {
    /// A file holding the operators' bearer token (one line; surrounding whitespace ignored),
    /// read again when it changes. Required by --admin-write. When set, the routes that show
    /// tenants' identifiers (/top, /buckets, /explain, /config, /status) need it too; probes
    /// and /metrics never do.
    #[arg(long, env = "SLUICE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,

    /// Host names (as in the `Host` header, without port) the admin listener answers writes and
    /// identifier reads for, besides IP literals and `localhost`; others are refused with 403
    /// (DNS rebinding). Comma-separated or repeated.
    #[arg(long, env = "SLUICE_ADMIN_HOST", value_delimiter = ',')]
    pub admin_host: Vec<String>,

    /// Most open connections on the admin listener (and on --metrics-addr, each). Past it a new
    /// connection takes the place of the one idle the longest.
    #[arg(long, env = "SLUICE_ADMIN_MAX_CONNECTIONS", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub admin_max_connections: u64,

    /// How long an admin connection may take to send a request's headers, from its opening or
    /// the previous answer (an idle keep-alive connection is closed then).
    #[arg(long, env = "SLUICE_ADMIN_HEADER_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub admin_header_timeout: Duration,

    /// An admin connection on which no byte moved for this long is closed (a stalled upload or
    /// a reader that stopped reading).
    #[arg(long, env = "SLUICE_ADMIN_IDLE_TIMEOUT", value_parser = parse_duration, default_value = "30s")]
    pub admin_idle_timeout: Duration,

    /// Also serve GET /metrics and the probes (/healthz, /readyz) on this address, a listener
    /// showing nothing else (envoyproxy: PROMETHEUS_ADDR; Envoy Gateway scrapes :19001).
    #[arg(long, env = "SLUICE_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
}

impl Default for AdminArgs {
    /// Every flag at its default.
    fn default() -> Self {
        super::Settings::defaults().admin
    }
}
