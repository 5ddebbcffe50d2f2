//! RLQS end to end on the embedded backend: `StreamRateLimitQuotas` over gRPC in, assignments
//! out, and the same bucket an RLS call charges.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use sluice_harness::rls::*;
use sluice_harness::sluice::TestServer;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const CONFIG: &str = r#"
domain: mesh
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 600}
  - key: blocked
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: free
    rate_limit: {unlimited: true}
"#;

/// One data plane's stream: reports go in through `tx`, assignments come out of `rx`.
struct Stream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: Streaming<RateLimitQuotaResponse>,
}

async fn open(s: &TestServer, domain: &str, first: &[(&str, &str)]) -> Stream {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", s.grpc_addr()))
        .await
        .unwrap();
    let (tx, reports) = mpsc::channel(16);
    tx.send(report(domain, first, 1, 0)).await.unwrap();
    let rx = client
        .stream_rate_limit_quotas(ReceiverStream::new(reports))
        .await
        .unwrap()
        .into_inner();
    Stream { tx, rx }
}

fn bucket(entries: &[(&str, &str)]) -> BucketId {
    BucketId {
        bucket: entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
    }
}

fn report(
    domain: &str,
    entries: &[(&str, &str)],
    allowed: u64,
    denied: u64,
) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(bucket(entries)),
            time_elapsed: Some(PbDuration {
                seconds: 1,
                nanos: 0,
            }),
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }],
    }
}

/// The next action for `entries`, skipping actions for other buckets.
async fn next_action(stream: &mut Stream, entries: &[(&str, &str)]) -> BucketAction {
    let wanted = bucket(entries);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let message = tokio::time::timeout_at(deadline, stream.rx.message())
            .await
            .expect("an assignment within 10 s")
            .expect("stream ok")
            .expect("stream open");
        if let Some(action) = message
            .bucket_action
            .into_iter()
            .find(|a| a.bucket_id.as_ref() == Some(&wanted))
        {
            return action;
        }
    }
}

fn strategy(action: &BucketAction) -> (Option<Strategy>, Option<PbDuration>) {
    match action.bucket_action.as_ref().expect("an action") {
        Kind::QuotaAssignmentAction(a) => (
            a.rate_limit_strategy.and_then(|s| s.strategy),
            a.assignment_time_to_live,
        ),
        Kind::AbandonAction(_) => panic!("abandoned: {action:?}"),
    }
}

#[tokio::test]
async fn a_limited_bucket_gets_a_prepaid_token_bucket_taken_from_the_rls_bucket() {
    let mut s = TestServer::start(&[("mesh.yaml", CONFIG)]).await;
    let tenant = [("tenant", "acme")];
    let mut dp = open(&s, "mesh", &tenant).await;
    let (assigned, ttl) = strategy(&next_action(&mut dp, &tenant).await);
    let Some(Strategy::TokenBucket(b)) = assigned else {
        panic!("expected a token bucket, got {assigned:?}")
    };
    // 600/minute is 10/s: a share of it, never more, refilled per whole second.
    let per_fill = b.tokens_per_fill.unwrap().value;
    let interval = b.fill_interval.unwrap();
    assert!((1..=10).contains(&per_fill), "{b:?}");
    // Whole seconds for Envoy's rate; the nanos repeat them so Envoy, which compares buckets by
    // the nanos, tells intervals apart.
    assert_eq!((interval.seconds, interval.nanos), (1, 1));
    assert!(b.max_tokens >= 1);
    let ttl = ttl.expect("prepaid assignments expire");
    assert_eq!(
        (ttl.seconds, ttl.nanos),
        (3, 0),
        "whole seconds: Envoy reads no more"
    );

    // The tokens were taken from the bucket an RLS descriptor of the same entries charges: the
    // first report's admission, and what the assignment may admit before it expires.
    let r = s.ok(req("mesh", vec![desc(&tenant)])).await;
    let remaining = r.statuses[0].limit_remaining;
    assert!(remaining < 599, "RLS still sees {remaining} of 600 left");
    s.stop().await;
}

#[tokio::test]
async fn standing_assignments_for_rule_less_unlimited_and_blocked_buckets() {
    let s = TestServer::start(&[("mesh.yaml", CONFIG)]).await;
    for (entries, expected) in [
        (&[("nobody", "x")][..], BlanketRule::AllowAll),
        (&[("free", "x")][..], BlanketRule::AllowAll),
        (&[("blocked", "x")][..], BlanketRule::DenyAll),
    ] {
        let mut dp = open(&s, "mesh", entries).await;
        let (assigned, ttl) = strategy(&next_action(&mut dp, entries).await);
        assert_eq!(
            assigned,
            Some(Strategy::BlanketRule(expected as i32)),
            "{entries:?}"
        );
        assert_eq!(
            ttl, None,
            "a standing assignment does not expire: {entries:?}"
        );
    }
    // An unknown domain has no rules: allow all, as RLS answers OK.
    let mut dp = open(&s, "elsewhere", &[("tenant", "a")]).await;
    let (assigned, _) = strategy(&next_action(&mut dp, &[("tenant", "a")]).await);
    assert_eq!(
        assigned,
        Some(Strategy::BlanketRule(BlanketRule::AllowAll as i32))
    );
    s.stop().await;
}

#[tokio::test]
async fn a_stream_that_changes_domain_ends_with_invalid_argument() {
    let s = TestServer::start(&[("mesh.yaml", CONFIG)]).await;
    let tenant = [("tenant", "acme")];
    let mut dp = open(&s, "mesh", &tenant).await;
    let _ = next_action(&mut dp, &tenant).await;
    dp.tx.send(report("other", &tenant, 1, 0)).await.unwrap();
    let status = loop {
        match dp.rx.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("stream ended without an error"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("domain"), "{}", status.message());
    s.stop().await;
}

#[tokio::test]
async fn malformed_bucket_ids_are_ignored_and_counted_and_the_stream_goes_on() {
    let s = TestServer::start_with(&[("mesh.yaml", CONFIG)], |settings| {
        settings.rlqs_max_bucket_entries = 4;
    })
    .await;
    let tenant = [("tenant", "acme")];
    let mut dp = open(&s, "mesh", &tenant).await;
    let _ = next_action(&mut dp, &tenant).await;
    let wide: Vec<(String, String)> = (0..50).map(|i| (format!("k{i}"), "v".into())).collect();
    let wide: Vec<(&str, &str)> = wide.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    dp.tx.send(report("", &wide, 1, 0)).await.unwrap();
    dp.tx
        .send(report("", &[("tenant", "")], 1, 0))
        .await
        .unwrap();
    dp.tx
        .send(report("", &[("tenant", "x")], u64::MAX, 0))
        .await
        .unwrap();
    // The stream still serves its bucket.
    let (assigned, _) = strategy(&next_action(&mut dp, &tenant).await);
    assert!(
        matches!(assigned, Some(Strategy::TokenBucket(_))),
        "{assigned:?}"
    );
    let metrics = reqwest_metrics(&s).await;
    for (reason, n) in [("invalid_bucket", 2), ("absurd_count", 1)] {
        let line = format!("sluice_rlqs_reports_ignored_total{{reason=\"{reason}\"}} {n}");
        assert!(metrics.contains(&line), "missing {line} in\n{metrics}");
    }
    s.stop().await;
}

/// `GET /metrics` from the admin listener.
async fn reqwest_metrics(s: &TestServer) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(s.admin_addr())
        .await
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    body
}

#[tokio::test]
async fn settings_that_cannot_work_together_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mesh.yaml"), CONFIG).unwrap();
    let start = |tweak: fn(&mut sluice::settings::Settings)| {
        let mut settings = sluice::settings::Settings::with_config(dir.path());
        settings.grpc_addr = "127.0.0.1:0".parse().unwrap();
        settings.admin_addr = "127.0.0.1:0".parse().unwrap();
        tweak(&mut settings);
        sluice::server::start(settings)
    };
    let error = start(|s| s.rlqs_assignment_ttl = s.rlqs_push_interval)
        .await
        .err()
        .expect("a ttl no longer than the push interval is refused")
        .to_string();
    assert!(error.contains("--rlqs-assignment-ttl"), "{error}");
    let error = start(|s| s.rlqs_assignment_ttl = std::time::Duration::from_millis(1_500))
        .await
        .err()
        .expect("a ttl Envoy would truncate is refused")
        .to_string();
    assert!(error.contains("whole number of seconds"), "{error}");
    let error = start(|s| s.redis_per_second.url = vec!["redis://127.0.0.1:1".into()])
        .await
        .err()
        .expect("a per-second Redis without the Redis backend is refused")
        .to_string();
    assert!(
        error.contains("--redis-per-second-url needs --backend redis"),
        "{error}"
    );
}
