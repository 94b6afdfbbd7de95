//! `POST /v1/check`: `{"tenant", "route", "subject"?, "cost"?,
//! "fingerprint"?, "reserve"?}` → a decision (409 for a duplicate
//! submission); with `"reserve": true`, a reservation (`after.rs`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use sluice_core::Request;

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
    decided(&app, &request).await
}

/// `request` decided through the app's one tail, answered (`/v1/check`
/// and forward-auth answer alike).
pub(super) async fn decided(app: &App, request: &Request<'_>) -> Response {
    let started = std::time::Instant::now();
    let policy = app.limiter.policy();
    let decision = app
        .decide(Some(request), started, app.limiter.decide(&policy, request))
        .await;
    decision_response(&decision)
}
