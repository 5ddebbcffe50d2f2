//! One real `redis-server` (or sentinel) process on a free loopback port, in its own temp dir.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::Duration;

use crate::{binary, free_port, parse_info, temp_dir, tls};

/// How long a server may take to answer PING after spawn before the harness gives up.
const START_DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(5);
/// How long [`RedisServer::conn`] retries transient connect errors (refused, timed out, reset:
/// a server restarting or too busy to finish the handshake) before it panics.
const CONNECT_DEADLINE: Duration = Duration::from_secs(10);
/// One connect attempt: TCP connect plus the client's handshake.
const CONNECT_ATTEMPT: Duration = Duration::from_millis(500);
const CONNECT_RETRY: Duration = Duration::from_millis(20);

/// What a process is started as.
#[derive(Clone, Debug)]
enum Role {
    /// `redis-server --port P <args>`.
    Server { args: Vec<String> },
    /// `redis-server <dir>/sentinel.conf --sentinel`; the config is written by the caller.
    Sentinel,
}

/// One `redis-server` (or sentinel) process on a loopback port, in its own temp dir.
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    role: Role,
    child: Option<Child>,
}

impl RedisServer {
    /// A plain server: no persistence, loopback only.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// A plain server with extra `redis-server` arguments (e.g. `["--requirepass", "pw"]`).
    pub fn start_with(args: &[&str]) -> RedisServer {
        Self::launch(
            Role::Server {
                args: args.iter().map(|a| a.to_string()).collect(),
            },
            false,
        )
    }

    /// A server that also serves TLS on `tls_port` with `files`' certificate (clients are not
    /// asked for certificates). The plain port stays for the harness's own inspection.
    pub fn start_tls(files: &tls::TlsFiles, tls_port: u16) -> RedisServer {
        let (cert, key) = (
            files.cert.display().to_string(),
            files.key.display().to_string(),
        );
        let port = tls_port.to_string();
        Self::start_with(&[
            "--tls-port",
            &port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-auth-clients",
            "no",
        ])
    }

    /// A cluster-enabled node (its bus port, port + 10000, is free too), with `extra` arguments.
    pub(crate) fn start_cluster_node(node_timeout_ms: u64, extra: &[&str]) -> RedisServer {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &node_timeout_ms.to_string(),
        ];
        Self::launch(
            Role::Server {
                args: args.iter().chain(extra).map(|a| a.to_string()).collect(),
            },
            true,
        )
    }

    /// A sentinel on `port` whose config file `config(dir)` returns. Ports of sentinels are
    /// fixed up front (they name each other), so a port race here panics instead of retrying.
    pub(crate) fn start_sentinel_on(port: u16, config: impl Fn(&Path) -> String) -> RedisServer {
        let dir = temp_dir();
        std::fs::write(dir.path().join("sentinel.conf"), config(dir.path()))
            .expect("write sentinel.conf");
        let mut server = RedisServer {
            port,
            dir,
            role: Role::Sentinel,
            child: None,
        };
        if let Err(log) = server.spawn_and_wait() {
            panic!("sentinel on port {port} did not start:\n{log}");
        }
        server
    }

    fn launch(role: Role, bus: bool) -> RedisServer {
        let mut attempt = 0;
        loop {
            let mut server = RedisServer {
                port: free_port(bus),
                dir: temp_dir(),
                role: role.clone(),
                child: None,
            };
            match server.spawn_and_wait() {
                Ok(()) => return server,
                // Another process took the port between probe and bind: try another one.
                Err(log) if attempt < 5 && log.contains("Address already in use") => attempt += 1,
                Err(log) => panic!("redis-server on port {} did not start:\n{log}", server.port),
            }
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The URL as ACL user `user` with `password`.
    pub fn url_for(&self, user: &str, password: &str) -> String {
        format!("redis://{user}:{password}@127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// A fresh synchronous connection (for setup and inspection, not for the code under test).
    /// Transient errors (refused, timed out, reset) are retried for up to 10 s.
    pub fn conn(&self) -> redis::Connection {
        let url = self.url();
        let mut waited = Duration::ZERO;
        loop {
            match connect(&url) {
                Ok(conn) => return conn,
                Err(err) if is_transient(&err) && waited < CONNECT_DEADLINE => {
                    sleep(CONNECT_RETRY);
                    waited += CONNECT_RETRY;
                }
                Err(err) => panic!("connect to {} (retried {waited:?}): {err}", self.addr()),
            }
        }
    }

    /// `redis-cli` against this server, as `auth` = (user, password) if given: stdout and
    /// stderr together (Redis errors such as NOPERM included).
    pub fn cli(&self, auth: Option<(&str, &str)>, args: &[&str]) -> String {
        let mut cmd = Command::new(binary("redis-cli"));
        cmd.args(["-h", "127.0.0.1", "-p", &self.port.to_string()]);
        if let Some((user, password)) = auth {
            cmd.args(["--user", user, "--pass", password, "--no-auth-warning"]);
        }
        let out = cmd.args(args).output().expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }

    /// Runs one command and returns its reply.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut self.conn())
            .unwrap_or_else(|err| panic!("{args:?} on {}: {err}", self.addr()))
    }

    /// `INFO <section>` as `field -> value`.
    pub fn info(&self, section: &str) -> std::collections::HashMap<String, String> {
        let text: String = self.cmd(&["INFO", section]);
        parse_info(&text)
    }

    /// SIGKILL the process group and reap it; the port is free again afterwards.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(&child, libc::SIGKILL);
            let _ = child.wait();
        }
    }

    /// SIGTERM (Redis shuts down cleanly) and wait for the exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(&child, libc::SIGTERM);
            let _ = child.wait();
        }
    }

    /// Start again on the same port and dir (after [`kill`](Self::kill) or [`stop`](Self::stop)).
    pub fn start_again(&mut self) {
        assert!(
            self.child.is_none(),
            "server on port {} is still running",
            self.port
        );
        let mut attempt = 0;
        loop {
            match self.spawn_and_wait() {
                Ok(()) => return,
                // The old socket can linger for a moment after a kill.
                Err(log) if attempt < 50 && log.contains("Address already in use") => {
                    attempt += 1;
                    sleep(Duration::from_millis(20));
                }
                Err(log) => panic!("restart on port {} failed:\n{log}", self.port),
            }
        }
    }

    /// kill -9, then start on the same port.
    pub fn restart(&mut self) {
        self.kill();
        self.start_again();
    }

    /// SIGSTOP: the process keeps its sockets open but answers nothing.
    pub fn pause(&self) {
        signal_group(
            self.child.as_ref().expect("server is running"),
            libc::SIGSTOP,
        );
    }

    /// SIGCONT after [`pause`](Self::pause).
    pub fn resume(&self) {
        signal_group(
            self.child.as_ref().expect("server is running"),
            libc::SIGCONT,
        );
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.path().join("redis.log")) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// Spawns the process and waits for PING; on failure returns the log (process reaped).
    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let dir = self.dir.path();
        let log = dir.join("redis.log");
        let _ = std::fs::remove_file(&log);
        let mut cmd = Command::new(binary("redis-server"));
        match &self.role {
            Role::Server { args } => {
                cmd.arg("--port")
                    .arg(self.port.to_string())
                    .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                    // A replica's first sync starts at once instead of after Redis's 5 s default.
                    .args(["--repl-diskless-sync-delay", "0"])
                    .arg("--dir")
                    .arg(dir)
                    .arg("--logfile")
                    .arg(&log)
                    .args(args);
            }
            Role::Sentinel => {
                cmd.arg(dir.join("sentinel.conf")).arg("--sentinel");
            }
        }
        let stderr = std::fs::File::create(dir.join("stderr.log")).expect("create stderr.log");
        cmd.current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; only the child runs this, between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|err| panic!("spawn redis-server: {err}"));
        self.child = Some(child);

        let url = self.url();
        let mut waited = Duration::ZERO;
        loop {
            let child = self.child.as_mut().expect("just spawned");
            if let Ok(Some(status)) = child.try_wait() {
                let stderr = std::fs::read_to_string(dir.join("stderr.log")).unwrap_or_default();
                self.child = None;
                return Err(format!(
                    "exited with {status}\nstderr: {stderr}\nlog:\n{}",
                    self.log()
                ));
            }
            if let Ok(mut conn) = connect(&url)
                && redis::cmd("PING").query::<String>(&mut conn).is_ok()
            {
                return Ok(());
            }
            if waited >= START_DEADLINE {
                self.kill();
                return Err(format!(
                    "no PING reply within {START_DEADLINE:?}\nlog:\n{}",
                    self.log()
                ));
            }
            sleep(POLL);
            waited += POLL;
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let conn = client.get_connection_with_timeout(CONNECT_ATTEMPT)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    Ok(conn)
}

fn signal_group(child: &Child, signal: libc::c_int) {
    // The child leads its own process group (process_group(0)), so -pid reaches all of it.
    // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), signal);
    }
}

/// An error a retry may cure: nothing listens yet (or again), the handshake timed out (a read
/// timeout is EAGAIN, "Resource temporarily unavailable"), or the connection dropped.
fn is_transient(err: &redis::RedisError) -> bool {
    err.is_connection_refusal() || err.is_timeout() || err.is_connection_dropped()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect_error(url: &str) -> redis::RedisError {
        match connect(url) {
            Ok(_) => panic!("{url} answered"),
            Err(err) => err,
        }
    }

    #[test]
    fn refused_and_unanswered_connects_are_transient() {
        let port = free_port(false);
        let refused = connect_error(&format!("redis://127.0.0.1:{port}"));
        assert!(is_transient(&refused), "{refused}");
        // Accepted but never answered, as by a server too busy to finish the handshake: the read
        // times out with EAGAIN ("Resource temporarily unavailable").
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("redis://{}", silent.local_addr().expect("addr"));
        let unanswered = connect_error(&url);
        assert!(is_transient(&unanswered), "{unanswered}");
    }
}
