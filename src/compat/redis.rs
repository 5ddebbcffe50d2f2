//! The Redis backend: `BACKEND_TYPE`, `REDIS_URL` and its companions become sluice's Redis
//! settings, `REDIS_PERSECOND` and `REDIS_PERSECOND_*` those of the per-second rules' Redis;
//! Redis URLs are redacted for the log.

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use super::Tr;
use super::unsupported::MEMCACHE;

/// The variables of one Redis: envoyproxy/ratelimit's main one (`REDIS_*`) or the one for
/// per-second rules (`REDIS_PERSECOND_*`, same forms), and the sluice settings they become.
struct Family {
    /// `REDIS` or `REDIS_PERSECOND`; the variables are `<prefix>_URL`, `<prefix>_TYPE`, ...
    prefix: &'static str,
    url: &'static str,
    mode: &'static str,
    sentinel_master: &'static str,
    /// Why a different `<prefix>_SENTINEL_AUTH` is ignored.
    sentinel_auth_ignored: &'static str,
}

const MAIN: Family = Family {
    prefix: "REDIS",
    url: "SLUICE_REDIS_URL",
    mode: "SLUICE_REDIS_MODE",
    sentinel_master: "SLUICE_REDIS_SENTINEL_MASTER",
    sentinel_auth_ignored: "sluice authenticates to the sentinels with the master's credentials (REDIS_AUTH)",
};

const PER_SECOND: Family = Family {
    prefix: "REDIS_PERSECOND",
    url: "SLUICE_REDIS_PER_SECOND_URL",
    mode: "SLUICE_REDIS_PER_SECOND_MODE",
    sentinel_master: "SLUICE_REDIS_PER_SECOND_SENTINEL_MASTER",
    sentinel_auth_ignored: "sluice authenticates to the sentinels with the master's credentials (REDIS_PERSECOND_AUTH)",
};

/// The `SLUICE_*` variables that hold Redis URLs (and so may hold passwords), for the log.
pub(super) const URL_SETTINGS: [&str; 2] = [MAIN.url, PER_SECOND.url];

/// What each family reads besides its URL.
const COMPANIONS: [&str; 6] = [
    "TYPE",
    "AUTH",
    "TLS",
    "SOCKET_TYPE",
    "POOL_SIZE",
    "SENTINEL_AUTH",
];

impl Family {
    fn var(&self, suffix: &str) -> String {
        format!("{}_{suffix}", self.prefix)
    }
}

impl Tr<'_> {
    pub(super) fn redis(&mut self) {
        let backend = self.backend_type();
        let per_second = self.bool("REDIS_PERSECOND").unwrap_or(false);
        let Some(url) = self.get("REDIS_URL").map(str::to_owned) else {
            for name in ["REDIS_TYPE", "REDIS_AUTH", "REDIS_TLS", "REDIS_SOCKET_TYPE"] {
                if self.env.contains_key(name) {
                    self.out
                        .notes
                        .push(format!("{name} has no effect without REDIS_URL"));
                }
            }
            // Without REDIS_URL sluice keeps buckets in memory (envoyproxy/ratelimit would use its
            // default socket): half the buckets in a Redis and half in memory is no deployment.
            if per_second {
                self.out.errors.push(
                    "REDIS_PERSECOND=true needs REDIS_URL too: without it sluice keeps the other buckets in memory".to_owned(),
                );
            }
            return;
        };
        if matches!(backend.as_deref(), None | Some("redis")) {
            self.set("SLUICE_BACKEND", "redis", "REDIS_URL");
        }
        if self.redis_family(&MAIN, &url) {
            self.redis_notes(&MAIN);
        }
        self.per_second_redis(per_second);
    }

    /// `REDIS_PERSECOND=true`: the per-second rules' Redis from `REDIS_PERSECOND_*`, read as
    /// the main one's variables are.
    fn per_second_redis(&mut self, enabled: bool) {
        let url_var = PER_SECOND.var("URL");
        if !enabled {
            for name in std::iter::once(url_var).chain(COMPANIONS.map(|c| PER_SECOND.var(c))) {
                if self.env.contains_key(&name) {
                    self.out
                        .notes
                        .push(format!("{name} has no effect without REDIS_PERSECOND=true"));
                }
            }
            return;
        }
        // envoyproxy/ratelimit would fall back to a default unix socket; a per-second Redis
        // nobody named is a mistake to report, not an address to guess.
        let Some(url) = self.get(&url_var).filter(|u| !u.trim().is_empty()) else {
            self.out.errors.push(format!(
                "REDIS_PERSECOND=true needs {url_var}: the address of the Redis for per-second limits"
            ));
            return;
        };
        let url = url.to_owned();
        if self.redis_family(&PER_SECOND, &url) {
            self.redis_notes(&PER_SECOND);
        }
    }

    /// Maps `<prefix>_URL` (given as `url`) and its companions to `family`'s settings; `false`
    /// when an error was recorded instead.
    fn redis_family(&mut self, family: &Family, url: &str) -> bool {
        let kind = self
            .get(&family.var("TYPE"))
            .unwrap_or("SINGLE")
            .to_ascii_uppercase();
        let addressing = self.redis_addressing(family);
        let Some((mode, urls)) = self.redis_urls(family, &kind, url, &addressing) else {
            return false;
        };
        let url_var = family.var("URL");
        let mut good = Vec::with_capacity(urls.len());
        for url in urls {
            match url {
                Ok(url) => good.push(url),
                Err(e) => self.out.errors.push(format!("{url_var}: {e}")),
            }
        }
        if good.len() > 1 && mode == "standalone" {
            self.out.errors.push(format!(
                "{url_var}: {}=SINGLE takes one address",
                family.var("TYPE")
            ));
            return false;
        }
        self.set(family.url, good.join(","), &url_var);
        self.set(family.mode, mode, &family.var("TYPE"));
        true
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

    /// How `family`'s addresses become URLs. Hostname verification is one setting for both
    /// Redis, as envoyproxy/ratelimit builds one TLS config for both.
    fn redis_addressing(&mut self, family: &Family) -> Addressing {
        let tls = self.bool(&family.var("TLS")).unwrap_or(false);
        let insecure = self
            .bool("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
            .unwrap_or(false);
        let auth = self
            .get(&family.var("AUTH"))
            .filter(|a| !a.is_empty())
            .map(str::to_owned);
        let socket_var = family.var("SOCKET_TYPE");
        let socket = self.get(&socket_var).map(str::to_ascii_lowercase);
        Addressing {
            socket_var,
            socket,
            tls,
            insecure,
            auth,
        }
    }

    /// The mode and the URL of each address of `<prefix>_URL`; `None` after an error is
    /// recorded.
    fn redis_urls(
        &mut self,
        family: &Family,
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
                .sentinels(family, url, addressing)
                .map(|sentinels| ("sentinel", sentinels)),
            other => {
                self.out.errors.push(format!(
                    "{}: `{other}` is not one of SINGLE, CLUSTER, SENTINEL",
                    family.var("TYPE")
                ));
                None
            }
        }
    }

    /// `<prefix>_URL` with `<prefix>_TYPE=SENTINEL`: "<master name>,<sentinel>,<sentinel>...".
    /// Sets the master name and returns the sentinels' URLs.
    fn sentinels(
        &mut self,
        family: &Family,
        url: &str,
        addressing: &Addressing,
    ) -> Option<Vec<Result<String, String>>> {
        let mut parts = url.split(',').map(str::trim);
        let master = parts.next().unwrap_or_default().to_owned();
        let sentinels: Vec<Result<String, String>> = parts.map(|a| addressing.url(a)).collect();
        let (url_var, auth_var) = (family.var("URL"), family.var("AUTH"));
        if master.is_empty() || sentinels.is_empty() {
            self.out.errors.push(format!(
                "{url_var}: with {}=SENTINEL it must be <master name>,<sentinel host:port>[,...]",
                family.var("TYPE")
            ));
            return None;
        }
        self.set(family.sentinel_master, master, &url_var);
        let auth = addressing.auth.as_deref();
        let sentinel_auth_var = family.var("SENTINEL_AUTH");
        let sentinel_auth = self.get(&sentinel_auth_var).unwrap_or_default();
        if !sentinel_auth.is_empty() && Some(sentinel_auth) != auth {
            self.ignore(&sentinel_auth_var, family.sentinel_auth_ignored);
        } else if sentinel_auth.is_empty() && auth.is_some() {
            self.out.notes.push(format!(
                "{auth_var} is also sent to the sentinels (sluice uses one set of credentials for sentinels and master)"
            ));
        }
        Some(sentinels)
    }

    fn redis_notes(&mut self, family: &Family) {
        let pool_size = family.var("POOL_SIZE");
        if self.env.contains_key(&pool_size) {
            self.out.notes.push(format!(
                "{pool_size} accepted without effect: sluice multiplexes one connection per Redis node"
            ));
        }
        if family.prefix == MAIN.prefix
            && self
                .env
                .contains_key("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
        {
            self.out.notes.push(
                "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION accepted: readiness always includes a Redis probe".to_owned(),
            );
        }
    }
}

/// How an envoyproxy/ratelimit address becomes a URL: `<prefix>_SOCKET_TYPE`, `<prefix>_TLS`,
/// `REDIS_TLS_SKIP_HOSTNAME_VERIFICATION` and `<prefix>_AUTH`.
struct Addressing {
    /// The socket type's variable, for its error message.
    socket_var: String,
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
        .map_err(|e| match e {
            UrlError::Empty => "empty address".to_owned(),
            UrlError::Socket(other) => {
                format!("{} `{other}` is not tcp or unix", self.socket_var)
            }
        })
    }
}

/// Why an address cannot become a URL.
enum UrlError {
    Empty,
    /// A socket type other than tcp or unix.
    Socket(String),
}

/// `host:port` (or a socket path) in envoyproxy/ratelimit's form → a sluice Redis URL. A value
/// that already has a scheme is kept as it is.
fn redis_url(
    address: &str,
    socket: Option<&str>,
    tls: bool,
    insecure: bool,
    auth: Option<&str>,
) -> Result<String, UrlError> {
    if address.is_empty() {
        return Err(UrlError::Empty);
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
        Some(other) => return Err(UrlError::Socket(other.to_owned())),
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
