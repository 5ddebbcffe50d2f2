//! Explaining a decision: which rule a descriptor reaches (or why none), the bucket it would use
//! and that bucket's storage key. Pure: `sluice explain` renders it as text or JSON against a
//! config on disk, `GET /explain` as JSON against the live config.
//!
//! The walk itself is [`crate::descriptor::Level::explain`], the same walk the request path
//! makes, so the explanation cannot drift from the decision.

use std::fmt::Write as _;

use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::algorithm::Algorithm;
use crate::config::Config;
use crate::descriptor::{Miss, Selected};
use crate::key::{RuleTag, write_shared_bucket_key};
use crate::request::Entry;
use crate::rule::{FailureMode, Limit, Unit};

/// Settings that shape a decision but are not in the descriptor config.
#[derive(Clone, Debug)]
pub struct ExplainOptions {
    pub key_prefix: String,
    /// `--failure-mode`: used by rules and domains that set none.
    pub default_failure_mode: FailureMode,
}

/// A `k=v,k2=v2` argument that cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorArgError {
    #[error("the descriptor is empty: expected key=value[,key=value...]")]
    Empty,
    #[error("entry {index} (`{text}`) is not key=value")]
    NotAPair { index: usize, text: String },
    #[error("entry {index} has an empty key")]
    EmptyKey { index: usize },
    #[error("entry {index}: percent-encoding does not decode to UTF-8")]
    NotUtf8 { index: usize },
}

/// Reads `key=value,key2=value2`. `,` separates entries and the first `=` of an entry separates
/// key from value; a key or value holding `,`, `=` or `%` writes them percent-encoded (`%2C`,
/// `%3D`, `%25`). Entries are numbered from 1 in errors.
pub fn parse_descriptor(text: &str) -> Result<Vec<Entry>, DescriptorArgError> {
    if text.is_empty() {
        return Err(DescriptorArgError::Empty);
    }
    text.split(',')
        .enumerate()
        .map(|(i, pair)| {
            let index = i + 1;
            let (key, value) = pair.split_once('=').ok_or(DescriptorArgError::NotAPair {
                index,
                text: pair.to_owned(),
            })?;
            let decode = |s: &str| {
                percent_decode_str(s)
                    .decode_utf8()
                    .map(|c| c.into_owned())
                    .map_err(|_| DescriptorArgError::NotUtf8 { index })
            };
            let key = decode(key)?;
            if key.is_empty() {
                return Err(DescriptorArgError::EmptyKey { index });
            }
            Ok(Entry::new(key, decode(value)?))
        })
        .collect()
}

/// Everything `explain` says about one descriptor.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub domain: String,
    pub descriptor: Vec<EntryView>,
    /// False when the domain is not configured at all.
    pub domain_known: bool,
    /// How each entry was matched, in order, as far as the walk got.
    pub steps: Vec<StepView>,
    pub matched: bool,
    /// Why no rule applies, when none does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleView>,
    /// What such a request is answered, in words.
    pub outcome: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EntryView {
    pub key: String,
    pub value: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepView {
    /// 1-based position of the entry in the descriptor.
    pub entry: usize,
    pub key: String,
    pub value: String,
    /// `exact`, `wildcard`, or `any value` (a descriptor with the key and no value).
    pub matched_by: &'static str,
    /// The configured value that matched (`abc`, `ab*`), absent for `any value`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub configured_value: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleView {
    /// Dotted config path, as metrics label it.
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `file:line` of the descriptor.
    pub source: String,
    pub unlimited: bool,
    /// How hits are counted; absent for `unlimited: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Algorithm>,
    /// `rule` (its `rate_limit.algorithm`), `domain` or `default` (`--default-algorithm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm_from: Option<&'static str>,
    /// The limit's shape; absent for `unlimited: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket: Option<BucketView>,
    pub shadow: bool,
    pub failure_mode: FailureMode,
    /// `config` (the rule or its domain) or `default` (`--failure-mode`).
    pub failure_mode_from: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
    /// The storage key of this descriptor's bucket; absent for `unlimited: true` and for a
    /// sharded rule, whose keys are in `shard_keys`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A sharded rule's keys, shard 0 first: one per shard, each in its own Cluster slot.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shard_keys: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketView {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// Most hits allowed at once: the token bucket's capacity and GCRA's burst (`burst`, else
    /// `requests_per_unit`); a window's `requests_per_unit`.
    pub capacity: u64,
    /// The token bucket's refill and GCRA's rate (hits per second); for a window, its average.
    pub refill_per_second: f64,
    /// Tokens one hit takes (before `hits_addend`).
    pub cost: u64,
    /// `lease`: tokens a replica takes per backend call and spends locally.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
    /// `shards`: the bucket is split into this many sub-buckets, each of the `shard` shape.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<ShardView>,
}

/// One shard of a sharded rule (`shards: N`): the limit divided by N.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardView {
    /// N.
    pub count: u32,
    pub requests_per_unit: u32,
    pub capacity: u64,
    pub refill_per_second: f64,
}

/// Explains how `config` treats one descriptor of `domain`.
pub fn explain(
    config: &Config,
    domain: &str,
    entries: &[Entry],
    options: &ExplainOptions,
) -> Report {
    let descriptor = entries
        .iter()
        .map(|e| EntryView {
            key: e.key.clone(),
            value: e.value.clone(),
        })
        .collect();
    let Some(found) = config.domain(domain) else {
        let mut known: Vec<&str> = config.domains().map(|d| &*d.name).collect();
        known.sort_unstable();
        let known = if known.is_empty() {
            "none".to_owned()
        } else {
            known.join(", ")
        };
        return Report {
            domain: domain.to_owned(),
            descriptor,
            domain_known: false,
            steps: Vec::new(),
            matched: false,
            reason: Some(format!(
                "domain `{domain}` is not configured (configured domains: {known})"
            )),
            rule: None,
            outcome: "OK: an unknown domain is never limited".to_owned(),
        };
    };

    let walk = found.explain(entries);
    let steps = walk
        .steps
        .iter()
        .map(|step| {
            let entry = &entries[step.index];
            let (matched_by, configured_value) = match &step.selected {
                Selected::Exact => ("exact", Some(entry.value.clone())),
                Selected::Wildcard(pattern) => ("wildcard", Some(pattern.clone())),
                Selected::AnyValue => ("any value", None),
            };
            StepView {
                entry: step.index + 1,
                key: entry.key.clone(),
                value: entry.value.clone(),
                matched_by,
                configured_value,
            }
        })
        .collect();
    let rule = match &walk.outcome {
        Err(miss) => {
            return Report {
                domain: domain.to_owned(),
                descriptor,
                domain_known: true,
                steps,
                matched: false,
                reason: Some(miss_reason(miss, entries)),
                rule: None,
                outcome: "OK: no rule applies, so the descriptor is not limited".to_owned(),
            };
        }
        Ok(rule) => rule,
    };

    let failure_mode_from = if rule.failure_mode.is_some() {
        "config"
    } else {
        "default"
    };
    let failure_mode = rule.failure_mode.unwrap_or(options.default_failure_mode);
    let (bucket, (key, shard_keys), outcome) = match rule.limit {
        Limit::Unlimited => (
            None,
            (None, Vec::new()),
            "OK: the rule is `unlimited: true`; no bucket is kept".to_owned(),
        ),
        Limit::Bucket(rate) => {
            let params = rate.bucket();
            let bucket = BucketView {
                requests_per_unit: rate.requests_per_unit,
                unit: rate.unit,
                capacity: params.capacity,
                refill_per_second: params.tokens_over(1_000.0),
                cost: rule.cost,
                lease: rule.lease,
                shards: rule.shards.map(|n| {
                    let shard = rate.split(n);
                    let p = shard.bucket();
                    ShardView {
                        count: n,
                        requests_per_unit: shard.requests_per_unit,
                        capacity: p.capacity,
                        refill_per_second: p.tokens_over(1_000.0),
                    }
                }),
            };
            let key = |tag| {
                let mut key = String::new();
                write_shared_bucket_key(
                    &mut key,
                    &options.key_prefix,
                    domain,
                    entries,
                    &rule.shared_values,
                    tag,
                    rule.algorithm,
                );
                key
            };
            let mut outcome = if rule.shadow_mode {
                "OK always: the rule is in shadow mode; hits are counted but never reject"
                    .to_owned()
            } else {
                outcome(rule.algorithm, &bucket)
            };
            let keys = match rule.shards {
                None => (Some(key(RuleTag::Configured)), Vec::new()),
                Some(n) => {
                    let _ = write!(
                        outcome,
                        "; judged by one of {n} shards (the limit / {n} each), chosen per request"
                    );
                    (
                        None,
                        (0..n)
                            .map(|i| key(RuleTag::Shard(i as u8)))
                            .collect::<Vec<_>>(),
                    )
                }
            };
            (Some(bucket), keys, outcome)
        }
    };
    Report {
        domain: domain.to_owned(),
        descriptor,
        domain_known: true,
        steps,
        matched: true,
        reason: None,
        rule: Some(RuleView {
            path: rule.path.to_string(),
            name: rule.name.as_deref().map(str::to_owned),
            source: rule.source.to_string(),
            unlimited: matches!(rule.limit, Limit::Unlimited),
            algorithm: bucket.as_ref().map(|_| rule.algorithm),
            algorithm_from: bucket.as_ref().map(|_| rule.algorithm_from.as_str()),
            bucket,
            shadow: rule.shadow_mode,
            failure_mode,
            failure_mode_from,
            replaces: rule.replaces.iter().map(|r| r.to_string()).collect(),
            key,
            shard_keys,
        }),
        outcome,
    }
}

/// When a hit passes, in words, by algorithm.
fn outcome(algorithm: Algorithm, b: &BucketView) -> String {
    match algorithm {
        Algorithm::TokenBucket => {
            "OK while the bucket holds the hit's tokens, OVER_LIMIT otherwise".to_owned()
        }
        Algorithm::FixedWindow => format!(
            "OK while this {}'s count plus the hit stays within {}, OVER_LIMIT otherwise; the count starts again at the next {} on the clock",
            b.unit, b.requests_per_unit, b.unit
        ),
        Algorithm::SlidingWindow => format!(
            "OK while this {}'s count plus the previous {}'s, weighted by its overlap with the last {}, plus the hit stays within {}, OVER_LIMIT otherwise",
            b.unit, b.unit, b.unit, b.requests_per_unit
        ),
        Algorithm::Gcra => format!(
            "OK while the hit keeps to the schedule (one every {} ms, up to {} at once), OVER_LIMIT otherwise",
            trim_float(1_000.0 / b.refill_per_second),
            b.capacity
        ),
    }
}

fn miss_reason(miss: &Miss, entries: &[Entry]) -> String {
    let entry = |i: usize| format!("entry {} `{}={}`", i + 1, entries[i].key, entries[i].value);
    let under = |i: usize| {
        if i == 0 {
            "at the top level".to_owned()
        } else {
            format!("under entry {}", i)
        }
    };
    let keys = |keys: &[String]| {
        if keys.is_empty() {
            "none".to_owned()
        } else {
            keys.join(", ")
        }
    };
    match miss {
        Miss::NoEntries => "the descriptor has no entries".to_owned(),
        Miss::NoMatch { index, keys: known } => format!(
            "{} matches no descriptor {} (keys configured there: {})",
            entry(*index),
            under(*index),
            keys(known)
        ),
        Miss::RequestDeeper { index } => {
            let more = entries.len() - index - 1;
            format!(
                "depth mismatch: {} reached a descriptor with no nested descriptors, but {more} more {} follow{}",
                entry(*index),
                if more == 1 { "entry" } else { "entries" },
                if more == 1 { "s" } else { "" }
            )
        }
        Miss::NoRule {
            index,
            keys: nested,
        } => format!(
            "depth mismatch: {} reached a descriptor without a rate_limit of its own; a longer descriptor continues with: {}",
            entry(*index),
            keys(nested)
        ),
    }
}

impl Report {
    /// Aligned `label: value` lines for a terminal.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let descriptor: Vec<String> = self
            .descriptor
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        // Writing to a String cannot fail.
        let _ = writeln!(out, "domain:      {}", self.domain);
        let _ = writeln!(out, "descriptor:  {}", descriptor.join(", "));
        for step in &self.steps {
            let how = match &step.configured_value {
                Some(v) => format!("{} `{}={v}`", step.matched_by, step.key),
                None => format!("{} `{}`", step.matched_by, step.key),
            };
            let _ = writeln!(
                out,
                "  entry {}:   {}={} matched {how}",
                step.entry, step.key, step.value
            );
        }
        if let Some(reason) = &self.reason {
            let _ = writeln!(out, "no rule:     {reason}");
        }
        if let Some(rule) = &self.rule {
            let name = rule
                .name
                .as_deref()
                .map(|n| format!(" (name `{n}`)"))
                .unwrap_or_default();
            let _ = writeln!(out, "rule:        {}{name}", rule.path);
            let _ = writeln!(out, "source:      {}", rule.source);
            match &rule.bucket {
                None => {
                    let _ = writeln!(out, "limit:       unlimited");
                }
                Some(b) => {
                    let _ = writeln!(out, "limit:       {} per {}", b.requests_per_unit, b.unit);
                    if let (Some(algorithm), Some(from)) = (rule.algorithm, rule.algorithm_from) {
                        let _ = writeln!(out, "algorithm:   {algorithm} (from {from})");
                        let _ = writeln!(out, "{}", shape_line(algorithm, b));
                    }
                    if let Some(lease) = b.lease {
                        let _ = writeln!(
                            out,
                            "lease:       up to {lease} tokens per backend call, spent by this replica within --lease-lifetime"
                        );
                    }
                    if let Some(s) = &b.shards {
                        let _ = writeln!(
                            out,
                            "shards:      {} of {} per {} each (capacity {}), one slot each; a request is judged by one",
                            s.count, s.requests_per_unit, b.unit, s.capacity
                        );
                    }
                }
            }
            let _ = writeln!(
                out,
                "shadow:      {}",
                if rule.shadow { "yes" } else { "no" }
            );
            let _ = writeln!(
                out,
                "on failure:  {} (from {})",
                rule.failure_mode.as_str(),
                rule.failure_mode_from
            );
            if !rule.replaces.is_empty() {
                let _ = writeln!(out, "replaces:    {}", rule.replaces.join(", "));
            }
            if let Some(key) = &rule.key {
                let _ = writeln!(out, "key:         {key}");
            }
            for (i, key) in rule.shard_keys.iter().enumerate() {
                let label = if i == 0 { "keys:" } else { "" };
                let _ = writeln!(out, "{label:<13}{key}");
            }
        }
        let _ = writeln!(out, "outcome:     {}", self.outcome);
        out
    }
}

/// The limit's shape as the algorithm sees it, as one aligned line.
fn shape_line(algorithm: Algorithm, b: &BucketView) -> String {
    match algorithm {
        Algorithm::TokenBucket => format!(
            "bucket:      capacity {} tokens, refill {} tokens/s, cost {} per hit",
            b.capacity,
            trim_float(b.refill_per_second),
            b.cost
        ),
        Algorithm::FixedWindow => format!(
            "window:      {} hits per {} aligned to the clock, cost {} per hit",
            b.requests_per_unit, b.unit, b.cost
        ),
        Algorithm::SlidingWindow => format!(
            "window:      {} hits per sliding {} (this {} + the previous one, weighted), cost {} per hit",
            b.requests_per_unit, b.unit, b.unit, b.cost
        ),
        Algorithm::Gcra => format!(
            "schedule:    one hit every {} ms, burst {}, cost {} per hit",
            trim_float(1_000.0 / b.refill_per_second),
            b.capacity,
            b.cost
        ),
    }
}

/// `5`, `0.5`, `0.0011574` — no trailing zeros, at most 7 decimals.
fn trim_float(x: f64) -> String {
    let s = format!("{x:.7}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load_sources;

    fn options() -> ExplainOptions {
        ExplainOptions {
            key_prefix: "sluice:".into(),
            default_failure_mode: FailureMode::Error,
        }
    }

    fn config() -> Config {
        let text = r#"domain: api
failure_mode: open
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 400}
    descriptors:
      - key: route
        value: export
        cost: 10
        failure_mode: local
        rate_limit: {unit: second, requests_per_unit: 5, burst: 50, name: export}
      - key: route
        value: "adm*"
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: health
    rate_limit: {unlimited: true}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 2}
"#;
        load_sources(&[("api.yaml".into(), text.into())]).unwrap()
    }

    fn run(domain: &str, descriptor: &str) -> Report {
        explain(
            &config(),
            domain,
            &parse_descriptor(descriptor).unwrap(),
            &options(),
        )
    }

    #[test]
    fn descriptors_parse_with_percent_encoding() {
        assert_eq!(
            parse_descriptor("a=1,b=x=y,c=%2C%3D%25,d=").unwrap(),
            [
                Entry::new("a", "1"),
                Entry::new("b", "x=y"),
                Entry::new("c", ",=%"),
                Entry::new("d", "")
            ]
        );
        assert_eq!(parse_descriptor(""), Err(DescriptorArgError::Empty));
        assert_eq!(
            parse_descriptor("a=1,b"),
            Err(DescriptorArgError::NotAPair {
                index: 2,
                text: "b".into()
            })
        );
        assert_eq!(
            parse_descriptor("=1"),
            Err(DescriptorArgError::EmptyKey { index: 1 })
        );
        assert_eq!(
            parse_descriptor("a=%FF"),
            Err(DescriptorArgError::NotUtf8 { index: 1 })
        );
    }

    #[test]
    fn a_match_reports_bucket_failure_mode_and_key() {
        let report = run("api", "tenant=acme,route=export");
        assert!(report.matched && report.domain_known);
        let rule = report.rule.as_ref().unwrap();
        assert_eq!(rule.path, "api.tenant.route_export");
        assert_eq!(rule.source, "api.yaml:7");
        assert_eq!(rule.name.as_deref(), Some("export"));
        let bucket = rule.bucket.as_ref().unwrap();
        assert_eq!(
            (bucket.capacity, bucket.cost, bucket.refill_per_second),
            (50, 10, 5.0)
        );
        assert_eq!(
            (rule.failure_mode, rule.failure_mode_from),
            (FailureMode::Local, "config")
        );
        assert_eq!(
            rule.key.as_deref(),
            Some("sluice:{api|tenant=acme}|route=export")
        );
        assert_eq!(report.steps[0].matched_by, "any value");
        assert_eq!(report.steps[1].matched_by, "exact");
        let text = report.to_text();
        for line in [
            "rule:        api.tenant.route_export (name `export`)",
            "source:      api.yaml:7",
            "algorithm:   token_bucket (from default)",
            "bucket:      capacity 50 tokens, refill 5 tokens/s, cost 10 per hit",
            "on failure:  local (from config)",
            "key:         sluice:{api|tenant=acme}|route=export",
        ] {
            assert!(text.contains(line), "{line}\nin\n{text}");
        }
    }

    #[test]
    fn wildcards_shadow_and_the_domain_failure_mode_are_reported() {
        let report = run("api", "tenant=t,route=admin");
        let rule = report.rule.as_ref().unwrap();
        assert!(rule.shadow);
        assert_eq!(report.steps[1].configured_value.as_deref(), Some("adm*"));
        assert_eq!(rule.failure_mode, FailureMode::Open);
        assert!(report.outcome.contains("shadow"));
        let slow = rule.bucket.as_ref().unwrap().refill_per_second;
        assert!((slow - 1.0 / 3600.0).abs() < 1e-12);
        assert!(report.to_text().contains("refill 0.0002778 tokens/s"));
    }

    #[test]
    fn unlimited_rules_have_no_bucket_or_key() {
        let report = run("api", "health=x");
        let rule = report.rule.as_ref().unwrap();
        assert!(rule.unlimited && rule.bucket.is_none() && rule.key.is_none());
        assert!(rule.algorithm.is_none());
        assert!(!report.to_text().contains("algorithm:"));
        assert!(report.to_text().contains("limit:       unlimited"));
    }

    #[test]
    fn misses_say_why() {
        let reason = |d: &str, desc: &str| run(d, desc).reason.unwrap();
        assert_eq!(
            reason("web", "a=1"),
            "domain `web` is not configured (configured domains: api)"
        );
        assert!(!run("web", "a=1").domain_known);
        assert_eq!(
            reason("api", "nope=1"),
            "entry 1 `nope=1` matches no descriptor at the top level (keys configured there: health, plain, tenant)"
        );
        assert_eq!(
            reason("api", "tenant=a,verb=get"),
            "entry 2 `verb=get` matches no descriptor under entry 1 (keys configured there: route)"
        );
        assert_eq!(
            reason("api", "plain=a,route=export"),
            "depth mismatch: entry 1 `plain=a` reached a descriptor with no nested descriptors, but 1 more entry follows"
        );
        let partial = run("api", "tenant=a,route=other");
        assert_eq!(partial.steps.len(), 1);
        assert!(
            partial
                .reason
                .as_deref()
                .unwrap()
                .starts_with("entry 2 `route=other` matches no descriptor under entry 1")
        );
        let json = serde_json::to_value(&partial).unwrap();
        assert_eq!(json["matched"], false);
        assert!(json.get("rule").is_none());
    }

    #[test]
    fn each_algorithm_is_named_with_its_origin_shape_and_key() {
        let text = r#"domain: w
algorithm: fixed_window
descriptors:
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: sliding
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window}
  - key: gcra
    cost: 2
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: gcra, burst: 8}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 4, algorithm: token_bucket}
"#;
        let config = load_sources(&[("w.yaml".into(), text.into())]).unwrap();
        let report = |key: &str| explain(&config, "w", &[Entry::new(key, "x")], &options());
        let cases = [
            (
                "fixed",
                Algorithm::FixedWindow,
                "domain",
                "window:      60 hits per minute aligned to the clock, cost 1 per hit",
                "sluice:{w|fixed=x}~fw",
                "the count starts again at the next minute on the clock",
            ),
            (
                "sliding",
                Algorithm::SlidingWindow,
                "rule",
                "window:      100 hits per sliding hour (this hour + the previous one, weighted), cost 1 per hit",
                "sluice:{w|sliding=x}~sw",
                "plus the previous hour's, weighted by its overlap",
            ),
            (
                "gcra",
                Algorithm::Gcra,
                "rule",
                "schedule:    one hit every 250 ms, burst 8, cost 2 per hit",
                "sluice:{w|gcra=x}~gcra",
                "one every 250 ms, up to 8 at once",
            ),
            (
                "bucket",
                Algorithm::TokenBucket,
                "rule",
                "bucket:      capacity 4 tokens, refill 4 tokens/s, cost 1 per hit",
                "sluice:{w|bucket=x}",
                "while the bucket holds the hit's tokens",
            ),
        ];
        for (key, algorithm, from, shape, storage, outcome) in cases {
            let r = report(key);
            let rule = r.rule.as_ref().unwrap();
            assert_eq!(rule.algorithm, Some(algorithm), "{key}");
            assert_eq!(rule.algorithm_from, Some(from), "{key}");
            assert_eq!(rule.key.as_deref(), Some(storage), "{key}");
            assert!(r.outcome.contains(outcome), "{key}: {}", r.outcome);
            let text = r.to_text();
            let named = format!("algorithm:   {algorithm} (from {from})");
            for line in [named.as_str(), shape] {
                assert!(text.contains(line), "{line}\nin\n{text}");
            }
            let json = serde_json::to_value(&r).unwrap();
            assert_eq!(json["rule"]["algorithm"], algorithm.as_str());
        }
    }

    #[test]
    fn a_sharded_rule_shows_its_shards_and_every_shard_key() {
        let text = "domain: hot\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100, shards: 4, lease: 5}\n";
        let config = load_sources(&[("hot.yaml".into(), text.into())]).unwrap();
        let report = explain(&config, "hot", &[Entry::new("tenant", "acme")], &options());
        let rule = report.rule.as_ref().unwrap();
        assert_eq!(rule.key, None);
        assert_eq!(
            rule.shard_keys,
            (0..4)
                .map(|i| format!("sluice:{{hot|tenant=acme~s{i}}}"))
                .collect::<Vec<_>>()
        );
        let bucket = rule.bucket.as_ref().unwrap();
        assert_eq!(bucket.capacity, 100, "the rule's full limit");
        assert_eq!(
            bucket.shards,
            Some(ShardView {
                count: 4,
                requests_per_unit: 25,
                capacity: 25,
                refill_per_second: 25.0 / 60.0,
            })
        );
        assert!(
            report
                .outcome
                .ends_with("; judged by one of 4 shards (the limit / 4 each), chosen per request"),
            "{}",
            report.outcome
        );
        let text = report.to_text();
        for line in [
            "limit:       100 per minute",
            "lease:       up to 5 tokens per backend call",
            "shards:      4 of 25 per minute each (capacity 25), one slot each; a request is judged by one",
            "keys:        sluice:{hot|tenant=acme~s0}\n             sluice:{hot|tenant=acme~s1}\n",
            "             sluice:{hot|tenant=acme~s3}\n",
        ] {
            assert!(text.contains(line), "{line}\nin\n{text}");
        }
        assert!(!text.contains("key:  "), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["rule"]["bucket"]["shards"]["count"], 4);
        assert_eq!(json["rule"]["shard_keys"].as_array().unwrap().len(), 4);
        assert!(json["rule"].get("key").is_none());
        // Unsharded rules have neither.
        let plain = serde_json::to_value(run("api", "plain=x")).unwrap();
        assert!(plain["rule"].get("shard_keys").is_none());
        assert!(plain["rule"]["bucket"].get("shards").is_none());
    }

    #[test]
    fn a_descriptor_stopping_at_a_tree_node_is_a_depth_mismatch() {
        let text = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 1}\n";
        let config = load_sources(&[("d.yaml".into(), text.into())]).unwrap();
        let report = explain(&config, "d", &[Entry::new("a", "1")], &options());
        assert_eq!(
            report.reason.as_deref(),
            Some(
                "depth mismatch: entry 1 `a=1` reached a descriptor without a rate_limit of its own; a longer descriptor continues with: b"
            )
        );
    }
}
