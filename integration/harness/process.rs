//! `sluice serve` as a child process ([`SluiceProcess`]): what a replica in a deployment is, so a
//! test can SIGTERM it mid-load, SIGKILL it, or read its `/metrics` like Prometheus would.
//!
//! The process runs in its own process group and gets SIGKILL when the thread that started it
//! exits (PR_SET_PDEATHSIG), so a killed test leaves nothing behind. Its stderr goes to a file
//! beside its config directory and is printed when a test panics.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::RedisServer;
use crate::rls::http_get;
use crate::{without_sluice_env, workspace_bin};

/// A running `sluice serve` on loopback ports.
pub struct SluiceProcess {
    child: Option<Child>,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    dir: tempfile::TempDir,
}

impl SluiceProcess {
    /// `sluice serve` with `files` (name, YAML) as its config directory, loopback port 0 for both
    /// listeners, and `args` after those (`--backend redis --redis-url …`, TLS, …). Returns once
    /// the ready line is printed.
    pub fn start(files: &[(&str, &str)], args: &[&str]) -> SluiceProcess {
        let dir = tempfile::Builder::new()
            .prefix("sluice-proc-")
            .tempdir()
            .expect("temp dir");
        // The log sits beside the config dir, not in it: the file watcher must not see it.
        let config = dir.path().join("config");
        std::fs::create_dir(&config).unwrap();
        for (name, text) in files {
            std::fs::write(config.join(name), text).unwrap();
        }
        Self::spawn(dir, &config, args)
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
        let dir = tempfile::Builder::new()
            .prefix("sluice-proc-")
            .tempdir()
            .expect("temp dir");
        Self::spawn(dir, config, args)
    }

    fn spawn(dir: tempfile::TempDir, config: &Path, args: &[&str]) -> SluiceProcess {
        let mut cmd = Command::new(workspace_bin("sluice"));
        without_sluice_env(&mut cmd);
        cmd.args(["serve", "--config"])
            .arg(config)
            .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(args)
            .env("SLUICE_LOG_FORMAT", "text")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.path().join("sluice.log")).unwrap())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn sluice serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let log = dir.path().join("sluice.log");
        let field = |name: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .unwrap_or_else(|| {
                    panic!(
                        "no {name} in the ready line {line:?}; log:\n{}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    )
                })
                .parse()
                .unwrap()
        };
        let (grpc, admin) = (field("grpc="), field("admin="));
        SluiceProcess {
            child: Some(child),
            grpc,
            admin,
            dir,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
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

    /// The process's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("sluice.log")
    }

    /// Sends `signal` to the process (SIGTERM: drain and exit; SIGSTOP/SIGCONT: freeze/thaw).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on a child this struct owns and has not reaped.
        unsafe {
            libc::kill(self.pid(), signal);
        }
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
                self.log()
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
            eprintln!("--- log of sluice at {} ---\n{}", self.grpc, self.log());
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
