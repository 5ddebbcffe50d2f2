//! The ADS stream: one state-of-the-world subscription to `RateLimitConfig`, each push installed
//! whole or not at all, ACKed or NACKed, and the stream re-opened with backoff when it ends.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::convert::{self, RATE_LIMIT_CONFIG_TYPE};
use super::{TlsFiles, XdsOptions};
use crate::admin::Readiness;
use crate::config::ConfigStore;

/// `google.rpc.Code.INVALID_ARGUMENT`, the code of a NACK's `error_detail`.
const INVALID_ARGUMENT: i32 = 3;

/// Longest `error_detail` message sent back; the full list is logged and shown by `GET /config`.
const MAX_DETAIL_BYTES: usize = 8 * 1024;

/// Reconnect delays: doubling from `initial` up to `max`, with "equal jitter" (half of each
/// delay fixed, half random) so replicas that lost the same server spread out without any of
/// them retrying immediately.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The delay before reconnect number `attempt` (1-based); `unit` is a sample from [0, 1].
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let doublings = attempt.saturating_sub(1).min(31);
        let ceiling = self.initial.saturating_mul(1 << doublings).min(self.max);
        ceiling.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// How the client waits between attempts; tests substitute one that returns at once.
pub trait Pause: Send + Sync + 'static {
    fn pause(&self, delay: Duration) -> BoxFuture<'static, ()>;
}

/// Waits on the tokio timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioPause;

impl Pause for TokioPause {
    fn pause(&self, delay: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(delay))
    }
}

/// Why one stream ended.
#[derive(Debug, thiserror::Error)]
enum StreamError {
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    #[error("cannot read {path}: {source}")]
    TlsFile {
        path: String,
        source: std::io::Error,
    },
    #[error("stream failed: {0}")]
    Rpc(#[from] tonic::Status),
    #[error("the server closed the stream")]
    Closed,
}

/// Keeps the active config in step with a management server.
pub struct XdsClient {
    options: XdsOptions,
    store: Arc<ConfigStore>,
    readiness: Arc<Readiness>,
    pause: Arc<dyn Pause>,
    jitter: Arc<dyn Fn() -> f64 + Send + Sync>,
    /// `version_info` of the last push installed; what a NACK and a re-subscription report.
    accepted_version: String,
}

impl std::fmt::Debug for XdsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsClient")
            .field("server", &self.options.server)
            .field("accepted_version", &self.accepted_version)
            .finish_non_exhaustive()
    }
}

impl XdsClient {
    pub fn new(options: XdsOptions, store: Arc<ConfigStore>, readiness: Arc<Readiness>) -> Self {
        XdsClient {
            options,
            store,
            readiness,
            pause: Arc::new(TokioPause),
            jitter: Arc::new(rand::random::<f64>),
            accepted_version: String::new(),
        }
    }

    pub fn with_pause(mut self, pause: Arc<dyn Pause>) -> Self {
        self.pause = pause;
        self
    }

    /// The source of jitter samples in [0, 1].
    pub fn with_jitter(mut self, jitter: Arc<dyn Fn() -> f64 + Send + Sync>) -> Self {
        self.jitter = jitter;
        self
    }

    /// Streams until `stop` turns true (or its sender is dropped), reconnecting as needed.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut failures: u32 = 0;
        loop {
            let mut responded = false;
            let ended = tokio::select! {
                ended = self.stream(&mut responded) => ended,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Err(error) = ended;
            // A stream that delivered anything was healthy: start the next wait from the bottom.
            if responded {
                failures = 0;
            }
            failures = failures.saturating_add(1);
            let delay = self.options.backoff.delay(failures, (self.jitter)());
            tracing::warn!(
                server = %self.options.server,
                %error,
                attempt = failures,
                retry_in = ?delay,
                "xDS stream down; the last good config stays active"
            );
            tokio::select! {
                () = self.pause.pause(delay) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    async fn stream(&mut self, responded: &mut bool) -> Result<Infallible, StreamError> {
        let channel = connect(&self.options).await?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.options.max_message_bytes);
        let (requests, outgoing) = mpsc::channel(4);
        // Subscribe (wildcard: every RateLimitConfig for this node), telling a restarted server
        // what we already run.
        let subscribe = self.request(self.accepted_version.clone(), String::new(), None);
        requests
            .send(subscribe)
            .await
            .map_err(|_| StreamError::Closed)?;
        let mut responses = client
            .stream_aggregated_resources(ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        tracing::info!(server = %self.options.server, "xDS stream open");
        loop {
            let Some(response) = responses.message().await? else {
                return Err(StreamError::Closed);
            };
            *responded = true;
            if let Some(reply) = self.handle(response) {
                requests
                    .send(reply)
                    .await
                    .map_err(|_| StreamError::Closed)?;
            }
        }
    }

    /// Installs or rejects one push; returns the ACK or NACK to send.
    fn handle(&mut self, response: DiscoveryResponse) -> Option<DiscoveryRequest> {
        if response.type_url != RATE_LIMIT_CONFIG_TYPE {
            tracing::warn!(type_url = %response.type_url, "ignoring a push of a type sluice did not subscribe to");
            return None;
        }
        let version = response.version_info;
        let result = convert::render_push(&response.resources).and_then(|rendered| {
            let validated = convert::validate_rendered(&rendered, &self.options.load);
            if validated.is_err() {
                for r in &rendered {
                    tracing::debug!(source = %r.source, rendering = %r.text, "rejected xDS resource as YAML");
                }
            }
            validated
        });
        let rejection = result.as_ref().err().map(ToString::to_string);
        let label = format!("xds version {version:?}");
        if self.store.install(result, &label) {
            tracing::info!(
                version,
                resources = response.resources.len(),
                "xDS config accepted"
            );
            self.accepted_version = version.clone();
            self.readiness.set_config_loaded(true);
            return Some(self.request(version, response.nonce, None));
        }
        tracing::warn!(version, "xDS config rejected (NACK)");
        Some(self.request(
            self.accepted_version.clone(),
            response.nonce,
            Some(Status {
                code: INVALID_ARGUMENT,
                message: truncate(rejection.unwrap_or_default()),
                details: Vec::new(),
            }),
        ))
    }

    fn request(&self, version: String, nonce: String, error: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version,
            node: Some(self.options.node.clone()),
            type_url: RATE_LIMIT_CONFIG_TYPE.into(),
            response_nonce: nonce,
            error_detail: error,
            ..Default::default()
        }
    }
}

async fn connect(options: &XdsOptions) -> Result<Channel, StreamError> {
    let mut endpoint = Endpoint::from_shared(options.server.clone())?
        .connect_timeout(options.connect_timeout)
        // Notice a server that vanished without closing the connection.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true)
        .tcp_nodelay(true);
    if let Some(files) = &options.tls {
        endpoint = endpoint.tls_config(tls_config(files).await?)?;
    }
    Ok(endpoint.connect().await?)
}

async fn tls_config(files: &TlsFiles) -> Result<ClientTlsConfig, StreamError> {
    let read = |path: &std::path::Path| {
        let path = path.to_path_buf();
        async move {
            tokio::fs::read(&path)
                .await
                .map_err(|source| StreamError::TlsFile {
                    path: path.display().to_string(),
                    source,
                })
        }
    };
    let mut config =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&files.ca).await?));
    if let Some((cert, key)) = &files.identity {
        config = config.identity(Identity::from_pem(read(cert).await?, read(key).await?));
    }
    if let Some(name) = &files.server_name {
        config = config.domain_name(name.clone());
    }
    Ok(config)
}

/// Cuts a long message at a line boundary and says how much was left out.
fn truncate(message: String) -> String {
    if message.len() <= MAX_DETAIL_BYTES {
        return message;
    }
    let mut cut = MAX_DETAIL_BYTES;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    let kept = message[..cut].rfind('\n').unwrap_or(cut);
    let omitted = message[kept..].lines().filter(|l| !l.is_empty()).count();
    format!(
        "{}\n… and {omitted} more lines (see sluice's log or GET /config)",
        &message[..kept]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_the_cap_with_equal_jitter() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
        };
        let top: Vec<u128> = (1..=6).map(|n| b.delay(n, 1.0).as_millis()).collect();
        assert_eq!(top, [100, 200, 400, 800, 1000, 1000]);
        let bottom: Vec<u128> = (1..=6).map(|n| b.delay(n, 0.0).as_millis()).collect();
        assert_eq!(bottom, [50, 100, 200, 400, 500, 500]);
        assert_eq!(b.delay(3, 0.5), Duration::from_millis(300));
        // Far past the cap nothing overflows.
        assert_eq!(b.delay(u32::MAX, 1.0), Duration::from_millis(1000));
        assert_eq!(b.delay(0, 1.0), Duration::from_millis(100));
    }

    #[test]
    fn long_details_are_cut_at_a_line() {
        let line = "x".repeat(99);
        let message = vec![line.as_str(); 200].join("\n");
        let cut = truncate(message.clone());
        assert!(cut.len() < MAX_DETAIL_BYTES + 100);
        let kept = cut.lines().filter(|l| *l == line).count();
        assert!(
            cut.ends_with(&format!(
                "… and {} more lines (see sluice's log or GET /config)",
                200 - kept
            )),
            "{}",
            &cut[cut.len() - 80..]
        );
        assert_eq!(truncate("short".into()), "short");
    }
}
