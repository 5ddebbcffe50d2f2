//! `sluice serve` as a child process ([`SluiceProcess`]): what a replica in a deployment is, so a
//! test can SIGTERM it mid-load, SIGKILL it, or read its `/metrics` like Prometheus would.
//! [`SluiceBuilder`] says how it starts: config, flags, environment, a wrapper command.
//! [`sluice_command`] is the same binary in the same clean environment for a one-shot command
//! (`check-config`, `explain`, `bucket`, `top`, a `serve` that must refuse to start).
//!
//! The process runs in its own process group and gets SIGKILL when the thread that started it
//! exits (PR_SET_PDEATHSIG), so a killed test leaves nothing behind. Its environment is only
//! what the builder names (plus `NO_COLOR`, so its log is plain text): nothing of the
//! developer's or CI's environment (`SLUICE_*`, `REDIS_URL`, `PORT`, `RUST_LOG`, `OTEL_*`, …)
//! reaches it. Its stderr goes to a file beside its config directory and is printed when a test
//! panics; its stdout stays open until it exits.

use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use crate::RedisServer;
use crate::rls::http_get;
use crate::workspace_bin;

/// The `sluice` binary the builder runs ([`workspace_bin`]) as a one-shot command, in the
/// builder's clean environment: only `NO_COLOR` (so its output is plain text), nothing of the
/// developer's or CI's. The test adds the subcommand, its arguments and any variables.
pub fn sluice_command() -> Command {
    let mut cmd = Command::new(workspace_bin("sluice"));
    clean_env(&mut cmd);
    cmd
}

/// The environment of every sluice a test starts: cleared, then `NO_COLOR`.
fn clean_env(cmd: &mut Command) -> &mut Command {
    cmd.env_clear().env("NO_COLOR", "1")
}

/// Where a [`SluiceBuilder`]'s process finds its config.
enum Config {
    /// (name, YAML) files written into a fresh config directory.
    Files(Vec<(String, String)>),
    /// A config directory or file that exists already.
    Path(PathBuf),
    /// No `--config` and no listener flags: the environment names them (envoyproxy/ratelimit's
    /// `RUNTIME_ROOT`, `GRPC_PORT`, `PORT`, …).
    Environment,
}

/// How to start a [`SluiceProcess`]: `sluice serve`, its config, the flags after it, its
/// environment and an optional wrapper command. With a config ([`SluiceBuilder::files`],
/// [`SluiceBuilder::config`]) both listeners are on loopback port 0.
pub struct SluiceBuilder {
    config: Config,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    wrapper: Vec<OsString>,
}

impl SluiceBuilder {
    fn new(config: Config) -> SluiceBuilder {
        SluiceBuilder {
            config,
            args: Vec::new(),
            env: Vec::new(),
            wrapper: Vec::new(),
        }
    }

    /// `files` (name, YAML) as the config directory.
    pub fn files(files: &[(&str, &str)]) -> SluiceBuilder {
        let files = files
            .iter()
            .map(|(name, text)| (name.to_string(), text.to_string()))
            .collect();
        Self::new(Config::Files(files))
    }

    /// A config directory or file that exists already (e.g. the repository's `config/`, tested
    /// as shipped, or one the test rewrites).
    pub fn config(path: &Path) -> SluiceBuilder {
        Self::new(Config::Path(path.to_path_buf()))
    }

    /// Plain `sluice serve`: the environment ([`SluiceBuilder::envs`]) names the config and the
    /// listeners, as an envoyproxy/ratelimit deployment does.
    pub fn environment() -> SluiceBuilder {
        Self::new(Config::Environment)
    }

    /// Flags after the config and listener flags.
    pub fn args<I, S>(mut self, args: I) -> SluiceBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// One variable of the process's environment.
    pub fn env(self, name: &str, value: &str) -> SluiceBuilder {
        self.envs([(name, value)])
    }

    /// Variables of the process's environment.
    pub fn envs<'a>(mut self, vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> SluiceBuilder {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Runs sluice under `wrapper` (program and its arguments, e.g. `faketime -f +2h`), which
    /// must exec or fork it with the rest of its command line. [`SluiceProcess::pid`] is then
    /// the wrapper's; the process group still reaches both.
    pub fn wrapped_in(mut self, wrapper: &[&str]) -> SluiceBuilder {
        self.wrapper = wrapper.iter().map(OsString::from).collect();
        self
    }

    /// Starts the process; returns once its ready line is printed.
    pub fn start(self) -> SluiceProcess {
        let dir = tempfile::Builder::new()
            .prefix("sluice-proc-")
            .tempdir()
            .expect("temp dir");
        let mut cmd = self.command(dir.path());
        let log = dir.path().join("sluice.log");
        cmd.stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn sluice serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let field = |name: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|addr| addr.parse().ok())
                .unwrap_or_else(|| {
                    panic!(
                        "no {name} in the ready line {line:?}; log:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    )
                })
        };
        let (grpc, admin) = (field("grpc="), field("admin="));
        SluiceProcess {
            child: Some(child),
            _stdout: stdout.into_inner(),
            ready: line.trim_end().to_string(),
            grpc,
            admin,
            dir,
        }
    }

    /// The command line and environment; `dir` holds the config files the builder writes (in
    /// `dir/config`: the log beside it must not be seen by the file watcher).
    fn command(&self, dir: &Path) -> Command {
        let binary = workspace_bin("sluice");
        let mut cmd = match self.wrapper.split_first() {
            None => Command::new(&binary),
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&binary);
                cmd
            }
        };
        clean_env(&mut cmd)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .arg("serve");
        let config = match &self.config {
            Config::Environment => None,
            Config::Path(path) => Some(path.clone()),
            Config::Files(files) => {
                let config = dir.join("config");
                std::fs::create_dir(&config).unwrap();
                for (name, text) in files {
                    std::fs::write(config.join(name), text).unwrap();
                }
                Some(config)
            }
        };
        if let Some(config) = config {
            cmd.arg("--config").arg(config).args([
                "--grpc-addr",
                "127.0.0.1:0",
                "--admin-addr",
                "127.0.0.1:0",
            ]);
        }
        cmd.args(&self.args);
        cmd
    }
}

/// A running `sluice serve` on loopback ports.
pub struct SluiceProcess {
    child: Option<Child>,
    /// Held open so a late write to stdout never meets a closed pipe.
    _stdout: ChildStdout,
    /// The first line on stdout (`sluice ready grpc=… admin=…`).
    ready: String,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    dir: tempfile::TempDir,
}

impl SluiceProcess {
    /// `sluice serve` with `files` (name, YAML) as its config directory, loopback port 0 for both
    /// listeners, and `args` after those (`--backend redis --redis-url …`, TLS, …). Returns once
    /// the ready line is printed. [`SluiceBuilder`] for more.
    pub fn start(files: &[(&str, &str)], args: &[&str]) -> SluiceProcess {
        SluiceBuilder::files(files).args(args).start()
    }

    /// [`SluiceProcess::start`] on the Redis backend against `redis`, with a 200 ms Redis deadline:
    /// generous for a loaded test machine, still under the 1 s the harness's Envoy waits.
    pub fn start_on_redis(files: &[(&str, &str)], redis: &RedisServer) -> SluiceProcess {
        let url = redis.url();
        let args = [
            "--backend",
            "redis",
            "--redis-url",
            &url,
            "--redis-timeout",
            "200ms",
        ];
        Self::start(files, &args)
    }

    /// `sluice serve --config <path>` on a config directory or file that exists already (e.g.
    /// the repository's `config/`, tested as shipped).
    pub fn start_with_config(config: &Path, args: &[&str]) -> SluiceProcess {
        SluiceBuilder::config(config).args(args).start()
    }

    /// The process's pid (its wrapper's, under [`SluiceBuilder::wrapped_in`]).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// The ready line the process printed, without its newline.
    pub fn ready_line(&self) -> &str {
        &self.ready
    }

    /// An RLS client connected to the gRPC listener.
    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("client connects")
    }

    /// `GET path` on the admin listener: (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        http_get(self.admin, path)
    }

    /// `/readyz`'s status, or `None` when the admin listener is closed.
    pub fn readyz(&self) -> Option<u16> {
        std::net::TcpStream::connect(self.admin).ok()?;
        Some(self.admin_get("/readyz").0)
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> String {
        let (status, body) = self.admin_get("/metrics");
        assert_eq!(status, 200, "GET /metrics: {body}");
        body
    }

    /// A counter or gauge from `/metrics`, summed over the series whose labels contain every
    /// `label="value"` pair given.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_in(&self.metrics(), name, labels)
    }

    /// The process's log so far; panics if it is not UTF-8.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).expect("the log, as UTF-8")
    }

    /// The log for a failure message (lossy, never panics).
    fn log_lossy(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.log_path()).unwrap_or_default()).into_owned()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("sluice.log")
    }

    /// Sends `signal` to the process (SIGTERM: drain and exit; SIGHUP: reload; SIGSTOP/SIGCONT:
    /// freeze/thaw).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child this struct owns and has not reaped.
        let sent = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(sent, 0, "kill({}, {signal})", self.pid());
    }

    /// SIGTERM (drain, hand leases back, exit) and waits up to `deadline` for the exit; its
    /// exit status.
    pub fn terminate(&mut self, deadline: Duration) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait_exit(deadline)
    }

    /// Waits up to `deadline` for the process to exit by itself; its exit status.
    pub fn wait_exit(&mut self, deadline: Duration) -> ExitStatus {
        let child = self.child.as_mut().expect("running");
        let mut waited = Duration::ZERO;
        loop {
            if let Some(status) = child.try_wait().expect("try_wait") {
                self.child = None;
                return status;
            }
            assert!(
                waited < deadline,
                "sluice did not exit within {deadline:?}; log:\n{}",
                self.log_lossy()
            );
            std::thread::sleep(Duration::from_millis(10));
            waited += Duration::from_millis(10);
        }
    }

    /// SIGKILL to its process group: no drain.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on the process group this struct created and has not reaped.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

impl Drop for SluiceProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- log of sluice at {} ---\n{}",
                self.grpc,
                self.log_lossy()
            );
        }
    }
}

/// A metric's value in Prometheus text, summed over the series whose labels include `labels`.
pub fn metric_in(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            if !rest.starts_with([' ', '{']) {
                return None;
            }
            let (series, value) = rest.rsplit_once(' ')?;
            let wanted = labels
                .iter()
                .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")));
            if wanted {
                value.parse::<f64>().ok()
            } else {
                None
            }
        })
        .sum()
}
