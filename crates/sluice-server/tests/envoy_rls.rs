//! The Envoy Rate Limit Service, driven by a real gRPC client over loopback
//! against `sluice serve`, on the memory store and on Redis.
//!
//! The conformance with envoyproxy/ratelimit, by its test groups:
//!
//! - validation: `cli.rs` (`validate_checks_envoyproxy_files…`) and
//!   `sluice-core`'s config tests (file:line:column refusals);
//! - matching: `envoyproxy_semantics`, `current_language` (wildcards
//!   anywhere, key-only nodes, depth), `sluice-core` `descriptors` tests;
//! - counting: `envoyproxy_semantics` (per value, replaces, shadow, all or
//!   nothing), `current_language` (share_threshold, quota_mode,
//!   `hits_addend: 0`), `sharded_tenants_…`;
//! - answers: `envoyproxy_semantics`, `current_language`,
//!   `envoyproxy_http_endpoints_…` (`/json`, `/healthcheck`, `/rlconfig`),
//!   stats on the memory store, `envoy/zero_limits.rs`;
//! - reload and deployment: `an_envoyproxy_ratelimit_manifest_starts_sluice`
//!   (environment, runtime directory, ConfigMap swap), `envoy/sources.rs`
//!   (`--envoy-config`, subdirectories) and `cli.rs`.

mod common;
mod envoy;

use common::{Server, descriptor, temp_dir, temp_file};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_testkit::{RedisCluster, RedisServer};
use tonic::transport::Channel;

const ENVOY_CONFIG: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: "/api/*"
    rate_limit: { unit: minute, requests_per_unit: 5, name: api }
  - key: path
    value: "/api/health"
    rate_limit: { unlimited: true }
  - key: path
    value: "/blocked"
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: tenant
    descriptors:
      - key: plan
        value: premium
        rate_limit: { unit: minute, requests_per_unit: 10, name: premium, replaces: [{ name: api }] }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
    shadow_mode: true
  - key: bucket
    rules:
      - { name: smooth, algorithm: gcra, limit: 2, per: 1h }
"#;

const SLUICE_CONFIG: &str = r#"
default_plan: free
plans:
  free:
    tenant: [{ name: tenant-minute, limit: 100, per: 1m }]
    routes:
      "POST /x": [{ name: x, algorithm: fixed_window, limit: 2, per: 1m }]
    subject:
      "*": [{ name: per-user, algorithm: sliding_log, limit: 1, per: 1m }]
    dedupe:
      "POST /pay": { window: 1m }
"#;

fn start(storage: &str, name: &str) -> Server {
    start_with(storage, name, &[("edge.yaml", ENVOY_CONFIG)])
}

/// `sluice serve` with `files` as its envoyproxy/ratelimit directory.
fn start_with(storage: &str, name: &str, files: &[(&str, &str)]) -> Server {
    let dir = temp_dir("rls");
    for (file, text) in files {
        std::fs::write(dir.path().join(file), text).unwrap();
    }
    let config = temp_file(
        &format!("{name}.yaml"),
        &format!("{storage}{SLUICE_CONFIG}"),
    );
    Server::start_with_env(
        &[
            "--config",
            config.to_str().unwrap(),
            "--envoy-config",
            dir.path().to_str().unwrap(),
        ],
        &[(
            "TEST_SLUICE_PEPPER",
            "3e1d9c7b5a3f1e2d4c6b8a0f9e7d5c3b1a2f4e6d8c0b9a7f5e3d1c2b4a6f8e0d",
        )],
    )
    .keep(config)
    .keep(dir)
}

/// The `storage` and `keys` sections for `redis`, with the test pepper.
fn redis_storage(redis: &RedisServer) -> String {
    format!(
        "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\n",
        redis.url()
    )
}

async fn client(server: &Server) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap()
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> RateLimitResponse {
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: hits,
    };
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

fn codes(response: &RateLimitResponse) -> Vec<Code> {
    response
        .statuses
        .iter()
        .map(|s| Code::try_from(s.code).unwrap())
        .collect()
}

fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

fn header<'r>(response: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// The behaviours envoyproxy/ratelimit users rely on, checked on a running
/// service.
async fn envoyproxy_semantics(server: &Server) {
    let mut c = client(server).await;
    let one = |entries: &[(&str, &str)]| vec![descriptor(entries)];

    // A key without a value counts each value on its own.
    for _ in 0..3 {
        let r = ask(&mut c, "edge", one(&[("remote_address", "10.0.0.1")]), 0).await;
        assert_eq!(overall(&r), Code::Ok);
    }
    let r = ask(&mut c, "edge", one(&[("remote_address", "10.0.0.1")]), 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let status = &r.statuses[0];
    assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 3);
    assert_eq!(status.limit_remaining, 0);
    // Whole seconds, rounded up, as envoyproxy/ratelimit reports them.
    let reset = status.duration_until_reset.as_ref().unwrap();
    assert!((1..=60).contains(&reset.seconds), "{reset:?}");
    assert_eq!(reset.nanos, 0);
    assert!(header(&r, "Retry-After").is_some());
    assert!(header(&r, "RateLimit").unwrap().contains(";r=0;"));
    assert!(
        header(&r, "RateLimit-Policy")
            .unwrap()
            .contains(";q=3;w=60")
    );
    let r = ask(&mut c, "edge", one(&[("remote_address", "10.0.0.2")]), 0).await;
    assert_eq!(overall(&r), Code::Ok);

    // Wildcard values, and an exact unlimited value that never counts.
    for _ in 0..5 {
        assert_eq!(
            overall(&ask(&mut c, "edge", one(&[("path", "/api/a")]), 0).await),
            Code::Ok
        );
    }
    assert_eq!(
        overall(&ask(&mut c, "edge", one(&[("path", "/api/b")]), 0).await),
        Code::Ok,
        "per value"
    );
    assert_eq!(
        overall(&ask(&mut c, "edge", one(&[("path", "/api/a")]), 0).await),
        Code::OverLimit
    );
    for _ in 0..10 {
        let r = ask(&mut c, "edge", one(&[("path", "/api/health")]), 0).await;
        assert_eq!(overall(&r), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX, "unlimited");
        assert!(r.statuses[0].current_limit.is_none());
    }

    // requests_per_unit: 0 is always over.
    let r = ask(&mut c, "edge", one(&[("path", "/blocked")]), 0).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        0
    );

    // Nested descriptors: the limit of the node the last entry reaches.
    let premium = [("tenant", "t1"), ("plan", "premium")];
    let r = ask(&mut c, "edge", one(&premium), 0).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        10
    );
    assert_eq!(r.statuses[0].limit_remaining, 9);
    for entries in [
        &[("tenant", "t1")][..],
        &[("tenant", "t1"), ("plan", "basic")],
        &[("tenant", "t1"), ("plan", "premium"), ("x", "y")],
    ] {
        let r = ask(&mut c, "edge", one(entries), 0).await;
        assert_eq!(overall(&r), Code::Ok);
        assert!(
            r.statuses[0].current_limit.is_none(),
            "{entries:?} matches no limit"
        );
    }

    // `replaces`: with premium present, the api limit (5) does not apply.
    for _ in 0..7 {
        let r = ask(
            &mut c,
            "edge",
            vec![
                descriptor(&[("path", "/api/replaced")]),
                descriptor(&[("tenant", "t2"), ("plan", "premium")]),
            ],
            0,
        )
        .await;
        assert_eq!(codes(&r), [Code::Ok, Code::Ok]);
        assert!(r.statuses[0].current_limit.is_none());
    }

    // Shadow mode never denies.
    for _ in 0..3 {
        assert_eq!(
            overall(&ask(&mut c, "edge", one(&[("user", "u1")]), 0).await),
            Code::Ok
        );
    }

    // hits_addend, for the request and per descriptor.
    let r = ask(&mut c, "edge", one(&[("remote_address", "10.0.0.3")]), 3).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    assert_eq!(
        overall(&ask(&mut c, "edge", one(&[("remote_address", "10.0.0.3")]), 0).await),
        Code::OverLimit
    );
    let mut heavy = descriptor(&[("bucket", "b1")]);
    heavy.hits_addend = Some(UInt64Value { value: 2 });
    let r = ask(&mut c, "edge", vec![heavy], 0).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "smooth");
    assert_eq!(
        overall(&ask(&mut c, "edge", one(&[("bucket", "b1")]), 0).await),
        Code::OverLimit
    );

    // A limit override from Envoy's route replaces the configured limit.
    let mut overridden = descriptor(&[("remote_address", "10.0.0.4")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3, // HOUR
    });
    let r = ask(&mut c, "edge", vec![overridden.clone()], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    assert_eq!(
        overall(&ask(&mut c, "edge", vec![overridden], 0).await),
        Code::OverLimit
    );
    // Overrides of any size envoyproxy/ratelimit accepts are honoured:
    // 150000 per year, the largest uint32 per second.
    for (requests_per_unit, unit) in [(150_000u32, 6), (u32::MAX, 1)] {
        let mut big = descriptor(&[("remote_address", &format!("10.0.9.{unit}"))]);
        big.limit = Some(RateLimitOverride {
            requests_per_unit,
            unit,
        });
        let r = ask(&mut c, "edge", vec![big], 0).await;
        assert_eq!(overall(&r), Code::Ok, "{requests_per_unit} per unit {unit}");
        assert_eq!(r.statuses[0].limit_remaining, requests_per_unit - 1);
    }

    // Statuses come in request order, and a denied request consumes nothing
    // from any descriptor.
    let r = ask(
        &mut c,
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.5")]),
            descriptor(&[("path", "/blocked")]),
        ],
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
    assert_eq!(overall(&r), Code::OverLimit);
    let r = ask(
        &mut c,
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.6")]),
            descriptor(&[("path", "/api/a")]),
        ],
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
    for address in ["10.0.0.5", "10.0.0.6"] {
        for _ in 0..3 {
            let r = ask(&mut c, "edge", one(&[("remote_address", address)]), 0).await;
            assert_eq!(
                overall(&r),
                Code::Ok,
                "{address}: denied requests counted nothing"
            );
        }
    }

    // Unknown domains have no limits.
    let r = ask(
        &mut c,
        "elsewhere",
        one(&[("remote_address", "10.0.0.1")]),
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok]);
}

#[tokio::test]
async fn envoyproxy_configuration_on_the_memory_store() {
    let mut server = start("", "memory");
    envoyproxy_semantics(&server).await;
    let metrics = || async {
        reqwest::get(format!("{}/metrics", server.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    let count = common::metric_total;
    // A `requests_per_unit: 0` descriptor counts as denied, never allowed.
    let before = metrics().await;
    let mut c = client(&server).await;
    let r = ask(&mut c, "edge", vec![descriptor(&[("path", "/blocked")])], 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let after = metrics().await;
    let denied = "sluice_decisions_total{outcome=\"denied\",reason=\"descriptor_limit\"";
    let allowed = "sluice_decisions_total{outcome=\"allowed\"";
    assert_eq!(count(&after, denied) - count(&before, denied), 1.0);
    assert_eq!(count(&after, allowed), count(&before, allowed));
    let metrics = after;
    let shadow = metrics
        .lines()
        .find(|l| l.starts_with("sluice_shadow_denials_total"))
        .unwrap();
    assert!(!shadow.ends_with(" 0"), "{shadow}");
    // envoyproxy/ratelimit's stats, under its statsd-to-Prometheus names,
    // labelled by the configured key, never by a request's value.
    let stat = |name: &str, labels: &str| {
        count(
            &metrics,
            &format!("ratelimit_service_rate_limit_{name}{{{labels}}}"),
        )
    };
    let remote = "domain=\"edge\",key1=\"remote_address\"";
    assert!(stat("total_hits", remote) >= 4.0, "{metrics}");
    assert!(stat("over_limit", remote) >= 1.0, "{metrics}");
    assert!(stat("within_limit", remote) >= 3.0, "{metrics}");
    assert!(stat("near_limit", remote) >= 1.0, "{metrics}");
    assert!(
        stat("shadow_mode", "domain=\"edge\",key1=\"user\"") >= 1.0,
        "{metrics}"
    );
    assert!(
        stat(
            "total_hits",
            "domain=\"edge\",key1=\"tenant\",key2=\"plan_premium\""
        ) >= 1.0,
        "{metrics}"
    );
    assert!(
        !metrics.contains("10.0.0.1"),
        "request values are never labels"
    );
    server.stop();
}

#[tokio::test]
async fn envoyproxy_configuration_on_redis() {
    let redis = RedisServer::start();
    let storage = redis_storage(&redis);
    let mut server = start(&storage, "redis");
    envoyproxy_semantics(&server).await;
    // The descriptors' buckets are in Redis, opaque.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.connection())
        .unwrap();
    assert!(keys.iter().any(|k| k.starts_with("sl:{")));
    assert!(
        keys.iter()
            .all(|k| !k.contains("10.0.0") && !k.contains("api"))
    );
    server.stop();
}

#[tokio::test]
async fn envoyproxy_configuration_on_redis_cluster() {
    // Descriptors have tags of their own, on different slots: the same
    // semantics (all descriptors all or nothing) hold across masters.
    let cluster = RedisCluster::start(3, 0);
    let storage = format!(
        "storage:\n  backend: redis-cluster\n  nodes: [{}]\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\n",
        cluster.urls().join(", ")
    );
    let mut server = start(&storage, "cluster");
    envoyproxy_semantics(&server).await;
    server.stop();
    let log = server.log.lock().unwrap().clone();
    assert!(
        !log.contains("CROSSSLOT") && !log.contains("failure policy"),
        "{log}"
    );
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
    assert_eq!(
        overall(&ask(&mut c, "sluice", pay("f1"), 0).await),
        Code::OverLimit
    );
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
async fn malformed_requests_are_invalid_arguments_health_is_served_and_other_services_are_not() {
    let mut server = start("", "invalid");
    let mut c = client(&server).await;
    let cases = [
        RateLimitRequest {
            domain: String::new(),
            descriptors: vec![descriptor(&[("a", "b")])],
            hits_addend: 0,
        },
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![],
            hits_addend: 0,
        },
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![descriptor(&[("a", "b")])],
            hits_addend: 2_000_000,
        },
    ];
    for request in cases {
        let status = c.should_rate_limit(request.clone()).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{request:?}");
    }
    // An entry with an empty key is no error, as upstream takes it: no
    // configured key is empty, so the descriptor matches no limit there.
    for (domain, entries) in [
        ("edge", &[("", "b")][..]),
        ("edge", &[("remote_address", "10.9.9.9"), ("", "")]),
        ("sluice", &[("tenant", "t-empty-key"), ("", "b")]),
    ] {
        let r = ask(&mut c, domain, vec![descriptor(entries)], 0).await;
        assert_eq!(codes(&r), [Code::Ok], "{entries:?}");
    }
    let r = ask(&mut c, "edge", vec![descriptor(&[("", "b")])], 0).await;
    assert!(r.statuses[0].current_limit.is_none(), "{r:?}");
    // The bounds on descriptors (256) and on a descriptor's entries (64),
    // named with the count sent; one under each passes.
    let many = |descriptors: usize, entries: usize| RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor(&vec![("a", "b"); entries]); descriptors],
        hits_addend: 0,
    };
    let status = c.should_rate_limit(many(1_000, 1)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("`descriptors` must hold 1 to 256 descriptors, got 1000"),
        "{}",
        status.message()
    );
    let status = c.should_rate_limit(many(2, 65)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status
            .message()
            .contains("`descriptors[0].entries` must hold at most 64 entries"),
        "{}",
        status.message()
    );
    let answer = c.should_rate_limit(many(256, 1)).await.unwrap();
    assert_eq!(answer.into_inner().statuses.len(), 256);
    let answer = c.should_rate_limit(many(1, 64)).await.unwrap();
    assert_eq!(answer.into_inner().statuses.len(), 1);
    let channel = Channel::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let reply = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        reply.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // A service, or a method of the Rate Limit Service, this server does
    // not have: UNIMPLEMENTED, naming it.
    let mut grpc = tonic::client::Grpc::new(channel);
    for (path, named) in [
        ("/no.such.Service/Check", "no.such.Service"),
        (
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldNot",
            "ShouldNot",
        ),
    ] {
        grpc.ready().await.unwrap();
        let status = grpc
            .unary(
                tonic::Request::new(tonic_health::pb::HealthCheckRequest::default()),
                http::uri::PathAndQuery::from_static(path),
                tonic_prost::ProstCodec::<
                    tonic_health::pb::HealthCheckRequest,
                    tonic_health::pb::HealthCheckResponse,
                >::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
        assert!(status.message().contains(named), "{status:?}");
    }
    drop((c, health));
    server.stop();
}

/// Fuzzing `ShouldRateLimit`: whatever the domain, descriptors, overrides
/// and hits, the answer is a status per descriptor or `INVALID_ARGUMENT`,
/// never another error, and the service keeps serving.
#[test]
fn any_request_gets_statuses_or_invalid_argument() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    let text = || {
        prop_oneof![
            6 => prop::sample::select(vec![
                "remote_address",
                "path",
                "tenant",
                "plan",
                "user",
                "bucket",
                "route",
                "subject",
                "premium",
                "/api/x",
                "/blocked",
                "GET /"
            ])
            .prop_map(str::to_owned),
            2 => "\\PC{0,20}",
            1 => "[a-z]{200,300}",
        ]
    };
    let entry = (text(), text()).prop_map(|(key, value)| Entry { key, value });
    let limit = prop::option::weighted(0.2, (any::<u32>(), -1i32..8)).prop_map(|o| {
        o.map(|(requests_per_unit, unit)| RateLimitOverride {
            requests_per_unit,
            unit,
        })
    });
    let descriptor = (
        prop::collection::vec(entry, 1..4),
        limit,
        prop::option::weighted(0.3, prop_oneof![4 => 0u64..4, 1 => Just(u64::MAX)]),
    )
        .prop_map(|(entries, limit, hits)| RateLimitDescriptor {
            entries,
            limit,
            hits_addend: hits.map(|value| UInt64Value { value }),
            ..Default::default()
        });
    let request = (
        prop::sample::select(vec!["edge", "edge", "sluice", "sluice", "", "other"]),
        prop::collection::vec(descriptor, 0..5),
        prop_oneof![8 => 0u32..3, 1 => Just(u32::MAX)],
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain: domain.to_owned(),
            descriptors,
            hits_addend,
        });

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut server = start("", "fuzz");
    let c = runtime.block_on(client(&server));
    let mut runner = TestRunner::new(Config {
        cases: 1000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&request, |request| {
            let asked = request.descriptors.len();
            match runtime.block_on(c.clone().should_rate_limit(request)) {
                Ok(response) => {
                    let response = response.into_inner();
                    prop_assert_eq!(response.statuses.len(), asked);
                    prop_assert!(matches!(overall(&response), Code::Ok | Code::OverLimit));
                }
                Err(status) => {
                    prop_assert_eq!(
                        status.code(),
                        tonic::Code::InvalidArgument,
                        "{}",
                        status.message()
                    );
                    prop_assert!(!status.message().is_empty());
                }
            }
            Ok(())
        })
        .unwrap();
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

/// envoyproxy/ratelimit's current configuration language, as its own
/// tests exercise it: wildcards anywhere, share_threshold, quota_mode,
/// replaces of a blocking limit, and the keys that only shape stats.
const CURRENT_LANGUAGE: &str = r#"
domain: lang
descriptors:
  - key: path
    value: "/v1/*/invoices/*"
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: file
    value: "*.pdf"
    share_threshold: true
    detailed_metric: true
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: file
    value: "*.csv"
    value_to_metric: true
    metadata: { owner: { team: billing }, tags: [a, b] }
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: quota_a
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: quota_b
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: closed
    rate_limit: { unit: second, requests_per_unit: 0, name: closed }
  - key: opener
    rate_limit: { unit: hour, requests_per_unit: 5, replaces: [{ name: closed }] }
"#;

async fn current_language(server: &Server) {
    let mut c = client(server).await;
    let one = |k: &str, v: &str| vec![descriptor(&[(k, v)])];
    // Matching: a `*` in the middle, and more than one.
    let r = ask(&mut c, "lang", one("path", "/v1/acme/invoices/7"), 0).await;
    assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 0));
    let r = ask(&mut c, "lang", one("path", "/v1/acme/invoices/8"), 0).await;
    assert_eq!(overall(&r), Code::Ok, "each value counts on its own");
    let r = ask(&mut c, "lang", one("path", "/v1/acme/bills/7"), 0).await;
    assert!(r.statuses[0].current_limit.is_none(), "no limit matched");
    // What Envoy may send is answered: an empty descriptor (no limit), a
    // long value, many descriptors.
    let r = ask(&mut c, "lang", vec![descriptor(&[])], 0).await;
    assert_eq!(codes(&r), [Code::Ok]);
    let long = format!("/v1/{}/invoices/1", "a".repeat(10_000));
    assert_eq!(
        overall(&ask(&mut c, "lang", one("path", &long), 0).await),
        Code::Ok
    );
    let many: Vec<_> = (0..200)
        .map(|i| descriptor(&[("k", &i.to_string())]))
        .collect();
    assert_eq!(ask(&mut c, "lang", many, 0).await.statuses.len(), 200);
    // `hits_addend: 0` checks without consuming.
    let check = |v: &str| {
        let mut d = descriptor(&[("path", v)]);
        d.hits_addend = Some(UInt64Value { value: 0 });
        vec![d]
    };
    for _ in 0..3 {
        let r = ask(&mut c, "lang", check("/v1/x/invoices/1"), 0).await;
        assert_eq!((overall(&r), r.statuses[0].limit_remaining), (Code::Ok, 1));
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            1
        );
    }
    let r = ask(&mut c, "lang", check("/v1/acme/invoices/7"), 0).await;
    assert_eq!(
        (overall(&r), r.statuses[0].limit_remaining),
        (Code::Ok, 0),
        "spent"
    );
    let r = ask(&mut c, "lang", one("path", "/v1/x/invoices/1"), 0).await;
    assert_eq!(overall(&r), Code::Ok, "the checks consumed nothing");
    // Counting: share_threshold puts every matched value in one bucket;
    // without it each value has its own.
    for (value, code) in [
        ("a.pdf", Code::Ok),
        ("b.pdf", Code::Ok),
        ("c.pdf", Code::OverLimit),
    ] {
        assert_eq!(
            overall(&ask(&mut c, "lang", one("file", value), 0).await),
            code,
            "{value}"
        );
    }
    for value in ["a.csv", "b.csv"] {
        assert_eq!(
            overall(&ask(&mut c, "lang", one("file", value), 0).await),
            Code::Ok,
            "{value}"
        );
    }
    // Quota mode: a quota descriptor over its limit says so, but the
    // request is over only when every quota descriptor is.
    let quotas = || {
        vec![
            descriptor(&[("quota_a", "x")]),
            descriptor(&[("quota_b", "x")]),
        ]
    };
    let r = ask(&mut c, "lang", vec![descriptor(&[("quota_a", "x")])], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    let r = ask(&mut c, "lang", quotas(), 0).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    assert_eq!(overall(&r), Code::Ok, "quota_b still had room");
    let r = ask(&mut c, "lang", quotas(), 0).await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::OverLimit]);
    assert_eq!(
        overall(&r),
        Code::OverLimit,
        "every quota descriptor is over"
    );
    // Replaces: a limit that replaces a blocking one lifts the block.
    let r = ask(&mut c, "lang", one("closed", "x"), 0).await;
    assert_eq!(overall(&r), Code::OverLimit);
    let r = ask(
        &mut c,
        "lang",
        vec![
            descriptor(&[("closed", "x")]),
            descriptor(&[("opener", "x")]),
        ],
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok, Code::Ok]);
    assert_eq!(r.statuses[1].limit_remaining, 4);
    // Stats name request values only where the file asks: value_to_metric
    // names each csv; share_threshold keeps the pdf pattern even though
    // detailed_metric is set; otherwise the configured key. (A `.` splits
    // labels, as upstream's statsd mapping splits them.)
    let metrics = common::get_text(&reqwest::Client::new(), server, "/metrics").await;
    let hits = |labels: &str| {
        common::metric_total(
            &metrics,
            &format!("ratelimit_service_rate_limit_total_hits{{domain=\"lang\",{labels}}}"),
        )
    };
    assert_eq!(hits("key1=\"file_a\",key2=\"csv\""), 1.0, "{metrics}");
    assert_eq!(hits("key1=\"file_*\",key2=\"pdf\""), 3.0, "{metrics}");
    assert!(!metrics.contains("file_a.pdf"), "{metrics}");
    assert!(
        !metrics.contains("acme"),
        "values of other limits stay out: {metrics}"
    );
}

#[tokio::test]
async fn the_current_configuration_language_on_memory_and_redis() {
    let mut server = start_with("", "lang-memory", &[("lang.yaml", CURRENT_LANGUAGE)]);
    current_language(&server).await;
    server.stop();
    let redis = RedisServer::start();
    let storage = redis_storage(&redis);
    let mut server = start_with(&storage, "lang-redis", &[("lang.yaml", CURRENT_LANGUAGE)]);
    current_language(&server).await;
    server.stop();
}

#[tokio::test]
async fn envoyproxy_http_endpoints_healthcheck_json_and_rlconfig() {
    let mut server = start("", "upstream-http");
    let http = reqwest::Client::new();
    let health = http
        .get(format!("{}/healthcheck", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "OK");
    // `POST /json`: ShouldRateLimit in protobuf's JSON form.
    let ask_json = |body: serde_json::Value| {
        let http = http.clone();
        let url = format!("{}/json", server.base);
        async move {
            let response = http.post(url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    let request = serde_json::json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "remote_address", "value": "10.9.9.9"}]}],
        "hitsAddend": 1
    });
    let (status, body) = ask_json(request.clone()).await;
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["overallCode"], "OK");
    assert_eq!(answer["statuses"][0]["code"], "OK");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 2);
    assert_eq!(answer["statuses"][0]["currentLimit"]["requestsPerUnit"], 3);
    assert_eq!(answer["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    // snake_case names, as protobuf's JSON parser also takes them.
    let snake = serde_json::json!({
        "domain": "edge",
        "descriptors": [{"entries": [{"key": "remote_address", "value": "10.9.9.9"}], "hits_addend": "2"}]
    });
    let (status, body) = ask_json(snake).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = ask_json(request).await;
    assert_eq!(status, 429, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["overallCode"], "OVER_LIMIT");
    for bad in [
        serde_json::json!({"domain": "edge", "descriptors": []}),
        serde_json::json!({"domain": "edge", "bogus": 1}),
        serde_json::json!([]),
        serde_json::json!({"domain": "edge", "descriptors": [5]}),
        serde_json::json!({"domain": "edge", "descriptors": [{"entries": ["x"]}]}),
        serde_json::json!({"domain": "edge", "descriptors": [{"entries": [], "limit": 5}]}),
    ] {
        let (status, body) = ask_json(bad).await;
        assert_eq!(status, 400, "{body}");
        assert!(!body.contains("Json"), "no type of ours: {body}");
    }
    // Numbers as protobuf's JSON writes them (a string of one too); the
    // field of anything else named.
    let entry = serde_json::json!([{"key": "remote_address", "value": "10.9.9.8"}]);
    let (status, body) = ask_json(serde_json::json!({
        "domain": "edge", "descriptors": [{"entries": entry}], "hitsAddend": "1"
    }))
    .await;
    assert_eq!(status, 200, "{body}");
    for (bad, field) in [
        (serde_json::json!({"hitsAddend": -1}), "hitsAddend"),
        (serde_json::json!({"hitsAddend": "many"}), "hitsAddend"),
        (
            serde_json::json!({"hitsAddend": 4294967296u64}),
            "hitsAddend",
        ),
        (
            serde_json::json!({"descriptors": [{"entries": entry, "hitsAddend": "abc"}]}),
            "descriptors[0].hits_addend",
        ),
        (
            serde_json::json!({"descriptors": [{"entries": entry, "hitsAddend": true}]}),
            "descriptors[0].hits_addend",
        ),
        (
            serde_json::json!({"descriptors": [{"entries": entry, "limit": {"requestsPerUnit": 5, "unit": "FORTNIGHT"}}]}),
            "descriptors[0].limit.unit",
        ),
    ] {
        let mut request = serde_json::json!({
            "domain": "edge", "descriptors": [{"entries": entry}]
        });
        for (key, value) in bad.as_object().unwrap() {
            request[key] = value.clone();
        }
        let (status, body) = ask_json(request).await;
        assert_eq!(status, 400, "{bad}: {body}");
        let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["invalid-params"][0]["name"], field, "{body}");
    }
    // `/rlconfig`: the loaded limits, keys and numbers only.
    let dump = common::get_text(&http, &server, "/rlconfig").await;
    assert!(
        dump.contains(
            "edge.remote_address: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false"
        ),
        "{dump}"
    );
    assert!(!dump.contains("3e1d9c7b"), "no secrets");
    server.stop();
}

/// A Kubernetes ConfigMap as mounted: the files are symlinks into `..data`,
/// itself a symlink to a timestamped directory that an update swaps.
fn configmap(dir: &std::path::Path, version: &str, files: &[(&str, &str)]) {
    let stamped = dir.join(format!("..{version}"));
    std::fs::create_dir_all(&stamped).unwrap();
    for (name, text) in files {
        std::fs::write(stamped.join(name), text).unwrap();
        let link = dir.join(name);
        if !link.exists() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
    let next = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(format!("..{version}"), &next).unwrap();
    std::fs::rename(&next, dir.join("..data")).unwrap();
}

#[tokio::test]
async fn an_envoyproxy_ratelimit_manifest_starts_sluice() {
    let redis = RedisServer::start();
    let runtime = temp_dir("runtime");
    let root = runtime.path();
    let config = root.join("ratelimit").join("config");
    std::fs::create_dir_all(&config).unwrap();
    let limit = |n: u32| {
        format!(
            "domain: k8s\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {n} }}\n"
        )
    };
    // Every file of the directory is loaded, with or without `.yaml`.
    let other = "domain: other\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";
    configmap(
        &config,
        "v1",
        &[("config.yaml", &limit(2)), ("other", other)],
    );
    let port = redis.port().to_string();
    let root_text = root.display().to_string();
    let prometheus = format!("127.0.0.1:{}", sluice_testkit::free_port(false));
    let mut server = Server::start_with_env(
        &["--envoyproxy-env"],
        &[
            ("RUNTIME_ROOT", root_text.as_str()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &format!("127.0.0.1:{port}")),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
            ("LOG_LEVEL", "info"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &prometheus),
            ("PROMETHEUS_PATH", "/stats"),
            (
                "SLUICE_PEPPER",
                "6c1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f72",
            ),
        ],
    );
    let mut c = client(&server).await;
    let one = |v: &str| vec![descriptor(&[("user", v)])];
    for code in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(overall(&ask(&mut c, "k8s", one("a"), 0).await), code);
    }
    let r = ask(&mut c, "other", vec![descriptor(&[("k", "x")])], 0).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    // The buckets are in that Redis, opaque.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sl:*")
        .query(&mut redis.connection())
        .unwrap();
    assert!(!keys.is_empty() && keys.iter().all(|k| !k.contains("user")));
    // The scrape the manifest points at PROMETHEUS_ADDR still finds
    // upstream's stats; statsd is said not to be pushed.
    let stats = reqwest::get(format!("http://{prometheus}/stats"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        stats.contains(r#"ratelimit_service_rate_limit_over_limit{domain="k8s",key1="user"} 1"#),
        "{stats}"
    );
    server.wait_for_log("sluice pushes no statsd");
    // A ConfigMap update (the `..data` swap) is picked up.
    configmap(
        &config,
        "v2",
        &[("config.yaml", &limit(5)), ("other", other)],
    );
    server.wait_for_log("configuration reloaded");
    let r = ask(&mut c, "k8s", one("a"), 0).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
    drop(c);
    server.stop();
}
