//! The admin listener's connections, served apart from the decisions.
//!
//! The admin router runs on its own OS thread, on a current-thread tokio runtime, at a lower CPU
//! priority (nice 10 on Linux): merging `/top`, encoding `/metrics` or answering a flood of
//! requests takes that one thread's time, never an RLS worker's, and when the CPUs are busy the
//! scheduler runs the RLS workers first. Backend calls (`/buckets`) are handed to the RLS runtime,
//! which owns the backend's connections, and awaited here.
//!
//! Connections are bounded: at most `max_connections` open; one more is taken in by closing the
//! open connection that has waited longest without a request in progress (a held idle connection
//! gives way to a probe), and closed at once only when every open connection has a request in
//! progress. A request's headers must arrive within `header_timeout` of the connection opening or
//! of the previous answer (so an idle keep-alive connection closes then too), and a connection on
//! which no byte moved for `idle_timeout` is closed (checked every quarter of it).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::connect_info::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot, watch};
use tower_service::Service;

use crate::telemetry::AdminMetrics;

/// Bounds of the admin listener's connections (`--admin-max-connections`,
/// `--admin-header-timeout`, `--admin-idle-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// How long a stopping listener waits for its connections to finish their answers.
const DRAIN_DEADLINE: Duration = Duration::from_secs(5);

/// The admin listener's thread, running until the stop signal.
pub struct AdminThread {
    done: oneshot::Receiver<()>,
}

impl AdminThread {
    /// Resolves once the listener has stopped and its connections are closed.
    pub async fn join(self) {
        let _ = self.done.await;
    }
}

/// Serves each router on its listener from one new thread until `stop` turns true.
pub fn spawn(
    listeners: Vec<(std::net::TcpListener, Router)>,
    limits: ListenerLimits,
    metrics: AdminMetrics,
    stop: watch::Receiver<bool>,
) -> io::Result<AdminThread> {
    for (listener, _) in &listeners {
        listener.set_nonblocking(true)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (done_tx, done) = oneshot::channel();
    std::thread::Builder::new()
        .name("sluice-admin".into())
        .spawn(move || {
            lower_priority();
            runtime.block_on(async move {
                let mut served = tokio::task::JoinSet::new();
                for (listener, router) in listeners {
                    match TcpListener::from_std(listener) {
                        Ok(listener) => {
                            let (metrics, stop) = (metrics.clone(), stop.clone());
                            served.spawn(serve(listener, router, limits, metrics, stop));
                        }
                        Err(e) => tracing::error!(error = %e, "admin listener failed"),
                    }
                }
                while served.join_next().await.is_some() {}
            });
            let _ = done_tx.send(());
        })?;
    Ok(AdminThread { done })
}

/// Nice 10 for the calling thread, so the RLS workers are scheduled first on busy CPUs.
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread's own id; no memory is shared.
    let result = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10)
    };
    if result != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "admin thread keeps its priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// The accept loop: admits (or refuses) each connection and serves it on its own task; on stop,
/// lets every connection finish its answer (up to [`DRAIN_DEADLINE`]).
async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ListenerLimits,
    metrics: AdminMetrics,
    mut stop: watch::Receiver<bool>,
) {
    let open = Arc::new(Open::default());
    loop {
        let (stream, peer) = tokio::select! {
            () = stopped(&mut stop) => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, most often: wait for some to close.
                    tracing::warn!(error = %e, "admin listener cannot accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some((conn, evicted)) = open.admit(limits.max_connections) else {
            metrics.refused("cap");
            drop(stream);
            continue;
        };
        if evicted {
            metrics.refused("evicted");
        }
        let served = Served {
            router: router.clone(),
            limits,
            metrics: metrics.clone(),
            stop: stop.clone(),
            open: Arc::clone(&open),
        };
        tokio::spawn(served.connection(stream, peer, conn));
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN_DEADLINE, open.emptied()).await;
}

/// One open connection as the accept loop sees it.
#[derive(Default)]
struct Conn {
    id: u64,
    /// Requests in progress.
    busy: AtomicUsize,
    /// Told when the connection is evicted.
    close: Notify,
}

/// The open connections, oldest first.
#[derive(Default)]
struct Open {
    conns: Mutex<VecDeque<Arc<Conn>>>,
    next_id: AtomicU64,
    left: Notify,
}

impl Open {
    /// A slot for a new connection, evicting the oldest one without a request in progress when
    /// `cap` are open (`true` when one was); `None` when every open one is busy.
    fn admit(&self, cap: usize) -> Option<(Arc<Conn>, bool)> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let mut evicted = false;
        if conns.len() >= cap {
            let idle = conns
                .iter()
                .position(|c| c.busy.load(Ordering::SeqCst) == 0)?;
            let gone = conns.remove(idle).expect("found above");
            gone.close.notify_one();
            evicted = true;
        }
        let conn = Arc::new(Conn {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            ..Conn::default()
        });
        conns.push_back(Arc::clone(&conn));
        Some((conn, evicted))
    }

    fn leave(&self, id: u64) {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns.retain(|c| c.id != id);
        self.left.notify_waiters();
    }

    async fn emptied(&self) {
        loop {
            let left = self.left.notified();
            if self.conns.lock().map(|c| c.is_empty()).unwrap_or(true) {
                return;
            }
            left.await;
        }
    }
}

/// What one connection's task needs.
struct Served {
    router: Router,
    limits: ListenerLimits,
    metrics: AdminMetrics,
    stop: watch::Receiver<bool>,
    open: Arc<Open>,
}

/// Why a connection's task ended.
enum Ended {
    Done,
    Evicted,
    Idle,
}

impl Served {
    async fn connection(mut self, stream: TcpStream, peer: SocketAddr, conn: Arc<Conn>) {
        let progress = Arc::new(AtomicU64::new(0));
        let io = TokioIo::new(Watched {
            inner: stream,
            progress: Arc::clone(&progress),
        });
        let router = self.router.clone();
        let busy = Arc::clone(&conn);
        let service = hyper::service::service_fn(move |mut request: http::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            let in_progress = InProgress::new(Arc::clone(&busy));
            let answer = router.clone().call(request);
            async move {
                let answer = answer.await;
                drop(in_progress);
                answer.map_err(|never: Infallible| match never {})
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .keep_alive(true);
        let served = builder.serve_connection(io, service);
        tokio::pin!(served);
        let idle = quiet_for(&progress, self.limits.idle_timeout);
        tokio::pin!(idle);
        let mut stopping = false;
        let ended = loop {
            tokio::select! {
                result = served.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, %peer, "admin connection ended");
                    }
                    break Ended::Done;
                }
                _ = conn.close.notified() => break Ended::Evicted,
                _ = &mut idle => break Ended::Idle,
                () = stopped(&mut self.stop), if !stopping => {
                    stopping = true;
                    served.as_mut().graceful_shutdown();
                }
            }
        };
        match ended {
            Ended::Done | Ended::Evicted => {}
            Ended::Idle => self.metrics.refused("idle_timeout"),
        }
        self.open.leave(conn.id);
    }
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Marks a request in progress on its connection (not evictable) until dropped.
struct InProgress(Arc<Conn>);

impl InProgress {
    fn new(conn: Arc<Conn>) -> Self {
        conn.busy.fetch_add(1, Ordering::SeqCst);
        InProgress(conn)
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves once `progress` has not moved for `timeout` (looked at every quarter of it).
async fn quiet_for(progress: &AtomicU64, timeout: Duration) {
    const LOOKS: u32 = 4;
    let tick = (timeout / LOOKS).max(Duration::from_millis(1));
    let mut last = progress.load(Ordering::Relaxed);
    let mut quiet = 0;
    loop {
        tokio::time::sleep(tick).await;
        let now = progress.load(Ordering::Relaxed);
        if now == last {
            quiet += 1;
            if quiet >= LOOKS {
                return;
            }
        } else {
            quiet = 0;
            last = now;
        }
    }
}

/// A connection's stream, counting the reads and writes that moved bytes.
struct Watched {
    inner: TcpStream,
    progress: Arc<AtomicU64>,
}

impl Watched {
    fn moved<T>(&self, poll: Poll<io::Result<T>>, bytes: usize) -> Poll<io::Result<T>> {
        if bytes > 0 && matches!(poll, Poll::Ready(Ok(_))) {
            self.progress.fetch_add(1, Ordering::Relaxed);
        }
        poll
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        this.moved(poll, read)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, data);
        let written = match &poll {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        this.moved(poll, written)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, data);
        let written = match &poll {
            Poll::Ready(Ok(n)) => *n,
            _ => 0,
        };
        this.moved(poll, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
