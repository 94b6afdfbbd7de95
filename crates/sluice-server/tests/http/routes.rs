//! What the router matches: an unknown path or method is a problem, and
//! no spelling of a route escapes its limit.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;

use crate::{forward, harness, header};

/// A wrong path or method is a problem too, saying what there is.
#[tokio::test]
async fn an_unknown_path_or_method_is_a_problem_saying_what_there_is() {
    let h = harness();
    let long = format!("/{}", "x".repeat(500));
    for path in ["/v1/chek", "/v1/check/", long.as_str()] {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let (response, problem) = h.send(request).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            header(&response, "content-type"),
            Some("application/problem+json")
        );
        assert_eq!(problem["invalid-params"][0]["name"], "path");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("POST /v1/check"), "{detail}");
        assert!(
            detail.len() < 500,
            "the path shown within a bound: {detail}"
        );
    }
    let request = Request::get("/v1/check").body(Body::empty()).unwrap();
    let (response, problem) = h.send(request).await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&response, "allow"), Some("POST"));
    assert_eq!(problem["invalid-params"][0]["name"], "method");
}

/// Spellings of `POST /v1/invoices` a client might try once the limit is
/// spent (see `sluice_core::route`).
const SPELLINGS: [&str; 14] = [
    "/v1/invoices/",
    "//v1/invoices",
    "/v1//invoices",
    "/v1/%69nvoices",
    "/v1/%69%6e%76%6f%69%63%65%73",
    "/v1/./invoices",
    "/v1/x/../invoices",
    "/v1/%2e/invoices",
    "/v1/invoices;jsessionid=1",
    "/v1;a=1/invoices",
    "/v1/invoices?page=2",
    "/v1/invoices#frag",
    "/v1/invoices/?a#b",
    "http://api.example/v1/invoices",
];

#[tokio::test]
async fn no_spelling_of_a_route_escapes_its_limit_through_forward_auth() {
    let h = harness();
    let exact = [
        ("X-Tenant", "acme"),
        ("X-Forwarded-Method", "POST"),
        ("X-Forwarded-Uri", "/v1/invoices"),
    ];
    for _ in 0..2 {
        assert_eq!(h.send(forward(&exact)).await.0.status(), StatusCode::OK);
    }
    assert_eq!(
        h.send(forward(&exact)).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for method in ["POST", "post", "Post"] {
        for uri in SPELLINGS {
            let headers = [
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", method),
                ("X-Forwarded-Uri", uri),
            ];
            let (response, body) = h.send(forward(&headers)).await;
            assert_eq!(
                response.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "{method} {uri} escaped the exhausted limit"
            );
            assert_eq!(body["policy"], "invoices", "{method} {uri}");
        }
    }
}

#[tokio::test]
async fn no_spelling_of_a_route_escapes_its_limit_through_check() {
    let h = harness();
    let check = |route: String| h.check_json(json!({"tenant": "acme", "route": route}));
    for _ in 0..2 {
        assert_eq!(
            check("POST /v1/invoices".into()).await.0.status(),
            StatusCode::OK
        );
    }
    for method in ["POST", "post"] {
        for path in SPELLINGS {
            let route = format!("{method} {path}");
            let (response, body) = check(route.clone()).await;
            assert_eq!(
                response.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "{route} escaped the exhausted limit"
            );
            assert_eq!(body["policy"], "invoices", "{route}");
        }
    }
}
