//! The RLQS gRPC edge: `StreamRateLimitQuotas` reports in, assignments out. Converts and
//! validates; every decision is [`Quotas`]'.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::TokenBucket as PbTokenBucket;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{self, BlanketRule};
use envoy_types::pb::envoy::r#type::v3::RateLimitStrategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId as PbBucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use futures::Stream;
use tonic::{Code, Request, Response, Status, Streaming};

use super::outbox::log_end;
use super::{Action, BucketId, End, EndReason, Ignored, Next, Outbox, QuotaStats, Quotas, Usage};
use crate::backend::Backend;
use sluice_core::quota::Strategy;

/// Longest domain, bucket-id key or value accepted (as RLS bounds descriptor entries).
const MAX_TEXT_BYTES: usize = 1024;

/// The RLQS service over one replica's [`Quotas`].
pub struct QuotaHandler<B> {
    quotas: Arc<Quotas<B>>,
    max_message_bytes: usize,
}

impl<B: Backend> QuotaHandler<B> {
    pub fn new(quotas: Arc<Quotas<B>>) -> Self {
        QuotaHandler {
            quotas,
            max_message_bytes: usize::MAX,
        }
    }

    /// The tonic service, with requests bounded to `max_message_bytes`.
    pub fn into_server(mut self, max_message_bytes: usize) -> RateLimitQuotaServiceServer<Self> {
        self.max_message_bytes = max_message_bytes;
        RateLimitQuotaServiceServer::new(self).max_decoding_message_size(max_message_bytes)
    }
}

type Assignments = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend> RateLimitQuotaService for QuotaHandler<B> {
    type StreamRateLimitQuotasStream = Assignments;

    /// The first message names the domain and subscribes its buckets. The stream ends, always
    /// with a status saying why (see [`end_status`]), when the data plane half-closes (after its
    /// last report is answered), resets it, sends a report over the message bound or one that
    /// breaks the protocol, sends no first report in time, or the server stops.
    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Assignments>, Status> {
        let mut accepted = Accepted::new(self.quotas.stats().clone());
        let mut reports = request.into_inner();
        let timeout = self.quotas.options().first_report_timeout;
        let first = match first_report(&mut reports, timeout, self.max_message_bytes).await {
            Ok(first) => first,
            Err(end) => return Err(accepted.refuse(&end)),
        };
        let domain = first.domain.clone();
        if let Err(detail) = check_domain(&domain) {
            return Err(accepted.refuse(&End {
                reason: EndReason::InvalidReport,
                detail,
            }));
        }
        let (stream, outbox) = self.quotas.open(&domain);
        accepted.outbox = Some(outbox.clone());
        tokio::spawn(read_reports(
            self.quotas.clone(),
            Reader {
                stream,
                outbox,
                domain,
                max_message_bytes: self.max_message_bytes,
            },
            reports,
            first,
        ));
        let assignments = futures::stream::unfold(Some(accepted), |accepted| async move {
            let accepted = accepted?;
            let outbox = accepted.outbox.clone()?;
            match outbox.next().await {
                Next::Actions(actions) => Some((Ok(to_response(actions)), Some(accepted))),
                Next::End(end) => Some((Err(end_status(&end)), None)),
            }
        });
        Ok(Response::new(Box::pin(assignments)))
    }
}

/// One accepted stream: counted in `sluice_rlqs_streams_open` from the moment it is accepted
/// until its response ends; dropped without an end (the data plane went away, tonic dropped the
/// response), it ends the stream as cancelled.
struct Accepted {
    stats: Arc<QuotaStats>,
    outbox: Option<Arc<Outbox>>,
    refused: bool,
}

impl Accepted {
    fn new(stats: Arc<QuotaStats>) -> Self {
        stats.stream_opened();
        Accepted {
            stats,
            outbox: None,
            refused: false,
        }
    }

    /// Ends a stream before it opened: logged, counted, and the status the handler returns.
    fn refuse(&mut self, end: &End) -> Status {
        log_end(&self.stats, "", end.reason, &end.detail);
        self.refused = true;
        end_status(end)
    }
}

impl Drop for Accepted {
    fn drop(&mut self) {
        let detail = "the data plane went away";
        match &self.outbox {
            Some(outbox) => {
                outbox.end(EndReason::Cancelled, detail.into());
            }
            None if !self.refused => log_end(&self.stats, "", EndReason::Cancelled, detail),
            None => {}
        }
        self.stats.stream_closed();
    }
}

/// The status a stream ends with. Envoy's filter treats every end alike — it drops the stream,
/// keeps each bucket's assignment until it expires, and opens a new stream on its next report
/// tick (every 5 s) — and logs the status; the code and message are for the operator.
fn end_status(end: &End) -> Status {
    let code = match end.reason {
        EndReason::HalfClosed => Code::Ok,
        EndReason::Cancelled => Code::Cancelled,
        EndReason::TooLarge => Code::ResourceExhausted,
        EndReason::InvalidReport => Code::InvalidArgument,
        EndReason::NoFirstReport => Code::DeadlineExceeded,
        EndReason::Stopping => Code::Unavailable,
    };
    Status::new(code, end.detail.clone())
}

/// The first report, within `timeout`.
async fn first_report(
    reports: &mut Streaming<RateLimitQuotaUsageReports>,
    timeout: Duration,
    max_message_bytes: usize,
) -> Result<RateLimitQuotaUsageReports, End> {
    match tokio::time::timeout(timeout, reports.message()).await {
        Ok(Ok(Some(first))) => Ok(first),
        Ok(Ok(None)) => Err(End {
            reason: EndReason::InvalidReport,
            detail: "no usage report: the stream was empty".into(),
        }),
        Ok(Err(status)) => Err(read_error(&status, max_message_bytes)),
        Err(_) => Err(End {
            reason: EndReason::NoFirstReport,
            detail: format!("no usage report within --rlqs-first-report-timeout ({timeout:?})"),
        }),
    }
}

/// Why reading a report failed: tonic's decoder refuses a message over its bound with
/// OUT_OF_RANGE; anything else is the data plane's side of the stream going away.
fn read_error(status: &Status, max_message_bytes: usize) -> End {
    if status.code() == Code::OutOfRange {
        End {
            reason: EndReason::TooLarge,
            detail: format!(
                "a usage report is larger than --max-message-bytes ({max_message_bytes} bytes): {}",
                status.message()
            ),
        }
    } else {
        End {
            reason: EndReason::Cancelled,
            detail: format!("reading the reports failed: {status}"),
        }
    }
}

/// The first report's domain, as a stream's domain.
fn check_domain(domain: &str) -> Result<(), String> {
    if domain.is_empty() {
        return Err("domain: the first usage report must name the domain".into());
    }
    if domain.len() > MAX_TEXT_BYTES {
        return Err(format!("domain: longer than {MAX_TEXT_BYTES} bytes"));
    }
    Ok(())
}

/// What the report reader of one stream needs.
struct Reader {
    stream: u64,
    outbox: Arc<Outbox>,
    domain: String,
    max_message_bytes: usize,
}

/// Applies a stream's reports in order until it ends; a half-close waits for the push that
/// answers the last report. The stream is closed (its subscriptions leave) when reading stops.
async fn read_reports<B: Backend>(
    quotas: Arc<Quotas<B>>,
    reader: Reader,
    mut reports: Streaming<RateLimitQuotaUsageReports>,
    first: RateLimitQuotaUsageReports,
) {
    let Reader {
        stream,
        outbox,
        domain,
        max_message_bytes,
    } = reader;
    let mut next = Some(first);
    while let Some(message) = next.take() {
        if let Err(detail) = apply(&quotas, stream, &domain, &message) {
            outbox.end(EndReason::InvalidReport, detail);
            break;
        }
        // A data plane with messages queued would otherwise keep this worker: h2's stream is
        // always ready, and its reads do not count against tokio's budget.
        tokio::task::consume_budget().await;
        // Stop reading when the stream ends (the request body must be let go of for the call to
        // finish while the data plane keeps its side open).
        next = tokio::select! {
            message = reports.message() => match message {
                Ok(Some(message)) => Some(message),
                Ok(None) => {
                    quotas.half_close(stream);
                    outbox.ended().await;
                    None
                }
                Err(status) => {
                    let end = read_error(&status, max_message_bytes);
                    outbox.end(end.reason, end.detail);
                    None
                }
            },
            () = outbox.ended() => None,
        };
    }
    quotas.close(stream);
}

/// Applies one message of a stream: the domain must stay the one it opened with (empty is the
/// same: only the first message needs it); each bucket's usage goes to [`Quotas::report`], a
/// malformed bucket id is skipped and counted.
fn apply<B: Backend>(
    quotas: &Quotas<B>,
    stream: u64,
    domain: &str,
    message: &RateLimitQuotaUsageReports,
) -> Result<(), String> {
    if !message.domain.is_empty() && message.domain != domain {
        return Err(format!(
            "domain: this stream is for {domain:?}, a report named {:?}; open a new stream for \
             another domain",
            message.domain
        ));
    }
    let max_entries = quotas.options().max_bucket_entries;
    let mut usages = Vec::with_capacity(message.bucket_quota_usages.len());
    for usage in &message.bucket_quota_usages {
        match usage
            .bucket_id
            .as_ref()
            .and_then(|id| bucket_id(id, max_entries))
        {
            Some(bucket) => usages.push(Usage {
                bucket,
                allowed: usage.num_requests_allowed,
                denied: usage.num_requests_denied,
            }),
            None => quotas.stats().count_ignored(Ignored::InvalidBucket),
        }
    }
    quotas.report_all(stream, usages);
    Ok(())
}

/// A bucket id as sluice keys it, or `None` when it is empty, has more than `max_entries`
/// entries, or an empty or oversized key or value.
fn bucket_id(id: &PbBucketId, max_entries: usize) -> Option<BucketId> {
    let ok = |s: &String| !s.is_empty() && s.len() <= MAX_TEXT_BYTES;
    if id.bucket.is_empty()
        || id.bucket.len() > max_entries
        || !id.bucket.iter().all(|(k, v)| ok(k) && ok(v))
    {
        return None;
    }
    let sorted: BTreeMap<String, String> = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Some(Arc::new(sorted))
}

fn to_response(actions: Vec<Action>) -> RateLimitQuotaResponse {
    RateLimitQuotaResponse {
        bucket_action: actions.into_iter().map(to_bucket_action).collect(),
    }
}

fn to_bucket_action(action: Action) -> BucketAction {
    let (bucket, kind) = match action {
        Action::Assign {
            bucket,
            strategy,
            ttl,
        } => (
            bucket,
            bucket_action::BucketAction::QuotaAssignmentAction(QuotaAssignmentAction {
                assignment_time_to_live: Some(to_duration(ttl)),
                rate_limit_strategy: Some(to_strategy(strategy)),
            }),
        ),
        Action::Abandon { bucket } => (
            bucket,
            bucket_action::BucketAction::AbandonAction(AbandonAction {}),
        ),
    };
    BucketAction {
        bucket_id: Some(PbBucketId {
            bucket: bucket.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }),
        bucket_action: Some(kind),
    }
}

fn to_strategy(strategy: Strategy) -> RateLimitStrategy {
    let strategy = match strategy {
        Strategy::AllowAll => {
            rate_limit_strategy::Strategy::BlanketRule(BlanketRule::AllowAll as i32)
        }
        Strategy::DenyAll => {
            rate_limit_strategy::Strategy::BlanketRule(BlanketRule::DenyAll as i32)
        }
        Strategy::TokenBucket(b) => rate_limit_strategy::Strategy::TokenBucket(PbTokenBucket {
            max_tokens: b.max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: b.tokens_per_fill,
            }),
            // Envoy's filter compares token buckets by max_tokens, tokens_per_fill and
            // fill_interval's nanos only, keeping the old bucket when they match, and computes the
            // rate from the whole seconds. The nanos repeat the seconds (at most 86,400 ns, under
            // a tenth of a millisecond) so intervals of different seconds are different to it.
            fill_interval: Some(PbDuration {
                seconds: i64::from(b.fill_interval_s),
                nanos: i32::try_from(b.fill_interval_s).unwrap_or(0),
            }),
        }),
    };
    RateLimitStrategy {
        strategy: Some(strategy),
    }
}

fn to_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
