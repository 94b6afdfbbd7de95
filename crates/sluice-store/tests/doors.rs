//! Every door into the limiter asks the same rules with the same answer:
//! `decide`, `acquire` (its lease given back at once), the synchronous
//! `decide_now`, and `decide_keyed` (Envoy descriptors without an
//! override), each on a limiter of its own with a hand-set clock, fed the
//! same requests. Rules that count by outcome (held as attempts),
//! duplicate guards, concurrency rules, fair valves' gates, a tenant's
//! shards and a cost above a rule's capacity are all on the path.

use std::sync::Arc;

use sluice_core::config::OnError;
use sluice_core::{Config, Decision, Policy, Request};
use sluice_store::{Keyed, Limiter, LimiterOptions, ManualClock, MemoryStore};

const LIMITS: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: calls, algorithm: gcra, limit: 40, per: 1s }]
    routes:
      "POST /login": [{ name: failed, algorithm: fixed_window, limit: 3, per: 1h, count_if: { status: [401] } }]
      "GET /export": [{ name: exports, algorithm: concurrency, limit: 2, lease: 30s }]
    dedupe:
      "POST /pay": { window: 1m }
tenants:
  wide: { plan: p, shards: 3 }
global:
  "GET /search": [{ name: search, algorithm: gcra, limit: 20, per: 1s }]
"#;

const DOORS: [&str; 4] = ["decide", "acquire", "decide_now", "decide_keyed"];

fn limiter() -> (Arc<ManualClock>, Limiter<MemoryStore>) {
    let config = Config::from_yaml(LIMITS, "doors.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    let store = MemoryStore::with_clock(10_000, clock.clone());
    let policy = Policy::compile(&config.limits);
    (clock, Limiter::with_options(policy, store, options))
}

/// What a decision says, to compare across doors.
fn seen(decision: &Decision<'_>) -> String {
    format!(
        "{} {:?} {:?} {:?} {:?}",
        decision.allowed,
        decision.reason,
        decision.policy().map(|r| r.name().to_owned()),
        decision.remaining(),
        decision.retry_after_ms(),
    )
}

/// `request` decided through `door`.
async fn through(door: &str, limiter: &Limiter<MemoryStore>, request: &Request<'_>) -> String {
    let policy = limiter.policy();
    match door {
        "decide" => seen(&limiter.decide(&policy, request).await),
        "acquire" => {
            let (decision, lease) = limiter.acquire(&policy, request).await;
            let answer = seen(&decision);
            if let Some(lease) = lease {
                limiter
                    .release(request.tenant, request.subject, &lease)
                    .await
                    .unwrap();
            }
            answer
        }
        "decide_now" => seen(&limiter.decide_now(&policy, request)),
        "decide_keyed" => {
            let applicable =
                policy.applicable(request.tenant, request.route, request.subject.is_some());
            let keyed = Keyed::request(request, applicable.rules);
            seen(&limiter.decide_keyed(applicable, &keyed).await)
        }
        other => panic!("no door {other}"),
    }
}

/// The answers `door` gives a fixed sequence of requests, 10 ms apart.
async fn answers(door: &str) -> Vec<String> {
    let (clock, limiter) = limiter();
    let mut answers = Vec::new();
    let mut ask = async |request: Request<'_>| {
        answers.push(through(door, &limiter, &request).await);
        clock.advance(10);
    };
    // Attempts held on a rule that counts by outcome: three, then none.
    for _ in 0..5 {
        ask(Request::new("acme", "POST /login", None, 1).unwrap()).await;
    }
    // A duplicate guard: the same fingerprint once, another again.
    for fingerprint in ["f1", "f1", "f2"] {
        let request = Request::new("acme", "POST /pay", None, 1).unwrap();
        ask(request.with_fingerprint(Some(fingerprint)).unwrap()).await;
    }
    // Concurrency rules check (an acquired lease is given back at once):
    // free, then both slots held by leases taken beside the door.
    let export = Request::new("acme", "GET /export", None, 1).unwrap();
    ask(export).await;
    let policy = limiter.policy();
    let held = [
        limiter.acquire(&policy, &export).await.1,
        limiter.acquire(&policy, &export).await.1,
    ];
    assert!(held.iter().all(Option::is_some));
    ask(export).await;
    // A fair valve's gate, and the valve itself, past its limit.
    for _ in 0..30 {
        ask(Request::new("acme", "GET /search", None, 1).unwrap()).await;
    }
    // A tenant of three shards, past its limit on every shard.
    for _ in 0..50 {
        ask(Request::new("wide", "GET /other", None, 1).unwrap()).await;
    }
    // A cost above a rule's capacity can never pass.
    ask(Request::new("acme", "GET /other", None, 41).unwrap()).await;
    answers
}

#[tokio::test]
async fn every_door_asks_the_same_rules_with_the_same_answer() {
    let first = answers(DOORS[0]).await;
    // The sequence reaches every limit it names.
    for denial in [
        "Some(\"failed\")",
        "Some(Duplicate)",
        "Some(\"exports\")",
        "Some(GlobalCapacity) Some(\"search\")",
        "Some(\"calls\")",
    ] {
        assert!(
            first
                .iter()
                .any(|a| a.starts_with("false") && a.contains(denial)),
            "no denial by {denial}: {first:#?}"
        );
    }
    for door in &DOORS[1..] {
        let other = answers(door).await;
        for (i, (a, b)) in first.iter().zip(&other).enumerate() {
            assert_eq!(a, b, "request {i}: {} answered {a}, {door} {b}", DOORS[0]);
        }
    }
}
