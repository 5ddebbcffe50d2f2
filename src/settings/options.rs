//! Parsed flags → the engine's option structs. The one place the command line meets the engine:
//! the structs and their defaults live in `sluice-engine`, which knows no flags.

use super::{CallerArgs, ListenerArgs, RedisModeArg, ResponseHeaders, Settings};
use crate::backend::breaker::BreakerSettings;
use crate::backend::memory::MemoryOptions;
use crate::backend::redis::{BatchSettings, RedisMode, RedisOptions};
use crate::limiter::LimiterOptions;
use crate::limiter::lease::LeaseOptions;
use crate::quota::QuotaOptions;
use crate::rls::caller::CallerPolicy;
use crate::rls::{HeaderMode, HeaderOptions, RequestBounds};
use crate::security::listener::ConnectionLimits;

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl From<RedisModeArg> for RedisMode {
    fn from(arg: RedisModeArg) -> Self {
        match arg {
            RedisModeArg::Standalone => RedisMode::Standalone,
            RedisModeArg::Cluster => RedisMode::Cluster,
            RedisModeArg::Sentinel => RedisMode::Sentinel,
        }
    }
}

impl From<&Settings> for RedisOptions {
    fn from(settings: &Settings) -> Self {
        RedisOptions {
            urls: settings.redis_url.clone(),
            mode: settings.redis_mode.into(),
            sentinel_master: Some(settings.redis_sentinel_master.clone()),
            connect_timeout: settings.redis_connect_timeout,
            command_timeout: settings.redis_timeout,
            breaker: BreakerSettings::from(settings),
            expiry_jitter_max: settings.expiry_jitter_max,
            batch: BatchSettings::from(settings),
        }
    }
}

impl From<&Settings> for BreakerSettings {
    /// The `--breaker-*` flags; a moment is one `--redis-timeout`.
    fn from(settings: &Settings) -> Self {
        BreakerSettings {
            min_failures: settings.breaker_failures,
            failure_permille: BreakerSettings::permille(settings.breaker_failure_ratio),
            window: settings.breaker_window,
            moment: settings.redis_timeout,
            cooldown: settings.breaker_cooldown,
        }
    }
}

impl From<&Settings> for BatchSettings {
    fn from(settings: &Settings) -> Self {
        BatchSettings {
            max_keys: to_usize(settings.redis_max_batch),
            in_flight: to_usize(settings.redis_batch_calls),
        }
    }
}

impl From<&Settings> for MemoryOptions {
    /// The memory backend's bounds, and the same for the `local` failure policy's buckets.
    fn from(settings: &Settings) -> Self {
        MemoryOptions::bounded(
            settings.memory_max_buckets,
            settings.security.memory_max_buckets_per_rule.map(to_usize),
        )
    }
}

impl From<&Settings> for LimiterOptions {
    fn from(settings: &Settings) -> Self {
        LimiterOptions {
            key_prefix: settings.key_prefix.clone(),
            default_failure_mode: settings.failure_mode.into(),
            quota_all: settings.config_ops.load.quota_mode,
        }
    }
}

impl From<&Settings> for LeaseOptions {
    /// `--lease-max-keys` and `--lease-lifetime` as given (the server refuses a zero lifetime
    /// before building the store).
    fn from(settings: &Settings) -> Self {
        LeaseOptions {
            max_keys: to_usize(settings.lease_max_keys),
            lifetime_ms: u64::try_from(settings.lease_lifetime.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl From<&Settings> for QuotaOptions {
    fn from(settings: &Settings) -> Self {
        QuotaOptions {
            push_interval: settings.rlqs_push_interval,
            pool: QuotaOptions::pool(settings.rlqs_push_interval, settings.rlqs_assignment_ttl),
            idle_timeout: settings.rlqs_idle_timeout,
            max_subscriptions: to_usize(settings.rlqs_max_subscriptions),
            max_buckets_per_stream: to_usize(settings.rlqs_max_buckets_per_stream),
            max_bucket_entries: to_usize(settings.rlqs_max_bucket_entries),
            first_report_timeout: settings.rlqs_first_report_timeout,
        }
    }
}

impl From<&ListenerArgs> for ConnectionLimits {
    fn from(args: &ListenerArgs) -> Self {
        ConnectionLimits {
            max_connections: args.max_connections,
            handshake_timeout: args.handshake_timeout,
        }
    }
}

impl From<&Settings> for RequestBounds {
    fn from(settings: &Settings) -> Self {
        RequestBounds {
            max_message_bytes: settings.max_message_bytes,
            max_descriptors: settings.max_descriptors,
            max_entries: settings.max_entries,
            max_key_bytes: settings.max_key_bytes,
            max_hits_addend: settings.security.callers.max_hits_addend,
            policy: CallerPolicy::from(&settings.security.callers),
        }
    }
}

impl From<ResponseHeaders> for HeaderMode {
    fn from(flag: ResponseHeaders) -> Self {
        match flag {
            ResponseHeaders::All => HeaderMode::All,
            ResponseHeaders::RetryAfter => HeaderMode::RetryAfter,
            ResponseHeaders::None => HeaderMode::None,
        }
    }
}

impl From<&Settings> for HeaderOptions {
    fn from(settings: &Settings) -> Self {
        HeaderOptions {
            mode: settings.response_headers.into(),
            limit: settings.header_limit.clone(),
            remaining: settings.header_remaining.clone(),
            reset: settings.header_reset.clone(),
            retry_after: settings.header_retry_after.clone(),
            degraded: settings.header_degraded.clone(),
            dynamic_metadata: settings.response_dynamic_metadata,
        }
    }
}

impl From<&CallerArgs> for CallerPolicy {
    fn from(args: &CallerArgs) -> Self {
        CallerPolicy {
            ignore_limit_override: args.ignore_limit_override,
            ignore_negative_hits: args.ignore_negative_hits,
        }
    }
}

impl Settings {
    /// The options of the per-second Redis (`--redis-per-second-*`), or `None` when it is not
    /// configured. Deadlines, breakers, batching and expiry jitter are the main Redis's.
    pub fn per_second_redis(&self) -> Option<RedisOptions> {
        let args = &self.redis_per_second;
        if !args.enabled() {
            return None;
        }
        Some(RedisOptions {
            urls: args
                .url
                .iter()
                .map(|url| url.trim().to_owned())
                .filter(|url| !url.is_empty())
                .collect(),
            mode: args.mode.into(),
            sentinel_master: Some(args.sentinel_master.clone()),
            ..RedisOptions::from(self)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The flags' defaults are the engine's: what `sluice serve` runs with unflagged is what an
    /// embedding gets from `Default`.
    #[test]
    fn flag_defaults_are_the_engine_defaults() {
        let settings = Settings::defaults();
        let (flags, engine) = (RedisOptions::from(&settings), RedisOptions::default());
        assert_eq!(flags.urls, engine.urls);
        assert_eq!(flags.mode, engine.mode);
        assert_eq!(flags.sentinel_master, engine.sentinel_master);
        assert_eq!(flags.connect_timeout, engine.connect_timeout);
        assert_eq!(flags.command_timeout, engine.command_timeout);
        assert_eq!(flags.expiry_jitter_max, engine.expiry_jitter_max);
        assert_eq!(flags.breaker, engine.breaker);
        assert_eq!(flags.batch, engine.batch);
        assert_eq!(MemoryOptions::from(&settings), MemoryOptions::default());
        assert_eq!(LeaseOptions::from(&settings), LeaseOptions::default());
        let (flags, engine) = (LimiterOptions::from(&settings), LimiterOptions::default());
        assert_eq!(flags.key_prefix, engine.key_prefix);
        assert_eq!(flags.default_failure_mode, engine.default_failure_mode);
        assert_eq!(flags.quota_all, engine.quota_all);
        assert_eq!(QuotaOptions::from(&settings), QuotaOptions::default());
        let (flags, edge) = (RequestBounds::from(&settings), RequestBounds::default());
        assert_eq!(
            (
                flags.max_message_bytes,
                flags.max_descriptors,
                flags.max_entries
            ),
            (
                edge.max_message_bytes,
                edge.max_descriptors,
                edge.max_entries
            )
        );
        assert_eq!(flags.max_key_bytes, edge.max_key_bytes);
        assert_eq!(flags.max_hits_addend, edge.max_hits_addend);
        assert_eq!(flags.policy, edge.policy);
        let (flags, edge) = (HeaderOptions::from(&settings), HeaderOptions::default());
        assert_eq!(flags.mode, edge.mode);
        assert_eq!(
            [
                flags.limit,
                flags.remaining,
                flags.reset,
                flags.retry_after,
                flags.degraded
            ],
            [
                edge.limit,
                edge.remaining,
                edge.reset,
                edge.retry_after,
                edge.degraded
            ]
        );
        assert_eq!(flags.dynamic_metadata, edge.dynamic_metadata);
        assert_eq!(
            ConnectionLimits::from(&settings.security.listener),
            ConnectionLimits::default()
        );
    }

    #[test]
    fn memory_bounds_come_from_their_flags() {
        let mut settings = Settings::defaults();
        settings.memory_max_buckets = 1_000;
        assert_eq!(
            MemoryOptions::from(&settings).max_buckets_per_rule,
            Some(250)
        );
        settings.security.memory_max_buckets_per_rule = Some(900);
        assert_eq!(
            MemoryOptions::from(&settings).max_buckets_per_rule,
            Some(900)
        );
    }

    #[test]
    fn per_second_redis_options_come_from_their_flags() {
        let mut settings = Settings::defaults();
        assert!(settings.per_second_redis().is_none());
        settings.redis_per_second.url = vec![String::new()];
        assert!(
            settings.per_second_redis().is_none(),
            "an empty value is none"
        );
        settings.redis_per_second.url = vec!["redis://s1:26379".into(), " redis://s2:26379".into()];
        settings.redis_per_second.mode = RedisModeArg::Sentinel;
        settings.redis_per_second.sentinel_master = "fast".into();
        settings.redis_timeout = Duration::from_millis(7);
        let opts = settings.per_second_redis().unwrap();
        assert_eq!(opts.urls, ["redis://s1:26379", "redis://s2:26379"]);
        assert_eq!(opts.mode, RedisMode::Sentinel);
        assert_eq!(opts.sentinel_master.as_deref(), Some("fast"));
        assert_eq!(
            opts.command_timeout,
            Duration::from_millis(7),
            "the main Redis's"
        );
    }

    #[test]
    fn modes_parse_from_their_flag_spelling() {
        use clap::ValueEnum as _;
        let parse = |s: &str| RedisModeArg::from_str(s, false).map(RedisMode::from);
        for mode in [
            RedisMode::Standalone,
            RedisMode::Cluster,
            RedisMode::Sentinel,
        ] {
            assert_eq!(parse(&mode.to_string()), Ok(mode));
        }
        assert_eq!(
            RedisModeArg::from_str("CLUSTER", true).map(RedisMode::from),
            Ok(RedisMode::Cluster)
        );
        assert!(parse("replica").is_err());
    }
}
