//! The Redis backend: `BACKEND_TYPE`, `REDIS_URL` and its companions become sluice's Redis
//! settings; Redis URLs are redacted for the log.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::Tr;
use super::unsupported::MEMCACHE;

impl Tr<'_> {
    pub(super) fn redis(&mut self) {
        let backend = self.backend_type();
        let Some(url) = self.get("REDIS_URL").map(str::to_owned) else {
            for name in ["REDIS_TYPE", "REDIS_AUTH", "REDIS_TLS", "REDIS_SOCKET_TYPE"] {
                if self.env.contains_key(name) {
                    self.out
                        .notes
                        .push(format!("{name} has no effect without REDIS_URL"));
                }
            }
            return;
        };
        if matches!(backend.as_deref(), None | Some("redis")) {
            self.set("SLUICE_BACKEND", "redis", "REDIS_URL");
        }
        let kind = self
            .get("REDIS_TYPE")
            .unwrap_or("SINGLE")
            .to_ascii_uppercase();
        let addressing = self.redis_addressing();
        let Some((mode, urls)) = self.redis_urls(&kind, &url, &addressing) else {
            return;
        };
        let mut good = Vec::with_capacity(urls.len());
        for url in urls {
            match url {
                Ok(url) => good.push(url),
                Err(e) => self.out.errors.push(format!("REDIS_URL: {e}")),
            }
        }
        if good.len() > 1 && mode == "standalone" {
            self.out
                .errors
                .push("REDIS_URL: REDIS_TYPE=SINGLE takes one address".to_owned());
            return;
        }
        self.set("SLUICE_REDIS_URL", good.join(","), "REDIS_URL");
        self.set("SLUICE_REDIS_MODE", mode, "REDIS_TYPE");
        self.redis_notes();
    }

    /// `BACKEND_TYPE`, lower-cased; anything but Redis is reported as ignored.
    fn backend_type(&mut self) -> Option<String> {
        let backend = self.get("BACKEND_TYPE").map(str::to_ascii_lowercase);
        match backend.as_deref() {
            None | Some("redis") => {}
            Some("memcache") => self.ignore("BACKEND_TYPE", MEMCACHE),
            Some(_) => self.ignore(
                "BACKEND_TYPE",
                "only Redis (or, without Redis, memory) is supported",
            ),
        }
        backend
    }

    fn redis_addressing(&mut self) -> Addressing {
        let tls = self.bool("REDIS_TLS").unwrap_or(false);
        let insecure = self
            .bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
            .unwrap_or(false);
        let auth = self
            .get("REDIS_AUTH")
            .filter(|a| !a.is_empty())
            .map(str::to_owned);
        let socket = self.get("REDIS_SOCKET_TYPE").map(str::to_ascii_lowercase);
        Addressing {
            socket,
            tls,
            insecure,
            auth,
        }
    }

    /// The mode and the URL of each address of `REDIS_URL`; `None` after an error is recorded.
    fn redis_urls(
        &mut self,
        kind: &str,
        url: &str,
        addressing: &Addressing,
    ) -> Option<(&'static str, Vec<Result<String, String>>)> {
        let to_url = |address: &str| addressing.url(address);
        match kind {
            "SINGLE" => Some(("standalone", vec![to_url(url.trim())])),
            "CLUSTER" => Some((
                "cluster",
                url.split(',').map(|a| to_url(a.trim())).collect(),
            )),
            "SENTINEL" => self
                .sentinels(url, addressing)
                .map(|sentinels| ("sentinel", sentinels)),
            other => {
                self.out.errors.push(format!(
                    "REDIS_TYPE: `{other}` is not one of SINGLE, CLUSTER, SENTINEL"
                ));
                None
            }
        }
    }

    /// `REDIS_URL` with `REDIS_TYPE=SENTINEL`: "<master name>,<sentinel>,<sentinel>...". Sets the
    /// master name and returns the sentinels' URLs.
    fn sentinels(
        &mut self,
        url: &str,
        addressing: &Addressing,
    ) -> Option<Vec<Result<String, String>>> {
        let mut parts = url.split(',').map(str::trim);
        let master = parts.next().unwrap_or_default().to_owned();
        let sentinels: Vec<Result<String, String>> = parts.map(|a| addressing.url(a)).collect();
        if master.is_empty() || sentinels.is_empty() {
            self.out.errors.push(
                "REDIS_URL: with REDIS_TYPE=SENTINEL it must be <master name>,<sentinel host:port>[,...]".to_owned(),
            );
            return None;
        }
        self.set("SLUICE_REDIS_SENTINEL_MASTER", master, "REDIS_URL");
        let auth = addressing.auth.as_deref();
        let sentinel_auth = self.get("REDIS_SENTINEL_AUTH").unwrap_or_default();
        if !sentinel_auth.is_empty() && Some(sentinel_auth) != auth {
            self.ignore(
                "REDIS_SENTINEL_AUTH",
                "sluice authenticates to the sentinels with the master's credentials (REDIS_AUTH)",
            );
        } else if sentinel_auth.is_empty() && auth.is_some() {
            self.out.notes.push(
                "REDIS_AUTH is also sent to the sentinels (sluice uses one set of credentials for sentinels and master)".to_owned(),
            );
        }
        Some(sentinels)
    }

    fn redis_notes(&mut self) {
        if self.env.contains_key("REDIS_POOL_SIZE") {
            self.out.notes.push(
                "REDIS_POOL_SIZE accepted without effect: sluice multiplexes one connection per Redis node".to_owned(),
            );
        }
        if self
            .env
            .contains_key("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
        {
            self.out.notes.push(
                "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION accepted: readiness always includes a Redis probe".to_owned(),
            );
        }
    }
}

/// How an envoyproxy/ratelimit address becomes a URL: `REDIS_SOCKET_TYPE`, `REDIS_TLS`,
/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` and `REDIS_AUTH`.
struct Addressing {
    socket: Option<String>,
    tls: bool,
    insecure: bool,
    auth: Option<String>,
}

impl Addressing {
    fn url(&self, address: &str) -> Result<String, String> {
        redis_url(
            address,
            self.socket.as_deref(),
            self.tls,
            self.insecure,
            self.auth.as_deref(),
        )
    }
}

/// `host:port` (or a socket path) in envoyproxy/ratelimit's form → a sluice Redis URL. A value
/// that already has a scheme is kept as it is.
fn redis_url(
    address: &str,
    socket: Option<&str>,
    tls: bool,
    insecure: bool,
    auth: Option<&str>,
) -> Result<String, String> {
    if address.is_empty() {
        return Err("empty address".to_owned());
    }
    if address.contains("://") {
        return Ok(address.to_owned());
    }
    let (user, password) = match auth {
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => (Some(user), Some(password)),
            None => (None, Some(auth)),
        },
        None => (None, None),
    };
    // envoyproxy/ratelimit's REDIS_SOCKET_TYPE defaults to unix; a value with a port is clearly
    // TCP, which is what a deployment that leaves the type unset means.
    let unix = match socket {
        Some("unix") => true,
        Some("tcp") | Some("tcp4") | Some("tcp6") => false,
        Some(other) => return Err(format!("REDIS_SOCKET_TYPE `{other}` is not tcp or unix")),
        None => address.starts_with('/'),
    };
    if unix {
        let mut url = format!("redis+unix://{address}");
        let mut query = Vec::new();
        if let Some(user) = user {
            query.push(format!("user={}", encode(user)));
        }
        if let Some(password) = password {
            query.push(format!("pass={}", encode(password)));
        }
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query.join("&"));
        }
        return Ok(url);
    }
    let userinfo = match (user, password) {
        (Some(user), Some(password)) => format!("{}:{}@", encode(user), encode(password)),
        (None, Some(password)) => format!(":{}@", encode(password)),
        _ => String::new(),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    let fragment = if tls && insecure { "#insecure" } else { "" };
    Ok(format!("{scheme}://{userinfo}{address}{fragment}"))
}

/// Everything but unreserved characters, so a password cannot end the userinfo or split the
/// comma-separated URL list.
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn encode(s: &str) -> String {
    utf8_percent_encode(s, USERINFO).to_string()
}

/// `redis://user:secret@host` → `redis://user:***@host`, for logs.
pub(super) fn redact_userinfo(urls: &str) -> String {
    urls.split(',')
        .map(|url| match (url.find("://"), url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let userinfo = &url[scheme + 3..at];
                let user = userinfo.split_once(':').map_or("", |(u, _)| u);
                format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
            }
            _ => match url.split_once("pass=") {
                Some((head, _)) => format!("{head}pass=***"),
                None => url.to_owned(),
            },
        })
        .collect::<Vec<_>>()
        .join(",")
}
