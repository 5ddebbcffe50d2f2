//! gRPC over TLS: our own rustls acceptor over the gRPC `TcpListener`, so certificates can be
//! swapped while serving (tonic's `ServerTlsConfig` is fixed when the server is built).
//!
//! - [`TlsState`] holds the current rustls `ServerConfig` in an `ArcSwap`; every handshake uses
//!   whatever config is current, so a reload affects new connections only and open ones finish
//!   undisturbed. [`TlsState::spawn_reloader`] re-reads the files on an interval and installs a
//!   new config only when the contents changed and form a valid set (a certificate written before
//!   its key during a rotation is rejected once and picked up when the key follows).
//! - [`GrpcIncoming`] accepts connections (plain or TLS) for tonic: TLS handshakes run
//!   concurrently with a deadline and a cap on how many may be pending, so slow or silent clients
//!   cannot stall accepting; the [`super::listener`] limits (open connections, the deadline for
//!   TLS plus the HTTP/2 preface) hold for every connection.
//! - [`AuthorizeLayer`] answers every RPC of a connection whose client certificate is not on the
//!   allow-list with PERMISSION_DENIED: the client did authenticate (its certificate chains to the
//!   trusted CA), it is just not allowed to call. A client without a valid certificate never gets
//!   past the handshake when client certificates are required.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::future::{BoxFuture, Either, FutureExt};
use futures::stream::{FuturesUnordered, Stream, StreamExt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::listener::{
    ConnectionGuard, ConnectionLimits, ConnectionStats, Handoff, Refusal, Source,
};
use crate::settings::TlsArgs;

/// Handshakes in progress at once; further connections wait in the kernel's accept queue.
const MAX_PENDING_HANDSHAKES: usize = 1024;

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// Why TLS could not be set up or a reload was rejected.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: io::Error },
    #[error("{path}: {message}")]
    Pem { path: PathBuf, message: String },
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client CA: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
}

/// Where the certificate material lives and what a client must prove.
#[derive(Clone, Debug)]
pub struct TlsSettings {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates issued by these CAs.
    pub client_ca: Option<PathBuf>,
    pub allowed: AllowList,
    pub reload_interval: Duration,
    pub handshake_timeout: Duration,
}

impl TlsArgs {
    /// `None` when TLS is off (no `--tls-cert`). Flag combinations are checked by clap.
    pub fn settings(&self) -> Option<TlsSettings> {
        let (cert, key) = (self.tls_cert.clone()?, self.tls_key.clone()?);
        Some(TlsSettings {
            cert,
            key,
            client_ca: self.tls_client_ca.clone(),
            allowed: AllowList::new(self.tls_allowed_sans.iter().cloned()),
            reload_interval: self.tls_reload_interval,
            handshake_timeout: self.tls_handshake_timeout,
        })
    }
}

/// Client certificate names allowed to call. Empty: any client the TLS layer accepted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    patterns: Vec<String>,
}

impl AllowList {
    pub fn new(patterns: impl IntoIterator<Item = String>) -> Self {
        AllowList {
            patterns: patterns
                .into_iter()
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether a client whose certificate carries the DNS and URI SANs `names` may call;
    /// `has_ip` answers for IP SANs. DNS names compare without case; a pattern ending in `*`
    /// matches a prefix.
    pub fn permits(&self, names: &[String], has_ip: impl Fn(IpAddr) -> bool) -> bool {
        if self.patterns.is_empty() {
            return true;
        }
        self.patterns.iter().any(|pattern| {
            if let Ok(ip) = pattern.parse::<IpAddr>() {
                return has_ip(ip);
            }
            names.iter().any(|name| match pattern.strip_suffix('*') {
                Some(prefix) => name
                    .get(..prefix.len())
                    .is_some_and(|head| head.eq_ignore_ascii_case(prefix)),
                None => name.eq_ignore_ascii_case(pattern),
            })
        })
    }
}

/// Who is on the other end of a gRPC connection; tonic puts it in every request's extensions.
#[derive(Clone, Debug)]
pub struct PeerInfo {
    pub local_addr: Option<SocketAddr>,
    pub remote_addr: Option<SocketAddr>,
    /// DNS and URI SANs of the client certificate (TLS with a client certificate only).
    pub client_names: Arc<[String]>,
    /// False when the client certificate is not on the allow-list.
    pub authorized: bool,
}

/// The file contents a config was built from, to tell whether anything changed.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sources {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// What a reload did.
#[derive(Debug)]
pub enum Reload {
    Unchanged,
    Installed,
    /// The files changed but do not form a valid set; the previous config stays in use.
    Rejected(TlsError),
}

/// The live TLS configuration of the gRPC listener.
pub struct TlsState {
    settings: TlsSettings,
    config: ArcSwap<ServerConfig>,
    /// Contents last looked at (installed or rejected), so an unchanged bad set is not rebuilt
    /// and logged on every tick.
    seen: Mutex<Sources>,
}

impl std::fmt::Debug for TlsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsState")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl TlsState {
    /// Reads and checks the files; fails when they are missing or do not form a valid set.
    pub fn load(settings: TlsSettings) -> Result<Arc<TlsState>, TlsError> {
        let sources = read_sources(&settings)?;
        let config = build_config(&settings, &sources)?;
        Ok(Arc::new(TlsState {
            settings,
            config: ArcSwap::new(config),
            seen: Mutex::new(sources),
        }))
    }

    pub fn settings(&self) -> &TlsSettings {
        &self.settings
    }

    /// True when RPCs must come from an allow-listed client certificate.
    pub fn enforces_allow_list(&self) -> bool {
        !self.settings.allowed.is_empty()
    }

    /// Re-reads the files and installs a new config if they changed and are valid.
    pub fn reload(&self) -> Reload {
        let sources = match read_sources(&self.settings) {
            Ok(s) => s,
            // A file briefly missing mid-rotation (e.g. a Kubernetes secret's symlink swap) is
            // retried on the next tick.
            Err(e) => return Reload::Rejected(e),
        };
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if *seen == sources {
            return Reload::Unchanged;
        }
        let built = build_config(&self.settings, &sources);
        *seen = sources;
        match built {
            Ok(config) => {
                self.config.store(config);
                Reload::Installed
            }
            Err(e) => Reload::Rejected(e),
        }
    }

    /// Checks the files every `reload_interval` until this state is dropped (the task holds only
    /// a weak reference) or the handle is aborted.
    pub fn spawn_reloader(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let state = Arc::downgrade(self);
        let every = self.settings.reload_interval.max(Duration::from_millis(10));
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let Some(state) = state.upgrade() else { return };
                // Blocking reads of three small files; off the async workers all the same.
                let outcome = tokio::task::spawn_blocking({
                    let state = Arc::clone(&state);
                    move || state.reload()
                })
                .await;
                match outcome {
                    Ok(Reload::Unchanged) => {}
                    Ok(Reload::Installed) => tracing::info!(
                        cert = %state.settings.cert.display(),
                        "TLS certificate files changed: new connections use the new set"
                    ),
                    Ok(Reload::Rejected(error)) => tracing::warn!(
                        %error,
                        "TLS certificate files changed but were not installed; keeping the previous set"
                    ),
                    Err(join) => tracing::error!(error = %join, "TLS reload task failed"),
                }
            }
        })
    }

    async fn handshake(
        self: Arc<Self>,
        tcp: TcpStream,
        local_addr: Option<SocketAddr>,
        remote_addr: SocketAddr,
        mut guard: ConnectionGuard,
        stats: Arc<ConnectionStats>,
    ) -> Option<Conn> {
        let acceptor = TlsAcceptor::from(self.config.load_full());
        let accepted = tokio::select! {
            accepted = tokio::time::timeout(self.settings.handshake_timeout, acceptor.accept(tcp)) => accepted,
            () = guard.expired() => {
                tracing::debug!(%remote_addr, "TLS handshake not done within --handshake-timeout");
                return None;
            }
        };
        let stream = match accepted {
            Err(_) => {
                stats.count_refusal(Refusal::HandshakeTimeout);
                tracing::debug!(%remote_addr, "TLS handshake timed out");
                return None;
            }
            Ok(Err(error)) => {
                tracing::debug!(%remote_addr, %error, "TLS handshake failed");
                return None;
            }
            Ok(Ok(stream)) => stream,
        };
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first());
        // The verifier already accepted the chain; this only reads the leaf's names.
        let cert = leaf.and_then(|der| webpki::EndEntityCert::try_from(der).ok());
        let names: Vec<String> = cert
            .iter()
            .flat_map(|c| c.valid_dns_names().chain(c.valid_uri_names()))
            .map(str::to_string)
            .collect();
        let authorized = self.settings.allowed.permits(&names, |ip| {
            cert.as_ref().is_some_and(|c| {
                c.verify_is_valid_for_subject_name(&ServerName::IpAddress(ip.into()))
                    .is_ok()
            })
        });
        if !authorized {
            tracing::warn!(
                %remote_addr,
                names = ?names,
                "client certificate is not in --tls-allowed-sans: its calls get PERMISSION_DENIED"
            );
        }
        Some(Conn {
            io: ConnIo::Tls(Box::new(stream)),
            info: PeerInfo {
                local_addr,
                remote_addr: Some(remote_addr),
                client_names: names.into(),
                authorized,
            },
            guard,
        })
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_sources(settings: &TlsSettings) -> Result<Sources, TlsError> {
    Ok(Sources {
        cert: read_file(&settings.cert)?,
        key: read_file(&settings.key)?,
        client_ca: settings.client_ca.as_deref().map(read_file).transpose()?,
    })
}

fn pem_error(path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        path: path.to_path_buf(),
        message: message.to_string(),
    }
}

fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(path, e))?;
    if certs.is_empty() {
        return Err(pem_error(path, "no CERTIFICATE block found"));
    }
    Ok(certs)
}

fn build_config(settings: &TlsSettings, sources: &Sources) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates(&settings.cert, &sources.cert)?;
    let key =
        PrivateKeyDer::from_pem_slice(&sources.key).map_err(|e| pem_error(&settings.key, e))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let builder = match (&settings.client_ca, &sources.client_ca) {
        (Some(path), Some(pem)) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(path, pem)? {
                roots.add(cert).map_err(|e| pem_error(path, e))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build()?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    // Checks that the key belongs to the leaf certificate.
    let mut config = builder.with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// One accepted gRPC connection.
pub struct Conn {
    io: ConnIo,
    info: PeerInfo,
    /// Its place under `--max-connections` and, until the HTTP/2 handshake is in, its deadline.
    guard: ConnectionGuard,
}

enum ConnIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.guard.check(cx)?;
        let before = buf.filled().len();
        let polled = match &mut this.io {
            ConnIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        if let Poll::Ready(Ok(())) = polled {
            this.guard.read(&buf.filled()[before..]);
        }
        polled
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            ConnIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().io {
            ConnIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            ConnIo::Plain(s) => s.is_write_vectored(),
            ConnIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            ConnIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().io {
            ConnIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The gRPC listener's connections for tonic's `serve_with_incoming_shutdown`: plaintext, or
/// TLS-terminated with the [`TlsState`] current at each handshake; accepted from a listener, or
/// handed over by an accept loop on another thread ([`GrpcIncoming::handed`]). Dropping it closes
/// the listening socket (or stops taking connections) and abandons pending handshakes.
pub struct GrpcIncoming {
    source: Source,
    tls: Option<Arc<TlsState>>,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    handshakes: FuturesUnordered<BoxFuture<'static, Option<Conn>>>,
    backoff: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl GrpcIncoming {
    /// With the default [`ConnectionLimits`].
    pub fn new(listener: TcpListener, tls: Option<Arc<TlsState>>) -> Self {
        Self::from_source(Source::Listener(listener), tls)
    }

    /// Over the connections another thread accepted and sends on `handed`; ends when every
    /// sender is gone. Poll it on the runtime that is to run the connections: each socket is
    /// registered with the reactor of the runtime that takes it.
    pub fn handed(handed: mpsc::UnboundedReceiver<Handoff>, tls: Option<Arc<TlsState>>) -> Self {
        Self::from_source(Source::Handed(handed), tls)
    }

    fn from_source(source: Source, tls: Option<Arc<TlsState>>) -> Self {
        GrpcIncoming {
            source,
            tls,
            limits: ConnectionLimits::default(),
            stats: Arc::default(),
            handshakes: FuturesUnordered::new(),
            backoff: None,
        }
    }
}

impl GrpcIncoming {
    /// Holds every connection to `limits`, counting in `stats`.
    #[must_use]
    pub fn with_limits(mut self, limits: ConnectionLimits, stats: Arc<ConnectionStats>) -> Self {
        self.limits = limits;
        self.stats = stats;
        self
    }
}

impl Stream for GrpcIncoming {
    type Item = io::Result<Conn>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Poll::Ready(Some(done)) = this.handshakes.poll_next_unpin(cx) {
                match done {
                    Some(conn) => return Poll::Ready(Some(Ok(conn))),
                    // Failed or timed out; already logged.
                    None => continue,
                }
            }
            if this.handshakes.len() >= MAX_PENDING_HANDSHAKES {
                return Poll::Pending;
            }
            if let Some(sleep) = this.backoff.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.backoff = None;
            }
            let (tcp, remote_addr, seat) = match this.source.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(error))) => {
                    this.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_ERROR_BACKOFF)));
                    return Poll::Ready(Some(Err(error)));
                }
                Poll::Ready(Some(Ok(accepted))) => accepted,
            };
            let Some(slot) = this.stats.admit(this.limits.max_connections) else {
                tracing::debug!(%remote_addr, "--max-connections reached: connection closed");
                continue;
            };
            let guard = ConnectionGuard::new(slot, seat, this.limits.handshake_timeout);
            // Small request/response RPCs: never hold a segment back waiting for more.
            let _ = tcp.set_nodelay(true);
            let local_addr = tcp.local_addr().ok();
            match &this.tls {
                None => {
                    return Poll::Ready(Some(Ok(Conn {
                        io: ConnIo::Plain(tcp),
                        info: PeerInfo {
                            local_addr,
                            remote_addr: Some(remote_addr),
                            client_names: Arc::from([]),
                            authorized: true,
                        },
                        guard,
                    })));
                }
                Some(tls) => this.handshakes.push(
                    Arc::clone(tls)
                        .handshake(tcp, local_addr, remote_addr, guard, this.stats.clone())
                        .boxed(),
                ),
            }
        }
    }
}

/// Rejects RPCs from connections whose client certificate is not allow-listed, and exposes the
/// peer address the way tonic's `Request::remote_addr` looks for it.
#[derive(Clone, Copy, Debug)]
pub struct AuthorizeLayer {
    /// A request without [`PeerInfo`] is refused too (fail closed).
    enforce: bool,
}

impl AuthorizeLayer {
    pub fn new(enforce: bool) -> Self {
        AuthorizeLayer { enforce }
    }
}

impl<S> tower_layer::Layer<S> for AuthorizeLayer {
    type Service = Authorize<S>;

    fn layer(&self, inner: S) -> Authorize<S> {
        Authorize {
            inner,
            enforce: self.enforce,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Authorize<S> {
    inner: S,
    enforce: bool,
}

impl<S, B> tower_service::Service<http::Request<B>> for Authorize<S>
where
    S: tower_service::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, std::future::Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let authorized = match &peer {
            Some(p) => p.authorized,
            None => !self.enforce,
        };
        if !authorized {
            let status = tonic::Status::permission_denied(
                "the client certificate's names are not in the server's --tls-allowed-sans",
            );
            return Either::Right(std::future::ready(Ok(status.into_http())));
        }
        if let Some(p) = peer {
            request.extensions_mut().insert(TcpConnectInfo {
                local_addr: p.local_addr,
                remote_addr: p.remote_addr,
            });
        }
        Either::Left(self.inner.call(request))
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn allow_list_matching() {
        let none = |_: IpAddr| false;
        assert!(
            AllowList::default().permits(&[], none),
            "empty list: anyone"
        );
        let list = AllowList::new(names(&[
            " spiffe://td/ns/a/sa/envoy ",
            "API.example.com",
            "spiffe://td/ns/b/*",
            "",
            "192.0.2.7",
        ]));
        assert!(!list.is_empty());
        assert!(list.permits(&names(&["spiffe://td/ns/a/sa/envoy"]), none));
        assert!(list.permits(&names(&["x", "api.EXAMPLE.com"]), none));
        assert!(list.permits(&names(&["spiffe://td/ns/b/sa/anything"]), none));
        assert!(list.permits(&names(&["spiffe://td/ns/b/"]), none));
        assert!(!list.permits(&names(&["spiffe://td/ns/a/sa/envoy2"]), none));
        assert!(!list.permits(&names(&["spiffe://td/ns/bb/sa/x"]), none));
        assert!(!list.permits(&names(&["sub.api.example.com"]), none));
        assert!(!list.permits(&[], none));
        assert!(
            !list.permits(&names(&["192.0.2.7"]), none),
            "IP patterns need an IP SAN"
        );
        assert!(list.permits(&[], |ip| ip == "192.0.2.7".parse::<IpAddr>().unwrap()));
        // Multi-byte text never splits inside a character.
        assert!(!list.permits(&names(&["spiffe://td/ns/é"]), none));
        let star = AllowList::new(names(&["*"]));
        assert!(star.permits(&names(&["anything"]), none));
        assert!(!star.permits(&[], none), "`*` still needs some name");
    }

    struct Material {
        dir: tempfile::TempDir,
        settings: TlsSettings,
    }

    fn pair() -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn material() -> Material {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair();
        std::fs::write(dir.path().join("c.pem"), cert).unwrap();
        std::fs::write(dir.path().join("k.pem"), key).unwrap();
        let settings = TlsSettings {
            cert: dir.path().join("c.pem"),
            key: dir.path().join("k.pem"),
            client_ca: None,
            allowed: AllowList::default(),
            reload_interval: Duration::from_secs(1),
            handshake_timeout: Duration::from_secs(1),
        };
        Material { dir, settings }
    }

    #[test]
    fn reload_installs_only_changed_valid_sets() {
        let m = material();
        let state = TlsState::load(m.settings.clone()).unwrap();
        let first = state.config.load_full();
        assert!(matches!(state.reload(), Reload::Unchanged));

        // A new certificate with the old key: rejected, the old config stays, and the same bad
        // contents are not retried.
        let (cert, key) = pair();
        std::fs::write(&m.settings.cert, &cert).unwrap();
        assert!(matches!(
            state.reload(),
            Reload::Rejected(TlsError::Rustls(_))
        ));
        assert!(Arc::ptr_eq(&first, &state.config.load_full()));
        assert!(matches!(state.reload(), Reload::Unchanged));

        std::fs::write(&m.settings.key, &key).unwrap();
        assert!(matches!(state.reload(), Reload::Installed));
        let second = state.config.load_full();
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(second.alpn_protocols, [b"h2".to_vec()]);

        // A file missing mid-rotation is an error each time, never a config without it.
        std::fs::remove_file(&m.settings.key).unwrap();
        assert!(matches!(
            state.reload(),
            Reload::Rejected(TlsError::Read { .. })
        ));
        assert!(Arc::ptr_eq(&second, &state.config.load_full()));
        std::fs::write(&m.settings.key, &key).unwrap();
        assert!(matches!(state.reload(), Reload::Unchanged));

        std::fs::write(&m.settings.cert, "not a certificate").unwrap();
        assert!(matches!(
            state.reload(),
            Reload::Rejected(TlsError::Pem { .. })
        ));
        assert!(Arc::ptr_eq(&second, &state.config.load_full()));
        drop(m.dir);
    }

    #[test]
    fn load_rejects_bad_material_naming_the_file() {
        let m = material();
        let mut bad_ca = m.settings.clone();
        let ca = m.dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        bad_ca.client_ca = Some(ca);
        let err = TlsState::load(bad_ca).unwrap_err().to_string();
        assert!(err.contains("ca.pem"), "{err}");

        let mut empty_key = m.settings.clone();
        std::fs::write(m.dir.path().join("empty"), "").unwrap();
        empty_key.key = m.dir.path().join("empty");
        let err = TlsState::load(empty_key).unwrap_err().to_string();
        assert!(err.contains("empty"), "{err}");

        let mut client_ca = m.settings.clone();
        client_ca.client_ca = Some(m.settings.cert.clone());
        let state = TlsState::load(client_ca).unwrap();
        assert!(!state.enforces_allow_list());
    }
}
