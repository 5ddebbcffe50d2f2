//! End-to-end through the real gRPC path on the embedded memory backend: Envoy's own client in,
//! `RateLimitResponse` out.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;
use tonic::Code;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 3, name: tenant-default}
    descriptors:
      - key: route
        value: export
        cost: 2
        rate_limit: {unit: hour, requests_per_unit: 6}
  - key: tenant
    value: internal-*
    rate_limit: {unlimited: true}
  - key: remote_address
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: plan
    value: free
    descriptors:
      - key: tenant
        rate_limit: {unit: minute, requests_per_unit: 1, name: free-tenant, replaces: [{name: tenant-default}]}
  - key: burst
    rate_limit: {unit: day, requests_per_unit: 2, burst: 5}
"#;

async fn server() -> TestServer {
    TestServer::start(&[("edge.yaml", CONFIG)]).await
}

#[tokio::test]
async fn allows_up_to_capacity_then_rejects_with_headers() {
    let mut s = server().await;
    for expected_remaining in [2u32, 1, 0] {
        let r = s.ok(req("edge", vec![desc(&[("tenant", "acme")])])).await;
        assert_eq!(r.overall_code, OK);
        let st = &r.statuses[0];
        assert_eq!(st.code, OK);
        assert_eq!(st.limit_remaining, expected_remaining);
        let limit = st.current_limit.as_ref().expect("current_limit");
        assert_eq!(limit.requests_per_unit, 3);
        assert_eq!(limit.unit, 2, "MINUTE");
        assert_eq!(limit.name, "tenant-default");
        assert!(st.duration_until_reset.is_some());
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("3, 3;w=60"));
        assert_eq!(
            header(&r, "x-ratelimit-remaining"),
            Some(expected_remaining.to_string().as_str())
        );
        assert!(header(&r, "retry-after").is_none());
    }
    let r = s.ok(req("edge", vec![desc(&[("tenant", "acme")])])).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(r.statuses[0].code, OVER_LIMIT);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    // 3 per minute: one token every 20 s; the wait is rounded up to whole seconds.
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((19..=20).contains(&retry), "retry-after {retry}");
    let reset: u64 = header(&r, "x-ratelimit-reset").unwrap().parse().unwrap();
    assert!((59..=60).contains(&reset), "reset {reset}");
    // Another client has its own bucket.
    let r = s.ok(req("edge", vec![desc(&[("tenant", "other")])])).await;
    assert_eq!(r.overall_code, OK);
    s.stop().await;
}

#[tokio::test]
async fn rejected_request_takes_no_tokens_from_any_descriptor() {
    let mut s = server().await;
    // Drain the export bucket (6 tokens, cost 2 → 3 hits).
    for _ in 0..3 {
        let r = s
            .ok(req(
                "edge",
                vec![desc(&[("tenant", "t1"), ("route", "export")])],
            ))
            .await;
        assert_eq!(r.overall_code, OK);
    }
    // tenant t1 has its full 3; the export bucket is empty: the pair is rejected...
    let pair = || {
        req(
            "edge",
            vec![
                desc(&[("tenant", "t1")]),
                desc(&[("tenant", "t1"), ("route", "export")]),
            ],
        )
    };
    for _ in 0..5 {
        let r = s.ok(pair()).await;
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(r.statuses[0].code, OK);
        assert_eq!(r.statuses[0].limit_remaining, 3, "untouched");
        assert_eq!(r.statuses[1].code, OVER_LIMIT);
    }
    // ...and the tenant bucket still holds all its tokens.
    let r = s.ok(req("edge", vec![desc(&[("tenant", "t1")])])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    s.stop().await;
}

#[tokio::test]
async fn hits_addend_and_cost_weigh_hits() {
    let mut s = server().await;
    // Request-level hits_addend 2 × cost 2 = 4 of 6.
    let mut r = req("edge", vec![desc(&[("tenant", "w"), ("route", "export")])]);
    r.hits_addend = 2;
    let resp = s.ok(r).await;
    assert_eq!(
        resp.statuses[0].limit_remaining, 1,
        "2 tokens left: one hit at cost 2 (remaining counts hits)"
    );
    // Descriptor-level hits_addend wins over the request's: 1 × 2 = 2 → 0 left.
    let mut d = desc(&[("tenant", "w"), ("route", "export")]);
    d.hits_addend = Some(UInt64Value { value: 1 });
    let mut r = req("edge", vec![d]);
    r.hits_addend = 50;
    let resp = s.ok(r).await;
    assert_eq!(resp.overall_code, OK);
    assert_eq!(resp.statuses[0].limit_remaining, 0);
    // hits_addend 0 at the descriptor checks without taking: empty bucket → over.
    let mut d = desc(&[("tenant", "w"), ("route", "export")]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let resp = s.ok(req("edge", vec![d])).await;
    assert_eq!(resp.overall_code, OVER_LIMIT);
    // A check on a fresh bucket is OK and takes nothing.
    let mut d = desc(&[("tenant", "fresh")]);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let resp = s.ok(req("edge", vec![d])).await;
    assert_eq!(resp.overall_code, OK);
    assert_eq!(resp.statuses[0].limit_remaining, 3);
    s.stop().await;
}

#[tokio::test]
async fn huge_hits_addend_is_rejected_without_panic() {
    let mut s = server().await;
    let mut d = desc(&[("tenant", "huge")]);
    d.hits_addend = Some(UInt64Value { value: u64::MAX });
    let resp = s.ok(req("edge", vec![d])).await;
    assert_eq!(resp.overall_code, OVER_LIMIT);
    // Never satisfiable: no retry-after is promised.
    assert!(header(&resp, "retry-after").is_none());
    let mut r = req("edge", vec![desc(&[("tenant", "huge2")])]);
    r.hits_addend = u32::MAX;
    assert_eq!(s.ok(r).await.overall_code, OVER_LIMIT);
    // The server still answers.
    assert_eq!(
        s.ok(req("edge", vec![desc(&[("tenant", "huge")])]))
            .await
            .overall_code,
        OK
    );
    s.stop().await;
}

#[tokio::test]
async fn negative_hits_refund_capped_at_capacity() {
    let mut s = server().await;
    for _ in 0..3 {
        s.ok(req("edge", vec![desc(&[("tenant", "r")])])).await;
    }
    let mut d = desc(&[("tenant", "r")]);
    d.is_negative_hits = true;
    d.hits_addend = Some(UInt64Value { value: 100 });
    let resp = s.ok(req("edge", vec![d])).await;
    assert_eq!(resp.overall_code, OK);
    assert_eq!(resp.statuses[0].limit_remaining, 3, "capped at capacity");
    s.stop().await;
}

#[tokio::test]
async fn limit_override_replaces_the_configured_rate() {
    let mut s = server().await;
    let mut d = desc(&[("tenant", "o")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 1, // SECOND
    });
    let r1 = s.ok(req("edge", vec![d.clone()])).await;
    assert_eq!(r1.overall_code, OK);
    let limit = r1.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (1, 1));
    let r2 = s.ok(req("edge", vec![d.clone()])).await;
    assert_eq!(r2.overall_code, OVER_LIMIT);
    // The configured bucket of the same client is separate and untouched.
    let r3 = s.ok(req("edge", vec![desc(&[("tenant", "o")])])).await;
    assert_eq!(r3.statuses[0].limit_remaining, 2);
    // An override applies even where no rule matches (the domain must exist).
    let mut d = desc(&[("nothing", "here")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 2,
    });
    assert_eq!(s.ok(req("edge", vec![d.clone()])).await.overall_code, OK);
    assert_eq!(
        s.ok(req("edge", vec![d.clone()])).await.overall_code,
        OVER_LIMIT
    );
    // ...but not for an unknown domain.
    assert_eq!(s.ok(req("nope", vec![d.clone()])).await.overall_code, OK);
    assert_eq!(s.ok(req("nope", vec![d])).await.overall_code, OK);
    s.stop().await;
}

#[tokio::test]
async fn shadow_mode_counts_but_never_rejects() {
    let mut s = server().await;
    for _ in 0..5 {
        let r = s
            .ok(req("edge", vec![desc(&[("remote_address", "10.0.0.1")])]))
            .await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].code, OK);
    }
    s.stop().await;
}

#[tokio::test]
async fn unknown_domain_unmatched_and_unlimited_are_ok() {
    let mut s = server().await;
    let r = s
        .ok(req("no-such-domain", vec![desc(&[("tenant", "x")])]))
        .await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses.len(), 1);
    assert_eq!(r.statuses[0].code, OK);
    assert!(r.statuses[0].current_limit.is_none());

    let r = s.ok(req("edge", vec![desc(&[("color", "red")])])).await;
    assert_eq!(r.statuses[0].code, OK);
    assert!(r.statuses[0].current_limit.is_none());

    for _ in 0..10 {
        let r = s
            .ok(req("edge", vec![desc(&[("tenant", "internal-billing")])]))
            .await;
        assert_eq!(r.overall_code, OK);
        assert!(r.statuses[0].current_limit.is_none());
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    }
    s.stop().await;
}

#[tokio::test]
async fn replaces_drops_the_replaced_rule() {
    let mut s = server().await;
    let pair = || {
        req(
            "edge",
            vec![
                desc(&[("tenant", "f")]),
                desc(&[("plan", "free"), ("tenant", "f")]),
            ],
        )
    };
    let r = s.ok(pair()).await;
    assert_eq!(r.overall_code, OK);
    assert!(
        r.statuses[0].current_limit.is_none(),
        "tenant-default replaced"
    );
    assert_eq!(
        r.statuses[1].current_limit.as_ref().unwrap().name,
        "free-tenant"
    );
    let r = s.ok(pair()).await;
    assert_eq!(r.overall_code, OVER_LIMIT, "free-tenant allows 1/minute");
    assert_eq!(r.statuses[0].code, OK);
    // Alone, the tenant rule applies as usual with all its tokens.
    let r = s.ok(req("edge", vec![desc(&[("tenant", "f")])])).await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    s.stop().await;
}

#[tokio::test]
async fn burst_sets_capacity() {
    let mut s = server().await;
    for i in 0..5 {
        let r = s.ok(req("edge", vec![desc(&[("burst", "b")])])).await;
        assert_eq!(r.overall_code, OK, "hit {i}");
        // 5 hits when full; an empty bucket takes 2.5 days (2 per day) to hold 5 again.
        assert_eq!(header(&r, "x-ratelimit-limit"), Some("5, 5;w=216000"));
    }
    assert_eq!(
        s.ok(req("edge", vec![desc(&[("burst", "b")])]))
            .await
            .overall_code,
        OVER_LIMIT
    );
    s.stop().await;
}

#[tokio::test]
async fn duplicate_descriptors_in_one_request_pay_together() {
    let mut s = server().await;
    let twice = || {
        req(
            "edge",
            vec![desc(&[("tenant", "d")]), desc(&[("tenant", "d")])],
        )
    };
    let r = s.ok(twice()).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // 1 token left, 2 needed: rejected, nothing taken.
    let r = s.ok(twice()).await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    let r = s.ok(req("edge", vec![desc(&[("tenant", "d")])])).await;
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    s.stop().await;
}

#[tokio::test]
async fn headers_can_be_switched_off_or_renamed() {
    let mut s = TestServer::start_with(&[("edge.yaml", CONFIG)], |st| {
        st.response_headers = sluice::settings::ResponseHeaders::None
    })
    .await;
    let r = s.ok(req("edge", vec![desc(&[("tenant", "h")])])).await;
    assert!(r.response_headers_to_add.is_empty());
    s.stop().await;

    let mut s = TestServer::start_with(&[("edge.yaml", CONFIG)], |st| {
        st.header_remaining = "ratelimit-remaining".into()
    })
    .await;
    let r = s.ok(req("edge", vec![desc(&[("tenant", "h")])])).await;
    assert_eq!(header(&r, "ratelimit-remaining"), Some("2"));
    assert!(header(&r, "x-ratelimit-remaining").is_none());
    s.stop().await;
}

async fn invalid(
    s: &mut TestServer,
    request: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
    field: &str,
) {
    let err = s.call(request).await.expect_err("rejected");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with(field),
        "message `{}` should name `{field}`",
        err.message()
    );
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_naming_the_field() {
    let mut s = server().await;
    invalid(&mut s, req("", vec![desc(&[("tenant", "a")])]), "domain").await;
    invalid(&mut s, req("edge", vec![]), "descriptors").await;
    invalid(
        &mut s,
        req("edge", vec![desc(&[("tenant", "a")]), desc(&[("", "v")])]),
        "descriptors[1].entries[0].key",
    )
    .await;
    let many: Vec<_> = (0..65)
        .map(|i| desc(&[("tenant", &i.to_string())]))
        .collect();
    invalid(&mut s, req("edge", many), "descriptors").await;
    let deep: Vec<(String, String)> = (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
    let deep: Vec<(&str, &str)> = deep.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    invalid(
        &mut s,
        req("edge", vec![desc(&deep)]),
        "descriptors[0].entries",
    )
    .await;
    let long_key = "k".repeat(257);
    invalid(
        &mut s,
        req("edge", vec![desc(&[(long_key.as_str(), "v")])]),
        "descriptors[0].entries[0].key",
    )
    .await;
    // 64 descriptors of 66 KB: over the 4 MiB message bound.
    let big: Vec<_> = (0..64)
        .map(|i| desc(&[("tenant", &format!("{i}{}", "x".repeat(66_000)))]))
        .collect();
    invalid(&mut s, req("edge", big), "message").await;
    // Decided, not refused: no entries (Envoy's `skip_if_absent`), a long value, and an override
    // of unit UNKNOWN (dropped: the configured rule decides).
    let r = s.ok(req("edge", vec![desc(&[])])).await;
    assert!(r.statuses[0].current_limit.is_none());
    let long_value = "v".repeat(70_000);
    let r = s
        .ok(req("edge", vec![desc(&[("tenant", &long_value)])]))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 2);
    let mut d = desc(&[("tenant", "unknown-unit")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: 0,
    });
    let r = s.ok(req("edge", vec![d])).await;
    let limit = r.statuses[0].current_limit.as_ref().expect("the rule's");
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit),
        ("tenant-default", 3)
    );
    // The server keeps serving valid requests.
    assert_eq!(
        s.ok(req("edge", vec![desc(&[("tenant", "a")])]))
            .await
            .overall_code,
        OK
    );
    s.stop().await;
}

#[tokio::test]
async fn bounds_are_configurable() {
    let mut s = TestServer::start_with(&[("edge.yaml", CONFIG)], |st| st.max_descriptors = 1).await;
    invalid(
        &mut s,
        req(
            "edge",
            vec![desc(&[("tenant", "a")]), desc(&[("tenant", "b")])],
        ),
        "descriptors",
    )
    .await;
    s.stop().await;
}

#[tokio::test]
async fn health_and_admin_endpoints() {
    let s = server().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.grpc_addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }
    let admin = s.admin_addr();
    let (code, body) = tokio::task::spawn_blocking(move || http_get(admin, "/healthz"))
        .await
        .unwrap();
    assert_eq!((code, body.trim()), (200, "ok"));
    let (code, _) = tokio::task::spawn_blocking(move || http_get(admin, "/readyz"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let (code, body) = tokio::task::spawn_blocking(move || http_get(admin, "/config"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(body.contains("tenant-default"), "{json}");
    // Nothing mutates through admin.
    let (code, _) = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut st = std::net::TcpStream::connect(admin).unwrap();
        write!(st, "POST /config HTTP/1.0\r\nContent-Length: 0\r\n\r\n").unwrap();
        let mut t = String::new();
        st.read_to_string(&mut t).unwrap();
        (
            t.split_whitespace().nth(1).unwrap().parse::<u16>().unwrap(),
            (),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 405);
    s.stop().await;
}

#[tokio::test]
async fn invalid_config_refuses_to_start_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    )
    .unwrap();
    let mut settings = sluice::settings::Settings::with_config(dir.path());
    settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
    settings.admin_addr = "127.0.0.1:0".parse().unwrap();
    let err = sluice::server::start(settings)
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(text.contains("bad.yaml:4:"), "{text}");
}

/// `unit_multiplier`: "60 per 30 seconds" and "100 per 5 minutes" answer with their real window
/// (sluice's `w=`, `retry-after`, `duration_until_reset`), and `current_limit` carries the same
/// rate in a unit at least as long as the window (Envoy's `RateLimit` has no multiplier).
#[tokio::test]
async fn a_multiplied_window_is_answered_with_its_real_length() {
    const WINDOWS: &str = r#"
domain: windows
descriptors:
  - key: half_minute
    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 60}
  - key: five_minutes
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: fixed_window}
"#;
    let mut s = TestServer::start(&[("windows.yaml", WINDOWS)]).await;
    let mut heavy = desc(&[("half_minute", "acme")]);
    heavy.hits_addend = Some(UInt64Value { value: 60 });
    let r = s.ok(req("windows", vec![heavy])).await;
    assert_eq!(r.overall_code, OK);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (120, 2),
        "120 per MINUTE"
    );
    assert_eq!(header(&r, "x-ratelimit-limit"), Some("60, 60;w=30"));
    let r = s
        .ok(req("windows", vec![desc(&[("half_minute", "acme")])]))
        .await;
    assert_eq!(r.overall_code, OVER_LIMIT);
    // 2 tokens a second: one more hit in 500 ms, rounded up to a whole second.
    assert_eq!(header(&r, "retry-after"), Some("1"));
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!((29..=30).contains(&reset.seconds), "{reset:?}");

    let r = s
        .ok(req("windows", vec![desc(&[("five_minutes", "acme")])]))
        .await;
    assert_eq!(r.overall_code, OK);
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1_200, 3),
        "1200 per HOUR"
    );
    assert_eq!(header(&r, "x-ratelimit-limit"), Some("100, 100;w=300"));
    // The window is aligned to multiples of 5 minutes on the epoch.
    let reset = r.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!((1..=300).contains(&reset.seconds), "{reset:?}");
    s.stop().await;
}
