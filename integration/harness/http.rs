//! A minimal blocking HTTP/1.1 client for tests that talk to Envoy as a client would: header
//! values are bytes (obs-text, 60 KiB values), responses keep every header line as sent, in
//! order, so a test can see a header that arrived twice.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Barrier;
use std::time::Duration;

/// One response: status, every header line (name lower-cased, value as bytes), body.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    /// Every value of header `name` (case-insensitive), in arrival order.
    pub fn all(&self, name: &str) -> Vec<String> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    /// The one value of header `name`; panics when it arrived more than once.
    pub fn one(&self, name: &str) -> Option<String> {
        let values = self.all(name);
        assert!(
            values.len() <= 1,
            "header {name} arrived {} times: {values:?}",
            values.len()
        );
        values.into_iter().next()
    }
}

/// A keep-alive HTTP/1.1 connection; reconnects when the server closed it.
pub struct HttpClient {
    addr: SocketAddr,
    stream: Option<BufReader<TcpStream>>,
}

impl HttpClient {
    pub fn new(addr: SocketAddr) -> HttpClient {
        HttpClient { addr, stream: None }
    }

    /// `GET path` with `headers` (values as bytes). Retries once on a connection the server
    /// had closed between two requests.
    pub fn get(&mut self, path: &str, headers: &[(&str, &[u8])]) -> HttpResponse {
        let mut request = format!("GET {path} HTTP/1.1\r\nhost: test\r\n").into_bytes();
        for (name, value) in headers {
            request.extend_from_slice(name.as_bytes());
            request.extend_from_slice(b": ");
            request.extend_from_slice(value);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"\r\n");
        match self.exchange(&request) {
            Ok(response) => response,
            Err(_) => {
                self.stream = None;
                self.exchange(&request)
                    .unwrap_or_else(|e| panic!("GET {path} via {}: {e}", self.addr))
            }
        }
    }

    fn exchange(&mut self, request: &[u8]) -> std::io::Result<HttpResponse> {
        if self.stream.is_none() {
            let stream = TcpStream::connect(self.addr)?;
            stream.set_read_timeout(Some(Duration::from_secs(10)))?;
            stream.set_nodelay(true)?;
            self.stream = Some(BufReader::new(stream));
        }
        let reader = self.stream.as_mut().unwrap();
        reader.get_mut().write_all(request)?;
        let response = read_response(reader);
        if response.as_ref().map_or(true, closes) {
            self.stream = None;
        }
        response
    }
}

fn closes(response: &HttpResponse) -> bool {
    response
        .all("connection")
        .iter()
        .any(|v| v.eq_ignore_ascii_case("close"))
}

fn read_response(reader: &mut BufReader<TcpStream>) -> std::io::Result<HttpResponse> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = Vec::new();
    if reader.read_until(b'\n', &mut line)? == 0 {
        return Err(bad("connection closed before a response"));
    }
    let status = String::from_utf8_lossy(&line)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status line"))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_until(b'\n', &mut line)?;
        let trimmed = line.strip_suffix(b"\r\n").unwrap_or(&line);
        if trimmed.is_empty() {
            break;
        }
        let colon = trimmed
            .iter()
            .position(|b| *b == b':')
            .ok_or_else(|| bad("header line without a colon"))?;
        let name = String::from_utf8_lossy(&trimmed[..colon]).to_ascii_lowercase();
        let value = trimmed[colon + 1..].trim_ascii().to_vec();
        headers.push((name, value));
    }
    let mut response = HttpResponse {
        status,
        headers,
        body: Vec::new(),
    };
    let length = response
        .all("content-length")
        .first()
        .and_then(|v| v.parse::<usize>().ok());
    match length {
        Some(n) => {
            response.body = vec![0; n];
            reader.read_exact(&mut response.body)?;
        }
        None if response.all("transfer-encoding").is_empty() => {}
        None => response.body = read_chunked(reader)?,
    }
    Ok(response)
}

/// A `transfer-encoding: chunked` body (no trailers expected).
fn read_chunked(reader: &mut BufReader<TcpStream>) -> std::io::Result<Vec<u8>> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let size_field = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size_field, 16).map_err(|_| bad("chunk size"))?;
        if size == 0 {
            line.clear();
            reader.read_line(&mut line)?;
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        line.clear();
        reader.read_line(&mut line)?;
    }
}

/// Runs `client(i, start)` for each `i` in `0..n`, every one on its own thread at once, and
/// returns the statuses they return, client by client. `start` is a barrier of `n` the bodies
/// wait on: once, to begin together, or every round, to send their requests in bunches.
pub fn concurrently<F>(n: usize, client: F) -> Vec<u16>
where
    F: Fn(usize, &Barrier) -> Vec<u16> + Sync,
{
    let start = Barrier::new(n);
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (client, start) = (&client, &start);
                scope.spawn(move || client(i, start))
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a client thread panicked"))
            .collect()
    })
}
