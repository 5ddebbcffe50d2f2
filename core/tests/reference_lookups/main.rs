//! The lookup expectations of envoyproxy/ratelimit's `test/config/config_test.go`, restated for
//! sluice: for each request its tests make, the rule sluice reaches, the limit it carries, and
//! what the per-rule metrics are named from — the rule's `path` (the reference's stats key of a
//! rule without per-value naming) and the flags that make the service name a series by runtime
//! values instead (`detailed_metric`, `value_to_metric` levels, `share_threshold` patterns).
//! The series names the service builds from these are checked through gRPC and `/metrics` in
//! the service crate's `tests/reference/`.
//!
//! The configs are written here in the shape of the reference's fixtures (`basic_config.yaml`,
//! `shadowmode_config.yaml`, `share_threshold.yaml`) and of its inline test configs; they are
//! not copies.
//!
//! This file: loading a config and reading what a rule carries. The lookups, by theme: [`basic`]
//! (`basic_config.yaml`, shadow mode), [`per_value`] (`detailed_metric`, `value_to_metric`),
//! [`share_threshold`] (shared wildcard buckets, wildcard flags), [`limits`] (`replaces`,
//! `unlimited`, blocking rules).

use std::sync::Arc;

use sluice_core::config::{Config, load_sources};
use sluice_core::request::Entry;
use sluice_core::rule::{Limit, RateLimit, Rule, Unit};

mod basic;
mod limits;
mod per_value;
mod share_threshold;

fn load(name: &str, text: &str) -> Config {
    load_sources(&[(name.to_owned(), text.to_owned())])
        .unwrap_or_else(|e| panic!("{name} does not load:\n{e}"))
}

/// The rule `pairs` reach in `domain`, if any.
fn reach<'c>(config: &'c Config, domain: &str, pairs: &[(&str, &str)]) -> Option<&'c Arc<Rule>> {
    let entries: Vec<Entry> = pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    config.domain(domain)?.find(&entries)
}

/// The rule `pairs` reach; panics naming the request when none is.
fn reached<'c>(config: &'c Config, domain: &str, pairs: &[(&str, &str)]) -> &'c Arc<Rule> {
    reach(config, domain, pairs).unwrap_or_else(|| panic!("no rule reached by {pairs:?}"))
}

fn per(requests_per_unit: u32, unit: Unit) -> Limit {
    Limit::Bucket(RateLimit {
        requests_per_unit,
        unit,
        unit_multiplier: 1,
        burst: None,
    })
}

/// The rule's path, its limit, and its name.
fn summary(rule: &Rule) -> (&str, Limit, Option<&str>) {
    (&rule.path, rule.limit, rule.name.as_deref())
}

/// Per request entry, whether the service names it by the request's value in a per-rule
/// series (`value_to_metric` on that level); empty when no level of the rule asks.
fn runtime_named_levels(rule: &Rule) -> Vec<bool> {
    rule.metric_levels
        .iter()
        .map(|l| l.value_to_metric)
        .collect()
}

/// Per request entry, the wildcard pattern standing for the value when that level shares one
/// bucket (the reference's `ShareThresholdKeyPattern`, with `""` for `None`); empty when none.
fn shared_patterns(rule: &Rule) -> Vec<&str> {
    rule.shared_values
        .iter()
        .map(|p| p.as_deref().unwrap_or(""))
        .collect()
}
