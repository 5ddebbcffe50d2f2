//! envoyproxy/ratelimit's config features through the real path, gRPC in and Redis out: a
//! blocking `requests_per_unit: 0` rule, which never reaches Redis.

use sluice::settings::RedisModeArg;
use sluice_harness::RedisServer;
use sluice_harness::rls::{OK, OVER_LIMIT, request};
use sluice_harness::sluice::Sluice;

const CONFIG: &str = r#"
domain: ref
descriptors:
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 5}
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
