//! Liveness and readiness.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use crate::app::App;

/// The process is up.
pub(super) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// The process can decide with its store: 200 when the store answers and
/// the circuit breaker is closed, else 503. The process keeps deciding
/// either way (under the failure policy while not ready).
pub(super) async fn readyz(State(app): State<Arc<App>>) -> (StatusCode, Json<Value>) {
    let ready = app.ready();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if ready { "ready" } else { "not_ready" },
        "store": sluice_store::Store::name(app.limiter.store()),
        "store_reachable": app.store_reachable.load(std::sync::atomic::Ordering::Relaxed),
        "breaker": app.limiter.breaker_state().as_str(),
        "live_instances": app.limiter.live_instances(),
        "other_peppers": app.other_peppers.load(std::sync::atomic::Ordering::Relaxed),
    });
    let mut body = body;
    if let Some(peers) = app.regions.get() {
        let peers: Vec<Value> = peers
            .snapshot()
            .into_iter()
            .map(|p| {
                json!({
                    "region": p.name,
                    "cut_off": p.cut_off,
                    "foreign": p.foreign,
                    "last_heard_ms": p.last_heard_ms,
                    "last_shipped_ms": p.last_shipped_ms,
                })
            })
            .collect();
        body["regions"] = Value::Array(peers);
    }
    (status, Json(body))
}

/// Prometheus metrics, text format.
pub(super) async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    app.metrics.valves(&app.limiter.valve_levels());
    app.metrics.adaptive(&app.limiter.adaptive_levels());
    app.metrics.slices(&app.limiter.slice_levels());
    if let Some(peers) = app.regions.get() {
        app.metrics.regions(&peers.snapshot());
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
}
