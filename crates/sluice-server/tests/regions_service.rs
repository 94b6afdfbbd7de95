//! `sluice serve` across regions (`storage.regions`): three real
//! redis-servers, each with its own sluice, linked through the test kit's
//! delay proxy (40 ms each way).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::regions::{
    LIMIT, OTHER_PEPPER, PEPPER, PER_MS, config, config_with, linked, readyz, wall_ms,
};
use common::{Server, get_text, metric_total, post, sluice, succeeds};
use serde_json::{Value, json};
use sluice_testkit::{DelayProxy, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sending_to_one_region_gets_the_whole_budget_and_peers_are_reported() {
    let names = ["eu", "us", "ap"];
    let redis: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut proxies = Vec::new();
    let mut servers = Vec::new();
    let mut configs = Vec::new();
    for (r, name) in names.iter().enumerate() {
        let mut peers = Vec::new();
        for (p, peer) in names.iter().enumerate() {
            if p != r {
                let proxy = DelayProxy::start(redis[p].port(), Duration::from_millis(40));
                peers.push((*peer, proxy.url()));
                proxies.push(proxy);
            }
        }
        let path = config(name, &redis[r], &peers);
        configs.push(path.to_str().unwrap().to_owned());
        let env = [("TEST_SLUICE_PEPPER", PEPPER)];
        let server = Server::start_with_env(&["--config", path.to_str().unwrap()], &env);
        servers.push(server.keep(path));
    }
    let client = reqwest::Client::new();
    for server in &servers {
        let body = linked(&client, server).await;
        assert_eq!(body["regions"].as_array().unwrap().len(), 2, "{body}");
    }

    // A tenant hammers one region (us) for two whole windows.
    let now = wall_ms();
    let start = now - now % PER_MS + PER_MS;
    tokio::time::sleep(Duration::from_millis(start - now)).await;
    let end = start + 2 * PER_MS;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (client, base) = (client.clone(), servers[1].base.clone());
        tasks.spawn(async move {
            let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
            while wall_ms() < end {
                let (status, _) = post(
                    &client,
                    &base,
                    json!({ "tenant": "acme-sends-to-us", "route": "GET /" }),
                )
                .await;
                let at = wall_ms();
                if status == 200 {
                    *admitted.entry(at - at % PER_MS).or_default() += 1;
                }
            }
            admitted
        });
    }
    let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
    while let Some(seen) = tasks.join_next().await {
        for (w, n) in seen.unwrap() {
            *admitted.entry(w).or_default() += n;
        }
    }
    println!("admitted per {PER_MS} ms window in us: {admitted:?} (limit {LIMIT})");
    for window in [start, start + PER_MS] {
        let n = admitted.get(&window).copied().unwrap_or(0);
        assert!(
            n as f64 >= 0.9 * LIMIT as f64 && n <= LIMIT,
            "window {window}: {n} admitted, not between 90% of {LIMIT} and {LIMIT}"
        );
    }

    // us heard the budget its peers granted it, and says so.
    let metrics = get_text(&client, &servers[1], "/metrics").await;
    assert!(
        metric_total(&metrics, "sluice_region_peer_units_received_total") > 0.0,
        "{metrics}"
    );
    assert_eq!(
        metric_total(&metrics, "sluice_region_peer_cut_off{"),
        0.0,
        "{metrics}"
    );
    let mut granted = 0.0;
    for r in [0, 2] {
        let metrics = get_text(&client, &servers[r], "/metrics").await;
        granted += metric_total(&metrics, "sluice_region_peer_units_shipped_total");
    }
    assert!(granted > 0.0, "eu and ap granted nothing");

    // `sluice inspect` in us shows each region's part of the window.
    let (table, _) = succeeds(
        sluice()
            .args([
                "inspect",
                "--config",
                &configs[1],
                "--tenant",
                "acme-sends-to-us",
            ])
            .env("TEST_SLUICE_PEPPER", PEPPER),
    );
    println!("{table}");
    let part = |region: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.starts_with("per-3s") && l.split_whitespace().nth(1) == Some(region))
            .unwrap_or_else(|| panic!("no part of {region}:\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert!(table.contains("across regions, this window"), "{table}");
    let ours = part("us");
    assert_eq!(ours[2], "(self)", "{table}");
    for peer in ["eu", "ap"] {
        assert_eq!(part(peer)[2], "50", "{table}");
    }
    // This window has just begun: us holds its share at least.
    assert!(ours[4].parse::<u64>().unwrap() >= 50, "{table}");

    // A region cut off is reported as such, and decisions go on.
    for proxy in &proxies {
        proxy.cut();
    }
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let (status, body) = readyz(&client, &servers[0]).await;
    assert_eq!(
        status, 200,
        "a cut-off peer does not make a region unready: {body}"
    );
    assert!(
        body["regions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["cut_off"] == true),
        "{body}"
    );
    let (status, _) = post(
        &client,
        &servers[0].base,
        json!({ "tenant": "acme-in-eu", "route": "GET /" }),
    )
    .await;
    assert_eq!(status, 200);
    // A read-only check there (inspect, as Envoy's `hits_addend: 0`)
    // finds what eu may still admit of its share, not of the whole limit.
    let (table, _) = succeeds(
        sluice()
            .args(["inspect", "--config", &configs[0], "--tenant", "acme-in-eu"])
            .env("TEST_SLUICE_PEPPER", PEPPER),
    );
    let row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("tenant") && l.split_whitespace().nth(1) == Some("per-3s"))
        .unwrap_or_else(|| panic!("no row:\n{table}"))
        .split_whitespace()
        .collect();
    let remaining: u64 = row[5].parse().unwrap();
    assert!(
        (49..=50).contains(&remaining),
        "eu's share is 50, one used (or a new window): {table}"
    );
    for proxy in &proxies {
        proxy.heal();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_another_pepper_is_named_in_readyz_and_never_merged_and_a_rotation_links() {
    let redis: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let eu = config("eu", &redis[0], &[("us", redis[1].url())]);
    let us = config("us", &redis[1], &[("eu", redis[0].url())]);
    let eu = Server::start_with_env(
        &["--config", eu.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", PEPPER)],
    )
    .keep(eu);
    let us = Server::start_with_env(
        &["--config", us.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", OTHER_PEPPER)],
    )
    .keep(us);
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    for server in [&eu, &us] {
        loop {
            let (status, body) = readyz(&client, server).await;
            let foreign = &body["regions"][0]["foreign"];
            if foreign
                .as_str()
                .is_some_and(|f| f.contains("another pepper"))
            {
                // Named, and the region still decides on its own.
                assert_eq!((status, &body["status"]), (200, &json!("ready")), "{body}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "never named foreign: {status} {body}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eu.wait_for_log("announces another pepper; never merged with it");
    // Nothing was merged: neither store holds a ledger of the other's.
    for server in &redis {
        let mut connection = server.client().get_connection().unwrap();
        let ledgers: Vec<String> = redis::cmd("KEYS")
            .arg("*:r")
            .query(&mut connection)
            .unwrap();
        assert!(ledgers.is_empty(), "{ledgers:?}");
    }

    // us rotates its pepper to OTHER_PEPPER, keeping eu's as the previous
    // one: eu no longer calls it foreign, but the two link only once eu
    // rotates too (until then their keys differ).
    drop(us);
    let rotating = config_with(
        "us",
        &redis[1],
        &[("eu", redis[0].url())],
        "  previous_pepper_env: TEST_SLUICE_PREVIOUS_PEPPER\n",
    );
    let _us = Server::start_with_env(
        &["--config", rotating.to_str().unwrap()],
        &[
            ("TEST_SLUICE_PEPPER", OTHER_PEPPER),
            ("TEST_SLUICE_PREVIOUS_PEPPER", PEPPER),
        ],
    )
    .keep(rotating);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, body) = readyz(&client, &eu).await;
        let us = &body["regions"][0];
        if us["foreign"].is_null() {
            assert_eq!(
                us["last_shipped_ms"],
                Value::Null,
                "shipped across peppers: {body}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "still foreign: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(eu);
    let eu_rotating = config_with(
        "eu",
        &redis[0],
        &[("us", redis[1].url())],
        "  previous_pepper_env: TEST_SLUICE_PREVIOUS_PEPPER\n",
    );
    let eu = Server::start_with_env(
        &["--config", eu_rotating.to_str().unwrap()],
        &[
            ("TEST_SLUICE_PEPPER", OTHER_PEPPER),
            ("TEST_SLUICE_PREVIOUS_PEPPER", PEPPER),
        ],
    )
    .keep(eu_rotating);
    linked(&client, &eu).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_settled_in_another_region_gives_nothing_back_there() {
    let redis: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let env = [("TEST_SLUICE_PEPPER", PEPPER)];
    let eu_config = config("eu", &redis[0], &[("us", redis[1].url())]);
    let us_config = config("us", &redis[1], &[("eu", redis[0].url())]);
    let us_path = us_config.to_str().unwrap().to_owned();
    let eu =
        Server::start_with_env(&["--config", eu_config.to_str().unwrap()], &env).keep(eu_config);
    let us = Server::start_with_env(&["--config", &us_path], &env).keep(us_config);
    let client = reqwest::Client::new();
    linked(&client, &eu).await;
    let used_in_us = || {
        let (table, _) = succeeds(
            sluice()
                .args(["inspect", "--config", &us_path, "--tenant", "acme"])
                .env("TEST_SLUICE_PEPPER", PEPPER),
        );
        // us's own part, in the table across regions: policy, region,
        // "(self)", share, cap, used.
        let ours: Vec<&str> = table
            .lines()
            .find(|l| l.starts_with("per-3s") && l.contains("(self)"))
            .unwrap_or_else(|| panic!("no part of us:\n{table}"))
            .split_whitespace()
            .collect();
        ours[5].parse::<u64>().unwrap()
    };
    // Early in a window, so that everything happens in one.
    let now = wall_ms();
    tokio::time::sleep(Duration::from_millis(PER_MS - now % PER_MS + 50)).await;
    let check = json!({ "tenant": "acme", "route": "GET /" });
    for _ in 0..3 {
        assert_eq!(post(&client, &us.base, check.clone()).await.0, 200);
    }
    let reserve = json!({ "tenant": "acme", "route": "GET /", "cost": 2, "reserve": true });
    let (status, reserved) = post(&client, &eu.base, reserve).await;
    assert_eq!(status, 200, "{reserved}");
    let settle = json!({ "reservation": reserved["reservation"], "cost": 0 });
    let url = format!("{}/v1/settle", us.base);
    let (status, settled) = common::post_to(&client, &url, settle).await;
    assert!(status < 500, "{status} {settled}");
    // us never took the reservation's 2 units: it gives nothing back.
    assert_eq!(used_in_us(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_each_shards_own_part_across_regions() {
    let redis: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let tenants = "tenants:\n  acme: { plan: free, shards: 2 }\n";
    let env = [("TEST_SLUICE_PEPPER", PEPPER)];
    let eu = config_with("eu", &redis[0], &[("us", redis[1].url())], tenants);
    let us = config_with("us", &redis[1], &[("eu", redis[0].url())], tenants);
    let eu_path = eu.to_str().unwrap().to_owned();
    let eu = Server::start_with_env(&["--config", &eu_path], &env).keep(eu);
    let _us = Server::start_with_env(&["--config", us.to_str().unwrap()], &env).keep(us);
    let client = reqwest::Client::new();
    linked(&client, &eu).await;
    // Early in a window, five decisions in eu, spread over the shards.
    let now = wall_ms();
    tokio::time::sleep(Duration::from_millis(PER_MS - now % PER_MS + 100)).await;
    for _ in 0..5 {
        let check = json!({ "tenant": "acme", "route": "GET /" });
        let (status, body) = post(&client, &eu.base, check).await;
        assert_eq!(status, 200, "{body}");
    }
    let (table, _) = succeeds(
        sluice()
            .args(["inspect", "--config", &eu_path, "--tenant", "acme"])
            .env("TEST_SLUICE_PEPPER", PEPPER),
    );
    let used: Vec<u64> = table
        .lines()
        .filter(|l| l.starts_with("tenant") && l.split_whitespace().nth(1) == Some("per-3s"))
        .map(|l| l.split_whitespace().nth(4).unwrap().parse().unwrap())
        .collect();
    assert_eq!(used.len(), 2, "a row per shard:\n{table}");
    assert_eq!(
        used.iter().sum::<u64>(),
        5,
        "five in all, none in us:\n{table}"
    );
    assert!(
        table.contains("shard 1:\nper-3s"),
        "each shard's parts:\n{table}"
    );
}
