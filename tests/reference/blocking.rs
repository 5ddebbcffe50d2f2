//! A blocking `requests_per_unit: 0` rule, a request's limit override of 0, and `replaces`.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
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
