//! `POST /v1/check`: `{"tenant", "route", "subject"?, "cost"?,
//! "fingerprint"?, "reserve"?}` → a decision (409 for a duplicate
//! submission); with `"reserve": true`, a reservation (`after.rs`); on a
//! route with rules that count by outcome, an attempt to conclude.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use sluice_core::Request;
use sluice_tower::answer::decision_answer;

use super::body::{bytes, no_status, parse_normalized, to_request};
use super::respond::{decision_response, refusal};
use crate::app::App;

pub(super) async fn check(
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
    if let Err(problem) = no_status(&parsed) {
        return refusal(&problem);
    }
    let request = match to_request(&parsed) {
        Ok(request) => request,
        Err(problem) => return refusal(&problem),
    };
    if parsed.reserve == Some(true) {
        return super::after::reserved(&app, &request).await;
    }
    decided(&app, &request, Handed::Field).await
}

/// Where an answer hands out the attempt it holds.
#[derive(Debug, Clone, Copy)]
pub(super) enum Handed {
    /// The JSON member `attempt`.
    Field,
    /// The response header `Sluice-Attempt` (forward-auth: a gateway
    /// copies it onto the request it forwards).
    Header,
}

/// `request` decided through the app's one tail, answered (`/v1/check`
/// and forward-auth answer alike), with the attempt it holds where its
/// rules count by outcome.
pub(super) async fn decided(app: &App, request: &Request<'_>, handed: Handed) -> Response {
    let started = std::time::Instant::now();
    let policy = app.limiter.policy();
    let decision = app
        .decide(Some(request), started, app.limiter.decide(&policy, request))
        .await;
    let Some(attempt) = app.attempt(&policy, request, &decision) else {
        return decision_response(&decision);
    };
    let answer = decision_answer(&decision);
    match handed {
        Handed::Field => super::after::with_fields(answer, [("attempt", attempt.into())]),
        Handed::Header => {
            let mut response = answer.map(axum::body::Body::from).into_response();
            if let Ok(value) = axum::http::HeaderValue::try_from(attempt) {
                response
                    .headers_mut()
                    .insert(crate::usage::ATTEMPT_HEADER, value);
            }
            response
        }
    }
}
