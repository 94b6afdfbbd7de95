//! `envoy.tolerance` on a real Redis: a descriptor of an
//! envoyproxy/ratelimit domain decided hundreds of times a second is
//! decided from slices, far fewer FCALLs than requests; the same domain
//! without a tolerance costs one FCALL per request.

use super::*;

const HOT_DOMAIN: &str = r#"
domain: hot
descriptors:
  - key: client
    rate_limit: { unit: minute, requests_per_unit: 1200000 }
"#;

/// Sends `ShouldRateLimit` for one client from 8 tasks for 2 s: requests
/// answered OK, and the FCALLs Redis ran meanwhile.
async fn hammer(server: &Server, redis: &RedisServer) -> (u64, u64) {
    let fcalls = || {
        sluice_testkit::command_calls(&mut redis.connection())
            .get("fcall")
            .copied()
            .unwrap_or(0)
    };
    let before = fcalls();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut c = client(server).await;
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u64;
            while std::time::Instant::now() < until {
                let r = ask(&mut c, "hot", vec![descriptor(&[("client", "c1")])], 0).await;
                assert_eq!(overall(&r), Code::Ok);
                ok += 1;
            }
            ok
        }));
    }
    let mut requests = 0;
    for task in tasks {
        requests += task.await.unwrap();
    }
    (requests, fcalls() - before)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_tolerance_decides_hot_descriptors_from_slices() {
    let redis = RedisServer::start();
    let storage = redis_storage(&redis);
    let with = format!("{storage}envoy:\n  tolerance: \"1%\"\n");
    let mut server = start_with(&with, "tolerant", &[("hot.yaml", HOT_DOMAIN)]);
    let (requests, fcalls) = hammer(&server, &redis).await;
    assert!(requests > 1_000, "only {requests} requests");
    assert!(
        fcalls * 10 < requests,
        "{fcalls} FCALLs for {requests} requests"
    );
    server.stop();

    let mut server = start_with(&storage, "exact", &[("hot.yaml", HOT_DOMAIN)]);
    let (requests, fcalls) = hammer(&server, &redis).await;
    assert!(
        fcalls >= requests,
        "without a tolerance, one FCALL per request: {fcalls} for {requests}"
    );
    server.stop();
}
