//! envoyproxy/ratelimit's `quota_mode`: per descriptor, mixed with ordinary descriptors, global.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;

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
