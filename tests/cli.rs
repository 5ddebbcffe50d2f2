//! The binary as an operator runs it: `check-config` exit codes and messages, `serve` printing its
//! bound addresses, SIGTERM draining to a clean exit.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    // The developer's environment must not leak into what is tested.
    for (k, _) in std::env::vars() {
        if k.starts_with("SLUICE_") {
            c.env_remove(k);
        }
    }
    c
}

fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn check_config_accepts_the_examples() {
    let out = sluice()
        .args(["check-config", &repo("config")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one-line summary: {stdout}");
    assert!(stdout.contains("2 domains"), "{stdout}");
}

#[test]
fn check_config_reports_file_and_line_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broken.yaml");
    std::fs::write(
        &file,
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 0}\n  - key: \"\"\n",
    )
    .unwrap();
    let out = sluice().args(["check-config"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("broken.yaml:4:"), "{stderr}");
    assert!(
        stderr.contains("broken.yaml:5:"),
        "every error, not just the first: {stderr}"
    );
}

#[cfg(unix)]
#[test]
fn serve_prints_addresses_and_exits_cleanly_on_sigterm() {
    let mut child = sluice()
        .args([
            "serve",
            "--config",
            &repo("config"),
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("sluice ready grpc=127.0.0.1:"), "{line}");
    assert!(line.contains(" admin=127.0.0.1:"), "{line}");
    let grpc: std::net::SocketAddr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(std::net::TcpStream::connect(grpc).is_ok());
    // SAFETY: plain kill(2) on our own child.
    let rc = unsafe { libc_kill(child.id() as i32, 15) };
    assert_eq!(rc, 0);
    let status = child.wait().unwrap();
    assert!(status.success(), "exit after SIGTERM: {status:?}");
}

#[cfg(unix)]
unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
