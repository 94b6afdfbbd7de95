//! Usage known after the fact, over HTTP:
//!
//! - `"reserve": true` on `/v1/check` (and `/v1/acquire`) holds the cost
//!   as an estimate and answers `"reservation"`;
//! - `POST /v1/settle` `{"reservation", "cost"}` replaces the estimate
//!   with the actual cost, once: 200 with the rules' state after (an
//!   identical retry answers the same and changes nothing), 404 for an
//!   unknown, forged, expired or differently settled reservation;
//! - `POST /v1/report` (the body of `/v1/check`) records a cost already
//!   spent: always counted, debt included, 200 with the rules' state
//!   after, never 429; on a route whose rules count by outcome it
//!   concludes the check's `"attempt"` with the response's `"status"`
//!   (`attempt.rs`).
//!
//! Reservations are sealed and tracked by [`crate::reservation`]; what a
//! settle or a report does, and counts, is [`crate::usage`]'s.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_core::Request;
use sluice_core::request::MAX_REPORTED_COST;
use sluice_store::{AfterError, MarkerAnswer, StoreError};
use sluice_tower::InvalidRequest;
use sluice_tower::answer::{decision_answer, standing_answer};

use super::body::{
    CheckBody, bytes, latency, observed, parse_normalized, status_code, to_spent_request,
    whole_number,
};
use super::respond::refusal;
use crate::app::App;
use crate::reservation::Reservations;

/// `request` decided as a reservation: the decision's answer, with
/// `"reservation"` when admitted (the estimate held until settled).
pub(super) async fn reserved(app: &App, request: &Request<'_>) -> Response {
    let started = std::time::Instant::now();
    let policy = app.limiter.policy();
    let decision = app
        .decide_reserving(request, started, app.limiter.decide(&policy, request))
        .await;
    let answer = decision_answer(&decision);
    let reservation = app.limiter.reserve(&policy, request, &decision);
    let attempt = app.attempt(&policy, request, &decision);
    let fields = [
        reservation.map(|r| ("reservation", app.reservations.give(r).into())),
        attempt.map(|id| ("attempt", id.into())),
    ];
    match fields {
        [None, None] => answer.map(Body::from).into_response(),
        fields => with_fields(answer, fields.into_iter().flatten()),
    }
}

/// `answer` (a JSON object) with each `(name, value)` of `added` set.
pub(super) fn with_fields<'n>(
    answer: axum::http::Response<Vec<u8>>,
    added: impl IntoIterator<Item = (&'n str, serde_json::Value)>,
) -> Response {
    let (parts, json) = answer.into_parts();
    let mut fields: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&json).unwrap_or_default();
    for (name, value) in added {
        fields.insert(name.to_owned(), value);
    }
    let json = serde_json::to_vec(&fields).unwrap_or_default();
    Response::from_parts(parts, Body::from(json))
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object such as {\"reservation\": \"...\", \"cost\": 42}"
)]
struct SettleBody {
    reservation: Option<String>,
    cost: Option<serde_json::Number>,
    latency_ms: Option<serde_json::Number>,
    status: Option<serde_json::Number>,
}

pub(super) async fn settle(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match bytes(body) {
        Ok(body) => body,
        Err(problem) => return refusal(&problem),
    };
    let parsed: SettleBody = match crate::http::parse_json(&body, "JSON body") {
        Ok(parsed) => parsed,
        Err(problem) => return refusal(&problem),
    };
    let Some(id) = parsed.reservation else {
        return refusal(&InvalidRequest::new(
            "reservation",
            "`reservation` is required: the reservation /v1/check answered",
        ));
    };
    let cost = match parsed.cost.as_ref().map(|n| {
        whole_number(n)
            .and_then(|c| u64::try_from(c).ok())
            .filter(|c| *c <= MAX_REPORTED_COST)
            .ok_or(n)
    }) {
        Some(Ok(cost)) => cost,
        Some(Err(n)) => {
            return refusal(&InvalidRequest::new(
                "cost",
                format!("`cost` must be a whole number from 0 to {MAX_REPORTED_COST}, got {n}"),
            ));
        }
        None => {
            return refusal(&InvalidRequest::new(
                "cost",
                "`cost` is required: what the request actually cost (0 or more)",
            ));
        }
    };
    let (latency_ms, status) = match (
        latency(parsed.latency_ms.as_ref()),
        status_code(parsed.status.as_ref()),
    ) {
        (Ok(latency_ms), Ok(status)) => (latency_ms, status),
        (Err(problem), _) | (_, Err(problem)) => return refusal(&problem),
    };
    let unknown = |why: &str| {
        app.settle_refused();
        refusal(
            &InvalidRequest::new(
                "reservation",
                format!("no such reservation to settle: {why}"),
            )
            .with_status(StatusCode::NOT_FOUND),
        )
    };
    let now = app.now_ms();
    let Some(held) = app.reservations.open(&id, now) else {
        return unknown("it expired (reservation_ttl), or was never given");
    };
    if held.reservation.attempt {
        return unknown(
            "it is an attempt: conclude it with POST /v1/report, its `attempt` and the response's `status`",
        );
    }
    let ttl = Reservations::marker_ttl_ms(&held, now);
    // On a task of its own: a client gone mid-settle cannot cut the
    // settle off between the store applying it and its count in the
    // metrics and the ledger (its retry would find it applied, uncounted).
    // Within the request's span: the settle's is a child of it.
    let traced = app.traced;
    let settle = settle_and_count(
        app,
        held.reservation,
        (cost, ttl),
        latency_ms.map(|l| (l, status)),
    );
    let span = crate::traces::current_if(traced);
    let settling = tokio::spawn(tracing::Instrument::instrument(settle, span));
    settling.await.unwrap_or_else(|error| {
        tracing::error!(%error, "a settle's task failed");
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    })
}

/// Settles `reservation` at `cost` ([`App::settle`], which counts what it
/// did): the answer.
async fn settle_and_count(
    app: Arc<App>,
    reservation: sluice_store::Reservation,
    (cost, ttl): (u64, u64),
    observed: Option<(f64, Option<u16>)>,
) -> Response {
    let policy = app.limiter.policy();
    let unavailable = |error: &StoreError| {
        refusal(
            &InvalidRequest::new(
                "store",
                format!(
                    "the rate-limit store could not record the settle ({error}); it may have applied, in part: send it again, it applies once"
                ),
            )
            .with_status(StatusCode::SERVICE_UNAVAILABLE),
        )
    };
    let settled = match app.settle(&policy, &reservation, cost, ttl).await {
        Ok(settled) => settled,
        // On Redis Cluster or a sharded tenant a settle may have applied
        // in some slots: its retry finishes it, whatever happened.
        Err(error) => return unavailable(&error),
    };
    match settled.marker {
        MarkerAnswer::Conflict => refusal(
            &InvalidRequest::new(
                "reservation",
                "no such reservation to settle: it was settled already, at another cost, or expired",
            )
            .with_status(StatusCode::NOT_FOUND),
        ),
        // Made under its lead marker, and counted once; a retry finishes
        // the slots or shards the store failed to reach (and answers as a
        // repeat).
        MarkerAnswer::Applied if settled.unfinished.is_some() => {
            unavailable(settled.unfinished.as_ref().expect("unfinished"))
        }
        MarkerAnswer::Again | MarkerAnswer::Applied => {
            // What the downstream showed, once: not again on a repeat.
            if let (MarkerAnswer::Applied, Some((latency_ms, status))) = (settled.marker, observed)
                && let Ok(request) = Request::new(
                    &reservation.tenant,
                    &reservation.route,
                    reservation.subject.as_deref(),
                    1,
                )
            {
                app.limiter
                    .observe(&policy, &request, latency_ms, status)
                    .await;
            }
            standing_answer(&settled.decision)
                .map(Body::from)
                .into_response()
        }
    }
}

pub(super) async fn report(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match bytes(body) {
        Ok(body) => body,
        Err(problem) => return refusal(&problem),
    };
    let parsed: CheckBody<'_> = match parse_normalized(&body) {
        Ok(parsed) => parsed,
        Err(problem) => return refusal(&problem),
    };
    if parsed.reserve.is_some() {
        return refusal(&InvalidRequest::new(
            "reserve",
            "`reserve` is for /v1/check and /v1/acquire: a report records a cost already spent",
        ));
    }
    let status = match status_code(parsed.status.as_ref()) {
        Ok(status) => status,
        Err(problem) => return refusal(&problem),
    };
    let latency_ms = match latency(parsed.latency_ms.as_ref()) {
        Ok(latency) => latency,
        Err(problem) => return refusal(&problem),
    };
    if let Some(id) = &parsed.attempt {
        return super::attempt::conclude(app.clone(), &parsed, id, (status, latency_ms)).await;
    }
    let request = match to_spent_request(&parsed) {
        Ok(request) => request,
        Err(problem) => return refusal(&problem),
    };
    let policy = app.limiter.policy();
    match app.report(&policy, &request).await {
        Ok(reported) => {
            observe(&app, &parsed, latency_ms, status).await;
            standing_answer(&reported.decision)
                .map(Body::from)
                .into_response()
        }
        Err(AfterError::AttemptNeeded) => refusal(&InvalidRequest::new(
            "attempt",
            AfterError::AttemptNeeded.to_string(),
        )),
        Err(AfterError::Store(error)) => unavailable(
            &error,
            "a report is not idempotent: send it again only if it was not recorded",
        ),
        Err(AfterError::Partly {
            recorded: units,
            error,
            ..
        }) => {
            // What was recorded is counted (App::report).
            refusal(
                &InvalidRequest::new(
                    "store",
                    format!(
                        "the rate-limit store recorded the report on some of the tenant's shards ({units} of the {} units; rules kept whole on shard 0, in full), then failed ({error}): sending it again would count that part twice",
                        request.cost
                    ),
                )
                .with_status(StatusCode::SERVICE_UNAVAILABLE),
            )
        }
    }
}

/// 503 when the store could not answer: unreachable, nothing changed;
/// out of time, the change may have applied (`retry` says what to do).
fn unavailable(error: &StoreError, retry: &str) -> Response {
    let what = match error {
        StoreError::Timeout(_) => "the change may have applied",
        _ => "nothing changed",
    };
    refusal(
        &InvalidRequest::new(
            "store",
            format!("the rate-limit store could not record it ({error}): {what}; {retry}"),
        )
        .with_status(StatusCode::SERVICE_UNAVAILABLE),
    )
}

/// Tells the adaptive valves of the request `parsed` names what its
/// downstream showed, when the caller said (`latency_ms`).
async fn observe(app: &App, parsed: &CheckBody<'_>, latency_ms: Option<f64>, status: Option<u16>) {
    if let Some(latency_ms) = latency_ms
        && let Some(request) = observed(parsed)
    {
        let policy = app.limiter.policy();
        app.limiter
            .observe(&policy, &request, latency_ms, status)
            .await;
    }
}
