//! Drop-in compatibility with envoyproxy/ratelimit deployments: its environment settings become
//! sluice's own, so switching is a change of image.
//!
//! [`apply`] is pure: environment in, [`Translation`] out. `main` turns the translation into
//! `serve` flags ([`Translation::args`]) before the command line is parsed, so precedence is
//! command line > `SLUICE_*` variable > envoyproxy/ratelimit variable > default, and logs what it
//! did once logging is up ([`Translation::log`]). Every envoyproxy/ratelimit setting sluice does
//! not support is reported as `ignored: NAME`, never dropped silently.
//!
//! The config directory is envoyproxy/ratelimit's
//! `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY` (goruntime loads
//! `RUNTIME_ROOT/RUNTIME_SUBDIRECTORY` and keeps the keys under `RUNTIME_APPDIRECTORY`).

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::PathBuf;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// envoyproxy/ratelimit's defaults where sluice needs them.
const DEFAULT_RUNTIME_ROOT: &str = "/srv/runtime_data/current";
const DEFAULT_RUNTIME_APPDIRECTORY: &str = "config";
const DEFAULT_HOST: &str = "0.0.0.0";
const DEFAULT_GRPC_PORT: &str = "8081";
const DEFAULT_PORT: &str = "8080";
const DEFAULT_DEBUG_PORT: &str = "6070";
const DEFAULT_LIMIT_HEADER: &str = "RateLimit-Limit";
const DEFAULT_REMAINING_HEADER: &str = "RateLimit-Remaining";
const DEFAULT_RESET_HEADER: &str = "RateLimit-Reset";
/// What one over-limit cache entry costs, about (a key of ~100 bytes plus the entry and map
/// overhead), to turn `LOCAL_CACHE_SIZE_IN_BYTES` into a number of keys.
const BYTES_PER_CACHED_KEY: u64 = 256;

/// What an envoyproxy/ratelimit environment means for sluice.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// `SLUICE_*` variable → value, for settings whose own `SLUICE_*` variable is unset.
    pub overrides: BTreeMap<String, String>,
    /// `SLUICE_*` variable → the envoyproxy/ratelimit setting(s) it came from.
    pub origins: BTreeMap<String, String>,
    /// envoyproxy/ratelimit settings sluice does not support, in name order.
    pub ignored: Vec<Ignored>,
    /// Settings accepted without effect, and envoyproxy/ratelimit defaults adopted, for the log.
    pub notes: Vec<String>,
    /// Values that cannot be translated; `serve` refuses to start, as envoyproxy/ratelimit would.
    pub errors: Vec<String>,
}

/// One unsupported setting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    pub name: String,
    pub reason: &'static str,
}

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
const PROMETHEUS: &str =
    "metrics are served on the admin listener at /metrics; no separate Prometheus listener";
const GRPC_TLS: &str = "gRPC server TLS is not configured through envoyproxy/ratelimit variables; use sluice's own TLS settings";
const REDIS_TUNING: &str = "sluice multiplexes one connection per Redis node and sends one script call per request (per slot in Cluster); no pipelining knobs";
const REDIS_PER_SECOND: &str =
    "sluice keeps every bucket in one Redis; there is no separate per-second Redis";
const REDIS_TLS_FILES: &str =
    "Redis TLS uses the system roots (rediss://); client certificates and custom CAs are not read";
const MEMCACHE: &str = "there is no memcache backend; sluice keeps buckets in Redis (REDIS_URL) or, without Redis, in memory";

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
    ("PROMETHEUS_ADDR", Neutral::Never, PROMETHEUS),
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
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        Neutral::True,
        "sluice never counts a rejected request, whatever the rule's algorithm; it always behaves as if this were true",
    ),
    ("QUOTA_MODE", Neutral::False, "quota mode is not supported"),
    (
        "RESPONSE_DYNAMIC_METADATA",
        Neutral::False,
        "no dynamic metadata is returned",
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
    ("REDIS_PERSECOND", Neutral::False, REDIS_PER_SECOND),
    ("REDIS_PERSECOND_*", Neutral::Never, REDIS_PER_SECOND),
    ("MEMCACHE_*", Neutral::Never, MEMCACHE),
];

/// Translates an envoyproxy/ratelimit environment. `env` is the whole process environment.
pub fn apply(env: &HashMap<String, String>) -> Translation {
    let mut t = Tr {
        env,
        out: Translation::default(),
    };
    let layout = t.runtime_layout();
    t.listeners(layout);
    t.redis();
    t.logging();
    t.limits(layout);
    t.unsupported();
    t.out.ignored.sort_by(|a, b| a.name.cmp(&b.name));
    t.out.ignored.dedup_by(|a, b| a.name == b.name);
    t.out
}

struct Tr<'e> {
    env: &'e HashMap<String, String>,
    out: Translation,
}

impl Tr<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }

    /// Sets `SLUICE_<name>` unless the environment sets it itself (sluice's own wins).
    fn set(&mut self, sluice: &str, value: impl Into<String>, from: &str) {
        if self.env.contains_key(sluice) {
            self.out
                .notes
                .push(format!("{from} not applied: {sluice} is set and wins"));
            return;
        }
        self.out.overrides.insert(sluice.to_owned(), value.into());
        self.out.origins.insert(sluice.to_owned(), from.to_owned());
    }

    fn ignore(&mut self, name: &str, reason: &'static str) {
        self.out.ignored.push(Ignored {
            name: name.to_owned(),
            reason,
        });
    }

    fn bool(&mut self, name: &str) -> Option<bool> {
        let value = self.get(name)?;
        match go_bool(value) {
            Some(b) => Some(b),
            None => {
                self.out
                    .errors
                    .push(format!("{name}: `{value}` is not a boolean"));
                None
            }
        }
    }

    /// The config directory; returns whether envoyproxy/ratelimit's layout is in use.
    fn runtime_layout(&mut self) -> bool {
        let used = [
            "RUNTIME_ROOT",
            "RUNTIME_SUBDIRECTORY",
            "RUNTIME_APPDIRECTORY",
        ]
        .iter()
        .any(|n| self.env.contains_key(*n));
        if !used {
            return false;
        }
        let mut dir = PathBuf::from(self.get("RUNTIME_ROOT").unwrap_or(DEFAULT_RUNTIME_ROOT));
        match self.get("RUNTIME_SUBDIRECTORY").filter(|s| !s.is_empty()) {
            Some(sub) => dir.push(sub),
            None => self.out.notes.push(
                "RUNTIME_SUBDIRECTORY is empty: envoyproxy/ratelimit would load no config; sluice reads RUNTIME_ROOT/RUNTIME_APPDIRECTORY".to_owned(),
            ),
        }
        dir.push(
            self.get("RUNTIME_APPDIRECTORY")
                .unwrap_or(DEFAULT_RUNTIME_APPDIRECTORY),
        );
        self.set(
            "SLUICE_CONFIG",
            dir.to_string_lossy().into_owned(),
            "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY",
        );
        // envoyproxy/ratelimit reads hidden files unless told not to; sluice never reads the
        // kubelet's `..*` entries either way.
        let ignore_dotfiles = self.bool("RUNTIME_IGNOREDOTFILES").unwrap_or(false);
        self.set(
            "SLUICE_CONFIG_DOTFILES",
            (!ignore_dotfiles).to_string(),
            "RUNTIME_IGNOREDOTFILES",
        );
        if self.env.contains_key("RUNTIME_WATCH_ROOT") {
            self.out.notes.push(
                "RUNTIME_WATCH_ROOT accepted without effect: sluice watches the config directory and every symlink on its path, which covers both modes".to_owned(),
            );
        }
        true
    }

    fn listeners(&mut self, layout: bool) {
        if self.env.contains_key("GRPC_HOST") || self.env.contains_key("GRPC_PORT") {
            let addr = self.addr("GRPC_HOST", "GRPC_PORT", DEFAULT_GRPC_PORT);
            if let Some(addr) = addr {
                self.set("SLUICE_GRPC_ADDR", addr, "GRPC_HOST/GRPC_PORT");
            }
        }
        // envoyproxy/ratelimit's PORT serves /healthcheck (what its probes hit) and DEBUG_PORT
        // its debug pages; sluice has one admin listener, serving both kinds, so it goes where
        // the probes go. In an envoyproxy/ratelimit deployment that is PORT even when unset
        // (default 8080). Elsewhere HOST alone is too common a variable (shells set it) to mean
        // anything without PORT.
        let http = layout || self.env.contains_key("PORT");
        let debug = self.env.contains_key("DEBUG_PORT");
        if http {
            if let Some(addr) = self.addr("HOST", "PORT", DEFAULT_PORT) {
                self.set("SLUICE_ADMIN_ADDR", addr, "HOST/PORT");
            }
            if debug {
                self.ignore("DEBUG_PORT", "sluice has one admin listener, on HOST:PORT; it serves /healthcheck and the debug pages' equivalents (/config, /metrics)");
            }
        } else if debug
            && let Some(addr) = self.addr("DEBUG_HOST", "DEBUG_PORT", DEFAULT_DEBUG_PORT)
        {
            self.set("SLUICE_ADMIN_ADDR", addr, "DEBUG_HOST/DEBUG_PORT");
        }
    }

    fn addr(&mut self, host: &str, port: &str, default_port: &str) -> Option<String> {
        let host_value = match self.get(host).unwrap_or(DEFAULT_HOST) {
            "localhost" => "127.0.0.1".to_owned(),
            other => other.to_owned(),
        };
        let port_value = self.get(port).unwrap_or(default_port).to_owned();
        if port_value.parse::<u16>().is_err() {
            self.out
                .errors
                .push(format!("{port}: `{port_value}` is not a port number"));
            return None;
        }
        let addr = if host_value.contains(':') {
            format!("[{host_value}]:{port_value}")
        } else {
            format!("{host_value}:{port_value}")
        };
        if addr.parse::<std::net::SocketAddr>().is_err() {
            self.out.errors.push(format!(
                "{host}: `{host_value}` is not an IP address (sluice binds addresses, not host names)"
            ));
            return None;
        }
        Some(addr)
    }

    fn redis(&mut self) {
        let backend = self.get("BACKEND_TYPE").map(str::to_ascii_lowercase);
        match backend.as_deref() {
            None | Some("redis") => {}
            Some("memcache") => self.ignore("BACKEND_TYPE", MEMCACHE),
            Some(_) => self.ignore(
                "BACKEND_TYPE",
                "only Redis (or, without Redis, memory) is supported",
            ),
        }
        let Some(url) = self.get("REDIS_URL").map(str::to_owned) else {
            for name in ["REDIS_TYPE", "REDIS_AUTH", "REDIS_TLS", "REDIS_SOCKET_TYPE"] {
                if self.env.contains_key(name) {
                    self.out
                        .notes
                        .push(format!("{name} has no effect without REDIS_URL"));
                }
            }
            return;
        };
        if matches!(backend.as_deref(), None | Some("redis")) {
            self.set("SLUICE_BACKEND", "redis", "REDIS_URL");
        }
        let kind = self
            .get("REDIS_TYPE")
            .unwrap_or("SINGLE")
            .to_ascii_uppercase();
        let tls = self.bool("REDIS_TLS").unwrap_or(false);
        let insecure = self
            .bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
            .unwrap_or(false);
        let auth = self
            .get("REDIS_AUTH")
            .filter(|a| !a.is_empty())
            .map(str::to_owned);
        let socket = self.get("REDIS_SOCKET_TYPE").map(str::to_ascii_lowercase);
        let to_url =
            |address: &str| redis_url(address, socket.as_deref(), tls, insecure, auth.as_deref());

        let (mode, urls) = match kind.as_str() {
            "SINGLE" => ("standalone", vec![to_url(url.trim())]),
            "CLUSTER" => (
                "cluster",
                url.split(',').map(|a| to_url(a.trim())).collect(),
            ),
            "SENTINEL" => {
                // "<master name>,<sentinel>,<sentinel>..."
                let mut parts = url.split(',').map(str::trim);
                let master = parts.next().unwrap_or_default().to_owned();
                let sentinels: Vec<Result<String, String>> = parts.map(to_url).collect();
                if master.is_empty() || sentinels.is_empty() {
                    self.out.errors.push(
                        "REDIS_URL: with REDIS_TYPE=SENTINEL it must be <master name>,<sentinel host:port>[,...]".to_owned(),
                    );
                    return;
                }
                self.set("SLUICE_REDIS_SENTINEL_MASTER", master, "REDIS_URL");
                let sentinel_auth = self.get("REDIS_SENTINEL_AUTH").unwrap_or_default();
                if !sentinel_auth.is_empty() && Some(sentinel_auth) != auth.as_deref() {
                    self.ignore("REDIS_SENTINEL_AUTH", "sluice authenticates to the sentinels with the master's credentials (REDIS_AUTH)");
                } else if sentinel_auth.is_empty() && auth.is_some() {
                    self.out.notes.push(
                        "REDIS_AUTH is also sent to the sentinels (sluice uses one set of credentials for sentinels and master)".to_owned(),
                    );
                }
                ("sentinel", sentinels)
            }
            other => {
                self.out.errors.push(format!(
                    "REDIS_TYPE: `{other}` is not one of SINGLE, CLUSTER, SENTINEL"
                ));
                return;
            }
        };
        let mut good = Vec::with_capacity(urls.len());
        for url in urls {
            match url {
                Ok(url) => good.push(url),
                Err(e) => self.out.errors.push(format!("REDIS_URL: {e}")),
            }
        }
        if good.len() > 1 && mode == "standalone" {
            self.out
                .errors
                .push("REDIS_URL: REDIS_TYPE=SINGLE takes one address".to_owned());
            return;
        }
        self.set("SLUICE_REDIS_URL", good.join(","), "REDIS_URL");
        self.set("SLUICE_REDIS_MODE", mode, "REDIS_TYPE");
        if self.env.contains_key("REDIS_POOL_SIZE") {
            self.out.notes.push(
                "REDIS_POOL_SIZE accepted without effect: sluice multiplexes one connection per Redis node".to_owned(),
            );
        }
        if self
            .env
            .contains_key("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
        {
            self.out.notes.push(
                "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION accepted: readiness always includes a Redis probe".to_owned(),
            );
        }
    }

    fn logging(&mut self) {
        if let Some(level) = self.get("LOG_LEVEL") {
            // logrus level names.
            let mapped = match level.to_ascii_lowercase().as_str() {
                "trace" => Some("trace"),
                "debug" => Some("debug"),
                "info" => Some("info"),
                "warn" | "warning" => Some("warn"),
                "error" | "fatal" | "panic" => Some("error"),
                _ => None,
            };
            match mapped {
                Some(mapped) => self.set("SLUICE_LOG_LEVEL", mapped, "LOG_LEVEL"),
                None => self.out.errors.push(format!(
                    "LOG_LEVEL: `{level}` is not a log level (trace, debug, info, warn, error)"
                )),
            }
        }
        if let Some(format) = self.get("LOG_FORMAT") {
            match format.to_ascii_lowercase().as_str() {
                f @ ("text" | "json") => {
                    let f = f.to_owned();
                    self.set("SLUICE_LOG_FORMAT", f, "LOG_FORMAT");
                }
                _ => self
                    .out
                    .errors
                    .push(format!("LOG_FORMAT: `{format}` is not text or json")),
            }
        }
    }

    fn limits(&mut self, layout: bool) {
        if let Some(prefix) = self.get("CACHE_KEY_PREFIX").map(str::to_owned) {
            self.set("SLUICE_KEY_PREFIX", prefix, "CACHE_KEY_PREFIX");
        }
        // The same idea as sluice's over-limit cache, sized in bytes of a freecache; 0 is off.
        if let Some(size) = self.get("LOCAL_CACHE_SIZE_IN_BYTES").map(str::to_owned) {
            const FROM: &str = "LOCAL_CACHE_SIZE_IN_BYTES";
            match size.trim().parse::<u64>() {
                Ok(0) => self.set("SLUICE_OVER_LIMIT_CACHE", "false", FROM),
                Ok(bytes) => {
                    self.set("SLUICE_OVER_LIMIT_CACHE", "true", FROM);
                    let keys = (bytes / BYTES_PER_CACHED_KEY).max(1);
                    self.set("SLUICE_OVER_LIMIT_CACHE_MAX_KEYS", keys.to_string(), FROM);
                }
                Err(_) => self
                    .out
                    .errors
                    .push(format!("{FROM}: `{size}` is not a number of bytes")),
            }
        }
        // A whole number of seconds, as envoyproxy/ratelimit parses it (0 or unset: no jitter).
        if let Some(jitter) = self.get("EXPIRATION_JITTER_MAX_SECONDS").map(str::to_owned) {
            match jitter.trim().parse::<u64>() {
                Ok(seconds) => self.set(
                    "SLUICE_EXPIRY_JITTER_MAX",
                    format!("{seconds}s"),
                    "EXPIRATION_JITTER_MAX_SECONDS",
                ),
                Err(_) => self.out.errors.push(format!(
                    "EXPIRATION_JITTER_MAX_SECONDS: `{jitter}` is not a whole number of seconds"
                )),
            }
        }
        if let Some(ratio) = self.get("NEAR_LIMIT_RATIO").map(str::to_owned) {
            match ratio.parse::<f64>() {
                Ok(r) if r > 0.0 && r <= 1.0 => {
                    self.set("SLUICE_NEAR_LIMIT_RATIO", ratio, "NEAR_LIMIT_RATIO")
                }
                _ => self.out.errors.push(format!(
                    "NEAR_LIMIT_RATIO: `{ratio}` is not a ratio in (0, 1]"
                )),
            }
        }
        for (envoy, sluice) in [
            (
                "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
                "SLUICE_XDS_BACKOFF_INITIAL",
            ),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "SLUICE_XDS_BACKOFF_MAX"),
        ] {
            if let Some(value) = self.get(envoy).map(str::to_owned) {
                match go_duration(&value) {
                    Some(d) => self.set(sluice, format!("{}ms", d.as_millis()), envoy),
                    None => self.out.errors.push(format!(
                        "{envoy}: `{value}` is not a duration (e.g. 10s, 1m30s)"
                    )),
                }
            }
        }
        if let Some(bytes) = self
            .get("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")
            .map(str::to_owned)
        {
            match bytes.parse::<usize>() {
                Ok(n) if n > 0 => self.set(
                    "SLUICE_XDS_MAX_MESSAGE_BYTES",
                    n.to_string(),
                    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
                ),
                _ => self.out.errors.push(format!(
                    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES: `{bytes}` is not a positive number"
                )),
            }
        }
        if let Some(shadow) = self.bool("SHADOW_MODE") {
            self.set("SLUICE_SHADOW_MODE", shadow.to_string(), "SHADOW_MODE");
        }
        if let Some(merge) = self.bool("MERGE_DOMAIN_CONFIG") {
            self.set(
                "SLUICE_MERGE_DOMAINS",
                merge.to_string(),
                "MERGE_DOMAIN_CONFIG",
            );
        }
        if self.bool("USE_PROMETHEUS") == Some(true) {
            self.out.notes.push(
                "USE_PROMETHEUS accepted: metrics are served at /metrics on the admin listener"
                    .to_owned(),
            );
        }
        if let Some(disable) = self.bool("DISABLE_STATS") {
            self.set("SLUICE_METRICS", (!disable).to_string(), "DISABLE_STATS");
        }
        if let Some(tracing) = self.bool("TRACING_ENABLED") {
            self.set("SLUICE_TRACING", tracing.to_string(), "TRACING_ENABLED");
        }
        if let Some(rate) = self.get("TRACING_SAMPLING_RATE").map(str::to_owned) {
            match rate.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => {
                    self.set("SLUICE_TRACE_SAMPLING_RATIO", rate, "TRACING_SAMPLING_RATE")
                }
                _ => self.out.errors.push(format!(
                    "TRACING_SAMPLING_RATE: `{rate}` is not a ratio in [0, 1]"
                )),
            }
        }
        match self.bool("LIMIT_RESPONSE_HEADERS_ENABLED") {
            Some(true) => {
                self.set(
                    "SLUICE_RESPONSE_HEADERS",
                    "true",
                    "LIMIT_RESPONSE_HEADERS_ENABLED",
                );
                for (envoy, sluice, default) in [
                    (
                        "LIMIT_LIMIT_HEADER",
                        "SLUICE_HEADER_LIMIT",
                        DEFAULT_LIMIT_HEADER,
                    ),
                    (
                        "LIMIT_REMAINING_HEADER",
                        "SLUICE_HEADER_REMAINING",
                        DEFAULT_REMAINING_HEADER,
                    ),
                    (
                        "LIMIT_RESET_HEADER",
                        "SLUICE_HEADER_RESET",
                        DEFAULT_RESET_HEADER,
                    ),
                ] {
                    let name = self.get(envoy).unwrap_or(default).to_owned();
                    self.set(sluice, name, envoy);
                }
            }
            Some(false) => self.set(
                "SLUICE_RESPONSE_HEADERS",
                "false",
                "LIMIT_RESPONSE_HEADERS_ENABLED",
            ),
            // envoyproxy/ratelimit adds no headers unless asked: a migrated deployment keeps that.
            None if layout => {
                self.set(
                    "SLUICE_RESPONSE_HEADERS",
                    "false",
                    "LIMIT_RESPONSE_HEADERS_ENABLED (unset: envoyproxy/ratelimit's default)",
                );
            }
            None => {}
        }
    }

    fn unsupported(&mut self) {
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

/// `host:port` (or a socket path) in envoyproxy/ratelimit's form → a sluice Redis URL. A value
/// that already has a scheme is kept as it is.
fn redis_url(
    address: &str,
    socket: Option<&str>,
    tls: bool,
    insecure: bool,
    auth: Option<&str>,
) -> Result<String, String> {
    if address.is_empty() {
        return Err("empty address".to_owned());
    }
    if address.contains("://") {
        return Ok(address.to_owned());
    }
    let (user, password) = match auth {
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => (Some(user), Some(password)),
            None => (None, Some(auth)),
        },
        None => (None, None),
    };
    // envoyproxy/ratelimit's REDIS_SOCKET_TYPE defaults to unix; a value with a port is clearly
    // TCP, which is what a deployment that leaves the type unset means.
    let unix = match socket {
        Some("unix") => true,
        Some("tcp") | Some("tcp4") | Some("tcp6") => false,
        Some(other) => return Err(format!("REDIS_SOCKET_TYPE `{other}` is not tcp or unix")),
        None => address.starts_with('/'),
    };
    if unix {
        let mut url = format!("redis+unix://{address}");
        let mut query = Vec::new();
        if let Some(user) = user {
            query.push(format!("user={}", encode(user)));
        }
        if let Some(password) = password {
            query.push(format!("pass={}", encode(password)));
        }
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query.join("&"));
        }
        return Ok(url);
    }
    let userinfo = match (user, password) {
        (Some(user), Some(password)) => format!("{}:{}@", encode(user), encode(password)),
        (None, Some(password)) => format!(":{}@", encode(password)),
        _ => String::new(),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let fragment = if tls && insecure { "#insecure" } else { "" };
    Ok(format!("{scheme}://{userinfo}{address}{fragment}"))
}

/// Everything but unreserved characters, so a password cannot end the userinfo or split the
/// comma-separated URL list.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn encode(s: &str) -> String {
    utf8_percent_encode(s, USERINFO).to_string()
}

/// Go's `time.ParseDuration` for non-negative values: `300ms`, `10s`, `1m30s`, `1.5h`.
fn go_duration(text: &str) -> Option<std::time::Duration> {
    if text == "0" {
        return Some(std::time::Duration::ZERO);
    }
    let mut rest = text;
    let mut seconds = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3_600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        seconds += number * scale;
    }
    std::time::Duration::try_from_secs_f64(seconds).ok()
}

/// Go's `strconv.ParseBool`, which envoyproxy/ratelimit's settings use.
fn go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// The process's command line, with the environment's envoyproxy/ratelimit settings added as
/// flags when the subcommand is `serve`, and the translation (to log once logging is set up).
/// Other subcommands get their command line unchanged. `Err` holds every untranslatable value.
pub fn serve_args() -> Result<(Vec<OsString>, Translation), Vec<String>> {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_none_or(|a| a != "serve") {
        return Ok((args, Translation::default()));
    }
    // Names and values that are not UTF-8 are no envoyproxy/ratelimit settings.
    let env: HashMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    let translation = apply(&env);
    if !translation.errors.is_empty() {
        return Err(translation.errors);
    }
    let cli = <crate::settings::Cli as clap::CommandFactory>::command();
    let serve = cli.find_subcommand("serve");
    let flag_of = |variable: &str| {
        serve?
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == variable))
            .and_then(|a| a.get_long())
            .map(|long| format!("--{long}"))
    };
    let mut translation = translation;
    // A setting another part of sluice owns may be missing from this build: say so.
    let missing: Vec<String> = translation
        .overrides
        .keys()
        .filter(|v| flag_of(v).is_none())
        .cloned()
        .collect();
    for variable in missing {
        translation.overrides.remove(&variable);
        let name = translation.origins.remove(&variable).unwrap_or(variable);
        translation.ignored.push(Ignored {
            name,
            reason: "this sluice build has no setting for it",
        });
    }
    let args = translation.args(args, flag_of);
    Ok((args, translation))
}

impl Translation {
    /// The `serve` command line with each override appended as a flag, unless the command line
    /// already gives that flag. `flag_of` maps a `SLUICE_*` variable to its `--flag`.
    pub fn args(
        &self,
        args: Vec<OsString>,
        flag_of: impl Fn(&str) -> Option<String>,
    ) -> Vec<OsString> {
        let mut out = args;
        for (variable, value) in &self.overrides {
            let Some(flag) = flag_of(variable) else {
                continue;
            };
            let given = out.iter().any(|a| {
                let a = a.to_string_lossy();
                a == flag || a.starts_with(&format!("{flag}="))
            });
            if !given {
                out.push(format!("{flag}={value}").into());
            }
        }
        out
    }

    /// Logs, once, what was translated and what is ignored.
    pub fn log(&self) {
        for (variable, value) in &self.overrides {
            let shown = if variable == "SLUICE_REDIS_URL" {
                redact_userinfo(value)
            } else {
                value.clone()
            };
            let from = self.origins.get(variable).map_or("", String::as_str);
            tracing::info!("envoyproxy/ratelimit setting applied: {from} → {variable}={shown}");
        }
        for note in &self.notes {
            tracing::info!("{note}");
        }
        // Never silent: a log level above warn must not hide what is ignored.
        let logged = tracing::enabled!(tracing::Level::WARN);
        for ignored in &self.ignored {
            if logged {
                tracing::warn!("ignored: {} ({})", ignored.name, ignored.reason);
            } else {
                eprintln!("sluice: ignored: {} ({})", ignored.name, ignored.reason);
            }
        }
    }
}

/// envoyproxy/ratelimit's `GET /healthcheck` (what its Kubernetes probes hit): `OK` while the
/// service is ready, 500 otherwise.
pub fn router(readiness: std::sync::Arc<crate::admin::Readiness>) -> axum::Router {
    use axum::http::StatusCode;
    axum::Router::new().route(
        "/healthcheck",
        axum::routing::get(move || async move {
            if readiness.is_ready() {
                (StatusCode::OK, "OK")
            } else {
                (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK")
            }
        }),
    )
}

/// `redis://user:secret@host` → `redis://user:***@host`, for logs.
fn redact_userinfo(urls: &str) -> String {
    urls.split(',')
        .map(|url| match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let userinfo = &url[scheme + 3..at];
                let user = userinfo.split_once(':').map_or("", |(u, _)| u);
                format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
            }
            _ => match url.split_once("pass=") {
                Some((head, _)) => format!("{head}pass=***"),
                None => url.to_owned(),
            },
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn over(t: &Translation, name: &str) -> Option<String> {
        t.overrides.get(name).cloned()
    }

    fn ignored(t: &Translation) -> Vec<&str> {
        t.ignored.iter().map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn an_unrelated_environment_changes_nothing() {
        let t = apply(&env(&[("PATH", "/bin"), ("HOME", "/root")]));
        assert_eq!(t, Translation::default());
    }

    #[test]
    fn the_runtime_layout_is_the_config_directory() {
        let t = apply(&env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
        ]));
        assert_eq!(
            over(&t, "SLUICE_CONFIG").as_deref(),
            Some("/data/ratelimit/config")
        );
        assert_eq!(over(&t, "SLUICE_CONFIG_DOTFILES").as_deref(), Some("false"));
        // envoyproxy/ratelimit's defaults: no rate-limit headers, HTTP (probes) on 0.0.0.0:8080.
        assert_eq!(
            over(&t, "SLUICE_RESPONSE_HEADERS").as_deref(),
            Some("false")
        );
        assert_eq!(
            over(&t, "SLUICE_ADMIN_ADDR").as_deref(),
            Some("0.0.0.0:8080")
        );
        let t = apply(&env(&[
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("RUNTIME_APPDIRECTORY", "limits"),
        ]));
        assert_eq!(
            over(&t, "SLUICE_CONFIG").as_deref(),
            Some("/srv/runtime_data/current/rl/limits")
        );
        assert_eq!(over(&t, "SLUICE_CONFIG_DOTFILES").as_deref(), Some("true"));
    }

    #[test]
    fn sluice_variables_win() {
        let t = apply(&env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("SLUICE_CONFIG", "/etc/sluice"),
        ]));
        assert_eq!(over(&t, "SLUICE_CONFIG"), None);
        assert!(t.notes.iter().any(|n| n.contains("SLUICE_CONFIG is set")));
    }

    #[test]
    fn listeners_map_to_grpc_and_admin_addresses() {
        let t = apply(&env(&[
            ("GRPC_PORT", "9000"),
            ("PORT", "8080"),
            ("HOST", "::1"),
        ]));
        assert_eq!(
            over(&t, "SLUICE_GRPC_ADDR").as_deref(),
            Some("0.0.0.0:9000")
        );
        assert_eq!(over(&t, "SLUICE_ADMIN_ADDR").as_deref(), Some("[::1]:8080"));
        let t = apply(&env(&[("DEBUG_PORT", "7000")]));
        assert_eq!(
            over(&t, "SLUICE_ADMIN_ADDR").as_deref(),
            Some("0.0.0.0:7000")
        );
        let both = apply(&env(&[("PORT", "8080"), ("DEBUG_PORT", "7000")]));
        assert_eq!(
            over(&both, "SLUICE_ADMIN_ADDR").as_deref(),
            Some("0.0.0.0:8080")
        );
        assert_eq!(ignored(&both), ["DEBUG_PORT"]);
        let local = apply(&env(&[("PORT", "1"), ("HOST", "localhost")]));
        assert_eq!(
            over(&local, "SLUICE_ADMIN_ADDR").as_deref(),
            Some("127.0.0.1:1")
        );
        // A shell's HOST without PORT means nothing here.
        assert_eq!(
            apply(&env(&[("HOST", "my-laptop")])),
            Translation::default()
        );
        let bad = apply(&env(&[
            ("GRPC_PORT", "http"),
            ("PORT", "1"),
            ("HOST", "box"),
        ]));
        assert_eq!(bad.errors.len(), 2, "{:?}", bad.errors);
    }

    #[test]
    fn redis_single_cluster_and_sentinel() {
        let t = apply(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.ns:6379"),
            ("REDIS_AUTH", "s3cr:t,x"),
        ]));
        assert_eq!(over(&t, "SLUICE_BACKEND").as_deref(), Some("redis"));
        assert_eq!(
            over(&t, "SLUICE_REDIS_URL").as_deref(),
            Some("redis://s3cr:t%2Cx@redis.ns:6379")
        );
        assert_eq!(over(&t, "SLUICE_REDIS_MODE").as_deref(), Some("standalone"));

        let t = apply(&env(&[
            ("REDIS_TYPE", "cluster"),
            ("REDIS_URL", "a:7000, b:7001"),
            ("REDIS_TLS", "true"),
            ("REDIS_AUTH", "pw"),
        ]));
        assert_eq!(
            over(&t, "SLUICE_REDIS_URL").as_deref(),
            Some("rediss://:pw@a:7000,rediss://:pw@b:7001")
        );
        assert_eq!(over(&t, "SLUICE_REDIS_MODE").as_deref(), Some("cluster"));

        let t = apply(&env(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_SENTINEL_AUTH", "other"),
        ]));
        assert_eq!(
            over(&t, "SLUICE_REDIS_SENTINEL_MASTER").as_deref(),
            Some("mymaster")
        );
        assert_eq!(
            over(&t, "SLUICE_REDIS_URL").as_deref(),
            Some("redis://s1:26379,redis://s2:26379")
        );
        assert_eq!(ignored(&t), ["REDIS_SENTINEL_AUTH"]);

        let bad = apply(&env(&[
            ("REDIS_TYPE", "SENTINEL"),
            ("REDIS_URL", "onlymaster"),
        ]));
        assert_eq!(bad.errors.len(), 1);
        let bad = apply(&env(&[("REDIS_TYPE", "RING"), ("REDIS_URL", "a:1")]));
        assert!(bad.errors[0].starts_with("REDIS_TYPE"));
    }

    #[test]
    fn redis_unix_sockets_users_and_explicit_urls() {
        let t = apply(&env(&[
            ("REDIS_URL", "/var/run/nutcracker/ratelimit.sock"),
            ("REDIS_AUTH", "me:p@ss"),
        ]));
        assert_eq!(
            over(&t, "SLUICE_REDIS_URL").as_deref(),
            Some("redis+unix:///var/run/nutcracker/ratelimit.sock?user=me&pass=p%40ss")
        );
        let t = apply(&env(&[
            ("REDIS_URL", "h:1"),
            ("REDIS_TLS", "1"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ]));
        assert_eq!(
            over(&t, "SLUICE_REDIS_URL").as_deref(),
            Some("rediss://h:1#insecure")
        );
        let t = apply(&env(&[("REDIS_URL", "redis://x:1/2")]));
        assert_eq!(
            over(&t, "SLUICE_REDIS_URL").as_deref(),
            Some("redis://x:1/2")
        );
        // memcache is not Redis: no backend switch, and reported.
        let t = apply(&env(&[("REDIS_URL", "h:1"), ("BACKEND_TYPE", "memcache")]));
        assert_eq!(over(&t, "SLUICE_BACKEND"), None);
        assert_eq!(ignored(&t), ["BACKEND_TYPE"]);
    }

    #[test]
    fn logging_limits_and_headers() {
        let t = apply(&env(&[
            ("LOG_LEVEL", "WARNING"),
            ("LOG_FORMAT", "JSON"),
            ("CACHE_KEY_PREFIX", "rl_"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("EXPIRATION_JITTER_MAX_SECONDS", "300"),
            ("SHADOW_MODE", "True"),
            ("MERGE_DOMAIN_CONFIG", "1"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-Left"),
        ]));
        let expect = [
            ("SLUICE_LOG_LEVEL", "warn"),
            ("SLUICE_LOG_FORMAT", "json"),
            ("SLUICE_KEY_PREFIX", "rl_"),
            ("SLUICE_NEAR_LIMIT_RATIO", "0.9"),
            ("SLUICE_EXPIRY_JITTER_MAX", "300s"),
            ("SLUICE_SHADOW_MODE", "true"),
            ("SLUICE_MERGE_DOMAINS", "true"),
            ("SLUICE_RESPONSE_HEADERS", "true"),
            ("SLUICE_HEADER_LIMIT", "RateLimit-Limit"),
            ("SLUICE_HEADER_REMAINING", "X-Left"),
            ("SLUICE_HEADER_RESET", "RateLimit-Reset"),
        ];
        for (name, value) in expect {
            assert_eq!(over(&t, name).as_deref(), Some(value), "{name}");
        }
        assert!(t.errors.is_empty(), "{:?}", t.errors);
        let bad = apply(&env(&[
            ("LOG_LEVEL", "loud"),
            ("NEAR_LIMIT_RATIO", "2"),
            ("SHADOW_MODE", "yes"),
            ("EXPIRATION_JITTER_MAX_SECONDS", "-1"),
        ]));
        assert_eq!(bad.errors.len(), 4, "{:?}", bad.errors);
    }

    #[test]
    fn unsupported_settings_are_reported_unless_harmless() {
        let t = apply(&env(&[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd"),
            ("USE_DOG_STATSD", "false"),
            ("MEMCACHE_HOST_PORT", "m:11211"),
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
            ("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "a:b"),
            ("XDS_CLIENT_BACKOFF_JITTER", "true"),
            ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"),
            ("REDIS_PERSECOND", "false"),
            ("TRACING_EXPORTER_PROTOCOL", "http"),
            ("TRACING_SERVICE_NAME", "RateLimit"),
            ("GRPC_SERVER_USE_TLS", "true"),
        ]));
        assert_eq!(
            ignored(&t),
            [
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "GRPC_SERVER_USE_TLS",
                "MEMCACHE_HOST_PORT",
                "STATSD_HOST",
                "TRACING_EXPORTER_PROTOCOL",
                "TRACING_SERVICE_NAME",
                "USE_STATSD",
            ]
        );
    }

    #[test]
    fn stats_and_tracing_switches_map() {
        let t = apply(&env(&[
            ("DISABLE_STATS", "true"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_SAMPLING_RATE", "0.25"),
            ("TRACING_EXPORTER_PROTOCOL", "grpc"),
        ]));
        assert_eq!(over(&t, "SLUICE_METRICS").as_deref(), Some("false"));
        assert_eq!(over(&t, "SLUICE_TRACING").as_deref(), Some("true"));
        assert_eq!(
            over(&t, "SLUICE_TRACE_SAMPLING_RATIO").as_deref(),
            Some("0.25")
        );
        assert!(ignored(&t).is_empty(), "{:?}", t.ignored);
        let bad = apply(&env(&[("TRACING_SAMPLING_RATE", "2")]));
        assert_eq!(bad.errors.len(), 1);
    }

    #[test]
    fn local_cache_size_maps_to_the_over_limit_cache() {
        let t = apply(&env(&[("LOCAL_CACHE_SIZE_IN_BYTES", "1048576")]));
        assert_eq!(over(&t, "SLUICE_OVER_LIMIT_CACHE").as_deref(), Some("true"));
        assert_eq!(
            over(&t, "SLUICE_OVER_LIMIT_CACHE_MAX_KEYS").as_deref(),
            Some("4096")
        );
        let off = apply(&env(&[("LOCAL_CACHE_SIZE_IN_BYTES", "0")]));
        assert_eq!(
            over(&off, "SLUICE_OVER_LIMIT_CACHE").as_deref(),
            Some("false")
        );
        assert!(ignored(&off).is_empty());
        let bad = apply(&env(&[("LOCAL_CACHE_SIZE_IN_BYTES", "lots")]));
        assert_eq!(bad.errors.len(), 1, "{:?}", bad.errors);
    }

    #[test]
    fn xds_client_settings_map_with_go_durations() {
        let t = apply(&env(&[
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "1m30s"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1.5h"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "4194304"),
        ]));
        assert_eq!(
            over(&t, "SLUICE_XDS_BACKOFF_INITIAL").as_deref(),
            Some("90000ms")
        );
        assert_eq!(
            over(&t, "SLUICE_XDS_BACKOFF_MAX").as_deref(),
            Some("5400000ms")
        );
        assert_eq!(
            over(&t, "SLUICE_XDS_MAX_MESSAGE_BYTES").as_deref(),
            Some("4194304")
        );
        assert_eq!(
            go_duration("250ms"),
            Some(std::time::Duration::from_millis(250))
        );
        assert_eq!(go_duration("0"), Some(std::time::Duration::ZERO));
        assert_eq!(go_duration("10"), None);
        assert_eq!(go_duration("5d"), None);
        let bad = apply(&env(&[("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "soon")]));
        assert_eq!(bad.errors.len(), 1);
    }

    #[test]
    fn overrides_become_flags_unless_given_on_the_command_line() {
        let t = apply(&env(&[("GRPC_PORT", "9000"), ("PORT", "9001")]));
        let flag_of = |v: &str| {
            v.strip_prefix("SLUICE_")
                .map(|f| format!("--{}", f.to_ascii_lowercase().replace('_', "-")))
        };
        let args: Vec<OsString> = ["sluice", "serve", "--admin-addr=127.0.0.1:1"]
            .iter()
            .map(OsString::from)
            .collect();
        let out: Vec<String> = t
            .args(args, flag_of)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            out,
            [
                "sluice",
                "serve",
                "--admin-addr=127.0.0.1:1",
                "--grpc-addr=0.0.0.0:9000"
            ]
        );
    }

    #[test]
    fn credentials_are_redacted_in_logs() {
        assert_eq!(
            redact_userinfo("redis://u:p%40@h:1,rediss://:x@h:2,redis://h:3"),
            "redis://u:***@h:1,rediss://:***@h:2,redis://h:3"
        );
        assert_eq!(
            redact_userinfo("redis+unix:///s.sock?user=u&pass=p"),
            "redis+unix:///s.sock?user=u&pass=***"
        );
    }
}
