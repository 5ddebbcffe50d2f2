//! sluice's Rate Limit Quota Service behind a real Envoy's `rate_limit_quota` filter: the shipped
//! bootstrap and config, and a rule enforced by Envoy from sluice's assignments. Envoy must
//! never crash (its filter segfaults on a token bucket in `no_assignment_behavior`), and what it
//! admits stays within the documented bound.

use std::time::Duration;

use serde_json::json;
use sluice_harness::rlqs_envoy::{
    DATA_PLANE_SLACK, TIGHT_RULE, assert_within_bound, assignments_sent, bucket_settings, get_all,
    hammer, now, quota_bootstrap, wait_for_assignment,
};
use sluice_harness::{Bootstrap, Envoy, HttpClient, SluiceProcess, concurrently};

/// `deploy/envoy/envoy-rlqs.yaml` and `config/` as shipped (ports substituted), sluice's
/// defaults: tenants are served through their assignments and Envoy survives every state a
/// bucket goes through (first request, assignment, renewal).
#[test]
fn the_shipped_rlqs_bootstrap_never_crashes_envoy() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let sluice = SluiceProcess::start_with_config(&root.join("config"), &[]);
    let mut bootstrap = Bootstrap::from_file(&root.join("deploy/envoy/envoy-rlqs.yaml"));
    bootstrap.set_endpoints("sluice", &[sluice.grpc]);
    let mut envoy = Envoy::start(&bootstrap);
    let mut client = envoy.client();
    let mut statuses = Vec::new();
    for (tenant, plan) in [
        (&b"acme"[..], &b"paid"[..]),
        (b"globex", b"free"),
        (b"", b""),
    ] {
        let headers: Vec<(&str, &[u8])> = [("x-tenant-id", tenant), ("x-plan", plan)]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect();
        statuses.extend(get_all(&mut client, &headers, 5));
        assert!(envoy.is_running(), "Envoy crashed; log:\n{}", envoy.log());
    }
    wait_for_assignment(&sluice);
    // Past the first assignments' renewal (push every 1 s, TTL 3 s), at half the tenant rule's
    // 10 per second.
    let until = now() + Duration::from_millis(3_500);
    while now() < until {
        statuses.extend(get_all(&mut client, &[("x-tenant-id", b"acme")], 1));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(envoy.is_running(), "Envoy crashed; log:\n{}", envoy.log());
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every tenant is within its limit: {statuses:?}"
    );
}

/// A rule far above the traffic: every request passes, before and after the assignments
/// arrive and while they are renewed (an assignment TTL Envoy truncates to 0 s denied 99.9 %).
#[test]
fn assignments_outlive_their_arrival_in_envoy() {
    let rules = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"#;
    let sluice = SluiceProcess::start(&[("edge.yaml", rules)], &[]);
    let envoy = Envoy::start(&quota_bootstrap(&[sluice.grpc]));
    let mut client = envoy.client();
    let user: &[(&str, &[u8])] = &[("x-user", b"fast")];
    let mut statuses = get_all(&mut client, user, 5);
    wait_for_assignment(&sluice);
    let until = now() + Duration::from_secs(4);
    while now() < until {
        statuses.extend(get_all(&mut client, user, 20));
    }
    let denied = statuses.iter().filter(|s| **s != 200).count();
    println!("{} requests, {denied} denied", statuses.len());
    assert_eq!(denied, 0);
    let kinds = |kind: &str| assignments_sent(&sluice, kind);
    assert!(
        kinds("token_bucket") > 0.0,
        "a prepaid token bucket was assigned"
    );
}

/// A rule whose burst lasts less than a push interval (10,000 a second, burst 1,000: 100 ms of
/// it, pushed every 200 ms): each share's part of the capacity cannot pay a bucket of a push's
/// rate as well as the push's rate, and the bucket Envoy gets must still hold more than one
/// token. Five clients send one request each at the same moment every 50 ms (100 a second, far
/// below the share): Envoy admits every one. A one-token bucket refused 4 of each 5.
#[test]
fn bunched_requests_far_below_the_share_are_all_admitted() {
    let rules = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10000, burst: 1000}
"#;
    let sluice = SluiceProcess::start(&[("edge.yaml", rules)], &[]);
    let envoy = Envoy::start(&quota_bootstrap(&[sluice.grpc]));
    let user: &[(&str, &[u8])] = &[("x-user", b"bunched")];
    let mut first = envoy.client();
    assert_eq!(first.get("/", user).status, 200);
    wait_for_assignment(&sluice);
    const CLIENTS: usize = 5;
    let statuses = concurrently(CLIENTS, |_, bunch| {
        let mut client = envoy.client();
        // 3 s, past several pushes and Envoy's first demand-based share.
        (0..60)
            .map(|_| {
                bunch.wait();
                let status = client.get("/", user).status;
                std::thread::sleep(Duration::from_millis(50));
                status
            })
            .collect()
    });
    let denied = statuses.iter().filter(|s| **s != 200).count();
    println!(
        "{} requests in bunches of {CLIENTS}, {denied} denied",
        statuses.len()
    );
    assert_eq!(denied, 0, "{statuses:?}");
    assert!(assignments_sent(&sluice, "token_bucket") > 1.0);
}

/// A slow rule (`20 per day`) still admits through Envoy: a token every 72 minutes, the bucket
/// starting full with the rule's burst, not DENY_ALL for a share below one token an hour.
#[test]
fn a_rule_of_twenty_a_day_admits_through_envoy() {
    let rules = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 20}
"#;
    let sluice = SluiceProcess::start(&[("edge.yaml", rules)], &[]);
    let envoy = Envoy::start(&quota_bootstrap(&[sluice.grpc]));
    let mut client = envoy.client();
    let user: &[(&str, &[u8])] = &[("x-user", b"slow")];
    // The first request is admitted by Envoy's default before any assignment.
    assert_eq!(client.get("/", user).status, 200);
    wait_for_assignment(&sluice);
    let kinds = |kind: &str| assignments_sent(&sluice, kind);
    assert!(kinds("token_bucket") > 0.0, "a token bucket, not DENY_ALL");
    assert_eq!(kinds("deny_all"), 0.0);
    // The assigned bucket starts full with the rule's burst (20, less the first request and the
    // pool's one-token reserve), then refills a token every 72 minutes.
    let statuses = get_all(&mut client, user, 20);
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        (15..20).contains(&admitted),
        "most of the day's burst at once, never more: {statuses:?}"
    );
    assert_eq!(
        statuses[..admitted],
        vec![200; admitted][..],
        "{statuses:?}"
    );
    assert_eq!(statuses[19], 429, "{statuses:?}");
}

/// A rule of capacity 1 (`1/minute`, as a token bucket and as a fixed window) behind an Envoy that
/// denies until its first assignment: that first assignment is a token bucket holding the one
/// token (not DENY_ALL until the bucket refills a minute later), so the next request is admitted
/// within a push of the first, and the one after it is denied. docs/rlqs.md, "Small rules".
#[test]
fn a_rule_of_one_a_minute_admits_its_token_at_the_first_assignment() {
    for algorithm in ["token_bucket", "fixed_window"] {
        let rules = format!(
            "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {{unit: minute, requests_per_unit: 1, algorithm: {algorithm}}}\n"
        );
        let sluice = SluiceProcess::start(&[("edge.yaml", &rules)], &[]);
        let mut bootstrap = quota_bootstrap(&[sluice.grpc]);
        bucket_settings(&mut bootstrap)["no_assignment_behavior"] =
            json!({"fallback_rate_limit": {"blanket_rule": "DENY_ALL"}});
        let mut envoy = Envoy::start(&bootstrap);
        let mut client = envoy.client();
        let user: &[(&str, &[u8])] = &[("x-user", b"once")];
        let started = now();
        assert_eq!(
            client.get("/", user).status,
            429,
            "{algorithm}: no assignment yet"
        );
        wait_for_assignment(&sluice);
        let admitted_after = loop {
            if client.get("/", user).status == 200 {
                break started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{algorithm}: the minute's token was not admitted within 10 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(
            client.get("/", user).status,
            429,
            "{algorithm}: one a minute"
        );
        println!(
            "RLQS 1/minute {algorithm}: admitted {} ms after the first request",
            admitted_after.as_millis()
        );
        assert!(assignments_sent(&sluice, "token_bucket") > 0.0);
        assert_eq!(assignments_sent(&sluice, "deny_all"), 0.0, "{algorithm}");
        assert!(envoy.is_running(), "Envoy crashed; log:\n{}", envoy.log());
    }
}

/// Redis gone: each rule's `failure_mode` becomes an assignment Envoy enforces — `open` a
/// tight bucket turns ALLOW_ALL, `closed` a roomy one turns DENY_ALL — within a few pushes; Redis
/// back: token buckets again, neither left as the failure mode made it.
#[test]
fn redis_down_becomes_each_rules_failure_mode_in_envoy() {
    let rules = r#"
domain: edge
descriptors:
  - key: user
    value: open
    failure_mode: open
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    value: closed
    failure_mode: closed
    rate_limit: {unit: second, requests_per_unit: 100000}
"#;
    let mut redis = sluice_harness::RedisServer::start();
    let sluice = SluiceProcess::start_on_redis(&[("edge.yaml", rules)], &redis);
    let mut envoy = Envoy::start(&quota_bootstrap(&[sluice.grpc]));
    let mut client = envoy.client();
    let open: &[(&str, &[u8])] = &[("x-user", b"open")];
    let closed: &[(&str, &[u8])] = &[("x-user", b"closed")];
    get_all(&mut client, open, 1);
    get_all(&mut client, closed, 1);
    wait_for_assignment(&sluice);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        get_all(&mut client, open, 3),
        [429; 3],
        "1 per minute, spent"
    );
    assert_eq!(get_all(&mut client, closed, 3), [200; 3]);
    redis.kill();
    sluice_harness::wait_until(
        "failure-mode assignments enforced by Envoy",
        Duration::from_secs(10),
        || {
            let o = client.get("/", open).status;
            let c = client.get("/", closed).status;
            std::thread::sleep(Duration::from_millis(50));
            o == 200 && c == 429
        },
    );
    assert_eq!(get_all(&mut client, open, 5), [200; 5], "open: ALLOW_ALL");
    assert_eq!(
        get_all(&mut client, closed, 5),
        [429; 5],
        "closed: DENY_ALL"
    );
    // Redis back (empty: every bucket full): token buckets again, the closed rule not left
    // denied, the open one limited again.
    let buckets = assignments_sent(&sluice, "token_bucket");
    redis.start_again();
    let back = now();
    sluice_harness::wait_until(
        "token buckets enforced again",
        Duration::from_secs(15),
        || {
            let c = client.get("/", closed).status;
            let o = client.get("/", open).status;
            std::thread::sleep(Duration::from_millis(50));
            c == 200 && o == 429 && assignments_sent(&sluice, "token_bucket") > buckets
        },
    );
    println!(
        "Redis back: closed admits and open is limited again {:.2} s after the restart",
        back.elapsed().as_secs_f64()
    );
    assert_eq!(get_all(&mut client, closed, 3), [200; 3]);
    assert!(envoy.is_running(), "Envoy crashed; log:\n{}", envoy.log());
}

/// Envoys spread over sluice replicas on one Redis, the same user hammered through every Envoy
/// for 6 s: one limit, C + r·T + each data plane's slack (two Envoys on two replicas once
/// admitted 7.5 × the bound: each replica granted its Envoy the whole rule).
fn envoys_share_one_limit(envoy_count: usize, replica_count: usize) {
    let redis = sluice_harness::RedisServer::start();
    let replicas: Vec<SluiceProcess> = (0..replica_count)
        .map(|_| SluiceProcess::start_on_redis(&[("edge.yaml", TIGHT_RULE)], &redis))
        .collect();
    let mut envoys: Vec<Envoy> = (0..envoy_count)
        .map(|i| Envoy::start(&quota_bootstrap(&[replicas[i % replica_count].grpc])))
        .collect();
    let mut clients: Vec<HttpClient> = envoys.iter().map(Envoy::client).collect();
    let user: &[(&str, &[u8])] = &[("x-user", b"shared")];
    // Each Envoy's first request subscribes the bucket; assignments follow within a round trip.
    let first: usize = clients
        .iter_mut()
        .map(|c| usize::from(c.get("/", user).status == 200))
        .sum();
    for replica in &replicas {
        wait_for_assignment(replica);
    }
    let (admitted, span) = hammer(&mut clients, user);
    for envoy in &mut envoys {
        assert!(envoy.is_running(), "Envoy crashed; log:\n{}", envoy.log());
    }
    assert_within_bound(
        &format!("{envoy_count} Envoy(s) on {replica_count} replica(s)"),
        first + admitted.iter().sum::<usize>(),
        span,
        envoy_count as f64 * DATA_PLANE_SLACK,
    );
}

#[test]
fn one_envoy_enforces_the_rule_within_the_bound() {
    envoys_share_one_limit(1, 1);
}

#[test]
fn two_envoys_on_two_replicas_share_one_limit() {
    envoys_share_one_limit(2, 2);
}

#[test]
fn three_envoys_on_two_replicas_share_one_limit() {
    envoys_share_one_limit(3, 2);
}

/// RLS and RLQS on one rule: one Envoy asks per request (ratelimit filter), another enforces
/// assignments (rate_limit_quota filter), both for `user=both` on one sluice: one bucket, one
/// limit (C + r·T + the RLQS data plane's slack).
#[test]
fn rls_and_rlqs_envoys_share_one_bucket() {
    let sluice = SluiceProcess::start(&[("edge.yaml", TIGHT_RULE)], &[]);
    let mut rls = Bootstrap::rls("edge", &[sluice.grpc]);
    rls.virtual_host()["rate_limits"] = json!([{"actions": [{"request_headers": {
        "header_name": "x-user", "descriptor_key": "user"}}]}]);
    let rls = Envoy::start(&rls);
    let rlqs = Envoy::start(&quota_bootstrap(&[sluice.grpc]));
    let user: &[(&str, &[u8])] = &[("x-user", b"both")];
    let mut clients = [rlqs.client(), rls.client()];
    let first = usize::from(clients[0].get("/", user).status == 200);
    wait_for_assignment(&sluice);
    let (admitted, span) = hammer(&mut clients, user);
    println!(
        "RLQS {} + RLS {} admitted",
        first + admitted[0],
        admitted[1]
    );
    assert_within_bound(
        "RLS + RLQS on one rule",
        first + admitted[0] + admitted[1],
        span,
        DATA_PLANE_SLACK,
    );
    assert!(admitted[1] > 0, "RLS still admits from the shared bucket");
    assert_eq!(rls.ratelimit_stat("app", "error"), 0);
}
