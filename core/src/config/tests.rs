//! Validation through the public interface: every problem of every file, located; and the
//! helpers the other test files of the config share.

use super::*;
use crate::rule::{Limit, RateLimit, Unit};

pub(super) fn load(src: &str) -> Result<Config, ConfigErrors> {
    load_sources(&[("t.yaml".to_owned(), src.to_owned())])
}

/// Every diagnostic of a one-file set as `line:column: message`.
pub(super) fn errors(src: &str) -> Vec<String> {
    match load(src) {
        Ok(_) => panic!("config loaded, expected errors:\n{src}"),
        Err(ConfigErrors(diags)) => diags
            .into_iter()
            .map(|d| {
                assert_eq!(d.file, "t.yaml");
                format!("{}:{}: {}", d.line, d.column, d.message)
            })
            .collect(),
    }
}

pub(super) fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

pub(super) fn path_of(domain: &Domain, pairs: &[(&str, &str)]) -> Option<String> {
    domain.find(&entries(pairs)).map(|r| r.path.to_string())
}

pub(super) fn bucket(requests_per_unit: u32, unit: Unit, burst: Option<u32>) -> Limit {
    Limit::Bucket(RateLimit {
        requests_per_unit,
        unit,
        unit_multiplier: 1,
        burst,
    })
}

// ---------------------------------------------------------------------------------------------
// Validation

#[test]
fn every_problem_of_a_file_is_reported_in_order() {
    let src = r#"domain: edge
failure_mode: sometimes
extra: 1
descriptors:
  - value: x
    rate_limit:
      unit: fortnight
      requests_per_unit: -3
  - key: ""
  - key: a
    rate_limit:
      unlimited: true
      unit: second
      requests_per_unit: 5
      burst: 2
  - key: a
    cost: 0
    rate_limit:
      requests_per_unit: -1
      burst: 0
      sharded: 4
      name: n
      replaces:
        - name: n
        - {}
        - name: ""
  - key: b
    failure_mode: maybe
    rate_limit:
      unit: minute
      requests_per_unit: 1.5
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1, name: n}
"#;
    assert_eq!(
        errors(src),
        [
            "2:15: invalid failure_mode `sometimes`; expected one of: open, closed, local, error",
            "3:1: unknown field `extra` in the config file; expected one of: domain, failure_mode, algorithm, charge, descriptors",
            "5:5: descriptor is missing required field `key`",
            "7:13: invalid unit `fortnight`; expected one of: second, minute, hour, day, week, month, year",
            "8:26: `requests_per_unit` must be an integer from 0 to 4294967295, got -3",
            "9:10: descriptor `key` must not be empty",
            "13:7: `unit` must not be given with `unlimited: true`",
            "14:7: `requests_per_unit` must not be given with `unlimited: true`",
            "15:7: `burst` must not be given with `unlimited: true`",
            "16:5: duplicate descriptor `a` (no value) at this level (first at line 10)",
            "17:11: `cost` must be an integer from 1 to 4294967295, got 0",
            "18:5: `rate_limit` is missing `unit` (or `unlimited: true`)",
            "19:26: `requests_per_unit` must be an integer from 0 to 4294967295, got -1",
            "20:14: `burst` must be an integer from 1 to 4294967295, got 0",
            "21:7: unknown field `sharded` in `rate_limit`; expected one of: unit, unit_multiplier, requests_per_unit, burst, lease, shards, algorithm, name, unlimited, replaces",
            "24:17: rule `n` cannot replace itself",
            "25:11: `replaces` entry is missing `name`",
            "26:17: `replaces` entry has an empty `name`",
            "28:19: invalid failure_mode `maybe`; expected one of: open, closed, local, error",
            "31:26: `requests_per_unit` must be an integer, got `1.5`",
            "34:64: duplicate rate_limit name `n` in this domain (first at line 22); `replaces` would be ambiguous",
        ]
    );
}

#[test]
fn every_problem_of_every_file_is_reported() {
    let sources = [
        (
            "a.yaml",
            "domain: a\ndescriptors:\n  - key: k\n    bogus: 1\n",
        ),
        ("b.yaml", "domain: b\ndescriptors: [1\n"),
        ("c.yaml", "domain: c\n"),
        ("d.yaml", "domain: a\n"),
    ]
    .map(|(n, t)| (n.to_owned(), t.to_owned()));
    let ConfigErrors(diags) = load_sources(&sources).unwrap_err();
    let shown: Vec<String> = diags.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 3, "{shown:#?}");
    assert!(shown[0].starts_with("a.yaml:4:5: unknown field `bogus` in a descriptor"));
    assert!(shown[1].starts_with("b.yaml:2:"), "{}", shown[1]);
    assert_eq!(
        shown[2],
        "d.yaml:1:9: duplicate domain `a`: already defined at a.yaml:1:9"
    );
    // Display: one diagnostic per line.
    let display = ConfigErrors(diags).to_string();
    assert_eq!(display.lines().count(), 3);
}

#[test]
fn domain_must_be_given_and_not_empty() {
    assert_eq!(
        errors("descriptors:\n  - key: a\n"),
        ["1:1: missing required field `domain`"]
    );
    assert_eq!(
        errors("domain:\ndescriptors: []\n"),
        ["1:1: missing required field `domain`"]
    );
    assert_eq!(
        errors("domain: \"\"\n"),
        ["1:9: `domain` must not be empty"]
    );
    assert_eq!(
        errors("domain: [a]\n"),
        ["1:9: `domain` must be a string, got a list"]
    );
}

#[test]
fn duplicate_domain_points_at_the_second_file() {
    let sources = [
        ("one.yaml", "domain: shared\n"),
        ("two.yaml", "# comment\ndomain:   shared\n"),
    ]
    .map(|(n, t)| (n.to_owned(), t.to_owned()));
    let ConfigErrors(diags) = load_sources(&sources).unwrap_err();
    assert_eq!(
        diags,
        [Diagnostic {
            file: "two.yaml".into(),
            line: 2,
            column: 11,
            message: "duplicate domain `shared`: already defined at one.yaml:1:9".into(),
        }]
    );
}

#[test]
fn descriptor_key_is_required() {
    assert_eq!(
        errors("domain: d\ndescriptors:\n  - value: v\n"),
        ["3:5: descriptor is missing required field `key`"]
    );
    assert_eq!(
        errors("domain: d\ndescriptors:\n  - key: ''\n"),
        ["3:10: descriptor `key` must not be empty"]
    );
    // A missing key deeper down is found too.
    assert_eq!(
        errors(
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - rate_limit: {unlimited: true}\n"
        ),
        ["5:9: descriptor is missing required field `key`"]
    );
}

#[test]
fn duplicate_key_value_at_one_level() {
    let src = "domain: d
descriptors:
  - key: k
    value: v
  - key: k
    value: w
  - key: k
    value: v*
  - key: k
    value: v
  - key: k
  - key: k
    value: ''
  - key: other
    descriptors:
      - key: k
        value: v
";
    assert_eq!(
        errors(src),
        [
            "9:5: duplicate descriptor `k` = `v` at this level (first at line 3)",
            // An empty value is no value, as in envoyproxy/ratelimit.
            "12:5: duplicate descriptor `k` (no value) at this level (first at line 11)",
        ]
    );
}

#[test]
fn unknown_fields_are_named_wherever_they_are() {
    let src = "domian: d
descriptors:
  - key: k
    rate_limt: {unit: second, requests_per_unit: 1}
  - key: j
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces:
        - name: x
          why: because
";
    assert_eq!(
        errors(src),
        [
            "1:1: unknown field `domian` in the config file; expected one of: domain, failure_mode, algorithm, charge, descriptors",
            "1:1: missing required field `domain`",
            "4:5: unknown field `rate_limt` in a descriptor; expected one of: key, value, rate_limit, rate_limits, descriptors, shadow_mode, quota_mode, detailed_metric, cost, charge, failure_mode, share_threshold, value_to_metric, metadata, in_flight, reserve",
            "11:11: unknown field `why` in a `replaces` entry; expected one of: name",
        ]
    );
}

#[test]
fn units_are_checked_and_case_insensitive() {
    assert_eq!(
        errors(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
        ),
        [
            "4:24: invalid unit `fortnight`; expected one of: second, minute, hour, day, week, month, year"
        ]
    );
    let config = load(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: SECOND, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: Week, requests_per_unit: 1}\n",
    )
    .unwrap();
    let units: Vec<Limit> = config.rules().map(|r| r.limit).collect();
    assert_eq!(
        units,
        [bucket(1, Unit::Second, None), bucket(1, Unit::Week, None)]
    );
}

#[test]
fn rate_limit_needs_unit_and_rate_unless_unlimited() {
    let src = "domain: d
descriptors:
  - key: a
    rate_limit:
      requests_per_unit: 1
  - key: b
    rate_limit:
      unit: second
  - key: c
    rate_limit:
  - key: d
    rate_limit:
      unlimited: false
";
    assert_eq!(
        errors(src),
        [
            "4:5: `rate_limit` is missing `unit` (or `unlimited: true`)",
            "7:5: `rate_limit` is missing `requests_per_unit` (or `unlimited: true`)",
            "10:5: `rate_limit` is missing `unit` (or `unlimited: true`)",
            "10:5: `rate_limit` is missing `requests_per_unit` (or `unlimited: true`)",
            "12:5: `rate_limit` is missing `unit` (or `unlimited: true`)",
            "12:5: `rate_limit` is missing `requests_per_unit` (or `unlimited: true`)",
        ]
    );
}

#[test]
fn unlimited_excludes_unit_rate_and_burst() {
    let src = "domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      unlimited: true
";
    assert_eq!(
        errors(src),
        ["5:7: `unit` must not be given with `unlimited: true`"]
    );
    let ok = load(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, name: free}\n",
    )
    .unwrap();
    assert_eq!(ok.rules().next().unwrap().limit, Limit::Unlimited);
}

#[test]
fn counts_must_be_integers_that_fit() {
    let src = "domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: b
    rate_limit: {unit: second, requests_per_unit: -5}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 2.5}
  - key: e
    rate_limit: {unit: second, requests_per_unit: \"10\"}
  - key: f
    rate_limit: {unit: second, requests_per_unit: 4294967296}
  - key: g
    rate_limit: {unit: second, requests_per_unit: 4294967295, burst: -1}
  - key: h
    cost: 1.0
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: i
    cost: -2
    rate_limit: {unit: second, requests_per_unit: 1}
";
    assert_eq!(
        errors(src),
        [
            "6:51: `requests_per_unit` must be an integer from 0 to 4294967295, got -5",
            "8:51: `requests_per_unit` must be an integer, got `2.5`",
            "10:51: `requests_per_unit` must be an integer, got `10`",
            "12:51: `requests_per_unit` must be an integer from 0 to 4294967295, got 4294967296",
            "14:70: `burst` must be an integer from 1 to 4294967295, got -1",
            "16:11: `cost` must be an integer, got `1.0`",
            "19:11: `cost` must be an integer from 1 to 4294967295, got -2",
        ]
    );
}

#[test]
fn failure_mode_is_checked_at_both_levels() {
    let src = "domain: d
failure_mode: shut
descriptors:
  - key: a
    failure_mode: Closed
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    failure_mode: half-open
    rate_limit: {unit: second, requests_per_unit: 1}
";
    assert_eq!(
        errors(src),
        [
            "2:15: invalid failure_mode `shut`; expected one of: open, closed, local, error",
            "8:19: invalid failure_mode `half-open`; expected one of: open, closed, local, error",
        ]
    );
}

#[test]
fn rule_settings_on_a_node_without_rate_limit_are_refused() {
    let src = "domain: d
descriptors:
  - key: a
    cost: 2
    failure_mode: open
    shadow_mode: true
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
";
    assert_eq!(
        errors(src),
        [
            "4:5: `cost` applies only to a descriptor with a `rate_limit` (it is not inherited)",
            "5:5: `failure_mode` applies only to a descriptor with a `rate_limit` (it is not inherited)",
        ]
    );
}

#[test]
fn replaces_entries_are_checked() {
    let src = "domain: d
descriptors:
  - key: a
    rate_limit:
      name: a
      unit: second
      requests_per_unit: 1
      replaces:
        - name: a
        - name:
        - name: ''
        - other
  - key: b
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces: {name: a}
";
    assert_eq!(
        errors(src),
        [
            "9:17: rule `a` cannot replace itself",
            "10:11: `replaces` entry is missing `name`",
            "11:17: `replaces` entry has an empty `name`",
            "12:11: a `replaces` entry must be a mapping, got `other`",
            "17:17: `replaces` must be a list, got a mapping",
        ]
    );
}

#[test]
fn rate_limit_names_are_unique_per_domain() {
    let src = "domain: d
descriptors:
  - key: a
    rate_limit: {name: n, unit: second, requests_per_unit: 1}
    descriptors:
      - key: b
        rate_limit:
          name: n
          unit: second
          requests_per_unit: 1
  - key: c
    rate_limit: {name: '', unit: second, requests_per_unit: 1}
";
    assert_eq!(
        errors(src),
        [
            "8:17: duplicate rate_limit name `n` in this domain (first at line 4); `replaces` would be ambiguous",
            "12:24: `rate_limit.name` must not be empty",
        ]
    );
    // The same name in two domains is fine: `replaces` works within a domain.
    let sources = [
        (
            "a.yaml",
            "domain: a\ndescriptors: [{key: k, rate_limit: {name: n, unlimited: true}}]\n",
        ),
        (
            "b.yaml",
            "domain: b\ndescriptors: [{key: k, rate_limit: {name: n, unlimited: true}}]\n",
        ),
    ]
    .map(|(n, t)| (n.to_owned(), t.to_owned()));
    assert_eq!(load_sources(&sources).unwrap().rule_count(), 2);
}

#[test]
fn shapes_are_checked() {
    let src = "domain: d
descriptors:
  - just-a-string
  - key: [a, b]
  - key: c
    shadow_mode: maybe
    detailed_metric: 1
    descriptors: {key: x}
  - key: e
    rate_limit: 60
  - key: f
    value: {a: 1}
";
    assert_eq!(
        errors(src),
        [
            "3:5: a descriptor must be a mapping, got `just-a-string`",
            "4:10: `key` must be a string, got a list",
            "6:18: `shadow_mode` must be true or false, got `maybe`",
            "7:22: `detailed_metric` must be true or false, got `1`",
            "8:18: `descriptors` must be a list, got a mapping",
            "10:17: `rate_limit` must be a mapping, got `60`",
            "12:12: `value` must be a string, got a mapping",
        ]
    );
    assert_eq!(
        errors("- domain: d\n"),
        ["1:1: the config file must be a mapping, got a list"]
    );
}

#[test]
fn yaml_problems_are_located() {
    let errs = errors("domain: d\ndescriptors:\n  - key: a\n    key: b\n");
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0].starts_with("4:5: ") && errs[0].contains("duplicate"),
        "{errs:?}"
    );

    let errs = errors("domain: d\ndescriptors: [\n");
    assert_eq!(errs.len(), 1);
    assert!(errs[0].starts_with("2:"), "{errs:?}");

    assert_eq!(
        errors("domain: d\n---\ndomain: e\n"),
        ["3:1: a config file holds one domain; found a second YAML document"]
    );
    assert_eq!(
        errors("# nothing here\n"),
        ["1:1: no domain in this file: expected a mapping with `domain` and `descriptors`"]
    );
}

#[test]
fn string_fields_keep_their_spelling() {
    // yaml.v2 (envoyproxy/ratelimit) reads these as the text written, not as bool/float/int.
    let config = load(
        "domain: 2024
descriptors:
  - key: enabled
    value: on
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: version
    value: 1.50
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: 404
    rate_limit: {unit: second, requests_per_unit: 1}
",
    )
    .unwrap();
    let domain = config.domain("2024").unwrap();
    assert_eq!(
        path_of(domain, &[("enabled", "on")]).as_deref(),
        Some("2024.enabled_on")
    );
    assert_eq!(path_of(domain, &[("enabled", "true")]), None);
    assert_eq!(
        path_of(domain, &[("version", "1.50")]).as_deref(),
        Some("2024.version_1.50")
    );
    assert_eq!(
        path_of(domain, &[("404", "x")]).as_deref(),
        Some("2024.404")
    );
}

#[test]
fn config_text_in_messages_cannot_break_lines() {
    assert_eq!(
        errors(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: \"a\\nb\\u001b[31m\", requests_per_unit: 1}\n"
        ),
        [
            "4:24: invalid unit `a\\nb\\u{1b}[31m`; expected one of: second, minute, hour, day, week, month, year"
        ]
    );
}

#[test]
fn anchors_and_aliases_share_subtrees() {
    let config = load(
        "domain: d
descriptors:
  - key: a
    descriptors: &per_user
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    descriptors: *per_user
",
    )
    .unwrap();
    let d = config.domain("d").unwrap();
    assert_eq!(
        path_of(d, &[("a", "1"), ("user", "u")]).as_deref(),
        Some("d.a.user")
    );
    assert_eq!(
        path_of(d, &[("b", "1"), ("user", "u")]).as_deref(),
        Some("d.b.user")
    );
    // Each use is its own rule, located where it is used.
    let sources: Vec<&str> = config.rules().map(|r| &*r.source).collect();
    assert_eq!(sources, ["t.yaml:5", "t.yaml:8"]);
}

#[test]
fn a_domain_without_descriptors_is_known_and_empty() {
    let config = load("domain: empty\n").unwrap();
    let domain = config.domain("empty").unwrap();
    assert!(domain.rules().is_empty());
    assert_eq!(path_of(domain, &[("k", "v")]), None);
    assert!(config.domain("other").is_none());
}
