//! The binary as an operator runs it: `check-config` exit codes and messages, `serve` printing its
//! bound addresses, SIGTERM draining to a clean exit.

use std::path::Path;
use std::time::Duration;

use sluice_harness::{SluiceProcess, sluice_command};

fn repo(path: &str) -> String {
    format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn check_config_accepts_the_examples() {
    let out = sluice_command()
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
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: -1}\n  - key: \"\"\n",
    )
    .unwrap();
    let out = sluice_command()
        .args(["check-config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("broken.yaml:4:"), "{stderr}");
    assert!(
        stderr.contains("broken.yaml:5:"),
        "every error, not just the first: {stderr}"
    );
}

/// The default algorithm decides whether `burst` means anything, so `check-config` takes it as
/// `serve` does: flag or `SLUICE_DEFAULT_ALGORITHM`; an unknown one is refused by name.
#[test]
fn check_config_takes_the_default_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("api.yaml");
    std::fs::write(
        &file,
        "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, burst: 9}\n",
    )
    .unwrap();
    let ok = sluice_command()
        .args(["check-config"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );

    let flag = sluice_command()
        .args(["check-config", "--default-algorithm", "fixed_window"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(flag.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&flag.stderr);
    assert!(
        stderr.contains(
            "api.yaml:4:54: `burst` does not apply to `fixed_window` (from --default-algorithm)"
        ),
        "{stderr}"
    );

    let env = sluice_command()
        .args(["check-config", "--format", "json"])
        .arg(&file)
        .env("SLUICE_DEFAULT_ALGORITHM", "GCRA")
        .output()
        .unwrap();
    assert!(
        env.status.success(),
        "{}",
        String::from_utf8_lossy(&env.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&env.stdout).unwrap();
    assert_eq!(json["algorithms"], serde_json::json!({"gcra": 1}));

    let unknown = sluice_command()
        .args(["check-config", "--default-algorithm", "leaky_bucket"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        stderr.contains("unknown algorithm `leaky_bucket` (expected one of: token_bucket, fixed_window, sliding_window, gcra)"),
        "{stderr}"
    );
}

#[test]
fn serve_prints_addresses_and_exits_cleanly_on_sigterm() {
    let mut serve = SluiceProcess::start_with_config(Path::new(&repo("config")), &[]);
    let line = serve.ready_line();
    assert!(line.starts_with("sluice ready grpc=127.0.0.1:"), "{line}");
    assert!(line.contains(" admin=127.0.0.1:"), "{line}");
    assert!(std::net::TcpStream::connect(serve.grpc).is_ok());
    let status = serve.terminate(Duration::from_secs(30));
    assert!(status.success(), "exit after SIGTERM: {status:?}");
}
