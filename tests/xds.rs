//! Config from an xDS management server, end to end: an in-test ADS server (tonic, Envoy's
//! own service definition) pushes `RateLimitConfig`s built with envoyproxy/ratelimit's generated
//! types, sluice answers `ShouldRateLimit` over real gRPC, and the test reads the ACKs and NACKs
//! the server received.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use futures::future::BoxFuture;
use prost::Message;
use sluice::admin::Readiness;
use sluice::config::{Config, ConfigStore};
use sluice::server::{self, Running};
use sluice::settings::{Cli, Command};
use sluice::xds::{Backoff, Pause, RATE_LIMIT_CONFIG_TYPE, XdsClient, XdsOptions};
use sluice_harness::rls::{OK, OVER_LIMIT, desc, http_get, req};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::{Certificate, Channel, Identity, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// Guards every wait so a broken client fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(15);

// ---------------------------------------------------------------------------------------------
// The management server

/// What the server pushes: a version and its resources.
#[derive(Clone)]
struct Snapshot {
    version: String,
    resources: Vec<Any>,
}

struct Shared {
    snapshot: watch::Sender<Option<Snapshot>>,
    /// Every request received on any stream, in order.
    received: mpsc::UnboundedSender<DiscoveryRequest>,
    /// (version, nonce) of every response sent.
    sent: Mutex<Vec<(String, String)>>,
    /// Turning true ends every open stream with UNAVAILABLE, as a dying server would.
    kill: watch::Sender<bool>,
}

#[derive(Clone)]
struct Ads(Arc<Shared>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut incoming = request.into_inner();
        let (out, stream) = mpsc::channel(16);
        let shared = self.0.clone();
        tokio::spawn(async move {
            let mut snapshots = shared.snapshot.subscribe();
            let mut kill = shared.kill.subscribe();
            // State of the world: nothing is sent before the client subscribes.
            match incoming.message().await {
                Ok(Some(subscribe)) => {
                    let _ = shared.received.send(subscribe);
                }
                _ => return,
            }
            let mut pending = snapshots.borrow_and_update().clone();
            loop {
                if let Some(snapshot) = pending.take() {
                    let nonce = {
                        let mut sent = shared.sent.lock().unwrap();
                        let nonce = format!("nonce-{}", sent.len() + 1);
                        sent.push((snapshot.version.clone(), nonce.clone()));
                        nonce
                    };
                    let response = DiscoveryResponse {
                        version_info: snapshot.version,
                        resources: snapshot.resources,
                        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
                        nonce,
                        ..Default::default()
                    };
                    if out.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    changed = snapshots.changed() => {
                        if changed.is_err() { return; }
                        pending = snapshots.borrow_and_update().clone();
                    }
                    next = incoming.message() => match next {
                        Ok(Some(r)) => { let _ = shared.received.send(r); }
                        _ => return,
                    },
                    () = async { let _ = kill.wait_for(|k| *k).await; } => {
                        let _ = out.send(Err(Status::unavailable("management server restarting"))).await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(stream)))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

struct ManagementServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    received: mpsc::UnboundedReceiver<DiscoveryRequest>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl ManagementServer {
    async fn start() -> ManagementServer {
        Self::start_on("127.0.0.1:0".parse().unwrap(), None).await
    }

    /// On `addr`, optionally already holding a snapshot (a restarted server that rebuilt its
    /// state before the client came back).
    async fn start_on(addr: SocketAddr, snapshot: Option<Snapshot>) -> ManagementServer {
        Self::start_with(addr, snapshot, None).await
    }

    async fn start_with(
        addr: SocketAddr,
        snapshot: Option<Snapshot>,
        tls: Option<ServerTlsConfig>,
    ) -> ManagementServer {
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().unwrap();
        let (received_tx, received) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            snapshot: watch::Sender::new(snapshot),
            received: received_tx,
            sent: Mutex::new(Vec::new()),
            kill: watch::Sender::new(false),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let service = AggregatedDiscoveryServiceServer::new(Ads(shared.clone()));
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls).expect("server TLS");
        }
        let task = tokio::spawn(async move {
            builder
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("management server");
        });
        ManagementServer {
            addr,
            shared,
            received,
            stop: Some(stop),
            task: Some(task),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn push(&self, version: &str, configs: &[RateLimitConfig]) {
        self.shared.snapshot.send_replace(Some(Snapshot {
            version: version.into(),
            resources: configs.iter().map(to_any).collect(),
        }));
    }

    fn nonce_of(&self, version: &str) -> String {
        let sent = self.shared.sent.lock().unwrap();
        let found = sent.iter().rev().find(|(v, _)| v == version);
        found.expect("version was sent").1.clone()
    }

    async fn next_request(&mut self) -> DiscoveryRequest {
        tokio::time::timeout(PATIENCE, self.received.recv())
            .await
            .expect("sluice sent no request in time")
            .expect("server alive")
    }

    /// The next request is the subscription that opens a stream.
    async fn expect_subscription(&mut self, version: &str) -> DiscoveryRequest {
        let r = self.next_request().await;
        assert_eq!(r.type_url, RATE_LIMIT_CONFIG_TYPE);
        assert_eq!(
            r.response_nonce, "",
            "a subscription answers no response: {r:?}"
        );
        assert_eq!(r.version_info, version, "last accepted version");
        assert!(r.resource_names.is_empty(), "wildcard subscription");
        r
    }

    async fn expect_ack(&mut self, version: &str) {
        let r = self.next_request().await;
        assert_eq!(
            r.error_detail, None,
            "expected an ACK of {version}, got a NACK"
        );
        assert_eq!(r.version_info, version);
        assert_eq!(r.response_nonce, self.nonce_of(version));
        assert_eq!(r.type_url, RATE_LIMIT_CONFIG_TYPE);
    }

    /// Returns the NACK's message.
    async fn expect_nack(&mut self, rejected: &str, still_active: &str) -> String {
        let r = self.next_request().await;
        let detail = r.error_detail.expect("expected a NACK");
        assert_eq!(detail.code, tonic::Code::InvalidArgument as i32);
        assert_eq!(
            r.version_info, still_active,
            "a NACK reports the version kept"
        );
        assert_eq!(r.response_nonce, self.nonce_of(rejected));
        detail.message
    }

    /// Ends every stream with an error and stops listening.
    async fn crash(mut self) -> SocketAddr {
        self.shared.kill.send_replace(true);
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(PATIENCE, self.task.take().unwrap())
            .await
            .expect("management server stops")
            .unwrap();
        self.addr
    }
}

fn to_any(config: &RateLimitConfig) -> Any {
    Any {
        type_url: RATE_LIMIT_CONFIG_TYPE.into(),
        value: config.encode_to_vec(),
    }
}

/// One domain with one `key` descriptor limited to `rpu` per minute.
fn domain(name: &str, key: &str, rpu: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: format!("{name}-config"),
        domain: name.into(),
        descriptors: vec![RateLimitDescriptor {
            key: key.into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: rpu,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// A domain the loader refuses: a limited policy without a unit (UNKNOWN).
fn broken(name: &str, key: &str) -> RateLimitConfig {
    let mut config = domain(name, key, 1);
    if let Some(policy) = &mut config.descriptors[0].rate_limit {
        policy.unit = RateLimitUnit::Unknown as i32;
    }
    config
}

// ---------------------------------------------------------------------------------------------
// sluice

struct Sluice {
    running: Option<Running>,
    client: RateLimitServiceClient<Channel>,
}

impl Sluice {
    async fn start(server: &str, extra: &[&str]) -> Sluice {
        let mut argv = vec![
            "sluice",
            "serve",
            "--config-source",
            "xds",
            "--xds-server",
            server,
            "--xds-node-id",
            "test-node",
            "--xds-node-metadata",
            "zone=test",
            "--xds-backoff-initial",
            "10ms",
            "--xds-backoff-max",
            "100ms",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--drain-delay",
            "0s",
        ];
        argv.extend_from_slice(extra);
        let Command::Serve(settings) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("serve")
        };
        let running = server::start(*settings).await.expect("starts");
        let client = RateLimitServiceClient::connect(format!("http://{}", running.grpc_addr))
            .await
            .expect("client connects");
        Sluice {
            running: Some(running),
            client,
        }
    }

    /// The overall code of one hit of `key=value` in `domain`.
    async fn hit(&mut self, domain: &str, key: &str, value: &str) -> i32 {
        self.client
            .should_rate_limit(req(domain, vec![desc(&[(key, value)])]))
            .await
            .expect("ShouldRateLimit")
            .into_inner()
            .overall_code
    }

    async fn hits(&mut self, domain: &str, key: &str, value: &str, n: usize) -> Vec<i32> {
        let mut codes = Vec::with_capacity(n);
        for _ in 0..n {
            codes.push(self.hit(domain, key, value).await);
        }
        codes
    }

    async fn admin(&self, path: &'static str) -> (u16, String) {
        let addr = self.running.as_ref().unwrap().admin_addr;
        tokio::task::spawn_blocking(move || http_get(addr, path))
            .await
            .unwrap()
    }

    async fn stop(mut self) {
        self.running
            .take()
            .unwrap()
            .shutdown()
            .await
            .expect("clean shutdown");
    }
}

// ---------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn pushed_limits_apply_through_should_rate_limit() {
    let mut cp = ManagementServer::start().await;
    cp.push("v1", &[domain("edge", "tenant", 2)]);
    let mut s = Sluice::start(&cp.url(), &[]).await;

    let subscription = cp.expect_subscription("").await;
    let node = subscription.node.expect("node");
    assert_eq!(node.id, "test-node");
    assert_eq!(node.user_agent_name, "sluice");
    let zone = &node.metadata.expect("metadata").fields["zone"];
    assert_eq!(
        zone.kind,
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
            "test".into()
        ))
    );
    cp.expect_ack("v1").await;

    assert_eq!(
        s.hits("edge", "tenant", "acme", 3).await,
        [OK, OK, OVER_LIMIT]
    );
    assert_eq!(s.hit("edge", "tenant", "other").await, OK);
    // A domain the control plane never sent is unknown: no limit.
    assert_eq!(s.hits("nowhere", "tenant", "acme", 3).await, [OK, OK, OK]);

    let (code, body) = s.admin("/config").await;
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["domains"][0]["domain"], "edge");
    assert_eq!(json["domains"][0]["file"], "xds:edge-config");
    s.stop().await;
}

#[tokio::test]
async fn an_invalid_push_is_nacked_and_the_old_config_keeps_answering() {
    let mut cp = ManagementServer::start().await;
    cp.push("v1", &[domain("edge", "tenant", 2)]);
    let mut s = Sluice::start(&cp.url(), &[]).await;
    cp.expect_subscription("").await;
    cp.expect_ack("v1").await;
    assert_eq!(s.hit("edge", "tenant", "acme").await, OK);

    // v2 is broken in one domain and fine in another: the whole push is refused.
    cp.push("v2", &[broken("edge", "tenant"), domain("api", "user", 1)]);
    let message = cp.expect_nack("v2", "v1").await;
    assert_eq!(
        message,
        "xds:edge-config:5:13: descriptors[0].rate_limit.unit: invalid unit `UNKNOWN`; expected one of: second, minute, hour, day, week, month, year"
    );

    // v1 still answers, with its bucket intact; nothing of v2 is active.
    assert_eq!(s.hits("edge", "tenant", "acme", 2).await, [OK, OVER_LIMIT]);
    assert_eq!(s.hits("api", "user", "u", 2).await, [OK, OK]);
    let (_, body) = s.admin("/config").await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["last_rejected"]["source"], "xds version \"v2\"");

    // A new good version replaces it.
    cp.push(
        "v3",
        &[domain("edge", "tenant", 5), domain("api", "user", 1)],
    );
    cp.expect_ack("v3").await;
    assert_eq!(
        s.hits("edge", "tenant", "fresh", 6).await,
        [OK, OK, OK, OK, OK, OVER_LIMIT]
    );
    assert_eq!(s.hits("api", "user", "u", 2).await, [OK, OVER_LIMIT]);
    let (_, body) = s.admin("/config").await;
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(json.get("last_rejected").is_none(), "{json}");

    // A push that drops a domain removes it.
    cp.push("v4", &[domain("api", "user", 1)]);
    cp.expect_ack("v4").await;
    assert_eq!(s.hits("edge", "tenant", "acme", 3).await, [OK, OK, OK]);
    s.stop().await;
}

#[tokio::test]
async fn several_domains_in_one_push_are_validated_together() {
    let mut cp = ManagementServer::start().await;
    cp.push(
        "v1",
        &[
            domain("edge", "tenant", 1),
            domain("api", "user", 2),
            domain("admin", "ip", 3),
        ],
    );
    let mut s = Sluice::start(&cp.url(), &[]).await;
    cp.expect_subscription("").await;
    cp.expect_ack("v1").await;
    assert_eq!(s.hits("edge", "tenant", "t", 2).await, [OK, OVER_LIMIT]);
    assert_eq!(s.hits("api", "user", "u", 3).await, [OK, OK, OVER_LIMIT]);
    assert_eq!(
        s.hits("admin", "ip", "i", 4).await,
        [OK, OK, OK, OVER_LIMIT]
    );

    // Two resources claiming one domain: each is valid alone, the push is not.
    let mut again = domain("api", "user", 9);
    again.name = "api-again".into();
    cp.push(
        "v2",
        &[domain("edge", "tenant", 1), domain("api", "user", 2), again],
    );
    let message = cp.expect_nack("v2", "v1").await;
    assert!(
        message.starts_with("xds:api-again:")
            && message.contains("duplicate domain `api`: already defined at xds:api-config:"),
        "{message}"
    );
    assert_eq!(
        s.hits("admin", "ip", "j", 4).await,
        [OK, OK, OK, OVER_LIMIT]
    );
    s.stop().await;
}

#[tokio::test]
async fn unready_until_the_first_good_config_even_before_the_server_is_up() {
    // Nothing listens on the address yet.
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let mut s = Sluice::start(&format!("http://{addr}"), &[]).await;
    let (code, body) = s.admin("/readyz").await;
    assert_eq!((code, body.trim()), (503, "not ready: config not loaded"));
    // Serving meanwhile, with no domains.
    assert_eq!(s.hit("edge", "tenant", "acme").await, OK);

    let mut cp = ManagementServer::start_on(addr, None).await;
    cp.expect_subscription("").await;
    cp.push("v1", &[broken("edge", "tenant")]);
    cp.expect_nack("v1", "").await;
    assert_eq!(s.admin("/readyz").await.0, 503);

    cp.push("v2", &[domain("edge", "tenant", 1)]);
    cp.expect_ack("v2").await;
    assert_eq!(s.admin("/readyz").await, (200, "ready\n".into()));
    assert_eq!(s.hits("edge", "tenant", "acme", 2).await, [OK, OVER_LIMIT]);
    s.stop().await;
}

#[tokio::test]
async fn start_without_config_is_ready_with_no_domains() {
    let addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let mut s = Sluice::start(&format!("http://{addr}"), &["--xds-start-without-config"]).await;
    assert_eq!(s.admin("/readyz").await.0, 200);
    assert_eq!(s.hits("edge", "tenant", "acme", 3).await, [OK, OK, OK]);
    s.stop().await;
}

#[tokio::test]
async fn a_management_server_restart_is_survived() {
    let mut cp = ManagementServer::start().await;
    cp.push("v1", &[domain("edge", "tenant", 2)]);
    let mut s = Sluice::start(&cp.url(), &[]).await;
    cp.expect_subscription("").await;
    cp.expect_ack("v1").await;
    assert_eq!(s.hit("edge", "tenant", "acme").await, OK);

    let addr = cp.crash().await;
    // Down: the last good config answers and sluice stays ready.
    assert_eq!(s.hits("edge", "tenant", "acme", 2).await, [OK, OVER_LIMIT]);
    assert_eq!(s.admin("/readyz").await.0, 200);

    // Back, with a newer snapshot: sluice resubscribes telling what it runs, and takes v2.
    let mut cp = ManagementServer::start_on(
        addr,
        Some(Snapshot {
            version: "v2".into(),
            resources: vec![to_any(&domain("edge", "tenant", 4))],
        }),
    )
    .await;
    cp.expect_subscription("v1").await;
    cp.expect_ack("v2").await;
    assert_eq!(
        s.hits("edge", "tenant", "other", 5).await,
        [OK, OK, OK, OK, OVER_LIMIT]
    );

    // And the stream that came back carries later pushes too.
    cp.push("v3", &[domain("edge", "tenant", 1)]);
    cp.expect_ack("v3").await;
    assert_eq!(s.hits("edge", "tenant", "third", 2).await, [OK, OVER_LIMIT]);
    s.stop().await;
}

/// Test-only PKI in tests/data/xds-tls (made with openssl, valid until 2126): a CA, a server
/// certificate for `xds.test`, and a client certificate.
fn tls_file(name: &str) -> String {
    format!("{}/tests/data/xds-tls/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn mutual_tls_to_the_management_server() {
    let read = |name: &str| std::fs::read(tls_file(name)).unwrap();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read("server.pem"), read("server.key")))
        // Only clients with a certificate from this CA get through.
        .client_ca_root(Certificate::from_pem(read("ca.pem")));
    let mut cp =
        ManagementServer::start_with("127.0.0.1:0".parse().unwrap(), None, Some(tls)).await;
    cp.push("v1", &[domain("edge", "tenant", 1)]);
    let (ca, cert, key) = (
        tls_file("ca.pem"),
        tls_file("client.pem"),
        tls_file("client.key"),
    );
    // A bare host:port, as Envoy Gateway configures it; the CA switches TLS on.
    let server = cp.addr.to_string();
    let mut s = Sluice::start(
        &server,
        &[
            "--xds-tls-ca",
            &ca,
            "--xds-tls-cert",
            &cert,
            "--xds-tls-key",
            &key,
            "--xds-tls-server-name",
            "xds.test",
        ],
    )
    .await;
    cp.expect_subscription("").await;
    cp.expect_ack("v1").await;
    assert_eq!(s.hits("edge", "tenant", "acme", 2).await, [OK, OVER_LIMIT]);
    s.stop().await;
}

#[tokio::test]
async fn unreadable_tls_files_fail_the_start() {
    let args = [
        "sluice",
        "serve",
        "--config-source",
        "xds",
        "--xds-tls-ca",
        "/nonexistent/ca.pem",
        "--grpc-addr",
        "127.0.0.1:0",
        "--admin-addr",
        "127.0.0.1:0",
    ];
    let Command::Serve(settings) = Cli::try_parse_from(args).unwrap().command else {
        panic!("serve")
    };
    let err = server::start(*settings)
        .await
        .err()
        .expect("refuses to start");
    let message = err.to_string();
    assert!(
        message.starts_with("invalid setting: xDS TLS: cannot read /nonexistent/ca.pem"),
        "{message}"
    );
}

// ---------------------------------------------------------------------------------------------
// Reconnect timing, with the client's waits handed to the test

/// Each wait is reported to the test, which releases it when it chooses.
struct GatedPause(mpsc::UnboundedSender<(Duration, oneshot::Sender<()>)>);

impl Pause for GatedPause {
    fn pause(&self, delay: Duration) -> BoxFuture<'static, ()> {
        let (release, released) = oneshot::channel();
        let _ = self.0.send((delay, release));
        Box::pin(async move {
            let _ = released.await;
        })
    }
}

async fn next_wait(
    waits: &mut mpsc::UnboundedReceiver<(Duration, oneshot::Sender<()>)>,
) -> (Duration, oneshot::Sender<()>) {
    tokio::time::timeout(PATIENCE, waits.recv())
        .await
        .expect("the client waited in time")
        .expect("client alive")
}

#[tokio::test]
async fn reconnects_back_off_exponentially_and_reset_after_a_healthy_stream() {
    let mut cp = ManagementServer::start().await;
    cp.push("v1", &[domain("edge", "tenant", 2)]);
    let store = Arc::new(ConfigStore::new(Config::default()));
    let readiness = Arc::new(Readiness::default());
    readiness.set_backend_ready(true);
    let options = XdsOptions {
        server: cp.url(),
        node: Node {
            id: "backoff-test".into(),
            ..Default::default()
        },
        tls: None,
        start_without_config: false,
        backoff: Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
        },
        connect_timeout: Duration::from_secs(5),
        max_message_bytes: 1 << 20,
        load: Default::default(),
    };
    let (waits_tx, mut waits) = mpsc::unbounded_channel();
    let client = XdsClient::new(options, store.clone(), readiness.clone())
        .with_pause(Arc::new(GatedPause(waits_tx)))
        .with_jitter(Arc::new(|| 1.0));
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(client.run(stopped));

    cp.expect_subscription("").await;
    assert!(!readiness.is_ready());
    cp.expect_ack("v1").await;
    assert!(readiness.is_ready());
    assert!(store.active().load().domain("edge").is_some());

    let addr = cp.crash().await;
    // The stream had delivered a push, so the first wait starts from the bottom...
    let (delay, release) = next_wait(&mut waits).await;
    assert_eq!(delay, Duration::from_millis(100));
    release.send(()).unwrap();
    // ...and each refused connection doubles it, up to the cap.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (delay, release) = next_wait(&mut waits).await;
        seen.push(delay.as_millis());
        release.send(()).unwrap();
    }
    assert_eq!(seen, [200, 400, 400]);

    let (delay, release) = next_wait(&mut waits).await;
    assert_eq!(delay, Duration::from_millis(400));
    let mut cp = ManagementServer::start_on(addr, None).await;
    release.send(()).unwrap();
    cp.expect_subscription("v1").await;
    cp.push("v2", &[domain("edge", "tenant", 3)]);
    cp.expect_ack("v2").await;

    cp.crash().await;
    let (delay, _hold) = next_wait(&mut waits).await;
    assert_eq!(
        delay,
        Duration::from_millis(100),
        "reset after a healthy stream"
    );

    stop.send_replace(true);
    tokio::time::timeout(PATIENCE, task)
        .await
        .expect("the client stops while waiting")
        .unwrap();
}
