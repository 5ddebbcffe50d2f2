//! envoyproxy/ratelimit's config features through the real path, gRPC in and Redis out: a
//! blocking `requests_per_unit: 0` rule, which never reaches Redis, and `share_threshold`, whose
//! wildcard's values share one Redis key (the one `sluice explain` prints).

use sluice::settings::RedisModeArg;
use sluice_harness::rls::{OK, OVER_LIMIT, request};
use sluice_harness::sluice::Sluice;
use sluice_harness::{RedisServer, sluice_command};

const CONFIG: &str = r#"
domain: ref
descriptors:
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 2}
"#;

/// The bucket keys of domain `ref` (sluice keeps bookkeeping keys of its own beside them).
fn keys(redis: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis.cmd(&["KEYS", "sluice:{ref|*"]);
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_rule_rejects_without_touching_redis() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(CONFIG, &[redis.url()], RedisModeArg::Standalone, |_| {}).await;
    let mut client = sluice.client().await;
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("ref", &[("block", "x")]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, OVER_LIMIT);
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            0
        );
    }
    assert_eq!(
        keys(&redis),
        Vec::<String>::new(),
        "no key for a blocked descriptor"
    );
    // A rejected request charges nothing: the tenant's bucket is not even created.
    let r = client
        .should_rate_limit(request("ref", &[("tenant", "a"), ("block", "x")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OVER_LIMIT);
    assert_eq!(keys(&redis), Vec::<String>::new());
    // The same tenant alone is charged in Redis as usual.
    let r = client
        .should_rate_limit(request("ref", &[("tenant", "a")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(keys(&redis), ["sluice:{ref|tenant=a}"]);
    sluice.stop().await;
}

/// The three values of one shared wildcard drain one bucket: two pass, the third is over, and
/// Redis holds one key, named by the pattern (`#*…`), never by a value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_threshold_values_drain_one_redis_key() {
    let redis = RedisServer::start();
    let sluice = Sluice::start(CONFIG, &[redis.url()], RedisModeArg::Standalone, |_| {}).await;
    let mut client = sluice.client().await;
    let mut codes = Vec::new();
    for value in ["/files/a", "/files/b", "/files/c"] {
        let r = client
            .should_rate_limit(request("ref", &[("path", value)]))
            .await
            .unwrap()
            .into_inner();
        codes.push(r.overall_code);
    }
    assert_eq!(codes, [OK, OK, OVER_LIMIT]);
    let shared = explained_key("path=/files/zzz");
    assert_eq!(keys(&redis), std::slice::from_ref(&shared));
    assert!(shared.contains("#*"), "{shared}");
    assert!(!shared.contains("/files/a"), "{shared}");
    sluice.stop().await;
}

/// The `key:` line of `sluice explain` for `descriptor` in domain `ref` of [`CONFIG`].
fn explained_key(descriptor: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ref.yaml"), CONFIG).unwrap();
    let out = sluice_command()
        .arg("explain")
        .arg("--config")
        .arg(dir.path())
        .args(["--domain", "ref", "--descriptor", descriptor])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("key:"))
        .unwrap_or_else(|| panic!("no key line in\n{stdout}"))
        .trim()
        .to_owned()
}
