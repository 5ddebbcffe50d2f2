//! Series named by the request's values: `detailed_metric` (the flag of the descriptor holding the
//! limit) and `value_to_metric` (per level).

use super::*;

/// TestDetailedMetric: whether the rule reached names its series by the request's values. The
/// flag that counts is the one on the descriptor holding the limit, as in the reference.
#[test]
fn detailed_metric_follows_the_rule_reached() {
    let nested = |outer: bool, inner: bool| {
        format!(
            "domain: nested
descriptors:
  - key: key-1
    detailed_metric: {outer}
    rate_limit: {{unit: minute, requests_per_unit: 100}}
    descriptors:
      - key: key-2
        detailed_metric: {inner}
        rate_limit: {{unit: minute, requests_per_unit: 5}}
"
        )
    };
    for (outer, inner, pairs, path, limit, detailed) in [
        (
            true,
            false,
            &[("key-1", "value-1")][..],
            "nested.key-1",
            per(100, Unit::Minute),
            true,
        ),
        (
            false,
            false,
            &[("key-1", "value-1")],
            "nested.key-1",
            per(100, Unit::Minute),
            false,
        ),
        (
            true,
            true,
            &[("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1.key-2",
            per(5, Unit::Minute),
            true,
        ),
        (
            false,
            false,
            &[("key-1", "value-1"), ("key-2", "value-2")],
            "nested.key-1.key-2",
            per(5, Unit::Minute),
            false,
        ),
    ] {
        let config = load("nested.yaml", &nested(outer, inner));
        let rule = reached(&config, "nested", pairs);
        assert_eq!(
            (&*rule.path, rule.limit, rule.detailed_metric),
            (path, limit, detailed),
            "{pairs:?} with detailed_metric {outer}/{inner}"
        );
    }
    detailed_metric_in_the_realistic_nested_example();
}

/// The reference's "realistic" nested example: every rule reached names its series by value;
/// `key_3` without a value holds no limit.
fn detailed_metric_in_the_realistic_nested_example() {
    let config = load(
        "realistic.yaml",
        "domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
",
    );
    for (pairs, path, limit) in [
        (
            &[("key_1", "value-for-key-1")][..],
            "nested.key_1",
            per(500, Unit::Minute),
        ),
        (
            &[("key_2", "key-2-value")],
            "nested.key_2",
            per(5000, Unit::Minute),
        ),
        (
            &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
            "nested.key_2.key_3_requested-key3-value",
            per(5, Unit::Minute),
        ),
        (
            &[("key_2", "specific-id"), ("key_3", "requested-key3-value")],
            "nested.key_2_specific-id.key_3_requested-key3-value",
            per(100, Unit::Minute),
        ),
    ] {
        let rule = reached(&config, "nested", pairs);
        assert_eq!(
            (&*rule.path, rule.limit, rule.detailed_metric),
            (path, limit, true),
            "{pairs:?}"
        );
    }
    // `key_3` without a value holds no limit: a request ending there reaches nothing.
    assert!(
        reach(
            &config,
            "nested",
            &[("key_2", "key-2-value"), ("key_3", "other")]
        )
        .is_none()
    );
}

/// The request most of TestValueToMetric_* send.
const DRAW_GET: [(&str, &str); 3] = [
    ("route", "draw"),
    ("http_method", "GET"),
    ("subject_id", "123"),
];

/// The three-level shape most of TestValueToMetric_* use, with `flags` on route/http_method.
fn route_method_subject(domain: &str, route: bool, method: bool) -> String {
    format!(
        "domain: {domain}
descriptors:
  - key: route
    value_to_metric: {route}
    descriptors:
      - key: http_method
        value_to_metric: {method}
        descriptors:
          - key: subject_id
            rate_limit: {{unit: minute, requests_per_unit: 60}}
"
    )
}

/// TestValueToMetric_*: which levels of the rule reached are named by the request's value.
#[test]
fn value_to_metric_marks_the_levels_named_by_runtime_values() {
    let request = DRAW_GET;

    // UsesRuntimeValuesInStats, FullKeyMatchesStatsKey (route_draw.http_method_GET.subject_id).
    let config = load("v.yaml", &route_method_subject("domain", true, true));
    let rule = reached(&config, "domain", &request);
    assert_eq!(
        (&*rule.path, rule.limit),
        ("domain.route.http_method.subject_id", per(60, Unit::Minute))
    );
    assert_eq!(runtime_named_levels(rule), [true, true, false]);
    assert!(!rule.detailed_metric);
    // WithEmptyValue: empty values still walk the same keys to the same rule.
    for pairs in [
        [("route", ""), ("http_method", "GET"), ("subject_id", "123")],
        [
            ("route", "draw"),
            ("http_method", ""),
            ("subject_id", "123"),
        ],
        [("route", ""), ("http_method", ""), ("subject_id", "123")],
    ] {
        assert!(Arc::ptr_eq(reached(&config, "domain", &pairs), rule));
    }

    // NoFlag_Unchanged: no level asks, so the rule's own path names it (d.k1.k2).
    let config = load(
        "n.yaml",
        &route_method_subject("test-domain-2", false, false),
    );
    let rule = reached(&config, "test-domain-2", &request);
    assert_eq!(&*rule.path, "test-domain-2.route.http_method.subject_id");
    assert!(runtime_named_levels(rule).is_empty());

    value_to_metric_on_one_level();
    value_to_metric_keeps_detailed_metric();
    value_to_metric_with_configured_values();
    value_to_metric_on_a_wildcard_level();
}

/// DefaultKeyIncludesValueAtThatLevel (d.k1_A.k2) and MidLevelOnly (d.k1.k2_Y.k3).
fn value_to_metric_on_one_level() {
    let config = load(
        "d.yaml",
        "domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: m1
    descriptors:
      - key: m2
        value_to_metric: true
        descriptors:
          - key: m3
            rate_limit: {unit: second, requests_per_unit: 1}
",
    );
    let rule = reached(&config, "d", &[("k1", "A"), ("k2", "foo")]);
    assert_eq!(
        (&*rule.path, runtime_named_levels(rule)),
        ("d.k1.k2", vec![true, false])
    );
    let rule = reached(&config, "d", &[("m1", "X"), ("m2", "Y"), ("m3", "Z")]);
    assert_eq!(
        (&*rule.path, runtime_named_levels(rule)),
        ("d.m1.m2.m3", vec![false, true, false])
    );
}

/// DoesNotOverrideDetailedMetric: detailed_metric on the leaf names every level by value.
fn value_to_metric_keeps_detailed_metric() {
    let config = load(
        "dm.yaml",
        "domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
",
    );
    let rule = reached(&config, "domain", &DRAW_GET);
    assert!(rule.detailed_metric);
    assert_eq!(rule.limit, per(60, Unit::Minute));
}

/// WithConfiguredValues: GET and POST are separate rules under one runtime-named route.
fn value_to_metric_with_configured_values() {
    let config = load(
        "cv.yaml",
        "domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
",
    );
    for (method, path, limit) in [
        (
            "GET",
            "test-domain.route.http_method_GET.subject_id",
            per(60, Unit::Minute),
        ),
        (
            "POST",
            "test-domain.route.http_method_POST.subject_id",
            per(30, Unit::Minute),
        ),
    ] {
        let pairs = [
            ("route", "api"),
            ("http_method", method),
            ("subject_id", "u"),
        ];
        let rule = reached(&config, "test-domain", &pairs);
        assert_eq!((&*rule.path, rule.limit), (path, limit));
        assert_eq!(runtime_named_levels(rule), [true, true, false]);
    }
}

/// WithWildcard: a `read*` level with value_to_metric is named by the value it matched.
fn value_to_metric_on_a_wildcard_level() {
    let config = load(
        "w.yaml",
        "domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
",
    );
    for (user, action, resource) in [
        ("alice", "readfile", "documents"),
        ("bob", "readdata", "database"),
    ] {
        let pairs = [("user", user), ("action", action), ("resource", resource)];
        let rule = reached(&config, "domain", &pairs);
        assert_eq!(
            (&*rule.path, rule.limit),
            ("domain.user.action_read*.resource", per(100, Unit::Minute))
        );
        assert_eq!(runtime_named_levels(rule), [true, true, false]);
    }
    assert!(
        reach(
            &config,
            "domain",
            &[("user", "a"), ("action", "write"), ("resource", "r")]
        )
        .is_none()
    );
}
