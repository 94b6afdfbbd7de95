//! Answers as axum responses. What they say (status, `RateLimit` fields,
//! JSON or problem body) is `sluice_tower::answer`'s, so that the service
//! and the in-process layer answer alike.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use sluice_core::Decision;
use sluice_tower::InvalidRequest;
use sluice_tower::answer::decision_answer;

/// The full answer to a decision: 200 with it as JSON, or 429 with it as
/// problem details.
pub(super) fn decision_response(decision: &Decision<'_>) -> Response {
    decision_answer(decision).map(Body::from).into_response()
}

/// A 400 (or 413) naming the field at fault.
pub(super) fn refusal(problem: &InvalidRequest) -> Response {
    problem.answer().map(Body::from).into_response()
}
