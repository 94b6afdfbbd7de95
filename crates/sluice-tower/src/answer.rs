//! A decision as an HTTP answer: the `RateLimit` fields, `Retry-After`, and
//! a JSON or RFC 9457 problem body. The sluice service answers with these
//! too, so an in-process limiter and the service look the same to clients.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use serde::Serialize;
use sluice_core::{Decision, Reason, RequestError};

/// The JSON fields of a decision (SPEC appendix B).
#[derive(Debug, Serialize)]
pub struct DecisionView<'a> {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Why not (`tenant_limit`, `route_limit`, …), `null` when allowed.
    pub reason: Option<&'static str>,
    /// The policy the other fields describe.
    pub policy: Option<&'a str>,
    /// Its capacity.
    pub limit: Option<u64>,
    /// Units left under it.
    pub remaining: Option<u64>,
    /// Milliseconds until it is back to full.
    pub reset_after_ms: u64,
    /// Milliseconds until a denied request would pass.
    pub retry_after_ms: Option<u64>,
    /// Some policy is past the soft-limit threshold.
    pub near_limit: bool,
    /// `null`, or the failure policy (`local`, `allow`, `deny`) that decided
    /// because the store could not.
    pub degraded: Option<&'static str>,
    /// A shadow-mode rule would have denied (present only then).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub shadow_denied: bool,
}

impl<'a> DecisionView<'a> {
    /// The view of a decision.
    pub fn of(decision: &'a Decision<'_>) -> DecisionView<'a> {
        DecisionView {
            allowed: decision.allowed,
            reason: decision.reason.map(Reason::as_str),
            policy: decision.policy().map(|r| r.name()),
            limit: decision.limit(),
            remaining: decision.remaining(),
            reset_after_ms: decision.reset_after_ms(),
            retry_after_ms: decision.retry_after_ms(),
            near_limit: decision.near_limit,
            degraded: decision.degraded.map(|p| p.name()),
            shadow_denied: decision.shadow_denied,
        }
    }
}

/// RFC 9457 body of a 429, with the decision's fields as extensions.
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(rename = "violated-policies")]
    violated_policies: Vec<&'a str>,
    #[serde(flatten)]
    decision: DecisionView<'a>,
}

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// No registered problem type says "duplicate submission": a plain 409.
const DUPLICATE: &str = "about:blank";
const REDUCED_CAPACITY: &str =
    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity";

static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// Adds `RateLimit-Policy`, `RateLimit` and (when denied) `Retry-After`.
pub fn add_headers(decision: &Decision<'_>, headers: &mut HeaderMap) {
    Fields::of(decision).add_to(headers);
}

/// The header fields of a decision, made before the response they go on
/// exists.
#[derive(Debug, Clone, Default)]
pub struct Fields {
    policy: Option<HeaderValue>,
    ratelimit: Option<HeaderValue>,
    retry_after: Option<HeaderValue>,
}

impl Fields {
    /// The fields of `decision`.
    pub fn of(decision: &Decision<'_>) -> Fields {
        let fields = sluice_core::headers::Fields::of(decision);
        let value = |text: &str| {
            (!text.is_empty())
                .then(|| HeaderValue::from_str(text).ok())
                .flatten()
        };
        Fields {
            policy: value(fields.policy),
            ratelimit: value(&fields.ratelimit),
            retry_after: fields.retry_after.map(HeaderValue::from),
        }
    }

    /// Sets them on `headers`, replacing any there.
    pub fn add_to(self, headers: &mut HeaderMap) {
        if let Some(value) = self.policy {
            headers.insert(RATELIMIT_POLICY.clone(), value);
        }
        if let Some(value) = self.ratelimit {
            headers.insert(RATELIMIT.clone(), value);
        }
        if let Some(value) = self.retry_after {
            headers.insert(header::RETRY_AFTER, value);
        }
    }
}

/// The status of a decision's answer: 200, 409 for a duplicate
/// submission, else 429.
pub fn status_of(decision: &Decision<'_>) -> StatusCode {
    match (decision.allowed, decision.reason) {
        (true, _) => StatusCode::OK,
        (false, Some(Reason::Duplicate)) => StatusCode::CONFLICT,
        (false, _) => StatusCode::TOO_MANY_REQUESTS,
    }
}

/// The decision as a whole answer: 200 with it as JSON, or 429 (409 for a
/// duplicate) with it as problem details; both with the headers of
/// [`add_headers`].
pub fn decision_answer(decision: &Decision<'_>) -> Response<Vec<u8>> {
    let view = DecisionView::of(decision);
    let status = status_of(decision);
    let (content_type, body) = if decision.allowed {
        ("application/json", serde_json::to_vec(&view))
    } else {
        (
            "application/problem+json",
            serde_json::to_vec(&problem(decision, view)),
        )
    };
    answer(status, content_type, body.unwrap_or_default(), |headers| {
        add_headers(decision, headers)
    })
}

/// The rules' state after a cost was recorded (a settle, a report): 200
/// with the decision fields as JSON and the `RateLimit` fields, whether or
/// not a request would pass now (`allowed`, `retry_after_ms` say; a
/// recorded cost is never refused).
pub fn standing_answer(decision: &Decision<'_>) -> Response<Vec<u8>> {
    let body = serde_json::to_vec(&DecisionView::of(decision)).unwrap_or_default();
    answer(StatusCode::OK, "application/json", body, |headers| {
        let mut fields = Fields::of(decision);
        fields.retry_after = None;
        fields.add_to(headers);
    })
}

fn problem<'a>(decision: &'a Decision<'_>, view: DecisionView<'a>) -> Problem<'a> {
    let policy = decision.policy().map_or("", |r| r.name());
    let (kind, title, detail) = match decision.reason {
        Some(Reason::StoreUnavailable) => (
            REDUCED_CAPACITY,
            "Request cannot be satisfied due to temporarily reduced capacity",
            "the rate-limit store is unavailable and the failure policy denies".to_owned(),
        ),
        Some(Reason::Duplicate) => (
            DUPLICATE,
            "The same submission was accepted moments ago",
            format!(
                "a request with this fingerprint was admitted less than the `{policy}` window ago"
            ),
        ),
        Some(Reason::CostExceedsCapacity) => (
            QUOTA_EXCEEDED,
            "Request cannot be satisfied as assigned quota has been exceeded",
            format!(
                "the request's cost is above the capacity of policy `{policy}`: it can never pass"
            ),
        ),
        _ => (
            QUOTA_EXCEEDED,
            "Request cannot be satisfied as assigned quota has been exceeded",
            format!("quota of policy `{policy}` exceeded"),
        ),
    };
    Problem {
        kind,
        title,
        detail,
        status: status_of(decision).as_u16(),
        violated_policies: decision.violated_policies().collect(),
        decision: view,
    }
}

fn answer(
    status: StatusCode,
    content_type: &'static str,
    body: Vec<u8>,
    headers: impl FnOnce(&mut HeaderMap),
) -> Response<Vec<u8>> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    let map = response.headers_mut();
    map.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers(map);
    response
}

/// A request refused before any decision, with the field at fault: 400
/// (413 for a body over the limit) with RFC 9457 problem details.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRequest {
    /// 400, or 413 for a body over the limit.
    pub status: StatusCode,
    /// The field (JSON member or header) at fault.
    pub field: String,
    /// What is wrong and what is allowed.
    pub detail: String,
}

impl InvalidRequest {
    /// A problem with `field`.
    pub fn new(field: impl Into<String>, detail: impl Into<String>) -> InvalidRequest {
        InvalidRequest {
            status: StatusCode::BAD_REQUEST,
            field: field.into(),
            detail: detail.into(),
        }
    }

    /// The same problem answered with `status` (413, 408, …) instead of 400.
    pub fn with_status(mut self, status: StatusCode) -> InvalidRequest {
        self.status = status;
        self
    }

    /// The answer.
    pub fn answer(&self) -> Response<Vec<u8>> {
        let body = InvalidBody {
            kind: "about:blank",
            title: self.status.canonical_reason().unwrap_or("Bad Request"),
            status: self.status.as_u16(),
            detail: &self.detail,
            invalid_params: [InvalidParam {
                name: &self.field,
                reason: &self.detail,
            }],
        };
        let json = serde_json::to_vec(&body).unwrap_or_default();
        answer(self.status, "application/problem+json", json, |_| {})
    }
}

impl From<RequestError> for InvalidRequest {
    fn from(e: RequestError) -> InvalidRequest {
        InvalidRequest::new(e.field, e.to_string())
    }
}

#[derive(Serialize)]
struct InvalidParam<'a> {
    name: &'a str,
    reason: &'a str,
}

#[derive(Serialize)]
struct InvalidBody<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(rename = "invalid-params")]
    invalid_params: [InvalidParam<'a>; 1],
}
