//! Usage known after the fact on the memory store, with a hand-set clock:
//! reports past the limit leave a debt that denies until repaid, settles
//! give back or take the difference once, and rules that count by outcome
//! are only asked before the request and counted by its status after.
//! (adjust.lua is held to the same arithmetic by `redis_adjust.rs`; the
//! HTTP doors run on Redis and Redis Cluster in sluice-server's tests.)

use std::sync::Arc;

use sluice_core::config::OnError;
use sluice_core::{Config, Policy, Reason, Request, Scope};
use sluice_store::{AfterError, Limiter, LimiterOptions, ManualClock, MarkerAnswer, MemoryStore};

const START_MS: u64 = 1_764_460_800_000;

fn limiter(yaml: &str) -> (Arc<ManualClock>, Limiter<MemoryStore>) {
    let config = Config::from_yaml(yaml, "after.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let store = MemoryStore::with_clock(10_000, clock.clone());
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    let limiter = Limiter::with_options(Policy::compile(&config.limits), store, options);
    (clock, limiter)
}

const TOKENS: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: tokens, algorithm: gcra, limit: 1000, per: 1m }]
"#;

fn request(cost: u64) -> Request<'static> {
    Request::new("acme", "POST /v1/chat", None, cost).unwrap()
}

#[tokio::test]
async fn a_report_past_the_limit_counts_and_the_debt_denies_until_repaid() {
    let (clock, limiter) = limiter(TOKENS);
    let policy = limiter.policy();
    // 1,500 tokens spent: 500 past the 1,000 a minute allows.
    let report = limiter.report(&policy, &request(1_500)).await.unwrap();
    assert_eq!(report.forgiven, 0);
    assert!(!report.decision.allowed, "in debt, a unit does not pass");
    assert_eq!(report.decision.remaining(), Some(0));
    // Owing 500 (30 s at 1,000 a minute), one more token waits 30.06 s.
    let denied = limiter.decide(&policy, &request(1)).await;
    assert!(!denied.allowed);
    assert_eq!(denied.reason, Some(Reason::TenantLimit));
    assert_eq!(denied.retry_after_ms(), Some(30_060));
    clock.advance(30_059);
    assert!(!limiter.decide(&policy, &request(1)).await.allowed);
    clock.advance(1);
    assert!(limiter.decide(&policy, &request(1)).await.allowed);
}

#[tokio::test]
async fn a_debt_beyond_max_debt_is_forgiven() {
    let (_, limiter) = limiter(
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 10, per: 1m, max_debt: 5 }]\n",
    );
    let policy = limiter.policy();
    let report = limiter.report(&policy, &request(40)).await.unwrap();
    assert_eq!(report.forgiven, 25, "10 + 5 counted, 25 forgiven");
}

#[tokio::test]
async fn a_settle_gives_back_or_takes_the_difference_once() {
    let (_, limiter) = limiter(TOKENS);
    let policy = limiter.policy();
    // Reserve 600, use 100: 500 come back.
    let estimate = request(600);
    let decision = limiter.decide(&policy, &estimate).await;
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    let settled = limiter
        .settle(&policy, &reservation, 100, 60_000)
        .await
        .unwrap();
    assert_eq!(settled.marker, MarkerAnswer::Applied);
    assert_eq!(settled.decision.remaining(), Some(899));
    // The same settle again: answered, nothing changed.
    let again = limiter
        .settle(&policy, &reservation, 100, 60_000)
        .await
        .unwrap();
    assert_eq!(again.marker, MarkerAnswer::Again);
    assert_eq!(again.decision.remaining(), Some(899));
    // Another cost for the same reservation: refused, nothing changed.
    let other = limiter
        .settle(&policy, &reservation, 900, 60_000)
        .await
        .unwrap();
    assert_eq!(other.marker, MarkerAnswer::Conflict);
    assert_eq!(other.decision.remaining(), Some(899));
    // Reserve 800 of the 900 left, use 1,200: 400 more, 300 past the limit.
    let estimate = request(800);
    let decision = limiter.decide(&policy, &estimate).await;
    assert!(decision.allowed);
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    let settled = limiter
        .settle(&policy, &reservation, 1_200, 60_000)
        .await
        .unwrap();
    assert!(!settled.decision.allowed, "owing 300");
    let denied = limiter.decide(&policy, &request(1)).await;
    assert_eq!(denied.retry_after_ms(), Some(18_060));
}

const LOGINS: &str = r#"
default_plan: p
plans:
  p:
    routes:
      "POST /login": [{ name: logins, algorithm: gcra, limit: 100, per: 1s }]
    subject:
      "POST /login":
        - { name: failed-logins, algorithm: sliding_log, limit: 5, per: 15m, count_if: { status: [401, 403] } }
"#;

fn login() -> Request<'static> {
    Request::new("acme", "POST /login", Some("10.0.0.1|alice"), 1).unwrap()
}

/// A login decided, then concluded with the response's `status`.
async fn log_in(limiter: &Limiter<MemoryStore>, status: u16) -> bool {
    let policy = limiter.policy();
    let decision = limiter.decide(&policy, &login()).await;
    if !decision.allowed {
        return false;
    }
    let attempt = limiter.attempt(&policy, &login(), &decision).unwrap();
    let concluded = limiter
        .conclude_attempt(&policy, &attempt, Some(status), 60_000)
        .await
        .unwrap();
    assert_eq!(concluded.marker, MarkerAnswer::Applied);
    true
}

#[tokio::test]
async fn failed_logins_count_by_outcome_and_successes_pass() {
    let (_, limiter) = limiter(LOGINS);
    let policy = limiter.policy();
    // Successful logins: held while they run, then given back.
    for _ in 0..20 {
        assert!(log_in(&limiter, 200).await);
    }
    // Five failures are counted; the sixth attempt is refused before it
    // is made, naming the rule that counts failures.
    for _ in 0..5 {
        assert!(log_in(&limiter, 401).await);
    }
    let refused = limiter.decide(&policy, &login()).await;
    assert!(!refused.allowed);
    assert_eq!(refused.policy().map(|r| r.name()), Some("failed-logins"));
    assert_eq!(refused.reason, Some(Reason::SubjectLimit));
    // Another (IP, user) is not affected.
    let other = Request::new("acme", "POST /login", Some("10.0.0.2|alice"), 1).unwrap();
    assert!(limiter.decide(&policy, &other).await.allowed);
}

/// The case of the report: 50 failed logins at once against "5 failed
/// logins per 15 minutes" all passed (each check only asked, and the
/// reports came after every check). Attempts hold their place: five are
/// in flight, the 45 others refused before they run; the five failing
/// count, and nothing more passes.
#[tokio::test]
async fn fifty_failed_logins_at_once_let_five_through() {
    for algorithm in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        let (clock, limiter) = limiter(&LOGINS.replace("sliding_log", algorithm));
        let policy = limiter.policy();
        let mut attempts = Vec::new();
        for _ in 0..50 {
            let decision = limiter.decide(&policy, &login()).await;
            attempts.extend(limiter.attempt(&policy, &login(), &decision));
        }
        assert_eq!(attempts.len(), 5, "{algorithm}: attempts admitted at once");
        clock.advance(40);
        for attempt in &attempts {
            let concluded = limiter
                .conclude_attempt(&policy, attempt, Some(401), 60_000)
                .await
                .unwrap();
            assert_eq!(concluded.marker, MarkerAnswer::Applied);
        }
        clock.advance(40);
        assert!(
            !limiter.decide(&policy, &login()).await.allowed,
            "{algorithm}: a sixth after five failures"
        );
    }
}

/// Attempts that succeed, or whose outcome is never known, are given
/// back at once: the next ones pass, on every algorithm (a give-back of a
/// unit moments after it was taken returns what it still holds). On
/// `gcra` and `token_bucket`, of attempts given back after another was,
/// each keeps what its own refill would have given it had it been alone
/// (`Rule::returnable`): five held 7 ms keep 4 × 7 ms of refill, the next
/// five wait 28 ms (here, a unit takes three minutes).
#[tokio::test]
async fn attempts_that_do_not_fail_free_their_place_at_once() {
    for algorithm in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        let (clock, limiter) = limiter(&LOGINS.replace("sliding_log", algorithm));
        let policy = limiter.policy();
        for round in 0..10 {
            let mut attempts = Vec::new();
            for _ in 0..5 {
                let decision = limiter.decide(&policy, &login()).await;
                assert!(decision.allowed, "{algorithm}: round {round}");
                attempts.extend(limiter.attempt(&policy, &login(), &decision));
            }
            assert!(!limiter.decide(&policy, &login()).await.allowed);
            clock.advance(7);
            for (i, attempt) in attempts.iter().enumerate() {
                let status = (i % 2 == 0).then_some(200);
                limiter
                    .conclude_attempt(&policy, attempt, status, 60_000)
                    .await
                    .unwrap();
            }
            clock.advance(28);
        }
    }
}

#[tokio::test]
async fn an_attempt_concludes_once() {
    let (_, limiter) = limiter(LOGINS);
    let policy = limiter.policy();
    let decision = limiter.decide(&policy, &login()).await;
    let attempt = limiter.attempt(&policy, &login(), &decision).unwrap();
    let first = limiter.conclude_attempt(&policy, &attempt, Some(200), 60_000);
    assert_eq!(first.await.unwrap().marker, MarkerAnswer::Applied);
    let again = limiter.conclude_attempt(&policy, &attempt, Some(200), 60_000);
    assert_eq!(again.await.unwrap().marker, MarkerAnswer::Again);
    // Given back once: four more fit, not five.
    for _ in 0..4 {
        assert!(log_in(&limiter, 401).await);
    }
    let other = limiter.conclude_attempt(&policy, &attempt, Some(401), 60_000);
    assert_eq!(other.await.unwrap().marker, MarkerAnswer::Conflict);
    let expired = limiter.conclude_attempt(&policy, &attempt, None, 60_000);
    assert_eq!(expired.await.unwrap().marker, MarkerAnswer::Conflict);
    assert!(log_in(&limiter, 401).await, "the fifth failure");
    assert!(!limiter.decide(&policy, &login()).await.allowed);
}

/// An attempt made before a reload that added a rule counting by outcome
/// never gives back on it (it held nothing there): concluded as a
/// success, it gives nothing back at all (what each rule held is no
/// longer known), and the new rule's one place, held by a later attempt,
/// stays held.
#[tokio::test]
async fn an_attempt_across_a_reload_that_adds_a_rule_gives_nothing_back() {
    let (_, limiter) = limiter(LOGINS);
    let before = limiter.policy();
    let decision = limiter.decide(&before, &login()).await;
    let early = limiter.attempt(&before, &login(), &decision).unwrap();
    let added = LOGINS.replace(
        "count_if: { status: [401, 403] } }",
        "count_if: { status: [401, 403] } }\n        - { name: one-at-a-time, algorithm: fixed_window, limit: 1, per: 1h, count_if: { status: [500] } }",
    );
    let config = Config::from_yaml(&added, "after.yaml").unwrap();
    limiter.set_policy(Policy::compile(&config.limits));
    let policy = limiter.policy();
    let decision = limiter.decide(&policy, &login()).await;
    assert!(decision.allowed);
    let late = limiter.attempt(&policy, &login(), &decision).unwrap();
    let concluded = limiter.conclude_attempt(&policy, &early, Some(200), 60_000);
    assert_eq!(concluded.await.unwrap().marker, MarkerAnswer::Applied);
    let refused = limiter.decide(&policy, &login()).await;
    assert!(
        !refused.allowed,
        "the late attempt still holds the one place"
    );
    assert_eq!(refused.policy().map(|r| r.name()), Some("one-at-a-time"));
    let concluded = limiter.conclude_attempt(&policy, &late, Some(200), 60_000);
    concluded.await.unwrap();
    assert!(limiter.decide(&policy, &login()).await.allowed);
}

#[tokio::test]
async fn the_synchronous_door_holds_attempts() {
    let (_, limiter) = limiter(LOGINS);
    let policy = limiter.policy();
    let mut attempts = Vec::new();
    for _ in 0..50 {
        let decision = limiter.decide_now(&policy, &login());
        attempts.extend(limiter.attempt(&policy, &login(), &decision));
    }
    assert_eq!(attempts.len(), 5, "five in flight at most");
    for attempt in &attempts {
        let concluded = limiter.conclude_attempt(&policy, attempt, Some(401), 60_000);
        concluded.await.unwrap();
    }
    let refused = limiter.decide_now(&policy, &login());
    assert!(!refused.allowed, "a sixth failed login after five");
    assert_eq!(refused.policy().map(|r| r.name()), Some("failed-logins"));
    let other = Request::new("acme", "POST /login", Some("10.0.0.2|alice"), 1).unwrap();
    assert!(limiter.decide_now(&policy, &other).allowed);
}

#[tokio::test]
async fn a_report_on_a_route_that_counts_by_outcome_needs_the_attempt() {
    let (_, limiter) = limiter(LOGINS);
    let policy = limiter.policy();
    let err = limiter.report(&policy, &login()).await.unwrap_err();
    assert_eq!(err, AfterError::AttemptNeeded);
    assert!(err.to_string().contains("`attempt`"));
}

/// A settle of 5,000 for an estimate of 60 on `POST /v1/chat`, behind a
/// valve of 100 a minute (`valve`: its algorithm and share): the tenant
/// owes (up to its max_debt); the valve keeps the estimate, and the
/// tenant's gate of a fair valve is untouched by the settle.
async fn debt_beside_a_valve(valve: &str, fair: bool) {
    let (_, limiter) = limiter(&format!(
        r#"
default_plan: p
plans:
  p:
    tenant: [{{ name: tokens, algorithm: gcra, limit: 1000, per: 1m }}]
global:
  "POST /v1/chat": [{{ name: valve, limit: 100, per: 1m, {valve} }}]
"#
    ));
    let policy = limiter.policy();
    let applicable = policy.applicable("acme", "POST /v1/chat", false);
    let batch = sluice_store::Batch::new("acme", None, 1, applicable.rules);
    let held = || async { limiter.peek(&batch).await.unwrap() };
    let estimate = request(60);
    let decision = limiter.decide(&policy, &estimate).await;
    assert!(decision.allowed);
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    let before = held().await;
    let settled = limiter
        .settle(&policy, &reservation, 5_000, 60_000)
        .await
        .unwrap();
    let after = held().await;
    for ((rule, before), after) in applicable.rules.iter().zip(&before.rows).zip(&after.rows) {
        match rule.name() {
            "tokens" => assert_ne!(before.state, after.state, "the tenant owes"),
            _ => assert_eq!(
                before.state,
                after.state,
                "{} ({:?}) is untouched by the settle",
                rule.name(),
                rule.scope()
            ),
        }
    }
    assert_eq!(
        applicable.rules.iter().any(|r| r.scope() == Scope::Share),
        fair,
        "a fair valve has a gate, a first-come one none"
    );
    assert_eq!(
        settled.decision.rules.len(),
        1,
        "only the tenant's own rule"
    );
    assert_eq!(settled.decision.rules[0].name(), "tokens");
    let valve = applicable
        .rules
        .iter()
        .position(|r| r.name() == "valve" && r.scope() == Scope::Global)
        .unwrap();
    let row = &after.rows[valve];
    let (outcome, _) = row.enforced.decide(&row.state, after.now, 1);
    let left = u64::from(outcome.remaining) + u64::from(outcome.allowed);
    assert_eq!(left, 40, "the valve kept the estimate, no more");
}

#[tokio::test]
async fn a_first_come_valve_never_goes_into_debt_and_keeps_what_the_estimate_took() {
    debt_beside_a_valve("algorithm: fixed_window, share: first_come", false).await;
}

#[tokio::test]
async fn a_fair_valve_and_its_gate_never_go_into_debt() {
    debt_beside_a_valve("algorithm: gcra", true).await;
}

#[tokio::test]
async fn a_settle_an_earlier_version_applied_is_not_applied_again() {
    let (_, limiter) = limiter(TOKENS);
    let policy = limiter.policy();
    let estimate = request(600);
    let decision = limiter.decide(&policy, &estimate).await;
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    // The version before settled it at 100: its marker holds "100".
    let own = policy.own_rules("acme", "POST /v1/chat", false);
    let batch = sluice_store::Batch::new("acme", None, 500, own);
    let marker = sluice_store::Marker {
        id: reservation.id,
        value: "100".to_owned(),
        ttl_ms: 60_000,
        shard: 0,
    };
    let earlier = sluice_store::Store::adjust(
        limiter.store(),
        &batch,
        sluice_store::Change::GiveBack {
            at: reservation.admitted_ms,
            first_shard_at: reservation.first_shard_admitted_ms,
        },
        Some(&marker),
    )
    .await
    .unwrap();
    assert_eq!(earlier.marker, MarkerAnswer::Applied);
    // Its retry, here: refused, nothing given back twice.
    let retried = limiter
        .settle(&policy, &reservation, 100, 60_000)
        .await
        .unwrap();
    assert_eq!(retried.marker, MarkerAnswer::Conflict);
    assert_eq!(retried.decision.remaining(), Some(899), "100 held");
}
