//! `/v1/admin/*`: every call needs `Authorization: Bearer <token>` (401
//! otherwise); absent when no token is configured.
//!
//! | call | answer |
//! |---|---|
//! | `PUT /v1/admin/overrides/{tenant}` `{"plan"?, "factor"?, "rules"?, "shadow"?, "expires_in"?}` | 200 the stored override (`ETag`: its version); 400 naming the field; 412 when `If-Match` names another version |
//! | `GET /v1/admin/overrides` | 200 `{"overrides": [...]}` |
//! | `GET /v1/admin/overrides/{tenant}` | 200 the override, 404 when none |
//! | `DELETE /v1/admin/overrides/{tenant}` | 204, 404 when none |
//! | `GET /v1/admin/inspect?tenant=T&route=R&subject=S` | 200 the tenant's buckets as the live policy sees them (any store) |
//! | `GET /v1/admin/heavy-hitters?by=denied\|admitted&limit=N` | 200 `{"window_s", "tenants": [{"tenant", "denied", "admitted"}]}` (see [`crate::admin::heavy`]) |

use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use sluice_core::duration::parse_duration_ms;
use sluice_tower::InvalidRequest;

use crate::admin::{Refused, Shadow, Stored, heavy};
use crate::app::App;

/// The admin routes, behind the bearer-token check.
pub(super) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/v1/admin/overrides", get(list))
        .route(
            "/v1/admin/overrides/{tenant}",
            get(read).put(put).delete(remove),
        )
        .route("/v1/admin/heavy-hitters", get(heavy_hitters))
        .route("/v1/admin/inspect", get(inspect))
}

/// 401 unless the request carries the token.
pub(super) async fn authorise(
    State(app): State<Arc<App>>,
    request: Request,
    next: Next,
) -> Response {
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()))
        .unwrap_or_default();
    if !app.admin.authorised(presented) {
        let problem = InvalidRequest::new(
            "Authorization",
            "the admin API needs `Authorization: Bearer <token>` with the configured token",
        )
        .with_status(StatusCode::UNAUTHORIZED);
        let mut response = problem.answer().map(Body::from).into_response();
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, "Bearer".parse().expect("valid"));
        return response;
    }
    next.run(request).await
}

/// The token of `Bearer <token>`; the scheme's case does not matter
/// (RFC 9110, 11.1).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    scheme.eq_ignore_ascii_case(b"bearer ").then_some(token)
}

/// The `{tenant}` of the path; one that is not UTF-8 is refused as a
/// problem naming it (axum's own answer is plain text).
struct Tenant(String);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Tenant, Response> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(tenant)) => Ok(Tenant(tenant)),
            Err(rejection) => Err(problem(
                "tenant",
                format!("the tenant in the path: {}", rejection.body_text()),
                StatusCode::BAD_REQUEST,
            )),
        }
    }
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an object such as {\"factor\": 2, \"expires_in\": \"2h\"}"
)]
struct PutBody {
    plan: Option<String>,
    factor: Option<f64>,
    rules: Option<serde_json::Value>,
    shadow: Option<Shadow>,
    expires_in: Option<String>,
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(value).unwrap_or_default(),
    )
        .into_response()
}

fn problem(field: &str, detail: String, status: StatusCode) -> Response {
    InvalidRequest::new(field, detail)
        .with_status(status)
        .answer()
        .map(Body::from)
        .into_response()
}

fn refused(why: Refused) -> Response {
    match why {
        Refused::Invalid(field, detail) => problem(&field, detail, StatusCode::BAD_REQUEST),
        Refused::Conflict(version) => problem(
            "If-Match",
            format!("the override changed meanwhile: its version is now {version}; read it again"),
            StatusCode::PRECONDITION_FAILED,
        ),
        Refused::Missing => not_found(),
        Refused::Store(e) => problem(
            "store",
            format!("the store did not answer: {e}; nothing changed"),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
    }
}

fn not_found() -> Response {
    problem(
        "tenant",
        "no override for this tenant".to_owned(),
        StatusCode::NOT_FOUND,
    )
}

/// `If-Match: "7"` (or `7`) as a version; `Err(())` when unreadable
/// (answered by [`bad_if_match`]).
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ()> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().trim_matches('"').parse().ok())
        .map(Some)
        .ok_or(())
}

fn bad_if_match() -> Response {
    problem(
        "If-Match",
        "`If-Match` takes the version an override was read at, such as \"7\"".to_owned(),
        StatusCode::BAD_REQUEST,
    )
}

fn with_etag(stored: &Stored) -> Response {
    let mut response = json(StatusCode::OK, stored);
    if let Ok(etag) = format!("\"{}\"", stored.version).parse() {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

async fn list(State(app): State<Arc<App>>) -> Response {
    match app.admin.list(&app.limiter).await {
        Ok(overrides) => json(
            StatusCode::OK,
            &serde_json::json!({ "overrides": overrides }),
        ),
        Err(why) => refused(why),
    }
}

async fn read(State(app): State<Arc<App>>, Tenant(tenant): Tenant) -> Response {
    match app.admin.get(&app.limiter, &tenant).await {
        Ok(Some(stored)) => with_etag(&stored),
        Ok(None) => not_found(),
        Err(why) => refused(why),
    }
}

async fn remove(
    State(app): State<Arc<App>>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
) -> Response {
    let Ok(expected) = if_match(&headers) else {
        return bad_if_match();
    };
    match app.admin.delete(&app.limiter, &tenant, expected).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(why) => refused(why),
    }
}

async fn put(
    State(app): State<Arc<App>>,
    Tenant(tenant): Tenant,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(expected) = if_match(&headers) else {
        return bad_if_match();
    };
    if let Err(e) = sluice_core::Request::new(&tenant, "GET /", None, 1) {
        return problem("tenant", e.to_string(), StatusCode::BAD_REQUEST);
    }
    let parsed: PutBody = match super::parse_json(&body, "override") {
        Ok(parsed) => parsed,
        Err(problem) => return problem.answer().map(Body::from).into_response(),
    };
    if parsed.plan.is_none()
        && parsed.factor.is_none()
        && parsed.rules.is_none()
        && parsed.shadow.is_none()
    {
        return problem(
            "body",
            "an override needs at least one of `plan`, `factor`, `rules`, `shadow`".to_owned(),
            StatusCode::BAD_REQUEST,
        );
    }
    let expires_at_ms = match &parsed.expires_in {
        None => None,
        Some(text) => match parse_duration_ms(text) {
            Ok(ms) if (1_000..=366 * 86_400_000).contains(&ms) => Some(app.admin.now_ms() + ms),
            Ok(_) => {
                return problem(
                    "expires_in",
                    format!("`expires_in` must be from 1s to 366d, got {text}"),
                    StatusCode::BAD_REQUEST,
                );
            }
            Err(e) => {
                return problem(
                    "expires_in",
                    format!("`expires_in`: {e}"),
                    StatusCode::BAD_REQUEST,
                );
            }
        },
    };
    let wanted = Stored {
        tenant,
        plan: parsed.plan,
        factor: parsed.factor,
        rules: parsed.rules,
        shadow: parsed.shadow.unwrap_or(Shadow::All(false)),
        expires_at_ms,
        version: 0,
    };
    match app.admin.put(&app.limiter, wanted, expected).await {
        Ok(stored) => with_etag(&stored),
        Err(why) => refused(why),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeavyQuery {
    by: Option<String>,
    limit: Option<String>,
}

async fn heavy_hitters(
    State(app): State<Arc<App>>,
    query: Result<axum::extract::Query<HeavyQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(axum::extract::Query(query)) = query else {
        return problem(
            "query",
            "takes `by` (denied or admitted) and `limit` (1 to 1000) only".to_owned(),
            StatusCode::BAD_REQUEST,
        );
    };
    let by = match query.by.as_deref() {
        None | Some("denied") => heavy::By::Denied,
        Some("admitted") => heavy::By::Admitted,
        Some(other) => {
            return problem(
                "by",
                format!("`by` must be `denied` or `admitted`, got `{other}`"),
                StatusCode::BAD_REQUEST,
            );
        }
    };
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => 10,
        Some(Ok(n)) if (1..=1_000).contains(&n) => n,
        Some(_) => {
            return problem(
                "limit",
                format!(
                    "`limit` must be a whole number from 1 to 1000, got `{}`",
                    query.limit.unwrap_or_default()
                ),
                StatusCode::BAD_REQUEST,
            );
        }
    };
    json(
        StatusCode::OK,
        &app.admin.heavy_hitters(&app.limiter, by, limit).await,
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InspectQuery {
    tenant: Option<String>,
    route: Option<String>,
    subject: Option<String>,
}

async fn inspect(
    State(app): State<Arc<App>>,
    query: Result<axum::extract::Query<InspectQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(axum::extract::Query(query)) = query else {
        return problem(
            "query",
            "takes `tenant` (required), `route` and `subject` only".to_owned(),
            StatusCode::BAD_REQUEST,
        );
    };
    let Some(tenant) = query.tenant else {
        return problem(
            "tenant",
            "`tenant` is required".to_owned(),
            StatusCode::BAD_REQUEST,
        );
    };
    let route = query
        .route
        .as_deref()
        .map(|r| sluice_core::route::normalize(r).into_owned());
    if let Err(e) = sluice_core::Request::new(
        &tenant,
        route.as_deref().unwrap_or("*"),
        query.subject.as_deref(),
        1,
    ) {
        return InvalidRequest::from(e)
            .answer()
            .map(Body::from)
            .into_response();
    }
    let policy = app.limiter.policy();
    match crate::inspect::inspect(
        &policy,
        app.limiter.store(),
        &tenant,
        route.as_deref(),
        query.subject.as_deref(),
    )
    .await
    {
        Ok(mut inspection) => {
            inspection.slices = crate::inspect::SliceRow::of(app.limiter.slices_of(&tenant));
            json(StatusCode::OK, &inspection)
        }
        Err(e) => problem(
            "store",
            format!("the store could not be read: {e}"),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
    }
}
