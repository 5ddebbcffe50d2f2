//! What a connection may cost before it carries an RPC, through the real listener: past
//! `--max-connections` a new connection is closed at accept, and one that has not sent the
//! HTTP/2 preface and its SETTINGS within `--handshake-timeout` is closed; both are counted in
//! `sluice_connections_rejected_total`, the open ones in `sluice_connections_open`.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 100}
"#;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Far beyond what any step here needs; only a connection left open forever reaches it.
const GENEROUS: Duration = Duration::from_secs(20);

/// The value of the series `name_and_labels` (exact match of everything before the value).
fn metric(s: &TestServer, name_and_labels: &str) -> Option<u64> {
    let text = s
        .running
        .as_ref()
        .unwrap()
        .metrics
        .prometheus_text()?
        .ok()?;
    text.lines().find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        (series == name_and_labels).then(|| value.parse::<f64>().ok().map(|v| v as u64))?
    })
}

async fn eventually(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + GENEROUS;
    while !ready() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Reads until the server closes the connection (EOF or reset); panics if it stays open.
async fn closed_by_server(mut tcp: TcpStream) {
    let mut buf = [0u8; 4096];
    let closed = tokio::time::timeout(GENEROUS, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                // The server's own SETTINGS, or a GOAWAY.
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection is still open");
}

async fn still_serving(addr: std::net::SocketAddr) {
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let r = client
        .should_rate_limit(req("edge", vec![desc(&[("tenant", "a")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_at_accept() {
    let s = TestServer::start_with(&[("edge.yaml", CONFIG)], |st| {
        st.security.listener.max_connections = 3;
        st.security.listener.handshake_timeout = Duration::from_secs(600);
    })
    .await;
    let open = |s: &TestServer| metric(s, "sluice_connections_open");
    let cap = |s: &TestServer| metric(s, "sluice_connections_rejected_total{reason=\"cap\"}");
    // The harness's client holds one connection; two idle ones fill the cap.
    eventually("the client's connection counted", || open(&s) == Some(1)).await;
    let idle_a = TcpStream::connect(s.grpc_addr()).await.unwrap();
    let _idle_b = TcpStream::connect(s.grpc_addr()).await.unwrap();
    eventually("three open", || open(&s) == Some(3)).await;
    assert_eq!(cap(&s), Some(0));

    // The kernel completes the fourth connection; sluice closes it as soon as it accepts it.
    let fourth = TcpStream::connect(s.grpc_addr()).await.unwrap();
    closed_by_server(fourth).await;
    assert_eq!(cap(&s), Some(1));
    assert_eq!(open(&s), Some(3));
    // The connections under the cap are served as before.
    let mut client = s.client.clone();
    let r = client
        .should_rate_limit(req("edge", vec![desc(&[("tenant", "a")])]))
        .await
        .unwrap();
    assert_eq!(r.into_inner().overall_code, OK);

    // A closed connection frees its place.
    drop(idle_a);
    eventually("a place freed", || open(&s) == Some(2)).await;
    still_serving(s.grpc_addr()).await;
    assert_eq!(cap(&s), Some(1));
    drop(_idle_b);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_preface_only_connections_are_closed_after_the_handshake_timeout() {
    let s = TestServer::start_with(&[("edge.yaml", CONFIG)], |st| {
        st.security.listener.handshake_timeout = Duration::from_millis(300);
    })
    .await;
    let timeouts = |s: &TestServer| {
        metric(
            s,
            "sluice_connections_rejected_total{reason=\"handshake_timeout\"}",
        )
    };
    assert_eq!(timeouts(&s), Some(0));

    // Sends nothing at all.
    let silent = TcpStream::connect(s.grpc_addr()).await.unwrap();
    closed_by_server(silent).await;
    eventually("one timeout counted", || timeouts(&s) == Some(1)).await;

    // Sends the preface but never its SETTINGS frame.
    let mut preface_only = TcpStream::connect(s.grpc_addr()).await.unwrap();
    preface_only.write_all(PREFACE).await.unwrap();
    closed_by_server(preface_only).await;
    eventually("two timeouts counted", || timeouts(&s) == Some(2)).await;

    // A client that completes the handshake keeps its connection past the deadline.
    let mut client = s.client.clone();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let r = client
        .should_rate_limit(req("edge", vec![desc(&[("tenant", "a")])]))
        .await
        .unwrap();
    assert_eq!(r.into_inner().overall_code, OK);
    eventually("the closed ones are not open", || {
        metric(&s, "sluice_connections_open") == Some(1)
    })
    .await;
    assert_eq!(timeouts(&s), Some(2));
    s.stop().await;
}
