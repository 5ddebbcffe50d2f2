//! Explaining a decision: which rule a descriptor reaches (or why none), the bucket it would use
//! and that bucket's storage key. Pure: `sluice explain` renders it as text or JSON against a
//! config on disk, `GET /explain` as JSON against the live config.
//!
//! The walk itself is [`crate::descriptor::Level::explain`], the same walk the request path
//! makes, so the explanation cannot drift from the decision. [`explain_bucket`] does the same
//! for an RLQS bucket id, through the placement the RLQS side uses.

mod bucket;
mod stored;

use std::fmt::Write as _;

use percent_encoding::percent_decode_str;
use serde::Serialize;

use crate::algorithm::Algorithm;
use crate::config::Config;
use crate::descriptor::{Miss, Selected, Step};
use crate::key::{RuleTag, write_shared_bucket_key};
use crate::request::Entry;
use crate::rule::{Charge, FailureMode, InFlightRule, Limit, RateLimit, Rule, Unit, Window};

pub use bucket::{BucketReport, RepeatedKey, explain_bucket};
pub use stored::{NotStored, Stored, StoredKey, stored_buckets, stored_pool};

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
    /// A key is UTF-8 (Envoy's descriptor keys come from its config); a value may be any bytes.
    #[error("entry {index}: the key's percent-encoding does not decode to UTF-8")]
    NotUtf8 { index: usize },
}

/// Reads `key=value,key2=value2`. `,` separates entries and the first `=` of an entry separates
/// key from value; a key or value holding `,`, `=` or `%` writes them percent-encoded (`%2C`,
/// `%3D`, `%25`). A value is bytes, so `%FF` explains a header value holding byte 0xFF. Entries
/// are numbered from 1 in errors.
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
            let key = percent_decode_str(key)
                .decode_utf8()
                .map_err(|_| DescriptorArgError::NotUtf8 { index })?;
            if key.is_empty() {
                return Err(DescriptorArgError::EmptyKey { index });
            }
            let value: Vec<u8> = percent_decode_str(value).collect();
            Ok(Entry::new(key, value))
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

/// An entry as shown to operators: a value that is not UTF-8 is written as `Value`'s `Display`
/// writes it (UTF-8 text as is, other bytes as `\xNN`).
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
    /// The unit of a `requests_per_unit: 0` rule, which blocks every request it reaches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<Unit>,
    /// How hits are counted; absent for `unlimited: true` and a blocking rule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<Algorithm>,
    /// `rule` (its `rate_limit.algorithm`), `domain` or `default` (`--default-algorithm`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithm_from: Option<&'static str>,
    /// The limit's shape; absent for `unlimited: true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bucket: Option<BucketView>,
    pub shadow: bool,
    /// `quota_mode: true` or `--quota-mode`: rejects only with every other quota descriptor.
    pub quota: bool,
    pub failure_mode: FailureMode,
    /// `config` (the rule or its domain) or `default` (`--failure-mode`).
    pub failure_mode_from: &'static str,
    /// When hits are counted: `if_allowed`, or `always` (into debt; `charge`).
    pub charge: Charge,
    /// `rule` (the descriptor's `charge`), `domain` or `default` (`--default-charge`).
    pub charge_from: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
    /// The storage key of this descriptor's bucket; absent for `unlimited: true` and for a
    /// sharded rule, whose keys are in `shard_keys`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A sharded rule's keys, shard 0 first: one per shard, each in its own Cluster slot.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shard_keys: Vec<String>,
    /// The descriptor's other limits (`rate_limits` after the first), each checked with this
    /// one: a request passes only if every limit passes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also: Vec<RuleView>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketView {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// Units per window (`requests_per_unit` per `unit_multiplier` × `unit`).
    pub unit_multiplier: u32,
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
    /// `in_flight`: `capacity` slots, the holder entry and the longest hold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlightRule>,
    /// `reserve`: the holder entry and how long a reservation waits for its settlement.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve: Option<InFlightRule>,
}

impl BucketView {
    /// The window in words: `minute`, `30 seconds`.
    pub fn window(&self) -> Window {
        Window {
            unit: self.unit,
            multiplier: self.unit_multiplier,
        }
    }
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
            value: e.value.to_string(),
        })
        .collect();
    let Some(found) = config.domain(domain) else {
        return unknown_domain(config, domain, descriptor);
    };
    let walk = found.explain(entries);
    let steps = walk
        .steps
        .iter()
        .map(|step| step_view(step, entries))
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
    let (rule, outcome) = rule_view(rule, domain, entries, options);
    Report {
        domain: domain.to_owned(),
        descriptor,
        domain_known: true,
        steps,
        matched: true,
        reason: None,
        rule: Some(rule),
        outcome,
    }
}

/// The report for a domain `config` does not have, naming the ones it has.
fn unknown_domain(config: &Config, domain: &str, descriptor: Vec<EntryView>) -> Report {
    let mut known: Vec<&str> = config.domains().map(|d| &*d.name).collect();
    known.sort_unstable();
    let known = if known.is_empty() {
        "none".to_owned()
    } else {
        known.join(", ")
    };
    Report {
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
    }
}

/// One step of the walk down the descriptor tree: which entry, matched how.
fn step_view(step: &Step, entries: &[Entry]) -> StepView {
    let entry = &entries[step.index];
    let (matched_by, configured_value) = match &step.selected {
        Selected::Exact => ("exact", Some(entry.value.to_string())),
        Selected::Wildcard(pattern) => ("wildcard", Some(pattern.clone())),
        Selected::AnyValue => ("any value", None),
    };
    StepView {
        entry: step.index + 1,
        key: entry.key.clone(),
        value: entry.value.to_string(),
        matched_by,
        configured_value,
    }
}

/// The rule the descriptor reaches, and the outcome in words.
fn rule_view(
    rule: &Rule,
    domain: &str,
    entries: &[Entry],
    options: &ExplainOptions,
) -> (RuleView, String) {
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
        Limit::Blocked { .. } => (
            None,
            (None, Vec::new()),
            if rule.shadow_mode {
                "OK always: the rule blocks (`requests_per_unit: 0`) but is in shadow mode; no bucket is kept".to_owned()
            } else if rule.quota_mode {
                "OVER_LIMIT always, in quota mode: `requests_per_unit: 0` blocks this descriptor, which rejects the request only when every quota-mode descriptor of the request is over its limit; no bucket is kept".to_owned()
            } else {
                "OVER_LIMIT always: `requests_per_unit: 0` blocks every request; no bucket is kept and the backend is not asked".to_owned()
            },
        ),
        Limit::Bucket(rate) => {
            let (bucket, keys, outcome) = bucket_of(rule, rate, domain, entries, options);
            (Some(bucket), keys, outcome)
        }
    };
    let view = RuleView {
        path: rule.path.to_string(),
        name: rule.name.as_deref().map(str::to_owned),
        source: rule.source.to_string(),
        unlimited: matches!(rule.limit, Limit::Unlimited),
        blocked: match rule.limit {
            Limit::Blocked { unit } => Some(unit),
            _ => None,
        },
        algorithm: bucket.as_ref().map(|_| rule.algorithm),
        algorithm_from: bucket.as_ref().map(|_| rule.algorithm_from.as_str()),
        bucket,
        shadow: rule.shadow_mode,
        quota: rule.quota_mode,
        failure_mode,
        failure_mode_from,
        charge: rule.charge,
        charge_from: rule.charge_from.as_str(),
        replaces: rule.replaces.iter().map(|r| r.to_string()).collect(),
        key,
        shard_keys,
        also: rule
            .also
            .iter()
            .map(|limit| rule_view(limit, domain, entries, options).0)
            .collect(),
    };
    let outcome = if rule.also.is_empty() {
        outcome
    } else {
        format!(
            "{outcome}; and so for each of the descriptor's {} other limits: the request passes only if every limit passes, and none is charged otherwise",
            rule.also.len()
        )
    };
    (view, outcome)
}

/// The bucket of a limited rule, its storage key (or its shards' keys) and the outcome in words.
fn bucket_of(
    rule: &Rule,
    rate: RateLimit,
    domain: &str,
    entries: &[Entry],
    options: &ExplainOptions,
) -> (BucketView, (Option<String>, Vec<String>), String) {
    let params = rate.bucket();
    let bucket = BucketView {
        requests_per_unit: rate.requests_per_unit,
        unit: rate.unit,
        unit_multiplier: rate.unit_multiplier,
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
        in_flight: rule.in_flight.clone(),
        reserve: rule.reserve.clone(),
    };
    let key = |tag| storage_key(rule, domain, entries, options, tag);
    let mut outcome = if rule.shadow_mode {
        "OK always: the rule is in shadow mode; hits are counted but never reject".to_owned()
    } else {
        outcome(rule.algorithm, &bucket)
    };
    if rule.quota_mode && !rule.shadow_mode {
        outcome.push_str(
            "; in quota mode: OVER_LIMIT here rejects the request only when every quota-mode descriptor of the request is over its limit, and a hit that does not fit is not counted",
        );
        if rule.lease.is_some() {
            outcome.push_str(" (`lease` is ignored: every hit goes to the backend)");
        }
    }
    let keys = match rule.shards {
        None => (Some(key(RuleTag::configured(rule))), Vec::new()),
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
    (bucket, keys, outcome)
}

/// When a hit passes, in words, by algorithm.
/// The storage key `rule` keeps for `entries` in `domain`, as the decision writes it.
fn storage_key(
    rule: &Rule,
    domain: &str,
    entries: &[Entry],
    options: &ExplainOptions,
    tag: RuleTag,
) -> String {
    let mut key = String::new();
    let entries = match rule.holding() {
        Some(holding) => crate::holder::split(holding, entries).0,
        None => entries,
    };
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
}

fn outcome(algorithm: Algorithm, b: &BucketView) -> String {
    match algorithm {
        Algorithm::TokenBucket => {
            "OK while the bucket holds the hit's tokens, OVER_LIMIT otherwise".to_owned()
        }
        Algorithm::FixedWindow => format!(
            "OK while this {w}'s count plus the hit stays within {}, OVER_LIMIT otherwise; the count starts again at the next {w} on the clock",
            b.requests_per_unit,
            w = b.window().noun()
        ),
        Algorithm::SlidingWindow => format!(
            "OK while this {w}'s count plus the previous {w}'s, weighted by its overlap with the last {}, plus the hit stays within {}, OVER_LIMIT otherwise",
            b.window(),
            b.requests_per_unit,
            w = b.window().noun()
        ),
        Algorithm::Gcra => format!(
            "OK while the hit keeps to the schedule (one every {} ms, up to {} at once), OVER_LIMIT otherwise",
            trim_float(1_000.0 / b.refill_per_second),
            b.capacity
        ),
        Algorithm::Reservation => "a reservation ledger decides nothing itself".to_owned(),
        Algorithm::InFlight => format!(
            "OK while fewer than {} holders hold a slot (a holder holding one already is OK, taking no second), OVER_LIMIT otherwise; a release (is_negative_hits) frees only its holder's slot",
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
            write_rule(&mut out, rule);
        }
        let _ = writeln!(out, "outcome:     {}", self.outcome);
        out
    }
}

/// The lines of the rule a descriptor reached, from `rule:` to its other limits.
fn write_rule(out: &mut String, rule: &RuleView) {
    let name = rule
        .name
        .as_deref()
        .map(|n| format!(" (name `{n}`)"))
        .unwrap_or_default();
    let _ = writeln!(out, "rule:        {}{name}", rule.path);
    let _ = writeln!(out, "source:      {}", rule.source);
    write_limit(out, rule);
    let _ = writeln!(
        out,
        "shadow:      {}",
        if rule.shadow { "yes" } else { "no" }
    );
    let _ = writeln!(
        out,
        "quota mode:  {}",
        if rule.quota { "yes" } else { "no" }
    );
    let _ = writeln!(
        out,
        "on failure:  {} (from {})",
        rule.failure_mode.as_str(),
        rule.failure_mode_from
    );
    if rule.charge == Charge::Always {
        let _ = writeln!(
            out,
            "charge:      always (from {}): hits are counted whether they fit or not; a key in debt refuses until refill repays it",
            rule.charge_from
        );
    }
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
    for limit in &rule.also {
        let shape = limit.bucket.as_ref().map_or(String::new(), |b| {
            format!("{} per {}", b.requests_per_unit, b.window())
        });
        let algorithm = limit.algorithm.map_or(String::new(), |a| format!(" ({a})"));
        let key = limit.key.as_deref().unwrap_or("");
        let _ = writeln!(
            out,
            "also:        {}: {shape}{algorithm}, key {key}",
            limit.path
        );
    }
}

/// The `limit:` line and, for a bucket, its algorithm, shape, lease and shards lines.
fn write_limit(out: &mut String, rule: &RuleView) {
    match (&rule.bucket, rule.blocked) {
        (None, Some(unit)) => {
            let _ = writeln!(out, "limit:       0 per {unit} (blocks every request)");
        }
        (None, None) => {
            let _ = writeln!(out, "limit:       unlimited");
        }
        (Some(b), _) => {
            if b.in_flight.is_some() {
                let _ = writeln!(out, "limit:       {} in flight", b.requests_per_unit);
            } else {
                let _ = writeln!(
                    out,
                    "limit:       {} per {}",
                    b.requests_per_unit,
                    b.window()
                );
            }
            if let (Some(algorithm), Some(from)) = (rule.algorithm, rule.algorithm_from) {
                let _ = writeln!(out, "algorithm:   {algorithm} (from {from})");
                let _ = writeln!(out, "{}", shape_line(algorithm, b));
            }
            if let Some(r) = &b.reserve {
                let _ = writeln!(
                    out,
                    "reserve:     a `{}` entry's first call reserves its hits (taken only if they fit), its next call settles them: the unused part comes back, an overrun lands in full; unsettled after {} ms, the reservation keeps what it took",
                    r.holder, r.max_hold_ms
                );
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
                    s.count,
                    s.requests_per_unit,
                    b.window(),
                    s.capacity
                );
            }
        }
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
            b.requests_per_unit,
            b.window(),
            b.cost
        ),
        Algorithm::SlidingWindow => format!(
            "window:      {} hits per sliding {} (this {w} + the previous one, weighted), cost {} per hit",
            b.requests_per_unit,
            b.window(),
            b.cost,
            w = b.window().noun()
        ),
        Algorithm::Gcra => format!(
            "schedule:    one hit every {} ms, burst {}, cost {} per hit",
            trim_float(1_000.0 / b.refill_per_second),
            b.capacity,
            b.cost
        ),
        Algorithm::Reservation => "ledger:      a holder's reservation".to_owned(),
        Algorithm::InFlight => match &b.in_flight {
            Some(cap) => format!(
                "slots:       at most {} in flight, held by the `{}` entry (kept out of the key), freed by its release or after {} ms",
                b.capacity, cap.holder, cap.max_hold_ms
            ),
            None => format!("slots:       at most {} in flight", b.capacity),
        },
    }
}

/// `5`, `0.5`, `0.0011574` — no trailing zeros, at most 7 decimals.
fn trim_float(x: f64) -> String {
    let s = format!("{x:.7}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests;
