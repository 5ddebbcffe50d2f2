//! `rediss://`: the Redis backend over TLS, trusting a private CA through `SSL_CERT_FILE`.
//!
//! Its own test binary: the test sets an environment variable, which is only sound while no
//! other thread of the process reads the environment.

use std::time::Duration;

use sluice::algorithm::BucketParams;
use sluice::backend::redis::{RedisBackend, RedisMode, RedisOptions};
use sluice::backend::{Backend, Hit};

use sluice_harness::tls::TlsFiles;
use sluice_harness::{RedisServer, command_calls, free_port};

#[tokio::test]
async fn rediss_with_a_private_ca() {
    let files = TlsFiles::generate();
    // SAFETY: the only test of this binary, and no thread of it has started yet (the
    // current-thread runtime spawns blocking threads only on first use).
    unsafe { std::env::set_var("SSL_CERT_FILE", &files.ca) };
    let tls_port = free_port(false);
    let server = RedisServer::start_tls(&files, tls_port);

    let backend = RedisBackend::connect(RedisOptions {
        urls: vec![format!("rediss://127.0.0.1:{tls_port}")],
        mode: RedisMode::Standalone,
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    })
    .await
    .expect("connect over TLS");
    let params = BucketParams {
        capacity: 10,
        requests_per_unit: 10,
        unit_ms: 1_000,
    };
    let verdicts = backend
        .check(&[Hit::new("tls:{a}", params, 1)])
        .await
        .expect("check over TLS");
    assert_eq!(verdicts[0].remaining, 9);
    assert_eq!(command_calls(&server, "evalsha"), 1);

    // Plain text to the TLS port is no connection at all.
    let plain = RedisBackend::connect(RedisOptions {
        urls: vec![format!("redis://127.0.0.1:{tls_port}")],
        connect_timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    })
    .await;
    assert!(plain.is_err());
}
