//! The `sluice` binary, run as a user would run it.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Server, example, post, sluice, temp_dir, temp_file};
use serde_json::{Value, json};

#[test]
fn validate_accepts_the_example() {
    let out = sluice().arg("validate").arg(example()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ok (3 plans, 3 tenants"), "{stdout}");
}

#[test]
fn validate_checks_envoyproxy_files_directories_and_what_a_config_points_to() {
    let envoy = temp_dir("validate-envoy");
    let dir = envoy.path();
    let good = "domain: d\ndescriptors:\n  - key: path\n    value: \"/a/*/b*\"\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    std::fs::write(dir.join("good.yaml"), good).unwrap();
    let ok = |path: &std::path::Path| {
        let out = sluice().arg("validate").arg(path).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, stderr) = ok(&dir.join("good.yaml"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("ok (1 domains"), "{stdout}");
    let (code, stdout, _) = ok(dir);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("ok (1 domains"), "{stdout}");
    // A limit sluice would not enforce as written is refused, with where.
    let bad = "domain: e\ndescriptors:\n  - key: path\n    value: exact\n    share_threshold: true\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n";
    std::fs::write(dir.join("bad.yaml"), bad).unwrap();
    let (code, _, stderr) = ok(dir);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("bad.yaml:5:22: share_threshold can only be used with wildcard values"),
        "{stderr}"
    );
    // Upstream's keys out of place: a limit written on the descriptor is
    // refused (upstream would load it and never apply it); a mark inside
    // `rate_limit` loads, as upstream loads it, with a note saying where.
    let misplaced =
        "domain: f\ndescriptors:\n  - key: a\n    unit: minute\n    requests_per_unit: 5\n";
    std::fs::write(dir.join("misplaced.yaml"), misplaced).unwrap();
    let (code, _, stderr) = ok(&dir.join("misplaced.yaml"));
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("misplaced.yaml:4:11: `unit` has no effect on a descriptor"),
        "{stderr}"
    );
    let noted = "domain: g\ndescriptors:\n  - key: a\n    rate_limit: { unit: minute, requests_per_unit: 5, shadow_mode: true }\n";
    std::fs::write(dir.join("misplaced.yaml"), noted).unwrap();
    let (code, _, stderr) = ok(&dir.join("misplaced.yaml"));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("note: ")
            && stderr.contains("misplaced.yaml:4:")
            && stderr.contains("`shadow_mode` has no effect inside `rate_limit`"),
        "{stderr}"
    );
    std::fs::remove_file(dir.join("misplaced.yaml")).unwrap();
    // A sluice configuration is checked with the files it points to, as
    // `serve` would load them.
    let config = temp_file(
        "points-to-envoy.yaml",
        &format!("envoy:\n  config: {}\n", dir.display()),
    );
    let (code, _, stderr) = ok(&config);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("share_threshold"), "{stderr}");
    std::fs::remove_file(dir.join("bad.yaml")).unwrap();
    let (code, stdout, stderr) = ok(&config);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("ok (1 domains"), "{stdout}");
    // What validate accepts, serve starts with (here: Envoy alone, no plans).
    let mut server = Server::start(&["--config", config.to_str().unwrap()]);
    server.stop();
}

/// Scalars upstream's reader refuses, each in a file of its own as in
/// upstream's test material: a floating-point value anywhere but in
/// `metadata`, a quoted number or flag. Each is named with its file, line
/// and column; the same values written as upstream takes them load.
#[test]
fn validate_refuses_floats_and_quoted_numbers_as_envoyproxy_does() {
    let envoy = temp_dir("validate-scalars");
    let dir = envoy.path();
    let limit = |line: &str| {
        format!(
            "domain: d\ndescriptors:\n  - key: a\n    {line}\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n"
        )
    };
    let files = [
        ("float_value.yaml", limit("value: 1.5"), ":4:12: `value: 1.5` is a floating-point number"),
        (
            "quoted_requests_per_unit.yaml",
            "domain: q\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: \"10\" }\n".to_owned(),
            ":4:52: `requests_per_unit` must be a whole number from 0 to 4294967295, unquoted",
        ),
        ("quoted_flag.yaml", limit("shadow_mode: \"true\""), ":4:18: `shadow_mode` must be true or false, unquoted"),
    ];
    for (name, text, expected) in &files {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let out = sluice().arg("validate").arg(&path).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains(&format!("{name}{expected}")), "{stderr}");
        std::fs::remove_file(&path).unwrap();
    }
    let taken = limit("value: \"1.5\"\n    shadow_mode: yes\n    metadata: { ratio: 0.5 }");
    std::fs::write(dir.join("taken.yaml"), taken).unwrap();
    let out = sluice().arg("validate").arg(dir).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn validate_reports_file_line_column_and_fails() {
    let path = temp_file(
        "bad.yaml",
        "default_plan: free\nplans:\n  free:\n    tenant:\n      - { algorithm: gcra, limit: 0, per: 1s }\n      - { algorithm: fixed_window, limit: 5, per: 1s, burst: 9 }\n",
    );
    let out = sluice().arg("validate").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let shown = path.display().to_string();
    assert!(
        stderr.contains(&format!(
            "{shown}:5:35: `limit` must be a whole number from 1"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{shown}:6:62: `burst` is only for gcra and token_bucket"
        )),
        "{stderr}"
    );
}

#[test]
fn check_prints_one_decision_as_json() {
    let out = sluice()
        .args([
            "check",
            "--tenant",
            "acme-corp",
            "--route",
            "POST /v1/invoices",
            "--subject",
            "u1",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let decision: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(decision["allowed"], true);
    assert_eq!(decision["reason"], Value::Null);

    let out = sluice()
        .arg("check")
        .arg("--config")
        .arg(example())
        .args([
            "--tenant",
            "t",
            "--route",
            "POST /v1/invoices",
            "--cost",
            "6",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "a denial exits 1");
    let decision: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(decision["reason"], "cost_exceeds_capacity");

    let out = sluice()
        .args(["check", "--tenant", "t", "--route", "GET /", "--cost", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`cost` must be a whole number from 1"));
}

#[tokio::test]
async fn serve_runs_the_embedded_example_from_any_directory_and_stops_on_sigterm() {
    let mut server = Server::start(&[]);
    let client = reqwest::Client::new();
    let health = client
        .get(format!("{}/healthz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // Free plan: POST /v1/invoices is 5 per second, exactly.
    let request = json!({"tenant": "newcomer", "route": "POST /v1/invoices"});
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(post(&client, &server.base, request.clone()).await.0);
    }
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        5,
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&429));
    let status = server.stop();
    assert!(
        status.success(),
        "graceful shutdown exits 0, got {status:?}"
    );
    server.wait_for_log("shutting down");
}

#[tokio::test]
async fn serve_reloads_a_changed_file_and_keeps_the_old_one_when_invalid() {
    let config = |limit: &str| {
        format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{{ name: t, limit: {limit}, per: 1h }}]\n"
        )
    };
    let path = temp_file("reload.yaml", &config("2"));
    let mut server = Server::start(&["--config", path.to_str().unwrap()]);
    let client = reqwest::Client::new();
    let limit_of = |body: &Value| body["limit"].as_u64();
    let (_, body) = post(
        &client,
        &server.base,
        json!({"tenant": "a", "route": "GET /"}),
    )
    .await;
    assert_eq!(limit_of(&body), Some(2));

    std::fs::write(&path, config("7")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, body) = post(
            &client,
            &server.base,
            json!({"tenant": "b", "route": "GET /"}),
        )
        .await;
        if limit_of(&body) == Some(7) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the changed file was not reloaded:\n{}",
            server.log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An invalid file is refused, with its error; the running
    // configuration stays.
    std::fs::write(&path, config("0")).unwrap();
    let _ = Command::new("kill")
        .arg("-HUP")
        .arg(server.child.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !server
        .log
        .lock()
        .unwrap()
        .contains("reload.yaml:4:32: `limit`")
    {
        assert!(
            Instant::now() < deadline,
            "the invalid file was not reported:\n{}",
            server.log.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, body) = post(
        &client,
        &server.base,
        json!({"tenant": "c", "route": "GET /"}),
    )
    .await;
    assert_eq!(limit_of(&body), Some(7));
    server.stop();
}

#[tokio::test]
async fn serve_never_applies_a_file_caught_half_written() {
    let config = |limit: u32| {
        format!(
            "default_plan: free\nplans:\n  free:\n    tenant: [{{ limit: {limit}, per: 1h }}]\n  big:\n    tenant: [{{ limit: 1000, per: 1h }}]\ntenants:\n  a: {{ plan: big }}\n  z: {{ plan: big }}\n"
        )
    };
    let path = temp_file("half-written.yaml", &config(2));
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let next = config(3);
    // An editor writing in place, caught after the first tenant: valid YAML
    // that would put `z` on the free plan.
    let cut = next.find("  z:").unwrap();
    std::fs::write(&path, &next[..cut]).unwrap();
    server.wait_for_log("configuration changed");
    std::fs::write(&path, &next).unwrap();
    server.wait_for_log("configuration reloaded");
    let log = server.log.lock().unwrap().clone();
    assert_eq!(
        log.matches("configuration reloaded").count(),
        1,
        "one reload, of the whole file:\n{log}"
    );
    assert!(log.contains("tenants=2"), "{log}");
    let client = reqwest::Client::new();
    for (tenant, limit) in [("z", 1000), ("other", 3)] {
        let (_, body) = post(
            &client,
            &server.base,
            json!({"tenant": tenant, "route": "GET /"}),
        )
        .await;
        assert_eq!(body["limit"], limit, "{tenant}");
    }
}

#[test]
fn serve_refuses_an_invalid_config_and_exits_non_zero() {
    let path = temp_file("invalid.yaml", "default_plan: nope\nplans:\n  p: {}\n");
    let out = sluice()
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown plan `nope`"));
}

/// The status of a forward-auth call for tenant `t` (`GET /x`) with
/// `headers` added.
async fn forward_auth_of_t(base: String, headers: Vec<(&'static str, String)>) -> u16 {
    let mut request = reqwest::Client::new()
        .get(format!("{base}/v1/forward-auth"))
        .header("X-Tenant", "t")
        .header("X-Forwarded-Method", "GET")
        .header("X-Forwarded-Uri", "/x");
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.unwrap().status().as_u16()
}

/// Per-IP limits through forward-auth: the client is the rightmost hop of
/// `X-Forwarded-For` that is not a trusted proxy, so a client cannot
/// escape its limit by writing addresses of its own to the left; from an
/// untrusted peer the headers are not believed at all.
#[tokio::test]
async fn forward_auth_limits_the_client_ip_behind_trusted_proxies_only() {
    let config = |trusted: &str| {
        format!(
            "server:\n  forward_auth:\n    subject_from: client_ip\n    trusted_proxies: [{trusted}]\ndefault_plan: p\nplans:\n  p:\n    subject:\n      \"*\": [{{ limit: 1, per: 1h }}]\n"
        )
    };
    let ask = |server: &Server, xff: &'static str| {
        forward_auth_of_t(
            server.base.clone(),
            vec![("X-Forwarded-For", xff.to_owned())],
        )
    };
    // sluice sees the test's connections from 127.0.0.1: the gateway.
    let path = temp_file("client-ip.yaml", &config("127.0.0.1/32"));
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    assert_eq!(ask(&server, "203.0.113.7").await, 200);
    assert_eq!(ask(&server, "203.0.113.7").await, 429, "that client's one");
    assert_eq!(
        ask(&server, "6.6.6.6, 203.0.113.7").await,
        429,
        "an address the client wrote itself changes nothing"
    );
    assert_eq!(ask(&server, "203.0.113.8").await, 200, "another client");
    drop(server);
    // Nobody trusted: the peer is the client, whatever the headers say.
    let path = temp_file("client-ip-untrusted.yaml", &config(""));
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    assert_eq!(ask(&server, "203.0.113.7").await, 200);
    assert_eq!(
        ask(&server, "198.51.100.1").await,
        429,
        "spoofed header ignored"
    );
}

/// A gateway that writes `X-Forwarded-For` passes a `Forwarded` header
/// along as the client wrote it: behind such a gateway (the default) it is
/// not read, so a client cannot name a fresh address for every request;
/// behind one that writes `Forwarded` (`client_ip_header: forwarded`),
/// the other way round.
#[tokio::test]
async fn forward_auth_reads_only_the_header_the_gateway_writes() {
    let config = |header: &str| {
        format!(
            "server:\n  forward_auth:\n    subject_from: client_ip\n    trusted_proxies: [127.0.0.1]\n{header}default_plan: p\nplans:\n  p:\n    subject:\n      \"*\": [{{ limit: 1, per: 1h }}]\n"
        )
    };
    let ask = |server: &Server, name: &'static str, value: String, other: &'static str| {
        let real = if other == "Forwarded" {
            "for=203.0.113.7"
        } else {
            "203.0.113.7"
        };
        forward_auth_of_t(
            server.base.clone(),
            vec![(name, value), (other, real.to_owned())],
        )
    };
    // The gateway wrote the client, 203.0.113.7, in X-Forwarded-For; the
    // client wrote a new Forwarded address each time.
    let path = temp_file("client-ip-xff.yaml", &config(""));
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    assert_eq!(
        ask(
            &server,
            "Forwarded",
            "for=6.6.6.1".into(),
            "X-Forwarded-For"
        )
        .await,
        200
    );
    for i in 2..5 {
        assert_eq!(
            ask(
                &server,
                "Forwarded",
                format!("for=6.6.6.{i}"),
                "X-Forwarded-For"
            )
            .await,
            429,
            "the client's own Forwarded is not its address"
        );
    }
    drop(server);
    let path = temp_file(
        "client-ip-forwarded.yaml",
        &config("    client_ip_header: forwarded\n"),
    );
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    assert_eq!(
        ask(&server, "X-Forwarded-For", "6.6.6.1".into(), "Forwarded").await,
        200
    );
    assert_eq!(
        ask(&server, "X-Forwarded-For", "6.6.6.2".into(), "Forwarded").await,
        429,
        "the client's own X-Forwarded-For is not its address"
    );
}

/// `sluice check --url` asks a running service: its budgets answer, and
/// they are the service's (spent by the check).
#[tokio::test]
async fn check_asks_a_running_service() {
    let path = temp_file(
        "check-url.yaml",
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 2, per: 1h }]\n",
    );
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let ask = || {
        sluice()
            .args([
                "check",
                "--url",
                &server.base,
                "--tenant",
                "t",
                "--route",
                "GET /",
            ])
            .output()
            .unwrap()
    };
    for remaining in [1, 0] {
        let out = ask();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["remaining"], remaining);
    }
    let out = ask();
    assert_eq!(out.status.code(), Some(1), "denied");
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["reason"], "tenant_limit");
    let down = sluice()
        .args([
            "check",
            "--url",
            "http://127.0.0.1:9",
            "--tenant",
            "t",
            "--route",
            "GET /",
        ])
        .output()
        .unwrap();
    assert_eq!(down.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&down.stderr).contains("cannot ask"));
}

/// `sluice inspect --url` asks a running service's admin API: the memory
/// store's buckets too, as its live policy (overrides included) sees them.
#[tokio::test]
async fn inspect_asks_a_running_memory_backed_service() {
    const TOKEN: &str = "inspect-admin-token-0123456789";
    let config = temp_file(
        "inspect-memory.yaml",
        "admin:\n  token_env: TEST_INSPECT_ADMIN\ndefault_plan: p\nplans:\n  p:\n    tenant: [{ name: day, algorithm: fixed_window, limit: 100, per: 1d }]\n    routes:\n      \"POST /v1/invoices\": [{ name: invoices, algorithm: gcra, limit: 5, per: 1h }]\n",
    );
    let mut server = Server::start_with_env(
        &["--config", config.to_str().unwrap()],
        &[("TEST_INSPECT_ADMIN", TOKEN)],
    );
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let body = serde_json::json!({"tenant": "acme", "route": "POST /v1/invoices"});
        common::post(&client, &server.base, body).await;
    }
    let inspect = |token: Option<&str>| {
        let mut command = sluice();
        command
            .args(["inspect", "--url", &server.base, "--tenant", "acme"])
            .args(["--route", "POST /v1/invoices"]);
        match token {
            Some(token) => command.env("SLUICE_ADMIN_TOKEN", token),
            None => command.env_remove("SLUICE_ADMIN_TOKEN"),
        };
        command.output().unwrap()
    };
    let out = inspect(Some(TOKEN));
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(common::inspect_row(&table, "invoices")[4], "3", "{table}");
    assert_eq!(common::inspect_row(&table, "day")[4], "3", "{table}");
    // An override shows: the route doubled.
    let put = client
        .put(format!("{}/v1/admin/overrides/acme", server.base))
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"factor": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let table = String::from_utf8_lossy(&inspect(Some(TOKEN)).stdout).to_string();
    assert!(
        common::inspect_row(&table, "invoices")[3].starts_with("10/1h"),
        "{table}"
    );
    // Without the token it says why.
    for token in [None, Some("wrong-token-0000000000")] {
        let out = inspect(token);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("SLUICE_ADMIN_TOKEN") || stderr.contains("401"),
            "{stderr}"
        );
    }
    server.stop();
}

/// A configuration file that disappears (deleted, a volume unmounted) is
/// reported once, not on every poll; the running configuration stays, and
/// the file's return is applied.
#[tokio::test]
async fn a_vanished_configuration_file_is_reported_once_and_its_return_applied() {
    let config = |limit: u32| {
        format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{{ name: t, limit: {limit}, per: 1h }}]\n"
        )
    };
    let path = temp_file("vanishing.yaml", &config(2));
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    std::fs::remove_file(&path).unwrap();
    server.wait_for_log("cannot read");
    // Two more polls (one every 2 s) find it still missing.
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let log = server.log.lock().unwrap().clone();
    assert_eq!(log.matches("cannot read").count(), 1, "{log}");
    let client = reqwest::Client::new();
    // Counted once as a failed reload (what `SluiceReloadFailed` watches).
    let metrics = common::get_text(&client, &server, "/metrics").await;
    assert!(
        metrics.contains("sluice_config_reloads_total{result=\"error\"} 1\n"),
        "{metrics}"
    );
    let limit = |body: Value| body["limit"].as_u64();
    let ask = || {
        post(
            &client,
            &server.base,
            json!({"tenant": "a", "route": "GET /"}),
        )
    };
    assert_eq!(limit(ask().await.1), Some(2));
    std::fs::write(&path, config(5)).unwrap();
    server.wait_for_log("configuration reloaded");
    assert_eq!(limit(ask().await.1), Some(5));
}
