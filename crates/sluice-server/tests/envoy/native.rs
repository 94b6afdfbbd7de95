//! The native domain: descriptor entries name the tenant, route and
//! subject, and sluice's plans decide.

use super::*;

/// Status `i` of `r`: the name of its `current_limit` (empty: none) and
/// what it has left.
fn shown(r: &RateLimitResponse, i: usize) -> (String, u32) {
    let status = &r.statuses[i];
    let name = status.current_limit.as_ref().map(|l| l.name.clone());
    (name.unwrap_or_default(), status.limit_remaining)
}

#[tokio::test]
async fn the_native_domain_maps_descriptors_onto_plans() {
    let mut server = start("", "native");
    let mut c = client(&server).await;
    let tenant = [("tenant", "acme")];
    let route = [("tenant", "acme"), ("route", "POST /x")];
    let subject = [
        ("tenant", "acme"),
        ("route", "POST /x"),
        ("subject", "alice"),
    ];
    let all = || {
        vec![
            descriptor(&tenant),
            descriptor(&route),
            descriptor(&subject),
        ]
    };
    // More hits than alice's limit (1) can ever hold: her descriptor is
    // over, with its limit; the others keep their standing; nothing is
    // consumed.
    let r = ask(&mut c, "sluice", all(), 2).await;
    assert_eq!(codes(&r), [Code::Ok, Code::Ok, Code::OverLimit]);
    assert_eq!(shown(&r, 0), ("tenant-minute".into(), 100));
    assert_eq!(shown(&r, 2), ("per-user".into(), 0));

    let r = ask(&mut c, "sluice", all(), 0).await;
    assert_eq!(codes(&r), [Code::Ok, Code::Ok, Code::Ok]);
    let limit = |i: usize| r.statuses[i].current_limit.as_ref().unwrap().name.clone();
    assert_eq!(
        (limit(0), limit(1), limit(2)),
        ("tenant-minute".into(), "x".into(), "per-user".into())
    );
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        100
    );
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().unit, 2); // MINUTE

    // alice's second request is over her subject limit only; nothing else
    // is consumed.
    let r = ask(&mut c, "sluice", all(), 0).await;
    assert_eq!(codes(&r), [Code::Ok, Code::Ok, Code::OverLimit]);
    assert_eq!(overall(&r), Code::OverLimit);
    let r = ask(&mut c, "sluice", vec![descriptor(&route)], 0).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 0,
        "the route had 2: one used, one now"
    );
    assert_eq!(overall(&r), Code::Ok);
    let r = ask(&mut c, "sluice", vec![descriptor(&route)], 0).await;
    assert_eq!(codes(&r), [Code::OverLimit]);

    // A `fingerprint` entry feeds the duplicate guard: the same submission
    // is over the limit, another one is not.
    let pay = |f: &str| {
        vec![descriptor(&[
            ("tenant", "acme"),
            ("route", "POST /pay"),
            ("fingerprint", f),
        ])]
    };
    assert_eq!(
        overall(&ask(&mut c, "sluice", pay("f1"), 0).await),
        Code::Ok
    );
    // Over on the descriptor that names the route, what the guard
    // remembers never shown.
    let r = ask(&mut c, "sluice", pay("f1"), 0).await;
    assert_eq!(
        (overall(&r), codes(&r)),
        (Code::OverLimit, vec![Code::OverLimit])
    );
    assert_eq!(shown(&r, 0).1, 0);
    assert_eq!(
        overall(&ask(&mut c, "sluice", pay("f2"), 0).await),
        Code::Ok
    );

    // A tenant is required on the native domain.
    let status = c
        .should_rate_limit(RateLimitRequest {
            domain: "sluice".into(),
            descriptors: vec![descriptor(&[("route", "GET /")])],
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("tenant"), "{}", status.message());

    // An answer's headers: its content type, no `date` or
    // `content-length` (no gRPC client reads them; the HTTP API's answers
    // carry them).
    let answer = c
        .should_rate_limit(RateLimitRequest {
            domain: "sluice".into(),
            descriptors: vec![descriptor(&tenant)],
            hits_addend: 0,
        })
        .await
        .unwrap();
    let headers = answer.metadata();
    assert_eq!(headers.get("content-type").unwrap(), "application/grpc");
    assert!(headers.get("date").is_none(), "{headers:?}");
    assert!(headers.get("content-length").is_none(), "{headers:?}");
    drop(c);
    server.stop();
}

#[tokio::test]
async fn sharded_tenants_get_their_whole_limit_through_envoy() {
    let redis = RedisServer::start();
    let storage = format!(
        "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\ntenants:\n  big1: {{ plan: free, shards: 4 }}\n  big2: {{ plan: free, shards: 4 }}\n  big3: {{ plan: free, shards: 4 }}\n",
        redis.url()
    );
    let mut server = start(&storage, "sharded");
    let mut c = client(&server).await;
    // Two sharded tenants taking turns each get all of `tenant-minute`.
    let mut admitted = [0u32; 2];
    for i in 0..260 {
        let t = i % 2;
        let tenant = ["big1", "big2"][t];
        let r = ask(&mut c, "sluice", vec![descriptor(&[("tenant", tenant)])], 0).await;
        admitted[t] += u32::from(overall(&r) == Code::Ok);
    }
    assert_eq!(admitted, [100, 100]);
    // A limit override on a sharded tenant is spread like its plan: the
    // plan's rules still give the whole limit, the override its own.
    let mut overridden = descriptor(&[("tenant", "big3")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 1_000,
        unit: 3, // HOUR
    });
    let mut admitted = 0;
    for _ in 0..130 {
        let r = ask(&mut c, "sluice", vec![overridden.clone()], 0).await;
        admitted += u32::from(overall(&r) == Code::Ok);
    }
    assert_eq!(admitted, 100, "the plan's tenant-minute, over all shards");
    drop(c);
    server.stop();
}

/// A route with a rule of its own and a fair valve (all tenants, 100 an
/// hour: nothing refills during the test).
const VALVED: &str = r#"
default_plan: free
plans:
  free:
    tenant: [{ name: tenant-hour, algorithm: fixed_window, limit: 1000, per: 1h }]
    routes:
      "POST /v": [{ name: v-route, algorithm: fixed_window, limit: 500, per: 1h }]
global:
  "POST /v": [{ name: v-valve, algorithm: gcra, limit: 100, per: 1h, burst: 100 }]
"#;

/// A valve is never shown in a descriptor's status (as it never is in the
/// `RateLimit` headers): what it has left would show other tenants'
/// traffic. When it or the tenant's share of it denies, the descriptor
/// that answers for the route says over.
async fn valves_stay_hidden(server: &Server) {
    let mut c = client(server).await;
    let both = |tenant: &str| {
        vec![
            descriptor(&[("tenant", tenant)]),
            descriptor(&[("tenant", tenant), ("route", "POST /v")]),
        ]
    };
    let route_status = |r: &RateLimitResponse| shown(r, 1);
    let r = ask(&mut c, "sluice", both("a"), 1).await;
    assert_eq!(codes(&r), [Code::Ok, Code::Ok]);
    assert_eq!(route_status(&r), ("v-route".into(), 499));
    // Another tenant's 40 units change nothing in what `a` is shown.
    let r = ask(&mut c, "sluice", both("b"), 40).await;
    assert_eq!(overall(&r), Code::Ok);
    let r = ask(&mut c, "sluice", both("a"), 1).await;
    assert_eq!(route_status(&r), ("v-route".into(), 498));

    // `b` drains the valve, past its share: each denial is the route's.
    let mut denied = 0;
    for tenant in ["b", "b", "b", "a", "b", "a", "b", "a"] {
        let r = ask(&mut c, "sluice", both(tenant), 12).await;
        if overall(&r) == Code::OverLimit {
            denied += 1;
            assert_eq!(codes(&r), [Code::Ok, Code::OverLimit], "{tenant}");
            assert_eq!(route_status(&r), ("v-route".into(), 0), "{tenant}");
        } else {
            assert_eq!(route_status(&r).0, "v-route");
        }
    }
    assert!(denied > 0, "the valve (100) was asked for 138");
    // Without a route descriptor, the subject's (it names the route too)
    // says over: more than the valve has left.
    let subject = descriptor(&[("tenant", "a"), ("route", "POST /v"), ("subject", "u")]);
    let r = ask(&mut c, "sluice", vec![subject], 100).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
}

#[tokio::test]
async fn valves_are_never_shown_and_their_denials_are_the_routes() {
    let mut server = start_config(VALVED, "valved-memory", &[]);
    valves_stay_hidden(&server).await;
    server.stop();
    let redis = RedisServer::start();
    let yaml = format!("{}{VALVED}", redis_storage(&redis));
    let mut server = start_config(&yaml, "valved-redis", &[]);
    valves_stay_hidden(&server).await;
    server.stop();
}
