//! The lookup expectations of envoyproxy/ratelimit's `test/config/config_test.go`, restated for
//! sluice: for each request its tests make, the rule sluice reaches, the limit it carries, and
//! what the per-rule metrics are named from — the rule's `path` (the reference's stats key of a
//! rule without per-value naming) and the flags that make the service name a series by runtime
//! values instead (`detailed_metric`, `value_to_metric` levels, `share_threshold` patterns).
//! The series names the service builds from these are checked through gRPC and `/metrics` in
//! the service crate's `tests/reference.rs`.
//!
//! The configs are written here in the shape of the reference's fixtures (`basic_config.yaml`,
//! `shadowmode_config.yaml`, `share_threshold.yaml`) and of its inline test configs; they are
//! not copies.

use std::sync::Arc;

use sluice_core::config::{Config, load_sources};
use sluice_core::request::Entry;
use sluice_core::rule::{Limit, RateLimit, Rule, Unit};

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

    // The reference's "realistic" nested example.
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
    let request = [
        ("route", "draw"),
        ("http_method", "GET"),
        ("subject_id", "123"),
    ];

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

    // DefaultKeyIncludesValueAtThatLevel (d.k1_A.k2) and MidLevelOnly (d.k1.k2_Y.k3).
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

    // DoesNotOverrideDetailedMetric: detailed_metric on the leaf names every level by value.
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
    let rule = reached(&config, "domain", &request);
    assert!(rule.detailed_metric);
    assert_eq!(rule.limit, per(60, Unit::Minute));

    // WithConfiguredValues: GET and POST are separate rules under one runtime-named route.
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

    // WithWildcard: a `read*` level with value_to_metric is named by the value it matched.
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

/// The shape of `share_threshold.yaml`.
const SHARE_THRESHOLD: &str = "domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: {unit: minute, requests_per_unit: 150}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 80}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
";

/// TestShareThreshold: every value a shared wildcard matches reaches one rule, whose pattern
/// stands for the value at that level (one bucket, and one series named by the pattern).
#[test]
fn share_threshold_lookups() {
    let config = load("share_threshold.yaml", SHARE_THRESHOLD);
    type Case<'a> = (&'a [&'a [(&'a str, &'a str)]], &'a str, u32, &'a [&'a str]);
    let cases: &[Case] = &[
        (
            &[
                &[("files", "files/a.pdf")],
                &[("files", "files/b.csv")],
                &[("files", "files/c.txt")],
            ],
            "test-domain.files_files/*",
            100,
            &["files/*"],
        ),
        (
            &[&[("route", "api/v1"), ("method", "GET")]],
            "test-domain.route_api/*.method",
            60,
            &["api/*", ""],
        ),
        (
            &[&[("service", "svc/user"), ("endpoint", "get")]],
            "test-domain.service_svc/*.endpoint",
            80,
            &["svc/*", ""],
        ),
        (
            &[&[("nested", "parent"), ("files", "nested/file1.txt")]],
            "test-domain.nested_parent.files_nested/*",
            200,
            &["", "nested/*"],
        ),
        (
            &[&[("files", "top/file1.txt"), ("files", "nested/file1.txt")]],
            "test-domain.files_top/*.files_nested/*",
            300,
            &["top/*", "nested/*"],
        ),
        (
            &[&[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")]],
            "test-domain.path_path/*.file_file/*.type",
            120,
            &["path/*", "", ""],
        ),
        (
            &[&[
                ("user", "user/alice"),
                ("resource", "res/file1"),
                ("action", "read"),
            ]],
            "test-domain.user_user/*.resource_res/*.action",
            150,
            &["user/*", "res/*", ""],
        ),
        (
            &[
                &[("file", "test2")],
                &[("file", "test23")],
                &[("file", "test123")],
            ],
            "test-domain.file_test*",
            100,
            &["test*"],
        ),
        (
            &[
                &[("midpath", "/api/v1")],
                &[("midpath", "/api-beta-v1")],
                &[("midpath", "/apiXYZv1")],
            ],
            "test-domain.midpath_/api*v1",
            100,
            &["/api*v1"],
        ),
        (
            &[
                &[("multiroute", "svcAepBrpc")],
                &[("multiroute", "svcXXXepYYYrpc")],
                &[("multiroute", "svceprpc")],
            ],
            "test-domain.multiroute_svc*ep*rpc",
            50,
            &["svc*ep*rpc"],
        ),
        (
            &[&[("midroute", "/api/v2")], &[("midroute", "/api-beta-v2")]],
            "test-domain.midroute_/api*v2",
            80,
            &["/api*v2"],
        ),
        (
            &[
                &[("tenant", "t1prod"), ("resource", "resAv2")],
                &[("tenant", "t99prod"), ("resource", "resBBBv2")],
            ],
            "test-domain.tenant_t*prod.resource_res*v2",
            60,
            &["t*prod", "res*v2"],
        ),
    ];
    for (requests, path, limit, patterns) in cases {
        let first = reached(&config, "test-domain", requests[0]);
        for pairs in *requests {
            let rule = reached(&config, "test-domain", pairs);
            assert!(Arc::ptr_eq(rule, first), "{pairs:?}: one rule for all");
            assert_eq!(
                (&*rule.path, rule.limit, shared_patterns(rule)),
                (*path, per(*limit, Unit::Minute), patterns.to_vec()),
                "{pairs:?}"
            );
        }
    }
    // The explicit value keeps its own rule and bucket.
    let test1 = reached(&config, "test-domain", &[("file", "test1")]);
    assert_eq!(
        (&*test1.path, test1.limit, shared_patterns(test1)),
        ("test-domain.file_test1", per(50, Unit::Minute), vec![])
    );
    // The detailed leaf under a shared level: per-value series, the shared level still named
    // by its pattern (`service_svc/*.endpoint_get`).
    let detailed = reached(
        &config,
        "test-domain",
        &[("service", "svc/user"), ("endpoint", "get")],
    );
    assert!(detailed.detailed_metric);
    for unmatched in [
        &[("midpath", "/api/v2")][..],
        &[("multiroute", "svcABCrpc")],
    ] {
        assert!(
            reach(&config, "test-domain", unmatched).is_none(),
            "{unmatched:?}"
        );
    }
}

/// TestWildcardStatsBehavior: trailing and middle wildcards behave alike under each flag.
#[test]
fn wildcard_flags_behave_alike_for_every_wildcard_shape() {
    for pattern in ["foo*", "foo*bar*"] {
        let value = if pattern == "foo*" {
            "foo1"
        } else {
            "foo123bar456"
        };
        for (flags, runtime_named, shared) in [
            ("", vec![], vec![]),
            ("value_to_metric: true", vec![true], vec![]),
            ("share_threshold: true", vec![], vec![pattern]),
            (
                "share_threshold: true\n    value_to_metric: true",
                vec![true],
                vec![pattern],
            ),
        ] {
            let config = load(
                "w.yaml",
                &format!(
                    "domain: test-domain
descriptors:
  - key: wild
    value: {pattern}
    {flags}
    rate_limit: {{unit: minute, requests_per_unit: 20}}
"
                ),
            );
            let rule = reached(&config, "test-domain", &[("wild", value)]);
            assert_eq!(
                (
                    &*rule.path,
                    rule.limit,
                    runtime_named_levels(rule),
                    shared_patterns(rule)
                ),
                (
                    &*format!("test-domain.wild_{pattern}"),
                    per(20, Unit::Minute),
                    runtime_named.clone(),
                    shared.clone()
                ),
                "{pattern} with `{flags}`"
            );
        }
    }
    // value_to_metric on another level keeps the wildcard's pattern in the name.
    let config = load(
        "o.yaml",
        "domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
",
    );
    let rule = reached(
        &config,
        "test-domain",
        &[("wild", "foo1"), ("other", "bar"), ("limit", "X")],
    );
    assert_eq!(&*rule.path, "test-domain.wild_foo*.other.limit");
    assert_eq!(runtime_named_levels(rule), [false, true, false]);
}

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
