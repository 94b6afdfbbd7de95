//! Fuzzing the request parsers: whatever the body or headers, the answer is
//! a decision (200, 429) or a problem naming a field (400, 413), never a
//! 5xx or a panic.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::harness;

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(u64::MAX)),
        "\\PC{0,40}".prop_map(Value::from),
        "[a-z]{250,300}".prop_map(Value::from),
        Just(Value::from("GET /v1/reports/7")),
        Just(Value::from("POST /v1/invoices")),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body: a request object with each member absent or any JSON value,
/// sometimes an unknown member, or raw bytes.
fn body() -> impl Strategy<Value = Vec<u8>> {
    let member = |name: &'static str| {
        prop::option::of(json_value()).prop_map(move |v| v.map(|v| (name.to_owned(), v)))
    };
    let object = (
        member("tenant"),
        member("route"),
        member("subject"),
        member("cost"),
        member("extra"),
    )
        .prop_map(|(a, b, c, d, e)| {
            let members: serde_json::Map<String, Value> =
                [a, b, c, d, e].into_iter().flatten().collect();
            Value::Object(members).to_string().into_bytes()
        });
    // Mostly well formed, with any text in the ids: reaches decisions.
    let plausible = (
        "\\PC{1,40}",
        "[A-Z]{1,7} /[ -~]{0,30}",
        prop::option::of("\\PC{1,20}"),
        1u64..5,
    )
        .prop_map(|(tenant, route, subject, cost)| {
            json!({"tenant": tenant, "route": route, "subject": subject, "cost": cost})
                .to_string()
                .into_bytes()
        });
    prop_oneof![
        4 => object,
        3 => plausible,
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

/// Checks an answer: a decision, or a problem naming a field.
fn judge(status: StatusCode, body: &Value) -> Result<(), TestCaseError> {
    match status.as_u16() {
        200 | 409 | 429 => {
            prop_assert!(body["allowed"].is_boolean() || body.is_null(), "{body}")
        }
        400 | 413 => {
            let name = &body["invalid-params"][0]["name"];
            prop_assert!(name.as_str().is_some_and(|n| !n.is_empty()), "{body}");
        }
        other => prop_assert!(false, "status {other}: {body}"),
    }
    Ok(())
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[ -~]{0,40}".prop_map(String::into_bytes),
        prop::collection::vec(32u8..=255, 0..40),
        Just(b"GET".to_vec()),
        Just(b"/v1/reports/1?x=%zz#frag".to_vec()),
        Just("x".repeat(300).into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn check_answers_every_body_without_a_5xx(body in body()) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let h = harness();
        let (response, value) = runtime.block_on(h.check(body));
        judge(response.status(), &value)?;
    }

    #[test]
    fn acquire_and_release_answer_every_body_without_a_5xx(
        body in body(),
        lease in prop_oneof![
            "\\PC{0,40}".prop_map(|l| json!({"lease": l}).to_string().into_bytes()),
            // Leases of the right form naming random requests and ids.
            (any::<u128>(), "\\PC{0,8}", "\\PC{0,12}").prop_map(|(id, t, r)| {
                let mut bytes = vec![1u8];
                bytes.extend_from_slice(&id.to_be_bytes());
                for part in [t, r] {
                    bytes.push(1);
                    bytes.extend_from_slice(&(part.len() as u16).to_be_bytes());
                    bytes.extend_from_slice(part.as_bytes());
                }
                bytes.push(0);
                use base64::Engine;
                let lease = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
                json!({"lease": lease}).to_string().into_bytes()
            }),
            prop::collection::vec(any::<u8>(), 0..48),
        ],
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let h = harness();
        let (response, value) = runtime.block_on(h.post("/v1/acquire", body));
        judge(response.status(), &value)?;
        let (response, value) = runtime.block_on(h.post("/v1/release", lease));
        match response.status().as_u16() {
            200 => prop_assert_eq!(value, json!({"released": true})),
            400 | 404 => {
                let name = &value["invalid-params"][0]["name"];
                prop_assert!(name.as_str().is_some_and(|n| !n.is_empty()), "{value}");
            }
            other => prop_assert!(false, "status {other}: {value}"),
        }
    }

    #[test]
    fn json_answers_every_body_without_a_5xx(
        descriptors in prop::collection::vec(
            prop::collection::vec(("\\PC{0,12}", "\\PC{0,12}"), 0..4), 0..4),
        domain in prop_oneof![Just("edge".to_owned()), "\\PC{0,10}"],
        hits in prop::option::of(json_value()),
        raw in prop::option::of(prop::collection::vec(any::<u8>(), 0..48)),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let h = harness();
        let body = match raw {
            Some(bytes) => bytes,
            None => {
                let descriptors: Vec<Value> = descriptors
                    .iter()
                    .map(|entries| json!({"entries": entries.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()}))
                    .collect();
                let mut request = json!({"domain": domain, "descriptors": descriptors});
                if let Some(hits) = hits {
                    request["hitsAddend"] = hits;
                }
                request.to_string().into_bytes()
            }
        };
        let request = Request::post("/json").body(Body::from(body)).unwrap();
        let (response, value) = runtime.block_on(h.send(request));
        match response.status().as_u16() {
            200 | 429 => prop_assert!(value["overallCode"].is_string(), "{value}"),
            400 => {
                let name = &value["invalid-params"][0]["name"];
                prop_assert!(name.as_str().is_some_and(|n| !n.is_empty()), "{value}");
            }
            other => prop_assert!(false, "status {other}: {value}"),
        }
    }

    #[test]
    fn forward_auth_answers_every_header_set_without_a_5xx(
        values in prop::collection::vec(prop::option::of(header_value()), 7),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let h = harness();
        let names = ["X-Tenant", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Original-Method", "X-Original-URI", "X-User", "X-Cost"];
        let mut request = Request::get("/v1/forward-auth");
        for (name, value) in names.iter().zip(values) {
            if let Some(value) = value.and_then(|v| axum::http::HeaderValue::from_bytes(&v).ok()) {
                request = request.header(*name, value);
            }
        }
        let (response, value) = runtime.block_on(h.send(request.body(Body::empty()).unwrap()));
        judge(response.status(), &value)?;
    }
}
