//! Serving threads: the gRPC listener's connections spread over one current-thread runtime per
//! serving thread (`--worker-threads`, default one per CPU; [`crate::runtime`] says why), each
//! running its own copy of the gRPC server. State (limiter, backend, metrics) is shared.
//!
//! - Share 0 is the runtime [`start`] is called on (`sluice serve`: the main thread's, beside the
//!   background tasks and the Redis client's); shares 1.. run on threads started here, each ending
//!   once its server has drained.
//! - With one share the server accepts on the listener itself. With more, one accept loop on
//!   share 0 hands each connection to the share with the fewest open ones (ties: the lowest), so
//!   a single connection (Envoy's) is served on share 0 and many spread evenly.
//! - Every share stops accepting when `closing` is sent ([`super::drain`]) and drains for at most
//!   the drain timeout from then.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};

use super::ServeError;
use super::drain;
use crate::runtime;
use crate::security::listener::{ConnectionLimits, ConnectionStats, Handoff, Seat};
use crate::security::tls::{GrpcIncoming, TlsState};

/// Pause after a failed `accept` (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);

/// The gRPC server over one share's connections, stopping to accept when its second argument
/// resolves (tonic's `serve_with_incoming_shutdown`).
pub(super) type ServeShare = Arc<
    dyn Fn(
            GrpcIncoming,
            BoxFuture<'static, ()>,
        ) -> BoxFuture<'static, Result<(), tonic::transport::Error>>
        + Send
        + Sync,
>;

/// What every share's connections are held to: TLS, limits and the shared counts.
pub(super) struct Listening {
    pub listener: TcpListener,
    pub tls: Option<Arc<TlsState>>,
    pub limits: ConnectionLimits,
    pub stats: Arc<ConnectionStats>,
}

impl Listening {
    /// A share's connections, as the accept loop hands them over on `handed`.
    fn handed(&self, handed: mpsc::UnboundedReceiver<Handoff>) -> GrpcIncoming {
        GrpcIncoming::handed(handed, self.tls.clone()).with_limits(self.limits, self.stats.clone())
    }
}

/// Starts serving on `threads` shares (at least one); the returned future runs share 0 and
/// resolves once every share has drained, with the first error any returned.
pub(super) fn start(
    listening: Listening,
    threads: usize,
    serve: ServeShare,
    closing: watch::Receiver<bool>,
    drain_timeout: Duration,
) -> Result<impl Future<Output = Result<(), ServeError>> + Send + 'static, ServeError> {
    let run = move |incoming: GrpcIncoming, closing: watch::Receiver<bool>, serve: &ServeShare| {
        let server = serve(incoming, Box::pin(closed(closing.clone())));
        drain::drained(server, closing, drain_timeout)
    };
    if threads <= 1 {
        let incoming = GrpcIncoming::new(listening.listener, listening.tls)
            .with_limits(listening.limits, listening.stats);
        let own = run(incoming, closing, &serve);
        return Ok(futures::future::Either::Left(own));
    }
    let mut seats = Vec::with_capacity(threads);
    let mut others = Vec::with_capacity(threads - 1);
    let mut own = None;
    for share in 0..threads {
        let (handoffs, handed) = mpsc::unbounded_channel();
        let open = Arc::new(AtomicU64::new(0));
        seats.push(ShareSeats { handoffs, open });
        let server = run(listening.handed(handed), closing.clone(), &serve);
        if share == 0 {
            own = Some(server);
        } else {
            others.push(spawn_share(share, server)?);
        }
    }
    tokio::spawn(accept_loop(listening.listener, seats, closing));
    let own = own.expect("share 0 is built first");
    Ok(futures::future::Either::Right(async move {
        let mut result = own.await;
        for other in others {
            let other = other.await.unwrap_or_else(|_| {
                Err(ServeError::Backend(
                    "a serving thread ended without an answer".into(),
                ))
            });
            result = result.and(other);
        }
        result
    }))
}

/// A listener bound to `addr` (gRPC, admin, metrics).
pub(super) async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// The address `listener` is bound to (`addr` as asked, for the error).
pub(super) fn local_addr(
    listener: &TcpListener,
    addr: SocketAddr,
) -> Result<SocketAddr, ServeError> {
    listener
        .local_addr()
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Resolves once `closing` is sent (or its sender is gone).
async fn closed(mut closing: watch::Receiver<bool>) {
    let _ = closing.wait_for(|c| *c).await;
}

/// Runs `server` on a thread of its own with a current-thread runtime; the receiver gets its
/// result once it has drained.
fn spawn_share(
    share: usize,
    server: impl Future<Output = Result<(), ServeError>> + Send + 'static,
) -> Result<oneshot::Receiver<Result<(), ServeError>>, ServeError> {
    let runtime = runtime::current_thread().map_err(ServeError::Thread)?;
    let (done, result) = oneshot::channel();
    std::thread::Builder::new()
        .name(format!("sluice-serve-{share}"))
        .spawn(move || {
            // Dropping the runtime afterwards ends what the drain timeout cut short.
            let _ = done.send(runtime.block_on(server));
        })
        .map_err(ServeError::Thread)?;
    Ok(result)
}

/// One share as the accept loop sees it: where its connections go, and how many it has open.
struct ShareSeats {
    handoffs: mpsc::UnboundedSender<Handoff>,
    open: Arc<AtomicU64>,
}

/// Accepts until `closing`, handing each connection to the share with the fewest open ones.
/// Returning drops the listener, which closes the listening socket.
async fn accept_loop(
    listener: TcpListener,
    shares: Vec<ShareSeats>,
    mut closing: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = closing.wait_for(|c| *c) => return,
        };
        match accepted {
            Ok((tcp, remote_addr)) => hand_over(&shares, tcp, remote_addr),
            Err(error) => {
                tracing::debug!(%error, "gRPC listener: accept failed");
                tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
            }
        }
    }
}

/// Hands `tcp` to the share with the fewest open connections (the first of equals).
fn hand_over(shares: &[ShareSeats], tcp: TcpStream, remote_addr: SocketAddr) {
    let Some(share) = shares.iter().min_by_key(|s| s.open.load(Ordering::Relaxed)) else {
        return;
    };
    let seat = Seat::take(&share.open);
    match tcp.into_std() {
        // A share whose server has stopped drops the connection, which closes it.
        Ok(tcp) => {
            let _ = share.handoffs.send(Handoff {
                tcp,
                remote_addr,
                seat,
            });
        }
        Err(error) => tracing::debug!(%remote_addr, %error, "cannot hand the connection over"),
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::security::tls::Conn;

    /// A "server" that reports each connection it takes, with the thread it was taken on, and
    /// holds it open until the test drops it.
    fn reporting(seen: mpsc::UnboundedSender<(String, Conn)>) -> ServeShare {
        Arc::new(move |mut incoming: GrpcIncoming, mut stop| {
            let seen = seen.clone();
            Box::pin(async move {
                loop {
                    tokio::select! {
                        conn = incoming.next() => match conn {
                            Some(Ok(conn)) => {
                                let thread = std::thread::current().name().unwrap_or("").to_string();
                                let _ = seen.send((thread, conn));
                            }
                            Some(Err(_)) => {}
                            None => return Ok(()),
                        },
                        () = &mut stop => return Ok(()),
                    }
                }
            })
        })
    }

    #[tokio::test(flavor = "current_thread")]
    async fn each_connection_goes_to_the_share_with_the_fewest_open() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let listening = Listening {
            listener,
            tls: None,
            limits: ConnectionLimits::default(),
            stats: Arc::default(),
        };
        let (seen_tx, mut seen) = mpsc::unbounded_channel();
        let (closing, closing_rx) = watch::channel(false);
        let served = start(
            listening,
            2,
            reporting(seen_tx),
            closing_rx,
            Duration::from_secs(5),
        )
        .unwrap();
        let served = tokio::spawn(served);
        let here = std::thread::current().name().unwrap_or("").to_string();

        let _first = TcpStream::connect(addr).await.unwrap();
        let (thread, first_conn) = seen.recv().await.unwrap();
        assert_eq!(thread, here, "a lone connection is served on share 0");
        let _second = TcpStream::connect(addr).await.unwrap();
        let (thread, _second_conn) = seen.recv().await.unwrap();
        assert_eq!(thread, "sluice-serve-1");
        drop(first_conn);
        let _third = TcpStream::connect(addr).await.unwrap();
        let (thread, _third_conn) = seen.recv().await.unwrap();
        assert_eq!(thread, here, "share 0 has none open again");

        closing.send(true).unwrap();
        served.await.unwrap().unwrap();
    }
}
