//! An upstream application for tests that measure what reached it ([`SlowApp`]): it holds each
//! request for a while and counts, per tenant (`x-tenant`), how many it serves at once, so a test
//! checks an in-flight cap by what the app saw, not by what the limiter says.
//!
//! HTTP/1.1 with keep-alive, one thread per connection (Envoy opens as many upstream connections
//! as it has requests in flight). Each request is held `x-hold-ms` ms (default: the app's hold)
//! and answered `200 ok`; a request with `x-cost: N` is answered with `x-tokens: N` (what an LLM
//! response reports it cost), and the app adds N to the tenant's cost served. Stopped on drop.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::Duration;

/// Per tenant: requests being served now, the most ever at once, requests served, and the cost
/// (`x-cost`) of the responses served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub now: u64,
    pub max: u64,
    pub served: u64,
    pub cost: u64,
}

type Tenants = Arc<Mutex<HashMap<String, Seen>>>;

/// A running app on a loopback port.
pub struct SlowApp {
    pub addr: SocketAddr,
    tenants: Tenants,
    stop: Arc<AtomicBool>,
}

impl SlowApp {
    /// Serves on a free loopback port, holding each request `hold` unless it says otherwise.
    pub fn start(hold: Duration) -> SlowApp {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind app");
        let addr = listener.local_addr().unwrap();
        let tenants = Tenants::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (tenants.clone(), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let t = t.clone();
                thread::spawn(move || serve(conn, &t, hold));
            }
        });
        SlowApp {
            addr,
            tenants,
            stop,
        }
    }

    /// What the app saw of `tenant`.
    pub fn seen(&self, tenant: &str) -> Seen {
        lock(&self.tenants).get(tenant).copied().unwrap_or_default()
    }
}

impl Drop for SlowApp {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn lock(tenants: &Tenants) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
    tenants.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Serves the requests of one connection until it closes.
fn serve(conn: TcpStream, tenants: &Tenants, hold: Duration) {
    let mut reader = BufReader::new(conn);
    while let Some(head) = read_head(&mut reader) {
        let tenant = head.get("x-tenant").cloned().unwrap_or_default();
        let held = head
            .get("x-hold-ms")
            .and_then(|ms| ms.parse().ok())
            .map_or(hold, Duration::from_millis);
        let cost: Option<u64> = head.get("x-cost").and_then(|c| c.parse().ok());
        {
            let mut map = lock(tenants);
            let seen = map.entry(tenant.clone()).or_default();
            seen.now += 1;
            seen.max = seen.max.max(seen.now);
        }
        thread::sleep(held);
        {
            let mut map = lock(tenants);
            let seen = map.entry(tenant).or_default();
            seen.now -= 1;
            seen.served += 1;
            seen.cost += cost.unwrap_or(0);
        }
        let tokens = cost.map_or(String::new(), |c| format!("x-tokens: {c}\r\n"));
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n{tokens}\r\nok"
        );
        if reader.get_mut().write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// One request's headers (names lower-cased); `None` when the connection closed. Requests
/// carry no body (GET).
fn read_head(reader: &mut BufReader<TcpStream>) -> Option<HashMap<String, String>> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut headers = HashMap::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            return Some(headers);
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_owned());
        }
    }
}
