//! Overrides across regions (`storage.regions`): set, changed or removed
//! in any region, the same in every region, with real `sluice serve`
//! processes on their own redis-servers.

mod common;

use std::time::{Duration, Instant};

use common::regions::{
    ADMIN, PEPPER, config_with, linked, override_becomes, override_call, wall_ms,
};
use common::{Server, post};
use serde_json::{Value, json};
use sluice_testkit::{DelayProxy, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_set_in_one_region_applies_in_every_region_and_the_last_write_wins() {
    let redis: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let admin = "admin:\n  token_env: TEST_SLUICE_ADMIN\n";
    let env = [("TEST_SLUICE_PEPPER", PEPPER), ("TEST_SLUICE_ADMIN", ADMIN)];
    let eu = config_with("eu", &redis[0], &[("us", redis[1].url())], admin);
    let us = config_with("us", &redis[1], &[("eu", redis[0].url())], admin);
    let eu = Server::start_with_env(&["--config", eu.to_str().unwrap()], &env).keep(eu);
    let us = Server::start_with_env(&["--config", us.to_str().unwrap()], &env).keep(us);
    let client = reqwest::Client::new();
    for server in [&eu, &us] {
        linked(&client, server).await;
    }

    // Set in eu, it reaches us, and us's decisions follow it: 150 × 0.02
    // is 3 a window across both regions.
    let put = reqwest::Method::PUT;
    let (status, body) = override_call(
        &client,
        &eu,
        put.clone(),
        "acme",
        Some(json!({ "factor": 0.02 })),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let heard = override_becomes(&client, &us, "acme", 200, "never reached us").await;
    assert_eq!(heard["factor"], json!(0.02), "{heard}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut admitted = 0;
    for _ in 0..20 {
        let (status, _) = post(
            &client,
            &us.base,
            json!({ "tenant": "acme", "route": "GET /" }),
        )
        .await;
        admitted += u32::from(status == 200);
    }
    // At most two windows' pool, if the burst straddled a window's end.
    assert!(
        admitted <= 6,
        "us admitted {admitted} of 20 under a limit of 3"
    );

    // Deleted in us, it is gone in eu, and an older value shipped again
    // (every 20 syncs, everything is) does not bring it back.
    let (status, _) = override_call(&client, &us, reqwest::Method::DELETE, "acme", None).await;
    assert_eq!(status, 204);
    override_becomes(&client, &eu, "acme", 404, "the delete never reached eu").await;
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    for server in [&eu, &us] {
        let (status, body) =
            override_call(&client, server, reqwest::Method::GET, "acme", None).await;
        assert_eq!(status, 404, "came back: {body}");
    }

    // Two writes at once, one per region: both regions settle on the same
    // one, the later.
    let (a, b) = tokio::join!(
        override_call(
            &client,
            &eu,
            put.clone(),
            "beta",
            Some(json!({ "factor": 0.5 }))
        ),
        override_call(
            &client,
            &us,
            put.clone(),
            "beta",
            Some(json!({ "factor": 0.25 }))
        ),
    );
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    let later = if a.1["version"].as_u64() > b.1["version"].as_u64() {
        &a.1
    } else {
        &b.1
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, in_eu) = override_call(&client, &eu, reqwest::Method::GET, "beta", None).await;
        let (_, in_us) = override_call(&client, &us, reqwest::Method::GET, "beta", None).await;
        if in_eu == in_us && in_eu["factor"] == later["factor"] {
            assert_eq!(in_eu["version"], later["version"], "{in_eu}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never settled on {later}: eu {in_eu}, us {in_us}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two regions with the admin API, each reaching the other through a
/// proxy (5 ms each way) that a test can cut.
fn admin_regions() -> (Vec<RedisServer>, [DelayProxy; 2], Server, Server) {
    let redis: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let to_us = DelayProxy::start(redis[1].port(), Duration::from_millis(5));
    let to_eu = DelayProxy::start(redis[0].port(), Duration::from_millis(5));
    let admin = "admin:\n  token_env: TEST_SLUICE_ADMIN\n";
    let env = [("TEST_SLUICE_PEPPER", PEPPER), ("TEST_SLUICE_ADMIN", ADMIN)];
    let eu = config_with("eu", &redis[0], &[("us", to_us.url())], admin);
    let us = config_with("us", &redis[1], &[("eu", to_eu.url())], admin);
    let eu = Server::start_with_env(&["--config", eu.to_str().unwrap()], &env).keep(eu);
    let us = Server::start_with_env(&["--config", us.to_str().unwrap()], &env).keep(us);
    (redis, [to_us, to_eu], eu, us)
}

/// Waits until both regions answer the same for `tenant`'s override (or
/// panics after 10 s): that answer.
async fn settled(client: &reqwest::Client, eu: &Server, us: &Server, tenant: &str) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let in_eu = override_call(client, eu, reqwest::Method::GET, tenant, None).await;
        let in_us = override_call(client, us, reqwest::Method::GET, tenant, None).await;
        if in_eu == in_us {
            return in_eu;
        }
        assert!(
            Instant::now() < deadline,
            "never settled: eu {in_eu:?}, us {in_us:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_regions_never_write_the_same_version_so_if_match_sees_a_replicated_change() {
    let (redis, proxies, eu, us) = admin_regions();
    let client = reqwest::Client::new();
    for server in [&eu, &us] {
        linked(&client, server).await;
    }
    // eu's change counter an hour ahead (a write from a region whose clock
    // ran fast), heard in us: both regions' next versions follow it, not
    // their clocks.
    let put = reqwest::Method::PUT;
    let warm = Some(json!({ "factor": 2 }));
    assert_eq!(
        override_call(&client, &eu, put.clone(), "warm", warm.clone())
            .await
            .0,
        200
    );
    let mut connection = redis[0].client().get_connection().unwrap();
    let counters: Vec<String> = redis::cmd("KEYS")
        .arg("*{admin}:version")
        .query(&mut connection)
        .unwrap();
    let ahead = (wall_ms() + 3_600_000) * 1_000;
    let _: () = redis::cmd("SET")
        .arg(&counters[0])
        .arg(ahead)
        .query(&mut connection)
        .unwrap();
    let (status, body) = override_call(&client, &eu, put.clone(), "warm", warm).await;
    assert_eq!(status, 200, "{body}");
    let (_, warmed) = settled(&client, &eu, &us, "warm").await;
    assert!(warmed["version"].as_u64() > Some(ahead), "{warmed}");
    // Cut off, each region changes acme: two versions, one per region.
    for proxy in &proxies {
        proxy.cut();
    }
    let (a, b) = tokio::join!(
        override_call(
            &client,
            &eu,
            put.clone(),
            "acme",
            Some(json!({ "factor": 0.5 }))
        ),
        override_call(
            &client,
            &us,
            put.clone(),
            "acme",
            Some(json!({ "factor": 0.25 }))
        ),
    );
    assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
    assert_ne!(a.1["version"], b.1["version"], "two writes, one version");
    for proxy in &proxies {
        proxy.heal();
    }
    // Healed: the region whose write lost refuses its client's If-Match.
    let (_, kept) = settled(&client, &eu, &us, "acme").await;
    let (loser, written) = if kept["factor"] == a.1["factor"] {
        (&us, &b.1)
    } else {
        (&eu, &a.1)
    };
    let response = client
        .put(format!("{}/v1/admin/overrides/acme", loser.base))
        .bearer_auth(ADMIN)
        .header("If-Match", format!("\"{}\"", written["version"]))
        .json(&json!({ "factor": 0.1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status().as_u16(),
        412,
        "If-Match {} passed though acme changed from {} to {} meanwhile",
        written["version"],
        written["factor"],
        kept["factor"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expiry_of_a_replaced_override_never_removes_its_replacement() {
    let (_redis, proxies, eu, us) = admin_regions();
    let client = reqwest::Client::new();
    for server in [&eu, &us] {
        linked(&client, server).await;
    }
    let put = reqwest::Method::PUT;
    let expiring = Some(json!({ "factor": 0.5, "expires_in": "3s" }));
    let (status, body) = override_call(&client, &eu, put.clone(), "acme", expiring).await;
    assert_eq!(status, 200, "{body}");
    override_becomes(&client, &us, "acme", 200, "never reached us").await;
    // Cut off, us replaces it for good while eu sees it expire.
    for proxy in &proxies {
        proxy.cut();
    }
    let replacement = Some(json!({ "factor": 0.25 }));
    let (status, replaced) = override_call(&client, &us, put.clone(), "acme", replacement).await;
    assert_eq!(status, 200, "{replaced}");
    override_becomes(&client, &eu, "acme", 404, "never expired in eu").await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    for proxy in &proxies {
        proxy.heal();
    }
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let (status, body) = settled(&client, &eu, &us, "acme").await;
    assert_eq!(
        (status, &body["factor"]),
        (200, &json!(0.25)),
        "the replacement {replaced} was removed by the expiry of what it replaced: {body}"
    );
}
