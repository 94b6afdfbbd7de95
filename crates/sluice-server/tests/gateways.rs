//! The gateway recipes in `deploy/gateways/`, run with the real gateway
//! (Debian's package) on free loopback ports, in front of a tiny app, with
//! a real `sluice serve` as forward-auth: what every recipe must do, then a
//! hostile client's table (spoofed forwarded headers, oversized and
//! repeated headers, long and non-ASCII paths, a repeated
//! `Idempotency-Key`), then sluice hung and sluice stopped.

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use common::{Server, TempPath, temp_file, temp_path};
use sluice_testkit::free_port;

const LIMITS: &str = r#"
server:
  forward_auth: { tenant_header: X-Tenant }
default_plan: p
plans:
  p:
    routes:
      "GET /orders": [{ name: orders, algorithm: fixed_window, limit: 2, per: 1h }]
      "POST /orders": [{ name: writes, algorithm: fixed_window, limit: 100, per: 1h }]
      "POST /login": [{ name: failed-logins, algorithm: fixed_window, limit: 2, per: 1h, count_if: { status: [401] } }]
    dedupe:
      "POST /orders": { window: 1h }
"#;

/// The attempt a request came with, or `none`.
async fn attempt_of(headers: HeaderMap) -> String {
    headers
        .get("sluice-attempt")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
        .to_owned()
}

/// The app behind the gateway: counts every request that reaches it,
/// whatever its path, and answers `GET /orders` with the tenant the
/// gateway passed on.
async fn app() -> (u16, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let router = axum::Router::new()
        .route(
            "/orders",
            axum::routing::get(|headers: HeaderMap| async move {
                let tenant = headers
                    .get("x-tenant")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned();
                format!("orders of {tenant}")
            })
            .post(|| async { "order created" }),
        )
        .route("/login", axum::routing::post(attempt_of))
        .route("/attempt", axum::routing::get(attempt_of))
        .fallback(|| async { "reached the app" })
        .layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                counted.fetch_add(1, Ordering::SeqCst);
                next.run(request)
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (port, hits)
}

struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers too (SIGKILL would leave
        // them running).
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn need(program: &str, package: &str) {
    let found = Command::new(program).arg("-v").output();
    assert!(
        found.is_ok(),
        "`{program}` is needed by this test: install Debian's {package} package (apt-get install {package})"
    );
}

/// The recipe `file` with its addresses moved to these ports.
fn recipe(file: &str, gateway: u16, sluice: u16, app: u16) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/gateways")
        .join(file);
    std::fs::read_to_string(path)
        .unwrap()
        .replace("127.0.0.1:8000", &format!("127.0.0.1:{gateway}"))
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{sluice}"))
        .replace("127.0.0.1:9000", &format!("127.0.0.1:{app}"))
}

/// What each gateway test starts with: sluice, the app, the gateway's
/// port and a directory of its own.
struct Setup {
    sluice: Server,
    sluice_port: u16,
    app_port: u16,
    hits: Arc<AtomicUsize>,
    port: u16,
    dir: TempPath,
}

/// One gateway at a time: a gateway's port is found free before the
/// gateway binds it (two tests at once could be handed the same one), and
/// "sluice hung" must not be a machine too busy to tell.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn setup(gateway: &str) -> Setup {
    let config = temp_file(&format!("gateway-limits-{gateway}.yaml"), LIMITS);
    let sluice = Server::start(&["--config", config.to_str().unwrap()]).keep(config);
    let sluice_port: u16 = sluice.base.rsplit(':').next().unwrap().parse().unwrap();
    let (app_port, hits) = app().await;
    let dir = temp_path(gateway, gateway);
    std::fs::create_dir_all(&dir).unwrap();
    Setup {
        sluice,
        sluice_port,
        app_port,
        hits,
        port: free_port(false),
        dir,
    }
}

async fn wait_for(port: u16) {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nothing listens on {port}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What every recipe must do, checked through the gateway at `base`.
async fn behaves(base: &str, hits: &AtomicUsize) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let get = |user: &str, forged: Option<&str>| {
        let mut request = client
            .get(format!("{base}/orders"))
            .basic_auth(user, Some(format!("{user}-secret")));
        if let Some(tenant) = forged {
            request = request.header("X-Tenant", tenant);
        }
        request.send()
    };
    // Allowed: the app sees the authenticated tenant, not the forged one;
    // the client gets the RateLimit fields.
    for left in [1, 0] {
        let response = get("acme", Some("globex")).await.unwrap();
        assert_eq!(response.status(), 200);
        let headers = response.headers().clone();
        assert_eq!(response.text().await.unwrap(), "orders of acme");
        let ratelimit = headers["ratelimit"].to_str().unwrap();
        assert!(
            ratelimit.contains(&format!("\"orders\";r={left}")),
            "{ratelimit}"
        );
        assert!(
            headers["ratelimit-policy"]
                .to_str()
                .unwrap()
                .contains("\"orders\";q=2")
        );
    }
    // Denied: 429 with Retry-After, the fields and a problem; the app never
    // sees it.
    let response = get("acme", None).await.unwrap();
    assert_eq!(response.status(), 429);
    let headers = response.headers().clone();
    assert!(
        headers["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert!(
        headers["ratelimit"]
            .to_str()
            .unwrap()
            .contains("\"orders\";r=0")
    );
    assert!(headers.contains_key("ratelimit-policy"));
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/problem+json")
    );
    let problem: serde_json::Value = response.json().await.unwrap();
    assert_eq!(problem["status"], 429);
    assert_eq!(hits.load(Ordering::SeqCst), 2);
    // The forged header spent nothing of globex's budget.
    for _ in 0..2 {
        assert_eq!(get("globex", None).await.unwrap().status(), 200);
    }
    // Without the gateway's authentication, nothing gets through.
    let anonymous = client.get(format!("{base}/orders")).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
}

/// On a route with a `count_if` rule, the app gets the attempt sluice
/// holds (never one the client sent) and concludes it on sluice: two
/// failures, then the gateway refuses the third login.
async fn passes_the_attempt(base: &str, sluice: &Server) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let login = |forged: Option<&str>| {
        let mut request = client
            .post(format!("{base}/login"))
            .basic_auth("globex", Some("globex-secret"));
        if let Some(attempt) = forged {
            request = request.header("Sluice-Attempt", attempt);
        }
        request.send()
    };
    for forged in [Some("forged-by-the-client"), None] {
        let response = login(forged).await.unwrap();
        assert_eq!(response.status(), 200);
        let attempt = response.text().await.unwrap();
        assert!(
            attempt != "none" && !attempt.contains("forged"),
            "the app got {attempt:?}"
        );
        let (status, body) = common::post_to(
            &client,
            &format!("{}/v1/report", sluice.base),
            serde_json::json!({"attempt": attempt, "status": 401}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(login(None).await.unwrap().status(), 429);
    // Elsewhere (no rule counts by outcome) the app gets none, whatever
    // the client sends.
    let response = client
        .get(format!("{base}/attempt"))
        .basic_auth("globex", Some("globex-secret"))
        .header("Sluice-Attempt", "forged-by-the-client")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "none");
}

/// `acme:acme-secret`, as the `Authorization: Basic` credentials.
const ACME: &str = "YWNtZTphY21lLXNlY3JldA==";

/// Sends `head` (a request line and headers, without the blank line) on
/// its own connection, byte for byte, and returns the status the gateway
/// answered (0 when it closed without one).
async fn raw(port: u16, head: &[u8]) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.write_all(head).await.unwrap();
    stream
        .write_all(b"\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer));
    // A gateway may reset a connection it refused: what it sent counts.
    let _ = read.await.expect("the gateway answers within 10 s");
    let text = String::from_utf8_lossy(&answer);
    text.split(' ')
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or(0)
}

/// A hostile client with acme's credentials and acme's `GET /orders`
/// budget spent: nothing it writes reaches the app, and sluice's refusals
/// (429, 409, 400 and 413 alike) reach the client, never the app.
async fn withstands(port: u16, hits: &AtomicUsize) {
    let auth = format!("Authorization: Basic {ACME}");
    let long = "x".repeat(1100);
    let key = "k".repeat(300);
    // What each case is, the statuses it may get (the gateway's own 400 or
    // sluice's, relayed; nginx passes the first of two Idempotency-Keys), and
    // its bytes.
    let cases: Vec<(&str, &[u16], Vec<u8>)> = vec![
        (
            "a spoofed X-Forwarded-Uri and method",
            &[429],
            format!("GET /orders HTTP/1.1\r\n{auth}\r\nX-Forwarded-Method: GET\r\nX-Forwarded-Uri: /free")
                .into_bytes(),
        ),
        (
            "a spoofed X-Original-URI and method",
            &[429],
            format!("GET /orders HTTP/1.1\r\n{auth}\r\nX-Original-Method: GET\r\nX-Original-URI: /free")
                .into_bytes(),
        ),
        (
            "a spoofed X-Forwarded-Uri sent twice",
            &[429],
            format!("GET /orders HTTP/1.1\r\n{auth}\r\nX-Forwarded-Uri: /free\r\nX-Forwarded-Uri: /free")
                .into_bytes(),
        ),
        (
            "a forged tenant sent twice",
            &[429],
            format!("GET /orders HTTP/1.1\r\n{auth}\r\nX-Tenant: globex\r\nX-Tenant: globex")
                .into_bytes(),
        ),
        (
            "an oversized Idempotency-Key",
            &[400],
            format!("GET /orders HTTP/1.1\r\n{auth}\r\nIdempotency-Key: {key}").into_bytes(),
        ),
        (
            "Idempotency-Key sent twice",
            &[400, 429],
            format!("GET /orders HTTP/1.1\r\n{auth}\r\nIdempotency-Key: a\r\nIdempotency-Key: b")
                .into_bytes(),
        ),
        (
            "a query past the route's bound",
            &[429],
            format!("GET /orders?pad={long} HTTP/1.1\r\n{auth}").into_bytes(),
        ),
        (
            "a path past the route's bound",
            &[400],
            format!("GET /orders/{long} HTTP/1.1\r\n{auth}").into_bytes(),
        ),
        (
            "a non-ASCII query",
            &[400],
            [
                b"GET /orders?q=\xc3\xa9 HTTP/1.1\r\n".as_slice(),
                auth.as_bytes(),
            ]
            .concat(),
        ),
        (
            "another spelling of the route",
            &[429],
            format!("GET //x/../orders/?a=b HTTP/1.1\r\n{auth}").into_bytes(),
        ),
    ];
    for (what, expected, head) in cases {
        let before = hits.load(Ordering::SeqCst);
        let status = raw(port, &head).await;
        assert_eq!(
            hits.load(Ordering::SeqCst),
            before,
            "{what}: the request reached the app (status {status})"
        );
        assert!(
            expected.contains(&status),
            "{what}: answered {status}, not one of {expected:?}"
        );
    }
    // The duplicate guard holds behind the gateway: one admission per
    // Idempotency-Key; the second is sluice's 409 and never reaches the app.
    let post =
        format!("POST /orders HTTP/1.1\r\n{auth}\r\nIdempotency-Key: order-1\r\nContent-Length: 0");
    let before = hits.load(Ordering::SeqCst);
    let first = raw(port, post.as_bytes()).await;
    assert_eq!(first, 200, "the first submission");
    assert_eq!(hits.load(Ordering::SeqCst), before + 1);
    assert_eq!(raw(port, post.as_bytes()).await, 409, "the duplicate");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        before + 1,
        "the duplicate reached the app"
    );
}

/// sluice hung (stopped with SIGSTOP: connections are accepted, nothing
/// answers), then down: the recipe answers within 2 s either way, as it
/// documents: to the app when it fails open, a 5xx when it fails closed.
async fn survives(port: u16, sluice: &mut Server, hits: &Arc<AtomicUsize>, fails_open: bool) {
    let attempt = |what: &'static str| {
        let hits = hits.clone();
        async move {
            let get = format!("GET /orders HTTP/1.1\r\nAuthorization: Basic {ACME}");
            let before = hits.load(Ordering::SeqCst);
            let started = Instant::now();
            let status = raw(port, get.as_bytes()).await;
            let took = started.elapsed();
            let reached = hits.load(Ordering::SeqCst) - before;
            assert!(
                took < Duration::from_secs(2),
                "{what}: answered after {took:?}"
            );
            if fails_open {
                assert_eq!((status, reached), (200, 1), "{what}: fails open");
            } else {
                assert!(
                    (500..600).contains(&status),
                    "{what}: fails closed, got {status}"
                );
                assert_eq!(reached, 0, "{what}: fails closed, yet reached the app");
            }
        }
    };
    // Stopped: every thread, waited on (`kill` returns before).
    let signal = |name: &str| sluice_testkit::signal(sluice.child.id(), name);
    signal("STOP");
    // Resumed even when the attempt fails, so that sluice can be stopped.
    let hung = tokio::spawn(attempt("sluice hung")).await;
    signal("CONT");
    if let Err(failed) = hung {
        std::panic::resume_unwind(failed.into_panic());
    }
    sluice.stop();
    attempt("sluice down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_recipe_limits_passes_the_fields_and_trusts_only_its_identity() {
    need("nginx", "nginx");
    let _one = ONE_AT_A_TIME.lock().await;
    let Setup {
        mut sluice,
        sluice_port,
        app_port,
        hits,
        port,
        dir,
    } = setup("nginx").await;
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    std::fs::write(
        dir.join("users.htpasswd"),
        "acme:{PLAIN}acme-secret\nglobex:{PLAIN}globex-secret\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("nginx.conf"),
        recipe("nginx.conf", port, sluice_port, app_port),
    )
    .unwrap();
    let _nginx = Gateway(
        Command::new("nginx")
            .arg("-p")
            .arg(&dir)
            .args(["-c", "nginx.conf", "-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(port).await;
    behaves(&format!("http://127.0.0.1:{port}"), &hits).await;
    withstands(port, &hits).await;
    passes_the_attempt(&format!("http://127.0.0.1:{port}"), &sluice).await;
    survives(port, &mut sluice, &hits, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caddy_recipe_limits_passes_the_fields_and_trusts_only_its_identity() {
    need("caddy", "caddy");
    let _one = ONE_AT_A_TIME.lock().await;
    let Setup {
        mut sluice,
        sluice_port,
        app_port,
        hits,
        port,
        dir,
    } = setup("caddy").await;
    std::fs::write(
        dir.join("Caddyfile"),
        recipe("Caddyfile", port, sluice_port, app_port),
    )
    .unwrap();
    let hash = |password: &str| {
        let out = Command::new("caddy")
            .args(["hash-password", "--plaintext", password])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let _caddy = Gateway(
        Command::new("caddy")
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(dir.join("Caddyfile"))
            .env("ACME_PASSWORD_HASH", hash("acme-secret"))
            .env("GLOBEX_PASSWORD_HASH", hash("globex-secret"))
            .env("HOME", &dir)
            .env("XDG_DATA_HOME", &dir)
            .env("XDG_CONFIG_HOME", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(port).await;
    behaves(&format!("http://127.0.0.1:{port}"), &hits).await;
    withstands(port, &hits).await;
    passes_the_attempt(&format!("http://127.0.0.1:{port}"), &sluice).await;
    survives(port, &mut sluice, &hits, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_haproxy_recipe_limits_passes_the_fields_and_trusts_only_its_identity() {
    need("haproxy", "haproxy");
    let _one = ONE_AT_A_TIME.lock().await;
    let Setup {
        mut sluice,
        sluice_port,
        app_port,
        hits,
        port,
        dir,
    } = setup("haproxy").await;
    let lua = dir.join("sluice.lua");
    std::fs::write(&lua, recipe("sluice.lua", port, sluice_port, app_port)).unwrap();
    let cfg = recipe("haproxy.cfg", port, sluice_port, app_port)
        .replace("/etc/haproxy/sluice.lua", lua.to_str().unwrap());
    std::fs::write(dir.join("haproxy.cfg"), cfg).unwrap();
    let _haproxy = Gateway(
        Command::new("haproxy")
            .arg("-f")
            .arg(dir.join("haproxy.cfg"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(port).await;
    behaves(&format!("http://127.0.0.1:{port}"), &hits).await;
    withstands(port, &hits).await;
    passes_the_attempt(&format!("http://127.0.0.1:{port}"), &sluice).await;
    survives(port, &mut sluice, &hits, true).await;
}
