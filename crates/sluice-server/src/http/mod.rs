//! The HTTP API.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/check` | one decision, JSON in and out |
//! | `POST /v1/acquire`, `POST /v1/release` | a decision that takes a lease of each concurrency rule; the lease given back |
//! | `POST /v1/settle`, `POST /v1/report` | usage known after the fact: a reservation settled, a cost recorded (`after.rs`) |
//! | `ANY /v1/forward-auth` | one decision from a gateway's forwarded headers |
//! | `GET /healthz` | the process is up |
//! | `GET /readyz` | the process can decide with its store (200, else 503) |
//! | `GET /metrics` | Prometheus metrics |
//! | `GET /healthcheck`, `POST /json`, `GET /rlconfig` | envoyproxy/ratelimit's endpoints (`envoyproxy.rs`) |
//! | `/v1/admin/*` | the admin API, with a token only: overrides, heavy hitters, inspect (`admin.rs`) |
//!
//! Every answer to a decision carries `RateLimit-Policy` and `RateLimit`;
//! a denial is a 429 with `Retry-After` and an RFC 9457 problem body. Bad
//! input is a 400 problem naming the field, never a 500.

mod admin;
mod after;
mod attempt;
mod body;
mod check;
mod envoyproxy;
mod forward_auth;
mod health;
mod lease;
mod respond;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{any, get, post};
use sluice_core::config::ConnectionLimits;

pub use sluice_tower::{DecisionView, InvalidRequest};

use crate::app::App;

/// Largest request body `/v1/check` reads.
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// Bounds every request, in one layer: one whose `Content-Length` is above
/// [`MAX_BODY_BYTES`] is refused before its body is read (413, problem
/// details naming `body`: a client that announces a large body and sends a
/// short one gets its answer at once instead of a wait), and one not
/// answered within `request_timeout` (a client sending its body slowly)
/// gets 408 naming `body` (the timer armed only when it has to wait:
/// [`crate::listen::within`]).
async fn bound(
    axum::extract::State(timeout): axum::extract::State<Duration>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let announced = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        let problem = InvalidRequest::new(
            "body",
            format!("the body may be at most {MAX_BODY_BYTES} bytes"),
        )
        .with_status(axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        return respond::refusal(&problem);
    }
    match crate::listen::within(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            let problem = InvalidRequest::new(
                "body",
                format!(
                    "the request was not complete within {} ms (server.limits.request_timeout)",
                    timeout.as_millis()
                ),
            )
            .with_status(axum::http::StatusCode::REQUEST_TIMEOUT);
            respond::refusal(&problem)
        }
    }
}

/// serde's names of Rust's number types, in a client's words.
fn in_words(message: String) -> String {
    const WORDS: [(&str, &str); 8] = [
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected u64", "expected a whole number from 0"),
        (
            "expected u32",
            "expected a whole number from 0 to 4294967295",
        ),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
    ];
    match WORDS.iter().find(|(rust, _)| message.contains(rust)) {
        Some((rust, words)) => message.replacen(rust, words, 1),
        None => message,
    }
}

/// A JSON body as `T`, the whole of it; a problem names the member at
/// fault (`body` for the document itself) and says what `what` is.
pub(crate) fn parse_json<'de, T: serde::Deserialize<'de>>(
    body: &'de [u8],
    what: &str,
) -> Result<T, sluice_tower::InvalidRequest> {
    let mut json = serde_json::Deserializer::from_slice(body);
    let parsed: T = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        let path = e.path().to_string();
        // A path that starts with a member's name names it; errors about
        // the document itself (`.`, `[0]`) have none.
        let named = path.starts_with(|c: char| c.is_ascii_alphabetic());
        let field = if named { path } else { "body".to_owned() };
        let message = in_words(e.into_inner().to_string());
        sluice_tower::InvalidRequest::new(field, format!("malformed {what}: {message}"))
    })?;
    json.end()
        .map_err(|e| sluice_tower::InvalidRequest::new("body", format!("malformed {what}: {e}")))?;
    Ok(parsed)
}

/// The router of the HTTP API, every request bounded by `limits`: a body
/// above [`MAX_BODY_BYTES`] is refused with 413 (at once when its
/// `Content-Length` says so), and a request not handled within
/// `request_timeout` (a client sending its body slowly) gets 408.
pub fn router(app: Arc<App>, limits: &ConnectionLimits) -> Router {
    // The admin API exists only with a token.
    let admin = if app.admin.enabled() {
        admin::routes().route_layer(axum::middleware::from_fn_with_state(
            app.clone(),
            admin::authorise,
        ))
    } else {
        Router::new()
    };
    let decisions = Router::new()
        .route("/v1/check", post(check::check))
        .route("/v1/acquire", post(lease::acquire))
        .route("/v1/release", post(lease::release))
        .route("/v1/settle", post(after::settle))
        .route("/v1/report", post(after::report))
        .route("/v1/forward-auth", any(forward_auth::forward_auth))
        .route("/json", post(envoyproxy::json));
    // Only when traced: without tracing, not even a header is read.
    let decisions = if app.traced {
        decisions.route_layer(axum::middleware::from_fn(traced))
    } else {
        decisions
    };
    Router::new()
        .merge(admin)
        .merge(decisions)
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/healthcheck", get(envoyproxy::healthcheck))
        .route("/rlconfig", get(envoyproxy::rlconfig))
        .fallback(no_such_endpoint)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            Duration::from_millis(limits.request_timeout_ms),
            bound,
        ))
        .with_state(app)
}

/// A decision endpoint's request within its server span, a child of the
/// caller's (`traces`), named by the endpoint's path.
async fn traced(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    // Every decision endpoint is a literal path, matched as sent: the
    // path is the route (and axum's MatchedPath, which would cost every
    // request an allocation, traced or not, is not needed).
    let span = crate::traces::http_span(request.method(), request.uri().path(), request.headers());
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    crate::traces::http_answered(&span, response.status());
    response
}

/// A 404 problem naming the path (a client's typo, or the admin API
/// without its token) and the endpoints there are.
async fn no_such_endpoint(uri: axum::http::Uri) -> axum::response::Response {
    let detail = format!(
        "no endpoint at `{}`; sluice answers POST /v1/check, POST /v1/acquire, \
         POST /v1/release, POST /v1/settle, POST /v1/report, /v1/forward-auth, GET /healthz, GET /readyz, GET /metrics, \
         envoyproxy/ratelimit's POST /json, GET /healthcheck and GET /rlconfig, \
         and, with `admin.token_env` or `admin.token_file`, /v1/admin/…",
        crate::shown(uri.path())
    );
    respond::refusal(
        &sluice_tower::InvalidRequest::new("path", detail)
            .with_status(axum::http::StatusCode::NOT_FOUND),
    )
}

/// A 405 problem naming the method (the `Allow` header lists those the
/// path takes).
async fn wrong_method(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> axum::response::Response {
    let detail = format!(
        "`{}` is not a method `{}` takes (see `Allow`)",
        crate::shown(method.as_str()),
        crate::shown(uri.path())
    );
    respond::refusal(
        &sluice_tower::InvalidRequest::new("method", detail)
            .with_status(axum::http::StatusCode::METHOD_NOT_ALLOWED),
    )
}

/// The router of a metrics listener of its own (`server.metrics`): the
/// metrics at `path`, nothing else.
pub fn metrics_router(app: Arc<App>, path: &str, limits: &ConnectionLimits) -> Router {
    Router::new()
        .route(path, get(health::metrics))
        .layer(axum::middleware::from_fn_with_state(
            Duration::from_millis(limits.request_timeout_ms),
            bound,
        ))
        .with_state(app)
}
