//! Who may reach what on the admin listener, against `sluice serve` processes: the operator token
//! on writes and identifier reads, the `Host` check, the connection cap that keeps probes
//! answering while hundreds of idle connections are held, and the metrics-only listener.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;
use sluice_harness::rls::{http_get, http_with};
use sluice_harness::{SluiceProcess, sluice_command};

const CONFIG: &str = r#"
domain: ops
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10}
"#;

const RESET: &str = "/buckets?domain=ops&descriptor=tenant%3Dacme";

fn ask(addr: SocketAddr, method: &str, path: &str, host: &str, token: Option<&str>) -> u16 {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Host", host)];
    if let Some(bearer) = &bearer {
        headers.push(("Authorization", bearer.as_str()));
    }
    http_with(addr, method, path, &headers).0
}

fn token_dir(token: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    let path = path.to_str().unwrap().to_owned();
    (dir, path)
}

#[test]
fn writes_and_identifier_reads_need_the_operator_token_and_the_listeners_host() {
    let (_dir, file) = token_dir("first-token");
    let sluice = SluiceProcess::start(
        &[("ops.yaml", CONFIG)],
        &[
            "--admin-write",
            "--admin-token-file",
            &file,
            "--admin-host",
            "sluice.ops.svc",
        ],
    );
    let admin = sluice.admin;
    let host = admin.to_string();
    assert_eq!(ask(admin, "DELETE", RESET, &host, None), 401, "no token");
    assert_eq!(
        ask(admin, "DELETE", RESET, &host, Some("guess")),
        403,
        "wrong token"
    );
    let rebound = ask(
        admin,
        "DELETE",
        RESET,
        "attacker.example",
        Some("first-token"),
    );
    assert_eq!(
        rebound, 403,
        "a DNS-rebinding Host is refused, token or not"
    );
    assert_eq!(ask(admin, "DELETE", RESET, &host, Some("first-token")), 200);
    let named = ask(
        admin,
        "DELETE",
        RESET,
        "sluice.ops.svc:6070",
        Some("first-token"),
    );
    assert_eq!(named, 200, "a name given with --admin-host");
    for path in [
        "/top",
        "/config",
        "/status",
        "/explain?domain=ops&descriptor=tenant%3Dx",
    ] {
        assert_eq!(
            ask(admin, "GET", path, &host, None),
            401,
            "{path} names tenants"
        );
        assert_eq!(
            ask(admin, "GET", path, &host, Some("first-token")),
            200,
            "{path}"
        );
        let foreign = ask(admin, "GET", path, "attacker.example", Some("first-token"));
        assert_eq!(foreign, 403, "{path} from a foreign Host");
    }
    for path in ["/healthz", "/readyz", "/metrics", "/healthcheck", "/"] {
        assert_eq!(
            ask(admin, "GET", path, "attacker.example", None),
            200,
            "{path} is open"
        );
    }
    // The file is read again: a rotated token takes effect on the next request.
    std::fs::write(&file, "second-token").unwrap();
    assert_eq!(ask(admin, "DELETE", RESET, &host, Some("first-token")), 403);
    assert_eq!(
        ask(admin, "DELETE", RESET, &host, Some("second-token")),
        200
    );
    refusals_are_logged_and_counted(&sluice);
}

/// Each refusal reason seen by `sluice` is in its log and in `sluice_admin_refused_total`.
fn refusals_are_logged_and_counted(sluice: &SluiceProcess) {
    let log = sluice.log();
    for reason in ["no_token", "wrong_token", "foreign_host"] {
        assert!(
            log.lines()
                .any(|l| l.contains("admin request refused") && l.contains(reason)),
            "{reason} logged:\n{log}"
        );
        let refused = sluice.metric("sluice_admin_refused_total", &[("reason", reason)]);
        assert!(refused >= 1.0, "{reason} counted: {refused}");
    }
}

#[test]
fn admin_write_without_a_token_file_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ops.yaml"), CONFIG).unwrap();
    let out = sluice_command()
        .args(["serve", "--config"])
        .arg(dir.path())
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .arg("--admin-write")
        .output()
        .expect("sluice runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--admin-write needs --admin-token-file"),
        "{stderr}"
    );
}

/// Whether the server closed `stream` (EOF or reset) within `wait`.
fn closed(mut stream: &TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn probes_answer_while_hundreds_of_idle_connections_are_held() {
    const HELD: usize = 300;
    let sluice = SluiceProcess::start(
        &[("ops.yaml", CONFIG)],
        &[
            "--admin-max-connections",
            "40",
            "--admin-header-timeout",
            "3s",
        ],
    );
    let held: Vec<TcpStream> = (0..HELD)
        .map(|_| TcpStream::connect(sluice.admin).expect("connects"))
        .collect();
    // Every probe answers at once, again and again, though each new connection is past the cap.
    for round in 0..20 {
        for probe in ["/healthz", "/readyz"] {
            let (status, body) = http_get(sluice.admin, probe);
            assert_eq!(status, 200, "{probe}, round {round}: {body}");
        }
    }
    // The listener holds at most its cap: the older held connections were closed to make room.
    let dropped = held
        .iter()
        .filter(|s| closed(s, Duration::from_millis(20)))
        .count();
    assert!(
        dropped >= HELD - 40,
        "{dropped} of {HELD} held connections closed"
    );
    let evicted = sluice.metric("sluice_admin_refused_total", &[("reason", "evicted")]);
    assert!(
        evicted >= (HELD - 40) as f64,
        "evictions counted: {evicted}"
    );
    // The rest are closed by the header timeout.
    std::thread::sleep(Duration::from_secs(4));
    let open = held
        .iter()
        .filter(|s| !closed(s, Duration::from_millis(20)))
        .count();
    assert_eq!(
        open, 0,
        "no held connection outlives --admin-header-timeout"
    );
}

#[test]
fn the_metrics_listener_serves_metrics_and_nothing_that_names_a_tenant() {
    let port = sluice_harness::free_port(false);
    let addr = format!("127.0.0.1:{port}");
    let sluice = SluiceProcess::start(&[("ops.yaml", CONFIG)], &["--metrics-addr", &addr]);
    let metrics: SocketAddr = addr.parse().unwrap();
    let (status, body) = http_get(metrics, "/metrics");
    assert_eq!(status, 200);
    assert!(
        body.contains("sluice_admin_refused_total") || body.contains("# TYPE"),
        "{body}"
    );
    assert_eq!(http_get(metrics, "/healthz").0, 200);
    assert_eq!(http_get(metrics, "/readyz").0, 200);
    for path in [
        "/top",
        "/config",
        "/buckets?domain=ops&descriptor=tenant%3Dx",
        "/status",
        "/",
    ] {
        assert_eq!(http_get(metrics, path).0, 404, "{path} is not served there");
    }
    let (status, config) = http_get(sluice.admin, "/config");
    assert_eq!(status, 200);
    let config: Value = serde_json::from_str(&config).unwrap();
    assert!(
        config["domains"].is_array(),
        "the admin listener still serves it"
    );
}

// ---------------------------------------------------------------------------------------------
// Bytes in, bytes out: a value that is not UTF-8, from the RLS request to `/top` and back into
// `DELETE /buckets`.

const BYTES: &str = r#"
domain: ops
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 3}
"#;

/// `GET` or `DELETE` with the operator token `t`, off the async workers.
async fn admin_call(admin: SocketAddr, method: &'static str, path: String) -> (u16, Value) {
    tokio::task::spawn_blocking(move || {
        let headers = [("Host", "localhost"), ("Authorization", "Bearer t")];
        let (status, body) = http_with(admin, method, &path, &headers);
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    })
    .await
    .unwrap()
}

/// `/explain` of `tenant=ab%FF`, as a descriptor and as an RLQS bucket id, shows the value in the
/// form it was given, wherever the bucket id's entries were placed.
async fn explain_shows_the_same_bytes(admin: SocketAddr) {
    let explain = "/explain?domain=ops&descriptor=tenant=ab%FF".to_owned();
    let (status, explained) = admin_call(admin, "GET", explain).await;
    assert_eq!(status, 200, "{explained}");
    assert_eq!(explained["descriptor"][0]["value"], "ab%FF", "{explained}");
    assert_eq!(explained["steps"][0]["value"], "ab%FF", "{explained}");
    let explain = "/explain?domain=ops&bucket=tenant=ab%FF".to_owned();
    let (status, explained) = admin_call(admin, "GET", explain).await;
    assert_eq!(status, 200, "{explained}");
    assert_eq!(explained["bucket_id"][0]["value"], "ab%FF", "{explained}");
    let placed = &explained["placed"];
    assert_eq!(placed["descriptor"][0]["value"], "ab%FF", "{explained}");
    assert_eq!(placed["steps"][0]["value"], "ab%FF", "{explained}");
}

#[tokio::test]
async fn a_value_that_is_not_utf8_is_printed_and_reset_as_the_same_bytes() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use sluice_harness::rls::{OK, OVER_LIMIT, desc, patched, raw_call, req};
    let (_dir, token) = token_dir("t");
    let sluice = SluiceProcess::start(
        &[("ops.yaml", BYTES)],
        &["--admin-write", "--admin-token-file", &token],
    );
    let (grpc, admin) = (sluice.grpc, sluice.admin);
    let raw = req("ops", vec![desc(&[("tenant", "ab~")])]);
    let spend_raw = || async {
        let bytes = patched(&raw, b"ab~", b"ab\xFF");
        raw_call(grpc, bytes).await.expect("decided").overall_code
    };
    // `ab\xFF` spends its bucket; its lossy spelling `ab\u{FFFD}` is another client, spent too.
    let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let lossy = req("ops", vec![desc(&[("tenant", "ab\u{FFFD}")])]);
    for expected in [OK, OK, OK, OVER_LIMIT] {
        assert_eq!(spend_raw().await, expected);
        let code = client.should_rate_limit(lossy.clone()).await.unwrap();
        assert_eq!(code.into_inner().overall_code, expected);
    }
    let (status, top) = admin_call(admin, "GET", "/top".into()).await;
    assert_eq!(status, 200, "{top}");
    let limited: Vec<&str> = top["rules"][0]["limited"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert!(limited.contains(&"tenant=ab%FF"), "{limited:?}");
    assert!(limited.contains(&"tenant=ab%EF%BF%BD"), "{limited:?}");
    // Typed back as printed, it names exactly those bytes.
    let path = "/buckets?domain=ops&descriptor=tenant=ab%FF".to_owned();
    let (status, shown) = admin_call(admin, "GET", path.clone()).await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["descriptor"][0]["value"], "ab%FF", "{shown}");
    explain_shows_the_same_bytes(admin).await;
    assert_eq!(shown["keys"][0]["remaining"], 0, "{shown}");
    for bad in ["tenant=ab%F", "tenant=ab%GG", "tenant=100%"] {
        let (status, body) = admin_call(
            admin,
            "GET",
            format!("/buckets?domain=ops&descriptor={bad}"),
        )
        .await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, reset) = admin_call(admin, "DELETE", path).await;
    assert_eq!(status, 200, "{reset}");
    assert_eq!(reset["reset"][0]["existed"], true, "{reset}");
    // Exactly that key starts fresh; the lossy spelling's bucket is still spent.
    assert_eq!(spend_raw().await, OK);
    let code = client.should_rate_limit(lossy.clone()).await.unwrap();
    assert_eq!(code.into_inner().overall_code, OVER_LIMIT);
    // The CLI reads the same form.
    let out = sluice_command()
        .args([
            "bucket",
            "show",
            "--admin",
            &admin.to_string(),
            "--admin-token-file",
            &token,
        ])
        .args(["--domain", "ops", "tenant=ab%ff"])
        .output()
        .unwrap();
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(shown["keys"][0]["remaining"], 2, "{shown}");
}

const COSTLY: &str = r#"
domain: ops
descriptors:
  - key: export
    cost: 10
    rate_limit: {unit: minute, requests_per_unit: 100}
"#;

#[tokio::test]
async fn buckets_count_remaining_in_the_units_of_the_rls_answer() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use sluice_harness::rls::{desc, req};
    let sluice = SluiceProcess::start(&[("ops.yaml", COSTLY)], &[]);
    let mut client = RateLimitServiceClient::connect(format!("http://{}", sluice.grpc))
        .await
        .unwrap();
    let mut told = 0;
    for _ in 0..6 {
        let answer = client
            .should_rate_limit(req("ops", vec![desc(&[("export", "q1")])]))
            .await
            .unwrap()
            .into_inner();
        told = answer.statuses[0].limit_remaining;
    }
    assert_eq!(told, 4, "RLS counts hits of cost 10");
    let (status, shown) = admin_call(
        sluice.admin,
        "GET",
        "/buckets?domain=ops&descriptor=export=q1".into(),
    )
    .await;
    assert_eq!(status, 200, "{shown}");
    let key = &shown["keys"][0];
    assert_eq!(key["remaining"], 4, "hits, as RLS said: {key}");
    assert_eq!(key["limit"], 10, "{key}");
    assert_eq!(key["cost"], 10, "{key}");
    let tokens = key["remaining_tokens"].as_u64().unwrap();
    assert!(
        (40..50).contains(&tokens),
        "the bucket's tokens beside: {key}"
    );
}
