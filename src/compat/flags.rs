//! Logging, limits and switches: the envoyproxy/ratelimit settings that map one-to-one onto a
//! sluice flag (key prefix, over-limit cache, jitter, near-limit ratio, xDS client, shadow mode,
//! domain merging, metrics, tracing, response headers and dynamic metadata).

use super::Tr;
use super::go::go_duration;

const DEFAULT_LIMIT_HEADER: &str = "RateLimit-Limit";
const DEFAULT_REMAINING_HEADER: &str = "RateLimit-Remaining";
const DEFAULT_RESET_HEADER: &str = "RateLimit-Reset";
/// What one over-limit cache entry costs, about (a key of ~100 bytes plus the entry and map
/// overhead), to turn `LOCAL_CACHE_SIZE_IN_BYTES` into a number of keys.
const BYTES_PER_CACHED_KEY: u64 = 256;

impl Tr<'_> {
    pub(super) fn logging(&mut self) {
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

    pub(super) fn limits(&mut self, layout: bool) {
        self.keys_and_cache();
        self.bucket_tuning();
        self.xds_client();
        self.switches();
        self.counting(layout);
        self.tracing();
        self.response_headers(layout);
    }

    /// `CACHE_KEY_PREFIX` and `LOCAL_CACHE_SIZE_IN_BYTES`.
    fn keys_and_cache(&mut self) {
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
    }

    /// `EXPIRATION_JITTER_MAX_SECONDS` and `NEAR_LIMIT_RATIO`.
    fn bucket_tuning(&mut self) {
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
    }

    /// The xDS client's backoff and message size.
    fn xds_client(&mut self) {
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
    }

    /// `SHADOW_MODE`, `QUOTA_MODE`, `MERGE_DOMAIN_CONFIG`, `USE_PROMETHEUS`, `DISABLE_STATS`,
    /// `RESPONSE_DYNAMIC_METADATA`.
    fn switches(&mut self) {
        if let Some(shadow) = self.bool("SHADOW_MODE") {
            self.set("SLUICE_SHADOW_MODE", shadow.to_string(), "SHADOW_MODE");
        }
        if let Some(quota) = self.bool("QUOTA_MODE") {
            self.set("SLUICE_QUOTA_MODE", quota.to_string(), "QUOTA_MODE");
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
        if let Some(metadata) = self.bool("RESPONSE_DYNAMIC_METADATA") {
            self.set(
                "SLUICE_RESPONSE_DYNAMIC_METADATA",
                metadata.to_string(),
                "RESPONSE_DYNAMIC_METADATA",
            );
        }
    }

    /// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT`: envoyproxy/ratelimit counts every hit, over the
    /// limit or not, unless it is true; sluice's `charge: always` counts so. Unset, the reference's
    /// counting applies where its runtime layout is in use (a migrated deployment), as its
    /// header default does.
    fn counting(&mut self, layout: bool) {
        const FROM: &str = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT";
        match self.bool(FROM) {
            Some(true) => self.set("SLUICE_DEFAULT_CHARGE", "if_allowed", FROM),
            Some(false) => self.set("SLUICE_DEFAULT_CHARGE", "always", FROM),
            None if layout => self.set(
                "SLUICE_DEFAULT_CHARGE",
                "always",
                "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT (unset: envoyproxy/ratelimit's default)",
            ),
            None => {}
        }
    }

    /// `TRACING_ENABLED` and `TRACING_SAMPLING_RATE`.
    fn tracing(&mut self) {
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
    }

    /// `LIMIT_RESPONSE_HEADERS_ENABLED` and the header names.
    fn response_headers(&mut self, layout: bool) {
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
}
