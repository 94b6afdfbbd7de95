//! `POST /v1/acquire` and `POST /v1/release`: leases of a concurrency rule.

use axum::http::StatusCode;
use serde_json::{Value, json};
use sfv::{BareItem, ListEntry, Parser};

use crate::{TOKEN, admin_harness, harness, header};

#[tokio::test]
async fn leases_are_acquired_released_once_and_expire() {
    let h = harness();
    let export = json!({"tenant": "acme", "route": "POST /v1/exports"}).to_string();
    // A check says whether a slot is free and takes none.
    for _ in 0..3 {
        assert_eq!(h.check(export.clone()).await.0.status(), StatusCode::OK);
    }
    let (response, first) = h.post("/v1/acquire", export.clone()).await;
    assert_eq!(response.status(), StatusCode::OK, "{first}");
    assert_eq!(first["allowed"], true);
    let lease = first["lease"].as_str().expect("a lease").to_owned();
    // Advertised as requests in flight, not per window.
    let policy = Parser::new(header(&response, "ratelimit-policy").unwrap())
        .parse::<sfv::List>()
        .unwrap();
    let exports = policy
        .iter()
        .find_map(|entry| match entry {
            ListEntry::Item(item)
                if item.bare_item
                    == BareItem::String(
                        sfv::String::from_string("exports".to_owned()).unwrap(),
                    ) =>
            {
                Some(item)
            }
            _ => None,
        })
        .expect("exports advertised");
    let params: Vec<(String, String)> = exports
        .params
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), format!("{v:?}")))
        .collect();
    assert_eq!(params.len(), 2, "{params:?}");
    assert!(
        params[0].0 == "q" && params[0].1.contains('2'),
        "{params:?}"
    );
    assert!(
        params[1].0 == "qu" && params[1].1.contains("concurrent-requests"),
        "{params:?}"
    );
    let (_, second) = h.post("/v1/acquire", export.clone()).await;
    let second = second["lease"].as_str().unwrap().to_owned();
    // Full: the third is denied, and so is a check.
    let (response, denied) = h.post("/v1/acquire", export.clone()).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{denied}");
    assert_eq!(denied["reason"], "route_limit");
    assert!(denied.get("lease").is_none());
    assert!(header(&response, "retry-after").is_some());
    assert_eq!(
        h.check(export.clone()).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Released once; twice, garbled or unknown: 404, freeing nothing.
    let release = |lease: &str| json!({ "lease": lease }).to_string();
    let (response, body) = h.post("/v1/release", release(&lease)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body, json!({"released": true}));
    // Another id for the same request (one character of the id changed).
    let other_char = if &lease[10..11] == "A" { "B" } else { "A" };
    let forged = format!("{}{other_char}{}", &lease[..10], &lease[11..]);
    for other in [lease.as_str(), "nonsense", forged.as_str()] {
        let (response, body) = h.post("/v1/release", release(other)).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{other}: {body}");
        assert_eq!(body["invalid-params"][0]["name"], "lease");
    }
    for bad in [
        json!({}),
        json!({"lease": "x", "extra": 1}),
        json!({"lease": 5}),
        json!([]),
    ] {
        let (response, problem) = h.post("/v1/release", bad.to_string()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert!(!problem.to_string().contains("Body"), "{problem}");
    }
    let (response, third) = h.post("/v1/acquire", export.clone()).await;
    assert_eq!(response.status(), StatusCode::OK, "{third}");
    assert_eq!(
        h.post("/v1/acquire", export.clone()).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Leases not released run out: the slots are free again, and an
    // expired lease is not released.
    h.clock.advance(30_000);
    assert_eq!(
        h.post("/v1/acquire", export.clone()).await.0.status(),
        StatusCode::OK
    );
    assert_eq!(
        h.post("/v1/release", release(&second)).await.0.status(),
        StatusCode::NOT_FOUND
    );
    // Where no concurrency rule applies, there is nothing to release.
    let (response, body) = h
        .post(
            "/v1/acquire",
            json!({"tenant": "acme", "route": "POST /v1/invoices"}).to_string(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body["lease"], Value::Null);
}

/// A lease is released by what it holds, whatever the policy is now: an
/// override that takes the concurrency rule away (or brings its own)
/// leaves every held lease releasable, and the slots free again (before,
/// `/v1/release` looked the rule up in the current policy: 404, and the
/// slot stayed taken for the whole `lease`).
#[tokio::test]
async fn a_lease_is_released_whatever_the_policy_is_now() {
    let (h, _) = admin_harness();
    let export = json!({"tenant": "acme", "route": "POST /v1/exports"}).to_string();
    let release = |lease: &str| json!({ "lease": lease }).to_string();
    let acquire = || async {
        let (response, body) = h.post("/v1/acquire", export.clone()).await;
        assert_eq!(response.status(), StatusCode::OK, "{body}");
        body["lease"].as_str().expect("a lease").to_owned()
    };
    let held = [acquire().await, acquire().await];
    // The override takes the concurrency rule away.
    let (response, body) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"rules": {"routes": {"POST /v1/exports": [{"name": "exports-rate", "limit": 100, "per": "1s"}]}}})),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{body}");
    let (response, body) = h.post("/v1/release", release(&held[0])).await;
    assert_eq!(response.status(), StatusCode::OK, "{body}");
    assert_eq!(body, json!({"released": true}));
    // Back on the plan: the released slot is free, the other still held.
    let (response, _) = h
        .admin("DELETE", "/v1/admin/overrides/acme", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let third = acquire().await;
    let (response, body) = h.post("/v1/acquire", export.clone()).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{body}");
    // An override with a concurrency rule of its own: its lease is
    // released after the override is gone too.
    let (response, body) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"rules": {"routes": {"POST /v1/exports": [{"name": "own", "algorithm": "concurrency", "limit": 1, "lease": "1h"}]}}})),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{body}");
    let own = acquire().await;
    let (response, _) = h
        .admin("DELETE", "/v1/admin/overrides/acme", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    for lease in [&own, &held[1], &third] {
        let (response, body) = h.post("/v1/release", release(lease)).await;
        assert_eq!(response.status(), StatusCode::OK, "{body}");
    }
    acquire().await;
    acquire().await;
}
