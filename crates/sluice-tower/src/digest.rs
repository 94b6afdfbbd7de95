//! A fingerprint for the duplicate guard made of the request body: the
//! same submission sent twice (a double-clicked "pay", a client retrying
//! on a timeout) has the same body even when it carries no
//! `Idempotency-Key`.
//!
//! [`BodyDigestLayer`] reads the body, up to a bound, and puts its SHA-256
//! in the request's extensions as a [`BodyDigest`], which
//! [`FromHeaders`](crate::FromHeaders) uses as the fingerprint when the
//! fingerprint header is absent; the inner service gets the same body. A
//! body above the bound is refused with 413 before anything is decided.
//! Put it outside the rate-limit layer (added after it, so it runs first):
//!
//! ```
//! use axum::{Router, routing::post};
//! use sluice_store::MemoryStore;
//! use sluice_tower::digest::BodyDigestLayer;
//! use sluice_tower::limits::Limits;
//!
//! let payments = Limits::route("POST /v1/payments")
//!     .prevent_duplicate("5s")
//!     .layer(MemoryStore::new(10_000))
//!     .unwrap();
//! let app: Router = Router::new().route(
//!     "/v1/payments",
//!     post(|| async { "paid" })
//!         .route_layer(payments)
//!         .route_layer(BodyDigestLayer::new(64 * 1024)),
//! );
//! ```

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Limited};
use sha2::{Digest, Sha256};
use tower::{Layer, Service};

use crate::answer::InvalidRequest;

/// The SHA-256 of a request body, in hex: a request extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyDigest(pub String);

/// Puts the [`BodyDigest`] of bodies up to `max_bytes` in their requests;
/// see the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct BodyDigestLayer {
    max_bytes: usize,
}

impl BodyDigestLayer {
    /// Digests bodies of up to `max_bytes`; a larger one is answered 413.
    pub fn new(max_bytes: usize) -> BodyDigestLayer {
        BodyDigestLayer { max_bytes }
    }
}

impl<T> Layer<T> for BodyDigestLayer {
    type Service = BodyDigestService<T>;

    fn layer(&self, inner: T) -> BodyDigestService<T> {
        BodyDigestService {
            inner,
            max_bytes: self.max_bytes,
        }
    }
}

/// The service of [`BodyDigestLayer`].
#[derive(Debug, Clone)]
pub struct BodyDigestService<T> {
    inner: T,
    max_bytes: usize,
}

impl<T, ReqBody, ResBody> Service<Request<ReqBody>> for BodyDigestService<T>
where
    T: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Send + 'static,
    ReqBody: Body + From<Bytes> + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: From<Vec<u8>> + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = T::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, T::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let max_bytes = self.max_bytes;
        Box::pin(async move {
            let (mut parts, body) = request.into_parts();
            let bytes = match Limited::new(body, max_bytes).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let too_large = e.is::<http_body_util::LengthLimitError>();
                    let problem = if too_large {
                        InvalidRequest::new(
                            "body",
                            format!("a body above {max_bytes} bytes cannot be fingerprinted"),
                        )
                        .with_status(StatusCode::PAYLOAD_TOO_LARGE)
                    } else {
                        InvalidRequest::new("body", format!("the body could not be read: {e}"))
                    };
                    return Ok(problem.answer().map(ResBody::from));
                }
            };
            let digest = Sha256::digest(&bytes);
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            parts.extensions.insert(BodyDigest(hex));
            inner
                .call(Request::from_parts(parts, ReqBody::from(bytes)))
                .await
        })
    }
}
