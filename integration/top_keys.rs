//! Who is limited now, through the real paths: `ShouldRateLimit` calls over gRPC to a `sluice
//! serve` process, then its admin `GET /top` and `sluice top --once` against that listener.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;
use sluice_harness::rls::{OK, OVER_LIMIT, desc, http_get, req};
use sluice_harness::{SluiceProcess, sluice_command};

const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1000}
"#;

/// `calls` ShouldRateLimit calls for `user=<user>`; the overall codes.
async fn hammer(sluice: &SluiceProcess, key: &str, value: &str, calls: usize) -> Vec<i32> {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", sluice.grpc))
        .await
        .expect("RLS client connects");
    let mut codes = Vec::new();
    for _ in 0..calls {
        let reply = client
            .should_rate_limit(req("edge", vec![desc(&[(key, value)])]))
            .await
            .expect("decided");
        codes.push(reply.into_inner().overall_code);
    }
    codes
}

fn ranked(list: &Value) -> Vec<(String, u64, u64)> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            let key = r["key"].as_str().unwrap().to_owned();
            (
                key,
                r["count"].as_u64().unwrap(),
                r["error"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_names_the_keys_over_their_limit_and_the_busiest() {
    let sluice = SluiceProcess::start(&[("edge.yaml", RULES)], &["--top-keys", "8"]);
    // mallory: 3 admitted then 7 over the limit; alice: 2, within it; a busy path: 20 OK.
    let mallory = hammer(&sluice, "user", "mallory", 10).await;
    assert_eq!(mallory.iter().filter(|c| **c == OVER_LIMIT).count(), 7);
    assert!(
        hammer(&sluice, "user", "alice", 2)
            .await
            .iter()
            .all(|c| *c == OK)
    );
    assert!(
        hammer(&sluice, "path", "/checkout", 20)
            .await
            .iter()
            .all(|c| *c == OK)
    );

    let (status, body) = http_get(sluice.admin, "/top?n=5");
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["capacity"], 8);
    let rules = view["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 2, "{body}");
    // The rule with limited keys comes first.
    assert_eq!(rules[0]["rule"], "edge.user");
    assert_eq!(rules[0]["limited_total"], 7);
    assert_eq!(rules[0]["active_total"], 12);
    assert_eq!(
        ranked(&rules[0]["limited"]),
        [("user=mallory".to_owned(), 7, 0)]
    );
    assert_eq!(
        ranked(&rules[0]["active"]),
        [
            ("user=mallory".to_owned(), 10, 0),
            ("user=alice".to_owned(), 2, 0)
        ]
    );
    assert_eq!(rules[1]["rule"], "edge.path");
    assert_eq!(rules[1]["limited_total"], 0);
    assert_eq!(
        ranked(&rules[1]["active"]),
        [("path=/checkout".to_owned(), 20, 0)]
    );

    // One rule only, and bad input answered, not guessed.
    let (_, body) = http_get(sluice.admin, "/top?rule=edge.path");
    let only: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(only["rules"].as_array().unwrap().len(), 1);
    assert_eq!(http_get(sluice.admin, "/top?n=0").0, 400);

    // The terminal view, printed once.
    let out = sluice_command()
        .args(["top", "--once", "--admin", &sluice.admin.to_string()])
        .output()
        .expect("sluice top runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("edge.user  — 7 over limit of 12 decisions"),
        "{text}"
    );
    assert!(text.contains("user=mallory  7"), "{text}");
    assert!(text.contains("path=/checkout  20"), "{text}");
}

#[test]
fn top_is_off_with_no_counters_and_sluice_top_says_why() {
    let sluice = SluiceProcess::start(&[("edge.yaml", RULES)], &["--top-keys", "0"]);
    let (status, body) = http_get(sluice.admin, "/top");
    assert_eq!(status, 404);
    assert!(body.contains("--top-keys 0"), "{body}");
    let out = sluice_command()
        .args(["top", "--once", "--admin", &sluice.admin.to_string()])
        .output()
        .expect("sluice top runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("404"));
}

/// A replica tracks at most 1,000 rules whatever its number of summary sets (one per CPU), and
/// `--top-keys` has an upper bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_tracks_at_most_a_thousand_rules_whatever_its_cores() {
    const RULES_CONFIGURED: usize = 1_050;
    let mut yaml = String::from("domain: wide\ndescriptors:\n");
    for rule in 0..RULES_CONFIGURED {
        yaml.push_str(&format!(
            "  - key: r{rule}\n    rate_limit: {{unit: minute, requests_per_unit: 10}}\n"
        ));
    }
    let sluice = SluiceProcess::start(&[("wide.yaml", &yaml)], &[]);
    // Four clients at once, so the decisions land on every runtime worker's summaries.
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..4 {
        let grpc = sluice.grpc;
        lanes.spawn(async move {
            let mut client = RateLimitServiceClient::connect(format!("http://{grpc}"))
                .await
                .unwrap();
            for rule in (lane..RULES_CONFIGURED).step_by(4) {
                let key = format!("r{rule}");
                let request = req("wide", vec![desc(&[(&key, "v")])]);
                client.should_rate_limit(request).await.expect("decided");
            }
        });
    }
    while lanes.join_next().await.is_some() {}
    let (status, body) = http_get(sluice.admin, "/top?limit=1&n=1");
    assert_eq!(status, 200, "{body}");
    let view: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["max_rules"], 1000);
    assert_eq!(view["rules_total"], 1000, "{body}");
    assert_eq!(view["untracked"], RULES_CONFIGURED - 1000, "{body}");
    // `sluice top` shows the first page (20 rules) and says how many more there are.
    let out = sluice_command()
        .args(["top", "--once", "--admin", &sluice.admin.to_string()])
        .output()
        .expect("sluice top runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("980 more rules with decisions"), "{text}");

    let out = sluice_command()
        .args(["serve", "--config", "/nonexistent", "--top-keys", "2000"])
        .output()
        .expect("sluice runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--top-keys") && stderr.contains("2000"),
        "{stderr}"
    );
}
