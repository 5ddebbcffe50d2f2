//! Explaining an RLQS bucket id: the descriptor its unordered entries are read as
//! ([`crate::config::Domain::place`]), then the same report as for that descriptor, plus the
//! assignment such a bucket gets.

use serde::Serialize;

use super::{EntryView, ExplainOptions, Report, explain, storage_key};
use crate::config::Config;
use crate::descriptor::Unplaced;
use crate::key::RuleTag;
use crate::request::Entry;
use crate::rule::{Limit, Rule};

/// What the RLQS side does with one bucket id.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketReport {
    /// The bucket id's entries, sorted by key (its order does not matter).
    pub bucket_id: Vec<EntryView>,
    /// The assignment its data planes get, in words.
    pub assignment: String,
    /// The storage key of the pool its data planes share (the key an RLS descriptor of the placed
    /// entries charges; a sharded rule's RLQS pool is its unsharded key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_key: Option<String>,
    /// The walk and rule of the descriptor the bucket id is read as.
    pub placed: Report,
}

/// A bucket id argument that repeats a key (a `BucketId` is a map).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("key `{0}` appears twice; a bucket id is a map")]
pub struct RepeatedKey(pub String);

/// Explains how the RLQS side treats a bucket id of `domain`.
pub fn explain_bucket(
    config: &Config,
    domain: &str,
    bucket: &[Entry],
    options: &ExplainOptions,
) -> Result<BucketReport, RepeatedKey> {
    let mut sorted = bucket.to_vec();
    sorted.sort_by(|a, b| a.key.cmp(&b.key));
    if let Some(w) = sorted.windows(2).find(|w| w[0].key == w[1].key) {
        return Err(RepeatedKey(w[0].key.clone()));
    }
    let bucket_id = sorted
        .iter()
        .map(|e| EntryView {
            key: e.key.clone(),
            value: e.value.to_string(),
        })
        .collect();
    let Some(found) = config.domain(domain) else {
        return Ok(BucketReport {
            bucket_id,
            assignment: "ALLOW_ALL, standing: the domain has no rules".to_owned(),
            pool_key: None,
            placed: explain(config, domain, &sorted, options),
        });
    };
    let (descriptor, rule) = match found.place(&sorted) {
        Ok(placed) => placed,
        Err(Unplaced::NoPath { placed, left }) => {
            return Ok(unplaced(config, domain, options, bucket_id, &placed, &left));
        }
    };
    let (assignment, pool_key) = assignment(&rule, domain, &descriptor, options);
    Ok(BucketReport {
        bucket_id,
        assignment,
        pool_key,
        placed: explain(config, domain, &descriptor, options),
    })
}

/// The report of a bucket id no order of whose entries reaches a rule: `placed` fit, `left` did
/// not.
fn unplaced(
    config: &Config,
    domain: &str,
    options: &ExplainOptions,
    bucket_id: Vec<EntryView>,
    placed: &[Entry],
    left: &[String],
) -> BucketReport {
    let mut report = explain(config, domain, placed, options);
    report.matched = false;
    report.rule = None;
    report.reason = Some(format!(
        "no order of the bucket id's entries reaches a rule: {} fit no level after {}",
        left.join(", "),
        if placed.is_empty() {
            "the top".to_owned()
        } else {
            placed
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));
    report.outcome = "not limited".to_owned();
    BucketReport {
        bucket_id,
        assignment: "ALLOW_ALL, standing: no rule applies".to_owned(),
        pool_key: None,
        placed: report,
    }
}

/// What RLQS assigns a bucket placed on `rule` as `descriptor`, and its pool's storage key.
fn assignment(
    rule: &Rule,
    domain: &str,
    descriptor: &[Entry],
    options: &ExplainOptions,
) -> (String, Option<String>) {
    match rule.limit {
        Limit::Unlimited => (
            "ALLOW_ALL, standing: the rule is `unlimited: true`".to_owned(),
            None,
        ),
        Limit::Blocked { .. } => (
            "DENY_ALL, standing: `requests_per_unit: 0` blocks the bucket".to_owned(),
            None,
        ),
        Limit::Bucket(_) if rule.shadow_mode => (
            "ALLOW_ALL, standing: the rule is in shadow mode".to_owned(),
            None,
        ),
        Limit::Bucket(rate) => {
            let key = storage_key(rule, domain, descriptor, options, RuleTag::configured(rule));
            let text = format!(
                "a prepaid token bucket: this bucket's data planes share {} per {} by their \
                 reported demand, each assignment paid from the pool key one push ahead and \
                 expiring after --rlqs-assignment-ttl (a data plane whose share is below one \
                 token a day gets DENY_ALL until it earns one); on a backend failure `{}` assigns",
                rate.requests_per_unit,
                rate.window(),
                rule.failure_mode
                    .unwrap_or(options.default_failure_mode)
                    .as_str(),
            );
            (text, Some(key))
        }
    }
}

impl BucketReport {
    /// The bucket id, how it was placed, then the descriptor's report.
    pub fn to_text(&self) -> String {
        let entries: Vec<String> = self
            .bucket_id
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        let mut out = format!("bucket id:   {{{}}}\n", entries.join(", "));
        out.push_str(&self.placed.to_text());
        out.push_str(&format!("assignment:  {}\n", self.assignment));
        if let Some(key) = &self.pool_key {
            out.push_str(&format!("pool key:    {key}\n"));
        }
        out
    }
}
