//! envoyproxy/ratelimit's config features through the real gRPC path on the memory backend:
//! a blocking `requests_per_unit: 0` rule.

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
