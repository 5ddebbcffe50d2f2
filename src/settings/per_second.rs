//! Flags of `serve` for a second Redis that holds the buckets of per-second rules
//! (envoyproxy/ratelimit's `REDIS_PERSECOND` family).

use clap::Args;

use super::flags::RedisModeArg;

/// A Redis of its own for rules whose unit is a second, so their high-churn, short-lived keys
/// do not share a server with the long windows. Unset: every bucket lives in the main Redis.
/// Timeouts, breakers and batching are the main Redis's flags.
#[derive(Clone, Debug, Args)]
pub struct PerSecondRedisArgs {
    /// The per-second rules' Redis, in `--redis-url`'s forms (several, comma-separated, for
    /// Cluster seeds or Sentinels). Requires `--backend redis`.
    #[arg(
        long = "redis-per-second-url",
        env = "SLUICE_REDIS_PER_SECOND_URL",
        value_delimiter = ','
    )]
    pub url: Vec<String>,

    /// How the per-second Redis is found, as `--redis-mode`.
    #[arg(
        long = "redis-per-second-mode",
        env = "SLUICE_REDIS_PER_SECOND_MODE",
        value_enum,
        default_value = "standalone"
    )]
    pub mode: RedisModeArg,

    /// Master name to ask the per-second Redis's Sentinels for.
    #[arg(
        long = "redis-per-second-sentinel-master",
        env = "SLUICE_REDIS_PER_SECOND_SENTINEL_MASTER",
        default_value = crate::backend::redis::RedisOptions::DEFAULT_SENTINEL_MASTER
    )]
    pub sentinel_master: String,
}

impl PerSecondRedisArgs {
    /// Whether a per-second Redis is configured (an empty value is none).
    pub fn enabled(&self) -> bool {
        self.url.iter().any(|url| !url.trim().is_empty())
    }
}
