//! The gRPC entry point: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.
//!
//! One call takes these hops, in this order:
//!
//! 1. Transport ([`crate::server`]): the HTTP/2 limits, TLS, the
//!    [`crate::security::tls::AuthorizeLayer`] (a client outside `--tls-allowed-sans` gets
//!    PERMISSION_DENIED) and tonic's message ceiling (OUT_OF_RANGE before any decoding).
//! 2. [`RateLimitServer`] (here): routes the one method and decodes its bytes with
//!    [`wire::StrictCodec`] into a [`WireRequest`] (entry values are bytes; INVALID_ARGUMENT
//!    naming a domain or key that is not UTF-8, or saying why the bytes are no
//!    `RateLimitRequest`).
//! 3. [`RateLimitHandler::serve`] (here): [`validate::check_request`] checks the size bounds,
//!    applies the caller policy and validates each field into a [`LimitRequest`]
//!    (INVALID_ARGUMENT naming the field; a refusal a real Envoy can meet is logged once and
//!    counted as a [`Problem`]); [`Limiter::decide`] decides; [`to_response`] converts the
//!    [`Decision`] to Envoy's response with rate-limit headers. Metrics and the trace span record
//!    the outcome.
//!
//! No decisions are made here; this module only translates.

pub mod caller;
pub mod dynamic_metadata;
pub mod validate;
pub mod wire;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus, RateLimit as PbRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, SERVICE_NAME,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use tonic::codegen::{BoxFuture, StdError};
use tonic::{Request, Response, Status as GrpcStatus};
use tracing::Instrument as _;

use crate::advertised::{Advertised, advertise};
use crate::backend::{Backend, BackendError};
use crate::limiter::{AppliedLimit, Code, Decision, LimitError, Limiter, Status};
use crate::request::LimitRequest;
use crate::telemetry::{Metrics, Outcome, traces};
use crate::top::TopRecorder;
use validate::{Checked, Problem, RequestError};
use wire::{SHOULD_RATE_LIMIT_PATH, WireRequest};

pub use validate::RequestBounds;

/// Which rate-limit headers sluice adds to its answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderMode {
    /// `x-ratelimit-limit`, `-remaining`, `-reset`, and `retry-after` on OVER_LIMIT.
    All,
    /// Only `retry-after` on OVER_LIMIT: for an Envoy whose `enable_x_ratelimit_headers`
    /// writes the `x-ratelimit-*` headers itself (it never writes `retry-after`).
    RetryAfter,
    None,
}

/// Which rate-limit headers to add to the response, and their names.
#[derive(Clone, Debug)]
pub struct HeaderOptions {
    pub mode: HeaderMode,
    pub limit: String,
    pub remaining: String,
    pub reset: String,
    pub retry_after: String,
    /// Names the failure policies that decided a degraded response (`local`, `open, closed`);
    /// empty: never sent.
    pub degraded: String,
    /// `--response-dynamic-metadata`: fill `dynamic_metadata` ([`crate::rls::dynamic_metadata`]).
    pub dynamic_metadata: bool,
}

impl HeaderOptions {
    pub const DEFAULT_LIMIT: &'static str = "x-ratelimit-limit";
    pub const DEFAULT_REMAINING: &'static str = "x-ratelimit-remaining";
    pub const DEFAULT_RESET: &'static str = "x-ratelimit-reset";
    pub const DEFAULT_RETRY_AFTER: &'static str = "retry-after";
    pub const DEFAULT_DEGRADED: &'static str = "x-ratelimit-degraded";
}

impl Default for HeaderOptions {
    /// Every header on under its usual name; no dynamic metadata.
    fn default() -> Self {
        HeaderOptions {
            mode: HeaderMode::All,
            limit: Self::DEFAULT_LIMIT.to_owned(),
            remaining: Self::DEFAULT_REMAINING.to_owned(),
            reset: Self::DEFAULT_RESET.to_owned(),
            retry_after: Self::DEFAULT_RETRY_AFTER.to_owned(),
            degraded: Self::DEFAULT_DEGRADED.to_owned(),
            dynamic_metadata: false,
        }
    }
}

/// Answers `ShouldRateLimit`: decode, decide, encode.
pub struct RateLimitHandler<B> {
    limiter: Arc<Limiter<B>>,
    bounds: RequestBounds,
    headers: HeaderOptions,
    metrics: Metrics,
    problems: Arc<Problems>,
    /// Notes [`Problem::MessageBytes`] in `problems` for the codec.
    on_oversize: wire::OversizeHook,
    /// The replica's top-keys summaries, when on.
    top: Option<Arc<TopRecorder>>,
}

impl<B> RateLimitHandler<B> {
    pub fn new(limiter: Arc<Limiter<B>>, bounds: RequestBounds, headers: HeaderOptions) -> Self {
        let problems = Arc::new(Problems::new(Metrics::off()));
        RateLimitHandler {
            limiter,
            bounds,
            headers,
            metrics: Metrics::off(),
            on_oversize: Problems::oversize_hook(&problems),
            problems,
            top: None,
        }
    }

    /// Counts every decision into `top` as well.
    pub fn with_top(mut self, top: Option<Arc<TopRecorder>>) -> Self {
        self.top = top;
        self
    }

    /// Counts every call into `metrics` (off by default).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.problems = Arc::new(Problems::new(metrics.clone()));
        self.on_oversize = Problems::oversize_hook(&self.problems);
        self.metrics = metrics;
        self
    }
}

/// The [`Problem`]s one server met: counted, and each logged at WARN the first time. A problem
/// comes from Envoy's route configuration, so it recurs on every request of the route.
struct Problems {
    metrics: Metrics,
    warned: [AtomicBool; Problem::ALL.len()],
}

impl Problems {
    fn new(metrics: Metrics) -> Self {
        Problems {
            metrics,
            warned: Default::default(),
        }
    }

    fn oversize_hook(problems: &Arc<Problems>) -> wire::OversizeHook {
        let problems = Arc::clone(problems);
        Arc::new(move |len, max| {
            problems.note(
                Problem::MessageBytes,
                &RequestError::MessageBytes { len, max },
            );
        })
    }

    fn note(&self, problem: Problem, detail: &dyn std::fmt::Display) {
        self.metrics.record_problem(problem);
        if !self.warned[problem.index()].swap(true, Ordering::Relaxed) {
            tracing::warn!(
                problem = problem.as_str(),
                "a request Envoy can send is not decided as sent ({detail}); check the route's \
                 rate limits against sluice's bounds (logged once; counted in \
                 sluice_request_problems_total)"
            );
        }
    }
}

/// For callers holding envoy-types' message (its string values are UTF-8 bytes, unchanged).
#[tonic::async_trait]
impl<B: Backend> RateLimitService for RateLimitHandler<B> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, GrpcStatus> {
        self.serve(request.map(WireRequest::from)).await
    }
}

impl<B: Backend> RateLimitHandler<B> {
    /// Answers one `ShouldRateLimit` as decoded by [`wire::StrictCodec`].
    pub async fn serve(
        &self,
        request: Request<WireRequest>,
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

    /// Validate, decide, encode; metrics and the span record the outcome.
    async fn answer(
        &self,
        request: WireRequest,
        span: &tracing::Span,
    ) -> Result<RateLimitResponse, GrpcStatus> {
        let started = self.metrics.start();
        let request = match validate::check_request(request, &self.bounds) {
            Ok(checked) => self.checked(checked),
            Err(error) => {
                if let Some(problem) = error.problem() {
                    self.problems.note(problem, &error);
                }
                return Err(self.failed(started, span, to_invalid_argument(error)));
            }
        };
        traces::record_request(span, &request);
        match self.limiter.decide(&request).await {
            Ok(decision) => {
                let mut response = to_response(&decision, &self.headers);
                if self.headers.dynamic_metadata {
                    response.dynamic_metadata = Some(dynamic_metadata::build(&request, &decision));
                }
                self.metrics.record_decision(started, &request, &decision);
                if let Some(top) = &self.top {
                    top.record(&request, &decision);
                }
                traces::record_decision(span, &decision);
                Ok(response)
            }
            Err(error) => Err(self.failed(started, span, to_grpc_status(error))),
        }
    }

    /// The request of `checked`, its dropped overrides noted.
    fn checked(&self, checked: Checked) -> LimitRequest {
        for (i, unit) in &checked.dropped_overrides {
            let domain = &checked.request.domain;
            let why = format!(
                "domain `{domain}`: descriptors[{i}].limit.unit {unit} is UNKNOWN or \
                 unrecognised; the descriptor is decided by its configured rule"
            );
            self.problems.note(Problem::OverrideUnit, &why);
        }
        checked.request
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

impl<B: Backend> tonic::server::UnaryService<WireRequest> for ShouldRateLimit<RateLimitHandler<B>> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, GrpcStatus>;

    fn call(&mut self, request: Request<WireRequest>) -> Self::Future {
        let inner = Arc::clone(&self.0);
        Box::pin(async move { inner.serve(request).await })
    }
}

impl<Bk, B> tower_service::Service<http::Request<B>> for RateLimitServer<RateLimitHandler<Bk>>
where
    Bk: Backend,
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
            on_oversize: Some(Arc::clone(&self.inner.on_oversize)),
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

/// Validates a protobuf request and converts it ([`validate::check_request`]); an override
/// dropped for its unit is dropped silently here.
pub fn to_limit_request(
    request: impl Into<WireRequest>,
    bounds: &RequestBounds,
) -> Result<LimitRequest, GrpcStatus> {
    validate::check_request(request.into(), bounds)
        .map(|checked| checked.request)
        .map_err(to_invalid_argument)
}

/// INVALID_ARGUMENT naming the field. Envoy treats it as any failed call: with
/// `failure_mode_deny: false` (its default) the request goes through unlimited, so only what no
/// Envoy request contains, or what the operator's route config causes ([`Problem`]), gets here.
fn to_invalid_argument(error: RequestError) -> GrpcStatus {
    GrpcStatus::invalid_argument(error.to_string())
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
    let response_headers_to_add = if headers.mode != HeaderMode::None {
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
/// bucket holds). [`HeaderMode::RetryAfter`] writes only `retry-after` (and the degraded
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
    if options.mode == HeaderMode::All {
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
