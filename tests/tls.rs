//! gRPC over TLS and mTLS through the real server: certificates made with rcgen in a temp dir,
//! Envoy's own RLS client over tonic's rustls client.

use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};
use sluice::server::{self, Running};
use sluice::settings::Settings;
use sluice_harness::rls::{OK, desc, http_get, req};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const CONFIG: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

/// A certificate authority that issues server and client certificates.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A PEM certificate and its PEM key.
struct Leaf {
    cert: String,
    key: String,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf certificate with these SANs (`spiffe://` and `https://` become URI SANs).
    fn issue(&self, sans: &[&str]) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "sluice test");
        for san in sans {
            let san = if san.contains("://") {
                SanType::URI((*san).try_into().unwrap())
            } else if let Ok(ip) = san.parse() {
                SanType::IpAddress(ip)
            } else {
                SanType::DnsName((*san).try_into().unwrap())
            };
            params.subject_alt_names.push(san);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// Server material on disk.
struct Files {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    client_ca: PathBuf,
    config: PathBuf,
}

impl Files {
    fn new(server: &Leaf, client_ca: &Ca) -> Files {
        let dir = tempfile::tempdir().unwrap();
        let files = Files {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            client_ca: dir.path().join("client-ca.crt"),
            config: dir.path().join("config"),
            _dir: dir,
        };
        files.write_server(server);
        std::fs::write(&files.client_ca, client_ca.pem()).unwrap();
        std::fs::create_dir(&files.config).unwrap();
        std::fs::write(files.config.join("edge.yaml"), CONFIG).unwrap();
        files
    }

    /// Replaces the certificate and key the way a rotation does: new files renamed into place.
    fn write_server(&self, server: &Leaf) {
        atomic_write(&self.cert, &server.cert);
        atomic_write(&self.key, &server.key);
    }
}

fn atomic_write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn start(files: &Files, tweak: impl FnOnce(&mut Settings)) -> Running {
    let mut settings = Settings::with_config(&files.config);
    settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
    settings.admin_addr = "127.0.0.1:0".parse().unwrap();
    settings.security.tls.tls_cert = Some(files.cert.clone());
    settings.security.tls.tls_key = Some(files.key.clone());
    settings.drain_delay = std::time::Duration::ZERO;
    tweak(&mut settings);
    server::start(settings).await.expect("server starts")
}

/// One ShouldRateLimit over a fresh TLS connection that trusts `ca` and presents `identity`.
async fn call_tls(
    running: &Running,
    ca: &Ca,
    identity: Option<&Leaf>,
) -> Result<i32, tonic::Status> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert, &leaf.key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{}", running.grpc_addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")))?;
    let mut client = RateLimitServiceClient::new(channel);
    client
        .should_rate_limit(req("edge", vec![desc(&[("tenant", "t")])]))
        .await
        .map(|r| r.into_inner().overall_code)
}

async fn call_plain(running: &Running) -> Result<i32, tonic::Status> {
    let channel = Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")))?;
    RateLimitServiceClient::new(channel)
        .should_rate_limit(req("edge", vec![desc(&[("tenant", "t")])]))
        .await
        .map(|r| r.into_inner().overall_code)
}

#[tokio::test]
async fn tls_serves_clients_that_trust_the_ca_and_refuses_plaintext() {
    let ca = Ca::new("server CA");
    let files = Files::new(&ca.issue(&["localhost", "127.0.0.1"]), &ca);
    let running = start(&files, |_| {}).await;

    assert_eq!(call_tls(&running, &ca, None).await.unwrap(), OK);
    assert!(call_plain(&running).await.is_err(), "plaintext is refused");
    let stranger = Ca::new("some other CA");
    assert!(
        call_tls(&running, &stranger, None).await.is_err(),
        "a client that does not trust the server's CA cannot connect"
    );
    // Failed handshakes do not disturb the listener.
    assert_eq!(call_tls(&running, &ca, None).await.unwrap(), OK);
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_client_ca() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let files = Files::new(&server_ca.issue(&["localhost"]), &client_ca);
    let running = start(&files, |s| {
        s.security.tls.tls_client_ca = Some(files.client_ca.clone());
    })
    .await;

    let envoy = client_ca.issue(&["envoy.mesh.internal"]);
    assert_eq!(
        call_tls(&running, &server_ca, Some(&envoy)).await.unwrap(),
        OK
    );
    assert!(
        call_tls(&running, &server_ca, None).await.is_err(),
        "no client certificate"
    );
    let forged = server_ca.issue(&["envoy.mesh.internal"]);
    assert!(
        call_tls(&running, &server_ca, Some(&forged)).await.is_err(),
        "a certificate from a CA the server does not trust for clients"
    );
    assert_eq!(
        call_tls(&running, &server_ca, Some(&envoy)).await.unwrap(),
        OK
    );
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn allow_list_answers_permission_denied_to_other_client_identities() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let files = Files::new(&server_ca.issue(&["localhost"]), &client_ca);
    let running = start(&files, |s| {
        s.security.tls.tls_client_ca = Some(files.client_ca.clone());
        s.security.tls.tls_allowed_sans = vec![
            "spiffe://cluster.local/ns/edge/sa/envoy".into(),
            "Gateway.Internal".into(),
            "spiffe://cluster.local/ns/mesh/*".into(),
            "10.1.2.3".into(),
        ];
    })
    .await;

    for sans in [
        &["spiffe://cluster.local/ns/edge/sa/envoy"][..],
        &["gateway.internal"],
        &[
            "other.example",
            "spiffe://cluster.local/ns/mesh/sa/anything",
        ],
        &["10.1.2.3"],
    ] {
        let client = client_ca.issue(sans);
        assert_eq!(
            call_tls(&running, &server_ca, Some(&client)).await.unwrap(),
            OK,
            "{sans:?} is allowed"
        );
    }
    for sans in [
        &["spiffe://cluster.local/ns/edge/sa/envoy2"][..],
        &["intruder.example"],
        &["spiffe://cluster.local/ns/meshy/sa/x"],
        &["10.1.2.4"],
        &[],
    ] {
        let client = client_ca.issue(sans);
        let err = call_tls(&running, &server_ca, Some(&client))
            .await
            .expect_err("not on the allow-list");
        assert_eq!(err.code(), Code::PermissionDenied, "{sans:?}: {err:?}");
    }

    // The health service is behind the same check.
    let intruder = client_ca.issue(&["intruder.example"]);
    let channel = Channel::from_shared(format!("https://localhost:{}", running.grpc_addr.port()))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(server_ca.pem()))
                .domain_name("localhost")
                .identity(Identity::from_pem(&intruder.cert, &intruder.key)),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let err = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect_err("denied");
    assert_eq!(err.code(), Code::PermissionDenied);
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn rotated_certificate_files_are_picked_up_without_a_restart() {
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let files = Files::new(&old_ca.issue(&["localhost"]), &old_ca);
    let running = start(&files, |s| {
        s.security.tls.tls_reload_interval = Duration::from_millis(20);
    })
    .await;
    assert_eq!(call_tls(&running, &old_ca, None).await.unwrap(), OK);

    // A certificate without its key is not installed: the old pair keeps serving.
    let rotated = new_ca.issue(&["localhost"]);
    atomic_write(&files.cert, &rotated.cert);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(call_tls(&running, &old_ca, None).await.unwrap(), OK);

    atomic_write(&files.key, &rotated.key);
    tokio::time::timeout(Duration::from_secs(30), async {
        while call_tls(&running, &new_ca, None).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the rotated certificate is served");
    assert!(call_tls(&running, &old_ca, None).await.is_err());
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn unusable_tls_files_refuse_to_start() {
    let ca = Ca::new("CA");
    let files = Files::new(&ca.issue(&["localhost"]), &ca);
    let other = ca.issue(&["localhost"]);
    std::fs::write(&files.key, &other.key).unwrap();
    let mut settings = Settings::with_config(&files.config);
    settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
    settings.admin_addr = "127.0.0.1:0".parse().unwrap();
    settings.security.tls.tls_cert = Some(files.cert.clone());
    settings.security.tls.tls_key = Some(files.key.clone());
    let err = server::start(settings.clone())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("TLS"), "{err}");

    settings.security.tls.tls_key = Some(files.config.join("missing.key"));
    let err = server::start(settings).await.err().expect("refused");
    assert!(err.to_string().contains("missing.key"), "{err}");
}

#[tokio::test]
async fn admin_listens_on_loopback_by_default_and_mutates_nothing() {
    let defaults = Settings::with_config("config/");
    assert!(defaults.admin_addr.ip().is_loopback());

    let ca = Ca::new("CA");
    let files = Files::new(&ca.issue(&["localhost"]), &ca);
    let running = start(&files, |_| {}).await;
    let admin = running.admin_addr;
    let before = tokio::task::spawn_blocking(move || http_get(admin, "/config"))
        .await
        .unwrap();
    for path in ["/healthz", "/readyz", "/config", "/", "/quitquitquit"] {
        for method in ["POST", "PUT", "DELETE", "PATCH"] {
            let code = tokio::task::spawn_blocking(move || request(admin, method, path))
                .await
                .unwrap();
            assert!(
                code == 404 || code == 405,
                "{method} {path} answered {code}"
            );
        }
    }
    let after = tokio::task::spawn_blocking(move || http_get(admin, "/config"))
        .await
        .unwrap();
    assert_eq!(before, after);
    running.shutdown().await.unwrap();
}

fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Length: 2\r\n\r\n{{}}"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn silent_clients_neither_block_others_nor_stay_connected() {
    use tokio::io::AsyncReadExt;
    let ca = Ca::new("CA");
    let files = Files::new(&ca.issue(&["localhost"]), &ca);
    let running = start(&files, |s| {
        s.security.tls.tls_handshake_timeout = Duration::from_millis(200);
    })
    .await;
    // Connections that never say a word, and one that sends garbage instead of a ClientHello.
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(
            tokio::net::TcpStream::connect(running.grpc_addr)
                .await
                .unwrap(),
        );
    }
    let mut garbage = tokio::net::TcpStream::connect(running.grpc_addr)
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut garbage, b"GET / HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    // Others are served meanwhile.
    assert_eq!(call_tls(&running, &ca, None).await.unwrap(), OK);
    // The server hangs up on each of them once the handshake deadline passes.
    silent.push(garbage);
    for mut conn in silent {
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue,
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the server closed the connection");
    }
    assert_eq!(call_tls(&running, &ca, None).await.unwrap(), OK);
    running.shutdown().await.unwrap();
}

/// Opens an RLQS stream over a fresh TLS connection and waits for its first assignment.
async fn quota_tls(running: &Running, ca: &Ca, identity: &Leaf) -> Result<(), tonic::Status> {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca.pem()))
        .domain_name("localhost")
        .identity(Identity::from_pem(&identity.cert, &identity.key));
    let channel = Channel::from_shared(format!("https://localhost:{}", running.grpc_addr.port()))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e:?}")))?;
    let report = RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("tenant".to_string(), "t".to_string())].into(),
            }),
            time_elapsed: None,
            num_requests_allowed: 1,
            num_requests_denied: 0,
        }],
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(report).await.unwrap();
    let mut stream = RateLimitQuotaServiceClient::new(channel)
        .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no assignment"))??;
    assert!(first.is_some_and(|m| !m.bucket_action.is_empty()));
    Ok(())
}

#[tokio::test]
async fn rlqs_is_served_on_the_same_listener_behind_the_same_allow_list() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let files = Files::new(&server_ca.issue(&["localhost"]), &client_ca);
    let running = start(&files, |s| {
        s.security.tls.tls_client_ca = Some(files.client_ca.clone());
        s.security.tls.tls_allowed_sans = vec!["spiffe://cluster.local/ns/edge/sa/envoy".into()];
    })
    .await;
    let allowed = client_ca.issue(&["spiffe://cluster.local/ns/edge/sa/envoy"]);
    quota_tls(&running, &server_ca, &allowed)
        .await
        .expect("an allowed data plane gets assignments");
    let other = client_ca.issue(&["intruder.example"]);
    let err = quota_tls(&running, &server_ca, &other)
        .await
        .expect_err("another identity is refused");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    running.shutdown().await.unwrap();
}
