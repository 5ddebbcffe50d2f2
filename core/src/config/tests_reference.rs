//! envoyproxy/ratelimit's config surface: the fields it accepts, where it ignores them, its
//! wildcard grammar and `share_threshold`.

use super::*;
use crate::request::Entry;
use crate::rule::{Limit, RateLimit, Unit};

fn load(text: &str) -> Result<Config, Vec<String>> {
    load_sources(&[("t.yaml".to_owned(), text.to_owned())])
        .map_err(|e| e.0.iter().map(ToString::to_string).collect())
}

fn warnings(config: &Config) -> Vec<String> {
    config.warnings().iter().map(ToString::to_string).collect()
}

fn rule<'c>(config: &'c Config, pairs: &[(&str, &str)]) -> Option<&'c Arc<Rule>> {
    let entries: Vec<Entry> = pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    config.domain("d")?.find(&entries)
}

#[test]
fn reference_fields_in_the_wrong_place_load_with_a_warning() {
    let config = load(
        "domain: d
descriptors:
  - key: k
    unit: second
    requests_per_unit: 5
    rate_limit:
      unit: minute
      requests_per_unit: 3
      shadow_mode: true
",
    )
    .expect("envoyproxy/ratelimit loads it, so sluice does");
    assert_eq!(
        warnings(&config),
        [
            "t.yaml:4:5: field `unit` has no effect in a descriptor and is ignored (envoyproxy/ratelimit ignores it there too); expected one of: key, value, rate_limit, rate_limits, descriptors, shadow_mode, quota_mode, detailed_metric, cost, charge, failure_mode, share_threshold, value_to_metric, metadata, in_flight, reserve",
            "t.yaml:5:5: field `requests_per_unit` has no effect in a descriptor and is ignored (envoyproxy/ratelimit ignores it there too); expected one of: key, value, rate_limit, rate_limits, descriptors, shadow_mode, quota_mode, detailed_metric, cost, charge, failure_mode, share_threshold, value_to_metric, metadata, in_flight, reserve",
            "t.yaml:9:7: field `shadow_mode` has no effect in `rate_limit` and is ignored (envoyproxy/ratelimit ignores it there too); expected one of: unit, unit_multiplier, requests_per_unit, burst, lease, shards, algorithm, name, unlimited, replaces",
        ]
    );
    let r = rule(&config, &[("k", "v")]).expect("the rule of the rate_limit");
    assert_eq!(
        r.limit,
        Limit::Bucket(RateLimit {
            requests_per_unit: 3,
            unit: Unit::Minute,
            unit_multiplier: 1,
            burst: None
        })
    );
    // The misplaced `shadow_mode` did nothing.
    assert!(!r.shadow_mode);
}

#[test]
fn names_neither_project_knows_stay_errors() {
    let errors = load("domain: d\ndescriptors:\n  - key: k\n    burts: 5\n").unwrap_err();
    assert_eq!(errors.len(), 1);
    assert!(errors[0].starts_with("t.yaml:4:5: unknown field `burts` in a descriptor"));
}

#[test]
fn share_threshold_needs_a_wildcard_and_marks_its_level_as_shared() {
    let config = load(
        "domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /files/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 10}
      - key: path
        value: /api*v1*
        share_threshold: true
        descriptors:
          - key: method
            rate_limit: {unit: minute, requests_per_unit: 20}
      - key: path
        value: /other/*
        rate_limit: {unit: minute, requests_per_unit: 30}
",
    )
    .expect("loads");
    let shared = |pairs: &[(&str, &str)]| {
        rule(&config, pairs).map(|r| {
            r.shared_values
                .iter()
                .map(|v| v.as_deref().map(str::to_owned))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(
        shared(&[("tenant", "a"), ("path", "/files/x")]),
        Some(vec![None, Some("/files/*".to_owned())])
    );
    // A shared level above the rule shares too.
    assert_eq!(
        shared(&[
            ("tenant", "a"),
            ("path", "/api/users/v1/x"),
            ("method", "GET")
        ]),
        Some(vec![None, Some("/api*v1*".to_owned()), None])
    );
    assert_eq!(
        shared(&[("tenant", "a"), ("path", "/other/x")]),
        Some(vec![])
    );

    let errors = load(
        "domain: d\ndescriptors:\n  - key: k\n    value: exact\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap_err();
    assert_eq!(
        errors,
        [
            "t.yaml:5:5: `share_threshold` applies only to a wildcard value (one holding `*`): the values it matches share one bucket"
        ]
    );
}

#[test]
fn metadata_and_value_to_metric_load() {
    let config = load(
        "domain: d
descriptors:
  - key: k
    value_to_metric: true
    metadata:
      team: payments
      tiers: [gold, 2, true]
      nested: {a: 1.5}
    rate_limit: {unit: second, requests_per_unit: 1}
",
    )
    .expect("loads");
    let r = rule(&config, &[("k", "v")]).unwrap();
    assert_eq!(
        r.metadata.as_deref(),
        Some(
            &serde_json::json!({"team": "payments", "tiers": ["gold", 2, true], "nested": {"a": 1.5}})
        )
    );
    assert!(warnings(&config).is_empty(), "{:?}", warnings(&config));
}

#[test]
fn stars_anywhere_match_in_config_order_after_exact_values() {
    let config = load(
        "domain: d
descriptors:
  - key: p
    value: foo*bar*baz
    rate_limit: {unit: second, requests_per_unit: 1, name: multi}
  - key: p
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 2, name: trailing}
  - key: p
    value: foo1bar2baz
    rate_limit: {unit: second, requests_per_unit: 3, name: exact}
  - key: p
    rate_limit: {unit: second, requests_per_unit: 4, name: bare}
",
    )
    .expect("loads");
    let name =
        |v: &str| rule(&config, &[("p", v)]).and_then(|r| r.name.as_deref().map(str::to_owned));
    assert_eq!(name("foo1bar2baz").as_deref(), Some("exact"));
    assert_eq!(name("fooXbarYbaz").as_deref(), Some("multi"));
    assert_eq!(name("foobarbaz").as_deref(), Some("multi"));
    assert_eq!(name("foobaz").as_deref(), Some("trailing"));
    assert_eq!(name("other").as_deref(), Some("bare"));
}

#[test]
fn requests_per_unit_zero_loads_as_a_blocking_rule_with_a_warning() {
    let config = load(
        "domain: d
descriptors:
  - key: block
    rate_limit:
      unit: second
      requests_per_unit: 0
",
    )
    .expect("envoyproxy/ratelimit loads it, so sluice does");
    assert_eq!(
        warnings(&config),
        [
            "t.yaml:6:26: `requests_per_unit: 0` blocks: every request this rule reaches is answered OVER_LIMIT"
        ]
    );
    let r = rule(&config, &[("block", "x")]).expect("the blocking rule");
    assert_eq!(r.limit, Limit::Blocked { unit: Unit::Second });
    let dumped = &config.to_json()["domains"][0]["rules"][0]["limit"];
    assert_eq!(dumped, &serde_json::json!({"blocked": {"unit": "second"}}));
}

#[test]
fn a_blocking_rule_refuses_the_fields_that_shape_a_bucket() {
    let errors = load(
        "domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 0, burst: 5, shards: 2}
",
    )
    .unwrap_err();
    assert_eq!(
        errors,
        [
            "t.yaml:4:54: `burst` must not be given with `requests_per_unit: 0` (it keeps no bucket)",
            "t.yaml:4:64: `shards` must not be given with `requests_per_unit: 0` (it keeps no bucket)",
        ]
    );
}
