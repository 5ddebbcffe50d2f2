//! envoyproxy/ratelimit's config features through the real gRPC path on the memory backend:
//! a blocking `requests_per_unit: 0` rule, `value_to_metric` in the per-rule metrics.

use std::time::Duration;

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
