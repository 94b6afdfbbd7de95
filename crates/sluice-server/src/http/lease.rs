//! `POST /v1/acquire` (the body of `/v1/check`) takes a lease of every
//! concurrency rule that applies, answering the decision with `"lease"`;
//! `POST /v1/release` `{"lease": "..."}` gives it back: 200
//! `{"released": true}`, or 404 when the lease is unknown, expired or
//! released already (releasing twice is harmless).
//!
//! A lease is opaque to clients: 128 random bits naming it in the store,
//! the tenant and subject it was taken for, and the concurrency rules it
//! holds (scope, pattern and name: what names their keys), so that any
//! instance releases it whatever the policy is by then (an override or a
//! reload may have changed the tenant's rules). Without its random bits a
//! lease cannot be released, so a client can only give back its own.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use sluice_core::{Request, Scope};
use sluice_store::limiter::Lease;
use sluice_tower::InvalidRequest;
use sluice_tower::answer::decision_answer;

use super::after::with_fields;
use super::body::{bytes, no_status, parse_normalized, status_code, to_request};
use super::respond::refusal;
use crate::app::App;

/// A lease naming the request it was taken for (tenant, route, subject):
/// released by the rules the current policy applies to that request. Still
/// read, for leases given before [`HOLDING`]; written only when a lease
/// holding its rules would be too long.
const REQUEST: u8 = 1;

/// A lease naming its tenant, subject and the rules it holds. Still read,
/// for leases given before [`HOLDING_SINCE`].
const HOLDING: u8 = 2;

/// A lease naming its tenant, subject, route, when it was taken and the
/// rules it holds: its release tells adaptive valves how long it was held.
const HOLDING_SINCE: u8 = 3;

/// Longest lease text accepted (a `/v1/release` body is at most 16 KiB):
/// a lease holding more than fits (over a hundred concurrency rules on one
/// request) is written as [`REQUEST`].
const MAX_LEASE_CHARS: usize = 12 * 1024;

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
    if let Err(problem) = no_status(&parsed) {
        return refusal(&problem);
    }
    let request = match to_request(&parsed) {
        Ok(request) => request,
        Err(problem) => return refusal(&problem),
    };
    let reserving = parsed.reserve == Some(true);
    let started = std::time::Instant::now();
    let policy = app.limiter.policy();
    let acquiring = app.limiter.acquire(&policy, &request);
    let (decision, lease) = if reserving {
        app.decide_reserving(&request, started, acquiring).await
    } else {
        app.decide(Some(&request), started, acquiring).await
    };
    let answer = decision_answer(&decision);
    if !decision.allowed {
        return answer.map(Body::from).into_response();
    }
    // The decision's fields, and the lease (null when no concurrency rule
    // applies: nothing to release), and the reservation when asked for.
    let lease = lease.map_or(serde_json::Value::Null, |lease| {
        encode(&lease, &request, app.now_ms()).into()
    });
    let mut fields = vec![("lease", lease)];
    if let Some(reservation) = reserving
        .then(|| app.limiter.reserve(&policy, &request, &decision))
        .flatten()
    {
        fields.push(("reservation", app.reservations.give(reservation).into()));
    }
    if let Some(attempt) = app.attempt(&policy, &request, &decision) {
        fields.push(("attempt", attempt.into()));
    }
    with_fields(answer, fields)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, expecting = "an object")]
struct ReleaseBody {
    lease: Option<String>,
    /// The response's status, when known (adaptive valves count 5xx and
    /// 429 as failures).
    status: Option<serde_json::Number>,
}

pub(super) async fn release(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match bytes(body) {
        Ok(body) => body,
        Err(problem) => return refusal(&problem),
    };
    let (lease, status) = match serde_json::from_slice::<ReleaseBody>(&body) {
        Ok(ReleaseBody {
            lease: Some(lease),
            status,
        }) => match status_code(status.as_ref()) {
            Ok(status) => (lease, status),
            Err(problem) => return refusal(&problem),
        },
        Ok(ReleaseBody { lease: None, .. }) => {
            return refusal(&InvalidRequest::new(
                "lease",
                "`lease` is required: the lease /v1/acquire answered",
            ));
        }
        Err(e) => {
            return refusal(&InvalidRequest::new(
                "body",
                format!(
                    "malformed JSON body: {e}; expected {{\"lease\": \"...\"}}, and `status` when known"
                ),
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
    let Some(given) = decode(&lease) else {
        return unknown();
    };
    let lease = match &given.held {
        Held::Rules(rules) => Lease::rebuilt(
            given.id,
            rules.iter().map(|(s, p, n)| (*s, p.as_str(), n.as_str())),
        ),
        Held::OfRoute(route) => {
            let Ok(request) = Request::new(&given.tenant, route, given.subject.as_deref(), 1)
            else {
                return unknown();
            };
            Lease::under(&app.limiter.policy(), &request, given.id)
        }
    };
    match app
        .limiter
        .release(&given.tenant, given.subject.as_deref(), &lease)
        .await
    {
        Ok(true) => {
            // How long it was held: its downstream's latency, for the
            // adaptive valves of its route.
            if let (Some(route), Some(taken)) = (&given.route, given.taken_ms)
                && let Ok(request) = Request::new(&given.tenant, route, given.subject.as_deref(), 1)
            {
                let held = app.now_ms().saturating_sub(taken) as f64;
                let policy = app.limiter.policy();
                app.limiter.observe(&policy, &request, held, status).await;
            }
            released()
        }
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

/// The answer to a release that released.
fn released() -> Response {
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        r#"{"released":true}"#,
    )
        .into_response()
}

/// What a lease names.
#[derive(Debug, PartialEq, Eq)]
struct Given {
    id: u128,
    tenant: String,
    subject: Option<String>,
    held: Held,
    /// Its route and when it was taken (ms), when it says
    /// ([`HOLDING_SINCE`]).
    route: Option<String>,
    taken_ms: Option<u64>,
}

/// What a lease holds.
#[derive(Debug, PartialEq, Eq)]
enum Held {
    /// Its rules: scope, pattern and name.
    Rules(Vec<(Scope, String, String)>),
    /// Whatever concurrency rules the policy applies to this route (a lease
    /// in the [`REQUEST`] format).
    OfRoute(String),
}

/// Scopes as a lease writes them.
const SCOPES: [Scope; 6] = [
    Scope::Tenant,
    Scope::Route,
    Scope::Subject,
    Scope::Global,
    Scope::Descriptor,
    Scope::Dedupe,
];

/// `lease`, taken for `request` at `taken_ms`, as clients hold it.
fn encode(lease: &Lease, request: &Request<'_>, taken_ms: u64) -> String {
    let mut bytes = Vec::with_capacity(128);
    bytes.push(HOLDING_SINCE);
    bytes.extend_from_slice(&lease.id().to_be_bytes());
    put(&mut bytes, Some(request.tenant));
    put(&mut bytes, request.subject);
    put(&mut bytes, Some(request.route));
    bytes.extend_from_slice(&taken_ms.to_be_bytes());
    bytes.extend_from_slice(&(lease.held().len() as u16).to_be_bytes());
    for (scope, pattern, name) in lease.held() {
        let scope = SCOPES.iter().position(|s| *s == scope).unwrap_or(0);
        bytes.push(scope as u8);
        put(&mut bytes, Some(pattern));
        put(&mut bytes, Some(name));
    }
    let text = URL_SAFE_NO_PAD.encode(bytes);
    if text.len() <= MAX_LEASE_CHARS {
        return text;
    }
    let mut bytes = Vec::with_capacity(64);
    bytes.push(REQUEST);
    bytes.extend_from_slice(&lease.id().to_be_bytes());
    for part in [Some(request.tenant), Some(request.route), request.subject] {
        put(&mut bytes, part);
    }
    URL_SAFE_NO_PAD.encode(bytes)
}

/// `text` (or its absence) with its length before it.
fn put(bytes: &mut Vec<u8>, text: Option<&str>) {
    match text {
        None => bytes.push(0),
        Some(text) => {
            bytes.push(1);
            bytes.extend_from_slice(&(text.len() as u16).to_be_bytes());
            bytes.extend_from_slice(text.as_bytes());
        }
    }
}

/// What a lease names; `None` for anything sluice did not give.
fn decode(lease: &str) -> Option<Given> {
    if lease.len() > MAX_LEASE_CHARS {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(lease).ok()?;
    let mut read = Reader(&bytes);
    let version = read.take(1)?[0];
    let id = u128::from_be_bytes(read.take(16)?.try_into().ok()?);
    let given = match version {
        REQUEST => {
            let tenant = read.text()??;
            let route = read.text()??;
            Given {
                id,
                tenant,
                subject: read.text()?,
                held: Held::OfRoute(route),
                route: None,
                taken_ms: None,
            }
        }
        HOLDING | HOLDING_SINCE => {
            let tenant = read.text()??;
            let subject = read.text()?;
            let (route, taken_ms) = if version == HOLDING_SINCE {
                let route = read.text()??;
                let taken = u64::from_be_bytes(read.take(8)?.try_into().ok()?);
                (Some(route), Some(taken))
            } else {
                (None, None)
            };
            let count = u16::from_be_bytes(read.take(2)?.try_into().ok()?);
            let mut rules = Vec::with_capacity(usize::from(count).min(256));
            for _ in 0..count {
                let scope = *SCOPES.get(usize::from(read.take(1)?[0]))?;
                let pattern = read.text()??;
                rules.push((scope, pattern, read.text()??));
            }
            Given {
                id,
                tenant,
                subject,
                held: Held::Rules(rules),
                route,
                taken_ms,
            }
        }
        _ => return None,
    };
    read.0.is_empty().then_some(given)
}

/// The bytes of a lease not read yet.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (taken, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(taken)
    }

    /// What [`put`] wrote.
    fn text(&mut self) -> Option<Option<String>> {
        if self.take(1)?[0] == 0 {
            return Some(None);
        }
        let len = usize::from(u16::from_be_bytes(self.take(2)?.try_into().ok()?));
        Some(Some(String::from_utf8(self.take(len)?.to_vec()).ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_reads_back_and_nothing_else_does() {
        let request = Request::new("acme", "POST /export", Some("u-1"), 1).unwrap();
        let held = [
            (Scope::Route, "POST /export", "exports"),
            (Scope::Global, "POST /export", "all"),
            (Scope::Subject, "*", "mine"),
        ];
        let lease = Lease::rebuilt(0xfeed_u128 << 64 | 7, held);
        let text = encode(&lease, &request, 1_764_460_800_123);
        let given = decode(&text).unwrap();
        let rules = Held::Rules(
            held.iter()
                .map(|(s, p, n)| (*s, p.to_string(), n.to_string()))
                .collect(),
        );
        assert_eq!(
            given,
            Given {
                id: 0xfeed_u128 << 64 | 7,
                tenant: "acme".into(),
                subject: Some("u-1".into()),
                held: rules,
                route: Some("POST /export".into()),
                taken_ms: Some(1_764_460_800_123),
            }
        );
        let none = Request::new("acme", "GET /", None, 1).unwrap();
        assert_eq!(decode(&encode(&lease, &none, 1)).unwrap().subject, None);
        // A lease given before leases said when they were taken: released
        // as ever, telling no hold time.
        let mut older = vec![HOLDING];
        older.extend_from_slice(&7u128.to_be_bytes());
        put(&mut older, Some("acme"));
        put(&mut older, None);
        older.extend_from_slice(&1u16.to_be_bytes());
        older.push(3);
        put(&mut older, Some("POST /export"));
        put(&mut older, Some("all"));
        let older = decode(&URL_SAFE_NO_PAD.encode(older)).unwrap();
        assert_eq!((older.id, older.route, older.taken_ms), (7, None, None));
        assert_eq!(
            older.held,
            Held::Rules(vec![(Scope::Global, "POST /export".into(), "all".into())])
        );
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

    /// A lease holding more rules than a lease can name is written, and
    /// read, as the request it was taken for; so are leases given before
    /// leases named their rules.
    #[test]
    fn a_lease_too_long_to_name_its_rules_names_its_request() {
        let request = Request::new("acme", "POST /export", None, 1).unwrap();
        let names: Vec<String> = (0..200).map(|i| format!("{i:0>60}")).collect();
        let lease = Lease::rebuilt(
            9,
            names
                .iter()
                .map(|n| (Scope::Route, "POST /export", n.as_str())),
        );
        let text = encode(&lease, &request, 5);
        assert!(text.len() <= MAX_LEASE_CHARS);
        assert_eq!(
            decode(&text).unwrap(),
            Given {
                id: 9,
                tenant: "acme".into(),
                subject: None,
                held: Held::OfRoute("POST /export".into()),
                route: None,
                taken_ms: None,
            }
        );
    }
}
