//! `GET /healthz` and `GET /readyz`.

use axum::body::Body;
use axum::http::{Request, StatusCode};

use crate::harness;

#[tokio::test]
async fn health_and_readiness() {
    let h = harness();
    let (response, body) = h
        .send(Request::get("/healthz").body(Body::empty()).unwrap())
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body["status"], "ok");
    let (response, body) = h
        .send(Request::get("/readyz").body(Body::empty()).unwrap())
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body["status"], "ready");
    assert_eq!(body["store"], "memory");
}
