//! envoyproxy/ratelimit's quota mode, with its own example configuration
//! (`examples/ratelimit/config/example.yaml`, domain `rl`) and the call
//! sequences of its integration scripts (`token-quota.sh`, `quota.sh`,
//! `multiservice-tokenquota.sh`), on the memory store, Redis and Redis
//! Cluster: a quota descriptor's hits count even past its limit (a debit:
//! the bucket owes), `hits_addend: 0` only checks and is over while the
//! bucket owes, and the request is over when every quota descriptor is.

use envoy_types::pb::google::protobuf::UInt64Value;

use super::*;

/// The quota descriptors of envoyproxy/ratelimit's example configuration.
const EXAMPLE: &str = r#"
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
    metadata:
      service_with_quota:
        name: "service_2"
"#;

fn service(name: &str, hits: Option<u64>) -> RateLimitDescriptor {
    let mut d = descriptor(&[("service", name)]);
    d.hits_addend = hits.map(|value| UInt64Value { value });
    d
}

/// `/tokenquota`: a check of service_2 with `hits_addend: 0` on the
/// request path, a debit of 1 when the stream is done. Three requests
/// pass (the third check finds 2 of 2 used: at the limit, not past it),
/// the fourth is limited.
async fn token_quota(c: &mut RateLimitServiceClient<Channel>, domain: &str) {
    for request in 1..=4 {
        let check = ask(c, domain, vec![service("service_2", Some(0))], 0).await;
        if request < 4 {
            assert_eq!(overall(&check), Code::Ok, "request {request}: {check:?}");
        } else {
            assert_eq!(
                overall(&check),
                Code::OverLimit,
                "request 4 is limited: {check:?}"
            );
            assert_eq!(codes(&check), [Code::OverLimit]);
            return;
        }
        // The stream is done: its hit counts, past the limit too.
        ask(c, domain, vec![service("service_2", Some(1))], 0).await;
    }
}

/// `/quota`: both services, one hit each. The second request leaves
/// service_1 past its limit but service_2 within: allowed; the third has
/// both past: limited.
async fn quota(c: &mut RateLimitServiceClient<Channel>, domain: &str) {
    let both = || vec![service("service_1", None), service("service_2", None)];
    let first = ask(c, domain, both(), 0).await;
    assert_eq!(
        (overall(&first), codes(&first)),
        (Code::Ok, vec![Code::Ok, Code::Ok])
    );
    let second = ask(c, domain, both(), 0).await;
    assert_eq!(codes(&second), [Code::OverLimit, Code::Ok]);
    assert_eq!(overall(&second), Code::Ok, "service_2 still has quota");
    let third = ask(c, domain, both(), 0).await;
    assert_eq!(codes(&third), [Code::OverLimit, Code::OverLimit]);
    assert_eq!(overall(&third), Code::OverLimit);
}

/// `/multiservice-tokenquota`: both services checked with `hits_addend:
/// 0`, the one that served debited 1. Service 1 serves two requests,
/// service 2 three, the sixth is limited.
async fn multiservice_token_quota(c: &mut RateLimitServiceClient<Channel>, domain: &str) {
    let checks = || vec![service("service_1", Some(0)), service("service_2", Some(0))];
    let mut served = Vec::new();
    for request in 1..=6 {
        let check = ask(c, domain, checks(), 0).await;
        if request == 6 {
            assert_eq!(codes(&check), [Code::OverLimit, Code::OverLimit]);
            assert_eq!(overall(&check), Code::OverLimit, "the sixth is limited");
            break;
        }
        assert_eq!(overall(&check), Code::Ok, "request {request}: {check:?}");
        // The first service with quota left serves it.
        let by = if codes(&check)[0] == Code::Ok {
            "service_1"
        } else {
            "service_2"
        };
        served.push(by);
        ask(c, domain, vec![service(by, Some(1))], 0).await;
    }
    assert_eq!(
        served,
        [
            "service_1",
            "service_1",
            "service_2",
            "service_2",
            "service_2"
        ]
    );
}

/// The three sequences, each on buckets of its own: the example
/// configuration under three domains.
async fn quota_mode(server: &Server) {
    let mut c = client(server).await;
    token_quota(&mut c, "rl").await;
    quota(&mut c, "quota").await;
    multiservice_token_quota(&mut c, "multi").await;
}

fn start_example(storage: &str, name: &str) -> Server {
    let under = |domain: &str| EXAMPLE.replace("domain: rl", &format!("domain: {domain}"));
    start_with(
        storage,
        name,
        &[
            ("rl.yaml", EXAMPLE),
            ("quota.yaml", &under("quota")),
            ("multi.yaml", &under("multi")),
        ],
    )
}

#[tokio::test]
async fn envoyproxy_quota_sequences_on_memory() {
    let mut server = start_example("", "quota-memory");
    quota_mode(&server).await;
    server.stop();
}

#[tokio::test]
async fn envoyproxy_quota_sequences_on_redis() {
    let redis = RedisServer::start();
    let mut server = start_example(&redis_storage(&redis), "quota-redis");
    quota_mode(&server).await;
    server.stop();
}

#[tokio::test]
async fn envoyproxy_quota_sequences_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let storage = cluster_storage(&cluster);
    let mut server = start_example(&storage, "quota-cluster");
    quota_mode(&server).await;
    server.stop();
}

/// Hits up to 2^32 - 1 are taken on the request and on a descriptor, and
/// counted on a quota descriptor.
#[tokio::test]
async fn the_largest_hits_addend_is_taken() {
    let mut server = start_example("", "quota-large");
    let mut c = client(&server).await;
    let big = ask(
        &mut c,
        "rl",
        vec![service("service_1", Some(u64::from(u32::MAX)))],
        0,
    )
    .await;
    assert_eq!(overall(&big), Code::OverLimit, "{big:?}");
    let r = ask(&mut c, "rl", vec![service("service_2", None)], u32::MAX).await;
    assert_eq!(overall(&r), Code::OverLimit, "{r:?}");
    let check = ask(&mut c, "rl", vec![service("service_1", Some(0))], 0).await;
    assert_eq!(overall(&check), Code::OverLimit, "owing: {check:?}");
    let mut too_big = service("service_1", Some(u64::from(u32::MAX) + 1));
    too_big.hits_addend = Some(UInt64Value {
        value: u64::from(u32::MAX) + 1,
    });
    let refused = c
        .should_rate_limit(RateLimitRequest {
            domain: "rl".into(),
            descriptors: vec![too_big],
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert!(refused.message().contains("hits_addend"), "{refused:?}");
    server.stop();
}
