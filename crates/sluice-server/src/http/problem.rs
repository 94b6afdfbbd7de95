//! Refused requests (400, 413) as RFC 9457 problem details that name the
//! field at fault.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluice_core::RequestError;

/// A request refused before any decision, with the field at fault.
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
struct Body<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'a str,
    status: u16,
    detail: &'a str,
    #[serde(rename = "invalid-params")]
    invalid_params: [InvalidParam<'a>; 1],
}

impl IntoResponse for InvalidRequest {
    fn into_response(self) -> Response {
        let body = Body {
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
        let mut response = (self.status, json).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        response
    }
}
