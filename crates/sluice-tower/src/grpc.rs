//! sluice for tonic servers (the `tonic` feature): a denial is a gRPC
//! status, `RESOURCE_EXHAUSTED` with the richer error model's `RetryInfo`
//! and `QuotaFailure`, and the `RateLimit`, `RateLimit-Policy` and
//! `Retry-After` fields as metadata, as the HTTP layer answers.
//!
//! [`GrpcRateLimitLayer`] decides every call before the service sees it,
//! with any store (memory, Redis, Redis Cluster); add it with
//! `tonic::transport::Server::builder().layer(...)`. The route of a call is
//! `POST /package.Service/Method`, so plans limit methods by route
//! pattern (`"POST /shop.Orders/*"`); tenant, subject and cost come from
//! metadata ([`FromHeaders`](crate::FromHeaders)). [`status`] makes the
//! status of a denial for code that decides on its own.
//!
//! | decision | code |
//! |---|---|
//! | over a limit | `RESOURCE_EXHAUSTED`, with `RetryInfo` |
//! | cost above a rule's capacity (can never pass) | `RESOURCE_EXHAUSTED`, no `RetryInfo` |
//! | duplicate submission (`dedupe`) | `ALREADY_EXISTS`, with `RetryInfo` |
//! | store unavailable under `on_error: deny` | `UNAVAILABLE`, with `RetryInfo` |
//! | keys unreadable | `INVALID_ARGUMENT`, with `BadRequest` naming the field |
//!
//! With a [`Usage`] ([`GrpcRateLimitLayer::with_usage`]), a call's cost is
//! an estimate, settled at what its response's head says (initial
//! metadata, such as `x-usage-tokens`) when the response body ends, fails
//! or is dropped. Rules that count by outcome (`count_if`) hold each call as
//! an attempt, kept by its `grpc-status` as it appears in the response's
//! head (how tonic answers a call that fails), as the HTTP status gRPC maps
//! it to (`UNAUTHENTICATED` 401, `PERMISSION_DENIED` 403, `NOT_FOUND` 404,
//! …; see [`http_status`]); a status sent only in trailers is not known,
//! and the attempt is given back.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, Request, Response};
use sluice_core::{Decision, Reason};
use sluice_store::trace::Disclosure;
use sluice_store::{Limiter, Store};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tower::{Layer, Service};

use crate::answer::{Fields, InvalidRequest};
use crate::extract::Extract;
use crate::lease::{FAILED, LeaseBody, Refusal, admit_reserving};
use crate::usage::Usage;

/// The gRPC status of a denied decision (see the module table).
pub fn status(decision: &Decision<'_>) -> Status {
    let policy = decision.policy().map_or("", |r| r.name());
    let (code, message) = match decision.reason {
        Some(Reason::Duplicate) => (
            Code::AlreadyExists,
            format!("the same submission was admitted less than the `{policy}` window ago"),
        ),
        Some(Reason::StoreUnavailable) => (
            Code::Unavailable,
            "the rate-limit store is unavailable and the failure policy denies".to_owned(),
        ),
        Some(Reason::CostExceedsCapacity) => (
            Code::ResourceExhausted,
            format!(
                "the request's cost is above the capacity of policy `{policy}`: it can never pass"
            ),
        ),
        _ => (
            Code::ResourceExhausted,
            format!("quota of policy `{policy}` exceeded"),
        ),
    };
    let mut details = ErrorDetails::new();
    if let Some(ms) = decision.retry_after_ms() {
        details.set_retry_info(Some(Duration::from_millis(ms)));
    }
    if code == Code::ResourceExhausted {
        for violated in decision.violated_policies() {
            details.add_quota_failure_violation(violated, message.clone());
        }
    }
    let mut headers = HeaderMap::new();
    Fields::of(decision).add_to(&mut headers);
    Status::with_error_details_and_metadata(
        code,
        message,
        details,
        MetadataMap::from_headers(headers),
    )
}

/// The gRPC status of keys that could not be read.
fn invalid(problem: &InvalidRequest) -> Status {
    let mut details = ErrorDetails::new();
    details.add_bad_request_violation(problem.field.clone(), problem.detail.clone());
    Status::with_error_details(Code::InvalidArgument, problem.detail.clone(), details)
}

/// Decides every gRPC call with a [`Limiter`] before the service sees it;
/// see the module documentation.
#[derive(Debug)]
pub struct GrpcRateLimitLayer<S, E> {
    limiter: Arc<Limiter<S>>,
    extract: E,
    usage: Option<Usage>,
    disclosure: Option<Arc<Disclosure>>,
}

impl<S, E: Clone> Clone for GrpcRateLimitLayer<S, E> {
    fn clone(&self) -> Self {
        GrpcRateLimitLayer {
            limiter: self.limiter.clone(),
            extract: self.extract.clone(),
            usage: self.usage.clone(),
            disclosure: self.disclosure.clone(),
        }
    }
}

impl<S: Store + 'static, E> GrpcRateLimitLayer<S, E> {
    /// Limits calls with `limiter`, by the keys `extract` reads (from
    /// metadata); the limiter is kept healthy from here on.
    pub fn new(limiter: Arc<Limiter<S>>, extract: E) -> GrpcRateLimitLayer<S, E> {
        Limiter::keep_healthy(&limiter, crate::layer::SWEEP_EVERY);
        GrpcRateLimitLayer {
            limiter,
            extract,
            usage: None,
            disclosure: None,
        }
    }

    /// What each decision's span tells of who asked (as
    /// [`RateLimitLayer::with_trace_attributes`](crate::RateLimitLayer::with_trace_attributes)).
    pub fn with_trace_attributes(mut self, disclosure: Disclosure) -> GrpcRateLimitLayer<S, E> {
        self.disclosure = Some(Arc::new(disclosure));
        self
    }

    /// The same layer, reading what each call cost from its response's
    /// head (see the module documentation).
    pub fn with_usage(mut self, usage: Usage) -> GrpcRateLimitLayer<S, E> {
        self.usage = Some(usage);
        self
    }
}

impl<T, S, E: Clone> Layer<T> for GrpcRateLimitLayer<S, E> {
    type Service = GrpcRateLimit<T, S, E>;

    fn layer(&self, inner: T) -> GrpcRateLimit<T, S, E> {
        GrpcRateLimit {
            inner,
            limiter: self.limiter.clone(),
            extract: self.extract.clone(),
            usage: self.usage.clone(),
            disclosure: self.disclosure.clone(),
        }
    }
}

/// The service [`GrpcRateLimitLayer`] wraps around a tonic service.
#[derive(Debug)]
pub struct GrpcRateLimit<T, S, E> {
    inner: T,
    limiter: Arc<Limiter<S>>,
    extract: E,
    usage: Option<Usage>,
    disclosure: Option<Arc<Disclosure>>,
}

impl<T: Clone, S, E: Clone> Clone for GrpcRateLimit<T, S, E> {
    fn clone(&self) -> Self {
        GrpcRateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            extract: self.extract.clone(),
            usage: self.usage.clone(),
            disclosure: self.disclosure.clone(),
        }
    }
}

/// The HTTP status a gRPC status code maps to (Google's API design
/// guide), for rules that count by outcome.
pub fn http_status(code: Code) -> u16 {
    match code {
        Code::Ok => 200,
        Code::Cancelled => 499,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
        Code::DeadlineExceeded => 504,
        Code::NotFound => 404,
        Code::AlreadyExists | Code::Aborted => 409,
        Code::PermissionDenied => 403,
        Code::ResourceExhausted => 429,
        Code::Unimplemented => 501,
        Code::Unavailable => 503,
        Code::Unauthenticated => 401,
        Code::Unknown | Code::Internal | Code::DataLoss => 500,
    }
}

/// The outcome of a call as its response's head tells it: its
/// `grpc-status` as an HTTP status, `None` when the head does not carry
/// one (it comes in the trailers).
fn outcome(parts: &http::response::Parts) -> Option<u16> {
    let code = parts
        .headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(http_status(Code::from_i32(code)))
}

/// The future of a [`GrpcRateLimit`] call.
pub type GrpcFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

impl<T, S, E, ReqBody, ResBody> Service<Request<ReqBody>> for GrpcRateLimit<T, S, E>
where
    T: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Send + 'static,
    S: Store + 'static,
    E: Extract<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = T::Error;
    type Future = GrpcFuture<LeaseBody<ResBody>, T::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let answer = |status: Status| {
            Ok(status
                .into_http::<ResBody>()
                .map(|b| LeaseBody::new(b, None)))
        };
        let keys = match self.extract.extract(&request) {
            Ok(keys) => keys,
            Err(problem) => return Box::pin(std::future::ready(answer(invalid(&problem)))),
        };
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        let usage = self.usage.clone();
        let disclosure = self.disclosure.clone();
        Box::pin(async move {
            let reserve = usage.is_some();
            let admitting = admit_reserving(limiter, keys, reserve, disclosure.as_deref(), status);
            let mut admitted = match admitting.await {
                Ok(admitted) => admitted,
                Err(Refusal::Invalid(problem)) => return answer(invalid(&problem)),
                Err(Refusal::Denied(status)) => return answer(status),
            };
            let response = match inner.call(request).await {
                Ok(response) => response,
                Err(error) => {
                    if let Some(observer) = admitted.observer.take() {
                        observer.answered(Some(FAILED)).await;
                    }
                    return Err(error);
                }
            };
            let (mut parts, body) = response.into_parts();
            if let Some(observer) = admitted.observer.take() {
                observer.answered(outcome(&parts)).await;
            }
            let settlement = admitted
                .pending
                .respond(&parts, outcome(&parts), usage.as_ref())
                .await;
            // The fields go out as initial metadata.
            admitted.fields.add_to(&mut parts.headers);
            let body = LeaseBody::new(body, admitted.lease).settling(settlement);
            Ok(Response::from_parts(parts, body))
        })
    }
}
