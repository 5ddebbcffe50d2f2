//! The buckets a descriptor, or an RLQS bucket id, keeps in the backend: each storage key with
//! the algorithm and shape it is decided with, for the admin listener's `/buckets`. The walk is
//! [`explain`]'s and the keys are written as the request path writes them, so they are the keys
//! a request charges.

use std::sync::Arc;

use super::{ExplainOptions, RepeatedKey, Report, RuleView, explain, explain_bucket, storage_key};
use crate::algorithm::{Algorithm, BucketParams};
use crate::config::{Config, Domain};
use crate::key::RuleTag;
use crate::request::Entry;
use crate::rule::{Limit, RateLimit, Rule};

/// One storage key of a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredKey {
    pub key: String,
    pub algorithm: Algorithm,
    /// The shape the key is decided with (one shard's share for a sharded rule).
    pub params: BucketParams,
    /// The shard of a sharded rule the key holds.
    pub shard: Option<u8>,
}

/// What a descriptor or bucket id keeps: the rule as `explain` shows it, and its keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    /// The explanation of the descriptor (for a bucket id: of the descriptor it is placed as).
    pub report: Report,
    pub rule: RuleView,
    /// The rule's keys for these entries: every shard of a sharded rule, shard 0 first; every
    /// limit of a `rate_limits` list, in config order (each key ends in `~w<window secs>`); for a
    /// bucket id, the one key its RLQS pool charges (a sharded rule's unsharded key, a
    /// `rate_limits` rule's first limit).
    pub keys: Vec<StoredKey>,
}

/// Why a descriptor or bucket id keeps no bucket.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotStored {
    #[error("{0}")]
    UnknownDomain(String),
    /// No rule applies (the reason says why).
    #[error("{0}")]
    NoRule(String),
    /// The rule keeps no bucket (`unlimited: true`, a blocking `requests_per_unit: 0`).
    #[error("{0}")]
    NoBucket(String),
    #[error(transparent)]
    RepeatedKey(#[from] RepeatedKey),
}

/// The keys a request with descriptor `entries` of `domain` charges under `config`.
pub fn stored_buckets(
    config: &Config,
    domain: &str,
    entries: &[Entry],
    options: &ExplainOptions,
) -> Result<Stored, NotStored> {
    let report = explain(config, domain, entries, options);
    let (found, rule_view) = matched(config, &report)?;
    let rule = found
        .explain(entries)
        .outcome
        .map_err(|_| NotStored::NoRule("no rule applies".to_owned()))?;
    let mut keys = Vec::new();
    for limit in rule.limits() {
        keys.extend(keys_of(limit, domain, entries, options, true)?);
    }
    Ok(Stored {
        report,
        rule: rule_view,
        keys,
    })
}

/// The key the RLQS pool of bucket id `bucket` of `domain` charges under `config`.
pub fn stored_pool(
    config: &Config,
    domain: &str,
    bucket: &[Entry],
    options: &ExplainOptions,
) -> Result<Stored, NotStored> {
    let report = explain_bucket(config, domain, bucket, options)?.placed;
    let (found, rule_view) = matched(config, &report)?;
    let mut sorted = bucket.to_vec();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    let (descriptor, rule) = found
        .place(&sorted)
        .map_err(|_| NotStored::NoRule("no rule applies".to_owned()))?;
    let keys = keys_of(&rule, domain, &descriptor, options, false)?;
    Ok(Stored {
        report,
        rule: rule_view,
        keys,
    })
}

/// The domain and the rule view of a report that reached a rule.
fn matched<'c>(config: &'c Config, report: &Report) -> Result<(&'c Domain, RuleView), NotStored> {
    let reason = || report.reason.clone().unwrap_or_default();
    let Some(found) = config.domain(&report.domain) else {
        return Err(NotStored::UnknownDomain(reason()));
    };
    match &report.rule {
        Some(rule) if report.matched => Ok((found, rule.clone())),
        _ => Err(NotStored::NoRule(reason())),
    }
}

/// An in-flight cap's shape: its longest hold rides as `unit_ms`, as the request path sends it.
fn held_for(rule: &Rule, mut params: BucketParams) -> BucketParams {
    if let Some(cap) = &rule.in_flight {
        params.unit_ms = cap.max_hold_ms;
    }
    params
}

/// The keys of `rule` for `entries`; `sharded`: every shard of a sharded rule (an RLS
/// descriptor's buckets), else its unsharded key (an RLQS pool's).
fn keys_of(
    rule: &Arc<Rule>,
    domain: &str,
    entries: &[Entry],
    options: &ExplainOptions,
    sharded: bool,
) -> Result<Vec<StoredKey>, NotStored> {
    let rate: RateLimit = match rule.limit {
        Limit::Bucket(rate) => rate,
        Limit::Unlimited => {
            return Err(NotStored::NoBucket(
                "the rule is `unlimited: true`; no bucket is kept".to_owned(),
            ));
        }
        Limit::Blocked { .. } => {
            return Err(NotStored::NoBucket(
                "the rule blocks every request (`requests_per_unit: 0`); no bucket is kept"
                    .to_owned(),
            ));
        }
    };
    let key = |tag| storage_key(rule, domain, entries, options, tag);
    let stored = |tag, params, shard| StoredKey {
        key: key(tag),
        algorithm: rule.algorithm,
        params,
        shard,
    };
    Ok(match rule.shards.filter(|_| sharded) {
        None => vec![stored(
            RuleTag::configured(rule),
            held_for(rule, rate.bucket()),
            None,
        )],
        Some(n) => {
            let params = rate.split(n).bucket();
            (0..n)
                .map(|i| stored(RuleTag::Shard(i as u8), params, Some(i as u8)))
                .collect()
        }
    })
}
