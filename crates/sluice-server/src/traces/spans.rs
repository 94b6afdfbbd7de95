//! The spans of the requests `sluice serve` answers: a server span per
//! request to a decision endpoint, continuing the caller's W3C context,
//! and the trace id a sampled decision leaves as its exemplar.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The caller's trace context in `headers` (W3C `traceparent` and
/// `tracestate`); empty when there is none, or it does not parse.
fn parent(headers: &http::HeaderMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers))
}

/// The server span of an HTTP request to `route` (the endpoint's path:
/// never one with tenant text), continuing the caller's trace. A method
/// outside HTTP's own is `_OTHER` (forward-auth takes any: its text is the
/// caller's).
pub fn http_span(method: &http::Method, route: &str, headers: &http::HeaderMap) -> Span {
    let method = match *method {
        http::Method::GET
        | http::Method::HEAD
        | http::Method::POST
        | http::Method::PUT
        | http::Method::DELETE
        | http::Method::CONNECT
        | http::Method::OPTIONS
        | http::Method::TRACE
        | http::Method::PATCH => method.as_str(),
        _ => "_OTHER",
    };
    let span = tracing::info_span!(
        target: "sluice::trace",
        "http",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        http.response.status_code = Empty,
        otel.status_code = Empty,
    );
    let _ = span.set_parent(parent(headers));
    span
}

/// Records an HTTP answer's status on its server span (a 5xx is an
/// error, as OpenTelemetry's HTTP conventions say).
pub fn http_answered(span: &Span, status: http::StatusCode) {
    span.record("http.response.status_code", status.as_u16());
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
}

/// The server span of a gRPC call of `service`/`method`, continuing the
/// caller's trace (Envoy sends `traceparent` in the call's metadata when
/// its tracing is on).
pub fn grpc_span(service: &str, method: &str, headers: &http::HeaderMap) -> Span {
    let span = tracing::info_span!(
        target: "sluice::trace",
        "grpc",
        otel.name = format!("{service}/{method}"),
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = Empty,
        otel.status_code = Empty,
    );
    let _ = span.set_parent(parent(headers));
    span
}

/// Records a gRPC answer's status code on its server span (an error for
/// the codes OpenTelemetry's gRPC conventions count as the server's).
pub fn grpc_answered(span: &Span, code: tonic::Code) {
    span.record("rpc.grpc.status_code", code as i32);
    if matches!(
        code,
        tonic::Code::Unknown
            | tonic::Code::DeadlineExceeded
            | tonic::Code::Unimplemented
            | tonic::Code::Internal
            | tonic::Code::Unavailable
            | tonic::Code::DataLoss
    ) {
        span.record("otel.status_code", "error");
    }
}

/// The trace id of `span` when its trace is sampled: a decision's
/// exemplar.
pub fn sampled_trace_id(span: &Span) -> Option<String> {
    let context = span.context();
    let span = context.span();
    let span_context = span.span_context();
    span_context
        .is_sampled()
        .then(|| span_context.trace_id().to_string())
}

/// The current span when `traced` (work handed to a task of its own stays
/// in the request's trace), else none (not even looked up).
pub fn current_if(traced: bool) -> Span {
    if traced {
        Span::current()
    } else {
        Span::none()
    }
}
