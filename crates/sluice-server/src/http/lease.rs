//! `POST /v1/acquire` (the body of `/v1/check`) takes a lease of every
//! concurrency rule that applies, answering the decision with `"lease"`;
//! `POST /v1/release` `{"lease": "..."}` gives it back: 200
//! `{"released": true}`, or 404 when the lease is unknown, expired or
//! released already (releasing twice is harmless).
//!
//! A lease is opaque to clients: 128 random bits naming it in the store,
//! and the request it was taken for (the client's own tenant, route and
//! subject), so that any instance can release it. Without its random bits
//! a lease cannot be released, so a client can only give back its own.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use sluice_core::Request;
use sluice_tower::InvalidRequest;
use sluice_tower::answer::decision_answer;

use super::check::{bytes, parse_normalized, to_request};
use super::respond::refusal;
use crate::app::App;

/// The format of a lease; another first byte is not a lease.
const VERSION: u8 = 1;

/// Longest lease text accepted: the largest tenant, route and subject.
const MAX_LEASE_CHARS: usize = 2_048;

pub(super) async fn acquire(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match bytes(body) {
        Ok(body) => body,
        Err(problem) => return refusal(&problem),
    };
    let parsed = match parse_normalized(&body) {
        Ok(parsed) => parsed,
        Err(problem) => return refusal(&problem),
    };
    let request = match to_request(&parsed) {
        Ok(request) => request,
        Err(problem) => return refusal(&problem),
    };
    let started = std::time::Instant::now();
    let policy = app.limiter.policy();
    let (decision, lease) = app.limiter.acquire(&policy, &request).await;
    app.metrics.decision(&decision, started.elapsed());
    app.account(&request, &decision);
    let answer = decision_answer(&decision);
    if !decision.allowed {
        return answer.map(Body::from).into_response();
    }
    // The decision's fields, and the lease (null when no concurrency rule
    // applies: nothing to release).
    let (parts, json) = answer.into_parts();
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&json).unwrap_or_default();
    fields.insert(
        "lease".to_owned(),
        lease.map_or(serde_json::Value::Null, |id| encode(id, &request).into()),
    );
    let json = serde_json::to_vec(&fields).unwrap_or_default();
    Response::from_parts(parts, Body::from(json))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
struct ReleaseBody {
    lease: Option<String>,
}

pub(super) async fn release(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match bytes(body) {
        Ok(body) => body,
        Err(problem) => return refusal(&problem),
    };
    let lease = match serde_json::from_slice::<ReleaseBody>(&body) {
        Ok(ReleaseBody { lease: Some(lease) }) => lease,
        Ok(ReleaseBody { lease: None }) => {
            return refusal(&InvalidRequest::new(
                "lease",
                "`lease` is required: the lease /v1/acquire answered",
            ));
        }
        Err(e) => {
            return refusal(&InvalidRequest::new(
                "body",
                format!("malformed JSON body: {e}; expected {{\"lease\": \"...\"}}"),
            ));
        }
    };
    let unknown = || {
        refusal(
            &InvalidRequest::new(
                "lease",
                "no such lease is held: it expired, was released already, or was never given",
            )
            .with_status(StatusCode::NOT_FOUND),
        )
    };
    let Some((id, parts)) = decode(&lease) else {
        return unknown();
    };
    let Ok(request) = Request::new(&parts.tenant, &parts.route, parts.subject.as_deref(), 1) else {
        return unknown();
    };
    let policy = app.limiter.policy();
    match app.limiter.release(&policy, &request, id).await {
        Ok(true) => (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            r#"{"released":true}"#,
        )
            .into_response(),
        Ok(false) => unknown(),
        Err(e) => {
            tracing::warn!(error = %e, "a lease could not be released; it expires by itself");
            refusal(
                &InvalidRequest::new(
                    "lease",
                    "the store is unavailable; the lease expires by itself after its `lease`",
                )
                .with_status(StatusCode::SERVICE_UNAVAILABLE),
            )
        }
    }
}

/// The request a lease was taken for.
#[derive(Debug, PartialEq, Eq)]
struct Parts {
    tenant: String,
    route: String,
    subject: Option<String>,
}

/// A lease as clients hold it.
fn encode(id: u128, request: &Request<'_>) -> String {
    let mut bytes = Vec::with_capacity(64);
    bytes.push(VERSION);
    bytes.extend_from_slice(&id.to_be_bytes());
    for part in [Some(request.tenant), Some(request.route), request.subject] {
        match part {
            None => bytes.push(0),
            Some(text) => {
                bytes.push(1);
                bytes.extend_from_slice(&(text.len() as u16).to_be_bytes());
                bytes.extend_from_slice(text.as_bytes());
            }
        }
    }
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The id and request of a lease; `None` for anything sluice did not give.
fn decode(lease: &str) -> Option<(u128, Parts)> {
    if lease.len() > MAX_LEASE_CHARS {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(lease).ok()?;
    let (&version, rest) = bytes.split_first()?;
    if version != VERSION {
        return None;
    }
    let (id, mut rest) = rest.split_at_checked(16)?;
    let id = u128::from_be_bytes(id.try_into().ok()?);
    let mut part = || -> Option<Option<String>> {
        let (&present, after) = rest.split_first()?;
        rest = after;
        if present == 0 {
            return Some(None);
        }
        let (len, after) = rest.split_at_checked(2)?;
        let len = usize::from(u16::from_be_bytes(len.try_into().ok()?));
        let (text, after) = after.split_at_checked(len)?;
        rest = after;
        Some(Some(String::from_utf8(text.to_vec()).ok()?))
    };
    let tenant = part()??;
    let route = part()??;
    let subject = part()?;
    rest.is_empty().then_some((
        id,
        Parts {
            tenant,
            route,
            subject,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_reads_back_and_nothing_else_does() {
        let request = Request::new("acme", "POST /export", Some("u-1"), 1).unwrap();
        let text = encode(0xfeed_u128 << 64 | 7, &request);
        let (id, parts) = decode(&text).unwrap();
        assert_eq!(id, 0xfeed_u128 << 64 | 7);
        assert_eq!(
            parts,
            Parts {
                tenant: "acme".into(),
                route: "POST /export".into(),
                subject: Some("u-1".into())
            }
        );
        let none = Request::new("acme", "GET /", None, 1).unwrap();
        assert_eq!(decode(&encode(1, &none)).unwrap().1.subject, None);
        for bad in [
            "",
            "not base64!",
            &text[..text.len() - 2],
            &format!("{text}AA"),
            &"A".repeat(MAX_LEASE_CHARS + 1),
        ] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
