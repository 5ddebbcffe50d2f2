//! The admin listener as `sluice` subcommands call it: one HTTP/1.0 request per call (the server
//! closes the connection after answering), over plain TCP.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Bound on connecting to and hearing from the admin listener.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP/1.0 request (the server closes the connection after answering): status and body.
pub fn exchange(admin: &str, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let addr = admin.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no address for the admin listener",
        )
    })?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {admin}\r\nAccept: application/json\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "no HTTP status"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
