//! What the rule reached carries besides its bucket: `replaces`, `unlimited`, and a blocking
//! `requests_per_unit: 0`.

use super::*;

/// `replaces` and `unlimited` as the service reads them: the names a rule replaces, and an
/// unlimited rule reached like any other.
#[test]
fn replaces_and_unlimited_are_carried_by_the_rule_reached() {
    let config = load(
        "r.yaml",
        "domain: d
descriptors:
  - key: tenant
    rate_limit: {name: tenant-default, unit: minute, requests_per_unit: 3}
  - key: plan
    value: free
    descriptors:
      - key: tenant
        rate_limit:
          name: free-tenant
          replaces: [{name: tenant-default}]
          unit: minute
          requests_per_unit: 1
  - key: internal
    rate_limit: {unlimited: true}
",
    );
    let default = reached(&config, "d", &[("tenant", "t")]);
    assert_eq!(
        summary(default),
        ("d.tenant", per(3, Unit::Minute), Some("tenant-default"))
    );
    assert!(default.replaces.is_empty());
    let free = reached(&config, "d", &[("plan", "free"), ("tenant", "t")]);
    assert_eq!(
        summary(free),
        (
            "d.plan_free.tenant",
            per(1, Unit::Minute),
            Some("free-tenant")
        )
    );
    let replaced: Vec<&str> = free.replaces.iter().map(|n| &**n).collect();
    assert_eq!(replaced, ["tenant-default"]);
    let internal = reached(&config, "d", &[("internal", "x")]);
    assert_eq!(summary(internal), ("d.internal", Limit::Unlimited, None));
}

/// `requests_per_unit: 0` (the reference's integration `reload.yaml` `block` key) loads as a
/// rule that blocks in its unit, with a warning saying so.
#[test]
fn requests_per_unit_zero_reaches_a_blocking_rule() {
    let config = load(
        "reload.yaml",
        "domain: reload
descriptors:
  - key: key1
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
",
    );
    let rule = reached(&config, "reload", &[("block", "foo")]);
    assert_eq!(
        summary(rule),
        ("reload.block", Limit::Blocked { unit: Unit::Second }, None)
    );
    let warnings: Vec<String> = config.warnings().iter().map(ToString::to_string).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("reload.yaml:") && w.contains("`requests_per_unit: 0` blocks")),
        "{warnings:?}"
    );
    assert_eq!(
        reached(&config, "reload", &[("key1", "foo")]).limit,
        per(50, Unit::Second)
    );
}
