//! envoyproxy/ratelimit settings sluice has no equivalent for, and when a set one is harmless.

use super::Tr;
use super::go::go_bool;

/// When a set unsupported variable is harmless: its value asks for nothing sluice lacks.
#[derive(Clone, Copy)]
enum Neutral {
    /// Any non-empty value matters.
    Never,
    /// `false` (Go's spellings) asks for nothing.
    False,
    /// `true` is what sluice does anyway.
    True,
    /// These values (case-insensitive) ask for nothing.
    Values(&'static [&'static str]),
}

const STATS: &str = "statsd/DogStatsD is not supported; sluice serves Prometheus metrics on the admin listener (/metrics)";
const PROMETHEUS: &str = "metrics are served at /metrics, on the admin listener and on PROMETHEUS_ADDR (--metrics-addr); their names and format are sluice's";
const GRPC_TLS: &str = "gRPC server TLS is not configured through envoyproxy/ratelimit variables; use sluice's own TLS settings";
const REDIS_TUNING: &str = "sluice multiplexes one connection per Redis node and sends one script call per request (per slot in Cluster); no pipelining knobs";
const REDIS_TLS_FILES: &str =
    "Redis TLS uses the system roots (rediss://); client certificates and custom CAs are not read";
pub(super) const MEMCACHE: &str = "there is no memcache backend; sluice keeps buckets in Redis (REDIS_URL) or, without Redis, in memory";

/// envoyproxy/ratelimit settings (see its `src/settings/settings.go`) sluice has no equivalent
/// for. A name ending in `*` is a prefix.
const UNSUPPORTED: &[(&str, Neutral, &str)] = &[
    ("USE_STATSD", Neutral::False, STATS),
    ("STATSD_HOST", Neutral::Never, STATS),
    ("STATSD_PORT", Neutral::Never, STATS),
    ("USE_DOG_STATSD", Neutral::False, STATS),
    ("USE_DOG_STATSD_MOGRIFIERS", Neutral::Never, STATS),
    ("EXTRA_TAGS", Neutral::Never, STATS),
    ("STATS_FLUSH_INTERVAL", Neutral::Never, STATS),
    (
        "PROMETHEUS_PATH",
        Neutral::Values(&["/metrics"]),
        PROMETHEUS,
    ),
    ("PROMETHEUS_MAPPER_YAML", Neutral::Never, PROMETHEUS),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        Neutral::False,
        PROMETHEUS,
    ),
    (
        "GRPC_UDS",
        Neutral::Never,
        "gRPC listens on TCP only (GRPC_HOST:GRPC_PORT)",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE",
        Neutral::Never,
        "connections are not aged out",
    ),
    (
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        Neutral::Never,
        "connections are not aged out",
    ),
    ("GRPC_SERVER_USE_TLS", Neutral::False, GRPC_TLS),
    ("GRPC_SERVER_TLS_CERT", Neutral::Never, GRPC_TLS),
    ("GRPC_SERVER_TLS_KEY", Neutral::Never, GRPC_TLS),
    ("GRPC_CLIENT_TLS_CACERT", Neutral::Never, GRPC_TLS),
    ("GRPC_CLIENT_TLS_SAN", Neutral::Never, GRPC_TLS),
    // CONFIG_TYPE, FORCE_START_WITHOUT_INITIAL_CONFIG and the other CONFIG_GRPC_XDS_* settings
    // are read by the xDS client itself (`crate::xds`).
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        Neutral::Never,
        "xDS reconnects back off from --xds-backoff-initial to --xds-backoff-max",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        Neutral::Never,
        "no extra headers are sent to the xDS server",
    ),
    (
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        Neutral::Never,
        "xDS reconnect delays double per attempt, with jitter",
    ),
    (
        "XDS_CLIENT_BACKOFF_JITTER",
        Neutral::True,
        "xDS reconnect delays always carry jitter",
    ),
    // TRACING_ENABLED and TRACING_SAMPLING_RATE map to --tracing and --trace-sampling-ratio.
    (
        "TRACING_EXPORTER_PROTOCOL",
        Neutral::Values(&["grpc"]),
        "sluice exports OTLP over gRPC only (OTEL_EXPORTER_OTLP_ENDPOINT, port 4317)",
    ),
    (
        "TRACING_SERVICE_*",
        Neutral::Never,
        "the service name and instance come from OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (service.name defaults to sluice)",
    ),
    ("GRPC_SERVER_*", Neutral::Never, GRPC_TLS),
    (
        "REDIS_PIPELINE_WINDOW",
        Neutral::Values(&["0", "0s"]),
        REDIS_TUNING,
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        Neutral::Values(&["0"]),
        REDIS_TUNING,
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        Neutral::Never,
        REDIS_TUNING,
    ),
    ("REDIS_POOL_ON_EMPTY_BEHAVIOR", Neutral::Never, REDIS_TUNING),
    (
        "REDIS_TIMEOUT",
        Neutral::Never,
        "each Redis call is bounded by --redis-timeout (default 15ms, under Envoy's 20ms); the connect timeout is --redis-connect-timeout",
    ),
    (
        "REDIS_STARTUP_*",
        Neutral::Never,
        "sluice connects at start within --redis-connect-timeout and then reconnects on its own",
    ),
    ("REDIS_TLS_CLIENT_CERT", Neutral::Never, REDIS_TLS_FILES),
    ("REDIS_TLS_CLIENT_KEY", Neutral::Never, REDIS_TLS_FILES),
    ("REDIS_TLS_CACERT", Neutral::Never, REDIS_TLS_FILES),
    // REDIS_PERSECOND and its URL, TYPE, AUTH, TLS, SOCKET_TYPE, POOL_SIZE and SENTINEL_AUTH map
    // to the per-second Redis (`super::redis`); its tuning is the main Redis's.
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        Neutral::Values(&["0", "0s"]),
        REDIS_TUNING,
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        Neutral::Values(&["0"]),
        REDIS_TUNING,
    ),
    (
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
        Neutral::Never,
        REDIS_TUNING,
    ),
    (
        "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
        Neutral::Never,
        REDIS_TUNING,
    ),
    (
        "REDIS_PERSECOND_TIMEOUT",
        Neutral::Never,
        "the per-second Redis shares the main Redis's deadlines (--redis-timeout, --redis-connect-timeout)",
    ),
    ("MEMCACHE_*", Neutral::Never, MEMCACHE),
];

impl Tr<'_> {
    pub(super) fn unsupported(&mut self) {
        let mut names: Vec<&String> = self.env.keys().collect();
        names.sort();
        for name in names {
            let value = self.env[name].as_str();
            let Some((_, neutral, reason)) =
                UNSUPPORTED
                    .iter()
                    .find(|(pattern, _, _)| match pattern.strip_suffix('*') {
                        Some(prefix) => name.starts_with(prefix),
                        None => name == pattern,
                    })
            else {
                continue;
            };
            let harmless = value.is_empty()
                || match neutral {
                    Neutral::Never => false,
                    Neutral::False => go_bool(value) == Some(false),
                    Neutral::True => go_bool(value) == Some(true),
                    Neutral::Values(ok) => ok.iter().any(|v| v.eq_ignore_ascii_case(value)),
                };
            if !harmless {
                self.ignore(name, reason);
            }
        }
    }
}
