//! Reserve, then settle: each request of `sluice bench --api reserve` is a
//! decision holding its cost as an estimate and the settle of it, the way
//! a client limiting what is only known after the response uses sluice.

use std::sync::atomic::{AtomicU64, Ordering};

/// A client reserving and settling on one instance.
#[derive(Clone)]
pub(super) struct Settling {
    http: reqwest::Client,
    check: String,
    settle: String,
}

/// Settled costs take turns: 0, 1, 2 (the estimate, 1, on average).
static TURN: AtomicU64 = AtomicU64::new(0);

impl Settling {
    pub(super) fn new(http: &reqwest::Client, base: &str) -> Settling {
        let base = base.trim_end_matches('/');
        Settling {
            http: http.clone(),
            check: format!("{base}/v1/check"),
            settle: format!("{base}/v1/settle"),
        }
    }

    /// The decision's status (200 or 429), once its reservation, when it
    /// was admitted, is settled; `None` when a call failed.
    pub(super) async fn reserve_and_settle(&self, tenant: &str, route: &str) -> Option<u16> {
        let body = serde_json::json!({ "tenant": tenant, "route": route, "reserve": true });
        let response = self.http.post(&self.check).json(&body).send().await.ok()?;
        let status = response.status().as_u16();
        let answer: serde_json::Value = response.json().await.ok()?;
        if status != 200 {
            return Some(status);
        }
        let cost = TURN.fetch_add(1, Ordering::Relaxed) % 3;
        let settle = serde_json::json!({ "reservation": answer["reservation"], "cost": cost });
        let settled = self
            .http
            .post(&self.settle)
            .json(&settle)
            .send()
            .await
            .ok()?;
        let ok = settled.status().as_u16() == 200;
        let _ = settled.bytes().await;
        ok.then_some(status)
    }
}
