//! The body `/v1/check`, `/v1/acquire` and `/v1/report` share, read and
//! checked: each problem names its member.

use std::borrow::Cow;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use serde::Deserialize;
use sluice_core::Request;
use sluice_core::request::{MAX_COST, check_cost_signed};
use sluice_tower::InvalidRequest;

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object such as {\"tenant\": \"acme\", \"route\": \"GET /v1/things\"}"
)]
pub(super) struct CheckBody<'a> {
    #[serde(borrow)]
    tenant: Option<Cow<'a, str>>,
    #[serde(borrow)]
    route: Option<Cow<'a, str>>,
    #[serde(borrow)]
    subject: Option<Cow<'a, str>>,
    cost: Option<serde_json::Number>,
    #[serde(borrow)]
    fingerprint: Option<Cow<'a, str>>,
    /// Hold the cost as an estimate and answer a reservation to settle.
    pub(super) reserve: Option<bool>,
    /// The response's status (`/v1/report` only).
    pub(super) status: Option<serde_json::Number>,
    /// The attempt the check answered (`/v1/report` only).
    pub(super) attempt: Option<String>,
    /// How long the request took downstream (`/v1/report` only).
    pub(super) latency_ms: Option<serde_json::Number>,
}

/// `status` and `attempt` belong to `/v1/report`, which records a cost or
/// concludes an attempt once the response is known.
pub(super) fn no_status(body: &CheckBody<'_>) -> Result<(), InvalidRequest> {
    if body.status.is_some() {
        return Err(InvalidRequest::new(
            "status",
            "`status` is only for POST /v1/report, once the response is known",
        ));
    }
    if body.attempt.is_some() {
        return Err(InvalidRequest::new(
            "attempt",
            "`attempt` is only for POST /v1/report, which concludes it once the response is known",
        ));
    }
    if body.latency_ms.is_some() {
        return Err(InvalidRequest::new(
            "latency_ms",
            "`latency_ms` is only for POST /v1/report, /v1/settle and /v1/release, once the response is known",
        ));
    }
    Ok(())
}

/// The longest latency a caller may report (ms): an hour.
const MOST_LATENCY_MS: f64 = 3_600_000.0;

/// A response's `status`, when given: an HTTP status code.
pub(super) fn status_code(raw: Option<&serde_json::Number>) -> Result<Option<u16>, InvalidRequest> {
    let Some(n) = raw else { return Ok(None) };
    whole_number(n)
        .and_then(|s| u16::try_from(s).ok())
        .filter(|s| (100..=599).contains(s))
        .map(Some)
        .ok_or_else(|| {
            InvalidRequest::new(
                "status",
                format!("`status` must be an HTTP status code from 100 to 599, got {n}"),
            )
        })
}

/// A request's `latency_ms` downstream, when given: 0 to an hour.
pub(super) fn latency(raw: Option<&serde_json::Number>) -> Result<Option<f64>, InvalidRequest> {
    let Some(n) = raw else { return Ok(None) };
    n.as_f64()
        .filter(|ms| (0.0..=MOST_LATENCY_MS).contains(ms))
        .map(Some)
        .ok_or_else(|| {
            InvalidRequest::new(
                "latency_ms",
                format!("`latency_ms` must be a number of milliseconds from 0 to 3600000, got {n}"),
            )
        })
}

/// The body as read, or the refusal of a body that could not be (too
/// large, too slow).
pub(super) fn bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, InvalidRequest> {
    body.map_err(|rejection| {
        InvalidRequest::new("body", rejection.body_text()).with_status(rejection.status())
    })
}

/// [`parse`], with the route in its one spelling (see
/// `sluice_core::route`).
pub(super) fn parse_normalized(body: &[u8]) -> Result<CheckBody<'_>, InvalidRequest> {
    let mut parsed = parse(body)?;
    if let Some(route) = &mut parsed.route
        && let Cow::Owned(normal) = sluice_core::route::normalize(route)
    {
        *route = Cow::Owned(normal);
    }
    Ok(parsed)
}

/// `x` as an integer when it is one (small enough to convert exactly).
fn whole(x: f64) -> Option<i128> {
    (x.fract() == 0.0 && x.abs() < 2f64.powi(63)).then_some(x as i128)
}

/// The body of `/v1/check` (and `/v1/acquire`), each problem naming its
/// member.
fn parse(body: &[u8]) -> Result<CheckBody<'_>, InvalidRequest> {
    crate::http::parse_json(body, "JSON body")
}

pub(super) fn to_request<'a>(body: &'a CheckBody<'a>) -> Result<Request<'a>, InvalidRequest> {
    let (tenant, route) = tenant_and_route(body)?;
    let cost = match &body.cost {
        None => 1,
        Some(n) => match whole_number(n) {
            Some(cost) => check_cost_signed(cost)?,
            None => {
                return Err(InvalidRequest::new(
                    "cost",
                    format!("`cost` must be a whole number from 1 to {MAX_COST}, got {n}"),
                ));
            }
        },
    };
    Ok(Request::new(tenant, route, body.subject.as_deref(), cost)?
        .with_fingerprint(body.fingerprint.as_deref())?)
}

/// A JSON number as a whole number, when it is one: JSON has one kind of
/// number, so 2.0 and 2e0 are the whole number 2 (as a client that
/// computes a cost in floating point sends it).
pub(super) fn whole_number(n: &serde_json::Number) -> Option<i128> {
    n.as_i64()
        .map(i128::from)
        .or_else(|| n.as_u64().map(i128::from))
        .or_else(|| whole(n.as_f64()?))
}

/// The tenant, route and subject of a body, as `/v1/report` reads them
/// with a cost already spent (1 to `MAX_REPORTED_COST`).
pub(super) fn to_spent_request<'a>(body: &'a CheckBody<'a>) -> Result<Request<'a>, InvalidRequest> {
    use sluice_core::request::MAX_REPORTED_COST;
    let (tenant, route) = tenant_and_route(body)?;
    let cost = match &body.cost {
        None => 1,
        Some(n) => whole_number(n)
            .and_then(|c| u64::try_from(c).ok())
            .filter(|c| (1..=MAX_REPORTED_COST).contains(c))
            .ok_or_else(|| {
                InvalidRequest::new(
                    "cost",
                    format!("`cost` must be a whole number from 1 to {MAX_REPORTED_COST}, got {n}"),
                )
            })?,
    };
    Ok(Request::spent(
        tenant,
        route,
        body.subject.as_deref(),
        cost,
    )?)
}

impl CheckBody<'_> {
    /// The first field besides `attempt` and `status` the body carries:
    /// a report that concludes an attempt carries no other (the attempt
    /// names its tenant, route, subject and cost).
    pub(super) fn beside_attempt(&self) -> Option<&'static str> {
        [
            ("tenant", self.tenant.is_some()),
            ("route", self.route.is_some()),
            ("subject", self.subject.is_some()),
            ("cost", self.cost.is_some()),
            ("fingerprint", self.fingerprint.is_some()),
            ("reserve", self.reserve.is_some()),
        ]
        .into_iter()
        .find_map(|(field, given)| given.then_some(field))
    }
}

/// The body's tenant and route, both required.
/// The request a body names (tenant, route, subject; a cost of 1), for
/// what its downstream showed ([`Limiter::observe`](sluice_store::Limiter::observe)).
pub(super) fn observed<'a>(body: &'a CheckBody<'a>) -> Option<Request<'a>> {
    let (tenant, route) = tenant_and_route(body).ok()?;
    Request::new(tenant, route, body.subject.as_deref(), 1).ok()
}

fn tenant_and_route<'a>(body: &'a CheckBody<'a>) -> Result<(&'a str, &'a str), InvalidRequest> {
    let tenant = body
        .tenant
        .as_deref()
        .ok_or_else(|| InvalidRequest::new("tenant", "`tenant` is required"))?;
    let route = body.route.as_deref().ok_or_else(|| {
        InvalidRequest::new("route", "`route` is required, e.g. \"POST /v1/invoices\"")
    })?;
    Ok((tenant, route))
}
