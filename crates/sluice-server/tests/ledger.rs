//! The usage ledger on a real `sluice serve`: what it appends, what
//! `sluice usage` sums, what a `kill -9` leaves, and tenant ids as HMACs.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{Server, TempPath, post, sluice, succeeds, temp_file, temp_path};
use serde_json::{Value, json};
use sluice_testkit::RedisServer;

fn config(dir: &std::path::Path, storage: &str, extra: &str) -> TempPath {
    config_with(dir, storage, extra, "")
}

/// [`config`] with `plan` appended to plan `p` (after its `routes`).
fn config_with(dir: &std::path::Path, storage: &str, extra: &str, plan: &str) -> TempPath {
    temp_file(
        &format!("ledger-{}.yaml", dir.file_name().unwrap().to_string_lossy()),
        &format!(
            "{storage}ledger:\n  dir: {}\n  flush_every: 100ms\n{extra}default_plan: p\nplans:\n  p:\n    routes:\n      \"POST /v1/invoices\": [{{ name: invoices, algorithm: fixed_window, limit: 5, per: 1h }}]\n{plan}",
            dir.display()
        ),
    )
}

/// A ledger directory not made yet (`sluice serve` makes it), removed
/// with what it then holds when dropped.
fn fresh_dir(name: &str) -> TempPath {
    temp_path(&format!("ledger-{name}"), "ledger")
}

/// `sluice usage DIR --by all --json`, by tenant.
fn usage(dir: &std::path::Path) -> (Vec<Value>, String) {
    let (stdout, stderr) = succeeds(sluice().args(["usage", "--by", "all", "--json"]).arg(dir));
    let lines = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (lines, stderr)
}

/// Waits (at most 10 s) until `sluice usage` sums `dir` to `want`.
async fn usage_reaches(dir: &std::path::Path, want: &Value) {
    let started = Instant::now();
    while Value::Array(usage(dir).0) != *want {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}, not {want}",
            usage(dir)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every line of every file in `dir`.
fn lines(dir: &std::path::Path) -> Vec<Value> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "a torn line: {text:?}"
        );
        for line in text.lines() {
            out.push(serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")));
        }
    }
    out
}

async fn send(client: &reqwest::Client, server: &Server, tenant: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        let body = json!({"tenant": tenant, "route": "POST /v1/invoices"});
        admitted += usize::from(post(client, &server.base, body).await.0 == 200);
    }
    admitted
}

#[tokio::test]
async fn usage_is_appended_per_tenant_route_and_minute_and_summed() {
    let dir = fresh_dir("sum");
    let path = config(&dir, "", "");
    let mut server = Server::start(&["--config", path.to_str().unwrap()]);
    let client = reqwest::Client::new();
    assert_eq!(send(&client, &server, "acme", 8).await, 5);
    assert_eq!(send(&client, &server, "globex", 2).await, 2);
    let want = json!([
        {"tenant": "acme", "period": null, "admitted": 5, "denied": 3},
        {"tenant": "globex", "period": null, "admitted": 2, "denied": 0}
    ]);
    usage_reaches(&dir, &want).await;
    let line = &lines(&dir)[0];
    assert_eq!(line["route"], "POST /v1/invoices");
    assert_eq!(line["minute"].as_u64().unwrap() % 60_000, 0);
    // Stopping flushes what was counted last.
    assert_eq!(send(&client, &server, "globex", 1).await, 1);
    server.stop();
    let (summed, note) = usage(&dir);
    assert_eq!(summed[1]["admitted"], 3, "{summed:?}");
    assert!(note.is_empty(), "{note}");
}

#[tokio::test]
async fn a_kill_minus_nine_leaves_no_torn_or_repeated_line() {
    let dir = fresh_dir("kill");
    let path = config(&dir, "", "");
    let mut server = Server::start(&["--config", path.to_str().unwrap()]);
    let client = reqwest::Client::new();
    let base = server.base.clone();
    let load = tokio::spawn(async move {
        let mut admitted = 0u64;
        for i in 0.. {
            let body = json!({"tenant": format!("t{}", i % 50), "route": "POST /v1/invoices"});
            match client
                .post(format!("{base}/v1/check"))
                .json(&body)
                .send()
                .await
            {
                Ok(r) => admitted += u64::from(r.status() == 200),
                Err(_) => break,
            }
        }
        admitted
    });
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    let answered = load.await.unwrap();
    // Whatever the kill interrupted, a restart leaves only whole lines.
    let mut again = Server::start(&["--config", path.to_str().unwrap()]);
    again.stop();
    let all = lines(&dir);
    assert!(!all.is_empty());
    let ids: HashSet<(String, u64)> = all
        .iter()
        .map(|l| {
            (
                l["instance"].as_str().unwrap().to_owned(),
                l["seq"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ids.len(), all.len(), "no line twice");
    let admitted: u64 = all.iter().map(|l| l["admitted"].as_u64().unwrap()).sum();
    // The load sends one request at a time: at most one decision was
    // counted whose answer the kill kept from the client.
    assert!(
        admitted <= answered + 1,
        "{admitted} recorded, {answered} admitted"
    );
    assert!(admitted > 0);
    assert!(usage(&dir).1.is_empty(), "nothing to skip");
}

#[tokio::test]
async fn tenant_ids_can_be_hmacs() {
    let redis = RedisServer::start();
    let dir = fresh_dir("hmac");
    let storage = format!(
        "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_LEDGER_PEPPER\n",
        redis.url()
    );
    let path = config(&dir, &storage, "  tenants: hmac\n");
    let mut server = Server::start_with_env(
        &["--config", path.to_str().unwrap()],
        &[(
            "TEST_LEDGER_PEPPER",
            "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
        )],
    );
    let client = reqwest::Client::new();
    send(&client, &server, "acme", 2).await;
    server.stop();
    let all = lines(&dir);
    assert!(!all.is_empty());
    for line in &all {
        let tenant = line["tenant"].as_str().unwrap();
        assert!(tenant != "acme" && tenant.len() == 32, "{line}");
    }
    // Without a pepper there is nothing to HMAC with: refused at start.
    let memory = config(&fresh_dir("hmac-memory"), "", "  tenants: hmac\n");
    let out = sluice()
        .args(["serve", "--config"])
        .arg(&memory)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("ledger.tenants: hmac needs a pepper"));
}

/// Lines whose counts add up past what a total can hold (a corrupt file:
/// no instance counts 2^64 units in a minute) are refused with the tenant
/// and period named, never summed to a wrapped, smaller total.
#[test]
fn usage_refuses_a_total_past_its_bound_instead_of_wrapping() {
    let dir = temp_path("ledger-overflow", "ledger");
    std::fs::create_dir_all(&dir).unwrap();
    let line = |seq: u64, admitted: u64| {
        format!(
            "{{\"minute\":1764593880000,\"tenant\":\"acme\",\"route\":\"POST /v1/invoices\",\"admitted\":{admitted},\"denied\":0,\"instance\":\"a\",\"seq\":{seq}}}\n"
        )
    };
    std::fs::write(
        dir.join("usage-1-a.jsonl"),
        line(1, u64::MAX) + &line(2, u64::MAX),
    )
    .unwrap();
    let out = sluice()
        .args(["usage", "--json"])
        .arg(&*dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("acme") && stderr.contains("admitted"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "no partial totals: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // At the bound itself, the total is exact.
    std::fs::write(
        dir.join("usage-1-a.jsonl"),
        line(1, u64::MAX - 1) + &line(2, 1),
    )
    .unwrap();
    let (totals, _) = usage(&dir);
    assert_eq!(totals[0]["admitted"], json!(u64::MAX));
}

/// A reservation is recorded at what it finally cost: its actual cost
/// when settled, its estimate when it expires, in the minute it was made,
/// and once (not at the decision as well).
#[tokio::test]
async fn reservations_are_recorded_at_what_they_finally_cost() {
    let dir = fresh_dir("reserved");
    let path = config(&dir, "", "reservation_ttl: 1s\n");
    let mut server = Server::start(&["--config", path.to_str().unwrap()]);
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", server.base);
    let reserve = |tenant: &str| json!({"tenant": tenant, "route": "POST /v1/invoices", "cost": 4, "reserve": true});
    let minute = |ms: u64| ms - ms % 60_000;
    let reserved_at = minute(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    );
    // Settled at 1, not the 4 reserved.
    let (_, settled) = common::post_to(&client, &url("/v1/check"), reserve("acme")).await;
    let settle = json!({"reservation": settled["reservation"], "cost": 1});
    let (status, _) = common::post_to(&client, &url("/v1/settle"), settle.clone()).await;
    assert_eq!(status, 200);
    // A retry of the settle records nothing more.
    common::post_to(&client, &url("/v1/settle"), settle).await;
    // Left to expire: its estimate, 4.
    common::post_to(&client, &url("/v1/check"), reserve("globex")).await;
    let want = json!([
        {"tenant": "acme", "period": null, "admitted": 1, "denied": 0},
        {"tenant": "globex", "period": null, "admitted": 4, "denied": 0}
    ]);
    usage_reaches(&dir, &want).await;
    server.stop();
    assert_eq!(Value::Array(usage(&dir).0), want, "nothing more at stop");
    for line in lines(&dir) {
        let at = line["minute"].as_u64().unwrap();
        assert!(at == reserved_at || at == reserved_at + 60_000, "{line}");
    }
}

/// A report is recorded at its cost; on a route that counts by outcome it
/// is not (the check before the request was recorded), whatever it counts.
#[tokio::test]
async fn reports_are_recorded_except_where_the_check_was() {
    let dir = fresh_dir("reports");
    let path = config_with(
        &dir,
        "",
        "",
        "      \"POST /login\": [{ name: logins, algorithm: fixed_window, limit: 100, per: 1h }]\n    subject:\n      \"POST /login\":\n        - { name: failed-logins, algorithm: fixed_window, limit: 100, per: 1h, count_if: { status: [401] } }\n",
    );
    let mut server = Server::start(&["--config", path.to_str().unwrap()]);
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}{path}", server.base);
    // 3 invoices reported after the fact.
    let invoices = json!({"tenant": "acme", "route": "POST /v1/invoices", "cost": 3});
    let (status, body) = common::post_to(&client, &url("/v1/report"), invoices).await;
    assert_eq!(status, 200, "{body}");
    // A login checked (recorded), then its attempt concluded failed
    // (counted, not recorded again).
    let login = json!({"tenant": "globex", "route": "POST /login", "subject": "10.0.0.1|alice"});
    let (status, body) = common::post_to(&client, &url("/v1/check"), login).await;
    assert_eq!(status, 200, "{body}");
    let failed = json!({"attempt": body["attempt"], "status": 401});
    let (status, body) = common::post_to(&client, &url("/v1/report"), failed).await;
    assert_eq!(status, 200, "{body}");
    let want = json!([
        {"tenant": "acme", "period": null, "admitted": 3, "denied": 0},
        {"tenant": "globex", "period": null, "admitted": 1, "denied": 0}
    ]);
    usage_reaches(&dir, &want).await;
    server.stop();
    assert_eq!(Value::Array(usage(&dir).0), want, "nothing more at stop");
    let routes: HashSet<(String, String)> = lines(&dir)
        .iter()
        .map(|l| {
            (
                l["tenant"].as_str().unwrap().to_owned(),
                l["route"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        routes,
        HashSet::from([
            ("acme".to_owned(), "POST /v1/invoices".to_owned()),
            ("globex".to_owned(), "POST /login".to_owned())
        ])
    );
}
