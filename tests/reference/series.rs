//! The per-rule series named as the reference names its stats: `value_to_metric` within
//! `--detailed-metric-max-values`, and every stats key of `config_test.go`.

use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;

const METRICS: &str = r#"
domain: vtm
descriptors:
  - key: route
    value: /api/*
    value_to_metric: true
    descriptors:
      - key: user
        rate_limit: {unit: day, requests_per_unit: 100}
  - key: plain
    value: /x/*
    rate_limit: {unit: day, requests_per_unit: 100}
"#;

/// `ratelimit_service_rate_limit_total_hits` of domain `vtm` by `key` label, from `/metrics`.
fn total_hits(admin: std::net::SocketAddr) -> Vec<(String, String)> {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200);
    let mut found: Vec<(String, String)> = body
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .filter(|l| l.contains("domain=\"vtm\""))
        .map(|l| {
            let key = l.split("key=\"").nth(1).and_then(|r| r.split('"').next());
            let value = l.rsplit(' ').next().unwrap_or_default();
            (key.unwrap_or_default().to_owned(), value.to_owned())
        })
        .collect();
    found.sort();
    found
}

/// A `value_to_metric` wildcard level names its series by the request's value, bounded by
/// `--detailed-metric-max-values` like `detailed_metric`; a level without it keeps its pattern.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn value_to_metric_names_series_by_the_runtime_value_within_the_bound() {
    let mut s = TestServer::start_with(&[("vtm.yaml", METRICS)], |settings| {
        settings.telemetry.metrics_detailed_max_values = 2;
    })
    .await;
    let route = |r: &str, u: &str| req("vtm", vec![desc(&[("route", r), ("user", u)])]);
    for (r, u) in [
        ("/api/v1", "ann"),
        ("/api/v1", "bob"),
        ("/api/v2", "ann"),
        ("/api/v3", "ann"),
    ] {
        assert_eq!(s.ok(route(r, u)).await.overall_code, OK);
    }
    for x in ["/x/1", "/x/2"] {
        assert_eq!(s.ok(request("vtm", &[("plain", x)])).await.overall_code, OK);
    }
    let admin = s.admin_addr();
    let found = tokio::task::spawn_blocking(move || total_hits(admin))
        .await
        .unwrap();
    let found: Vec<(&str, &str)> = found
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            // Past the bound of two values: counted in the rule's own series.
            ("plain_/x/*", "2"),
            ("route_/api/*.user", "1"),
            ("route_/api/v1.user", "2"),
            ("route_/api/v2.user", "1"),
        ]
    );
    s.stop().await;
}

/// Every `ratelimit_service_rate_limit_total_hits` series counted so far, as
/// `(domain, key, hits)`, sorted, from `/metrics`.
fn counted_series(admin: std::net::SocketAddr) -> Vec<(String, String, u64)> {
    let (status, body) = http_get(admin, "/metrics");
    assert_eq!(status, 200);
    let label = |line: &str, name: &str| {
        line.split(&format!("{name}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default()
            .to_owned()
    };
    let mut found: Vec<(String, String, u64)> = body
        .lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit_total_hits{"))
        .map(|l| {
            let hits = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
            (
                label(l, "domain"),
                label(l, "key"),
                hits.unwrap_or(0.0) as u64,
            )
        })
        .filter(|(_, _, hits)| *hits > 0)
        .collect();
    found.sort();
    found
}

/// The configs of `config_test.go`'s stats-key expectations, one domain per reference config
/// (`basic_config.yaml`, the detailed-metric and value_to_metric inline configs,
/// `share_threshold.yaml`, the wildcard flag cases), written in its shapes.
const STATS: &[(&str, &str)] = &[
    (
        "basic.yaml",
        "domain: test-domain
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
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
",
    ),
    (
        "detailed.yaml",
        "domain: nested-outer
descriptors:
  - key: key-1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: key-2
        rate_limit: {unit: minute, requests_per_unit: 5}
",
    ),
    (
        "detailed-both.yaml",
        "domain: nested-both
descriptors:
  - key: key-1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: key-2
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
",
    ),
    (
        "detailed-none.yaml",
        "domain: nested-none
descriptors:
  - key: key-1
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: key-2
        rate_limit: {unit: minute, requests_per_unit: 5}
",
    ),
    (
        "realistic.yaml",
        "domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
",
    ),
    (
        "v2m.yaml",
        "domain: domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
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
    ),
    (
        "v2m-detailed.yaml",
        "domain: v2m-detailed
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
    ),
    (
        "v2m-levels.yaml",
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
    ),
    (
        "share.yaml",
        "domain: share
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
",
    ),
    (
        "wild.yaml",
        "domain: wild
descriptors:
  - key: plain
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: named
    value: foo*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: shared
    value: foo*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: both
    value: foo*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: outer
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
  - key: mid
    value: foo*bar*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midnamed
    value: foo*bar*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 20}
",
    ),
];

/// Each request of `config_test.go` that names a stats key, with the key it expects — here the
/// `domain` label and the `key` label (the stats key below its domain). Requests of one key are
/// counted together.
#[allow(clippy::type_complexity)]
#[rustfmt::skip] // one request per line: a table
const STATS_KEYS: &[(&str, &[(&str, &str)], &str)] = &[
    // TestBasicConfig: a rule's own series, and key7's per-value ones. key6 is unlimited and
    // counts nothing (the reference gives no limit to the cache).
    ("test-domain", &[("key1", "value1"), ("subkey1", "something")], "key1_value1.subkey1"),
    ("test-domain", &[("key1", "value1"), ("subkey1", "subvalue1")], "key1_value1.subkey1_subvalue1"),
    ("test-domain", &[("key2", "something")], "key2"),
    ("test-domain", &[("key2", "value2")], "key2_value2"),
    ("test-domain", &[("key7", "unspecified_value")], "key7_unspecified_value"),
    ("test-domain", &[("key7", "another_value")], "key7_another_value"),
    // A detailed key joins key and value with `_` even when the value is empty.
    ("test-domain", &[("key7", "")], "key7_"),
    // TestDetailedMetric.
    ("nested-outer", &[("key-1", "value-1")], "key-1_value-1"),
    ("nested-none", &[("key-1", "value-1")], "key-1"),
    ("nested-both", &[("key-1", "value-1"), ("key-2", "value-2")], "key-1_value-1.key-2_value-2"),
    ("nested-none", &[("key-1", "value-1"), ("key-2", "value-2")], "key-1.key-2"),
    ("nested", &[("key_1", "value-for-key-1")], "key_1_value-for-key-1"),
    ("nested", &[("key_2", "key-2-value")], "key_2_key-2-value"),
    (
        "nested",
        &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")],
        "key_2_key-2-value.key_3_requested-key3-value",
    ),
    // TestValueToMetric_*.
    (
        "domain",
        &[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
        "route_draw.http_method_GET.subject_id",
    ),
    (
        "domain",
        &[("route", ""), ("http_method", "GET"), ("subject_id", "123")],
        "route.http_method_GET.subject_id",
    ),
    (
        "domain",
        &[("route", "draw"), ("http_method", ""), ("subject_id", "123")],
        "route_draw.http_method.subject_id",
    ),
    (
        "domain",
        &[("route", ""), ("http_method", ""), ("subject_id", "123")],
        "route.http_method.subject_id",
    ),
    (
        "domain",
        &[("user", "alice"), ("action", "readfile"), ("resource", "documents")],
        "user_alice.action_readfile.resource",
    ),
    (
        "domain",
        &[("user", "bob"), ("action", "readdata"), ("resource", "database")],
        "user_bob.action_readdata.resource",
    ),
    (
        "v2m-detailed",
        &[("route", "draw"), ("http_method", "GET"), ("subject_id", "123")],
        "route_draw.http_method_GET.subject_id_123",
    ),
    ("d", &[("k1", "A"), ("k2", "foo")], "k1_A.k2"),
    ("d", &[("m1", "X"), ("m2", "Y"), ("m3", "Z")], "m1.m2_Y.m3"),
    (
        "d",
        &[("route", "api"), ("http_method", "GET"), ("subject_id", "user123")],
        "route_api.http_method_GET.subject_id",
    ),
    (
        "d",
        &[("route", "api"), ("http_method", "POST"), ("subject_id", "user456")],
        "route_api.http_method_POST.subject_id",
    ),
    // TestShareThreshold.
    ("share", &[("files", "files/a.pdf")], "files_files/*"),
    ("share", &[("files", "files/b.csv")], "files_files/*"),
    ("share", &[("files", "files/c.txt")], "files_files/*"),
    ("share", &[("route", "api/v1"), ("method", "GET")], "route_api/*.method"),
    ("share", &[("service", "svc/user"), ("endpoint", "get")], "service_svc/*.endpoint_get"),
    (
        "share",
        &[("nested", "parent"), ("files", "nested/file1.txt")],
        "nested_parent.files_nested/*",
    ),
    (
        "share",
        &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
        "files_top/*.files_nested/*",
    ),
    (
        "share",
        &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
        "path_path/*.file_file/*.type",
    ),
    (
        "share",
        &[("user", "user/alice"), ("resource", "res/file1"), ("action", "read")],
        "user_user/*.resource_res/*.action",
    ),
    ("share", &[("file", "test1")], "file_test1"),
    ("share", &[("file", "test2")], "file_test*"),
    ("share", &[("file", "test23")], "file_test*"),
    ("share", &[("file", "test123")], "file_test*"),
    ("share", &[("midpath", "/api/v1")], "midpath_/api*v1"),
    ("share", &[("midpath", "/api-beta-v1")], "midpath_/api*v1"),
    ("share", &[("multiroute", "svcXXXepYYYrpc")], "multiroute_svc*ep*rpc"),
    ("share", &[("multiroute", "svceprpc")], "multiroute_svc*ep*rpc"),
    ("share", &[("midroute", "/api/v2")], "midroute_/api*v2"),
    ("share", &[("midroute", "/api-beta-v2")], "midroute_/api*v2"),
    (
        "share",
        &[("tenant", "t1prod"), ("resource", "resAv2")],
        "tenant_t*prod.resource_res*v2",
    ),
    (
        "share",
        &[("tenant", "t99prod"), ("resource", "resBBBv2")],
        "tenant_t*prod.resource_res*v2",
    ),
    // TestWildcardStatsBehavior.
    ("wild", &[("plain", "foo1")], "plain_foo*"),
    ("wild", &[("named", "foo1")], "named_foo1"),
    ("wild", &[("shared", "foo1")], "shared_foo*"),
    ("wild", &[("both", "foo1")], "both_foo*"),
    (
        "wild",
        &[("outer", "foo1"), ("other", "bar"), ("limit", "X")],
        "outer_foo*.other_bar.limit",
    ),
    ("wild", &[("mid", "foo123bar456")], "mid_foo*bar*"),
    ("wild", &[("mid", "fooXbarY")], "mid_foo*bar*"),
    ("wild", &[("midnamed", "foo123bar456")], "midnamed_foo123bar456"),
];

/// The per-rule series are named as envoyproxy/ratelimit names its stats: each request of its
/// config tests is sent once over gRPC, and `/metrics` then holds exactly the expected series,
/// each counting the requests that named it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_are_named_as_the_reference_names_its_stats() {
    let mut s = TestServer::start(STATS).await;
    for (domain, pairs, _) in STATS_KEYS {
        let r = s.ok(req(domain, vec![desc(pairs)])).await;
        assert_eq!(r.overall_code, OK, "{domain} {pairs:?}");
        assert!(
            r.statuses[0].current_limit.is_some(),
            "{domain} {pairs:?} reaches a rule"
        );
    }
    // key6 is unlimited: answered, never counted.
    let r = s.ok(request("test-domain", &[("key6", "foo")])).await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);

    let mut expected: Vec<(String, String, u64)> = Vec::new();
    for (domain, _, key) in STATS_KEYS {
        match expected
            .iter_mut()
            .find(|(d, k, _)| d == domain && k == key)
        {
            Some(series) => series.2 += 1,
            None => expected.push((domain.to_string(), key.to_string(), 1)),
        }
    }
    expected.sort();
    let admin = s.admin_addr();
    let found = tokio::task::spawn_blocking(move || counted_series(admin))
        .await
        .unwrap();
    assert_eq!(found, expected);
    s.stop().await;
}
