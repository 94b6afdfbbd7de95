//! A complete axum app limited in process: per tenant (`X-Tenant`), per
//! client IP behind a local proxy, a duplicate guard on payments, limits
//! reloaded from a file on SIGHUP-free polling. Run it and try:
//!
//! ```sh
//! cargo run -p sluice-tower --example axum_app
//! curl -i -X POST localhost:3000/v1/payments -H 'X-Tenant: acme' -H 'Idempotency-Key: p1'
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use axum::{Router, middleware};
use http::{HeaderName, StatusCode};
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, MemoryStore};
use sluice_tower::{FromHeaders, Peer, RateLimitLayer};

const LIMITS: &str = r#"
default_plan: free
plans:
  free:
    tenant: [{ name: hourly, limit: 1000, per: 1h }]
    routes:
      "POST /v1/payments": [{ name: payments, limit: 10, per: 1m }]
    subject:
      "*": [{ name: per-ip, algorithm: gcra, limit: 5, per: 1s }]
    dedupe:
      "POST /v1/payments": { window: 10s }
"#;

#[tokio::main]
async fn main() {
    let path = std::env::var("LIMITS_FILE").ok();
    let load =
        |text: &str| Policy::compile(&Config::from_yaml(text, "limits.yaml").unwrap().limits);
    let text = path
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_else(|| LIMITS.to_owned());
    let limiter = Arc::new(Limiter::new(
        load(&text),
        MemoryStore::new(100_000),
        OnError::Local,
    ));
    // Reload the limits when the file changes (every 2 s); a file that
    // does not parse is reported and the running limits stay.
    if let Some(path) = path {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let mut last = text;
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let Ok(next) = std::fs::read_to_string(&path) else {
                    continue;
                };
                if next == last {
                    continue;
                }
                match Config::from_yaml(&next, &path) {
                    Ok(config) => limiter.set_policy(Policy::compile(&config.limits)),
                    Err(errors) => eprintln!("{errors}"),
                }
                last = next;
            }
        });
    }
    let keys = FromHeaders::new(HeaderName::from_static("x-tenant"))
        .client_ip(vec!["127.0.0.1/32".parse().unwrap()]);
    let app =
        Router::new()
            .route(
                "/v1/payments",
                post(|| async { (StatusCode::CREATED, "paid") }),
            )
            .route("/v1/things", get(|| async { "things" }))
            // Only matched routes are limited: a 404 spends nothing.
            .route_layer(RateLimitLayer::new(limiter, keys))
            // The limiter reads the client's address as a `Peer`.
            .layer(middleware::map_request(
                |ConnectInfo(peer): ConnectInfo<SocketAddr>,
                 mut request: axum::extract::Request| async move {
                    request.extensions_mut().insert(Peer(peer));
                    request
                },
            ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("listening on http://127.0.0.1:3000");
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
    .unwrap();
}
