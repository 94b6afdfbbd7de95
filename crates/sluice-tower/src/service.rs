//! The [`RateLimit`] service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use sluice_store::trace::Disclosure;
use sluice_store::{Limiter, Store};
use tower::Service;

use crate::answer::decision_answer;
use crate::extract::Extract;
use crate::lease::{FAILED, LeaseBody, Refusal, admit_reserving};
use crate::usage::Usage;

/// The future of a [`RateLimit`] call.
pub type ResponseFuture<B, E> = Pin<Box<dyn Future<Output = Result<Response<B>, E>> + Send>>;

/// Decides each request before calling the inner service.
///
/// - Keys `extract` cannot read: 400 problem details naming the field; the
///   inner service is not called.
/// - Denied: 429 problem details with `RateLimit`, `RateLimit-Policy` and
///   `Retry-After`, as the sluice service answers; the inner service is not
///   called, and the request consumed nothing.
/// - Admitted: the inner service's response, with `RateLimit` and
///   `RateLimit-Policy` added. Where concurrency rules apply, the request
///   holds a lease of each from before the inner service runs until the
///   response body ends or is dropped (see [`LeaseBody`]).
/// - With a [`Usage`], the request's cost is an estimate: the response says
///   what it actually cost, settled when its body ends, fails or is
///   dropped. On a route with `count_if` rules the request is held there
///   as an attempt, concluded by the response's status before it goes out
///   (see [`crate::usage`]).
///
/// The response body type must be buildable from bytes (`From<Vec<u8>>`:
/// axum's `Body`, `http_body_util::Full<Bytes>`, …) for the answers made
/// here.
#[derive(Debug)]
pub struct RateLimit<T, S, E> {
    inner: T,
    limiter: Arc<Limiter<S>>,
    extract: E,
    usage: Option<Usage>,
    disclosure: Option<Arc<Disclosure>>,
}

impl<T: Clone, S, E: Clone> Clone for RateLimit<T, S, E> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            extract: self.extract.clone(),
            usage: self.usage.clone(),
            disclosure: self.disclosure.clone(),
        }
    }
}

impl<T, S, E> RateLimit<T, S, E> {
    /// Wraps `inner`.
    pub fn new(inner: T, limiter: Arc<Limiter<S>>, extract: E) -> RateLimit<T, S, E> {
        RateLimit {
            inner,
            limiter,
            extract,
            usage: None,
            disclosure: None,
        }
    }

    /// The same service, reading what each request cost from its
    /// response (see [`Usage`]).
    pub fn with_usage(mut self, usage: Option<Usage>) -> RateLimit<T, S, E> {
        self.usage = usage;
        self
    }

    /// The same service, its decisions' spans telling of who asked as
    /// `disclosure` says (`None`: nothing).
    pub fn with_disclosure(mut self, disclosure: Option<Arc<Disclosure>>) -> RateLimit<T, S, E> {
        self.disclosure = disclosure;
        self
    }
}

impl<T, S, E, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<T, S, E>
where
    T: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Send + 'static,
    S: Store + 'static,
    E: Extract<ReqBody>,
    ReqBody: Send + 'static,
    ResBody: From<Vec<u8>> + Send + 'static,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = T::Error;
    type Future = ResponseFuture<LeaseBody<ResBody>, T::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let keys = match self.extract.extract(&request) {
            Ok(keys) => keys,
            Err(problem) => {
                let answer = problem.answer().map(LeaseBody::from);
                return Box::pin(std::future::ready(Ok(answer)));
            }
        };
        // The service that was made ready goes with this call; a clone
        // stays for the next (tower's usual hand-over).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limiter = self.limiter.clone();
        let usage = self.usage.clone();
        let disclosure = self.disclosure.clone();
        Box::pin(async move {
            let answer = |d: &sluice_core::Decision<'_>| decision_answer(d).map(LeaseBody::from);
            let reserve = usage.is_some();
            let admitting = admit_reserving(limiter, keys, reserve, disclosure.as_deref(), answer);
            let mut admitted = match admitting.await {
                Ok(admitted) => admitted,
                Err(Refusal::Invalid(problem)) => {
                    return Ok(problem.answer().map(LeaseBody::from));
                }
                Err(Refusal::Denied(answer)) => return Ok(answer),
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
            let status = Some(parts.status.as_u16());
            if let Some(observer) = admitted.observer.take() {
                observer.answered(status).await;
            }
            let settlement = admitted
                .pending
                .respond(&parts, status, usage.as_ref())
                .await;
            admitted.fields.add_to(&mut parts.headers);
            let body = LeaseBody::new(body, admitted.lease).settling(settlement);
            Ok(Response::from_parts(parts, body))
        })
    }
}
