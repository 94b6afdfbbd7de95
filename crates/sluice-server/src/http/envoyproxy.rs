//! envoyproxy/ratelimit's HTTP endpoints, so that its probes, scripts and
//! debugging habits keep working:
//!
//! - `GET /healthcheck`: `OK` (200) while the service can decide, else 500;
//! - `POST /json`: `ShouldRateLimit` in protobuf's JSON form (field names
//!   in lowerCamelCase or as in the `.proto`, enums by name), answered the
//!   same way, 429 when over the limit, 400 (problem details naming the
//!   field) for a request it refuses;
//! - `GET /rlconfig`: the loaded envoyproxy/ratelimit limits, one per line
//!   (no secrets: keys and limits only).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::app::App;
use crate::envoy::RateLimiter;

pub(super) async fn healthcheck(State(app): State<Arc<App>>) -> (StatusCode, &'static str) {
    if app.ready() {
        (StatusCode::OK, "OK")
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT OK")
    }
}

pub(super) async fn rlconfig(State(app): State<Arc<App>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        app.limiter.policy().descriptors().dump(),
    )
}

pub(super) async fn json(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let request = match crate::http::parse_json::<JsonRequest>(&body, "request") {
        Ok(request) => request.into_proto(),
        Err(problem) => return bad_request(&problem.field, &problem.detail),
    };
    let request = match request {
        Ok(request) => request,
        Err((field, message)) => return bad_request(&field, &message),
    };
    match RateLimiter::new(app).should_rate_limit(request).await {
        Ok(response) => {
            let status = if response.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(response_json(&response))).into_response()
        }
        Err(status) => {
            // The message names the field (`descriptors[0].entries`, …).
            let message = status.message();
            let field = message
                .strip_prefix('`')
                .and_then(|m| m.split_once('`'))
                .map_or("body", |(f, _)| f);
            bad_request(field, message)
        }
    }
}

/// A 400 problem naming `field`, as every sluice endpoint refuses input.
fn bad_request(field: &str, message: &str) -> Response {
    super::respond::refusal(&sluice_tower::InvalidRequest::new(field, message))
}

// Each says what it expects in the client's terms (serde's default names
// the Rust type).
#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a RateLimitRequest object: {\"domain\": ..., \"descriptors\": [...]}"
)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    /// A `uint32`: a number, or a string of one.
    #[serde(default, alias = "hits_addend")]
    #[serde(rename = "hitsAddend")]
    hits_addend: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a descriptor object: {\"entries\": [...]}"
)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    /// A `UInt64Value`: a number, or a string of one.
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Value>,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "an entry object: {\"key\": ..., \"value\": ...}"
)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a limit object: {\"requestsPerUnit\": ..., \"unit\": ...}"
)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: u32,
    /// By name (`SECOND`) or number.
    #[serde(default)]
    unit: Option<Value>,
}

impl JsonRequest {
    /// The request as protobuf, or the field at fault and why.
    fn into_proto(self) -> Result<RateLimitRequest, (String, String)> {
        let descriptors = self
            .descriptors
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                // A `UInt64Value` (anything else was read as absent
                // before: a cost of 1).
                let hits_addend = whole(d.hits_addend, || format!("descriptors[{i}].hits_addend"))?
                    .map(|value| UInt64Value { value });
                let limit = d
                    .limit
                    .map(|o| {
                        let field = || format!("descriptors[{i}].limit.unit");
                        let unit = match &o.unit {
                            None => Ok(Unit::Unknown as i32),
                            Some(Value::Number(n)) => {
                                Ok(n.as_i64().and_then(|n| i32::try_from(n).ok()).unwrap_or(-1))
                            }
                            Some(Value::String(name)) => {
                                Unit::from_str_name(name).map(|u| u as i32).ok_or_else(|| {
                                    let shown = crate::shown(name);
                                    (field(), format!("`{}`: unknown unit `{shown}`", field()))
                                })
                            }
                            Some(_) => Err((
                                field(),
                                format!("`{}` must be a unit name or number", field()),
                            )),
                        }?;
                        Ok::<_, (String, String)>(RateLimitOverride {
                            requests_per_unit: o.requests_per_unit,
                            unit,
                        })
                    })
                    .transpose()?;
                Ok(RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit,
                    hits_addend,
                    ..Default::default()
                })
            })
            .collect::<Result<Vec<_>, (String, String)>>()?;
        let hits_addend = whole(self.hits_addend, || "hitsAddend".to_owned())?
            .map_or(Ok(0), u32::try_from)
            .map_err(|_| {
                let message = "`hitsAddend` must be at most 4294967295".to_owned();
                ("hitsAddend".to_owned(), message)
            })?;
        Ok(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend,
        })
    }
}

/// A whole number as protobuf's JSON writes one (a number, or a string of
/// one); `None` when absent; the field (named by `field`) and why when it
/// is anything else.
fn whole(
    value: Option<Value>,
    field: impl Fn() -> String,
) -> Result<Option<u64>, (String, String)> {
    let value = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(value) => value,
    };
    let number = match &value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    number.map(Some).ok_or_else(|| {
        let message = format!(
            "`{}` must be a whole number (or a string of one), got {}",
            field(),
            crate::shown(&value.to_string())
        );
        (field(), message)
    })
}

/// The answer in protobuf's JSON form: default values left out, enums by
/// name, durations as seconds (`"12s"`, `"0.500s"`).
fn response_json(response: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert(
        "overallCode".into(),
        json!(code_name(response.overall_code)),
    );
    let statuses: Vec<Value> = response.statuses.iter().map(status_json).collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Value::Array(statuses));
    }
    for (name, headers) in [
        ("responseHeadersToAdd", &response.response_headers_to_add),
        ("requestHeadersToAdd", &response.request_headers_to_add),
    ] {
        let headers: Vec<Value> = headers
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        if !headers.is_empty() {
            out.insert(name.into(), Value::Array(headers));
        }
    }
    Value::Object(out)
}

fn status_json(status: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    out.insert("code".into(), json!(code_name(status.code)));
    if let Some(limit) = &status.current_limit {
        let mut l = Map::new();
        if !limit.name.is_empty() {
            l.insert("name".into(), json!(limit.name));
        }
        if limit.requests_per_unit != 0 {
            l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
        }
        let unit = Unit::try_from(limit.unit).unwrap_or(Unit::Unknown);
        if unit != Unit::Unknown {
            l.insert("unit".into(), json!(unit.as_str_name()));
        }
        out.insert("currentLimit".into(), Value::Object(l));
    }
    if status.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(status.limit_remaining));
    }
    if let Some(d) = &status.duration_until_reset {
        let text = if d.nanos == 0 {
            format!("{}s", d.seconds)
        } else {
            format!("{}.{:03}s", d.seconds, d.nanos / 1_000_000)
        };
        out.insert("durationUntilReset".into(), json!(text));
    }
    Value::Object(out)
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).unwrap_or(Code::Unknown).as_str_name()
}
