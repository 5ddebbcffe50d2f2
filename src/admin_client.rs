//! The admin listener as the CLI's subcommands read it: one HTTP/1.1 GET per call over a plain
//! TCP connection (the admin listener speaks plain HTTP on loopback or a private port).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Why a call to the admin listener gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminCallError {
    #[error("cannot reach the admin listener at {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("the admin listener at {addr} closed the call: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("the admin listener at {addr} answered something that is not HTTP/1.1")]
    Malformed { addr: String },
}

/// `GET path` (with its query, already URL-encoded) on `addr`: the status and the body.
pub fn get(addr: &str, path: &str, timeout: Duration) -> Result<(u16, String), AdminCallError> {
    let connect = |source| AdminCallError::Connect {
        addr: addr.to_owned(),
        source,
    };
    let io = |source| AdminCallError::Io {
        addr: addr.to_owned(),
        source,
    };
    let target = addr
        .to_socket_addrs()
        .map_err(connect)?
        .next()
        .ok_or_else(|| connect(std::io::ErrorKind::NotFound.into()))?;
    let mut stream = TcpStream::connect_timeout(&target, timeout).map_err(connect)?;
    stream.set_read_timeout(Some(timeout)).map_err(io)?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let malformed = || AdminCallError::Malformed {
        addr: addr.to_owned(),
    };
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(malformed)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(malformed)?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

/// The payload of a chunked body (sizes in hex, each chunk followed by CRLF, 0 ends).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(
            super::dechunk("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "hello world"
        );
    }
}
