//! What one TCP connection to the gRPC listener may cost before it carries an RPC: a cap on
//! open connections, and a deadline for the TLS handshake plus the HTTP/2 client preface and
//! its first SETTINGS frame.
//!
//! [`crate::security::tls::GrpcIncoming`] takes a [`ConnectionSlot`] at accept (over the cap the
//! socket is closed at once) and gives every connection a [`ConnectionGuard`]; the guard's
//! [`HandshakeWatch`] reads along with the HTTP/2 server until the preface and SETTINGS have
//! arrived, and fails the connection's reads once the deadline passes first. [`ConnectionStats`]
//! counts both refusals and the open connections for the metrics.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// The HTTP/2 client connection preface (RFC 9113 §3.4), before its SETTINGS frame.
const PREFACE_LEN: usize = 24;
/// An HTTP/2 frame header: 3 bytes length, type, flags, 4 bytes stream id.
const FRAME_HEADER_LEN: usize = 9;

/// Bounds of the gRPC listener on connections (`--max-connections`, `--handshake-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections (pending TLS handshakes included); one more is closed at accept.
    pub max_connections: u64,
    /// From accept to the end of the first SETTINGS frame after the client preface.
    pub handshake_timeout: Duration,
}

impl ConnectionLimits {
    pub const DEFAULT_MAX_CONNECTIONS: u64 = 10_000;
    pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: Self::DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// Why a connection was closed before it could carry an RPC (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `--max-connections` were open at accept.
    Cap,
    /// TLS, the preface or its SETTINGS frame did not arrive within `--handshake-timeout` (or
    /// the TLS handshake not within `--tls-handshake-timeout`).
    HandshakeTimeout,
}

impl Refusal {
    pub const ALL: [Refusal; 2] = [Refusal::Cap, Refusal::HandshakeTimeout];

    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::Cap => "cap",
            Refusal::HandshakeTimeout => "handshake_timeout",
        }
    }
}

/// Open connections of the gRPC listener and the ones it refused, by reason.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    open: AtomicU64,
    refused: [AtomicU64; 2],
}

impl ConnectionStats {
    pub fn open(&self) -> u64 {
        self.open.load(Ordering::Relaxed)
    }

    pub fn refused(&self, reason: Refusal) -> u64 {
        self.refused[reason as usize].load(Ordering::Relaxed)
    }

    pub(crate) fn count_refusal(&self, reason: Refusal) {
        self.refused[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A slot for one more connection, or `None` (counted) when `max` are open.
    pub(crate) fn admit(self: &Arc<Self>, max: u64) -> Option<ConnectionSlot> {
        let admitted = self
            .open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
                (open < max).then_some(open + 1)
            })
            .is_ok();
        if !admitted {
            self.count_refusal(Refusal::Cap);
            return None;
        }
        Some(ConnectionSlot(Arc::clone(self)))
    }
}

/// One open connection, counted until dropped.
#[derive(Debug)]
pub struct ConnectionSlot(Arc<ConnectionStats>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection accepted on one thread and handed to the serving thread that will run it
/// (`crate::server`'s serving threads): the socket, taken off the accepting runtime's reactor so
/// the receiving runtime registers it with its own, the peer, and its seat there.
#[derive(Debug)]
pub struct Handoff {
    pub tcp: std::net::TcpStream,
    pub remote_addr: SocketAddr,
    pub seat: Seat,
}

/// One connection counted on the serving thread it was handed to, until dropped.
#[derive(Debug)]
pub struct Seat(Arc<AtomicU64>);

impl Seat {
    /// Counts one more connection in `open`.
    pub fn take(open: &Arc<AtomicU64>) -> Seat {
        open.fetch_add(1, Ordering::Relaxed);
        Seat(Arc::clone(open))
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Where [`crate::security::tls::GrpcIncoming`] takes its connections from.
pub(crate) enum Source {
    Listener(TcpListener),
    Handed(mpsc::UnboundedReceiver<Handoff>),
}

impl Source {
    /// The next connection, its peer and (handed over) its seat; `None` once the senders of a
    /// handed source are gone.
    #[allow(clippy::type_complexity, reason = "one private poll function's result")]
    pub(crate) fn poll_accept(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<io::Result<(TcpStream, SocketAddr, Option<Seat>)>>> {
        match self {
            Source::Listener(listener) => listener
                .poll_accept(cx)
                .map(|accepted| Some(accepted.map(|(tcp, remote)| (tcp, remote, None)))),
            Source::Handed(handed) => handed.poll_recv(cx).map(|handoff| {
                handoff.map(|h| {
                    TcpStream::from_std(h.tcp).map(|tcp| (tcp, h.remote_addr, Some(h.seat)))
                })
            }),
        }
    }
}

/// What an accepted connection carries: its slot, its seat on a serving thread when it was
/// handed to one, and, until the handshake is complete, the watch over it.
#[derive(Debug)]
pub struct ConnectionGuard {
    _slot: ConnectionSlot,
    _seat: Option<Seat>,
    watch: Option<HandshakeWatch>,
}

impl ConnectionGuard {
    pub(crate) fn new(slot: ConnectionSlot, seat: Option<Seat>, timeout: Duration) -> Self {
        ConnectionGuard {
            _seat: seat,
            watch: Some(HandshakeWatch {
                deadline: Box::pin(tokio::time::sleep(timeout)),
                seen: 0,
                needed: PREFACE_LEN + FRAME_HEADER_LEN,
                length: [0; 3],
                expired: false,
                stats: Arc::clone(&slot.0),
            }),
            _slot: slot,
        }
    }

    /// Resolves when the deadline passes (counted); pending forever once the handshake is done.
    pub(crate) async fn expired(&mut self) {
        match self.watch.as_mut() {
            Some(watch) => std::future::poll_fn(|cx| watch.poll_expired(cx)).await,
            None => std::future::pending().await,
        }
    }

    /// Call before reading: fails the read once the deadline has passed with the handshake
    /// incomplete, and wakes the reader when it passes.
    pub(crate) fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.watch.as_mut().map(|w| w.poll_expired(cx)) {
            Some(Poll::Ready(())) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "HTTP/2 preface and SETTINGS not received within --handshake-timeout",
            )),
            _ => Ok(()),
        }
    }

    /// Call with the bytes a read returned: once the preface and the SETTINGS frame after it
    /// are in, the deadline no longer applies.
    pub(crate) fn read(&mut self, bytes: &[u8]) {
        if let Some(watch) = self.watch.as_mut()
            && watch.saw(bytes)
        {
            self.watch = None;
        }
    }
}

/// Counts the bytes of the client preface and of the frame after it (SETTINGS, whose length
/// the frame header gives). The HTTP/2 server checks their content; this only waits for them.
#[derive(Debug)]
struct HandshakeWatch {
    deadline: Pin<Box<tokio::time::Sleep>>,
    seen: usize,
    /// Bytes that complete the handshake: the preface and a frame header, then that frame.
    needed: usize,
    length: [u8; 3],
    expired: bool,
    stats: Arc<ConnectionStats>,
}

impl HandshakeWatch {
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.expired {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            self.expired = true;
            self.stats.count_refusal(Refusal::HandshakeTimeout);
        }
        Poll::Ready(())
    }

    /// Takes the next bytes read; true once the handshake is complete.
    fn saw(&mut self, bytes: &[u8]) -> bool {
        let header_at = PREFACE_LEN;
        for (i, &b) in bytes.iter().enumerate() {
            let at = self.seen + i;
            if (header_at..header_at + 3).contains(&at) {
                self.length[at - header_at] = b;
            }
            if at + 1 == header_at + FRAME_HEADER_LEN {
                let [a, b, c] = self.length;
                self.needed += u32::from_be_bytes([0, a, b, c]) as usize;
            }
        }
        self.seen = self.seen.saturating_add(bytes.len());
        self.seen >= self.needed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> HandshakeWatch {
        HandshakeWatch {
            deadline: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
            seen: 0,
            needed: PREFACE_LEN + FRAME_HEADER_LEN,
            length: [0; 3],
            expired: false,
            stats: Arc::default(),
        }
    }

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    #[tokio::test]
    async fn the_handshake_is_the_preface_and_one_settings_frame() {
        let settings = [&[0, 0, 12, 4, 0, 0, 0, 0, 0][..], &[7; 12]].concat();
        let all = [PREFACE, &settings].concat();
        // Byte by byte: complete exactly at the frame's last byte.
        let mut w = watch();
        for (i, b) in all.iter().enumerate() {
            assert_eq!(w.saw(&[*b]), i + 1 == all.len(), "byte {i}");
        }
        // In one read, or the preface alone.
        assert!(watch().saw(&all));
        let mut w = watch();
        assert!(!w.saw(PREFACE));
        assert!(!w.saw(&settings[..9]));
        assert!(w.saw(&settings[9..]));
        // An empty SETTINGS frame completes with its header.
        assert!(watch().saw(&[PREFACE, &[0, 0, 0, 4, 0, 0, 0, 0, 0]].concat()));
    }

    #[test]
    fn admission_stops_at_the_cap_and_slots_free_on_drop() {
        let stats = Arc::new(ConnectionStats::default());
        let a = stats.admit(2).unwrap();
        let _b = stats.admit(2).unwrap();
        assert!(stats.admit(2).is_none());
        assert_eq!((stats.open(), stats.refused(Refusal::Cap)), (2, 1));
        drop(a);
        assert!(stats.admit(2).is_some());
        assert_eq!(stats.open(), 1, "the new slot was dropped at once");
    }
}
