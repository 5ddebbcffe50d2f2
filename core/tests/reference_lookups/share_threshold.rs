//! `share_threshold.yaml`: wildcard values sharing one bucket, and the wildcard flags behaving
//! alike for every wildcard shape.

use super::*;

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

/// TestShareThreshold's requests, per rule: the requests reaching it, its path, its limit per
/// minute, and the pattern standing for the value at each level.
#[allow(clippy::type_complexity)]
const SHARE_CASES: &[(&[&[(&str, &str)]], &str, u32, &[&str])] = &[
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

/// TestShareThreshold: every value a shared wildcard matches reaches one rule, whose pattern
/// stands for the value at that level (one bucket, and one series named by the pattern).
#[test]
fn share_threshold_lookups() {
    let config = load("share_threshold.yaml", SHARE_THRESHOLD);
    for (requests, path, limit, patterns) in SHARE_CASES {
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
