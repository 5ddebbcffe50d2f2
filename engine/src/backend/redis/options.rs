//! How the Redis backend is reached: [`RedisMode`] and [`RedisOptions`], with their defaults.

use std::time::Duration;

use super::batch::BatchSettings;
use crate::backend::breaker::BreakerSettings;

/// How sluice finds its Redis.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RedisMode {
    /// One server (or a proxy); exactly one URL.
    #[default]
    Standalone,
    /// Redis Cluster; the URLs are seed nodes, the topology is discovered.
    Cluster,
    /// The URLs are sentinels; [`RedisOptions::sentinel_master`] names the monitored master.
    Sentinel,
}

impl RedisMode {
    pub const fn as_str(self) -> &'static str {
        match self {
            RedisMode::Standalone => "standalone",
            RedisMode::Cluster => "cluster",
            RedisMode::Sentinel => "sentinel",
        }
    }
}

impl std::fmt::Display for RedisMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Connection settings for [`RedisBackend::connect`]. `Debug` hides URL passwords.
#[derive(Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]`, `rediss://` for TLS. Credentials in the URL are
    /// sent with `AUTH` (ACL user or the default user); in Sentinel mode they are used for the
    /// sentinels and for the master alike.
    pub urls: Vec<String>,
    pub mode: RedisMode,
    /// Master name the sentinels monitor (Sentinel mode only).
    pub sentinel_master: Option<String>,
    /// Bound on establishing a connection: each startup step and each reconnect attempt.
    pub connect_timeout: Duration,
    /// Bound on one check (all of its round trips); well under Envoy's 20 ms filter timeout.
    pub command_timeout: Duration,
    /// When an endpoint's circuit breaker opens and for how long.
    pub breaker: BreakerSettings,
    /// Each call adds a random `0..expiry_jitter_max` to the TTL of the keys it writes, so keys
    /// written together (a fixed window's counters) do not all expire at once. Expiry only
    /// drops settled state, so the jitter never changes a decision. Zero: no jitter.
    pub expiry_jitter_max: Duration,
    /// How concurrent checks share script calls (standalone and Sentinel modes; Cluster calls
    /// go one per request and slot).
    pub batch: BatchSettings,
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|url| redact(url)).collect();
        f.debug_struct("RedisOptions")
            .field("urls", &urls)
            .field("mode", &self.mode)
            .field("sentinel_master", &self.sentinel_master)
            .field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("breaker", &self.breaker)
            .field("expiry_jitter_max", &self.expiry_jitter_max)
            .field("batch", &self.batch)
            .finish()
    }
}

/// `scheme://user:secret@host` → `scheme://user:***@host`, for logs.
fn redact(url: &str) -> String {
    let Some(authority_at) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let authority_end = url[authority_at..]
        .find('/')
        .map_or(url.len(), |i| authority_at + i);
    let authority = &url[authority_at..authority_end];
    match authority.rfind('@') {
        Some(at) => {
            let user = authority[..at].split(':').next().unwrap_or_default();
            let hidden = if authority[..at].contains(':') {
                ":***"
            } else {
                ""
            };
            format!(
                "{}{user}{hidden}{}{}",
                &url[..authority_at],
                &authority[at..],
                &url[authority_end..]
            )
        }
        None => url.to_string(),
    }
}

impl RedisOptions {
    pub const DEFAULT_URL: &'static str = "redis://127.0.0.1:6379";
    pub const DEFAULT_SENTINEL_MASTER: &'static str = "mymaster";
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
}

impl Default for RedisOptions {
    /// A standalone Redis on 127.0.0.1:6379, calls bounded by
    /// [`DEFAULT_CALL_DEADLINE`](crate::backend::DEFAULT_CALL_DEADLINE), breakers and batching
    /// at their defaults, no expiry jitter.
    fn default() -> Self {
        RedisOptions {
            urls: vec![Self::DEFAULT_URL.to_owned()],
            mode: RedisMode::Standalone,
            sentinel_master: Some(Self::DEFAULT_SENTINEL_MASTER.to_owned()),
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            command_timeout: crate::backend::DEFAULT_CALL_DEADLINE,
            breaker: BreakerSettings::default(),
            expiry_jitter_max: Duration::ZERO,
            batch: BatchSettings::default(),
        }
    }
}
