//! Malformed and arbitrary requests, health, and services that are not
//! served.

use super::*;

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
