//! A throwaway CA and a server certificate for 127.0.0.1, made with the `openssl` CLI.

use std::path::PathBuf;
use std::process::Command;

pub struct TlsFiles {
    _dir: tempfile::TempDir,
    /// The CA certificate (PEM) clients must trust.
    pub ca: PathBuf,
    /// Server certificate (PEM, SAN IP:127.0.0.1) and its key.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// A client certificate signed by the same CA (SAN `URI:spiffe://sluice.test/envoy`,
    /// `DNS:envoy`) and its key, for mTLS.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl TlsFiles {
    pub fn generate() -> TlsFiles {
        let dir = crate::temp_dir();
        let path = |name: &str| dir.path().join(name);
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=sluice-test-ca",
            ],
        );
        issue(&dir, "server", "/CN=127.0.0.1", "IP:127.0.0.1");
        issue(
            &dir,
            "client",
            "/CN=envoy",
            "URI:spiffe://sluice.test/envoy,DNS:envoy",
        );
        TlsFiles {
            ca: path("ca.pem"),
            cert: path("server.pem"),
            key: path("server.key"),
            client_cert: path("client.pem"),
            client_key: path("client.key"),
            _dir: dir,
        }
    }
}

/// `<name>.pem` and `<name>.key`: an EC certificate for `subject` with `san`, signed by the CA.
fn issue(dir: &tempfile::TempDir, name: &str, subject: &str, san: &str) {
    let ext = format!("{name}.cnf");
    std::fs::write(dir.path().join(&ext), format!("subjectAltName={san}\n")).expect("write cnf");
    let (key, csr, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
}

fn openssl(dir: &tempfile::TempDir, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir.path())
        .output()
        .unwrap_or_else(|err| panic!("run openssl (install the Debian package `openssl`): {err}"));
    assert!(
        output.status.success(),
        "openssl {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
