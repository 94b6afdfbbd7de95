//! The Redis backend against a real `redis-server` each test starts itself.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use redis::cluster_routing::Slot;
use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{
    Batch, ConnectOptions, KeySet, Limiter, ManualClock, RedisStore, Store, TimeSource,
};
use sluice_testkit::{Monitor, RedisServer, command_calls};

mod scenarios;

const TIMEOUT: Duration = Duration::from_secs(5);

fn pepper(n: u8) -> Pepper {
    Pepper::parse(&[b'g' + n; 32]).unwrap()
}

fn keys(byte: u8) -> KeySet {
    KeySet {
        current: Keyer::new("sl", &pepper(byte)),
        previous: None,
    }
}

fn policy(yaml: &str, sharded: bool) -> Policy {
    Policy::compile_for(
        &Config::from_yaml(yaml, "test.yaml").unwrap().limits,
        sharded,
    )
}

/// A limiter rotating from pepper `from` to pepper `to`.
async fn rotated(server: &RedisServer, policy: Policy, from: u8, to: u8) -> Limiter<RedisStore> {
    let rotating = KeySet {
        current: Keyer::new("sl", &pepper(to)),
        previous: Some(Keyer::new("sl", &pepper(from))),
    };
    Limiter::new(policy, store(server, rotating).await, OnError::Deny)
}

async fn store(server: &RedisServer, keys: KeySet) -> RedisStore {
    RedisStore::connect(&server.url(), keys, &ConnectOptions::with_timeout(TIMEOUT))
        .await
        .unwrap()
}

const FOUR_SCOPES: &str = r#"
default_plan: plan-basic-tier
plans:
  plan-basic-tier:
    tenant: [{ algorithm: gcra, limit: 1000, per: 1h }]
    routes:
      "POST /v1/invoices-secret-route": [{ algorithm: token_bucket, limit: 500, per: 1h },
                                         { algorithm: sliding_log, limit: 300, per: 1h }]
      "*": [{ algorithm: fixed_window, limit: 500, per: 1h }]
    subject:
      "*": [{ algorithm: sliding_window, limit: 400, per: 1h }]
global:
  "POST /v1/invoices-secret-route": [{ name: valve, algorithm: gcra, limit: 100000, per: 1h }]
"#;

/// Sends 50 decisions of six rules (five and the valve's fair-share
/// gate); returns what clients sent (MONITOR)
/// and how many of each script command Redis ran.
async fn fifty_decisions(server: &RedisServer, store: RedisStore) -> (Vec<String>, u64, u64) {
    let limiter = Limiter::new(policy(FOUR_SCOPES, true), store, OnError::Deny);
    let policy = limiter.policy();
    let request = Request::new("acme", "POST /v1/invoices-secret-route", Some("alice"), 2).unwrap();
    // Warm up: the function is loaded at connect time, or the fallback
    // found on the first call.
    assert!(limiter.decide(&policy, &request).await.allowed);
    assert_eq!(
        policy.applicable("acme", request.route, true).rules.len(),
        6
    );
    let mut conn = server.connection();
    let before = command_calls(&mut conn);
    let monitor = Monitor::start(server);
    for _ in 0..50 {
        assert!(limiter.decide(&policy, &request).await.allowed);
    }
    let sent = monitor.stop();
    let after = command_calls(&mut conn);
    let ran =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    (sent, ran("fcall"), ran("evalsha"))
}

#[tokio::test]
async fn every_decision_is_exactly_one_fcall() {
    let server = RedisServer::start();
    let (sent, fcall, evalsha) = fifty_decisions(&server, store(&server, keys(1)).await).await;
    assert_eq!((fcall, evalsha), (50, 0));
    // INFO commandstats also counts what the function runs inside Redis;
    // MONITOR tells what clients sent: 50 FCALL and nothing else.
    assert_eq!(sent.len(), 50, "{sent:#?}");
    assert!(sent.iter().all(|command| command == "fcall"), "{sent:#?}");
}

#[tokio::test]
async fn without_functions_every_decision_is_exactly_one_evalsha() {
    // A user that may run scripts but not functions (as on Redis 6, where
    // FCALL is an unknown command).
    let server = RedisServer::start();
    let url = server.scripts_only_url();
    let store = RedisStore::connect(&url, keys(1), &ConnectOptions::with_timeout(TIMEOUT))
        .await
        .unwrap();
    let (sent, fcall, evalsha) = fifty_decisions(&server, store).await;
    assert_eq!((fcall, evalsha), (0, 50));
    assert_eq!(sent.len(), 50, "{sent:#?}");
    assert!(sent.iter().all(|command| command == "evalsha"), "{sent:#?}");
}

#[tokio::test]
async fn leases_never_exceed_their_limits() {
    let server = RedisServer::start();
    let (a, b) = (store(&server, keys(2)).await, store(&server, keys(2)).await);
    scenarios::leases_never_exceed_their_limits(a, b).await;
}

#[tokio::test]
async fn one_submission_is_admitted_once() {
    let server = RedisServer::start();
    let (a, b) = (store(&server, keys(2)).await, store(&server, keys(2)).await);
    scenarios::one_submission_is_admitted_once(a, b).await;
}

#[tokio::test]
async fn weighted_requests_pass_a_guarded_route() {
    let server = RedisServer::start();
    scenarios::weighted_requests_pass_a_guarded_route(store(&server, keys(2)).await).await;
}

#[tokio::test]
async fn concurrent_instances_never_over_admit_and_denials_consume_nothing() {
    let server = RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..5 {
        stores.push(store(&server, keys(2)).await);
    }
    scenarios::concurrent_instances_never_over_admit_and_denials_consume_nothing(stores).await;
}

#[tokio::test]
async fn keys_and_values_reveal_nothing_about_tenants() {
    let server = RedisServer::start();
    let limiter = Limiter::new(
        policy(FOUR_SCOPES, true),
        store(&server, keys(3)).await,
        OnError::Deny,
    );
    let policy = limiter.policy();
    let tenants: Vec<String> = (0..40).map(|i| format!("tenant-visible-{i:03}")).collect();
    let subjects = ["alice@example.com", "192.0.2.77"];
    for tenant in &tenants {
        for route in [
            "POST /v1/invoices-secret-route",
            "GET /v1/other-secret-route",
        ] {
            for subject in subjects {
                let request = Request::new(tenant, route, Some(subject), 1).unwrap();
                assert!(limiter.decide(&policy, &request).await.allowed);
            }
        }
    }
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(keys.len() > 200, "{} keys", keys.len());
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let mut secrets: Vec<String> = vec![
        "tenant-visible".into(),
        "alice".into(),
        "192.0.2".into(),
        "invoices".into(),
        "secret-route".into(),
        "plan-basic".into(),
        "valve".into(),
    ];
    secrets.extend(secrets.clone().iter().map(|s| hex(s)));
    let shape = regex_like_key;
    for key in &keys {
        assert!(shape(key), "unexpected key shape: {key}");
        let kind: String = redis::cmd("TYPE").arg(key).query(&mut conn).unwrap();
        let value: Vec<u8> = if kind == "zset" {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .query(&mut conn)
                .unwrap();
            let members = members.join(" ");
            assert!(
                members
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b';' || b == b' '),
                "members {members:?}"
            );
            members.into_bytes()
        } else {
            let value: Vec<u8> = redis::cmd("GET").arg(key).query(&mut conn).unwrap();
            // Records of 40 bytes: an opaque name and four numbers.
            assert!(
                !value.is_empty() && value.len().is_multiple_of(40),
                "value of {key}: {} bytes",
                value.len()
            );
            value
        };
        let value = String::from_utf8_lossy(&value);
        for secret in &secrets {
            assert!(
                !key.to_lowercase().contains(secret.as_str()),
                "key {key} contains {secret}"
            );
            assert!(
                !value.to_lowercase().contains(secret.as_str()),
                "value of {key} contains {secret}"
            );
        }
    }
}

/// `sl:{<32 hex>}:<32 hex>`.
fn regex_like_key(key: &str) -> bool {
    let Some(rest) = key.strip_prefix("sl:{") else {
        return false;
    };
    let Some((tag, k)) = rest.split_once("}:") else {
        return false;
    };
    let is_hex = |s: &str| {
        s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    is_hex(tag) && is_hex(k)
}

#[tokio::test]
async fn every_key_expires_within_its_window_plus_slack() {
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 20, per: 10s, burst: 50 }]
    routes:
      "*": [{ algorithm: token_bucket, limit: 5, per: 30s, burst: 10 },
            { algorithm: sliding_log, limit: 20, per: 20s },
            { algorithm: sliding_window, limit: 20, per: 15s },
            { algorithm: fixed_window, limit: 20, per: 40s },
            { algorithm: fixed_window, limit: 20, per: 25s, aligned: true }]
"#;
    let server = RedisServer::start();
    let limiter = Limiter::new(
        policy(yaml, true),
        store(&server, keys(4)).await,
        OnError::Deny,
    );
    let policy = limiter.policy();
    for i in 0..30 {
        let tenant = format!("t{}", i % 7);
        let request = Request::new(&tenant, "GET /", None, 1 + i % 2).unwrap();
        limiter.decide(&policy, &request).await;
    }
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    // Per tenant: the tenant's gcra, the route's four rules whose state is
    // a few numbers (one key, a record each), and its sliding_log.
    assert_eq!(keys.len(), 7 * 3);
    // A state lives until it is as good as fresh: a window for the window
    // algorithms (two for sliding_window: 30s), `burst/limit` periods for
    // gcra (25s) and token_bucket (10 tokens at one per 6s: 60s). Plus 1s
    // slack, rounded up to a multiple of 64 ms (61,056).
    let mut records = Vec::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).unwrap();
        if kind == "string" {
            let value: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut conn).unwrap();
            records.push(value.len() / 40);
        }
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut conn).unwrap();
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
        assert!(ttl <= 61_056, "{key} lives {ttl}ms");
    }
    records.sort_unstable();
    assert_eq!(records, [[1; 7], [4; 7]].concat());
}

/// A key's TTL as the function sends it (PX, a string it keeps, rounded up
/// to 64 ms): never shorter than the state's freshness plus the slack, at
/// most 63 ms longer, for every remainder of 64.
#[tokio::test]
async fn a_keys_expiry_is_never_shorter_than_its_state_and_at_most_63_ms_longer() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let store = store(&server, keys(6))
        .await
        .with_time(TimeSource::Client(clock.clone()));
    let mut conn = server.connection();
    // A fixed window's state is fresh one window after it opened: the key
    // lives per + 1s (the slack), whatever the remainder of 64.
    for (i, per) in (9_000..9_130).step_by(7).enumerate() {
        let yaml = format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{{ algorithm: fixed_window, limit: 5, per: {per}ms }}]\n"
        );
        let policy = policy(&yaml, true);
        let tenant = format!("t{i}");
        let rules = policy.applicable(&tenant, "GET /", false).rules;
        let started = std::time::Instant::now();
        let outcomes = store
            .decide(&Batch::new(&tenant, None, 1, rules))
            .await
            .unwrap();
        assert!(outcomes.outcomes[0].allowed);
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        assert_eq!(keys.len(), 1, "{keys:?}");
        let ttl: u64 = redis::cmd("PTTL").arg(&keys[0]).query(&mut conn).unwrap();
        let waited = started.elapsed().as_millis() as u64 + 1;
        let _: () = redis::cmd("FLUSHDB").query(&mut conn).unwrap();
        let exact = per + 1_000;
        assert!(
            ttl + waited >= exact,
            "per {per}ms: {ttl}ms left after {waited}ms, state needs {exact}"
        );
        assert!(
            ttl <= exact.div_ceil(64) * 64,
            "per {per}ms: {ttl}ms, more than {exact} rounded up"
        );
    }
}

fn function_loaded(server: &RedisServer) -> bool {
    let libraries: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut server.connection())
        .unwrap();
    format!("{libraries:?}").contains("sluice_decide_")
}

#[tokio::test]
async fn decisions_survive_function_flush_script_flush_and_a_restart() {
    let mut server = RedisServer::start();
    let limiter = Limiter::new(
        policy(FOUR_SCOPES, true),
        store(&server, keys(5)).await,
        OnError::Deny,
    );
    let policy = limiter.policy();
    let request = Request::new("acme", "POST /v1/invoices-secret-route", Some("a"), 1).unwrap();
    assert!(limiter.decide(&policy, &request).await.allowed);
    for flush in ["FUNCTION", "SCRIPT"] {
        let _: () = redis::cmd(flush)
            .arg("FLUSH")
            .query(&mut server.connection())
            .unwrap();
        let decision = limiter.decide(&policy, &request).await;
        assert!(decision.allowed, "after {flush} FLUSH: {decision:?}");
        assert_eq!(
            decision.outcomes.len(),
            6,
            "decided by the function, not by a failure policy"
        );
    }
    assert!(
        function_loaded(&server),
        "the function was loaded again after FUNCTION FLUSH"
    );

    server.restart();
    // The connection comes back on its own; the first calls may fail while
    // it does.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let decision = limiter.decide(&policy, &request).await;
        if decision.allowed && decision.outcomes.len() == 6 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no recovery after restart: {decision:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The new server started empty: the store loaded the function again
    // rather than falling back to scripts.
    assert!(
        function_loaded(&server),
        "the function was loaded on the restarted server"
    );
    let calls = command_calls(&mut server.connection());
    assert!(calls.get("fcall").copied().unwrap_or(0) > 0, "{calls:?}");
}

#[tokio::test]
async fn pepper_rotation_neither_resets_nor_doubles_a_budget() {
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 10, per: 1h }]
    routes:
      "*": [{ algorithm: sliding_log, limit: 10, per: 1h }]
"#;
    let server = RedisServer::start();
    let old = Limiter::new(
        policy(yaml, true),
        store(&server, keys(6)).await,
        OnError::Deny,
    );
    let p = old.policy();
    let request = Request::new("acme", "GET /", None, 1).unwrap();
    for _ in 0..10 {
        assert!(old.decide(&p, &request).await.allowed);
    }
    assert!(!old.decide(&p, &request).await.allowed);

    let new = rotated(&server, policy(yaml, true), 6, 7).await;
    let p = new.policy();
    let decision = new.decide(&p, &request).await;
    assert!(
        !decision.allowed,
        "the budget used under the old pepper still counts"
    );
    assert_eq!(decision.outcomes.len(), 2);
    assert_eq!(decision.outcomes[0].remaining, 0);

    // The state now lives under the new keys: without the previous pepper
    // the tenant is still limited.
    let moved = Limiter::new(
        policy(yaml, true),
        store(&server, keys(7)).await,
        OnError::Deny,
    );
    let p = moved.policy();
    assert!(!moved.decide(&p, &request).await.allowed);
    // A tenant never seen before starts fresh under the new pepper.
    let fresh = Request::new("newcomer", "GET /", None, 1).unwrap();
    assert!(moved.decide(&p, &fresh).await.allowed);
}

#[tokio::test]
async fn a_sharded_tenant_spreads_over_slots_and_stays_within_its_limit() {
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 100, per: 1h }]
tenants:
  huge: { shards: 4 }
"#;
    let server = RedisServer::start();
    let limiter = Limiter::new(
        policy(yaml, true),
        store(&server, keys(8)).await,
        OnError::Deny,
    );
    let p = limiter.policy();
    let request = Request::new("huge", "GET /", None, 1).unwrap();
    let mut admitted = 0;
    for _ in 0..200 {
        if limiter.decide(&p, &request).await.allowed {
            admitted += 1;
        }
    }
    // Each of the 4 shards holds 25: round robin fills them evenly.
    assert_eq!(admitted, 100);
    let mut conn = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert_eq!(keys.len(), 4);
    let slots: HashSet<Slot> = keys.iter().map(Slot::for_key).collect();
    assert_eq!(slots.len(), 4, "the shards' keys land on different slots");
}

#[tokio::test]
async fn the_store_reports_a_dead_redis_as_an_error_not_a_hang() {
    let mut server = RedisServer::start();
    let store = store(&server, keys(9)).await;
    let p = policy(FOUR_SCOPES, true);
    server.stop();
    let rules = p.applicable("t", "GET /", false).rules;
    let batch = Batch::new("t", None, 1, rules);
    let started = std::time::Instant::now();
    let result = store.decide(&batch).await;
    assert!(result.is_err());
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn connects_with_acl_credentials_in_the_url() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("sluice")
        .arg("on")
        .arg(">s3cret-pass")
        .arg("~sl:*")
        .arg("+@all")
        .query(&mut conn)
        .unwrap();
    let url = format!("redis://sluice:s3cret-pass@127.0.0.1:{}", server.port());
    let store = RedisStore::connect(&url, keys(10), &ConnectOptions::with_timeout(TIMEOUT))
        .await
        .unwrap();
    let limiter = Limiter::new(policy(FOUR_SCOPES, true), store, OnError::Deny);
    let p = limiter.policy();
    let decision = limiter
        .decide(&p, &Request::new("acme", "GET /", None, 1).unwrap())
        .await;
    assert!(decision.allowed && !decision.outcomes.is_empty());

    // Wrong credentials: the store is created (the connection is lazy) but
    // refuses to decide, and says so without the password.
    let wrong = format!("redis://sluice:wrong-pass@127.0.0.1:{}", server.port());
    let store = RedisStore::connect(&wrong, keys(10), &ConnectOptions::with_timeout(TIMEOUT))
        .await
        .unwrap();
    let error = store.ping().await.unwrap_err();
    assert!(
        matches!(error, sluice_store::StoreError::Refused(_)),
        "{error}"
    );
    assert!(!error.to_string().contains("wrong-pass"), "{error}");
}

#[tokio::test]
async fn connects_over_tls_to_a_server_signed_by_a_private_ca() {
    let server = RedisServer::start_tls();
    let url = format!("rediss://127.0.0.1:{}", server.tls_port());
    let options = ConnectOptions {
        timeout: TIMEOUT,
        tls_ca_pem: Some(server.ca_pem()),
    };
    let store = RedisStore::connect(&url, keys(11), &options).await.unwrap();
    let limiter = Limiter::new(policy(FOUR_SCOPES, true), store, OnError::Deny);
    let p = limiter.policy();
    let decision = limiter
        .decide(&p, &Request::new("acme", "GET /", None, 1).unwrap())
        .await;
    assert!(decision.allowed && !decision.outcomes.is_empty());
    let written: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.connection())
        .unwrap();
    assert!(!written.is_empty());

    // Without the CA the certificate is not trusted: nothing gets through.
    let untrusted = RedisStore::connect(&url, keys(11), &ConnectOptions::with_timeout(TIMEOUT))
        .await
        .unwrap();
    assert!(untrusted.ping().await.is_err());
}

#[tokio::test]
async fn heartbeats_tell_other_peppers_apart_but_not_a_rolling_rotation() {
    let server = RedisServer::start();
    let old = store(&server, keys(1)).await;
    let rotated = store(
        &server,
        KeySet {
            previous: Some(Keyer::new("sl", &pepper(1))),
            ..keys(2)
        },
    )
    .await;
    let other = store(&server, keys(3)).await;
    let beat = |s: &RedisStore, id: &'static str| {
        let s = s.clone();
        async move { s.heartbeat(id, 3_000).await.unwrap() }
    };
    let b = beat(&old, "old").await;
    assert_eq!((b.live, b.other_peppers), (1, 0));
    // Mid-rotation: the rotated instance still knows the old pepper.
    let b = beat(&rotated, "rotated").await;
    assert_eq!((b.live, b.other_peppers), (2, 0));
    let b = beat(&old, "old").await;
    assert_eq!((b.live, b.other_peppers), (2, 0));
    // A third pepper is nobody's.
    let b = beat(&other, "other").await;
    assert_eq!((b.live, b.other_peppers), (1, 2));
    let b = beat(&old, "old").await;
    assert_eq!((b.live, b.other_peppers), (2, 1));
    // Fingerprints, never peppers, are what the store holds.
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg("sl:instances")
        .arg(0)
        .arg(-1)
        .query(&mut server.connection())
        .unwrap();
    assert_eq!(members.len(), 3, "{members:?}");
    for member in &members {
        // The peppers are 32 × 'h', 'i' and 'j'.
        for secret in ["hhhh", "iiii", "jjjj", "6868", "6969", "6a6a"] {
            assert!(!member.contains(secret), "{member}");
        }
    }
}

fn decide_on(runtime: &tokio::runtime::Runtime, limiter: &Limiter<RedisStore>) -> bool {
    runtime.block_on(async {
        let policy = limiter.policy();
        let request = Request::new("acme", "GET /v1/x", None, 1).unwrap();
        limiter.decide(&policy, &request).await.allowed
    })
}

fn clients(server: &RedisServer) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.connection())
        .unwrap();
    list.lines().count()
}

/// Each thread decides over a connection of its own (driven on its own
/// runtime, as sluice-server's listener threads are), and a thread whose
/// runtime went away decides again at once on its next runtime (on Deny,
/// a decision Redis did not make would be a denial).
#[test]
fn each_thread_decides_over_its_own_connection_and_outlives_its_runtime() {
    let server = RedisServer::start();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let store = first.block_on(store(&server, keys(9)));
    let limiter = std::sync::Arc::new(Limiter::new(
        policy(FOUR_SCOPES, true),
        store,
        OnError::Deny,
    ));
    let before = clients(&server);
    assert!(decide_on(&first, &limiter));
    // Two more threads decide, and keep their runtimes until counted.
    let deciding = limiter.clone();
    let (decided, during) = sluice_testkit::while_threads_stand(
        2,
        move || {
            let runtime = runtime();
            ((0..5).all(|_| decide_on(&runtime, &deciding)), runtime)
        },
        || clients(&server),
    );
    assert!(decided, "decided by Redis on other threads");
    assert_eq!(
        during,
        before + 3,
        "one connection per deciding thread ({before} before)"
    );
    drop(first);
    let second = runtime();
    assert!(
        decide_on(&second, &limiter),
        "the first decision on a new runtime is made by Redis"
    );
}

/// A dropped store's connections go: a thread gives its own up on its next
/// call to any store, though its runtime lives on.
#[test]
fn a_dropped_store_leaves_no_connection_behind() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limiter = |runtime: &tokio::runtime::Runtime| {
        Limiter::new(
            policy(FOUR_SCOPES, true),
            runtime.block_on(store(&server, keys(9))),
            OnError::Deny,
        )
    };
    let before = clients(&server);
    let first = limiter(&runtime);
    assert!(decide_on(&runtime, &first));
    assert_eq!(clients(&server), before + 2, "shared and this thread's");
    drop(first);
    let second = limiter(&runtime);
    assert!(decide_on(&runtime, &second));
    // Redis sees a closed connection go a moment later.
    let settled = (0..50).any(|_| {
        runtime.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(20)).await });
        clients(&server) == before + 2
    });
    assert!(
        settled,
        "only the second store's two connections are left ({} now, {before} before)",
        clients(&server)
    );
}

/// The rules of one scope share a key, a record each. A reload that drops
/// one of them keeps its record while it still counts, so restoring the
/// rule restores its budget; once idle it is dropped at the next write,
/// and the key holds nothing of rules no longer configured. A rule finds
/// its record wherever it is in the value: alone, or with the rules in
/// another order.
#[tokio::test]
async fn a_removed_rule_keeps_its_record_while_it_counts_then_leaves_nothing() {
    let both = r#"
default_plan: p
plans:
  p:
    tenant:
      - { name: fast, algorithm: gcra, limit: 100, per: 1s }
      - { name: daily, algorithm: fixed_window, limit: 3, per: 10s }
"#;
    let fast_only = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: fast, algorithm: gcra, limit: 100, per: 1s }]
"#;
    // daily's record is the value's second: found wherever it is.
    let daily_only = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: daily, algorithm: fixed_window, limit: 3, per: 10s }]
"#;
    let reversed = r#"
default_plan: p
plans:
  p:
    tenant:
      - { name: daily, algorithm: fixed_window, limit: 3, per: 10s }
      - { name: fast, algorithm: gcra, limit: 100, per: 1s }
"#;
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let store = store(&server, keys(12))
        .await
        .with_time(TimeSource::Client(clock.clone()));
    let decide = |yaml: &'static str| {
        let policy = policy(yaml, false);
        let store = store.clone();
        async move {
            let rules = policy.applicable("acme", "GET /", false).rules;
            let outcomes = store
                .decide(&Batch::new("acme", None, 1, rules))
                .await
                .unwrap();
            outcomes.outcomes.iter().all(|o| o.allowed)
        }
    };
    let mut conn = server.connection();
    let records = |conn: &mut redis::Connection| -> usize {
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).unwrap();
        assert_eq!(keys.len(), 1, "one key for the tenant's rules: {keys:?}");
        let value: Vec<u8> = redis::cmd("GET").arg(&keys[0]).query(conn).unwrap();
        value.len() / 40
    };
    for _ in 0..3 {
        assert!(decide(both).await);
    }
    assert!(!decide(both).await, "daily has counted 3");
    assert_eq!(records(&mut conn), 2);
    assert!(!decide(daily_only).await, "daily alone finds its count");
    assert!(!decide(reversed).await, "in another order too");
    // Reloaded without daily: fast decides alone, daily's record stays.
    clock.advance(1_000);
    assert!(decide(fast_only).await);
    assert_eq!(records(&mut conn), 2);
    // Restored within its window: still exhausted.
    assert!(!decide(both).await, "daily's count survived the reload");
    // Without daily again, past its window and the slack: gone.
    clock.advance(10_000);
    assert!(decide(fast_only).await);
    assert_eq!(records(&mut conn), 1);
    assert!(decide(both).await, "a fresh window");
    assert_eq!(records(&mut conn), 2);
}

/// Rotation through every path a decision takes: one rule alone, and a
/// group of rules sharing a key; each finds its record under the previous
/// pepper's name.
#[tokio::test]
async fn rotation_finds_records_of_one_rule_and_of_a_group() {
    let server = RedisServer::start();
    for (yaml, tenant) in [
        (
            "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 3, per: 1h }]\n",
            "alone",
        ),
        (
            "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 3, per: 1h }, { algorithm: fixed_window, limit: 50, per: 1h }]\n",
            "group",
        ),
    ] {
        let request = Request::new(tenant, "GET /", None, 1).unwrap();
        let old = Limiter::new(
            policy(yaml, false),
            store(&server, keys(13)).await,
            OnError::Deny,
        );
        let p = old.policy();
        for _ in 0..3 {
            assert!(old.decide(&p, &request).await.allowed);
        }
        let new = rotated(&server, policy(yaml, false), 13, 14).await;
        let p = new.policy();
        let decision = new.decide(&p, &request).await;
        assert!(
            !decision.allowed,
            "{tenant}: the budget used under the old pepper counts"
        );
    }
}

/// Redis's clock in ms, read with `TIME`.
fn server_ms(server: &RedisServer) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut server.connection()).unwrap();
    seconds * 1000 + micros / 1000
}

#[tokio::test]
async fn a_decision_on_the_servers_clock_is_stamped_with_its_time() {
    // What the store sends when it decides on the server's clock (no
    // header argument at all): the admission time in the reply, which a
    // refund names, is Redis's TIME in ms, read between two TIMEs of our
    // own, on every call whatever the milliseconds.
    use sluice_store::Valve;
    use sluice_store::redis::{self as script, Decide, DecideCall, Selection};

    let server = RedisServer::start();
    let decide = Decide::new();
    let mut connection = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    decide.load(&mut connection).await.unwrap();
    let policy = policy(
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 1000000, per: 1s }]\n",
        false,
    );
    let rules = policy.applicable("any", "GET /", false).rules;
    let keys = keys(1);
    for i in 0..40 {
        let tenant = format!("t{}", i % 3);
        let batch = Batch::new(&tenant, None, 1, rules);
        let buckets = KeySet::keys(&keys.current, &batch, Valve::WHOLE);
        let call = DecideCall::new(
            &batch,
            Selection::ALL,
            buckets.keys.into_vec(),
            &buckets.records,
            None,
            &TimeSource::Server,
        );
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(decide.function_name());
        call.fill(&mut cmd);
        let before = server_ms(&server);
        let bytes: Vec<u8> = cmd.query_async(&mut connection).await.unwrap();
        let after = server_ms(&server);
        let reply = script::reply(&bytes, 1).unwrap();
        assert!(reply.outcomes[0].allowed);
        assert!(
            (before..=after).contains(&reply.admitted_at),
            "admitted at {} outside Redis's {before}..={after}",
            reply.admitted_at
        );
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// A plan whose every list holds the most rules a list may
/// (`MAX_RULES_PER_LIST`): a request it applies to is decided against four
/// times that many rules, of every algorithm with a state, and a gate per
/// valve (the valves of the algorithms fair valves have, so each has its
/// gate), in one call.
fn fullest_plan() -> String {
    use sluice_core::config::MAX_RULES_PER_LIST;
    let algorithms = [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ];
    let list = |scope: &str, indent: &str| {
        (0..MAX_RULES_PER_LIST)
            .map(|i| {
                // The route's first rule admits one request an hour.
                let limit = if scope == "r" && i == 0 { 1 } else { 1000 + i };
                let algorithm = if scope == "g" {
                    algorithms[i % 2]
                } else {
                    algorithms[i % algorithms.len()]
                };
                format!(
                    "{indent}- {{ name: {scope}{i}, algorithm: {algorithm}, limit: {limit}, per: 1h }}\n"
                )
            })
            .collect::<String>()
    };
    format!(
        "default_plan: p\nplans:\n  p:\n    tenant:\n{}    routes:\n      \"POST /a\":\n{}    subject:\n      \"*\":\n{}global:\n  \"POST /a\":\n{}",
        list("t", "      "),
        list("r", "        "),
        list("s", "        "),
        list("g", "    "),
    )
}

#[tokio::test]
async fn a_request_under_the_most_rules_a_plan_allows_is_decided_by_redis() {
    let server = RedisServer::start();
    let limiter = Limiter::new(
        policy(&fullest_plan(), false),
        store(&server, keys(7)).await,
        OnError::Deny,
    );
    let policy = limiter.policy();
    let request = Request::new("acme", "POST /a", Some("alice"), 1).unwrap();
    let first = limiter.decide(&policy, &request).await;
    // Four lists, and a fair-share gate per valve.
    let bound = 5 * sluice_core::config::MAX_RULES_PER_LIST;
    assert_eq!(first.rules.len(), bound);
    let said = |d: &sluice_core::Decision<'_>| format!("{:?}, degraded {:?}", d.reason, d.degraded);
    assert!(
        first.allowed && first.degraded.is_none(),
        "{}",
        said(&first)
    );
    assert_eq!(first.known_outcomes().count(), bound);
    // The route's tight rule refuses the second; the others keep what
    // they had: all or nothing, over every rule.
    let second = limiter.decide(&policy, &request).await;
    assert!(
        !second.allowed && second.degraded.is_none(),
        "{}",
        said(&second)
    );
    assert_eq!(second.violated_policies().collect::<Vec<_>>(), ["r0"]);
    // (A valve's fair-share gate, open while the valve is not saturated,
    // refills within the millisecond: it holds no budget to compare.)
    for ((rule, before), (_, after)) in first.known_outcomes().zip(second.known_outcomes()) {
        if rule.name() != "r0" && rule.scope() != sluice_core::Scope::Share {
            assert_eq!(before.remaining, after.remaining, "{}", rule.name());
        }
    }
}

/// While rotating, a read-only check (peek) finds a bucket that has no
/// state under the new pepper yet where a decision finds it: under the
/// previous one (a group's records, and a set).
#[tokio::test]
async fn a_peek_while_rotating_finds_what_a_decision_finds() {
    let server = RedisServer::start();
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 3, per: 1h }, { algorithm: fixed_window, limit: 3, per: 1h }]\n    routes:\n      \"GET /\": [{ algorithm: sliding_log, limit: 3, per: 1h }]\n";
    let request = Request::new("acme", "GET /", None, 1).unwrap();
    let old = Limiter::new(
        policy(yaml, false),
        store(&server, keys(21)).await,
        OnError::Deny,
    );
    let p = old.policy();
    for _ in 0..3 {
        assert!(old.decide(&p, &request).await.allowed);
    }
    let new = rotated(&server, policy(yaml, false), 21, 22).await;
    let p = new.policy();
    let applicable = p.applicable("acme", "GET /", false);
    let batch = sluice_store::Batch::new("acme", None, 1, applicable.rules);
    let peeked = new.peek(&batch).await.unwrap();
    assert_eq!(peeked.rows.len(), 3);
    for row in &peeked.rows {
        let (outcome, _) = row.enforced.decide(&row.state, peeked.now, 1);
        assert!(!outcome.allowed, "spent before the rotation: {row:?}");
    }
    assert!(!new.decide(&p, &request).await.allowed);
}

/// While rotating, usage after the fact (a debit, a give-back) finds a
/// bucket that has no state under the new pepper yet under the previous
/// one, as a decision does: what was spent before the rotation is kept.
#[tokio::test]
async fn a_debit_while_rotating_keeps_what_was_spent_under_the_old_pepper() {
    let server = RedisServer::start();
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 3, per: 1h }, { algorithm: fixed_window, limit: 3, per: 1h }]\n";
    let old = Limiter::new(
        policy(yaml, false),
        store(&server, keys(31)).await,
        OnError::Deny,
    );
    let p = old.policy();
    let request = Request::new("acme", "GET /", None, 1).unwrap();
    for _ in 0..3 {
        assert!(old.decide(&p, &request).await.allowed);
    }
    let new = rotated(&server, policy(yaml, false), 31, 32).await;
    let p = new.policy();
    new.report(&p, &request).await.unwrap();
    let decision = new.decide(&p, &request).await;
    assert!(
        !decision.allowed,
        "a debit under the new pepper forgot the budget spent under the old one: {decision:?}"
    );
}
