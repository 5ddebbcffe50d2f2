//! The admin listener's page (`GET /`) and `GET /status` on a `sluice serve` process. The page is
//! also loaded in a real headless browser (Debian's chromium) by an opt-in test:
//! `SLUICE_CHROMIUM=/usr/bin/chromium cargo nextest run --test admin_page --run-ignored only`.

use std::process::Command;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;
use sluice_harness::SluiceProcess;
use sluice_harness::rls::{OVER_LIMIT, desc, http_get, req};

const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;

/// Spends `user=mallory` past its limit through gRPC.
async fn limit_mallory(sluice: &SluiceProcess) {
    let mut client = RateLimitServiceClient::connect(format!("http://{}", sluice.grpc))
        .await
        .expect("RLS client connects");
    let mut codes = Vec::new();
    for _ in 0..6 {
        let reply = client
            .should_rate_limit(req("edge", vec![desc(&[("user", "mallory")])]))
            .await
            .expect("decided");
        codes.push(reply.into_inner().overall_code);
    }
    assert_eq!(codes.iter().filter(|c| **c == OVER_LIMIT).count(), 3);
}

#[test]
fn the_page_is_self_contained_and_status_says_what_the_replica_is() {
    let sluice = SluiceProcess::start(&[("edge.yaml", RULES)], &[]);
    let (status, page) = http_get(sluice.admin, "/");
    assert_eq!(status, 200);
    for part in [
        "<form id=\"explain-form\"",
        "<form id=\"peek-form\"",
        "/top?n=10",
        "/status",
    ] {
        assert!(page.contains(part), "the page has {part}");
    }
    // No external asset: nothing is loaded from anywhere but this listener.
    for external in ["src=\"http", "href=\"http", "@import", "url(http", "//cdn"] {
        assert!(!page.contains(external), "the page loads {external}");
    }
    let (status, body) = http_get(sluice.admin, "/status");
    assert_eq!(status, 200, "{body}");
    let s: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["ready"], true);
    assert_eq!(s["not_ready"], serde_json::json!([]));
    assert_eq!(s["backend"], "memory");
    assert_eq!(s["replicas"], 1);
    assert_eq!(s["breakers"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "opt-in: needs a browser; SLUICE_CHROMIUM=/usr/bin/chromium, --run-ignored only"]
async fn a_browser_shows_the_limited_key_and_answers_both_forms() {
    let chromium = std::env::var("SLUICE_CHROMIUM").expect("SLUICE_CHROMIUM names the browser");
    let sluice = SluiceProcess::start(&[("edge.yaml", RULES)], &[]);
    limit_mallory(&sluice).await;
    let (_, config) = http_get(sluice.admin, "/config");
    let digest = serde_json::from_str::<Value>(&config).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    // The link fills both forms and submits them; the DOM is dumped once the page's scripts
    // (its fetches and its first refreshes) have run.
    let url = format!(
        "http://{}/?domain=edge&descriptor=user=mallory",
        sluice.admin
    );
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=5000",
            &format!("--user-data-dir={}", profile.path().display()),
            "--dump-dom",
            &url,
        ])
        .output()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = |part: &str| assert!(dom.contains(part), "the page shows {part}:\n{dom}");
    shown("class=\"ok\">ready<");
    shown(&digest);
    // Who is limited now: mallory, over the limit 3 times of 6 decisions.
    shown("data-rule=\"edge.user\"");
    shown("3 over limit of 6 decisions in the last 60–120 s");
    shown("<td class=\"key\">user=mallory</td>");
    // ... drawn as bars over that window: mallory's the longest of each list.
    shown("class=\"bar limited\" data-count=\"3\" style=\"width:120px\"");
    shown("class=\"bar active\" data-count=\"6\" style=\"width:120px\"");
    // The peeked bucket as a picture: empty, 0 of its 3 hits, in the RLS answer's units.
    shown("data-remaining=\"0\" data-limit=\"3\" data-level=\"0%\"");
    shown("<div class=\"fill\" style=\"width:0%\"></div>");
    shown(" 0 of 3 hits left (0 tokens, cost 1), full in ");
    // The explain form's answer names the rule; the peek form's answer holds the bucket's state.
    shown("\"path\": \"edge.user\"");
    shown("\"remaining\": 0");
    shown("\"algorithm\": \"token_bucket\"");
}
