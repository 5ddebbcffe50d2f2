//! envoyproxy/ratelimit's config features through the real gRPC path on the memory backend:
//! a blocking `requests_per_unit: 0` rule and request override, `replaces`, and the per-rule
//! series named as the reference names its stats (`detailed_metric`, `value_to_metric`,
//! `share_threshold`), request by request from its `test/config/config_test.go`.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;

const CONFIG: &str = r#"
domain: ref
descriptors:
  - key: block
    rate_limit: {unit: minute, requests_per_unit: 0, name: blocked}
  - key: block_shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 2}
"#;

#[tokio::test]
async fn requests_per_unit_zero_rejects_every_request() {
    let mut s = TestServer::start(&[("ref.yaml", CONFIG)]).await;
    for _ in 0..3 {
        let r = s.ok(request("ref", &[("block", "anything")])).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        let status = &r.statuses[0];
        assert_eq!(status.code, OVER_LIMIT);
        let limit = status.current_limit.as_ref().expect("the blocking limit");
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_str()),
            (0, 2, "blocked"),
            "{{0, MINUTE}} under the rule's name"
        );
        assert_eq!(status.limit_remaining, 0);
        // Until the next minute on the clock, as envoyproxy/ratelimit reports it.
        let reset = status.duration_until_reset.as_ref().expect("a reset");
        let reset = Duration::new(reset.seconds as u64, reset.nanos as u32);
        assert!(
            reset > Duration::ZERO && reset <= Duration::from_secs(60),
            "{reset:?}"
        );
        // Waiting does not help: no retry-after.
        assert_eq!(header(&r, "retry-after"), None);
    }
    s.stop().await;
}

/// The request is rejected whatever its other descriptors say, so — all or nothing — their
/// buckets are not charged: the tenant's 2 per day are still there afterwards.
#[tokio::test]
async fn a_blocked_request_charges_none_of_its_other_descriptors() {
    let mut s = TestServer::start(&[("ref.yaml", CONFIG)]).await;
    for _ in 0..5 {
        let r = s
            .ok(request("ref", &[("tenant", "a"), ("block", "x")]))
            .await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(r.statuses[0].code, OK, "not evaluated");
        assert_eq!(r.statuses[1].code, OVER_LIMIT);
    }
    for remaining in [1, 0] {
        let r = s.ok(request("ref", &[("tenant", "a")])).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, remaining);
    }
    s.stop().await;
}

#[tokio::test]
async fn a_blocking_rule_in_shadow_mode_answers_ok() {
    let mut s = TestServer::start(&[("ref.yaml", CONFIG)]).await;
    let r = s.ok(request("ref", &[("block_shadow", "x")])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].code, OK);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );
    s.stop().await;
}

/// A request's own `limit` of 0 requests per unit blocks, as in envoyproxy/ratelimit (whose
/// config lookup turns the override into a `{0, unit}` limit that every hit exceeds): with or
/// without a rule reached, OVER_LIMIT against `{0, unit}` and no name; only an unknown domain
/// lets it through (no limit applies there at all). All or nothing: the request's other
/// descriptors are not charged.
#[tokio::test]
async fn a_limit_override_of_zero_blocks() {
    let mut s = TestServer::start(&[("ref.yaml", CONFIG)]).await;
    let blocking = |pairs: &[(&str, &str)]| {
        let mut d = desc(pairs);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 0,
            unit: 2, // MINUTE
        });
        d
    };
    for blocked in [&[("tenant", "a")][..], &[("nothing", "here")]] {
        for _ in 0..2 {
            let r = s.ok(req("ref", vec![blocking(blocked)])).await;
            assert_eq!(r.overall_code, OVER_LIMIT, "{blocked:?}");
            let status = &r.statuses[0];
            assert_eq!(status.code, OVER_LIMIT);
            let limit = status.current_limit.as_ref().expect("the override's limit");
            assert_eq!(
                (limit.requests_per_unit, limit.unit, limit.name.as_str()),
                (0, 2, "")
            );
            assert_eq!(status.limit_remaining, 0);
            let reset = status.duration_until_reset.as_ref().expect("a reset");
            let reset = Duration::new(reset.seconds as u64, reset.nanos as u32);
            assert!(
                reset > Duration::ZERO && reset <= Duration::from_secs(60),
                "{reset:?}"
            );
        }
    }
    // Beside it, the tenant's bucket (2 a day) is not charged.
    let r = s
        .ok(req(
            "ref",
            vec![desc(&[("tenant", "b")]), blocking(&[("nothing", "here")])],
        ))
        .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].code, OK);
    let r = s.ok(request("ref", &[("tenant", "b")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 1, "the first charge");
    // No domain, no limit.
    let r = s.ok(req("nope", vec![blocking(&[("tenant", "a")])])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].current_limit, None);
    s.stop().await;
}

const REPLACES: &str = r#"
domain: rep
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
"#;

/// A descriptor whose rule another descriptor of the request replaces is answered as
/// envoyproxy/ratelimit answers a descriptor without a limit: OK, no `current_limit`,
/// `limit_remaining` 0, and its bucket is not charged. An `unlimited` rule reports 4294967295.
#[tokio::test]
async fn a_replaced_descriptor_reports_what_the_reference_reports() {
    let mut s = TestServer::start(&[("rep.yaml", REPLACES)]).await;
    let both = || {
        req(
            "rep",
            vec![
                desc(&[("tenant", "t")]),
                desc(&[("plan", "free"), ("tenant", "t")]),
                desc(&[("internal", "x")]),
            ],
        )
    };
    let r = s.ok(both()).await;
    assert_eq!(r.overall_code, OK);
    let replaced = &r.statuses[0];
    assert_eq!(
        (
            replaced.code,
            replaced.current_limit.is_none(),
            replaced.limit_remaining,
            replaced.duration_until_reset.is_none()
        ),
        (OK, true, 0, true)
    );
    let free = r.statuses[1].current_limit.as_ref().unwrap();
    assert_eq!(
        (free.name.as_str(), r.statuses[1].limit_remaining),
        ("free-tenant", 0)
    );
    let unlimited = &r.statuses[2];
    assert_eq!(
        (
            unlimited.code,
            unlimited.current_limit.is_none(),
            unlimited.limit_remaining
        ),
        (OK, true, u32::MAX)
    );
    // The replacing rule is spent; the replaced one was never charged.
    assert_eq!(s.ok(both()).await.overall_code, OVER_LIMIT);
    let r = s.ok(request("rep", &[("tenant", "t")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    s.stop().await;
}

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

const METADATA: &str = r#"
domain: md
descriptors:
  - key: tenant
    metadata: {team: core, tags: {tier: gold}}
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: route
    metadata: {team: edge, owner: ops, tags: {region: eu}}
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: free
    metadata: {team: never}
    rate_limit: {unlimited: true}
"#;

/// `--response-dynamic-metadata`: the domain, every descriptor's entries and `hits_addend`, the
/// request's `hits_addend`, and the rules' `metadata` of the descriptors that passed, merged
/// with the first value of a field kept and objects merged.
#[tokio::test]
async fn dynamic_metadata_carries_the_descriptors_and_the_passed_rules_metadata() {
    let mut s = TestServer::start_with(&[("md.yaml", METADATA)], |settings| {
        settings.response_dynamic_metadata = true;
    })
    .await;
    let three = || {
        let mut r = req(
            "md",
            vec![
                desc(&[("tenant", "a")]),
                desc(&[("route", "r")]),
                desc(&[("free", "x")]),
            ],
        );
        r.hits_addend = 1;
        r
    };
    let first = s.ok(three()).await;
    assert_eq!(first.overall_code, OK);
    let json = struct_json(first.dynamic_metadata.as_ref().expect("dynamic metadata"));
    assert_eq!(
        json,
        serde_json::json!({
            "domain": "md",
            "hitsAddend": 1.0,
            "descriptors": [
                {"entries": ["tenant=a"]},
                {"entries": ["route=r"]},
                {"entries": ["free=x"]},
            ],
            "metadata": {"team": "core", "owner": "ops", "tags": {"tier": "gold", "region": "eu"}},
        })
    );
    // The tenant is over now: only the route's metadata is merged.
    let second = s.ok(three()).await;
    assert_eq!(second.overall_code, OVER_LIMIT);
    let json = struct_json(second.dynamic_metadata.as_ref().unwrap());
    assert_eq!(
        json["metadata"],
        serde_json::json!({"team": "edge", "owner": "ops", "tags": {"region": "eu"}})
    );
    s.stop().await;
}

#[tokio::test]
async fn dynamic_metadata_is_off_by_default() {
    let mut s = TestServer::start(&[("md.yaml", METADATA)]).await;
    let r = s.ok(request("md", &[("route", "r")])).await;
    assert_eq!(r.dynamic_metadata, None);
    s.stop().await;
}

fn struct_json(s: &envoy_types::pb::google::protobuf::Struct) -> serde_json::Value {
    use envoy_types::pb::google::protobuf::value::Kind;
    fn value(v: &envoy_types::pb::google::protobuf::Value) -> serde_json::Value {
        match &v.kind {
            Some(Kind::StringValue(s)) => s.clone().into(),
            Some(Kind::NumberValue(n)) => (*n).into(),
            Some(Kind::BoolValue(b)) => (*b).into(),
            Some(Kind::StructValue(s)) => struct_json(s),
            Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
            Some(Kind::NullValue(_)) | None => serde_json::Value::Null,
        }
    }
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// envoyproxy/ratelimit's `quota_mode`, from its `test/service/ratelimit_test.go` quota cases,
/// through the real path: each descriptor keeps its own status; the request is OVER_LIMIT when an
/// ordinary descriptor is, or when every quota descriptor is. An allowed request takes from every
/// bucket it fits, a quota bucket it does not fit takes nothing, and a rejected request takes
/// nothing anywhere.
const QUOTA: &str = r#"
domain: quota
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: quota1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: quota2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: quota_blocked
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
"#;

fn codes(r: &RateLimitResponse) -> (i32, Vec<i32>) {
    (r.overall_code, r.statuses.iter().map(|s| s.code).collect())
}

fn remaining(r: &RateLimitResponse) -> Vec<u32> {
    r.statuses.iter().map(|s| s.limit_remaining).collect()
}

/// TestServiceQuotaModeOnlySomeOverTheLimit, then TestServiceQuotaModeOnlyAllOverTheLimit.
#[tokio::test]
async fn quota_descriptors_reject_only_when_all_are_over() {
    let mut s = TestServer::start(&[("quota.yaml", QUOTA)]).await;
    let both = || request("quota", &[("quota1", "a"), ("quota2", "a")]);
    let r = s.ok(both()).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert_eq!(remaining(&r), [0, 2]);
    // quota1 is over: reported so, but quota2 fits, so the request passes and only quota2 pays.
    // The headers describe quota2, not the quota descriptor that did not reject.
    for left in [1, 0] {
        let r = s.ok(both()).await;
        assert_eq!(codes(&r), (OK, vec![OVER_LIMIT, OK]));
        assert_eq!(remaining(&r), [0, left]);
        assert_eq!(
            header(&r, "x-ratelimit-remaining"),
            Some(&*left.to_string())
        );
        assert_eq!(header(&r, "retry-after"), None);
    }
    // Both over: rejected, and the wait is the one until the first of them fits again (quota1:
    // 1 per minute; quota2 needs 20 s for one of its 3 per minute).
    let r = s.ok(both()).await;
    assert_eq!(codes(&r), (OVER_LIMIT, vec![OVER_LIMIT, OVER_LIMIT]));
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "retry-after {retry}");
    s.stop().await;
}

/// TestServiceMixedPerDescriptorModes and TestServicePerDescriptorQuotaMode: an ordinary
/// descriptor over rejects whatever the quota ones say; every quota descriptor over rejects
/// though the ordinary one fits; either way nothing is taken.
#[tokio::test]
async fn ordinary_and_quota_descriptors_mixed() {
    let mut s = TestServer::start(&[("quota.yaml", QUOTA)]).await;
    let mixed = |quota: &'static str| request("quota", &[("regular", "x"), (quota, "x")]);
    let r = s.ok(mixed("quota1")).await;
    assert_eq!(codes(&r), (OK, vec![OK, OK]));
    assert_eq!(remaining(&r), [1, 0]);
    // Its only quota descriptor is over: rejected, though the ordinary one fits.
    let r = s.ok(mixed("quota1")).await;
    assert_eq!(codes(&r), (OVER_LIMIT, vec![OK, OVER_LIMIT]));
    // ...and the ordinary bucket was not charged: it still has its second hit.
    let r = s.ok(request("quota", &[("regular", "x")])).await;
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK]), vec![0]));
    // The ordinary one over rejects though the quota one fits, which is not charged either.
    let r = s.ok(mixed("quota2")).await;
    assert_eq!(codes(&r), (OVER_LIMIT, vec![OVER_LIMIT, OK]));
    let r = s.ok(request("quota", &[("quota2", "x")])).await;
    assert_eq!((codes(&r), remaining(&r)), ((OK, vec![OK]), vec![2]));
    s.stop().await;
}

/// A blocking quota descriptor is a quota descriptor over its limit: alone it rejects, beside a
/// quota descriptor that fits it does not.
#[tokio::test]
async fn a_blocking_quota_descriptor_rejects_only_with_the_others() {
    let mut s = TestServer::start(&[("quota.yaml", QUOTA)]).await;
    let r = s.ok(request("quota", &[("quota_blocked", "x")])).await;
    assert_eq!(codes(&r), (OVER_LIMIT, vec![OVER_LIMIT]));
    let pair = || request("quota", &[("quota_blocked", "x"), ("quota1", "y")]);
    let r = s.ok(pair()).await;
    assert_eq!(codes(&r), (OK, vec![OVER_LIMIT, OK]));
    let r = s.ok(pair()).await;
    assert_eq!(codes(&r), (OVER_LIMIT, vec![OVER_LIMIT, OVER_LIMIT]));
    s.stop().await;
}

const PLAIN: &str = r#"
domain: plain
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

/// TestServiceGlobalQuotaMode: `--quota-mode` (QUOTA_MODE) puts every descriptor in quota mode,
/// including, as in envoyproxy/ratelimit, one no rule limits, which counts as a quota descriptor
/// under its limit.
#[tokio::test]
async fn global_quota_mode_treats_every_descriptor_as_quota() {
    let mut s = TestServer::start_with(&[("plain.yaml", PLAIN)], |settings| {
        settings.config_ops.load.quota_mode = true;
    })
    .await;
    let ab = |a: &str, b: &str| request("plain", &[("a", a), ("b", b)]);
    assert_eq!(codes(&s.ok(ab("1", "1")).await), (OK, vec![OK, OK]));
    assert_eq!(
        codes(&s.ok(ab("1", "1")).await),
        (OVER_LIMIT, vec![OVER_LIMIT, OVER_LIMIT])
    );
    // A fresh `b` passes the quota group: allowed, and `b=2` pays.
    assert_eq!(codes(&s.ok(ab("1", "2")).await), (OK, vec![OVER_LIMIT, OK]));
    assert_eq!(
        codes(&s.ok(ab("1", "2")).await),
        (OVER_LIMIT, vec![OVER_LIMIT, OVER_LIMIT])
    );
    let unmatched = request("plain", &[("a", "1"), ("nothing", "here")]);
    assert_eq!(codes(&s.ok(unmatched).await), (OK, vec![OVER_LIMIT, OK]));
    s.stop().await;

    // Without it the same requests are ordinary: one over rejects.
    let mut s = TestServer::start(&[("plain.yaml", PLAIN)]).await;
    assert_eq!(codes(&s.ok(ab("1", "1")).await).0, OK);
    assert_eq!(
        codes(&s.ok(ab("1", "2")).await),
        (OVER_LIMIT, vec![OVER_LIMIT, OK])
    );
    s.stop().await;
}

/// TestServiceQuotaModeWithShadowMode: global shadow mode answers OK whatever the quota
/// descriptors say.
#[tokio::test]
async fn global_shadow_mode_overrides_quota_mode() {
    let mut s = TestServer::start_with(&[("quota.yaml", QUOTA)], |settings| {
        settings.config_ops.load.shadow_mode = true;
    })
    .await;
    let both = || request("quota", &[("quota1", "s"), ("quota_blocked", "s")]);
    for _ in 0..3 {
        assert_eq!(s.ok(both()).await.overall_code, OK);
    }
    s.stop().await;
}
