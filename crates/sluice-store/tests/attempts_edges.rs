//! Attempts at their edges (rules that count by outcome, `count_if`) on the
//! memory store, with a hand-set clock: each test states a promise of
//! docs/CONFIG.md "Reports and `count_if`" and tries to break it with
//! another feature beside it (shadow rules, leases, shards, fair valves,
//! the duplicate guard, reloads).

use std::sync::Arc;

use sluice_core::config::OnError;
use sluice_core::{Config, Policy, Request};
use sluice_store::{Limiter, LimiterOptions, ManualClock, MarkerAnswer, MemoryStore};

const START_MS: u64 = 1_764_460_800_000;

fn limiter(yaml: &str) -> (Arc<ManualClock>, Limiter<MemoryStore>) {
    let config = Config::from_yaml(yaml, "edges.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let store = MemoryStore::with_clock(10_000, clock.clone());
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    let limiter = Limiter::with_options(Policy::compile(&config.limits), store, options);
    (clock, limiter)
}

fn login() -> Request<'static> {
    Request::new("acme", "POST /login", Some("10.0.0.1|alice"), 1).unwrap()
}

/// A login decided, then (when admitted) concluded with `status`: whether
/// it was admitted, and whether a shadow rule would have denied it.
async fn log_in(
    limiter: &Limiter<MemoryStore>,
    request: &Request<'_>,
    status: u16,
) -> (bool, bool) {
    let policy = limiter.policy();
    let decision = limiter.decide(&policy, request).await;
    if !decision.allowed {
        return (false, decision.shadow_denied);
    }
    let attempt = limiter
        .attempt(&policy, request, &decision)
        .expect("an attempt");
    let concluded = limiter
        .conclude_attempt(&policy, &attempt, Some(status), 60_000)
        .await
        .unwrap();
    assert_eq!(concluded.marker, MarkerAnswer::Applied);
    (true, decision.shadow_denied)
}

/// A shadow rule never blocks and "consumes only when it admits"
/// (memory/tests.rs). When a shadow `count_if` rule denies, its check took
/// nothing there, yet the attempt says it holds the cost on every rule
/// that counts by outcome: concluded as a success, it gives the shadow
/// rule back a unit it never took. After two failures counted (limit 2),
/// every success then frees a place the failures still hold: the
/// dark-launched limit stops reporting the denials it would make.
#[tokio::test]
async fn a_shadow_rule_is_not_given_back_what_its_denial_never_took() {
    let mut broken = Vec::new();
    for algorithm in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        let yaml = format!(
            r#"
default_plan: p
plans:
  p:
    routes:
      "POST /login": [{{ name: logins, algorithm: gcra, limit: 100, per: 1s }}]
    subject:
      "POST /login":
        - {{ name: failed-logins, algorithm: {algorithm}, limit: 2, per: 15m, shadow: true, count_if: {{ status: [401] }} }}
"#
        );
        let (clock, limiter) = limiter(&yaml);
        // Two failures: the shadow rule's two places are counted.
        for _ in 0..2 {
            assert_eq!(log_in(&limiter, &login(), 401).await, (true, false));
            clock.advance(20);
        }
        // Successes: the shadow rule would deny each (two failures are
        // counted in its window) and took nothing for it.
        let mut shadow_denials = 0;
        for _ in 0..5 {
            let (admitted, shadow_denied) = log_in(&limiter, &login(), 200).await;
            assert!(admitted, "{algorithm}: a shadow rule never blocks");
            shadow_denials += usize::from(shadow_denied);
            clock.advance(20);
        }
        // Then a third failure: the shadow rule must still say it would
        // deny it (two failures within 15 minutes).
        let (_, third_failure_shadow_denied) = log_in(&limiter, &login(), 401).await;
        if shadow_denials != 5 || !third_failure_shadow_denied {
            broken.push(format!(
                "{algorithm}: {shadow_denials} of 5 successes and {} the third failure seen by the shadow rule as over its limit of 2",
                if third_failure_shadow_denied { "" } else { "not" }
            ));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// `count_if` on `algorithm: concurrency` held nothing: a check only
/// asks a concurrency rule (it takes no slot), so fifty checks at once on
/// a rule of 2 all passed with an attempt each. The configuration is
/// refused, naming the field.
#[test]
fn count_if_on_a_concurrency_rule_is_refused() {
    let yaml = r#"
default_plan: p
plans:
  p:
    subject:
      "POST /login":
        - { name: slots, algorithm: concurrency, limit: 2, lease: 30s, count_if: { status: [401] } }
"#;
    let error = Config::from_yaml(yaml, "edges.yaml")
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("`count_if` is not for `algorithm: concurrency`"),
        "{error}"
    );
}

/// A sharded tenant keeps `count_if` rules whole on its first shard.
/// Successes are given back at once (no lock-out), fifty at once let the
/// limit through, and two failures shut it.
#[tokio::test]
async fn a_sharded_tenant_holds_attempts_and_gives_successes_back() {
    for algorithm in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        let yaml = format!(
            r#"
default_plan: p
plans:
  p:
    routes:
      "POST /login": [{{ name: logins, algorithm: gcra, limit: 400, per: 1s }}]
    subject:
      "POST /login":
        - {{ name: failed-logins, algorithm: {algorithm}, limit: 3, per: 15m, count_if: {{ status: [401] }} }}
tenants:
  acme: {{ plan: p, shards: 4 }}
"#
        );
        let (clock, limiter) = limiter(&yaml);
        let policy = limiter.policy();
        for i in 0..20 {
            assert!(
                log_in(&limiter, &login(), 200).await.0,
                "{algorithm}: success {i} locked out"
            );
            clock.advance(5);
        }
        let mut attempts = Vec::new();
        for _ in 0..50 {
            let decision = limiter.decide(&policy, &login()).await;
            attempts.extend(limiter.attempt(&policy, &login(), &decision));
        }
        assert_eq!(attempts.len(), 3, "{algorithm}: at once");
        for attempt in &attempts {
            let concluded = limiter
                .conclude_attempt(&policy, attempt, Some(401), 60_000)
                .await
                .unwrap();
            assert_eq!(concluded.marker, MarkerAnswer::Applied);
        }
        clock.advance(5);
        assert!(
            !limiter.decide(&policy, &login()).await.allowed,
            "{algorithm}: after three failures"
        );
    }
}

/// Beside a fair valve (a `global` rule: the gated path), the same.
#[tokio::test]
async fn beside_a_fair_valve_attempts_hold_and_successes_come_back() {
    for algorithm in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        let yaml = format!(
            r#"
default_plan: p
plans:
  p:
    subject:
      "POST /login":
        - {{ name: failed-logins, algorithm: {algorithm}, limit: 3, per: 15m, count_if: {{ status: [401] }} }}
global:
  "POST /login": [{{ name: valve, algorithm: gcra, limit: 1000, per: 1s }}]
"#
        );
        let (clock, limiter) = limiter(&yaml);
        let policy = limiter.policy();
        for i in 0..20 {
            assert!(
                log_in(&limiter, &login(), 200).await.0,
                "{algorithm}: success {i} locked out"
            );
            clock.advance(5);
        }
        let mut attempts = Vec::new();
        for _ in 0..50 {
            let decision = limiter.decide(&policy, &login()).await;
            attempts.extend(limiter.attempt(&policy, &login(), &decision));
        }
        assert_eq!(attempts.len(), 3, "{algorithm}: at once");
        for attempt in &attempts {
            limiter
                .conclude_attempt(&policy, attempt, Some(401), 60_000)
                .await
                .unwrap();
        }
        assert!(!limiter.decide(&policy, &login()).await.allowed);
    }
}

/// Beside the duplicate guard: distinct fingerprints, fifty at once, the
/// limit passes; successes come back.
#[tokio::test]
async fn beside_the_duplicate_guard_attempts_hold_and_successes_come_back() {
    let yaml = r#"
default_plan: p
plans:
  p:
    subject:
      "POST /login":
        - { name: failed-logins, algorithm: gcra, limit: 3, per: 15m, count_if: { status: [401] } }
    dedupe:
      "POST /login": { window: 1h }
"#;
    let (_, limiter) = limiter(yaml);
    let policy = limiter.policy();
    let prints: Vec<String> = (0..100).map(|i| format!("print-{i}")).collect();
    for (i, print) in prints[..20].iter().enumerate() {
        let request = login().with_fingerprint(Some(print)).unwrap();
        assert!(log_in(&limiter, &request, 200).await.0, "success {i}");
    }
    let mut attempts = Vec::new();
    for print in &prints[20..70] {
        let request = login().with_fingerprint(Some(print)).unwrap();
        let decision = limiter.decide(&policy, &request).await;
        attempts.extend(limiter.attempt(&policy, &request, &decision));
    }
    assert_eq!(attempts.len(), 3);
}

/// A reload lowers or raises the `count_if` rule's limit (its state is kept:
/// "changing `limit`, `per` or `burst` keeps the budget already used")
/// while five attempts are held. All five succeed: given back, nothing
/// counts, and the new limit's failures must pass (no lock-out), and no
/// more than it.
#[tokio::test]
async fn attempts_held_across_a_reload_changing_the_limit_give_successes_back() {
    let mut broken = Vec::new();
    for algorithm in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        for (from, to) in [(5, 2), (2, 5)] {
            let yaml = |limit: u32| {
                format!(
                    r#"
default_plan: p
plans:
  p:
    subject:
      "POST /login":
        - {{ name: failed-logins, algorithm: {algorithm}, limit: {limit}, per: 15m, count_if: {{ status: [401] }} }}
"#
                )
            };
            let (clock, limiter) = limiter(&yaml(from));
            let before = limiter.policy();
            let mut attempts = Vec::new();
            for _ in 0..from {
                let decision = limiter.decide(&before, &login()).await;
                attempts.extend(limiter.attempt(&before, &login(), &decision));
            }
            assert_eq!(attempts.len(), from as usize);
            clock.advance(10);
            let config = Config::from_yaml(&yaml(to), "edges.yaml").unwrap();
            limiter.set_policy(Policy::compile(&config.limits));
            let policy = limiter.policy();
            for attempt in &attempts {
                limiter
                    .conclude_attempt(&policy, attempt, Some(200), 60_000)
                    .await
                    .unwrap();
            }
            clock.advance(10);
            let mut failures = 0;
            while failures <= to + 1 && log_in(&limiter, &login(), 401).await.0 {
                failures += 1;
                clock.advance(1);
            }
            // gcra and token_bucket read what was used at the new rate
            // (CONFIG.md, "Reload"): raised, a unit held before gives back
            // a unit of the new rate, and the whole new limit comes back
            // within the new burst's refill (here 15 minutes), never later.
            let rated = ["gcra", "token_bucket"].contains(&algorithm) && to > from;
            if rated && failures > 0 && failures < to {
                clock.advance(15 * 60_000);
                let mut later = 0;
                while later <= to + 1 && log_in(&limiter, &login(), 401).await.0 {
                    later += 1;
                    clock.advance(1);
                }
                if later != to {
                    broken.push(format!(
                        "{algorithm} {from}→{to}: {later} failures passed a refill after every held attempt succeeded"
                    ));
                }
            } else if failures != to {
                broken.push(format!(
                    "{algorithm} {from}→{to}: {failures} failures passed after every held attempt succeeded"
                ));
            }
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// An attempt concluded as a success long after its unit refilled gives
/// nothing back: five failures counted since fill the rule, and the
/// success of the old attempt must not free a sixth.
#[tokio::test]
async fn a_success_concluded_after_its_refill_frees_nothing() {
    let mut broken = Vec::new();
    for algorithm in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        let yaml = format!(
            r#"
default_plan: p
plans:
  p:
    subject:
      "POST /login":
        - {{ name: failed-logins, algorithm: {algorithm}, limit: 5, per: 15m, count_if: {{ status: [401] }} }}
"#
        );
        let (clock, limiter) = limiter(&yaml);
        let policy = limiter.policy();
        let decision = limiter.decide(&policy, &login()).await;
        let old = limiter.attempt(&policy, &login(), &decision).unwrap();
        // Half an hour later (two windows: the old one's count is gone).
        clock.advance(30 * 60_000);
        for _ in 0..5 {
            assert!(log_in(&limiter, &login(), 401).await.0, "{algorithm}");
        }
        limiter
            .conclude_attempt(&policy, &old, Some(200), 60_000)
            .await
            .unwrap();
        if log_in(&limiter, &login(), 401).await.0 {
            broken.push(format!("{algorithm}: a sixth failure passed"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}
