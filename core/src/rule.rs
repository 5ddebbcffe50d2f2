//! Compiled rules: what a descriptor config says about one bucket.
//!
//! Produced by [`crate::config`], found by [`crate::descriptor`], consumed by
//! the service crate's limiter. Plain data, no behaviour beyond unit arithmetic.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::algorithm::{Algorithm, BucketParams};

/// A rate-limit time unit, with envoyproxy/ratelimit's lengths (a month is 30 days, a year 365).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    pub const fn millis(self) -> u64 {
        self.seconds() * 1_000
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Parses a config spelling; envoyproxy/ratelimit configs use upper case (`SECOND`), so case is ignored.
    pub fn parse(s: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(s))
    }

    /// From Envoy's `RateLimitUnit` enum value (`envoy.type.v3.RateLimitUnit`); UNKNOWN (0) is `None`.
    pub const fn from_proto(value: i32) -> Option<Unit> {
        match value {
            1 => Some(Unit::Second),
            2 => Some(Unit::Minute),
            3 => Some(Unit::Hour),
            4 => Some(Unit::Day),
            5 => Some(Unit::Month),
            6 => Some(Unit::Year),
            7 => Some(Unit::Week),
            _ => None,
        }
    }

    pub const fn to_proto(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A rule's window as people say it: `minute` for one unit, `30 seconds` for several.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub unit: Unit,
    pub multiplier: u32,
}

impl Window {
    /// The window as a noun: `minute`, `30-second window` ("this minute's count", "this
    /// 30-second window's count").
    pub fn noun(&self) -> String {
        if self.multiplier <= 1 {
            self.unit.as_str().to_owned()
        } else {
            format!("{}-{} window", self.multiplier, self.unit.as_str())
        }
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.multiplier <= 1 {
            f.write_str(self.unit.as_str())
        } else {
            write!(f, "{} {}s", self.multiplier, self.unit.as_str())
        }
    }
}

/// A token bucket's size and refill: `requests_per_unit` tokens per window of
/// `unit_multiplier` × `unit`, holding at most `burst` (default `requests_per_unit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct RateLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// Units per window (1: the window is one `unit`); "60 per 30 seconds" is 60 per 30 × second.
    #[serde(skip_serializing_if = "is_one")]
    pub unit_multiplier: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// The longest window a rule may have (`unit_multiplier` × `unit`): ten 365-day years, so every
/// window in ms stays far below 2^53, where the algorithms' doubles stop counting whole ms.
pub const MAX_WINDOW_SECS: u64 = 10 * 365 * 86_400;

impl RateLimit {
    /// `requests_per_unit` per one `unit` (no multiplier).
    pub const fn per(requests_per_unit: u32, unit: Unit) -> RateLimit {
        RateLimit {
            requests_per_unit,
            unit,
            unit_multiplier: 1,
            burst: None,
        }
    }

    /// The window's length in seconds: `unit_multiplier` × `unit`.
    pub const fn window_secs(&self) -> u64 {
        window_secs(self.unit, self.unit_multiplier)
    }

    /// The window's length in ms.
    pub const fn window_ms(&self) -> u64 {
        self.window_secs() * 1_000
    }

    /// The window in words: `minute`, `30 seconds`.
    pub const fn window(&self) -> Window {
        Window {
            unit: self.unit,
            multiplier: self.unit_multiplier,
        }
    }

    pub const fn capacity(&self) -> u64 {
        match self.burst {
            Some(b) => b as u64,
            None => self.requests_per_unit as u64,
        }
    }

    pub const fn bucket(&self) -> BucketParams {
        BucketParams {
            capacity: self.capacity(),
            requests_per_unit: self.requests_per_unit as u64,
            unit_ms: self.window_ms(),
        }
    }

    /// One shard's share of this limit under `shards: n`: `requests_per_unit / n` per unit and
    /// `burst / n`. Config validation makes `n` divide both, so nothing is rounded away and the
    /// n shards together hold exactly this limit.
    pub const fn split(&self, n: u32) -> RateLimit {
        let n = if n == 0 { 1 } else { n };
        RateLimit {
            requests_per_unit: self.requests_per_unit / n,
            unit: self.unit,
            unit_multiplier: self.unit_multiplier,
            burst: match self.burst {
                Some(b) => Some(b / n),
                None => None,
            },
        }
    }
}

/// What a rule limits to: a bucket, nothing (`unlimited: true`), or everything
/// (`requests_per_unit: 0`, envoyproxy/ratelimit's way to block a descriptor).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Unlimited,
    Bucket(RateLimit),
    /// Every request is OVER_LIMIT; no bucket is kept and the backend is never asked. `unit` is
    /// only reported (`current_limit` is `{0, unit}`).
    Blocked {
        unit: Unit,
    },
}

/// What to answer when the shared backend cannot be asked.
///
/// The default is `Error`: like envoyproxy/ratelimit, the RPC fails with UNAVAILABLE and Envoy's
/// own `failure_mode_deny` decides, so switching to sluice changes nothing until an operator opts in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureMode {
    /// Answer OK.
    Open,
    /// Answer OVER_LIMIT.
    Closed,
    /// Decide with an in-process bucket of limit / live replicas.
    Local,
    /// Fail the RPC with UNAVAILABLE.
    #[default]
    Error,
}

impl FailureMode {
    pub fn parse(s: &str) -> Option<FailureMode> {
        match s.to_ascii_lowercase().as_str() {
            "open" => Some(FailureMode::Open),
            "closed" => Some(FailureMode::Closed),
            "local" => Some(FailureMode::Local),
            "error" => Some(FailureMode::Error),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
            FailureMode::Local => "local",
            FailureMode::Error => "error",
        }
    }
}

/// When a rule's hits are counted (`charge`, beside `cost`; a domain's `charge` is the default of
/// its rules, `--default-charge` the global one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Charge {
    /// Only when the request is allowed and the hits fit: a refused request takes nothing.
    #[default]
    IfAllowed,
    /// Whatever the answer: hits that do not fit are counted too and put the key into debt,
    /// which refill repays before it admits again. For costs known after the response (Envoy's
    /// `apply_on_stream_done` charges, whose answer Envoy ignores), and envoyproxy/ratelimit's
    /// counting of over-limit hits.
    Always,
}

impl Charge {
    pub const ALL: [Charge; 2] = [Charge::IfAllowed, Charge::Always];

    /// The config and command-line spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Charge::IfAllowed => "if_allowed",
            Charge::Always => "always",
        }
    }

    /// Parses a config spelling, any case.
    pub fn parse(s: &str) -> Option<Charge> {
        Charge::ALL
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Charge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a setting that falls back from rule to domain to a global default came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The rule's own `rate_limit`.
    Rule,
    /// The domain file's top level.
    Domain,
    /// The global default (a command-line flag or its environment variable).
    Default,
}

impl Origin {
    pub const fn as_str(self) -> &'static str {
        match self {
            Origin::Rule => "rule",
            Origin::Domain => "domain",
            Origin::Default => "default",
        }
    }
}

/// Dense index of a rule within one loaded config (stable for the life of that config only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct RuleId(pub u32);

/// One configured descriptor that carries a `rate_limit`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rule {
    pub id: RuleId,
    pub domain: Arc<str>,
    /// Dotted config path, as envoyproxy/ratelimit names its stats: `domain.key_value.key`
    /// (a wildcard value keeps its `*`). Used as the metric label.
    pub path: Arc<str>,
    /// `rate_limit.name`, the handle `replaces` refers to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<Arc<str>>,
    pub limit: Limit,
    /// How hits are counted: `rate_limit.algorithm`, else the domain's `algorithm`, else
    /// `--default-algorithm`. Resolved at load time, so validation knows it.
    pub algorithm: Algorithm,
    pub algorithm_from: Origin,
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit's `quota_mode` (or `--quota-mode`): the request is rejected for
    /// this rule's descriptor only when every quota-mode descriptor of the request is over its
    /// limit ([`crate::decision::overall`]). Never leased.
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// Tokens per hit (weighted endpoints); at least 1.
    pub cost: u64,
    /// When hits are counted: the descriptor's `charge`, else the domain's, else
    /// `--default-charge`. Resolved at load time. Never `Always` with a `lease`.
    pub charge: Charge,
    pub charge_from: Origin,
    /// `rate_limit.lease`: a replica takes up to this many tokens per backend call and spends
    /// them locally (the service crate's `lease` module). Only on token-bucket and GCRA rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
    /// `rate_limit.shards`: hot-key splitting. Each descriptor's bucket is N sub-buckets of
    /// `limit / N` under keys with `~s<i>` in the hash tag (N Cluster slots); each request is
    /// judged by one of them. 2..=64, dividing `requests_per_unit` and `burst`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    /// `in_flight`: the rule caps requests in flight (its `limit` is a bucket of `max` per
    /// second, only reported; [`Algorithm::InFlight`] decides).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlightRule>,
    /// `reserve`: the holder entry's first call reserves its hits on the bucket, its next one
    /// settles them ([`crate::algorithm::reservation`]); the same holder entry and longest hold
    /// as an in-flight cap's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve: Option<InFlightRule>,
    /// Descriptor override, else the domain's; `None` means the global default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_mode: Option<FailureMode>,
    /// Names of rules this one replaces when both match one request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<Arc<str>>,
    /// Per request entry, the wildcard pattern that stands for the entry's value in the bucket
    /// key when that level of the path says `share_threshold: true` (all values it matches share
    /// one bucket); empty when no level does. See [`crate::key`].
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub shared_values: Arc<[Option<Arc<str>>]>,
    /// Per request entry, how that level of the path is named in per-rule metrics when some
    /// level says `value_to_metric: true`; empty when none does (the metric key is `path`).
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub metric_levels: Arc<[MetricLevel]>,
    /// envoyproxy/ratelimit's `metadata` of the descriptor, as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Arc<serde_json::Value>>,
    /// YAML source location (`file:line`) of the descriptor, for `explain` and diagnostics.
    pub source: Arc<str>,
    /// A limit of a `rate_limits` list: its window in seconds, which tags its storage key
    /// ([`crate::key::RuleTag::Window`]). `None` for a `rate_limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_tag: Option<u64>,
    /// The descriptor's other limits (`rate_limits` after the first): each its own rule, bucket
    /// and metrics, all enforced together with this one.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub also: Arc<[Arc<Rule>]>,
}

impl Rule {
    /// The holder entry and hold of an in-flight cap or of reservations: the entry that ends the
    /// descriptor and is kept out of its storage key.
    pub fn holding(&self) -> Option<&InFlightRule> {
        self.in_flight.as_ref().or(self.reserve.as_ref())
    }

    /// This rule and the descriptor's other limits, in config order.
    pub fn limits(self: &Arc<Self>) -> impl Iterator<Item = &Arc<Rule>> {
        std::iter::once(self).chain(self.also.iter())
    }
}

/// The window of `unit_multiplier` × `unit`, in seconds (a multiplier of 0 counts as 1).
pub const fn window_secs(unit: Unit, unit_multiplier: u32) -> u64 {
    unit.seconds() * multiplier(unit_multiplier)
}

const fn multiplier(unit_multiplier: u32) -> u64 {
    if unit_multiplier == 0 {
        1
    } else {
        unit_multiplier as u64
    }
}

/// A window as a short label for paths and metrics: `30s`, `5m`, `1h`, `7d`.
pub fn window_label(secs: u64) -> String {
    match secs {
        s if s >= 86_400 && s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s >= 3_600 && s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// What `in_flight` adds to a rule: who holds a slot and for how long at most.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InFlightRule {
    /// The key of the descriptor entry naming the holder (e.g. `request_id`, from Envoy's
    /// `x-request-id`): the entry right after the rule's own, kept out of the storage key.
    pub holder: Arc<str>,
    /// A slot not released by then frees itself.
    pub max_hold_ms: u64,
}

/// How one level of a rule's path names itself in per-rule metrics (envoyproxy/ratelimit's
/// `value_to_metric`): `key`, then `_value` where a value is named.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MetricLevel {
    /// The configured value or wildcard pattern; `None` for a key-only descriptor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<Arc<str>>,
    /// `value_to_metric: true`: the request's value names this level instead (unless the level
    /// is a `share_threshold` wildcard, which is always named by its pattern).
    pub value_to_metric: bool,
}
