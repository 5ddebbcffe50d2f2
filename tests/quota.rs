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
        let ttl = ttl.expect("Envoy reads an unset ttl as 0 s");
        assert!(
            ttl.seconds >= 1 && ttl.nanos == 0,
            "a standing assignment lasts whole seconds: {entries:?} {ttl:?}"
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
    let error = start(|s| s.rlqs_first_report_timeout = std::time::Duration::ZERO)
        .await
        .err()
        .expect("a stream must have time for its first report")
        .to_string();
    assert!(error.contains("--rlqs-first-report-timeout"), "{error}");
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

/// A report of every bucket in `buckets` (each allowed once), as Envoy sends all of a domain's
/// buckets in one message.
fn report_all(domain: &str, buckets: &[Vec<(String, String)>]) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: buckets
            .iter()
            .map(|entries| BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: entries.iter().cloned().collect(),
                }),
                time_elapsed: Some(PbDuration {
                    seconds: 5,
                    nanos: 0,
                }),
                num_requests_allowed: 1,
                num_requests_denied: 0,
            })
            .collect(),
    }
}

/// A bucket id's entries, sorted by key.
fn sorted(id: &BucketId) -> Vec<(String, String)> {
    let mut entries: Vec<_> = id.bucket.clone().into_iter().collect();
    entries.sort();
    entries
}

/// A stream opened with `first` as its first message.
async fn open_with(s: &TestServer, first: RateLimitQuotaUsageReports) -> Stream {
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", s.grpc_addr()))
        .await
        .unwrap()
        .max_encoding_message_size(usize::MAX);
    let (tx, reports) = mpsc::channel(16);
    tx.send(first).await.unwrap();
    let rx = client
        .stream_rate_limit_quotas(ReceiverStream::new(reports))
        .await
        .unwrap()
        .into_inner();
    Stream { tx, rx }
}

/// A bucket id of one UUID-like entry, as Envoy builds from a request header.
fn uuid_bucket(key: &str, i: usize) -> Vec<(String, String)> {
    vec![(
        key.to_string(),
        format!("{:08x}-4c2e-4a5b-9d3f-{:012x}", i, i * 7919),
    )]
}

/// The next assignment action of the stream, `None` when it ended with OK.
async fn next_message(
    stream: &mut Stream,
) -> Result<Option<RateLimitQuotaResponse>, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(10), stream.rx.message())
        .await
        .expect("a message or an end within 10 s")
}

/// The status a stream ends with, skipping its assignments.
async fn end_status(stream: &mut Stream) -> tonic::Status {
    loop {
        match next_message(stream).await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended with OK and no reason"),
            Err(status) => return status,
        }
    }
}

fn metric_line(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
}

/// 50 blocked buckets and 50 reaching no rule, reported in one message: every one of them gets
/// its standing assignment, with a TTL Envoy reads as at least one whole second (Envoy reads an
/// unset TTL as 0 s), and gets it again before it expires.
#[tokio::test]
async fn every_standing_bucket_gets_its_assignment_with_a_ttl_and_again_before_it_expires() {
    let s = TestServer::start(&[("mesh.yaml", CONFIG)]).await;
    let buckets: Vec<Vec<(String, String)>> = (0..50)
        .flat_map(|i| [uuid_bucket("blocked", i), uuid_bucket("nobody", i)])
        .collect();
    let mut dp = open_with(&s, report_all("mesh", &buckets)).await;
    type Assigned = (Option<Strategy>, Option<PbDuration>);
    let mut received: HashMap<Vec<(String, String)>, Vec<Assigned>> = HashMap::new();
    while received.len() < buckets.len() || received.values().any(|v| v.len() < 2) {
        let message = next_message(&mut dp).await.unwrap().expect("stream open");
        for action in message.bucket_action {
            let id = sorted(action.bucket_id.as_ref().unwrap());
            received.entry(id).or_default().push(strategy(&action));
        }
    }
    for entries in &buckets {
        let expected = if entries[0].0 == "blocked" {
            BlanketRule::DenyAll
        } else {
            BlanketRule::AllowAll
        };
        for (assigned, ttl) in &received[entries] {
            assert_eq!(*assigned, Some(Strategy::BlanketRule(expected as i32)));
            let ttl = ttl.expect("a standing assignment carries a ttl");
            assert!(ttl.seconds >= 1, "Envoy reads whole seconds: {ttl:?}");
        }
    }
    s.stop().await;
}

/// A report larger than `--max-message-bytes` ends the stream with RESOURCE_EXHAUSTED naming the
/// flag, as a first message or a later one, and the end is counted by reason.
#[tokio::test]
async fn a_report_over_the_message_bound_ends_the_stream_saying_why() {
    let s = TestServer::start_with(&[("mesh.yaml", CONFIG)], |settings| {
        settings.max_message_bytes = 64 * 1024;
    })
    .await;
    let big: Vec<_> = (0..2_000).map(|i| uuid_bucket("tenant", i)).collect();
    let tenant = [("tenant", "acme")];
    let mut dp = open(&s, "mesh", &tenant).await;
    let _ = next_action(&mut dp, &tenant).await;
    dp.tx.send(report_all("", &big)).await.unwrap();
    let later = end_status(&mut dp).await;

    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", s.grpc_addr()))
        .await
        .unwrap();
    let first = client
        .stream_rate_limit_quotas(tokio_stream::iter([report_all("mesh", &big)]))
        .await
        .expect_err("an oversized first report is refused");
    for status in [later, first] {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("--max-message-bytes"),
            "{}",
            status.message()
        );
    }
    let metrics = reqwest_metrics(&s).await;
    let ends = metric_line(
        &metrics,
        "sluice_rlqs_stream_ends_total{reason=\"too_large\"}",
    );
    assert_eq!(ends, 2);
    s.stop().await;
}

/// Envoy reports every bucket of a domain in one message: at the default bound, one report of
/// `--rlqs-max-buckets-per-stream` UUID buckets is read and every bucket is assigned.
#[tokio::test]
async fn the_default_bound_reads_a_report_of_every_bucket_a_stream_may_subscribe() {
    let s = TestServer::start(&[("mesh.yaml", CONFIG)]).await;
    let max = usize::try_from(sluice::settings::Settings::defaults().rlqs_max_buckets_per_stream)
        .unwrap();
    let buckets: Vec<_> = (0..max).map(|i| uuid_bucket("tenant", i)).collect();
    let report = report_all("mesh", &buckets);
    let bytes = prost::Message::encoded_len(&report);
    println!("a report of {max} one-UUID buckets: {bytes} bytes");
    let mut dp = open_with(&s, report).await;
    let mut assigned = std::collections::HashSet::new();
    while assigned.len() < max {
        let message = next_message(&mut dp).await.unwrap().expect("stream open");
        assigned.extend(
            message
                .bucket_action
                .iter()
                .map(|a| sorted(a.bucket_id.as_ref().unwrap())),
        );
    }
    s.stop().await;
}

/// A data plane that half-closes right after a report still gets that report's assignment,
/// then the stream ends with OK.
#[tokio::test]
async fn a_half_close_is_answered_before_the_stream_ends() {
    let s = TestServer::start(&[("mesh.yaml", CONFIG)]).await;
    let tenant = [("tenant", "acme")];
    let Stream { tx, mut rx } = open(&s, "mesh", &tenant).await;
    drop(tx);
    let mut dp_rx = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), rx.message())
            .await
            .expect("an end within 10 s")
        {
            Ok(Some(message)) => dp_rx.extend(message.bucket_action),
            Ok(None) => break,
            Err(status) => panic!("ended with {status:?}"),
        }
    }
    let wanted = bucket(&tenant);
    let action = dp_rx
        .iter()
        .find(|a| a.bucket_id.as_ref() == Some(&wanted))
        .expect("the last report was answered");
    assert!(
        matches!(strategy(action).0, Some(Strategy::TokenBucket(_))),
        "{action:?}"
    );
    let metrics = reqwest_metrics(&s).await;
    assert_eq!(
        metric_line(
            &metrics,
            "sluice_rlqs_stream_ends_total{reason=\"half_closed\"}"
        ),
        1
    );
    s.stop().await;
}

/// A stream that sends no first report is an open stream while it waits, and ends with
/// DEADLINE_EXCEEDED after `--rlqs-first-report-timeout`, counted by reason.
#[tokio::test]
async fn a_stream_without_a_first_report_is_counted_open_and_timed_out() {
    let connect =
        |s: &TestServer| RateLimitQuotaServiceClient::connect(format!("http://{}", s.grpc_addr()));
    // Waiting: counted open; an empty stream is refused.
    let s = TestServer::start(&[("mesh.yaml", CONFIG)]).await;
    let mut client = connect(&s).await.unwrap();
    let (tx, reports) = mpsc::channel::<RateLimitQuotaUsageReports>(1);
    let call = tokio::spawn(async move {
        client
            .stream_rate_limit_quotas(ReceiverStream::new(reports))
            .await
    });
    let open = "sluice_rlqs_streams_open";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metric_line(&reqwest_metrics(&s).await, open) != 1 {
        assert!(tokio::time::Instant::now() < deadline, "never counted open");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(tx);
    let status = call.await.unwrap().expect_err("an empty stream is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let metrics = reqwest_metrics(&s).await;
    assert_eq!(metric_line(&metrics, open), 0);
    assert_eq!(
        metric_line(
            &metrics,
            "sluice_rlqs_stream_ends_total{reason=\"invalid_report\"}"
        ),
        1
    );
    s.stop().await;

    // Silent: timed out.
    let s = TestServer::start_with(&[("mesh.yaml", CONFIG)], |settings| {
        settings.rlqs_first_report_timeout = Duration::from_millis(100);
    })
    .await;
    let mut client = connect(&s).await.unwrap();
    let (_tx, reports) = mpsc::channel::<RateLimitQuotaUsageReports>(1);
    let status = client
        .stream_rate_limit_quotas(ReceiverStream::new(reports))
        .await
        .expect_err("a silent stream is timed out");
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(
        status.message().contains("--rlqs-first-report-timeout"),
        "{}",
        status.message()
    );
    let metrics = reqwest_metrics(&s).await;
    assert_eq!(metric_line(&metrics, open), 0);
    assert_eq!(
        metric_line(
            &metrics,
            "sluice_rlqs_stream_ends_total{reason=\"no_first_report\"}"
        ),
        1
    );
    s.stop().await;
}

/// `--rlqs-max-subscriptions` bounds the replica's subscriptions over every stream: a new bucket
/// past it is ignored and counted, and a closed stream's subscriptions make room again.
#[tokio::test]
async fn subscriptions_past_the_replica_bound_are_refused_and_freed_when_a_stream_closes() {
    let s = TestServer::start_with(&[("mesh.yaml", CONFIG)], |settings| {
        settings.rlqs_max_subscriptions = 10;
    })
    .await;
    let first: Vec<_> = (0..8).map(|i| uuid_bucket("tenant", i)).collect();
    let second: Vec<_> = (100..108).map(|i| uuid_bucket("tenant", i)).collect();
    let mut one = open_with(&s, report_all("mesh", &first)).await;
    let _ = next_message(&mut one).await.unwrap().expect("assigned");
    let mut two = open_with(&s, report_all("mesh", &second)).await;
    let _ = next_message(&mut two).await.unwrap().expect("assigned");
    let subscribed = "sluice_rlqs_buckets_subscribed";
    let refused = "sluice_rlqs_reports_ignored_total{reason=\"too_many_subscriptions\"}";
    let metrics = reqwest_metrics(&s).await;
    assert_eq!(metric_line(&metrics, subscribed), 10);
    assert_eq!(metric_line(&metrics, refused), 6);

    // The first stream closes: its 8 go, and the second's next report subscribes the rest.
    drop(one);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metric_line(&reqwest_metrics(&s).await, subscribed) != 2 {
        assert!(tokio::time::Instant::now() < deadline, "never unsubscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    two.tx.send(report_all("", &second)).await.unwrap();
    while metric_line(&reqwest_metrics(&s).await, subscribed) != 8 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never subscribed the rest"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(metric_line(&reqwest_metrics(&s).await, refused), 6);
    s.stop().await;
}

/// `method path` on the admin listener: status and JSON body.
async fn admin(s: &TestServer, method: &str, path: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(s.admin_addr())
        .await
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\
         authorization: Bearer quota-test-token\r\n\r\n"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).await.unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or_default())
}

/// `GET /buckets` of a bucket id shows the pool this replica holds for it; a reset empties the
/// pool (its member stays), and the next push takes from the fresh bucket again.
#[tokio::test]
async fn a_bucket_reset_empties_the_pool_and_the_next_push_takes_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "quota-test-token").unwrap();
    let s = TestServer::start_with(&[("mesh.yaml", CONFIG)], |settings| {
        settings.admin_write = true;
        settings.admin.admin_token_file = Some(token.clone());
    })
    .await;
    let tenant = [("tenant", "pool")];
    let mut dp = open(&s, "mesh", &tenant).await;
    next_action(&mut dp, &tenant).await;
    let path = "/buckets?domain=mesh&bucket=tenant%3Dpool";
    let (status, shown) = admin(&s, "GET", path).await;
    assert_eq!(status, 200, "{shown}");
    let key = &shown["keys"][0];
    assert_eq!(key["key"], "sluice:{mesh|tenant=pool}", "{shown}");
    assert_eq!(key["replica"]["rlqs_pool"]["members"], 1, "{shown}");
    assert!(key["replica"]["rlqs_pool"]["held_tokens"].as_f64().unwrap() > 0.0);
    assert!(
        key["remaining"].as_u64().unwrap() < 600,
        "the pool took: {shown}"
    );

    let (status, reset) = admin(&s, "DELETE", path).await;
    assert_eq!(status, 200, "{reset}");
    assert_eq!(reset["replica"]["rlqs_pools_emptied"], 1, "{reset}");
    assert_eq!(reset["reset"][0]["existed"], true, "{reset}");
    // The assignment stands; the next push pays for it from the fresh bucket.
    next_action(&mut dp, &tenant).await;
    next_action(&mut dp, &tenant).await;
    let (_, after) = admin(&s, "GET", path).await;
    let key = &after["keys"][0];
    assert_eq!(key["replica"]["rlqs_pool"]["members"], 1, "{after}");
    assert_eq!(key["stored"], true, "taken again: {after}");
    assert!(key["replica"]["rlqs_pool"]["held_tokens"].as_f64().unwrap() > 0.0);
    s.stop().await;
}
