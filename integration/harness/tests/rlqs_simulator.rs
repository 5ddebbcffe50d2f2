//! The RLQS data-plane simulator against a scripted in-test RLQS server (no sluice): the test
//! plays the server, pushes bucket actions and reads every report the simulator sends.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as ActionPb, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as DurationPb;
use sluice_harness::rlqs::{
    AssignmentKind, BucketId, DataPlane, ExpiredBehavior, Settings, Strategy, TokenBucketSpec,
    bucket, to_proto_id,
};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

const DOMAIN: &str = "edge";
/// How long any one step of the script may take on a loaded machine.
const STEP: Duration = Duration::from_secs(10);
/// Refills one token an hour: over a test's seconds a token bucket only drains.
const HOUR: Duration = Duration::from_secs(3600);

/// Feeds one stream's responses; None ends the stream.
type Responder = mpsc::UnboundedSender<Option<Result<RateLimitQuotaResponse, Status>>>;

enum Event {
    Opened(Responder),
    Report(RateLimitQuotaUsageReports),
    /// The data plane's half of the stream ended: cleanly (half-close) or not (reset).
    Ended {
        clean: bool,
    },
}

struct Script {
    events: mpsc::UnboundedSender<Event>,
}

#[tonic::async_trait]
impl RateLimitQuotaService for Script {
    type StreamRateLimitQuotasStream =
        Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Self::StreamRateLimitQuotasStream>, Status> {
        let (responder, responses) = mpsc::unbounded_channel();
        let _ = self.events.send(Event::Opened(responder.clone()));
        let events = self.events.clone();
        let mut inbound = request.into_inner();
        tokio::spawn(async move {
            let clean = loop {
                match inbound.message().await {
                    Ok(Some(report)) => {
                        let _ = events.send(Event::Report(report));
                    }
                    Ok(None) => break true,
                    Err(_) => break false,
                }
            };
            let _ = events.send(Event::Ended { clean });
            // A real server ends its half once the data plane has ended its own.
            if clean {
                let _ = responder.send(None);
            }
        });
        let responses = UnboundedReceiverStream::new(responses).map_while(|response| response);
        Ok(Response::new(Box::pin(responses)))
    }
}

/// The scripted server and what it has seen.
struct Fake {
    addr: SocketAddr,
    events: mpsc::UnboundedReceiver<Event>,
    responder: Option<Responder>,
    streams: usize,
    ends: Vec<bool>,
    _stop: oneshot::Sender<()>,
}

impl Fake {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (events_tx, events) = mpsc::unbounded_channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let service = RateLimitQuotaServiceServer::new(Script { events: events_tx });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                    let _ = stopped.await;
                }),
        );
        Self {
            addr,
            events,
            responder: None,
            streams: 0,
            ends: Vec::new(),
            _stop: stop,
        }
    }

    /// Handles one event; None when it was not a report.
    async fn next_event(&mut self) -> Option<RateLimitQuotaUsageReports> {
        let event = tokio::time::timeout(STEP, self.events.recv())
            .await
            .expect("the data plane went silent")
            .expect("the server stopped");
        match event {
            Event::Opened(responder) => {
                self.streams += 1;
                self.responder = Some(responder);
                None
            }
            Event::Report(report) => Some(report),
            Event::Ended { clean } => {
                self.ends.push(clean);
                None
            }
        }
    }

    async fn next_report(&mut self) -> RateLimitQuotaUsageReports {
        loop {
            if let Some(report) = self.next_event().await {
                return report;
            }
        }
    }

    async fn next_end(&mut self) -> bool {
        let seen = self.ends.len();
        while self.ends.len() == seen {
            self.next_event().await;
        }
        self.ends[seen]
    }

    fn push(&self, actions: Vec<BucketAction>) {
        self.responder
            .as_ref()
            .expect("a stream is open")
            .send(Some(Ok(RateLimitQuotaResponse {
                bucket_action: actions,
            })))
            .expect("the stream is open");
    }

    /// Breaks the current stream with an error status, as a failing server would.
    fn fail_stream(&mut self) {
        let responder = self.responder.take().expect("a stream is open");
        let _ = responder.send(Some(Err(Status::unavailable("scripted failure"))));
    }
}

fn settings(no_assignment: Strategy, expired: ExpiredBehavior) -> Settings {
    Settings {
        reporting_interval: Duration::from_millis(200),
        no_assignment,
        expired,
    }
}

fn token_bucket(max_tokens: u32, tokens_per_fill: u32, fill_interval: Duration) -> Strategy {
    Strategy::TokenBucket(TokenBucketSpec {
        max_tokens,
        tokens_per_fill,
        fill_interval,
    })
}

fn assign(id: &BucketId, strategy: Strategy, ttl: Option<Duration>) -> BucketAction {
    BucketAction {
        bucket_id: Some(to_proto_id(id)),
        bucket_action: Some(ActionPb::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: ttl.map(|ttl| DurationPb {
                seconds: ttl.as_secs() as i64,
                nanos: ttl.subsec_nanos() as i32,
            }),
            rate_limit_strategy: Some(strategy.to_proto()),
        })),
    }
}

fn abandon(id: &BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(to_proto_id(id)),
        bucket_action: Some(ActionPb::AbandonAction(AbandonAction {})),
    }
}

fn kind(strategy: Strategy) -> AssignmentKind {
    match strategy {
        Strategy::AllowAll => AssignmentKind::AllowAll,
        Strategy::DenyAll => AssignmentKind::DenyAll,
        Strategy::TokenBucket(spec) => AssignmentKind::TokenBucket(spec),
    }
}

/// Each usage of a report as (bucket id, allowed, denied).
fn usages(report: &RateLimitQuotaUsageReports) -> Vec<(BucketId, u64, u64)> {
    report
        .bucket_quota_usages
        .iter()
        .map(|usage| {
            let id = usage
                .bucket_id
                .clone()
                .unwrap()
                .bucket
                .into_iter()
                .collect();
            (id, usage.num_requests_allowed, usage.num_requests_denied)
        })
        .collect()
}

/// Requests `n` times; how many were allowed.
fn allowed_of(plane: &DataPlane, id: &BucketId, n: usize) -> usize {
    (0..n).filter(|_| plane.try_request(id)).count()
}

/// Reported totals per bucket, summed over every report read.
#[derive(Default)]
struct Ledger {
    totals: BTreeMap<BucketId, (u64, u64)>,
}

impl Ledger {
    fn add(&mut self, report: &RateLimitQuotaUsageReports) {
        for (id, allowed, denied) in usages(report) {
            let total = self.totals.entry(id).or_default();
            total.0 += allowed;
            total.1 += denied;
        }
    }

    /// Reads reports until the data plane's decisions for `id` are all reported.
    async fn catch_up(&mut self, fake: &mut Fake, plane: &DataPlane, id: &BucketId) {
        loop {
            let stats = plane.stats(id);
            let reported = self.totals.get(id).copied().unwrap_or_default();
            assert!(
                reported.0 <= stats.admitted && reported.1 <= stats.denied,
                "reported more than decided for {id:?}: {reported:?} vs {stats:?}"
            );
            if reported == (stats.admitted, stats.denied) {
                return;
            }
            let report = fake.next_report().await;
            self.add(&report);
        }
    }
}

async fn wait_for_kind(plane: &DataPlane, id: &BucketId, want: Option<AssignmentKind>) {
    plane
        .wait_until(&format!("{id:?} to be {want:?}"), STEP, |plane| {
            plane.assignment(id) == want
        })
        .await;
}

/// Subscription, periodic reports, token buckets kept or replaced, expiry with a fallback, a
/// new assignment after expiry, and abandon with re-subscription.
#[tokio::test]
async fn follows_envoys_assignment_rules() {
    let mut fake = Fake::start().await;
    let plane = DataPlane::connect(
        fake.addr,
        DOMAIN,
        settings(
            Strategy::AllowAll,
            ExpiredBehavior::Fallback(Strategy::DenyAll),
        ),
    );
    let tenant = bucket(&[("name", "tenant"), ("tenant", "acme")]);
    let catch_all = bucket(&[("name", "default")]);
    let mut ledger = Ledger::default();

    // Subscription: the first request is decided by no_assignment (allow all) and reported at
    // once, alone, on a new stream that names the domain.
    assert_eq!(plane.assignment(&tenant), None);
    assert!(plane.try_request(&tenant));
    assert_eq!(
        plane.assignment(&tenant),
        Some(AssignmentKind::NoAssignment)
    );
    let first = fake.next_report().await;
    assert_eq!(first.domain, DOMAIN);
    assert_eq!(usages(&first), vec![(tenant.clone(), 1, 0)]);
    assert_eq!(first.bucket_quota_usages[0].time_elapsed.unwrap().nanos, 0);
    ledger.add(&first);

    // A second bucket; then a periodic report carries both, without the domain.
    assert!(plane.try_request(&catch_all));
    loop {
        let report = fake.next_report().await;
        ledger.add(&report);
        assert_eq!(
            report.domain, "",
            "only a stream's first message names the domain"
        );
        let ids: Vec<BucketId> = usages(&report).into_iter().map(|(id, ..)| id).collect();
        if ids.len() == 2 {
            assert_eq!(ids, vec![catch_all.clone(), tenant.clone()]);
            break;
        }
    }

    // A token bucket starts full.
    let five = token_bucket(5, 1, HOUR);
    fake.push(vec![assign(&tenant, five, None)]);
    wait_for_kind(&plane, &tenant, Some(kind(five))).await;
    assert_eq!(allowed_of(&plane, &tenant, 3), 3);

    // The identical bucket again: the 2 remaining tokens carry over.
    fake.push(vec![assign(&tenant, five, None)]);
    plane
        .wait_until("the second assignment", STEP, |plane| {
            plane.stats(&tenant).assignments == 2
        })
        .await;
    assert_eq!(allowed_of(&plane, &tenant, 5), 2);

    // A different bucket starts full again.
    let four = token_bucket(4, 1, HOUR);
    fake.push(vec![assign(&tenant, four, None)]);
    wait_for_kind(&plane, &tenant, Some(kind(four))).await;
    assert_eq!(allowed_of(&plane, &tenant, 6), 4);

    // An assignment with a time to live; after it the expired fallback (deny all) decides.
    fake.push(vec![assign(
        &tenant,
        Strategy::AllowAll,
        Some(Duration::from_secs(2)),
    )]);
    wait_for_kind(&plane, &tenant, Some(AssignmentKind::AllowAll)).await;
    assert!(plane.try_request(&tenant));
    wait_for_kind(&plane, &tenant, Some(AssignmentKind::Expired)).await;
    assert_eq!(allowed_of(&plane, &tenant, 3), 0);
    // Unrelated buckets keep their own state.
    assert!(plane.try_request(&catch_all));

    // A new assignment ends the expired state.
    fake.push(vec![assign(&tenant, Strategy::AllowAll, None)]);
    wait_for_kind(&plane, &tenant, Some(AssignmentKind::AllowAll)).await;
    assert_eq!(allowed_of(&plane, &tenant, 3), 3);

    // Every decision so far reaches the server exactly once.
    ledger.catch_up(&mut fake, &plane, &tenant).await;
    ledger.catch_up(&mut fake, &plane, &catch_all).await;
    let before = plane.stats(&tenant);
    println!(
        "tenant before abandon: admitted {} denied {} assignments {}",
        before.admitted, before.denied, before.assignments
    );

    // Abandon erases the bucket; the next request starts over and subscribes again.
    fake.push(vec![abandon(&tenant)]);
    wait_for_kind(&plane, &tenant, None).await;
    assert_eq!(plane.counters().abandons, 1);
    assert_eq!(plane.tracked(), vec![catch_all.clone()]);
    assert!(plane.try_request(&tenant));
    assert_eq!(
        plane.assignment(&tenant),
        Some(AssignmentKind::NoAssignment)
    );
    let after = plane.stats(&tenant);
    assert_eq!((after.subscriptions, after.abandons), (2, 1));
    loop {
        let report = fake.next_report().await;
        ledger.add(&report);
        let counted: Vec<_> = usages(&report)
            .into_iter()
            .filter(|(id, allowed, denied)| *id == tenant && allowed + denied > 0)
            .collect();
        if !counted.is_empty() {
            assert_eq!(counted, vec![(tenant.clone(), 1, 0)]);
            break;
        }
    }
    ledger.catch_up(&mut fake, &plane, &tenant).await;

    // Actions for buckets the data plane does not track are ignored.
    let stranger = bucket(&[("name", "nobody")]);
    fake.push(vec![assign(&stranger, Strategy::DenyAll, None)]);
    plane
        .wait_until("the stranger's assignment to be ignored", STEP, |plane| {
            plane.counters().ignored_actions == 1
        })
        .await;
    assert_eq!(plane.assignment(&stranger), None);

    let counters = plane.counters();
    println!("counters: {counters:?}");
    assert_eq!(counters.assignments, 5);
    assert_eq!(counters.streams_opened, 1);
    plane.close().await;
    assert!(fake.next_end().await, "close ends the stream cleanly");
}

/// reuse_last_assignment keeps enforcing the expired token bucket, tokens included, and the
/// identical assignment afterwards keeps them too. no_assignment: deny all.
#[tokio::test]
async fn reuse_last_assignment_keeps_the_tokens() {
    let mut fake = Fake::start().await;
    let plane = DataPlane::connect(
        fake.addr,
        DOMAIN,
        settings(Strategy::DenyAll, ExpiredBehavior::ReuseLastAssignment),
    );
    let id = bucket(&[("name", "tenant"), ("tenant", "globex")]);

    assert!(!plane.try_request(&id));
    let first = fake.next_report().await;
    assert_eq!(usages(&first), vec![(id.clone(), 0, 1)]);

    let three = token_bucket(3, 1, HOUR);
    fake.push(vec![assign(&id, three, Some(Duration::from_secs(1)))]);
    plane
        .wait_until("the assignment", STEP, |plane| {
            plane.stats(&id).assignments == 1
        })
        .await;
    // Expired or not, the same bucket decides.
    assert_eq!(allowed_of(&plane, &id, 2), 2);
    wait_for_kind(&plane, &id, Some(AssignmentKind::Expired)).await;
    assert_eq!(allowed_of(&plane, &id, 2), 1);

    fake.push(vec![assign(&id, three, None)]);
    wait_for_kind(&plane, &id, Some(kind(three))).await;
    assert_eq!(allowed_of(&plane, &id, 2), 0, "the empty bucket was kept");
    plane.close().await;
}

/// A broken stream: the assignment keeps being enforced, and the next report opens a new
/// stream that names the domain again. A crash resets the stream instead of ending it.
#[tokio::test]
async fn stream_failure_keeps_enforcing_and_reconnects() {
    let mut fake = Fake::start().await;
    let plane = DataPlane::connect(
        fake.addr,
        DOMAIN,
        settings(
            Strategy::AllowAll,
            ExpiredBehavior::Fallback(Strategy::AllowAll),
        ),
    );
    let id = bucket(&[("name", "tenant"), ("tenant", "initech")]);
    assert!(plane.try_request(&id));
    fake.next_report().await;
    fake.push(vec![assign(&id, Strategy::DenyAll, None)]);
    wait_for_kind(&plane, &id, Some(AssignmentKind::DenyAll)).await;

    fake.fail_stream();
    plane
        .wait_until("the stream failure", STEP, |plane| {
            plane.counters().stream_failures >= 1
        })
        .await;
    assert!(!plane.try_request(&id), "deny all outlives the stream");
    let reopened = loop {
        let report = fake.next_report().await;
        if fake.streams == 2 {
            break report;
        }
    };
    assert_eq!(reopened.domain, DOMAIN);
    // The server may read the report before the data plane has the response headers.
    plane
        .wait_until("the second stream", STEP, |plane| {
            plane.counters().streams_opened == 2
        })
        .await;
    assert_eq!(plane.assignment(&id), Some(AssignmentKind::DenyAll));

    plane.crash();
    // The first stream ended with the scripted failure; the second is reset by the crash.
    loop {
        let clean = fake.next_end().await;
        if fake.ends.len() == 2 {
            assert!(!clean, "a crash does not end the stream cleanly");
            break;
        }
    }
}

/// The load helper and the window counts, on paused time against no server: the no-assignment
/// token bucket (capacity 10, 5 per second) admits 10 + 5·T over T seconds and never more than
/// 10 + 5 within any second.
#[tokio::test(start_paused = true)]
async fn offer_paces_requests_and_windows_count_them() {
    let nowhere: SocketAddr = ([127, 0, 0, 1], sluice_harness::free_port(false)).into();
    let plane = DataPlane::connect(
        nowhere,
        DOMAIN,
        settings(
            token_bucket(10, 5, Duration::from_secs(1)),
            ExpiredBehavior::ReuseLastAssignment,
        ),
    );
    let id = bucket(&[("name", "default")]);
    let start = tokio::time::Instant::now();
    let load = plane.offer(&id, 100.0, Duration::from_secs(10)).await;
    let stats = plane.stats(&id);
    let window = stats.max_admitted_within(Duration::from_secs(1));
    println!("load {load:?}, most admitted within 1 s: {window}");
    assert_eq!(load.offered, 1000);
    assert_eq!(load.admitted + load.denied, load.offered);
    assert_eq!((stats.admitted, stats.denied), (load.admitted, load.denied));
    assert!(
        (59..=61).contains(&load.admitted),
        "10 + 5/s × 10 s, got {}",
        load.admitted
    );
    assert!(window <= 10 + 5 + 1, "{window} within one second");
    assert_eq!(
        plane.admitted_between(&id, start, start + Duration::from_secs(11)),
        load.admitted
    );
    assert_eq!(plane.counters().streams_opened, 0);
}
