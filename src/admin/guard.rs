//! Who may ask what of the admin listener.
//!
//! - **Probes and metrics** (`/healthz`, `/readyz`, `/healthcheck`, `/metrics`) and the page's
//!   HTML (`/`, which holds no data) answer anyone.
//! - **Identifier reads** (every other `GET`: `/top`, `/buckets`, `/explain`, `/config`,
//!   `/status`) name tenants: refused with 403 when the `Host` header is not one of the
//!   listener's names, and, when an operator token is configured, with 401 (no token) or 403
//!   (another token).
//! - **Writes** (any other method: `DELETE /buckets`) need the `Host` check and the token, always.
//!
//! A `Host` is the listener's when it is an IP literal (a DNS-rebinding page always sends its own
//! host name), `localhost`, or a name given with `--admin-host`; the port is not compared. The
//! token is `Authorization: Bearer <token>` against the one line of `--admin-token-file`, read
//! on every request that needs it, so a rotated file takes effect on the next request. Every
//! refusal is logged with the caller's address and counted in
//! `sluice_admin_refused_total{reason}`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::connect_info::ConnectInfo;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Json, Response};

use crate::telemetry::AdminMetrics;

/// Why the operator token cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the admin token file {path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the admin token file {path} holds no token")]
    Empty { path: PathBuf },
}

/// The operators' token, in a file read again on every use.
#[derive(Clone, Debug)]
pub struct TokenFile(PathBuf);

impl TokenFile {
    /// The token file at `path`, read once now so a wrong path fails at start.
    pub fn open(path: PathBuf) -> Result<TokenFile, TokenError> {
        let file = TokenFile(path);
        file.read()?;
        Ok(file)
    }

    fn read(&self) -> Result<String, TokenError> {
        let text = std::fs::read_to_string(&self.0).map_err(|source| TokenError::Unreadable {
            path: self.0.clone(),
            source,
        })?;
        let token = text.trim();
        if token.is_empty() {
            return Err(TokenError::Empty {
                path: self.0.clone(),
            });
        }
        Ok(token.to_owned())
    }
}

/// What the guard checks requests against.
pub struct Guard {
    pub token: Option<TokenFile>,
    /// `--admin-host`, lower-cased.
    pub hosts: Vec<String>,
    pub metrics: AdminMetrics,
}

/// What a request may reveal or change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Open,
    Identifiers,
    Write,
}

/// The access `method` on `path` asks for.
pub fn access(method: &Method, path: &str) -> Access {
    if method != Method::GET && method != Method::HEAD {
        return Access::Write;
    }
    match path {
        "/" | "/healthz" | "/readyz" | "/healthcheck" | "/metrics" => Access::Open,
        _ => Access::Identifiers,
    }
}

impl Guard {
    pub fn new(token: Option<TokenFile>, hosts: &[String], metrics: AdminMetrics) -> Guard {
        Guard {
            token,
            hosts: hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            metrics,
        }
    }

    /// Whether `host` (a `Host` header value, port included or not) names this listener. A
    /// request without one (HTTP/1.0) cannot come from a browser's page, so it passes.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        let Some(host) = host else { return true };
        let name = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or_default(),
            None => host.rsplit_once(':').map_or(host, |(name, _port)| name),
        };
        name.parse::<IpAddr>().is_ok()
            || name.eq_ignore_ascii_case("localhost")
            || self.hosts.iter().any(|h| name.eq_ignore_ascii_case(h))
    }

    /// `None` when the request may go on, else the refusal: status, `reason` label, message.
    fn check(
        &self,
        access: Access,
        headers: &HeaderMap,
    ) -> Option<(StatusCode, &'static str, String)> {
        if access == Access::Open {
            return None;
        }
        let host = headers
            .get(header::HOST)
            .map(|h| h.to_str().unwrap_or("\u{FFFD}"));
        if !self.host_allowed(host) {
            let message = format!(
                "Host {:?} is not this admin listener's name: use its address, localhost, or a \
                 name given with --admin-host",
                host.unwrap_or_default()
            );
            return Some((StatusCode::FORBIDDEN, "foreign_host", message));
        }
        // No token: identifier reads are open; a write goes on to be refused by its route
        // (writes need --admin-write, which needs a token).
        let Some(token) = &self.token else {
            return None;
        };
        let expected = match token.read() {
            Ok(expected) => expected,
            Err(e) => {
                return Some((
                    StatusCode::SERVICE_UNAVAILABLE,
                    "token_unreadable",
                    e.to_string(),
                ));
            }
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match given {
            None => Some((
                StatusCode::UNAUTHORIZED,
                "no_token",
                "this route needs the operator token: Authorization: Bearer <token> (sluice \
                 bucket/top --admin-token-file)"
                    .to_owned(),
            )),
            Some(given) if !same(given.trim().as_bytes(), expected.as_bytes()) => Some((
                StatusCode::FORBIDDEN,
                "wrong_token",
                "the bearer token is not the operator token".to_owned(),
            )),
            Some(_) => None,
        }
    }
}

/// Compares in time independent of where the two differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The middleware: lets the request through or answers the refusal.
pub async fn guard(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let access = access(request.method(), request.uri().path());
    let Some((status, reason, message)) = guard.check(access, request.headers()) else {
        return next.run(request).await;
    };
    let caller = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |ConnectInfo(a)| a.to_string());
    tracing::warn!(%caller, method = %request.method(), path = request.uri().path(), reason,
        status = status.as_u16(), "admin request refused");
    guard.metrics.refused(reason);
    let mut response = (status, Json(serde_json::json!({ "error": message }))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            "Bearer".parse().expect("a header value"),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(token: Option<TokenFile>) -> Guard {
        Guard::new(
            token,
            &["sluice.ops.svc".to_owned()],
            AdminMetrics::default(),
        )
    }

    fn headers(host: &str, auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, host.parse().unwrap());
        if let Some(auth) = auth {
            h.insert(header::AUTHORIZATION, auth.parse().unwrap());
        }
        h
    }

    #[test]
    fn hosts_are_ip_literals_localhost_or_named() {
        let g = guard(None);
        for ok in [
            "127.0.0.1:6070",
            "10.0.0.7",
            "[::1]:6070",
            "localhost:6070",
            "Sluice.Ops.Svc:6070",
        ] {
            assert!(g.host_allowed(Some(ok)), "{ok}");
        }
        for bad in [
            "attacker.example",
            "attacker.example:6070",
            "127.0.0.1.nip.io:6070",
            "",
        ] {
            assert!(!g.host_allowed(Some(bad)), "{bad}");
        }
    }

    #[test]
    fn routes_are_open_identifier_reads_or_writes() {
        assert_eq!(access(&Method::GET, "/healthz"), Access::Open);
        assert_eq!(access(&Method::GET, "/metrics"), Access::Open);
        assert_eq!(access(&Method::GET, "/top"), Access::Identifiers);
        assert_eq!(access(&Method::GET, "/status"), Access::Identifiers);
        assert_eq!(access(&Method::DELETE, "/buckets"), Access::Write);
        assert_eq!(access(&Method::POST, "/healthz"), Access::Write);
    }

    #[test]
    fn the_token_is_asked_for_read_again_and_compared() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        let g = guard(Some(TokenFile::open(path.clone()).unwrap()));
        let status = |h: &HeaderMap, a| g.check(a, h).map(|(s, _, _)| s.as_u16());
        assert_eq!(status(&headers("localhost", None), Access::Open), None);
        assert_eq!(
            status(&headers("localhost", None), Access::Identifiers),
            Some(401)
        );
        let wrong = headers("localhost", Some("Bearer nope"));
        assert_eq!(status(&wrong, Access::Write), Some(403));
        let right = headers("localhost", Some("Bearer s3cret"));
        assert_eq!(status(&right, Access::Write), None);
        let foreign = headers("attacker.example", Some("Bearer s3cret"));
        assert_eq!(status(&foreign, Access::Write), Some(403));
        std::fs::write(&path, "rotated").unwrap();
        assert_eq!(
            status(&right, Access::Write),
            Some(403),
            "the file is read again"
        );
        assert!(TokenFile::open(dir.path().join("missing")).is_err());
    }
}
