//! The alert rules and the Grafana dashboard in `deploy/`, held to what
//! sluice exports: `promtool check rules`, then a real Prometheus
//! (Debian's `prometheus` package) scraping a real `sluice serve` and
//! evaluating every dashboard and alert expression; any expression that
//! fails, or names a metric sluice does not export, fails the test.

mod common;

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Server, temp_file, temp_path};
use serde_json::Value;

fn deploy(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(file)
}

fn need(program: &str) {
    let found = Command::new(program).arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "`{program}` is needed by this test: install Debian's prometheus package (apt-get install prometheus)"
    );
}

/// Every expression of the alert rules and of the dashboard's panels.
fn expressions() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let rules = std::fs::read_to_string(deploy("sluice-alerts.yaml")).unwrap();
    // `expr:` values, inline or as a `|` block.
    let mut lines = rules.lines().peekable();
    let mut alert = String::new();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(name) = trimmed.strip_prefix("- alert: ") {
            alert = name.to_owned();
        }
        if let Some(expr) = trimmed.strip_prefix("expr: ") {
            if expr.trim() == "|" {
                let indent = line.len() - trimmed.len() + 2;
                let mut block = String::new();
                while let Some(next) = lines.peek() {
                    if next.trim().is_empty() || next.len() - next.trim_start().len() < indent {
                        break;
                    }
                    block.push_str(next.trim());
                    block.push(' ');
                    lines.next();
                }
                out.push((format!("alert {alert}"), block));
            } else {
                out.push((format!("alert {alert}"), expr.to_owned()));
            }
        }
    }
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(deploy("sluice-dashboard.json")).unwrap())
            .unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            out.push((
                format!("panel {}", panel["title"]),
                target["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    out
}

/// The metric names an expression reads.
fn metrics_named(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &expr[i..];
        if (rest.starts_with("sluice_") || rest.starts_with("ratelimit_"))
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'))
        {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            let family = ["_bucket", "_sum", "_count", "_total"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .unwrap_or(name);
            names.insert(family.to_owned());
            i += end;
        } else {
            i += 1;
        }
    }
    names
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_alert_rules_pass_promtool() {
    need("promtool");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(deploy("sluice-alerts.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn every_dashboard_and_alert_expression_evaluates_on_a_real_prometheus() {
    need("prometheus");
    let envoy = temp_file(
        "dashboards-envoy.yaml",
        "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    );
    let mut sluice = Server::start(&["--envoy-config", envoy.to_str().unwrap()]);
    let client = reqwest::Client::new();
    // Some traffic, allowed and denied, over HTTP and the Envoy RLS, so
    // that every family has series.
    for _ in 0..8 {
        let body = serde_json::json!({"tenant": "newco", "route": "POST /v1/invoices"});
        common::post(&client, &sluice.base, body).await;
    }
    {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
        use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
        let mut rls = RateLimitServiceClient::connect(sluice.grpc.clone())
            .await
            .unwrap();
        for _ in 0..2 {
            let request = RateLimitRequest {
                domain: "edge".into(),
                descriptors: vec![RateLimitDescriptor {
                    entries: vec![Entry {
                        key: "remote_address".into(),
                        value: "10.0.0.1".into(),
                    }],
                    ..Default::default()
                }],
                hits_addend: 1,
            };
            rls.should_rate_limit(request).await.unwrap();
        }
    }
    let exported = common::get_text(&client, &sluice, "/metrics").await;
    let families: BTreeSet<String> = exported
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(|name| name.strip_suffix("_total").unwrap_or(name).to_owned())
        .collect();
    let expressions = expressions();
    assert!(expressions.len() >= 15, "{expressions:?}");
    for (place, expr) in &expressions {
        for name in metrics_named(expr) {
            assert!(
                families.contains(&name),
                "{place} reads `{name}`, which sluice does not export: {expr}"
            );
        }
    }
    let target = sluice.base.trim_start_matches("http://").to_owned();
    let port = sluice_testkit::free_port(false);
    let data = temp_path("prometheus", "data");
    let config = temp_file(
        "prometheus.yml",
        &format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: sluice\n    static_configs:\n      - targets: ['{target}']\n",
            deploy("sluice-alerts.yaml").display()
        ),
    );
    let _prometheus = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", data.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let query = |expr: String| {
        let (client, api) = (client.clone(), api.clone());
        async move {
            client
                .get(format!("{api}/query"))
                .query(&[("query", expr)])
                .send()
                .await
                .ok()?
                .json::<Value>()
                .await
                .ok()
        }
    };
    // Scraped at least twice (rates need two samples).
    let started = Instant::now();
    loop {
        let up = query("count_over_time(up{job=\"sluice\"}[1m])".into()).await;
        let samples = up
            .as_ref()
            .and_then(|v| v["data"]["result"][0]["value"][1].as_str())
            .and_then(|v| v.parse::<u32>().ok());
        if samples.is_some_and(|n| n >= 3) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Prometheus never scraped sluice: {up:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (place, expr) in &expressions {
        let answer = query(expr.clone()).await.expect("Prometheus answers");
        assert_eq!(answer["status"], "success", "{place}: {expr}: {answer}");
    }
    // The decision families have data through Prometheus, not only names.
    let decided = query("sum(sluice_decisions_total)".into()).await.unwrap();
    assert!(
        decided["data"]["result"][0]["value"][1]
            .as_str()
            .is_some_and(|v| v.parse::<f64>().unwrap() >= 8.0),
        "{decided}"
    );
    // Every rule group loaded and evaluated without error.
    let started = Instant::now();
    loop {
        let rules: Value = client
            .get(format!("{api}/rules"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let all: Vec<&Value> = rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        if all.len() == 9 && all.iter().all(|r| r["health"] == "ok") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{rules}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    sluice.stop();
}
