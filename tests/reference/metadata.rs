//! `--response-dynamic-metadata`.

use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;

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
