//! The gRPC listener's services, chosen by the request's path
//! (`/SERVICE/METHOD`): the Rate Limit Service's `ShouldRateLimit`, served
//! by [`unary`] straight on hyper, and `grpc.health.v1.Health` (tonic's);
//! any other service or method answers `UNIMPLEMENTED`, as gRPC servers
//! do.
//!
//! A plain match rather than `tonic::service::Routes`, which is an axum
//! router: a route table lookup, URL parameters inserted into the
//! request's extensions and a boxed service call per request, a few
//! thousand instructions of the ~79 thousand a gRPC decision cost the
//! service (docs/BENCHMARKS.md, "Service CPU per decision").

pub mod request;
pub mod unary;

use std::convert::Infallible;
use std::fmt::Display;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use http_body_util::Either;
use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::NamedService;

use std::sync::Arc;

use crate::Fallible;
use crate::app::App;
use crate::envoy::RateLimiter;
use request::RequestView;

/// Serves the Rate Limit Service and `grpc.health.v1` on `listener` until
/// `shutdown` resolves.
pub async fn serve_grpc(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    limits: sluice_core::config::ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Fallible<()> {
    let routes = grpc_routes(app, &limits).await;
    crate::listen::serve(
        listener,
        routes,
        &limits,
        crate::listen::Protocols::Http2,
        shutdown,
        crate::listen::places(&limits),
    )
    .await;
    Ok(())
}

/// The Rate Limit Service and `grpc.health.v1`, reporting serving.
pub async fn grpc_routes(
    app: Arc<App>,
    limits: &sluice_core::config::ConnectionLimits,
) -> GrpcServices<
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(RLS, tonic_health::ServingStatus::Serving)
        .await;
    let max_message = usize::try_from(limits.grpc_max_message_bytes).unwrap_or(usize::MAX);
    let traced = app.traced;
    GrpcServices::new(
        RateLimiter::new(app),
        max_message,
        std::time::Duration::from_millis(limits.request_timeout_ms),
        health_service,
    )
    .traced(traced)
}

/// The Rate Limit Service's name.
pub const RLS: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Its one method.
const SHOULD_RATE_LIMIT: &str = "ShouldRateLimit";

/// What the listener answers with: a unary answer of its own, or tonic's
/// body (the health service, errors).
pub type Answer = http::Response<Either<unary::OneMessage, Body>>;

/// The Rate Limit Service and the health service `health` behind one
/// listener.
#[derive(Debug, Clone)]
pub struct GrpcServices<H> {
    rls: RateLimiter,
    /// `server.limits.grpc_max_message_bytes`.
    max_message: usize,
    /// `server.limits.request_timeout`: how long a request's message may
    /// take to arrive.
    read_timeout: Duration,
    health: H,
    /// Whether calls of the Rate Limit Service get server spans
    /// (`traces`).
    traced: bool,
}

impl<H> GrpcServices<H> {
    /// Both services; requests to the Rate Limit Service carry messages of
    /// at most `max_message` bytes, arriving within `read_timeout`.
    pub fn new(
        rls: RateLimiter,
        max_message: usize,
        read_timeout: Duration,
        health: H,
    ) -> GrpcServices<H> {
        GrpcServices {
            rls,
            max_message,
            read_timeout,
            health,
            traced: false,
        }
    }

    /// With `traced`, each call of the Rate Limit Service runs within a
    /// server span continuing the caller's trace.
    pub fn traced(mut self, traced: bool) -> GrpcServices<H> {
        self.traced = traced;
        self
    }
}

/// The service and method parts of a gRPC path, `/SERVICE/METHOD`.
fn service_and_method(path: &str) -> (&str, &str) {
    let rest = path.strip_prefix('/').unwrap_or(path);
    rest.split_once('/').unwrap_or((rest, ""))
}

/// What tonic generates for a service: named, answering every request
/// with a boxed future.
pub trait Generated<B>:
    NamedService
    + tower::Service<
        http::Request<B>,
        Response = http::Response<Body>,
        Error = Infallible,
        Future = BoxFuture<http::Response<Body>, Infallible>,
    >
{
}

impl<S, B> Generated<B> for S where
    S: NamedService
        + tower::Service<
            http::Request<B>,
            Response = http::Response<Body>,
            Error = Infallible,
            Future = BoxFuture<http::Response<Body>, Infallible>,
        >
{
}

impl<H, B> tower::Service<http::Request<B>> for GrpcServices<H>
where
    H: Generated<B>,
    B: http_body::Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Display,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = BoxFuture<Answer, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both are always ready (tonic's generated servers are); each is
        // asked in `call`, where the request names which.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let (service, method) = service_and_method(request.uri().path());
        if service == RLS && method == SHOULD_RATE_LIMIT {
            let span = self
                .traced
                .then(|| crate::traces::grpc_span(RLS, SHOULD_RATE_LIMIT, request.headers()));
            // The headers are checked here and not kept: the future holds
            // only what the rest needs (it is boxed, moved into its box
            // whole, per request).
            let mut body = match unary::check_encoding(request.headers()) {
                Ok(()) => request.into_body(),
                Err(status) => {
                    if let Some(span) = &span {
                        crate::traces::grpc_answered(span, status.code());
                    }
                    let refused = unary::respond::<RateLimitResponse>(Err(status));
                    return Box::pin(std::future::ready(Ok(refused.map(Either::Left))));
                }
            };
            let (rls, max_message, read_timeout) =
                (self.rls.clone(), self.max_message, self.read_timeout);
            let traced = span.is_some();
            let answered = async move {
                // A client trickling its message (or never sending it)
                // holds a stream and a buffer: it gets as long as an HTTP
                // request's body does (no timer when the message came with
                // the headers: `within`). The body is borrowed, not moved
                // into the read, so this future holds it once.
                let read = unary::read_message(&mut body, max_message);
                let message = crate::listen::within(read_timeout, read)
                    .await
                    .unwrap_or_else(|_| {
                        Err(tonic::Status::deadline_exceeded(format!(
                            "the request's message did not arrive within {} ms \
                             (server.limits.request_timeout)",
                            read_timeout.as_millis()
                        )))
                    });
                let answer = match message {
                    Ok(message) => match RequestView::decode(&message) {
                        Ok(request) => rls.should_rate_limit_view(request).await,
                        Err(e) => Err(tonic::Status::internal(format!(
                            "cannot decode the RateLimitRequest: {e}"
                        ))),
                    },
                    Err(status) => Err(status),
                };
                if traced {
                    let code = answer
                        .as_ref()
                        .map_or_else(tonic::Status::code, |_| tonic::Code::Ok);
                    crate::traces::grpc_answered(&tracing::Span::current(), code);
                }
                Ok(unary::respond(answer).map(Either::Left))
            };
            // Untraced, the future is what it was before traces: nothing
            // wraps it.
            return match span {
                None => Box::pin(answered),
                Some(span) => Box::pin(tracing::Instrument::instrument(answered, span)),
            };
        }
        if service == H::NAME {
            let health = self.health.call(request);
            return Box::pin(async move { Ok(health.await?.map(Either::Right)) });
        }
        let message = if service == RLS {
            let shown = crate::shown(method);
            format!("{RLS} has no method {shown:?}; it has {SHOULD_RATE_LIMIT}")
        } else {
            unknown(service, &[RLS, H::NAME])
        };
        let unimplemented = tonic::Status::unimplemented(message).into_http();
        Box::pin(std::future::ready(Ok(unimplemented.map(Either::Left))))
    }
}

/// The answer's message for a service this server does not have: its name
/// (its first 100 characters: it is the client's to choose) and
/// those it has.
fn unknown(service: &str, have: &[&str]) -> String {
    format!(
        "no service {:?} here; this server has {}",
        crate::shown(service),
        have.join(" and ")
    )
}

#[cfg(test)]
mod tests {
    use super::{service_and_method, unknown};

    #[test]
    fn the_service_and_method_are_the_path_segments() {
        assert_eq!(
            service_and_method("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
            (
                "envoy.service.ratelimit.v3.RateLimitService",
                "ShouldRateLimit"
            )
        );
        assert_eq!(
            service_and_method("/grpc.health.v1.Health/Check"),
            ("grpc.health.v1.Health", "Check")
        );
        assert_eq!(service_and_method("/lonely"), ("lonely", ""));
        assert_eq!(service_and_method("/"), ("", ""));
        assert_eq!(service_and_method(""), ("", ""));
    }

    #[test]
    fn an_unknown_service_is_named_within_a_bound() {
        let message = unknown("no.such.Service", &["a.A", "b.B"]);
        assert_eq!(
            message,
            "no service \"no.such.Service\" here; this server has a.A and b.B"
        );
        let long = "x".repeat(10_000);
        let message = unknown(&long, &["a.A"]);
        assert!(message.len() < 100 + 60, "{message}");
        assert!(message.contains('…'), "{message}");
    }
}
