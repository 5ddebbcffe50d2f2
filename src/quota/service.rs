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
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::{Action, BucketId, Ignored, Quotas, Usage};
use crate::backend::Backend;
use sluice_core::quota::Strategy;

/// Longest domain, bucket-id key or value accepted (as RLS bounds descriptor entries).
const MAX_TEXT_BYTES: usize = 1024;

/// The RLQS service over one replica's [`Quotas`].
pub struct QuotaHandler<B> {
    quotas: Arc<Quotas<B>>,
}

impl<B: Backend> QuotaHandler<B> {
    pub fn new(quotas: Arc<Quotas<B>>) -> Self {
        QuotaHandler { quotas }
    }

    /// The tonic service, with requests bounded to `max_message_bytes`.
    pub fn into_server(self, max_message_bytes: usize) -> RateLimitQuotaServiceServer<Self> {
        RateLimitQuotaServiceServer::new(self).max_decoding_message_size(max_message_bytes)
    }
}

type Assignments = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend> RateLimitQuotaService for QuotaHandler<B> {
    type StreamRateLimitQuotasStream = Assignments;

    /// The first message names the domain and subscribes its buckets; the stream ends when the
    /// data plane closes it, or with INVALID_ARGUMENT when a later message names another domain
    /// (a stream is one domain, as the protocol says: open a new one to change it).
    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Assignments>, Status> {
        let mut reports = request.into_inner();
        let first = match reports.message().await? {
            Some(first) => first,
            None => {
                return Err(Status::invalid_argument(
                    "no usage report: the stream was empty",
                ));
            }
        };
        let domain = first.domain.clone();
        if domain.is_empty() {
            return Err(Status::invalid_argument(
                "domain: the first usage report must name the domain",
            ));
        }
        if domain.len() > MAX_TEXT_BYTES {
            return Err(Status::invalid_argument(format!(
                "domain: longer than {MAX_TEXT_BYTES} bytes"
            )));
        }
        let quotas = self.quotas.clone();
        let (stream, mut inbox) = quotas.open(&domain);
        let (out, assignments) = tokio::sync::mpsc::channel(4);
        let (failed, mut failure) = tokio::sync::oneshot::channel::<Status>();
        // Assignments, until the stream is closed (its outbox dropped: the data plane ended it,
        // or the server is stopping), the data plane stops listening, or a report broke the
        // protocol (then that error ends the stream).
        let (ended, mut end) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ended = ended;
            loop {
                tokio::select! {
                    actions = inbox.recv() => {
                        let Some(actions) = actions else {
                            // Closed after a protocol error: that error is the last word.
                            if let Ok(status) = failure.try_recv() {
                                let _ = out.send(Err(status)).await;
                            }
                            break;
                        };
                        if out.send(Ok(to_response(actions))).await.is_err() {
                            break;
                        }
                    }
                    status = &mut failure => {
                        if let Ok(status) = status {
                            let _ = out.send(Err(status)).await;
                        }
                        break;
                    }
                }
            }
        });
        // Reports, applied in order.
        tokio::spawn(async move {
            let mut next = Some(first);
            let mut failed = Some(failed);
            while let Some(message) = next.take() {
                if let Err(status) = apply(&quotas, stream, &domain, &message) {
                    if let Some(failed) = failed.take() {
                        let _ = failed.send(status);
                    }
                    break;
                }
                // A data plane with messages queued would otherwise keep this worker: h2's
                // stream is always ready, and its reads do not count against tokio's budget.
                tokio::task::consume_budget().await;
                // Stop reading when the assignments end (the request body must be let go of
                // for the call to finish while the data plane keeps its side open).
                next = tokio::select! {
                    message = reports.message() => message.ok().flatten(),
                    _ = &mut end => None,
                };
            }
            quotas.close(stream);
        });
        let assignments = ReceiverStream::new(assignments);
        Ok(Response::new(Box::pin(assignments)))
    }
}

/// Applies one message of a stream: the domain must stay the one it opened with (empty is the
/// same: only the first message needs it); each bucket's usage goes to [`Quotas::report`], a
/// malformed bucket id is skipped and counted.
fn apply<B: Backend>(
    quotas: &Quotas<B>,
    stream: u64,
    domain: &str,
    message: &RateLimitQuotaUsageReports,
) -> Result<(), Status> {
    if !message.domain.is_empty() && message.domain != domain {
        return Err(Status::invalid_argument(format!(
            "domain: this stream is for {domain:?}, a report named {:?}; open a new stream for \
             another domain",
            message.domain
        )));
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
                assignment_time_to_live: ttl.map(to_duration),
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
