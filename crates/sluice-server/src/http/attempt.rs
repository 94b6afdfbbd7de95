//! Concluding an attempt over HTTP: `POST /v1/report` with the `attempt`
//! a check answered (on a route whose rules count by outcome) and the
//! response's `status`. The rules whose `count_if` matches keep what the
//! check held, the others are given it back; once (an identical retry
//! answers the same, another status or the expiry finds it taken: 404).
//! The body carries `attempt` and `status` only: the attempt names the
//! rest, and nothing a body could test against it is answered.

use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sluice_store::MarkerAnswer;
use sluice_tower::InvalidRequest;
use sluice_tower::answer::standing_answer;

use super::body::CheckBody;
use super::respond::refusal;
use crate::app::App;
use crate::reservation::{Held, Reservations};

/// Concludes the attempt `id` of a report's body `parsed` with `status`.
pub(super) async fn conclude(
    app: Arc<App>,
    parsed: &CheckBody<'_>,
    id: &str,
    (status, latency_ms): (Option<u16>, Option<f64>),
) -> Response {
    let Some(status) = status else {
        return refusal(&InvalidRequest::new(
            "status",
            "`status` is required to conclude an attempt: the response's status code (100 to 599)",
        ));
    };
    // Checked before the id is opened: nothing in the answer depends on
    // what the attempt holds.
    if let Some(field) = parsed.beside_attempt() {
        return refusal(&InvalidRequest::new(
            field,
            format!(
                "`{field}` is not for a report that concludes an attempt: send `attempt` and `status` only (the attempt names the rest)"
            ),
        ));
    }
    let unknown = |why: &str| {
        refusal(
            &InvalidRequest::new("attempt", format!("no such attempt to conclude: {why}"))
                .with_status(StatusCode::NOT_FOUND),
        )
    };
    let now = app.now_ms();
    let held = match app.reservations.open(id, now) {
        Some(held) if held.reservation.attempt => held,
        Some(_) => {
            return unknown("it is a reservation: settle it with POST /v1/settle");
        }
        None => return unknown("it expired (attempt_ttl), or was never given"),
    };
    let ttl = Reservations::marker_ttl_ms(&held, now);
    // On a task of its own, as a settle: a client gone mid-way cannot cut
    // the conclusion off between the store and its count.
    // Within the request's span: the conclusion's is a child of it.
    let span = crate::traces::current_if(app.traced);
    let conclude = conclude_and_count(app, held, (status, latency_ms), ttl);
    let concluding = tokio::spawn(tracing::Instrument::instrument(conclude, span));
    concluding.await.unwrap_or_else(|error| {
        tracing::error!(%error, "an attempt's task failed");
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    })
}

/// Concludes `attempt` with `status` ([`App::conclude`], which counts how
/// it ended), and tells its route's adaptive valves how long it took when
/// the caller said (once: not on a repeat): the answer.
async fn conclude_and_count(
    app: Arc<App>,
    held: Held,
    (status, latency_ms): (u16, Option<f64>),
    ttl: u64,
) -> Response {
    let policy = app.limiter.policy();
    let concluded = match app
        .conclude(&policy, &held.reservation, Some(status), ttl)
        .await
    {
        Ok(concluded) => concluded,
        Err(error) => {
            return refusal(
                &InvalidRequest::new(
                    "store",
                    format!(
                        "the rate-limit store could not conclude the attempt ({error}); send it again, it applies once"
                    ),
                )
                .with_status(StatusCode::SERVICE_UNAVAILABLE),
            );
        }
    };
    match concluded.marker {
        MarkerAnswer::Conflict => refusal(
            &InvalidRequest::new(
                "attempt",
                "no such attempt to conclude: it was concluded already, with another status, or expired",
            )
            .with_status(StatusCode::NOT_FOUND),
        ),
        MarkerAnswer::Again | MarkerAnswer::Applied => {
            let r = &held.reservation;
            if let (MarkerAnswer::Applied, Some(latency_ms)) = (concluded.marker, latency_ms)
                && let Ok(request) =
                    sluice_core::Request::new(&r.tenant, &r.route, r.subject.as_deref(), 1)
            {
                app.limiter
                    .observe(&policy, &request, latency_ms, Some(status))
                    .await;
            }
            app.reservations.concluded(&held);
            standing_answer(&concluded.decision)
                .map(Body::from)
                .into_response()
        }
    }
}
