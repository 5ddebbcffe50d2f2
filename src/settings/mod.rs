//! Command line and environment → [`Settings`]. Every flag also reads `SLUICE_<FLAG_IN_CAPS>`.
//!
//! The command-line layer: the flags of every subsystem are declared here. The engine's option
//! structs own their defaults (`RedisOptions::DEFAULT_URL`, ...) and the flags show them;
//! [`options`] turns parsed flags into those structs (`impl From<&Settings> for RedisOptions`,
//! ...), so no engine module knows clap. [`Settings::defaults`] is every flag at its default.
//!
//! - [`flags`]: value enums and parsers (`parse_duration`, `--backend`, `--failure-mode`, ...).
//! - [`admin`], [`config`], [`per_second`], [`security`], [`telemetry`], [`xds`]: the flag groups flattened
//!   into `serve`.
//! - [`commands`]: the flags of `check-config` and `explain`.

pub mod admin;
pub mod commands;
pub mod config;
pub mod flags;
mod options;
pub mod per_second;
pub mod security;
pub mod telemetry;
pub mod xds;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use clap::{Args, FromArgMatches, Parser, Subcommand};

use crate::backend::DEFAULT_CALL_DEADLINE;
use crate::backend::breaker::BreakerSettings;
use crate::backend::memory::MemoryOptions;
use crate::backend::redis::{BatchSettings, RedisOptions};
use crate::limiter::LimiterOptions;
use crate::limiter::lease::LeaseOptions;
use crate::quota::QuotaOptions;
use crate::rls::{HeaderOptions, RequestBounds};

pub use self::admin::AdminArgs;
pub use self::commands::{
    BucketAction, BucketArgs, BucketTarget, CheckConfigArgs, ExplainArgs, TopArgs,
};
pub use self::config::{ConfigOpsArgs, LoadArgs};
pub use self::flags::{
    BackendKind, ConfigSourceArg, FailureModeArg, LogFormat, OutputFormat, RedisModeArg,
    ResponseHeaders, duration_text, parse_duration, parse_ratio,
};
pub use self::per_second::PerSecondRedisArgs;
pub use self::security::{CallerArgs, Http2Args, ListenerArgs, SecurityArgs, TlsArgs};
pub use self::telemetry::{OtlpSettings, TelemetryArgs};
pub use self::xds::XdsArgs;

#[derive(Debug, Parser)]
#[command(name = "sluice", version, about = "Envoy external rate-limit service")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve envoy.service.ratelimit.v3.RateLimitService over gRPC.
    Serve(Box<Settings>),
    /// Validate a config file or directory: exit 0 with a summary, or 1 with file:line errors.
    CheckConfig(CheckConfigArgs),
    /// Show which rule a descriptor reaches (or why none), its bucket and its storage key.
    Explain(ExplainArgs),
    /// Watch one replica's keys most limited and most active per rule (its admin GET /top).
    Top(TopArgs),
    /// Look at or reset a descriptor's buckets on a running sluice, through its admin listener.
    Bucket(BucketArgs),
}

/// Everything `serve` needs.
#[derive(Clone, Debug, Args)]
pub struct Settings {
    /// A YAML file or a directory of *.yaml / *.yml descriptor configs (required unless the
    /// config source is xds).
    #[arg(long, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,

    /// gRPC listen address (RateLimitService and grpc.health.v1).
    #[arg(long, env = "SLUICE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    pub grpc_addr: SocketAddr,

    /// Admin HTTP listen address (health, readiness, config). Loopback by default.
    #[arg(long, env = "SLUICE_ADMIN_ADDR", default_value = "127.0.0.1:6070")]
    pub admin_addr: SocketAddr,

    /// Allow the admin listener's one write, `DELETE /buckets` (reset a descriptor's buckets,
    /// `sluice bucket reset`); without it that answers 403. `GET /buckets` needs nothing.
    #[arg(long, env = "SLUICE_ADMIN_WRITE", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set)]
    pub admin_write: bool,

    /// Where buckets live.
    #[arg(long, env = "SLUICE_BACKEND", value_enum, default_value = "memory")]
    pub backend: BackendKind,

    /// redis://[user:pass@]host:port[/db] or rediss:// for TLS; several, comma-separated, for
    /// Cluster seeds or Sentinels.
    #[arg(
        long,
        env = "SLUICE_REDIS_URL",
        value_delimiter = ',',
        default_value = RedisOptions::DEFAULT_URL
    )]
    pub redis_url: Vec<String>,

    #[arg(
        long,
        env = "SLUICE_REDIS_MODE",
        value_enum,
        default_value = "standalone"
    )]
    pub redis_mode: RedisModeArg,

    /// Master name to ask the Sentinels for.
    #[arg(long, env = "SLUICE_REDIS_SENTINEL_MASTER", default_value = RedisOptions::DEFAULT_SENTINEL_MASTER)]
    pub redis_sentinel_master: String,

    #[command(flatten)]
    pub redis_per_second: PerSecondRedisArgs,

    /// Deadline of one Redis call, well under Envoy's 20 ms filter timeout.
    #[arg(long, env = "SLUICE_REDIS_TIMEOUT", value_parser = parse_duration,
          default_value = duration_text(DEFAULT_CALL_DEADLINE))]
    pub redis_timeout: Duration,

    /// Deadline for establishing a Redis connection.
    #[arg(long, env = "SLUICE_REDIS_CONNECT_TIMEOUT", value_parser = parse_duration,
          default_value = duration_text(RedisOptions::DEFAULT_CONNECT_TIMEOUT))]
    pub redis_connect_timeout: Duration,

    /// Upper bound of a random delay added to the expiry of every Redis key a call writes, so
    /// keys written together (fixed-window counters) do not all expire together. Never changes
    /// a decision. envoyproxy/ratelimit's EXPIRATION_JITTER_MAX_SECONDS.
    #[arg(long, env = "SLUICE_EXPIRY_JITTER_MAX", value_parser = parse_duration,
          default_value = duration_text(Duration::ZERO))]
    pub expiry_jitter_max: Duration,

    /// Most keys (descriptors) one Redis script call decides for concurrent requests
    /// (standalone and Sentinel modes); a request is never split, one with more keys goes
    /// alone. Checks share a call only when earlier calls are still out, so an idle server
    /// answers each at once; every request is still decided exactly as its own call would. The
    /// bound caps how long one call holds Redis (about 13 µs per fresh key). 1: one call per
    /// request.
    #[arg(long, env = "SLUICE_REDIS_MAX_BATCH", default_value_t = BatchSettings::DEFAULT_MAX_KEYS as u64,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub redis_max_batch: u64,

    /// Script calls out at once on the standalone connection (or Sentinel mode's master) before
    /// new checks queue for the next batch. More calls: each waits less for a batch to form,
    /// batches are smaller.
    #[arg(long, env = "SLUICE_REDIS_BATCH_CALLS", default_value_t = BatchSettings::DEFAULT_IN_FLIGHT as u64,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub redis_batch_calls: u64,

    /// Prefix of every bucket key (must not contain `{` or `}`).
    #[arg(long, env = "SLUICE_KEY_PREFIX", default_value = LimiterOptions::DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,

    /// Failure mode of domains and rules that set none.
    #[arg(long, env = "SLUICE_FAILURE_MODE", value_enum,
          default_value = LimiterOptions::DEFAULT_FAILURE_MODE.as_str())]
    pub failure_mode: FailureModeArg,

    /// Rate-limit headers added to answers: `all` (x-ratelimit-limit, -remaining, -reset, and
    /// retry-after on OVER_LIMIT), `retry-after` (only that: for an Envoy whose
    /// `enable_x_ratelimit_headers` writes the others, which it never does for retry-after), or
    /// `none`. `true`/`false` mean `all`/`none`.
    #[arg(
        long,
        env = "SLUICE_RESPONSE_HEADERS",
        value_enum,
        default_value = "all"
    )]
    pub response_headers: ResponseHeaders,

    /// Fill `RateLimitResponse.dynamic_metadata` as envoyproxy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA` does: the domain, each descriptor, and the `metadata` of the
    /// rules of the descriptors that passed.
    #[arg(long, env = "SLUICE_RESPONSE_DYNAMIC_METADATA", default_value_t = false, action = clap::ArgAction::Set)]
    pub response_dynamic_metadata: bool,

    #[arg(long, env = "SLUICE_HEADER_LIMIT", default_value = HeaderOptions::DEFAULT_LIMIT)]
    pub header_limit: String,

    #[arg(
        long,
        env = "SLUICE_HEADER_REMAINING",
        default_value = HeaderOptions::DEFAULT_REMAINING
    )]
    pub header_remaining: String,

    #[arg(long, env = "SLUICE_HEADER_RESET", default_value = HeaderOptions::DEFAULT_RESET)]
    pub header_reset: String,

    #[arg(long, env = "SLUICE_HEADER_RETRY_AFTER", default_value = HeaderOptions::DEFAULT_RETRY_AFTER)]
    pub header_retry_after: String,

    /// Header naming the failure policies that decided a degraded response (sent with the
    /// other headers; empty: never sent).
    #[arg(
        long,
        env = "SLUICE_HEADER_DEGRADED",
        default_value = HeaderOptions::DEFAULT_DEGRADED
    )]
    pub header_degraded: String,

    /// Failed moments (spans of one `--redis-timeout` in which most calls to one Redis endpoint
    /// failed or timed out; a stall seen by many callers is one per deadline it lasts) that
    /// `--breaker-window` must hold before its circuit breaker can open.
    #[arg(long, env = "SLUICE_BREAKER_FAILURES", default_value_t = BreakerSettings::DEFAULT_MIN_FAILURES,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub breaker_failures: u32,

    /// Share of the moments of `--breaker-window` in which the endpoint was called that must
    /// have failed to open its breaker (0 < ratio <= 1).
    #[arg(long, env = "SLUICE_BREAKER_FAILURE_RATIO", value_parser = parse_ratio,
          default_value_t = f64::from(BreakerSettings::DEFAULT_FAILURE_PERMILLE) / 1000.0)]
    pub breaker_failure_ratio: f64,

    /// How far back a breaker judges its endpoint (rolling, in tenths).
    #[arg(long, env = "SLUICE_BREAKER_WINDOW", value_parser = parse_duration,
          default_value = duration_text(BreakerSettings::DEFAULT_WINDOW))]
    pub breaker_window: Duration,

    /// How long an open breaker skips its Redis endpoint before one probe call is let through.
    #[arg(long, env = "SLUICE_BREAKER_COOLDOWN", value_parser = parse_duration,
          default_value = duration_text(BreakerSettings::DEFAULT_COOLDOWN))]
    pub breaker_cooldown: Duration,

    /// Replicas sharing each limit, for the `local` failure policy (each local bucket holds
    /// limit / N); 0: count the live replicas through a heartbeat in Redis.
    #[arg(long, env = "SLUICE_REPLICAS", default_value_t = 0)]
    pub replicas: u64,

    /// Answer OVER_LIMIT locally for a bucket Redis just rejected, until its retry-after passes.
    #[arg(long, env = "SLUICE_OVER_LIMIT_CACHE", default_value_t = true, action = clap::ArgAction::Set)]
    pub over_limit_cache: bool,

    /// Most buckets the over-limit cache remembers.
    #[arg(long, env = "SLUICE_OVER_LIMIT_CACHE_MAX_KEYS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub over_limit_cache_max_keys: u64,

    /// Most bucket keys with a token lease (rules with `lease`) on this replica; a new key past
    /// it takes the place of an empty lease, or is not leased.
    #[arg(long, env = "SLUICE_LEASE_MAX_KEYS", default_value_t = LeaseOptions::DEFAULT_MAX_KEYS as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_max_keys: u64,

    /// How long leased tokens may be spent locally; older ones go back to the bucket.
    #[arg(long, env = "SLUICE_LEASE_LIFETIME", value_parser = parse_duration,
          default_value = duration_text(LeaseOptions::DEFAULT_LIFETIME))]
    pub lease_lifetime: Duration,

    /// RLQS: how often each replica re-plans its data planes' shares, takes what they need from
    /// the shared buckets and pushes assignments (a token bucket holds this much of its rate).
    #[arg(long, env = "SLUICE_RLQS_PUSH_INTERVAL", value_parser = parse_duration,
          default_value = duration_text(QuotaOptions::DEFAULT_PUSH_INTERVAL))]
    pub rlqs_push_interval: Duration,

    /// RLQS: `assignment_time_to_live` of every assignment — longer than the push interval; a
    /// data plane whose sluice is gone falls back to its expired-assignment behaviour within it.
    /// What a data plane may admit over it is paid ahead, so it bounds the grant slack. Whole
    /// seconds: Envoy reads only the seconds of `assignment_time_to_live` (600 ms is 0 s to it:
    /// the assignment expires as it arrives).
    #[arg(long, env = "SLUICE_RLQS_ASSIGNMENT_TTL", value_parser = parse_duration,
          default_value = duration_text(QuotaOptions::DEFAULT_ASSIGNMENT_TTL))]
    pub rlqs_assignment_ttl: Duration,

    /// RLQS: a bucket a data plane has not reported for this long is abandoned.
    #[arg(long, env = "SLUICE_RLQS_IDLE_TIMEOUT", value_parser = parse_duration,
          default_value = duration_text(QuotaOptions::DEFAULT_IDLE_TIMEOUT))]
    pub rlqs_idle_timeout: Duration,

    /// RLQS: most buckets one stream may subscribe; reports for more are ignored (counted).
    #[arg(long, env = "SLUICE_RLQS_MAX_BUCKETS_PER_STREAM",
          default_value_t = QuotaOptions::DEFAULT_MAX_BUCKETS_PER_STREAM as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub rlqs_max_buckets_per_stream: u64,

    /// RLQS: most bucket subscriptions on this replica, every stream together (each costs about
    /// 2 KB); a new bucket past it is ignored (counted) until others go.
    #[arg(long, env = "SLUICE_RLQS_MAX_SUBSCRIPTIONS",
          default_value_t = QuotaOptions::DEFAULT_MAX_SUBSCRIPTIONS as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub rlqs_max_subscriptions: u64,

    /// RLQS: most entries in one bucket id; a bucket id with more is ignored (counted).
    #[arg(long, env = "SLUICE_RLQS_MAX_BUCKET_ENTRIES",
          default_value_t = QuotaOptions::DEFAULT_MAX_BUCKET_ENTRIES as u64,
          value_parser = clap::value_parser!(u64).range(1..=64))]
    pub rlqs_max_bucket_entries: u64,

    /// RLQS: a stream that sends no usage report for this long after it opens is ended with
    /// DEADLINE_EXCEEDED (Envoy opens a stream to send a report, and sends it at once).
    #[arg(long, env = "SLUICE_RLQS_FIRST_REPORT_TIMEOUT", value_parser = parse_duration,
          default_value = duration_text(QuotaOptions::DEFAULT_FIRST_REPORT_TIMEOUT))]
    pub rlqs_first_report_timeout: Duration,

    /// Most ShouldRateLimit decisions in progress; past it a call is refused at once with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "SLUICE_MAX_IN_FLIGHT", default_value_t = 4096,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_in_flight: u64,

    /// Largest accepted request message, in bytes (as encoded; a larger one is INVALID_ARGUMENT).
    /// The default, 4 MiB, holds `--max-descriptors` (64) descriptors each carrying Envoy's
    /// whole default request-header block (60 KiB) once: Envoy copies header values into
    /// descriptors unchanged and may copy one header into several.
    #[arg(long, env = "SLUICE_MAX_MESSAGE_BYTES", default_value_t = RequestBounds::DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: usize,

    /// Most descriptors in one request.
    #[arg(long, env = "SLUICE_MAX_DESCRIPTORS", default_value_t = RequestBounds::DEFAULT_MAX_DESCRIPTORS)]
    pub max_descriptors: usize,

    /// Most entries in one descriptor.
    #[arg(long, env = "SLUICE_MAX_ENTRIES", default_value_t = RequestBounds::DEFAULT_MAX_ENTRIES)]
    pub max_entries: usize,

    /// Longest descriptor entry key, in bytes.
    #[arg(long, env = "SLUICE_MAX_KEY_BYTES", default_value_t = RequestBounds::DEFAULT_MAX_KEY_BYTES)]
    pub max_key_bytes: usize,

    /// Deprecated, no effect: a descriptor value of any length is decided (refusing one let the
    /// request through Envoy unlimited); `--max-message-bytes` bounds values with the rest of the
    /// request. Accepted so existing deployments start; a warning is logged when it is set.
    #[arg(long, env = "SLUICE_MAX_VALUE_BYTES", hide = true)]
    pub max_value_bytes: Option<usize>,

    /// Most live buckets the memory backend keeps (and, separately, the `local` failure
    /// policy's buckets).
    #[arg(long, env = "SLUICE_MEMORY_MAX_BUCKETS", default_value_t = MemoryOptions::DEFAULT_MAX_BUCKETS)]
    pub memory_max_buckets: usize,

    /// After SIGTERM/SIGINT, how long sluice keeps answering while reporting NOT_SERVING (gRPC
    /// health, `/readyz`) before it closes its gRPC listener, so health-checking callers (Envoy,
    /// Kubernetes) take it out of rotation first; skipped when no gRPC connection is open. Keep
    /// it above the caller's health-check interval × unhealthy threshold + timeout.
    #[arg(long, env = "SLUICE_DRAIN_DELAY", value_parser = parse_duration, default_value = "3s")]
    pub drain_delay: Duration,

    /// How long in-flight calls may finish once the gRPC listener has closed.
    #[arg(long, env = "SLUICE_DRAIN_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub drain_timeout: Duration,

    /// Serving threads, each with its own runtime and its share of the gRPC connections (default:
    /// the CPUs this process may use, cgroup quota included). A connection stays on one thread;
    /// see src/runtime.rs.
    #[arg(long, env = "SLUICE_WORKER_THREADS")]
    pub worker_threads: Option<std::num::NonZeroUsize>,

    /// Log level filter (RUST_LOG syntax), e.g. `info` or `sluice=debug`.
    #[arg(long, env = "SLUICE_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    #[arg(long, env = "SLUICE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    #[command(flatten)]
    pub config_ops: ConfigOpsArgs,

    #[command(flatten)]
    pub xds: XdsArgs,

    #[command(flatten)]
    pub security: SecurityArgs,

    #[command(flatten)]
    pub telemetry: TelemetryArgs,

    #[command(flatten)]
    pub admin: AdminArgs,
}

/// Every flag at its default, the environment not read; parsed once.
static DEFAULTS: LazyLock<Settings> = LazyLock::new(|| {
    let command = Settings::augment_args(clap::Command::new("serve")).mut_args(|arg| arg.env(None));
    let matches = command
        .try_get_matches_from(["serve"])
        .expect("every serve flag has a default or is optional");
    Settings::from_arg_matches(&matches).expect("defaults parse")
});

impl Settings {
    /// Every flag at its clap default, whatever the environment says: the one source of the
    /// defaults of the options structs built from settings.
    pub fn defaults() -> Settings {
        DEFAULTS.clone()
    }

    /// Settings for `config` with every other value at its default (tests, embedding).
    pub fn with_config(config: impl Into<PathBuf>) -> Settings {
        let config = config.into();
        let cli = Cli::try_parse_from([
            "sluice".as_ref(),
            "serve".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
        ])
        .expect("defaults parse");
        match cli.command {
            Command::Serve(s) => *s,
            _ => unreachable!("parsed serve"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_parsed_command_line() {
        let defaults = Settings::defaults();
        assert_eq!(defaults.config, None);
        let parsed = Settings::with_config("c");
        let with_config = Settings {
            config: Some("c".into()),
            ..defaults
        };
        assert_eq!(format!("{with_config:?}"), format!("{parsed:?}"));
    }

    #[test]
    fn defaults_match_the_design() {
        let s = Settings::with_config("config/");
        assert_eq!(s.grpc_addr.to_string(), "0.0.0.0:8081");
        assert_eq!(s.admin_addr.to_string(), "127.0.0.1:6070");
        assert_eq!(s.backend, BackendKind::Memory);
        assert_eq!(s.response_headers, ResponseHeaders::All);
        assert!(s.redis_timeout < Duration::from_millis(20));
        assert_eq!(s.breaker_failures, 10);
        assert_eq!(s.breaker_failure_ratio, 0.5);
        assert_eq!(s.breaker_window, Duration::from_secs(1));
        assert_eq!(s.breaker_cooldown, Duration::from_secs(1));
        assert_eq!(s.replicas, 0, "discovered");
        assert!(s.over_limit_cache);
        assert_eq!(s.max_in_flight, 4096);
        assert_eq!(s.header_degraded, "x-ratelimit-degraded");
        assert_eq!(s.expiry_jitter_max, Duration::ZERO);
        assert_eq!(s.redis_max_batch, 128);
        assert_eq!(s.redis_batch_calls, 2);
        assert_eq!(
            s.worker_threads, None,
            "tokio's default: the available CPUs"
        );
        assert_eq!(
            s.config_ops.load.default_algorithm,
            sluice_core::algorithm::Algorithm::TokenBucket
        );
        assert_eq!(
            s.config_ops.load.default_charge,
            sluice_core::rule::Charge::IfAllowed
        );
    }

    #[test]
    fn algorithm_and_jitter_flags_parse() {
        let cli = Cli::try_parse_from([
            "sluice",
            "serve",
            "--config",
            "c",
            "--default-algorithm",
            "Sliding_Window",
            "--default-charge",
            "always",
            "--expiry-jitter-max",
            "30s",
        ])
        .unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("serve")
        };
        assert_eq!(
            s.config_ops.load.default_algorithm,
            sluice_core::algorithm::Algorithm::SlidingWindow
        );
        assert_eq!(
            s.config_ops.load.default_charge,
            sluice_core::rule::Charge::Always
        );
        assert_eq!(s.expiry_jitter_max, Duration::from_secs(30));
        assert!(Cli::try_parse_from(["sluice", "serve", "--default-algorithm", "leaky"]).is_err());
        assert!(Cli::try_parse_from(["sluice", "serve", "--default-charge", "never"]).is_err());
    }

    #[test]
    fn several_redis_urls_split_on_commas() {
        let cli = Cli::try_parse_from([
            "sluice",
            "serve",
            "--config",
            "c",
            "--redis-url",
            "redis://a:1,redis://b:2",
        ])
        .unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("serve")
        };
        assert_eq!(s.redis_url, vec!["redis://a:1", "redis://b:2"]);
    }

    #[test]
    fn the_per_second_redis_is_off_unless_given() {
        let s = Settings::with_config("c");
        assert!(!s.redis_per_second.enabled());
        let cli = Cli::try_parse_from([
            "sluice",
            "serve",
            "--config",
            "c",
            "--redis-per-second-url",
            "redis://a:1,redis://b:2",
            "--redis-per-second-mode",
            "cluster",
        ])
        .unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("serve")
        };
        assert!(s.redis_per_second.enabled());
        assert_eq!(s.redis_per_second.url, ["redis://a:1", "redis://b:2"]);
        assert_eq!(s.redis_per_second.mode, RedisModeArg::Cluster);
        assert_eq!(s.redis_per_second.sentinel_master, "mymaster");
    }
}
