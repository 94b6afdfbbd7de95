//! A `gcra` shared across regions (`storage.regions`, the default for a
//! tenant's gcra): three real redis-servers, each with its own sluice,
//! linked through the test kit's delay proxy (40 ms each way). The fleet
//! is one bucket of the pool: over any span `d` it admits at most `burst +
//! limit × d / per`, and a busy fleet about `limit` per `per`.

mod common;

use std::time::Duration;

use common::regions::{LIMIT, PER_MS, hammer, next_window, three_regions, wall_ms};
use common::{Server, get_text, metric_total, post, sluice, succeeds};
use serde_json::json;

/// The rule: `LIMIT` per 3 s, a burst of `BURST`.
const BURST: u64 = 60;

fn rule() -> String {
    format!("{{ name: rate, algorithm: gcra, limit: {LIMIT}, per: 3s, burst: {BURST} }}")
}

/// The fleet's bound over `windows` whole windows: one bucket of the pool.
fn bound(windows: u64) -> u64 {
    BURST + LIMIT * windows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_hammering_every_region_gets_one_bucket_linked_partitioned_and_healed() {
    let client = reqwest::Client::new();
    let (_redis, proxies, servers, _) = three_regions(&client, &rule()).await;
    let all: Vec<&Server> = servers.iter().collect();

    // Linked: two windows.
    let start = next_window().await;
    let linked = hammer(&client, &all, "acme-everywhere", start + 2 * PER_MS).await;
    // ap cut off from its peers, both ways, for two windows: eu and us
    // reach ap's Redis through proxies[2], ap theirs through the second
    // proxy to each.
    for proxy in &proxies[2] {
        proxy.cut();
    }
    let ap_out: Vec<_> = [0, 1].iter().map(|&r| &proxies[r][1]).collect();
    for proxy in &ap_out {
        proxy.cut();
    }
    let cut = start + 2 * PER_MS;
    let partitioned = hammer(&client, &all, "acme-everywhere", cut + 2 * PER_MS).await;
    for proxy in proxies[2].iter().chain(ap_out) {
        proxy.heal();
    }
    let healed_at = cut + 2 * PER_MS;
    let healed = hammer(&client, &all, "acme-everywhere", healed_at + 2 * PER_MS).await;

    println!("linked {linked:?}\npartitioned {partitioned:?}\nhealed {healed:?}");
    let mut total = 0;
    for (phase, admitted) in [
        ("linked", &linked),
        ("partitioned", &partitioned),
        ("healed", &healed),
    ] {
        for (window, &n) in admitted {
            total += n;
            assert!(
                n as f64 >= 0.9 * LIMIT as f64 && n <= bound(1),
                "{phase}, window {window}: {n} admitted, not between 90% of {LIMIT} and {}",
                bound(1)
            );
        }
        assert_eq!(admitted.len(), 2, "{phase}: {admitted:?}");
    }
    // Over the whole run, one bucket: the burst once, then the rate.
    assert!(
        total <= bound(6),
        "{total} admitted in 6 windows, past {}",
        bound(6)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_in_one_region_gets_the_pools_rate_there_within_a_few_syncs() {
    let client = reqwest::Client::new();
    let (_redis, _proxies, servers, configs) = three_regions(&client, &rule()).await;
    let start = next_window().await;
    let admitted = hammer(
        &client,
        &[&servers[1]],
        "acme-sends-to-us",
        start + 3 * PER_MS,
    )
    .await;
    println!("admitted per {PER_MS} ms window in us: {admitted:?}");
    // The other regions keep a sixteenth of their share (50 each) for
    // their own next requests: 4 each.
    let reachable = LIMIT - 2 * 4;
    let total: u64 = admitted.values().sum();
    assert!(total <= bound(3), "{total} admitted, past {}", bound(3));
    for window in [start + PER_MS, start + 2 * PER_MS] {
        let n = admitted.get(&window).copied().unwrap_or(0);
        assert!(
            n as f64 >= 0.9 * reachable as f64 && n <= bound(1),
            "window {window}: {n} admitted, not between 90% of {reachable} and {}",
            bound(1)
        );
    }
    // The rate moved there from its peers (a budget of its own in each
    // region would admit as much in us alone, and move nothing).
    let metrics = get_text(&client, &servers[1], "/metrics").await;
    assert!(
        metric_total(&metrics, "sluice_region_peer_units_received_total") > 0.0,
        "{metrics}"
    );
    // `sluice inspect` in us, the tenant still sending there: its own
    // bucket (a token_bucket of its rate now, past its share of 50), and
    // each region's rate. (An epoch, 12 s here, starts again from the
    // shares: the rate moves back within a few syncs.)
    let sending = tokio::spawn({
        let (client, us) = (client.clone(), servers[1].base.clone());
        async move {
            let end = wall_ms() + 4_000;
            while wall_ms() < end {
                let body = json!({ "tenant": "acme-sends-to-us", "route": "GET /" });
                post(&client, &us, body).await;
            }
        }
    });
    let inspect = || {
        let (table, _) = succeeds(
            sluice()
                .args([
                    "inspect",
                    "--config",
                    &configs[1],
                    "--tenant",
                    "acme-sends-to-us",
                ])
                .env("TEST_SLUICE_PEPPER", common::regions::PEPPER),
        );
        let row: Vec<String> = table
            .lines()
            .find(|l| l.starts_with("tenant") && l.split_whitespace().nth(1) == Some("rate"))
            .unwrap_or_else(|| panic!("no row:\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        (table, row)
    };
    let (mut table, mut row) = inspect();
    for _ in 0..10 {
        if row[3].split('/').next().unwrap().parse::<u64>().unwrap() > 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        (table, row) = inspect();
    }
    sending.await.unwrap();
    println!("{table}");
    assert_eq!(row[2], "token_bucket", "{table}");
    let rate: u64 = row[3].split('/').next().unwrap().parse().unwrap();
    assert!(rate > 50, "us holds more than its share's rate: {table}");
    let part = |region: &str| -> Vec<String> {
        table
            .lines()
            .find(|l| l.starts_with("rate") && l.split_whitespace().nth(1) == Some(region))
            .unwrap_or_else(|| panic!("no part of {region}:\n{table}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(part("us")[2], "(self)", "{table}");
    for peer in ["eu", "ap"] {
        assert_eq!(part(peer)[2], "50", "the share of a peer: {table}");
        assert_eq!(part(peer)[4], "-", "a bucket's part tells no use: {table}");
    }
}
