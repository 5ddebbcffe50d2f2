//! The value types of flags: the enums clap parses (`--backend`, `--redis-mode`, ...) and the
//! parsers of values clap has none for (durations, ratios, algorithms).

use std::time::Duration;

use clap::ValueEnum;
use sluice_core::algorithm::Algorithm;
use sluice_core::rule::{Charge, FailureMode};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Embedded in-process buckets (one replica; development, tests).
    Memory,
    /// Shared buckets in Redis (standalone, Cluster or Sentinel).
    Redis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RedisModeArg {
    Standalone,
    Cluster,
    Sentinel,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FailureModeArg {
    Open,
    Closed,
    Local,
    Error,
}

impl From<FailureModeArg> for FailureMode {
    fn from(value: FailureModeArg) -> Self {
        match value {
            FailureModeArg::Open => FailureMode::Open,
            FailureModeArg::Closed => FailureMode::Closed,
            FailureModeArg::Local => FailureMode::Local,
            FailureModeArg::Error => FailureMode::Error,
        }
    }
}

/// Which rate-limit headers sluice adds to its answers (`--response-headers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ResponseHeaders {
    /// `x-ratelimit-limit`, `-remaining`, `-reset`, and `retry-after` on OVER_LIMIT.
    #[value(alias = "true")]
    All,
    /// Only `retry-after` on OVER_LIMIT: for an Envoy whose `enable_x_ratelimit_headers`
    /// writes the `x-ratelimit-*` headers itself (it never writes `retry-after`).
    RetryAfter,
    /// None.
    #[value(alias = "false")]
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Output of `check-config` and `explain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// For people.
    Text,
    /// One JSON document on stdout, for CI bots.
    Json,
}

/// Where descriptor configs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ConfigSourceArg {
    /// YAML files (`--config`).
    File,
    /// An xDS management server over ADS (`--xds-server`).
    Xds,
}

/// Parses `15ms`, `2s`, `1m`, or a bare number of milliseconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, scale_ms) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1_000.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000.0)
    } else {
        (s, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("invalid duration `{s}` (examples: 15ms, 2s, 1m)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("invalid duration `{s}`"));
    }
    Ok(Duration::from_micros(
        (value * scale_ms * 1_000.0).round() as u64
    ))
}

/// `d` as `parse_duration` reads it back: whole seconds as `1s`, else milliseconds (`15ms`).
pub fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

/// A share above 0 and at most 1 (`0.5`).
pub fn parse_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(value) if value > 0.0 && value <= 1.0 => Ok(value),
        _ => Err(format!(
            "invalid ratio `{s}` (a number above 0 and at most 1, e.g. 0.5)"
        )),
    }
}

/// An algorithm by any of its spellings ([`Algorithm::parse`]).
pub(super) fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::parse(s).ok_or_else(|| {
        format!(
            "unknown algorithm `{s}` (expected one of: {})",
            Algorithm::names()
        )
    })
}

pub(super) fn parse_charge(s: &str) -> Result<Charge, String> {
    Charge::parse(s)
        .ok_or_else(|| format!("unknown charge `{s}` (expected one of: if_allowed, always)"))
}

/// A ratio in (0, 1].
pub(super) fn parse_near_limit_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(format!("`{s}` is not a ratio in (0, 1]")),
    }
}

/// A ratio in [0, 1].
pub(super) fn parse_sampling_ratio(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("`{s}` is not a ratio in [0, 1]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_parse_within_zero_exclusive_to_one() {
        assert_eq!(parse_ratio("0.5"), Ok(0.5));
        assert_eq!(parse_ratio("1"), Ok(1.0));
        assert!(parse_ratio("0").is_err());
        assert!(parse_ratio("1.01").is_err());
        assert!(parse_ratio("NaN").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("15ms"), Ok(Duration::from_millis(15)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("7"), Ok(Duration::from_millis(7)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1s").is_err());
    }
}
