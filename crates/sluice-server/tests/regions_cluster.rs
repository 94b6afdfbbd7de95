//! `storage.regions` with a region on Redis Cluster: eu's store is a real
//! three-node cluster, us's and ap's each one redis-server. eu decides on
//! its cluster and its link runs there (ledgers in each tenant's slot, its
//! own keys in the admin slot); us and ap reach eu as a cluster peer
//! (`nodes:`). eu reaches its peers through the test kit's delay proxy (40
//! ms each way); its peers reach eu's nodes directly (a cluster tells its
//! clients its nodes' own addresses, which a proxy in front of the seed
//! cannot change).

mod common;

use std::time::Duration;

use common::regions::{
    ADMIN, LIMIT, PEPPER, PER_MS, config_in, hammer, linked, next_window, override_becomes,
    override_call, readyz,
};
use common::{Server, get_text, metric_total, sluice, succeeds};
use sluice_testkit::{DelayProxy, RedisCluster, RedisServer};

/// The rule every region shares: `LIMIT` per aligned window of `PER_MS`.
const RULE: &str = "{ name: per-3s, algorithm: fixed_window, limit: 150, per: 3s, aligned: true }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_on_redis_cluster_shares_one_budget_with_regions_on_one_redis() {
    assert_eq!((LIMIT, PER_MS), (150, 3_000), "RULE says 150 per 3s");
    let cluster = RedisCluster::start(3, 0);
    let nodes = cluster.urls();
    let redis: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    // The proxies to us and to ap, by who goes through them.
    let to_us_from_eu = DelayProxy::start(redis[0].port(), Duration::from_millis(40));
    let to_ap_from_eu = DelayProxy::start(redis[1].port(), Duration::from_millis(40));
    let to_us_from_ap = DelayProxy::start(redis[0].port(), Duration::from_millis(40));
    let to_ap_from_us = DelayProxy::start(redis[1].port(), Duration::from_millis(40));
    let eu_nodes = format!(
        "{{ nodes: [{}] }}",
        nodes
            .iter()
            .map(|n| format!("\"{n}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let url = |proxy: &DelayProxy| format!("{{ url: \"{}\" }}", proxy.url());
    let regions = [
        (
            "eu",
            format!("backend: redis-cluster\n  nodes: [{}]", nodes.join(", ")),
            vec![("us", url(&to_us_from_eu)), ("ap", url(&to_ap_from_eu))],
        ),
        (
            "us",
            format!("backend: redis\n  url: {}", redis[0].url()),
            vec![("eu", eu_nodes.clone()), ("ap", url(&to_ap_from_us))],
        ),
        (
            "ap",
            format!("backend: redis\n  url: {}", redis[1].url()),
            vec![("eu", eu_nodes.clone()), ("us", url(&to_us_from_ap))],
        ),
    ];
    let (mut servers, mut configs) = (Vec::new(), Vec::new());
    for (name, store, peers) in &regions {
        let path = config_in(name, store, peers, "", RULE);
        configs.push(path.to_str().unwrap().to_owned());
        let env = [("TEST_SLUICE_PEPPER", PEPPER)];
        let server = Server::start_with_env(&["--config", path.to_str().unwrap()], &env);
        servers.push(server.keep(path));
    }
    let client = reqwest::Client::new();
    for server in &servers {
        linked(&client, server).await;
    }
    let [eu, us, ap] = [&servers[0], &servers[1], &servers[2]];
    let in_bounds = |admitted: &std::collections::BTreeMap<u64, u64>, start: u64, what: &str| {
        println!("{what}: admitted per {PER_MS} ms window {admitted:?} (limit {LIMIT})");
        for window in [start, start + PER_MS] {
            let n = admitted.get(&window).copied().unwrap_or(0);
            assert!(
                n as f64 >= 0.9 * LIMIT as f64 && n <= LIMIT,
                "{what}, window {window}: {n} admitted, not between 90% of {LIMIT} and {LIMIT}"
            );
        }
    };

    // What the cluster's region admitted, never denying, its peers learn
    // within a few syncs: `sluice inspect` in us shows eu's use.
    let start = next_window().await;
    for _ in 0..30 {
        let body = serde_json::json!({ "tenant": "acme-seen", "route": "GET /" });
        assert_eq!(common::post(&client, &eu.base, body).await.0, 200);
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (table, _) = succeeds(
        sluice()
            .args(["inspect", "--config", &configs[1], "--tenant", "acme-seen"])
            .env("TEST_SLUICE_PEPPER", PEPPER),
    );
    assert!(
        common::regions::wall_ms() < start + PER_MS,
        "too slow: the window ended"
    );
    let eu_row: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("per-3s") && l.split_whitespace().nth(1) == Some("eu"))
        .unwrap_or_else(|| panic!("no part of eu:\n{table}"))
        .split_whitespace()
        .collect();
    assert_eq!(eu_row.last(), Some(&"30"), "us sees what eu used:\n{table}");

    // A tenant sending to every region at once: one budget.
    let start = next_window().await;
    let everywhere = hammer(
        &client,
        &[eu, us, ap],
        "acme-everywhere",
        start + 2 * PER_MS,
    )
    .await;
    in_bounds(&everywhere, start, "sent to every region");

    // Sending to eu only, the cluster's region gets the budget its peers
    // grant it; then to us only, us gets what eu (on its cluster) grants.
    let start = next_window().await;
    let to_eu = hammer(&client, &[eu], "acme-in-eu", start + 2 * PER_MS).await;
    in_bounds(&to_eu, start, "sent to eu (the cluster) only");
    let start = next_window().await;
    let to_us = hammer(&client, &[us], "acme-in-us", start + 2 * PER_MS).await;
    in_bounds(&to_us, start, "sent to us only");
    for (server, what) in [(eu, "received"), (eu, "shipped"), (us, "received")] {
        let metrics = get_text(&client, server, "/metrics").await;
        let total = metric_total(&metrics, &format!("sluice_region_peer_units_{what}_total"));
        assert!(total > 0.0, "{}: no units {what}:\n{metrics}", server.base);
    }

    // `sluice inspect` on the cluster's region shows each region's part.
    let (table, _) = succeeds(
        sluice()
            .args(["inspect", "--config", &configs[0], "--tenant", "acme-in-us"])
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
    assert_eq!(part("eu")[2], "(self)", "{table}");
    for peer in ["us", "ap"] {
        assert_eq!(part(peer)[2], "50", "{table}");
    }

    // us cut off from its peers' links, and from ap (it still reaches
    // eu's nodes, which no proxy stands before): the fleet never admits
    // past the limit, and after healing gets the budget again.
    for proxy in [&to_us_from_eu, &to_us_from_ap, &to_ap_from_us] {
        proxy.cut();
    }
    let start = next_window().await;
    let cut = hammer(&client, &[eu, us, ap], "acme-cut", start + 2 * PER_MS).await;
    println!("us cut off: admitted per window {cut:?} (limit {LIMIT})");
    for window in [start, start + PER_MS] {
        let n = cut.get(&window).copied().unwrap_or(0);
        assert!(
            n <= LIMIT,
            "us cut off, window {window}: {n} admitted, past {LIMIT}"
        );
    }
    let (_, body) = readyz(&client, us).await;
    let eu_seen_by_us = body["regions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["region"] == "eu")
        .cloned()
        .unwrap();
    assert_eq!(eu_seen_by_us["cut_off"], true, "{body}");
    for proxy in [&to_us_from_eu, &to_us_from_ap, &to_ap_from_us] {
        proxy.heal();
    }
    for server in &servers {
        linked(&client, server).await;
    }
    let start = next_window().await;
    let healed = hammer(&client, &[eu, us, ap], "acme-healed", start + 2 * PER_MS).await;
    in_bounds(&healed, start, "healed");
    drop(cluster);
}

/// Overrides are kept alike in a region on Redis Cluster and one on one
/// Redis: each region's store merges what the other ships (the admin keys
/// and the link's own share one slot there), and decisions follow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_set_in_a_cluster_region_or_its_peer_apply_in_both() {
    let cluster = RedisCluster::start(3, 0);
    let nodes = cluster.urls();
    let redis = RedisServer::start();
    let admin = "admin:\n  token_env: TEST_SLUICE_ADMIN\n";
    let env = [("TEST_SLUICE_PEPPER", PEPPER), ("TEST_SLUICE_ADMIN", ADMIN)];
    let quoted: Vec<String> = nodes.iter().map(|n| format!("\"{n}\"")).collect();
    let eu = config_in(
        "eu",
        &format!("backend: redis-cluster\n  nodes: [{}]", nodes.join(", ")),
        &[("us", format!("{{ url: \"{}\" }}", redis.url()))],
        admin,
        RULE,
    );
    let us = config_in(
        "us",
        &format!("backend: redis\n  url: {}", redis.url()),
        &[("eu", format!("{{ nodes: [{}] }}", quoted.join(", ")))],
        admin,
        RULE,
    );
    let eu = Server::start_with_env(&["--config", eu.to_str().unwrap()], &env).keep(eu);
    let us = Server::start_with_env(&["--config", us.to_str().unwrap()], &env).keep(us);
    let client = reqwest::Client::new();
    for server in [&eu, &us] {
        linked(&client, server).await;
    }
    let put = reqwest::Method::PUT;
    let factor = |f: f64| Some(serde_json::json!({ "factor": f }));
    let (status, body) = override_call(&client, &eu, put.clone(), "acme", factor(0.02)).await;
    assert_eq!(status, 200, "{body}");
    let heard = override_becomes(&client, &us, "acme", 200, "set in eu, never reached us").await;
    assert_eq!(heard["factor"], serde_json::json!(0.02), "{heard}");
    let (status, body) = override_call(&client, &us, put, "globex", factor(0.02)).await;
    assert_eq!(status, 200, "{body}");
    let heard = override_becomes(&client, &eu, "globex", 200, "set in us, never reached eu").await;
    assert_eq!(heard["factor"], serde_json::json!(0.02), "{heard}");
    // eu's decisions follow what us set: 150 × 0.02 is 3 a window across
    // both regions (at most two windows' if the burst straddles an end).
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut admitted = 0;
    for _ in 0..20 {
        let body = serde_json::json!({ "tenant": "globex", "route": "GET /" });
        admitted += u32::from(common::post(&client, &eu.base, body).await.0 == 200);
    }
    assert!(
        admitted <= 6,
        "eu admitted {admitted} of 20 under a limit of 3"
    );
    let (status, _) = override_call(&client, &eu, reqwest::Method::DELETE, "globex", None).await;
    assert_eq!(status, 204);
    override_becomes(&client, &us, "globex", 404, "deleted in eu, still in us").await;
    drop(cluster);
}
