//! Config operations through the running service: hot reload under load (edits, invalid sets,
//! many reloads, Kubernetes ConfigMap and runtime-root symlink swaps), bucket state across a
//! reload, and the admin `GET /explain` and `GET /healthcheck` endpoints.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sluice::config::ConfigStore;
use sluice::settings::Settings;
use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;

fn rule(rpu: u32, unit: &str) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: {unit}, requests_per_unit: {rpu}}}\n"
    )
}

fn fast_reload(settings: &mut Settings) {
    settings.config_ops.watch_debounce = Duration::from_millis(20);
}

fn store(server: &TestServer) -> Arc<ConfigStore> {
    server.running.as_ref().unwrap().config.clone()
}

/// The configured requests_per_unit of `edge`'s `tenant` rule.
fn active_rpu(store: &ConfigStore) -> u32 {
    let config = store.active().load();
    let rule = config
        .domain("edge")
        .and_then(|d| d.find(&[sluice::request::Entry::new("tenant", "x")]))
        .expect("tenant rule");
    match rule.limit {
        sluice::rule::Limit::Bucket(rate) => rate.requests_per_unit,
        sluice::rule::Limit::Blocked { .. } => 0,
        sluice::rule::Limit::Unlimited => panic!("unlimited"),
    }
}

/// Polls `check` every 5 ms until it holds; fails after `limit`.
async fn eventually(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let polled = tokio::time::timeout(limit, async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(polled.is_ok(), "not within {limit:?}: {what}");
}

/// Clients calling `ShouldRateLimit` for tenant=<n> until stopped (each at most `MAX_CALLS`).
struct Load {
    stop: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    /// requests_per_unit seen in the latest answer.
    seen_limit: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

const MAX_CALLS: u64 = 200_000;

impl Load {
    fn start(server: &TestServer, clients: usize) -> Load {
        let load = Load {
            stop: Arc::new(AtomicBool::new(false)),
            calls: Arc::new(AtomicU64::new(0)),
            failures: Arc::new(AtomicU64::new(0)),
            seen_limit: Arc::new(AtomicU64::new(0)),
            tasks: Vec::new(),
        };
        let mut tasks = Vec::new();
        for n in 0..clients {
            let mut client = server.client.clone();
            let (stop, calls, failures, seen) = (
                load.stop.clone(),
                load.calls.clone(),
                load.failures.clone(),
                load.seen_limit.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let tenant = format!("t{n}");
                for _ in 0..MAX_CALLS {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let request = req("edge", vec![desc(&[("tenant", &tenant)])]);
                    match client.should_rate_limit(request).await {
                        Ok(response) => {
                            let response = response.into_inner();
                            if let Some(limit) = response.statuses[0].current_limit.as_ref() {
                                seen.store(limit.requests_per_unit as u64, Ordering::Relaxed);
                            }
                        }
                        Err(_) => {
                            failures.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        Load { tasks, ..load }
    }

    /// Stops the clients; returns (calls, failed calls).
    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        (
            self.calls.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_rule_applies_within_2s_under_load_and_no_request_fails() {
    let server = TestServer::start_with(&[("edge.yaml", &rule(1_000_000, "second"))], |_| {}).await;
    let load = Load::start(&server, 4);
    let calls = load.calls.clone();
    eventually(Duration::from_secs(10), "load is running", || {
        calls.load(Ordering::Relaxed) > 100
    })
    .await;

    std::fs::write(server.dir.path().join("edge.yaml"), rule(7, "hour")).unwrap();
    let seen = load.seen_limit.clone();
    eventually(
        Duration::from_secs(2),
        "answers carry the new limit",
        || seen.load(Ordering::Relaxed) == 7,
    )
    .await;
    let (calls, failures) = load.stop().await;
    assert_eq!(failures, 0, "{failures} of {calls} calls failed");
    assert_eq!(store(&server).load_counts(), (2, 0));
    server.stop().await;
}

#[tokio::test]
async fn an_invalid_set_keeps_the_old_config_counts_and_is_shown() {
    let mut server =
        TestServer::start_with(&[("edge.yaml", &rule(2, "minute"))], fast_reload).await;
    let store = store(&server);
    std::fs::write(
        server.dir.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: fortnight, requests_per_unit: 2\n",
    )
    .unwrap();
    eventually(
        Duration::from_secs(5),
        "the load failure is counted",
        || store.load_counts().1 == 1,
    )
    .await;

    // The old config still answers.
    for expected in [OK, OK, OVER_LIMIT] {
        let response = server.ok(req("edge", vec![desc(&[("tenant", "a")])])).await;
        assert_eq!(response.overall_code, expected);
    }
    let admin = server.admin_addr();
    let (code, body) = tokio::task::spawn_blocking(move || http_get(admin, "/config"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["loads"]["failed"], 1);
    let rejected = &json["last_rejected"];
    let file = server.dir.path().join("edge.yaml").display().to_string();
    assert_eq!(rejected["errors"][0]["file"], file.as_str());
    assert_eq!(rejected["errors"][0]["line"], 4);
    assert!(
        rejected["source"].as_str().unwrap().contains("file change"),
        "{rejected}"
    );

    // Fixing the file clears the rejection.
    std::fs::write(server.dir.path().join("edge.yaml"), rule(9, "minute")).unwrap();
    eventually(Duration::from_secs(5), "the fixed set is active", || {
        active_rpu(&store) == 9
    })
    .await;
    assert!(store.last_rejected().is_none());
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_reloads_under_load_fail_no_request() {
    let server =
        TestServer::start_with(&[("edge.yaml", &rule(1_000, "second"))], fast_reload).await;
    let store = store(&server);
    let load = Load::start(&server, 2);
    for i in 0..100u32 {
        let before = store.load_counts().0;
        let rpu = 1_000 + i % 2;
        std::fs::write(server.dir.path().join("edge.yaml"), rule(rpu, "second")).unwrap();
        eventually(Duration::from_secs(5), "the reload happens", || {
            store.load_counts().0 > before
        })
        .await;
    }
    let (calls, failures) = load.stop().await;
    assert_eq!(failures, 0, "{failures} of {calls} calls failed");
    let (ok, failed) = store.load_counts();
    assert!(ok > 100, "{ok} successful loads");
    assert_eq!(failed, 0);
    assert_eq!(active_rpu(&store), 1_001);
    server.stop().await;
}

#[cfg(unix)]
#[tokio::test]
async fn a_configmap_update_is_seen() {
    use std::os::unix::fs::symlink;
    // What the kubelet writes: the data in a timestamped directory, `..data` pointing at it,
    // and one top-level symlink per key through `..data`.
    let server = TestServer::start_with(&[], |settings| {
        let dir = settings.config.clone().expect("a config directory");
        write_version(&dir, "..2026_01_01_00_00_00.000000001", 3);
        symlink("..2026_01_01_00_00_00.000000001", dir.join("..data")).unwrap();
        symlink("..data/edge.yaml", dir.join("edge.yaml")).unwrap();
        fast_reload(settings);
    })
    .await;
    let store = store(&server);
    assert_eq!(active_rpu(&store), 3);

    // An update: a new timestamped directory, `..data` renamed over atomically, the old one gone.
    let dir = server.dir.path();
    write_version(dir, "..2026_01_01_00_01_00.000000002", 4);
    symlink("..2026_01_01_00_01_00.000000002", dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    std::fs::remove_dir_all(dir.join("..2026_01_01_00_00_00.000000001")).unwrap();
    eventually(
        Duration::from_secs(5),
        "the new ConfigMap data is active",
        || active_rpu(&store) == 4,
    )
    .await;
    assert_eq!(store.load_counts().1, 0, "no half-written state was read");
    server.stop().await;
}

#[cfg(unix)]
#[tokio::test]
async fn a_swapped_runtime_root_symlink_is_seen_and_followed() {
    use std::os::unix::fs::symlink;
    // envoyproxy/ratelimit's layout: RUNTIME_ROOT (`current`) points at a version directory.
    let root = tempfile::tempdir().unwrap();
    for (version, rpu) in [("v1", 11), ("v2", 12), ("v3", 13)] {
        let config = root.path().join(version).join("ratelimit/config");
        std::fs::create_dir_all(&config).unwrap();
        std::fs::write(config.join("edge.yaml"), rule(rpu, "minute")).unwrap();
    }
    symlink("v1", root.path().join("current")).unwrap();
    let config_path = root.path().join("current/ratelimit/config");
    let server = TestServer::start_with(&[], |settings| {
        settings.config = Some(config_path.clone());
        fast_reload(settings);
    })
    .await;
    let store = store(&server);
    assert_eq!(active_rpu(&store), 11);
    for (version, rpu) in [("v2", 12), ("v3", 13)] {
        let tmp = root.path().join("current.tmp");
        symlink(version, &tmp).unwrap();
        std::fs::rename(&tmp, root.path().join("current")).unwrap();
        eventually(Duration::from_secs(5), "the swapped root is read", || {
            active_rpu(&store) == rpu
        })
        .await;
    }
    // Edits inside the new target are watched too.
    std::fs::write(
        root.path().join("v3/ratelimit/config/edge.yaml"),
        rule(14, "minute"),
    )
    .unwrap();
    eventually(
        Duration::from_secs(5),
        "an edit in the new target is read",
        || active_rpu(&store) == 14,
    )
    .await;
    server.stop().await;
}

fn write_version(dir: &Path, name: &str, rpu: u32) {
    let version = dir.join(name);
    std::fs::create_dir(&version).unwrap();
    std::fs::write(version.join("edge.yaml"), rule(rpu, "minute")).unwrap();
}

#[tokio::test]
async fn a_rate_change_keeps_the_bucket_and_clamps_it() {
    let mut server = TestServer::start_with(
        &[(
            "edge.yaml",
            "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
        )],
        fast_reload,
    )
    .await;
    let store = store(&server);
    let call = || req("edge", vec![desc(&[("tenant", "a")])]);
    for _ in 0..3 {
        assert_eq!(server.ok(call()).await.overall_code, OK);
    }
    // 2 tokens left. A larger bucket keeps them: an edit grants no fresh burst.
    std::fs::write(
        server.dir.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 50}\n",
    )
    .unwrap();
    eventually(Duration::from_secs(5), "the larger limit is active", || {
        active_rpu(&store) == 50
    })
    .await;
    let response = server.ok(call()).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].limit_remaining, 1);
    // A smaller bucket clamps what is stored to its capacity.
    std::fs::write(
        server.dir.path().join("edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 50, burst: 1}\n",
    )
    .unwrap();
    eventually(Duration::from_secs(5), "the burst is active", || {
        let config = store.active().load();
        config
            .rules()
            .any(|r| matches!(r.limit, sluice::rule::Limit::Bucket(b) if b.burst == Some(1)))
    })
    .await;
    let response = server.ok(call()).await;
    assert_eq!(response.overall_code, OK);
    assert_eq!(response.statuses[0].limit_remaining, 0);
    assert_eq!(server.ok(call()).await.overall_code, OVER_LIMIT);
    server.stop().await;
}

#[tokio::test]
async fn reading_the_config_does_not_trigger_reloads() {
    let server = TestServer::start_with(&[("edge.yaml", &rule(3, "minute"))], fast_reload).await;
    let store = store(&server);
    std::fs::write(server.dir.path().join("edge.yaml"), rule(4, "minute")).unwrap();
    eventually(Duration::from_secs(5), "the edit is read", || {
        active_rpu(&store) == 4
    })
    .await;
    let settled = store.load_counts();
    // Reading the files (as the reload just did, and as this does) opens them: no reload may
    // follow from that, or the service would reload forever.
    for _ in 0..5 {
        let _ = std::fs::read(server.dir.path().join("edge.yaml")).unwrap();
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    assert_eq!(store.load_counts(), settled);
    server.stop().await;
}

#[tokio::test]
async fn explain_and_healthcheck_endpoints() {
    let server = TestServer::start(&[(
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 4}\n    descriptors:\n      - key: path\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
    )])
    .await;
    let admin = server.admin_addr();
    let get = |path: &'static str| tokio::task::spawn_blocking(move || http_get(admin, path));

    let (code, body) = get("/explain?domain=edge&descriptor=tenant%3Dacme%2Cpath%3D%252Fa%252Cb")
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["matched"], true);
    // Values are shown in the admin API's one form (`value_text`): a `,` inside one is `%2C`.
    assert_eq!(json["descriptor"][1]["value"], "/a%2Cb");
    assert_eq!(json["rule"]["path"], "edge.tenant.path");
    assert_eq!(json["rule"]["bucket"]["capacity"], 1);
    assert_eq!(json["rule"]["key"], "sluice:{edge|tenant=acme}|path=/a%2Cb");

    let (code, body) = get("/explain?domain=edge&descriptor=path%3Dx")
        .await
        .unwrap();
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["matched"], false);
    assert!(
        json["reason"]
            .as_str()
            .unwrap()
            .contains("matches no descriptor at the top level"),
        "{json}"
    );

    // An RLQS bucket id, in any order: placed as tenant, then path; values in the one form.
    let (code, body) = get("/explain?domain=edge&bucket=path%3D%252Fa%252Cb%2Ctenant%3Dacme")
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["placed"]["rule"]["path"], "edge.tenant.path");
    assert_eq!(json["pool_key"], "sluice:{edge|tenant=acme}|path=/a%2Cb");
    assert_eq!(json["bucket_id"][0]["value"], "/a%2Cb", "{json}");
    assert_eq!(json["placed"]["descriptor"][0]["value"], "acme", "{json}");
    assert_eq!(json["placed"]["descriptor"][1]["value"], "/a%2Cb", "{json}");
    let (code, _) = get("/explain?domain=edge&bucket=a%3D1&descriptor=a%3D1")
        .await
        .unwrap();
    assert_eq!(code, 400);

    let (code, body) = get("/explain?domain=edge").await.unwrap();
    assert_eq!(code, 400);
    assert!(body.contains("descriptor"), "{body}");
    let (code, _) = get("/explain?domain=edge&descriptor=novalue")
        .await
        .unwrap();
    assert_eq!(code, 400);

    let (code, body) = get("/healthcheck").await.unwrap();
    assert_eq!((code, body.as_str()), (200, "OK"));
    server.stop().await;
}
