//! An axum service limiting LLM tokens per tenant per minute: a request is
//! admitted on its estimate (`X-Max-Tokens`, else 1), the handler says
//! what the answer really cost in `x-usage-tokens`, and the layer settles
//! that when the response body ends (or is dropped): an answer above the
//! estimate goes past the limit, and the tenant waits until it has repaid
//! it. Run it and try:
//!
//! ```sh
//! cargo run -p sluice-tower --example llm_tokens
//! curl -i localhost:3000/v1/chat -H 'X-Tenant: acme' -d 'write me a long poem'
//! ```
//!
//! Each answer costs 40 tokens per word of the prompt; the fourth long
//! prompt of a minute is refused with `Retry-After`.

use std::sync::Arc;

use axum::Router;
use axum::routing::post;
use http::HeaderName;
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, MemoryStore};
use sluice_tower::{FromHeaders, RateLimitLayer, Usage};

const LIMITS: &str = r#"
default_plan: free
plans:
  free:
    routes:
      "POST /v1/chat": [{ name: tokens, algorithm: gcra, limit: 500, per: 1m, max_debt: 500 }]
"#;

/// The model: an answer of 40 tokens per word asked.
async fn chat(prompt: String) -> ([(&'static str, String); 1], String) {
    let tokens = 40 * prompt.split_whitespace().count().max(1);
    let answer = format!("{tokens} tokens of answer to {prompt:?}\n");
    ([("x-usage-tokens", tokens.to_string())], answer)
}

#[tokio::main]
async fn main() {
    let config = Config::from_yaml(LIMITS, "limits.yaml").unwrap();
    let limiter = Arc::new(Limiter::new(
        Policy::compile(&config.limits),
        MemoryStore::new(100_000),
        OnError::Local,
    ));
    let keys = FromHeaders::new(HeaderName::from_static("x-tenant"))
        .cost(HeaderName::from_static("x-max-tokens"));
    let usage = Usage::header(HeaderName::from_static("x-usage-tokens"));
    let app = Router::new()
        .route("/v1/chat", post(chat))
        .route_layer(RateLimitLayer::new(limiter, keys).with_usage(usage));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000")
        .await
        .unwrap();
    println!("listening on http://127.0.0.1:3000");
    axum::serve(listener, app).await.unwrap();
}
