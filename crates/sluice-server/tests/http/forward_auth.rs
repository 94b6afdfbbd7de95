//! `GET /v1/forward-auth`: the request read from a gateway's headers.

use std::sync::Arc;

use axum::http::StatusCode;
use sluice_core::{Config, Policy};
use sluice_server::app::App;
use sluice_server::backend::Backend;
use sluice_server::http::router;
use sluice_store::{Limiter, ManualClock, MemoryStore};

use crate::{CONFIG, Harness, forward, harness, header, param, sf_list};

#[tokio::test]
async fn forward_auth_reads_traefik_and_caddy_headers() {
    let h = harness();
    let traefik = [
        ("X-Tenant", "acme"),
        ("X-Forwarded-Method", "GET"),
        ("X-Forwarded-Uri", "/v1/reports/7?format=csv"),
    ];
    for _ in 0..3 {
        let (response, _) = h.send(forward(&traefik)).await;
        assert_eq!(response.status(), StatusCode::OK);
        let policy = sf_list(header(&response, "ratelimit-policy").unwrap());
        assert!(
            policy.iter().any(|(n, _)| n == "reports"),
            "route from method + path, query dropped"
        );
    }
    let (response, body) = h.send(forward(&traefik)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["reason"], "route_limit");
    assert_eq!(header(&response, "retry-after"), Some("10"));
}

/// With `method_header` and `uri_header` set, forward-auth reads those
/// headers and no other: a client's own `X-Forwarded-Uri`, passed along by
/// a gateway that writes `X-Original-URI`, changes nothing.
#[tokio::test]
async fn forward_auth_reads_only_the_original_headers_it_is_told_to() {
    let config = CONFIG.replace(
        "    cost_header: X-Cost\n",
        "    cost_header: X-Cost\n    method_header: X-Original-Method\n    uri_header: X-Original-URI\n",
    );
    let config = Config::from_yaml(&config, "test.yaml").unwrap();
    let store = MemoryStore::with_clock(1000, Arc::new(ManualClock::new(1_764_460_800_500)));
    let limiter = Limiter::new(
        Policy::compile(&config.limits),
        Backend::Memory(store),
        config.storage.on_error,
    );
    let app = App::new(
        limiter,
        config.server.forward_auth.clone(),
        Default::default(),
    );
    let h = Harness {
        router: router(app, &config.server.limits),
        clock: Arc::new(ManualClock::new(0)),
    };
    let spoofed = [
        ("X-Tenant", "acme"),
        ("X-Forwarded-Method", "GET"),
        ("X-Forwarded-Uri", "/unlimited"),
        ("X-Original-Method", "POST"),
        ("X-Original-URI", "/v1/invoices"),
    ];
    for allowed in [true, true, false] {
        let (response, body) = h.send(forward(&spoofed)).await;
        assert_eq!(response.status() == StatusCode::OK, allowed, "{body}");
    }
    // The default order is not in force: X-Forwarded-* alone is missing.
    let (response, problem) = h
        .send(forward(&[
            ("X-Tenant", "acme"),
            ("X-Forwarded-Method", "GET"),
            ("X-Forwarded-Uri", "/"),
        ]))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(problem["invalid-params"][0]["name"], "X-Original-Method");
    // A name that is no header name is refused with the field.
    let bad = CONFIG.replace(
        "    cost_header: X-Cost\n",
        "    cost_header: X-Cost\n    uri_header: \"X Original\"\n",
    );
    let error = Config::from_yaml(&bad, "test.yaml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("server.forward_auth.uri_header"), "{error}");
}

#[tokio::test]
async fn forward_auth_reads_nginx_headers_subject_and_cost() {
    let h = harness();
    let nginx = [
        ("X-Tenant", "acme"),
        ("X-User", "u9"),
        ("X-Cost", "2"),
        ("X-Original-Method", "POST"),
        ("X-Original-URI", "/v1/invoices"),
    ];
    let (response, _) = h.send(forward(&nginx)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let state = sf_list(header(&response, "ratelimit").unwrap());
    assert_eq!(param(&state, "invoices", "r"), 0);
    assert_eq!(param(&state, "per-user", "r"), 0);
}

#[tokio::test]
async fn forward_auth_without_its_headers_or_with_one_twice_is_a_400() {
    let h = harness();
    let cases: [(&[(&str, &str)], &str); 7] = [
        (
            &[("X-Forwarded-Method", "GET"), ("X-Forwarded-Uri", "/")],
            "X-Tenant",
        ),
        (&[("X-Tenant", "acme")], "X-Forwarded-Method"),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
                ("X-Cost", "many"),
            ],
            "X-Cost",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
                ("X-Cost", "0"),
            ],
            "X-Cost",
        ),
        // Sent twice: which one counts would be whoever added the other's
        // choice.
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Tenant", "victim"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
            ],
            "X-Tenant",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
                ("X-Forwarded-Uri", "/v1/reports"),
            ],
            "X-Forwarded-Uri",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
                ("X-Cost", "1"),
                ("X-Cost", "1"),
            ],
            "X-Cost",
        ),
    ];
    for (headers, field) in cases {
        let (response, problem) = h.send(forward(headers)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(problem["invalid-params"][0]["name"], field, "{problem}");
    }
    // A field out of its bounds is named by the header that carried it.
    let long = format!("/{}", "a".repeat(1100));
    let tenant = "t".repeat(257);
    let user = "u".repeat(257);
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let bounds: [(Headers<'_>, &str, &str); 4] = [
        (
            &[
                ("X-Tenant", &tenant),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
            ],
            "X-Tenant",
            "`tenant` must be 1 to 256 bytes",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", &long),
            ],
            "X-Forwarded-Uri",
            "`route` must be 1 to 1024 bytes",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Original-Method", "GET"),
                ("X-Original-URI", &long),
            ],
            "X-Original-URI",
            "`route` must be 1 to 1024 bytes",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-User", &user),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
            ],
            "X-User",
            "`subject` must be 1 to 256 bytes",
        ),
    ];
    for (headers, name, says) in bounds {
        let (response, problem) = h.send(forward(headers)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(problem["invalid-params"][0]["name"], name, "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("header `{name}`: {says}")),
            "{detail}"
        );
    }
    let (_, problem) = h
        .send(forward(&[
            ("X-Tenant", "acme"),
            ("X-Tenant", "victim"),
            ("X-Forwarded-Method", "GET"),
            ("X-Forwarded-Uri", "/"),
        ]))
        .await;
    assert_eq!(
        problem["detail"],
        "header `X-Tenant` must be sent once, got 2 values"
    );
}
