//! Liveness and readiness.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};

use crate::app::App;

/// The process is up.
pub(super) async fn healthz() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// The process can decide: its configuration is loaded and its store is
/// usable.
pub(super) async fn readyz(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({
        "status": "ready",
        "store": app.limiter.store().name(),
    }))
}
