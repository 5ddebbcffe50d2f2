//! `basic_config.yaml` and `shadowmode_config.yaml`: which rule a request reaches and the limit
//! and shadow mode it carries.

use super::*;

/// The shape of `basic_config.yaml`.
const BASIC: &str = "domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
";

/// TestBasicConfig: exact values win over the bare key, a value without a limit allows its
/// value through (`key2=value3`), a request deeper or shallower than the config reaches nothing.
#[test]
fn basic_config_lookups() {
    let config = load("basic_config.yaml", BASIC);
    assert!(config.domain("foo_domain").is_none(), "unknown domain");
    assert!(reach(&config, "test-domain", &[]).is_none());
    for unmatched in [
        &[("key1", "something")][..],
        &[("key1", "value1")],
        &[("key2", "value2"), ("subkey", "subvalue")],
        &[("key5", "value5"), ("subkey5", "subvalue")],
        &[("key2", "value3")],
    ] {
        assert!(
            reach(&config, "test-domain", unmatched).is_none(),
            "{unmatched:?} reaches no rule"
        );
    }
    for (pairs, expected) in [
        (
            &[("key1", "value1"), ("subkey1", "something")][..],
            (
                "test-domain.key1_value1.subkey1",
                per(5, Unit::Second),
                None,
            ),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            (
                "test-domain.key1_value1.subkey1_subvalue1",
                per(10, Unit::Second),
                None,
            ),
        ),
        (
            &[("key2", "something")],
            ("test-domain.key2", per(20, Unit::Minute), None),
        ),
        (
            &[("key2", "value2")],
            ("test-domain.key2_value2", per(30, Unit::Minute), None),
        ),
        (
            &[("key3", "foo")],
            ("test-domain.key3", per(1, Unit::Hour), None),
        ),
        (
            &[("key4", "foo")],
            (
                "test-domain.key4",
                per(1, Unit::Day),
                Some("key4_rate_limit"),
            ),
        ),
        (
            &[("key6", "foo")],
            ("test-domain.key6", Limit::Unlimited, None),
        ),
        (
            &[("key7", "unspecified_value")],
            ("test-domain.key7", per(70, Unit::Minute), None),
        ),
    ] {
        let rule = reached(&config, "test-domain", pairs);
        assert_eq!(summary(rule), expected, "{pairs:?}");
    }
    // key7's series are named by value (`key7_unspecified_value`, `key7_another_value`); no
    // other rule of the file is.
    let detailed: Vec<&str> = config
        .rules()
        .filter(|r| r.detailed_metric)
        .map(|r| &*r.path)
        .collect();
    assert_eq!(detailed, ["test-domain.key7"]);
}

/// TestShadowModeConfig: `shadow_mode` belongs to the rule it is written on, not to its
/// siblings of the same key.
#[test]
fn shadow_mode_lookups() {
    let config = load(
        "shadowmode_config.yaml",
        "domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
",
    );
    for (pairs, limit, shadow) in [
        (
            &[("key1", "value1"), ("subkey1", "something")][..],
            per(5, Unit::Second),
            false,
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            per(10, Unit::Second),
            true,
        ),
        (&[("key2", "something")], per(20, Unit::Minute), true),
        (&[("key2", "value2")], per(30, Unit::Minute), false),
    ] {
        let rule = reached(&config, "test-domain", pairs);
        assert_eq!((rule.limit, rule.shadow_mode), (limit, shadow), "{pairs:?}");
    }
}
