//! `/v1/admin/…`: the token, overrides and heavy hitters.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;

use crate::{Harness, TOKEN, admin_harness, admin_harness_of, harness, header};

#[tokio::test]
async fn the_admin_api_is_absent_without_a_token_and_refuses_a_wrong_one() {
    let h = harness();
    let (response, _) = h
        .admin("GET", "/v1/admin/overrides", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let (h, _) = admin_harness();
    for token in [
        None,
        Some("wrong"),
        Some("test-admin-token-012345678"),
        Some("test-admin-token-0123456789x"),
    ] {
        let (response, body) = h.admin("GET", "/v1/admin/overrides", None, token).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(body["invalid-params"][0]["name"], "Authorization");
        assert_eq!(header(&response, "www-authenticate"), Some("Bearer"));
    }
    let (response, body) = h
        .admin("GET", "/v1/admin/overrides", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body, json!({"overrides": []}));
    // The scheme's case does not matter (RFC 9110, 11.1); another scheme
    // or a bare token is refused.
    for (authorization, status) in [
        (format!("bearer {TOKEN}"), StatusCode::OK),
        (format!("BEARER {TOKEN}"), StatusCode::OK),
        (format!("Basic {TOKEN}"), StatusCode::UNAUTHORIZED),
        (TOKEN.to_owned(), StatusCode::UNAUTHORIZED),
        ("Bearer".to_owned(), StatusCode::UNAUTHORIZED),
    ] {
        let request = Request::get("/v1/admin/overrides")
            .header("authorization", &authorization)
            .body(Body::empty())
            .unwrap();
        let (response, _) = h.send(request).await;
        assert_eq!(response.status(), status, "{authorization}");
    }
}

#[tokio::test]
async fn overrides_scale_shadow_and_expire_one_tenant_only() {
    let (h, app) = admin_harness();
    let invoice = |tenant: &str| json!({"tenant": tenant, "route": "POST /v1/invoices"});
    async fn admitted(h: &Harness, tenant: &str) -> u32 {
        let body = json!({"tenant": tenant, "route": "POST /v1/invoices"});
        let mut n = 0;
        while h.check_json(body.clone()).await.0.status() == StatusCode::OK {
            n += 1;
            assert!(n < 100);
        }
        n
    }
    // Doubled for acme (invoices: 2 → 5 with factor 2.5); globex keeps 2.
    let (response, stored) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"factor": 2.5})),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{stored}");
    assert_eq!(stored["tenant"], "acme");
    let version = stored["version"].as_u64().unwrap();
    assert_eq!(
        header(&response, "etag"),
        Some(format!("\"{version}\"").as_str())
    );
    assert_eq!(admitted(&h, "acme").await, 5);
    assert_eq!(admitted(&h, "globex").await, 2);
    // A stale If-Match is refused; the right one goes through.
    let mut stale = Request::put("/v1/admin/overrides/acme")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("if-match", format!("\"{}\"", version + 7))
        .body(Body::from(json!({"shadow": true}).to_string()))
        .unwrap();
    let (response, _) = h.send(stale).await;
    assert_eq!(response.status(), StatusCode::PRECONDITION_FAILED);
    stale = Request::put("/v1/admin/overrides/acme")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("if-match", format!("\"{version}\""))
        .body(Body::from(
            json!({"shadow": true, "expires_in": "1s"}).to_string(),
        ))
        .unwrap();
    let (response, stored) = h.send(stale).await;
    assert_eq!(response.status(), StatusCode::OK, "{stored}");
    // Shadow: never denied, the would-be denial marked.
    for _ in 0..5 {
        let (response, body) = h.check_json(invoice("acme")).await;
        assert_eq!(response.status(), StatusCode::OK);
        if body.get("shadow_denied") == Some(&json!(true)) {
            break;
        }
    }
    let (response, body) = h.check_json(invoice("acme")).await;
    assert_eq!(
        (response.status(), &body["shadow_denied"]),
        (StatusCode::OK, &json!(true)),
        "{body}"
    );
    // …and in heavy hitters as a denial.
    let (_, top) = h
        .admin(
            "GET",
            "/v1/admin/heavy-hitters?by=denied",
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(top["tenants"][0]["tenant"], "acme", "{top}");
    let (_, list) = h
        .admin("GET", "/v1/admin/overrides", None, Some(TOKEN))
        .await;
    assert_eq!(list["overrides"].as_array().unwrap().len(), 1);
    // Expired, it no longer applies nor lists.
    h.clock.advance(1_100);
    app.admin.sync(&app.limiter, false).await;
    let (response, _) = h
        .admin("GET", "/v1/admin/overrides/acme", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    // Its plan's 2/s again, enforced (the bucket refilled meanwhile: the
    // store's clock is the admin API's).
    assert_eq!(admitted(&h, "acme").await, 2, "back to its plan");
    // Removed: 204, then 404.
    let (response, _) = h
        .admin("PUT", "/v1/admin/overrides/globex", Some(json!({"plan": "free", "rules": {"routes": {"POST /v1/invoices": [{"name": "invoices", "limit": 3, "per": "1s"}]}}})), Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    h.clock.advance(1_000);
    assert_eq!(admitted(&h, "globex").await, 3, "its own rules");
    let (response, _) = h
        .admin("DELETE", "/v1/admin/overrides/globex", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let (response, _) = h
        .admin("DELETE", "/v1/admin/overrides/globex", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_bad_override_is_a_400_naming_the_field_and_changes_nothing() {
    let (h, _) = admin_harness();
    let cases = [
        (json!({}), "body"),
        (json!({"plan": "platinum"}), "plan"),
        (json!({"factor": 0}), "factor"),
        (json!({"factor": 5000}), "factor"),
        (json!({"factor": "two"}), "factor"),
        (json!({"shadow": "yes"}), "shadow"),
        (
            json!({"rules": {"tenant": [{"limit": 0, "per": "1s"}]}}),
            "rules.tenant",
        ),
        (
            json!({"rules": {"tenant": [], "routes": {"GET /": [{"per": "1s"}]}}}),
            "rules.routes",
        ),
        (json!({"rules": {"subject": "x"}}), "rules.subject"),
        (json!({"rules": {"everything": []}}), "rules.everything"),
        (json!({"rules": 5}), "rules"),
        (json!([]), "body"),
        (json!({"factor": 2, "expires_in": "forever"}), "expires_in"),
        (json!({"factor": 2, "expires_in": "500ms"}), "expires_in"),
        (json!({"factor": 2, "colour": "red"}), "colour"),
        (json!({"shadow": ["no-such-policy"]}), "shadow"),
        (json!({"shadow": [1]}), "shadow"),
    ];
    for (body, field) in cases {
        let (response, problem) = h
            .admin(
                "PUT",
                "/v1/admin/overrides/acme",
                Some(body.clone()),
                Some(TOKEN),
            )
            .await;
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{body}: {problem}"
        );
        let named = problem["invalid-params"][0]["name"].as_str().unwrap();
        assert_eq!(named, field, "{body}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        for ours in ["PutBody", "f64", "u64", "u32"] {
            assert!(!detail.contains(ours), "no Rust in it: {detail}");
        }
    }
    let (_, problem) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"factor": 1e308})),
            Some(TOKEN),
        )
        .await;
    assert_eq!(
        problem["detail"],
        "`factor` must be above 0 and at most 1000, got 1e308"
    );
    let (_, problem) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"shadow": "yes"})),
            Some(TOKEN),
        )
        .await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("`shadow` takes true, false or a list of policy names"),
        "{problem}"
    );
    // A tenant in the path that is not UTF-8: a problem naming it.
    for method in ["GET", "PUT", "DELETE"] {
        let (response, problem) = h
            .admin(
                method,
                "/v1/admin/overrides/%ff",
                Some(json!({"shadow": true})),
                Some(TOKEN),
            )
            .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{method}");
        assert_eq!(problem["invalid-params"][0]["name"], "tenant", "{problem}");
    }
    let (_, list) = h
        .admin("GET", "/v1/admin/overrides", None, Some(TOKEN))
        .await;
    assert_eq!(list, json!({"overrides": []}), "nothing half-applied");
}

#[tokio::test]
async fn heavy_hitters_count_each_tenants_fair_share_denials() {
    // A fair valve of 10/s saturated by "greedy" (160/s, inside its own
    // ceiling); once the share has converged (a second), "modest" asks for
    // 2/s, below its share of 5/s.
    let (h, _) = admin_harness_of(
        r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, limit: 1000, per: 1s }]
global:
  "POST /v1/orders": [{ name: orders-valve, limit: 10, per: 1s }]
"#,
    );
    let mut held = 0;
    for round in 0..120 {
        h.clock.advance(25);
        for _ in 0..4 {
            let (_, body) = h
                .check_json(json!({"tenant": "greedy", "route": "POST /v1/orders"}))
                .await;
            held += u64::from(body["reason"] == "global_capacity");
        }
        if round >= 40 && round % 20 == 0 {
            h.check_json(json!({"tenant": "modest", "route": "POST /v1/orders"}))
                .await;
        }
    }
    assert!(held > 0, "the valve held greedy back");
    let (response, top) = h
        .admin(
            "GET",
            "/v1/admin/heavy-hitters?by=denied",
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{top}");
    let row = |tenant: &str| {
        top["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tenant"] == tenant)
            .cloned()
    };
    let greedy = row("greedy").expect("greedy was denied");
    assert_eq!(greedy["fair_share_denied"], json!(held), "{top}");
    assert_eq!(
        greedy["denied"],
        json!(held),
        "only the valve denied: {top}"
    );
    // The modest tenant, below its share, was never held back.
    assert!(
        row("modest").is_none_or(|m| m["fair_share_denied"] == 0),
        "{top}"
    );
}

#[tokio::test]
async fn heavy_hitters_name_the_most_denied_tenants_to_the_admin_api_only() {
    let (h, _) = admin_harness();
    for (tenant, requests) in [("flood", 30), ("drizzle", 6), ("polite", 2)] {
        for _ in 0..requests {
            h.check_json(json!({"tenant": tenant, "route": "POST /v1/invoices"}))
                .await;
        }
    }
    let (response, top) = h
        .admin(
            "GET",
            "/v1/admin/heavy-hitters?by=denied&limit=2",
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{top}");
    assert!(top["window_s"].as_u64().unwrap() >= 60);
    assert_eq!(
        top["tenants"],
        json!([
            {"tenant": "flood", "denied": 28, "admitted": 2, "fair_share_denied": 0},
            {"tenant": "drizzle", "denied": 4, "admitted": 2, "fair_share_denied": 0}
        ])
    );
    let (_, admitted) = h
        .admin(
            "GET",
            "/v1/admin/heavy-hitters?by=admitted",
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(admitted["tenants"].as_array().unwrap().len(), 3);
    for bad in [
        "by=cost",
        "limit=0",
        "limit=1001",
        "limit=ten",
        "colour=red",
    ] {
        let (response, problem) = h
            .admin(
                "GET",
                &format!("/v1/admin/heavy-hitters?{bad}"),
                None,
                Some(TOKEN),
            )
            .await;
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{bad}: {problem}"
        );
    }
    let (response, _) = h.admin("GET", "/v1/admin/heavy-hitters", None, None).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // Never in the metrics.
    assert!(!h.metrics().await.contains("flood"));
}

#[tokio::test]
async fn a_shadow_override_can_name_some_policies_only() {
    let (h, _) = admin_harness();
    // Shadow for `invoices` only: never denied by it, its would-be
    // denials marked; `per-user` still enforced.
    let (response, stored) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"shadow": ["invoices"]})),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{stored}");
    assert_eq!(stored["shadow"], json!(["invoices"]));
    let mut marked = false;
    for _ in 0..5 {
        let (response, body) = h
            .check_json(json!({"tenant": "acme", "route": "POST /v1/invoices"}))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "{body}");
        marked |= body.get("shadow_denied") == Some(&json!(true));
    }
    assert!(marked, "the would-be denials are marked");
    let with_user = json!({"tenant": "acme", "route": "POST /v1/invoices", "subject": "u1"});
    let statuses = [
        h.check_json(with_user.clone()).await.0.status(),
        h.check_json(with_user.clone()).await.0.status(),
        h.check_json(with_user.clone()).await.0.status(),
    ];
    assert_eq!(
        statuses[2],
        StatusCode::TOO_MANY_REQUESTS,
        "per-user is enforced"
    );
}
