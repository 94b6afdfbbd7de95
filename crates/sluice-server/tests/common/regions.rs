//! What the tests across regions share: a region's configuration, and
//! waiting until regions link.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use sluice_testkit::{DelayProxy, RedisServer};

use super::{Server, post, temp_file};

pub const PEPPER: &str = "5a1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f71";
pub const OTHER_PEPPER: &str = "0b1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f72";
pub const PER_MS: u64 = 3_000;
pub const LIMIT: u64 = 150;

pub fn config(this: &str, own: &RedisServer, peers: &[(&str, String)]) -> super::TempPath {
    config_with(this, own, peers, "")
}

/// A region's configuration, `keys` lines added under `keys:`.
pub fn config_with(
    this: &str,
    own: &RedisServer,
    peers: &[(&str, String)],
    keys: &str,
) -> super::TempPath {
    let rule = format!(
        "{{ name: per-3s, algorithm: fixed_window, limit: {LIMIT}, per: 3s, aligned: true }}"
    );
    config_of(this, own, peers, keys, &rule)
}

/// A region's configuration whose plan's tenant rules are `rules` (a YAML
/// flow map, or several separated by commas).
pub fn config_of(
    this: &str,
    own: &RedisServer,
    peers: &[(&str, String)],
    keys: &str,
    rules: &str,
) -> super::TempPath {
    let peers: Vec<(&str, String)> = peers
        .iter()
        .map(|(name, url)| (*name, format!("{{ url: \"{url}\" }}")))
        .collect();
    let store = format!("backend: redis\n  url: {}", own.url());
    config_in(this, &store, &peers, keys, rules)
}

/// A region's configuration: its store (`storage` lines, such as
/// `backend: redis\n  url: …`), its peers' each as a YAML flow map (`{ url:
/// … }` or `{ nodes: [...] }`), `keys` lines, its plan's tenant `rules`.
pub fn config_in(
    this: &str,
    store: &str,
    peers: &[(&str, String)],
    keys: &str,
    rules: &str,
) -> super::TempPath {
    let peers: String = peers
        .iter()
        .map(|(name, peer)| format!("      {name}: {peer}\n"))
        .collect();
    temp_file(
        &format!("regions-{this}.yaml"),
        &format!(
            r#"
storage:
  {store}
  regions:
    self: {this}
    peers:
{peers}    sync_every: 100ms
    peer_timeout: 1s
keys:
  pepper_env: TEST_SLUICE_PEPPER
{keys}default_plan: free
plans:
  free:
    tenant: [{rules}]
"#
        ),
    )
}

pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `/readyz` of `server`: its status and body.
pub async fn readyz(client: &reqwest::Client, server: &Server) -> (u16, Value) {
    let response = client
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

/// Waits until `server` hears from every peer (or panics after 15 s).
pub async fn linked(client: &reqwest::Client, server: &Server) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, body) = readyz(client, server).await;
        let peers = body["regions"].as_array().cloned().unwrap_or_default();
        let linked = |p: &Value| p["cut_off"] == false && p["foreign"].is_null();
        if status == 200 && !peers.is_empty() && peers.iter().all(linked) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "the regions never linked: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three regions (eu, us, ap), each a real redis-server with its own
/// sluice whose tenant rules are `rules`, linked through delay proxies
/// (40 ms each way); returns once every region hears its peers. The
/// proxies are by region reached: `proxies[r]` are the two to region
/// `r`'s Redis. The servers keep their configurations, whose paths come
/// last.
pub async fn three_regions(
    client: &reqwest::Client,
    rules: &str,
) -> (
    Vec<RedisServer>,
    Vec<Vec<DelayProxy>>,
    Vec<Server>,
    Vec<String>,
) {
    let names = ["eu", "us", "ap"];
    let redis: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let mut proxies: Vec<Vec<DelayProxy>> = (0..3).map(|_| Vec::new()).collect();
    let (mut servers, mut configs) = (Vec::new(), Vec::new());
    for (r, name) in names.iter().enumerate() {
        let mut peers = Vec::new();
        for (p, peer) in names.iter().enumerate() {
            if p != r {
                let proxy = DelayProxy::start(redis[p].port(), Duration::from_millis(40));
                peers.push((*peer, proxy.url()));
                proxies[p].push(proxy);
            }
        }
        let path = config_of(name, &redis[r], &peers, "", rules);
        configs.push(path.to_str().unwrap().to_owned());
        let env = [("TEST_SLUICE_PEPPER", PEPPER)];
        let server = Server::start_with_env(&["--config", path.to_str().unwrap()], &env);
        servers.push(server.keep(path));
    }
    for server in &servers {
        linked(client, server).await;
    }
    (redis, proxies, servers, configs)
}

/// What a tenant got per aligned window of `PER_MS`, sending to each of
/// `regions` as fast as three clients each can until `end` (wall clock).
pub async fn hammer(
    client: &reqwest::Client,
    regions: &[&Server],
    tenant: &str,
    end: u64,
) -> BTreeMap<u64, u64> {
    let mut tasks = tokio::task::JoinSet::new();
    for server in regions {
        for _ in 0..3 {
            let (client, base) = (client.clone(), server.base.clone());
            let tenant = tenant.to_owned();
            tasks.spawn(async move {
                let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
                while wall_ms() < end {
                    let body = json!({ "tenant": tenant, "route": "GET /" });
                    let (status, _) = post(&client, &base, body).await;
                    let at = wall_ms();
                    if status == 200 && at < end {
                        *admitted.entry(at - at % PER_MS).or_default() += 1;
                    }
                }
                admitted
            });
        }
    }
    let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
    while let Some(seen) = tasks.join_next().await {
        for (w, n) in seen.unwrap() {
            *admitted.entry(w).or_default() += n;
        }
    }
    admitted
}

/// The start of the next aligned window, once it has come.
pub async fn next_window() -> u64 {
    let now = wall_ms();
    let start = now - now % PER_MS + PER_MS;
    tokio::time::sleep(Duration::from_millis(start - now)).await;
    start
}

/// The admin token the tests across regions use.
pub const ADMIN: &str = "regions-admin-token";

/// `method` on `/v1/admin/overrides/{tenant}` of `server`: its status and
/// JSON body (`Null` when it has none).
pub async fn override_call(
    client: &reqwest::Client,
    server: &Server,
    method: reqwest::Method,
    tenant: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = client
        .request(
            method,
            format!("{}/v1/admin/overrides/{tenant}", server.base),
        )
        .bearer_auth(ADMIN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Waits until `GET` of `tenant`'s override on `server` answers `status`
/// (or panics after 10 s): its body then.
pub async fn override_becomes(
    client: &reqwest::Client,
    server: &Server,
    tenant: &str,
    status: u16,
    what: &str,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (seen, body) = override_call(client, server, reqwest::Method::GET, tenant, None).await;
        if seen == status {
            return body;
        }
        assert!(Instant::now() < deadline, "{what}: still {seen} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
