//! Each descriptor's status field by field, as envoyproxy/ratelimit
//! answers it: a descriptor over its limit says so with its limit (hits
//! above what the limit can ever hold included), nothing remaining; a
//! descriptor within its limit names the limit as configured (an unnamed
//! limit has no name), beside a zero limit too. sluice consumes nothing
//! for a request over the limit, so what remains is read, not counted
//! (docs/ENVOY.md, deliberate differences).

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_testkit::{RedisCluster, RedisServer};

use crate::common::Server;
use crate::zero_limits::assert_status;
use crate::{
    ask, client, cluster_storage, codes, descriptor, header, overall, redis_storage, start,
    start_with,
};

const LIMITS: &str = r#"
domain: st
descriptors:
  - key: blocked
    rate_limit: { unit: minute, requests_per_unit: 0 }
  - key: counted
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: named
    rate_limit: { unit: minute, requests_per_unit: 10, name: wide }
  - key: watched
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 3 }
"#;

const COUNTED: (u32, Unit, &str) = (3, Unit::Minute, "");

async fn statuses(server: &Server) {
    let mut c = client(server).await;
    let code = |s: &DescriptorStatus| Code::try_from(s.code).unwrap();
    let heavy = |entries: &[(&str, &str)], hits: u64| {
        let mut d = descriptor(entries);
        d.hits_addend = Some(UInt64Value { value: hits });
        d
    };

    // More hits than the limit can ever hold: that descriptor is over,
    // with its limit; nothing is consumed.
    let r = ask(&mut c, "st", vec![descriptor(&[("counted", "a")])], 5).await;
    assert_eq!(
        (overall(&r), code(&r.statuses[0])),
        (Code::OverLimit, Code::OverLimit)
    );
    assert_status(&r.statuses[0], COUNTED, 0);
    let r = ask(&mut c, "st", vec![descriptor(&[("counted", "a")])], 0).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_status(&r.statuses[0], COUNTED, 2);

    // The same on one descriptor of two: the other keeps its own status,
    // its limit by the name it was given, what it has left.
    let r = ask(
        &mut c,
        "st",
        vec![heavy(&[("counted", "b")], 5), descriptor(&[("named", "b")])],
        0,
    )
    .await;
    assert_eq!(overall(&r), Code::OverLimit);
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    assert_status(&r.statuses[0], COUNTED, 0);
    assert_status(&r.statuses[1], (10, Unit::Minute, "wide"), 10);

    // Hits above what is left: over, nothing remaining (not what the
    // bucket still holds for a smaller request).
    let r = ask(&mut c, "st", vec![descriptor(&[("counted", "c")])], 2).await;
    assert_status(&r.statuses[0], COUNTED, 1);
    let r = ask(&mut c, "st", vec![descriptor(&[("counted", "c")])], 2).await;
    assert_eq!(codes(&r), [Code::OverLimit]);
    assert_status(&r.statuses[0], COUNTED, 0);

    // Beside a zero limit: OK, its limit (unnamed: no name), what remains.
    let r = ask(
        &mut c,
        "st",
        vec![
            descriptor(&[("counted", "d")]),
            descriptor(&[("blocked", "x")]),
        ],
        0,
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
    assert_status(&r.statuses[0], COUNTED, 3);

    // A shadow-mode limit never denies, more hits than it holds included.
    let r = ask(&mut c, "st", vec![descriptor(&[("watched", "e")])], 5).await;
    assert_eq!((overall(&r), codes(&r)), (Code::Ok, vec![Code::Ok]));
}

#[tokio::test]
async fn descriptor_statuses_answer_as_envoyproxy_does_on_every_store() {
    let mut server = start_with("", "statuses-memory", &[("st.yaml", LIMITS)]);
    statuses(&server).await;
    server.stop();
    let redis = RedisServer::start();
    let mut server = start_with(
        &redis_storage(&redis),
        "statuses-redis",
        &[("st.yaml", LIMITS)],
    );
    statuses(&server).await;
    // Redis too slow to read what the other rules hold: the descriptor
    // that can never fit still says so, with its limit (the other's
    // standing is unknown: OK).
    let mut c = client(&server).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(500)
        .arg("ALL")
        .query(&mut redis.connection())
        .unwrap();
    let r = ask(
        &mut c,
        "st",
        vec![
            descriptor(&[("counted", "slow")]),
            descriptor(&[("named", "slow")]),
        ],
        5,
    )
    .await;
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    let limit = r.statuses[0].current_limit.as_ref().expect("its limit");
    assert_eq!(
        (limit.requests_per_unit, r.statuses[0].limit_remaining),
        (3, 0)
    );
    server.stop();
    let cluster = RedisCluster::start(3, 0);
    let storage = cluster_storage(&cluster);
    let mut server = start_with(&storage, "statuses-cluster", &[("st.yaml", LIMITS)]);
    statuses(&server).await;
    server.stop();
}

/// Envoy is answered the header fields HTTP answers: on the native domain
/// the plan's `RateLimit-Policy` and the same `RateLimit` for the same
/// standing as `/v1/check`; on an envoyproxy/ratelimit domain each counted
/// descriptor's limit, in the request's order (an unlimited one has none).
#[tokio::test]
async fn envoy_answers_the_header_fields_http_answers() {
    let server = start("", "fields");
    let mut c = client(&server).await;
    let route = |tenant| vec![descriptor(&[("tenant", tenant), ("route", "POST /x")])];
    let grpc = ask(&mut c, "sluice", route("acme"), 0).await;
    let http = reqwest::Client::new()
        .post(format!("{}/v1/check", server.base))
        .json(&serde_json::json!({"tenant": "globex", "route": "POST /x"}))
        .send()
        .await
        .unwrap();
    for name in ["RateLimit-Policy", "RateLimit"] {
        let answered = http.headers().get(name).map(|v| v.to_str().unwrap());
        assert!(answered.is_some(), "HTTP answers {name}");
        assert_eq!(header(&grpc, name), answered, "{name}");
    }
    assert_eq!(
        header(&grpc, "RateLimit-Policy"),
        Some(r#""tenant-minute";q=100;w=60, "x";q=2;w=60"#)
    );

    let descriptors = vec![
        descriptor(&[("remote_address", "10.9.9.9")]),
        descriptor(&[("path", "/api/health")]),
        descriptor(&[("path", "/api/x")]),
    ];
    let r = ask(&mut c, "edge", descriptors, 0).await;
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some(r#""edge.remote_address";q=3;w=60, "api";q=5;w=60"#)
    );
    // One descriptor: its limit's compiled items alone.
    let r = ask(&mut c, "edge", vec![descriptor(&[("path", "/api/y")])], 0).await;
    assert_eq!(header(&r, "RateLimit-Policy"), Some(r#""api";q=5;w=60"#));
}
