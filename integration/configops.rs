//! Config operations against the real `sluice` binary: SIGHUP reloads, `check-config` and
//! `explain` as CI and operators run them, and an envoyproxy/ratelimit deployment (its
//! environment, its runtime directory, its Redis) switched to sluice by changing the image.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_harness as harness;
use sluice_harness::rls::{OK, OVER_LIMIT, desc, header, http_get, req};
use sluice_harness::{SluiceBuilder, SluiceProcess, sluice_command};
use tonic::transport::Channel;

fn run(c: &mut Command) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = c.output().unwrap();
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// `GET /config` on `serve`'s admin listener, as JSON.
fn config_json(serve: &SluiceProcess) -> serde_json::Value {
    let (code, body) = http_get(serve.admin, "/config");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

/// Polls `check` every 10 ms; fails after 10 s.
fn eventually(what: &str, check: impl FnMut() -> bool) {
    harness::wait_until(what, Duration::from_secs(10), check);
}

const EDGE: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 3}\n";

#[cfg(unix)]
#[test]
fn sighup_reloads_the_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("edge.yaml"), EDGE).unwrap();
    let serve = SluiceBuilder::config(dir.path())
        .args(["--watch-config", "false"])
        .start();
    let before = config_json(&serve)["digest"].clone();

    std::fs::write(dir.path().join("edge.yaml"), EDGE.replace(": 3}", ": 30}")).unwrap();
    serve.signal(libc::SIGHUP);
    eventually("SIGHUP reloaded the edited file", || {
        let json = config_json(&serve);
        json["digest"] != before && json["loads"]["ok"] == 2
    });
    let json = config_json(&serve);
    assert_eq!(
        json["domains"][0]["rules"][0]["limit"]["bucket"]["requests_per_unit"],
        30
    );
    let log = serve.log();
    assert!(log.contains("SIGHUP received"), "{log}");
    // A broken file on SIGHUP: rejected, the process lives on with the last good config.
    std::fs::write(dir.path().join("edge.yaml"), "domain: [").unwrap();
    serve.signal(libc::SIGHUP);
    eventually("the broken file was rejected", || {
        config_json(&serve)["loads"]["failed"] == 1
    });
    assert_eq!(
        config_json(&serve)["last_rejected"]["source"]
            .as_str()
            .map(|s| s.contains("SIGHUP")),
        Some(true)
    );
    assert!(TcpStream::connect(serve.grpc).is_ok());
}

#[test]
fn check_config_json_lists_every_error_for_ci() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: -1}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("b.yaml"), "domain: b\nbogus: 1\n").unwrap();
    let (code, stdout, _) = run(sluice_command()
        .arg("check-config")
        .arg(dir.path())
        .args(["--format", "json"]));
    assert_eq!(code, Some(1));
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["ok"], false);
    let errors = json["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 3, "{json}");
    let a = dir.path().join("a.yaml").display().to_string();
    assert_eq!(errors[0]["file"], a.as_str());
    assert_eq!(
        (errors[0]["line"].as_u64(), errors[0]["column"].as_u64()),
        (Some(4), Some(24))
    );
    assert_eq!(errors[2]["line"], 2);
    assert_eq!(json["digest"], serde_json::Value::Null);
}

#[test]
fn check_config_reports_warnings_without_failing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("w.yaml"),
        r#"domain: w
descriptors:
  - key: path
    value: "/api*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: "/api/v1*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1
      replaces: [{name: ghost}]
"#,
    )
    .unwrap();
    let (code, stdout, stderr) = run(sluice_command().arg("check-config").arg(dir.path()));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.starts_with("ok: 1 domain (w), 3 rules, digest "),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with(", 2 warnings"), "{stdout}");
    let file = dir.path().join("w.yaml").display().to_string();
    assert!(
        stderr.contains(&format!(
            "warning: {file}:6:5: wildcard `path=/api/v1*` is never matched"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("warning: {file}:9:5: `replaces` names `ghost`")),
        "{stderr}"
    );

    let (code, stdout, _) = run(sluice_command()
        .arg("check-config")
        .arg(dir.path())
        .args(["--format", "json"]));
    assert_eq!(code, Some(0));
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["rules"], 3);
    assert_eq!(json["domains"][0]["name"], "w");
    assert_eq!(json["warnings"].as_array().unwrap().len(), 2);
    assert_eq!(json["digest"].as_str().unwrap().len(), 40);
}

#[test]
fn check_config_merges_domains_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("1.yaml"), EDGE).unwrap();
    std::fs::write(
        dir.path().join("2.yaml"),
        "domain: edge\ndescriptors:\n  - key: route\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let (code, _, stderr) = run(sluice_command().arg("check-config").arg(dir.path()));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("duplicate domain `edge`"), "{stderr}");
    let (code, stdout, _) = run(sluice_command()
        .arg("check-config")
        .arg(dir.path())
        .env("SLUICE_MERGE_DOMAINS", "true"));
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with("ok: 1 domain (edge), 2 rules"),
        "{stdout}"
    );
}

#[test]
fn explain_prints_the_rule_its_bucket_and_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: route\n        value: export\n        cost: 10\n        rate_limit: {unit: second, requests_per_unit: 5, burst: 50}\n",
    )
    .unwrap();
    let explain = |descriptor: &str, extra: &[&str]| {
        run(sluice_command()
            .arg("explain")
            .arg("--config")
            .arg(dir.path())
            .args(["--domain", "api", "--descriptor", descriptor])
            .args(extra))
    };
    let (code, stdout, stderr) = explain("tenant=acme,route=export", &["--key-prefix", "rl:"]);
    assert_eq!(code, Some(0), "{stderr}");
    for line in [
        "rule:        api.tenant.route_export",
        &format!("source:      {}:5", dir.path().join("api.yaml").display()),
        "limit:       5 per second",
        "bucket:      capacity 50 tokens, refill 5 tokens/s, cost 10 per hit",
        "on failure:  error (from default)",
        "key:         rl:{api|tenant=acme}|route=export",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }

    let (code, stdout, _) = explain("tenant=acme", &["--format", "json"]);
    assert_eq!(code, Some(0));
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["matched"], false);
    assert!(
        json["reason"]
            .as_str()
            .unwrap()
            .starts_with("depth mismatch"),
        "{json}"
    );

    let (code, stdout, _) = explain("tenant=a%2Cb,route=other", &[]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("tenant=a,b"), "{stdout}");
    assert!(
        stdout.contains("no rule:     entry 2 `route=other` matches no descriptor"),
        "{stdout}"
    );

    let (code, _, stderr) = explain("tenant", &[]);
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("entry 1 (`tenant`) is not key=value"),
        "{stderr}"
    );
}

#[test]
fn explain_places_an_rlqs_bucket_id_on_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("api.yaml"),
        "domain: api\ndescriptors:\n  - key: tenant\n    descriptors:\n      - key: route\n        rate_limit: {unit: minute, requests_per_unit: 60}\n",
    )
    .unwrap();
    let explain = |bucket: &str| {
        run(sluice_command()
            .arg("explain")
            .arg("--config")
            .arg(dir.path())
            .args(["--domain", "api", "--bucket", bucket]))
    };
    // Given in any order; read as tenant, then route.
    let (code, stdout, stderr) = explain("route=export,tenant=acme");
    assert_eq!(code, Some(0), "{stderr}");
    for line in [
        "bucket id:   {route=export, tenant=acme}",
        "descriptor:  tenant=acme, route=export",
        "rule:        api.tenant.route",
        "assignment:  a prepaid token bucket",
        "pool key:    sluice:{api|tenant=acme}|route=export",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in\n{stdout}");
    }
    let (code, stdout, _) = explain("env=prod,tenant=acme");
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("assignment:  ALLOW_ALL, standing"),
        "{stdout}"
    );
    assert!(stdout.contains("env fit no level"), "{stdout}");
    let (code, _, stderr) = explain("tenant=a,tenant=b");
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("--bucket: key `tenant` appears twice"),
        "{stderr}"
    );
    // One of --descriptor and --bucket.
    let (code, _, _) = run(sluice_command()
        .arg("explain")
        .arg("--config")
        .arg(dir.path())
        .args(["--domain", "api"]));
    assert_eq!(code, Some(2));
}

/// envoyproxy/ratelimit's README example config (upper-case units, as its users write them).
const MONGO: &str = r#"domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: SECOND
      requests_per_unit: 3
"#;

/// A second file of the same domain, as MERGE_DOMAIN_CONFIG deployments have.
const MONGO_MORE: &str = r#"domain: mongo_cps
descriptors:
  - key: remote_address
    rate_limit:
      unit: MINUTE
      requests_per_unit: 2
"#;

fn runtime_layout(root: &Path) -> PathBuf {
    let version = root.join("v1");
    let config = version.join("ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("mongo.yaml"), MONGO).unwrap();
    std::fs::write(config.join("mongo_more.yaml"), MONGO_MORE).unwrap();
    // Dot files are skipped with RUNTIME_IGNOREDOTFILES=true; this one would not load.
    std::fs::write(config.join(".editor-backup.yaml"), "domain: [").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&version, root.join("current")).unwrap();
    root.join("current")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envoyproxy_ratelimit_deployment_switches_by_changing_the_image() {
    let redis = harness::RedisServer::start();
    let root = tempfile::tempdir().unwrap();
    let runtime_root = runtime_layout(root.path());

    let serve = start_envoyproxy_deployment(&runtime_root, &redis.addr());

    assert_unsupported_settings_named(&serve.log());
    let mut client = serve.client().await;
    decides_as_the_mongo_rules(&mut client).await;

    // The buckets live in the deployment's Redis, under CACHE_KEY_PREFIX.
    let keys: Vec<String> = redis.cmd(&["KEYS", "ratelimit:*"]);
    assert!(
        keys.iter()
            .any(|k| k == "ratelimit:{mongo_cps|database=default}"),
        "{keys:?}"
    );

    // envoyproxy/ratelimit's health check path on PORT; the config came from the runtime dir.
    let (code, body) = http_get(serve.admin, "/healthcheck");
    assert_eq!((code, body.as_str()), (200, "OK"));
    let json = config_json(&serve);
    assert_eq!(json["rule_count"], 3);
    assert!(
        json["domains"][0]["file"]
            .as_str()
            .unwrap()
            .ends_with("current/ratelimit/config/mongo.yaml")
    );
    drop(serve);
}

/// sluice started with the environment of an envoyproxy/ratelimit deployment (its runtime
/// directory, Redis, ports, headers, and settings sluice does not support).
fn start_envoyproxy_deployment(runtime_root: &Path, redis_addr: &str) -> SluiceProcess {
    SluiceBuilder::environment()
        .envs([
            ("RUNTIME_ROOT", runtime_root.to_str().unwrap()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_APPDIRECTORY", "config"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", redis_addr),
            ("REDIS_TYPE", "SINGLE"),
            ("REDIS_POOL_SIZE", "10"),
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("DEBUG_PORT", "6070"),
            ("LOG_LEVEL", "INFO"),
            ("LOG_FORMAT", "text"),
            ("CACHE_KEY_PREFIX", "ratelimit:"),
            ("MERGE_DOMAIN_CONFIG", "true"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REMAINING_HEADER", "X-RateLimit-Left"),
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "statsd.monitoring"),
            ("USE_PROMETHEUS", "true"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
        ])
        .start()
}

/// Every unsupported setting is named once in the log, never dropped silently.
fn assert_unsupported_settings_named(log: &str) {
    for name in ["USE_STATSD", "STATSD_HOST", "DEBUG_PORT"] {
        let line = format!("ignored: {name} ");
        assert_eq!(log.matches(&line).count(), 1, "{line:?} once in\n{log}");
    }
    assert!(!log.contains("ignored: REDIS_URL"), "{log}");
    // Its local cache of over-limit keys is sluice's over-limit cache, sized in keys.
    assert!(
        log.contains("LOCAL_CACHE_SIZE_IN_BYTES → SLUICE_OVER_LIMIT_CACHE_MAX_KEYS=4096"),
        "{log}"
    );
}

/// The `mongo_cps` rules of the runtime directory's two files, merged, as envoyproxy/ratelimit
/// decides them; unmatched descriptors and unknown domains pass.
async fn decides_as_the_mongo_rules(client: &mut RateLimitServiceClient<Channel>) {
    let call = |pairs: &'static [(&'static str, &'static str)]| req("mongo_cps", vec![desc(pairs)]);
    // database=default: 3 per second, then OVER_LIMIT, with the configured header names.
    for _ in 0..3 {
        let r = client
            .should_rate_limit(call(&[("database", "default")]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, OK);
    }
    let over = client
        .should_rate_limit(call(&[("database", "default")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(over.overall_code, OVER_LIMIT);
    assert_eq!(header(&over, "X-RateLimit-Left"), Some("0"));
    assert_eq!(header(&over, "RateLimit-Limit"), Some("3, 3;w=1"));
    // The merged second file's rule applies.
    for expected in [OK, OK, OVER_LIMIT] {
        let r = client
            .should_rate_limit(call(&[("remote_address", "10.0.0.1")]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.overall_code, expected);
    }
    // Unmatched descriptors and unknown domains are OK, as in envoyproxy/ratelimit.
    let r = client
        .should_rate_limit(call(&[("database", "other")]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
    let r = client
        .should_rate_limit(req("nope", vec![desc(&[("a", "b")])]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, OK);
}

#[test]
fn an_untranslatable_envoyproxy_setting_refuses_to_start() {
    let (code, _, stderr) = run(sluice_command()
        .args(["serve", "--config", "/nonexistent"])
        .env("REDIS_URL", "127.0.0.1:1")
        .env("REDIS_TYPE", "RING"));
    assert_eq!(code, Some(2));
    assert!(
        stderr.contains("REDIS_TYPE: `RING` is not one of SINGLE, CLUSTER, SENTINEL"),
        "{stderr}"
    );
    // Other subcommands do not read envoyproxy/ratelimit settings at all.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("edge.yaml"), EDGE).unwrap();
    let (code, _, _) = run(sluice_command()
        .arg("check-config")
        .arg(dir.path())
        .env("REDIS_TYPE", "RING"));
    assert_eq!(code, Some(0));
}
