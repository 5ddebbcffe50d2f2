//! The admin listener as `sluice` subcommands call it: one HTTP/1.0 request per call (the server
//! closes the connection after answering), over plain TCP.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

/// Bound on connecting to and hearing from the admin listener.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The operator token in `file` (its one line, trimmed), to send with each request.
pub fn token(file: Option<&Path>) -> std::io::Result<Option<String>> {
    let Some(file) = file else { return Ok(None) };
    let text = std::fs::read_to_string(file)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
    Ok(Some(text.trim().to_owned()))
}

/// One HTTP/1.0 request (the server closes the connection after answering), with the operator
/// token when given: status and body.
pub fn exchange(
    admin: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let addr = admin.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no address for the admin listener",
        )
    })?;
    let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {admin}\r\nAccept: application/json\r\n\
         {authorization}\r\n"
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
