//! The gRPC entry point: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
//!
//! One call takes these hops, in this order:
//!
//! 1. Transport ([`crate::server`]): the HTTP/2 limits, TLS, the
//!    [`crate::security::tls::AuthorizeLayer`] (a client outside `--tls-allowed-sans` gets
//!    PERMISSION_DENIED) and tonic's message ceiling (OUT_OF_RANGE before any decoding).
//! 2. [`RateLimitServer`] (here): routes the one method and decodes its bytes with
//!    [`wire::StrictCodec`] (INVALID_ARGUMENT naming a string field that is not UTF-8, or saying
//!    why the bytes are no `RateLimitRequest`).
//! 3. [`RateLimitHandler`]'s `should_rate_limit` (here): [`to_limit_request`] checks the size
//!    bounds, applies the [`CallerPolicy`] and validates each field into a [`LimitRequest`]
//!    (INVALID_ARGUMENT naming the field); [`Limiter::decide`] decides; [`to_response`] converts
//!    the [`Decision`] to Envoy's response with rate-limit headers. Metrics and the trace span
//!    record the outcome.
//!
//! No decisions are made here; this module only translates.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry as PbEntry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, SERVICE_NAME,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use prost::Message;
use tonic::codegen::{BoxFuture, StdError};
use tonic::{Request, Response, Status as GrpcStatus};
use tracing::Instrument as _;

use crate::advertised::{Advertised, advertise};
use crate::backend::{Backend, BackendError};
use crate::dynamic_metadata;
use crate::limiter::{AppliedLimit, Code, Decision, LimitError, Limiter, Status};
use crate::request::{Entry, LimitOverride, LimitRequest, RequestDescriptor};
use crate::rule::Unit;
use crate::security::CallerPolicy;
use crate::security::wire::{self, SHOULD_RATE_LIMIT_PATH};
use crate::settings::{ResponseHeaders, Settings};
use crate::telemetry::{Metrics, Outcome, traces};

/// Size bounds on incoming requests; anything larger is `INVALID_ARGUMENT`.
#[derive(Clone, Debug)]
pub struct RequestBounds {
    pub max_message_bytes: usize,
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    /// Largest `hits_addend` honoured, request- or descriptor-level (`--max-hits-addend`); a
    /// larger one counts as this.
    pub max_hits_addend: u64,
    /// What untrusted callers may not decide (applied before validation).
    pub policy: CallerPolicy,
}

impl From<&Settings> for RequestBounds {
    fn from(settings: &Settings) -> Self {
        RequestBounds {
            max_message_bytes: settings.max_message_bytes,
            max_descriptors: settings.max_descriptors,
            max_entries: settings.max_entries,
            max_key_bytes: settings.max_key_bytes,
            max_value_bytes: settings.max_value_bytes,
            max_hits_addend: settings.security.callers.max_hits_addend,
            policy: CallerPolicy::from(&settings.security.callers),
        }
    }
}

impl Default for RequestBounds {
    /// Every bound at its flag's default; callers trusted.
    fn default() -> Self {
        RequestBounds::from(&Settings::defaults())
    }
}

/// Which rate-limit headers to add to the response, and their names.
#[derive(Clone, Debug)]
pub struct HeaderOptions {
    pub mode: ResponseHeaders,
    pub limit: String,
    pub remaining: String,
    pub reset: String,
    pub retry_after: String,
    /// Names the failure policies that decided a degraded response (`local`, `open, closed`);
    /// empty: never sent.
    pub degraded: String,
    /// `--response-dynamic-metadata`: fill `dynamic_metadata` ([`crate::dynamic_metadata`]).
    pub dynamic_metadata: bool,
}

impl From<&Settings> for HeaderOptions {
    fn from(settings: &Settings) -> Self {
        HeaderOptions {
            mode: settings.response_headers,
            limit: settings.header_limit.clone(),
            remaining: settings.header_remaining.clone(),
            reset: settings.header_reset.clone(),
            retry_after: settings.header_retry_after.clone(),
            degraded: settings.header_degraded.clone(),
            dynamic_metadata: settings.response_dynamic_metadata,
        }
    }
}

impl Default for HeaderOptions {
    /// Headers on, every name at its flag's default.
    fn default() -> Self {
        HeaderOptions::from(&Settings::defaults())
    }
}

/// Answers `ShouldRateLimit`: decode, decide, encode.
pub struct RateLimitHandler<B> {
    limiter: Arc<Limiter<B>>,
    bounds: RequestBounds,
    headers: HeaderOptions,
    metrics: Metrics,
}

impl<B> RateLimitHandler<B> {
    pub fn new(limiter: Arc<Limiter<B>>, bounds: RequestBounds, headers: HeaderOptions) -> Self {
        RateLimitHandler {
            limiter,
            bounds,
            headers,
            metrics: Metrics::off(),
        }
    }

    /// Counts every call into `metrics` (off by default).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }
}

#[tonic::async_trait]
impl<B: Backend> RateLimitService for RateLimitHandler<B> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, GrpcStatus> {
        let span = traces::rpc_span();
        let response = if span.is_disabled() {
            self.answer(request.into_inner(), &span).await
        } else {
            traces::adopt_remote_parent(&span, request.metadata());
            self.answer(request.into_inner(), &span)
                .instrument(span.clone())
                .await
        };
        response.map(Response::new)
    }
}

impl<B: Backend> RateLimitHandler<B> {
    /// Decode, decide, encode; metrics and the span record the outcome.
    async fn answer(
        &self,
        request: RateLimitRequest,
        span: &tracing::Span,
    ) -> Result<RateLimitResponse, GrpcStatus> {
        let started = self.metrics.start();
        let request = match to_limit_request(request, &self.bounds) {
            Ok(request) => request,
            Err(status) => return Err(self.failed(started, span, status)),
        };
        traces::record_request(span, &request);
        match self.limiter.decide(&request).await {
            Ok(decision) => {
                let mut response = to_response(&decision, &self.headers);
                if self.headers.dynamic_metadata {
                    response.dynamic_metadata = Some(dynamic_metadata::build(&request, &decision));
                }
                self.metrics.record_decision(started, &request, &decision);
                traces::record_decision(span, &decision);
                Ok(response)
            }
            Err(error) => Err(self.failed(started, span, to_grpc_status(error))),
        }
    }

    fn failed(
        &self,
        started: Option<crate::clock::Stopwatch>,
        span: &tracing::Span,
        status: GrpcStatus,
    ) -> GrpcStatus {
        self.metrics
            .record_error(started, Outcome::of_status(&status));
        traces::record_error(span, &status);
        status
    }
}

/// `envoy.service.ratelimit.v3.RateLimitService` as a tower service: the generated
/// `RateLimitServiceServer` with [`wire::StrictCodec`] in place of tonic's prost codec, whose
/// decode failures are INTERNAL (blaming the server for the caller's bytes).
#[derive(Debug)]
pub struct RateLimitServer<T> {
    inner: Arc<T>,
    /// `--max-message-bytes`, held by the codec against the encoded request.
    max_request_bytes: usize,
    max_decoding_message_size: Option<usize>,
    max_encoding_message_size: Option<usize>,
}

impl<T> RateLimitServer<T> {
    pub fn new(inner: T) -> Self {
        Self::from_arc(Arc::new(inner))
    }

    pub fn from_arc(inner: Arc<T>) -> Self {
        RateLimitServer {
            inner,
            max_request_bytes: usize::MAX,
            max_decoding_message_size: None,
            max_encoding_message_size: None,
        }
    }

    /// Largest encoded request decoded (unknown fields included); a larger one is
    /// INVALID_ARGUMENT (`message: N bytes exceed the limit of M`). Default: no bound beyond
    /// tonic's.
    #[must_use]
    pub fn max_request_bytes(mut self, limit: usize) -> Self {
        self.max_request_bytes = limit;
        self
    }

    /// Largest request tonic buffers (larger ones get OUT_OF_RANGE before decoding); default 4 MiB.
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }

    #[must_use]
    pub fn max_encoding_message_size(mut self, limit: usize) -> Self {
        self.max_encoding_message_size = Some(limit);
        self
    }
}

impl<T> Clone for RateLimitServer<T> {
    fn clone(&self) -> Self {
        RateLimitServer {
            inner: Arc::clone(&self.inner),
            max_request_bytes: self.max_request_bytes,
            max_decoding_message_size: self.max_decoding_message_size,
            max_encoding_message_size: self.max_encoding_message_size,
        }
    }
}

impl<T> tonic::server::NamedService for RateLimitServer<T> {
    const NAME: &'static str = SERVICE_NAME;
}

/// The one method, as tonic's unary-call adapter wants it.
struct ShouldRateLimit<T>(Arc<T>);

impl<T: RateLimitService> tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit<T> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, GrpcStatus>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.should_rate_limit(request).await })
    }
}

impl<T, B> tower_service::Service<http::Request<B>> for RateLimitServer<T>
where
    T: RateLimitService,
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT_PATH {
            return Box::pin(async {
                Ok(GrpcStatus::unimplemented("unknown method of RateLimitService").into_http())
            });
        }
        let method = ShouldRateLimit(Arc::clone(&self.inner));
        let codec = wire::StrictCodec {
            max_message_bytes: self.max_request_bytes,
        };
        let (max_decoding, max_encoding) = (
            self.max_decoding_message_size,
            self.max_encoding_message_size,
        );
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(codec)
                .apply_max_message_size_config(max_decoding, max_encoding);
            Ok(grpc.unary(method, request).await)
        })
    }
}

/// Validates a protobuf request and converts it: the size bound, the caller policy, then each
/// field. Every error is INVALID_ARGUMENT naming the offending field.
pub fn to_limit_request(
    mut request: RateLimitRequest,
    bounds: &RequestBounds,
) -> Result<LimitRequest, GrpcStatus> {
    check_message_size(&request, bounds)?;
    bounds.policy.apply(&mut request);
    if request.domain.is_empty() {
        return Err(invalid("domain: must not be empty".into()));
    }
    check_descriptor_count(request.descriptors.len(), bounds)?;
    let mut descriptors = Vec::with_capacity(request.descriptors.len());
    for (i, d) in request.descriptors.into_iter().enumerate() {
        descriptors.push(to_descriptor(i, d, bounds)?);
    }
    Ok(LimitRequest {
        domain: request.domain,
        descriptors,
        hits_addend: u64::from(request.hits_addend).min(bounds.max_hits_addend),
    })
}

fn check_message_size(
    request: &RateLimitRequest,
    bounds: &RequestBounds,
) -> Result<(), GrpcStatus> {
    wire::check_encoded_len(request.encoded_len(), bounds.max_message_bytes)
}

fn check_descriptor_count(count: usize, bounds: &RequestBounds) -> Result<(), GrpcStatus> {
    if count == 0 {
        return Err(invalid(
            "descriptors: at least one descriptor is required".into(),
        ));
    }
    if count > bounds.max_descriptors {
        return Err(invalid(format!(
            "descriptors: {count} descriptors exceed the limit of {}",
            bounds.max_descriptors
        )));
    }
    Ok(())
}

/// `descriptors[i]`: its entries, its `limit` override and its hits.
fn to_descriptor(
    i: usize,
    d: RateLimitDescriptor,
    bounds: &RequestBounds,
) -> Result<RequestDescriptor, GrpcStatus> {
    if d.entries.is_empty() {
        return Err(invalid(format!(
            "descriptors[{i}].entries: at least one entry is required"
        )));
    }
    if d.entries.len() > bounds.max_entries {
        return Err(invalid(format!(
            "descriptors[{i}].entries: {} entries exceed the limit of {}",
            d.entries.len(),
            bounds.max_entries
        )));
    }
    let mut entries = Vec::with_capacity(d.entries.len());
    for (j, e) in d.entries.into_iter().enumerate() {
        entries.push(to_entry(i, j, e, bounds)?);
    }
    let limit_override = match d.limit {
        None => None,
        Some(l) => Some(to_limit_override(i, l)?),
    };
    Ok(RequestDescriptor {
        entries,
        limit_override,
        // Clamped, not refused: a refusal is an error Envoy lets through by default
        // (`failure_mode_deny: false`), so a huge count must stay a decision (OVER_LIMIT).
        hits_addend: d.hits_addend.map(|h| h.value.min(bounds.max_hits_addend)),
        is_negative_hits: d.is_negative_hits,
    })
}

/// `descriptors[i].entries[j]`: a non-empty key and a value within their byte bounds.
fn to_entry(i: usize, j: usize, e: PbEntry, bounds: &RequestBounds) -> Result<Entry, GrpcStatus> {
    if e.key.is_empty() {
        return Err(invalid(format!(
            "descriptors[{i}].entries[{j}].key: must not be empty"
        )));
    }
    if e.key.len() > bounds.max_key_bytes {
        return Err(invalid(format!(
            "descriptors[{i}].entries[{j}].key: {} bytes exceed the limit of {}",
            e.key.len(),
            bounds.max_key_bytes
        )));
    }
    if e.value.len() > bounds.max_value_bytes {
        return Err(invalid(format!(
            "descriptors[{i}].entries[{j}].value: {} bytes exceed the limit of {}",
            e.value.len(),
            bounds.max_value_bytes
        )));
    }
    Ok(Entry {
        key: e.key,
        value: e.value,
    })
}

/// `descriptors[i].limit`: a known unit (0 requests per unit blocks, as in envoyproxy/ratelimit).
fn to_limit_override(i: usize, l: RateLimitOverride) -> Result<LimitOverride, GrpcStatus> {
    let unit = Unit::from_proto(l.unit).ok_or_else(|| {
        invalid(format!(
            "descriptors[{i}].limit.unit: {} is not a valid unit (UNKNOWN or unrecognised)",
            l.unit
        ))
    })?;
    Ok(LimitOverride {
        requests_per_unit: l.requests_per_unit,
        unit,
    })
}

fn invalid(message: String) -> GrpcStatus {
    GrpcStatus::invalid_argument(message)
}

/// UNAVAILABLE, not UNKNOWN or INTERNAL: Envoy's ratelimit filter treats any error as a failed
/// call and applies its `failure_mode_deny`, and UNAVAILABLE tells operators and retry policies
/// that the condition is transient and lies in the backend. RESOURCE_EXHAUSTED for overload:
/// Envoy applies `failure_mode_deny` the same way, but the code tells an operator that this
/// replica refused the work (`--max-in-flight`) rather than that Redis failed, and a retry
/// against another replica may succeed.
pub fn to_grpc_status(error: LimitError) -> GrpcStatus {
    match error {
        LimitError::Unavailable(BackendError::Overloaded(m)) => GrpcStatus::resource_exhausted(m),
        LimitError::Unavailable(e) => GrpcStatus::unavailable(e.to_string()),
        LimitError::Overloaded(_) => GrpcStatus::resource_exhausted(error.to_string()),
    }
}

/// Converts a decision to Envoy's response, with rate-limit headers when enabled.
pub fn to_response(decision: &Decision, headers: &HeaderOptions) -> RateLimitResponse {
    let statuses = decision.statuses.iter().map(to_descriptor_status).collect();
    let response_headers_to_add = if headers.mode != ResponseHeaders::None {
        rate_limit_headers(decision, headers)
    } else {
        Vec::new()
    };
    RateLimitResponse {
        overall_code: to_code(decision.overall) as i32,
        statuses,
        response_headers_to_add,
        ..Default::default()
    }
}

fn to_code(code: Code) -> PbCode {
    match code {
        Code::Ok => PbCode::Ok,
        Code::OverLimit => PbCode::OverLimit,
    }
}

fn to_descriptor_status(status: &Status) -> DescriptorStatus {
    let Some(limit) = &status.limit else {
        return DescriptorStatus {
            code: to_code(status.code) as i32,
            limit_remaining: status.remaining.min(u32::MAX as u64) as u32,
            ..Default::default()
        };
    };
    let shown = advertised(status, limit);
    DescriptorStatus {
        code: to_code(status.code) as i32,
        current_limit: Some(PbRateLimit {
            name: limit.name.as_deref().unwrap_or_default().to_string(),
            requests_per_unit: shown.per_unit.0,
            unit: shown.per_unit.1.to_proto(),
        }),
        limit_remaining: shown.remaining.min(u32::MAX as u64) as u32,
        duration_until_reset: Some(duration_ms(status.reset_ms)),
        ..Default::default()
    }
}

/// `status` as a client reads it: in hits at its rule's cost ([`advertise`]).
fn advertised(status: &Status, limit: &AppliedLimit) -> Advertised {
    let cost = status.rule.as_ref().map_or(1, |rule| rule.cost);
    advertise(limit, status.remaining, cost)
}

fn duration_ms(ms: u64) -> PbDuration {
    PbDuration {
        seconds: (ms / 1000).min(i64::MAX as u64) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// The status the headers describe: when over limit, the rejecting descriptor that asks the
/// longest wait; otherwise the limited descriptor with the fewest tokens left.
///
/// Quota-mode descriptors reject together: when they all are over, the request waits only for
/// the first of them to fit again, so that one stands for them; when one of them passes, those
/// over their limit neither rejected the request nor describe what the client has left.
fn most_constrained(decision: &Decision) -> Option<&Status> {
    let limited = decision.statuses.iter().filter(|s| s.limit.is_some());
    let over = |s: &&Status| s.code == Code::OverLimit;
    if decision.overall == Code::OverLimit {
        let mut quota = decision.statuses.iter().filter(|s| s.quota).peekable();
        let quota_rejects = quota.peek().is_some() && quota.all(|s| over(&s));
        let ordinary = limited.clone().filter(|s| !s.quota && over(s));
        let first_quota = limited
            .filter(|s| quota_rejects && s.quota && over(s))
            .min_by_key(|s| wait_ms(s));
        ordinary.chain(first_quota).max_by_key(|s| wait_ms(s))
    } else {
        limited
            .filter(|s| !s.shadow && !over(s))
            .min_by_key(|s| (hits_left(s), std::cmp::Reverse(s.reset_ms)))
    }
}

/// Hits that would still pass on a limited status.
fn hits_left(status: &Status) -> u64 {
    status.limit.as_ref().map_or(status.remaining, |limit| {
        advertised(status, limit).remaining
    })
}

fn wait_ms(status: &Status) -> u64 {
    match status.retry_after_ms {
        Some(Some(ms)) => ms,
        Some(None) => u64::MAX,
        None => 0,
    }
}

fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Headers in the IETF draft's shape (`x-ratelimit-limit: 5, 5;w=10`), counted in hits
/// ([`advertise`]). `retry-after` is omitted when no wait helps (the hit costs more than the
/// bucket holds). [`ResponseHeaders::RetryAfter`] writes only `retry-after` (and the degraded
/// header): Envoy's `enable_x_ratelimit_headers` writes the rest from the statuses.
fn rate_limit_headers(decision: &Decision, options: &HeaderOptions) -> Vec<HeaderValue> {
    let mut out = Vec::with_capacity(5);
    let mut push = |key: &str, value: String| {
        out.push(HeaderValue {
            key: key.to_string(),
            value,
            ..Default::default()
        })
    };
    let modes = decision.degraded_modes();
    if !options.degraded.is_empty() && !modes.is_empty() {
        let names: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
        push(&options.degraded, names.join(", "));
    }
    let Some(status) = most_constrained(decision) else {
        return out;
    };
    let Some(limit) = &status.limit else {
        return out;
    };
    // Numbers written with itoa into one sized buffer each: `format!` was a tenth of sluice's
    // own instructions per request (callgrind).
    let mut digits = itoa::Buffer::new();
    if options.mode == ResponseHeaders::All {
        let shown = advertised(status, limit);
        let mut limit_value = String::with_capacity(48);
        limit_value.push_str(digits.format(shown.limit));
        limit_value.push_str(", ");
        limit_value.push_str(digits.format(shown.limit));
        limit_value.push_str(";w=");
        limit_value.push_str(digits.format(shown.window_secs));
        push(&options.limit, limit_value);
        push(
            &options.remaining,
            digits.format(shown.remaining).to_owned(),
        );
        push(
            &options.reset,
            digits.format(ceil_secs(status.reset_ms)).to_owned(),
        );
    }
    if decision.overall == Code::OverLimit
        && let Some(Some(ms)) = status.retry_after_ms
    {
        push(
            &options.retry_after,
            digits.format(ceil_secs(ms).max(1)).to_owned(),
        );
    }
    out
}
