//! The gRPC listener's services, chosen by the service name in the
//! request's path (`/SERVICE/METHOD`): the Rate Limit Service and
//! `grpc.health.v1.Health`; any other answers `UNIMPLEMENTED`, as gRPC
//! servers do.
//!
//! A plain match rather than `tonic::service::Routes`, which is an axum
//! router: a route table lookup, URL parameters inserted into the
//! request's extensions and a boxed service call per request, a few
//! thousand instructions of the ~79 thousand a gRPC decision costs the
//! service (docs/BENCHMARKS.md, "Service CPU per decision").

use std::convert::Infallible;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::BoxFuture;
use tonic::server::NamedService;

/// The Rate Limit Service `rls` and the health service `health` behind one
/// listener.
#[derive(Debug, Clone)]
pub struct GrpcServices<R, H> {
    rls: R,
    health: H,
}

impl<R, H> GrpcServices<R, H> {
    /// Both services, each answering under its own name.
    pub fn new(rls: R, health: H) -> GrpcServices<R, H> {
        GrpcServices { rls, health }
    }
}

/// The service part of a gRPC path, `/SERVICE/METHOD`.
fn service_name(path: &str) -> &str {
    let rest = path.strip_prefix('/').unwrap_or(path);
    rest.split_once('/').map_or(rest, |(service, _)| service)
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

impl<R: Generated<B>, H: Generated<B>, B> tower::Service<http::Request<B>> for GrpcServices<R, H> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<http::Response<Body>, Infallible>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // tonic's generated servers are always ready; each is asked in
        // `call`, where the request names which.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let service = service_name(request.uri().path());
        if service == R::NAME {
            self.rls.call(request)
        } else if service == H::NAME {
            self.health.call(request)
        } else {
            let unimplemented = tonic::Status::unimplemented(unknown(service, &[R::NAME, H::NAME]));
            Box::pin(std::future::ready(Ok(unimplemented.into_http())))
        }
    }
}

/// The answer's message for a service this server does not have: its name
/// (the first `NAME_SHOWN` characters: it is the client's to choose) and
/// those it has.
fn unknown(service: &str, have: &[&str]) -> String {
    let shown: String = service.chars().take(NAME_SHOWN).collect();
    let more = if shown.len() < service.len() {
        "…"
    } else {
        ""
    };
    format!(
        "no service {shown:?}{more} here; this server has {}",
        have.join(" and ")
    )
}

const NAME_SHOWN: usize = 100;

#[cfg(test)]
mod tests {
    use super::{NAME_SHOWN, service_name, unknown};

    #[test]
    fn the_service_is_the_first_segment_of_the_path() {
        assert_eq!(
            service_name("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"),
            "envoy.service.ratelimit.v3.RateLimitService"
        );
        assert_eq!(
            service_name("/grpc.health.v1.Health/Check"),
            "grpc.health.v1.Health"
        );
        assert_eq!(service_name("/lonely"), "lonely");
        assert_eq!(service_name("/"), "");
        assert_eq!(service_name(""), "");
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
        assert!(message.len() < NAME_SHOWN + 60, "{message}");
        assert!(message.contains('…'), "{message}");
    }
}
