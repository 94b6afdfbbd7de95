//! Sharded tenants get their whole limit, however tenants interleave and
//! costs fall on the shards, and a reload that changes `shards` grants at
//! most the documented extra.

use std::sync::Arc;

use sluice_core::config::OnError;

use sluice_core::{Config, Policy, Request};
use sluice_store::{Limiter, LimiterOptions, ManualClock, MemoryStore, Store};

mod remote;
use remote::Remote;

fn policy(shards: u16) -> Policy {
    let yaml = format!(
        "default_plan: p\nplans:\n  p:\n    tenant: [{{ algorithm: fixed_window, limit: 100, per: 1h }}]\n    routes:\n      \"*\": [{{ algorithm: gcra, limit: 1000, per: 1h }}]\ntenants:\n  a: {{ plan: p, shards: {shards} }}\n  b: {{ plan: p, shards: {shards} }}\n"
    );
    // As on Redis: tenants are spread over their shards.
    Policy::compile_for(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits, true)
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::new(1_764_460_800_000))
}

/// Units admitted to `a` and `b`, alternating, with costs 2, 1, 2, 1, …
/// and then cost 1 until both are refused.
async fn drain<S: Store>(limiter: &Limiter<S>) -> (u64, u64) {
    let policy = limiter.policy();
    let mut admitted = [0u64; 2];
    let mut refused = [0u32; 2];
    for i in 0..2_000u64 {
        let t = (i % 2) as usize;
        if refused[t] > 8 {
            if refused[1 - t] > 8 {
                break;
            }
            continue;
        }
        let cost = if i < 120 { 1 + (i / 2) % 2 } else { 1 };
        let request = Request::new(["a", "b"][t], "GET /", None, cost).unwrap();
        let decision = limiter.decide(&policy, &request).await;
        if decision.allowed {
            admitted[t] += cost;
        } else {
            refused[t] += 1;
            assert!(
                decision.retry_after_ms().is_some_and(|r| r > 0),
                "a refusal says when to retry"
            );
        }
    }
    (admitted[0], admitted[1])
}

#[tokio::test]
async fn alternating_sharded_tenants_each_get_their_whole_limit() {
    let limiter = Limiter::new(
        policy(4),
        MemoryStore::with_clock(1_000, clock()),
        OnError::Deny,
    );
    assert_eq!(drain(&limiter).await, (100, 100));
}

#[tokio::test]
async fn through_the_over_limit_cache_too() {
    let clock = clock();
    let mut options = LimiterOptions::new(OnError::Deny);
    options.denial_cache = true;
    options.clock = clock.clone();
    let limiter = Limiter::with_options(
        policy(4),
        Remote::new(MemoryStore::with_clock(1_000, clock)),
        options,
    );
    assert_eq!(drain(&limiter).await, (100, 100));
}

#[test]
fn decide_now_spreads_over_shards_too() {
    let limiter = Limiter::new(
        policy(4),
        MemoryStore::with_clock(1_000, clock()),
        OnError::Deny,
    );
    let policy = limiter.policy();
    let request = Request::new("a", "GET /", None, 1).unwrap();
    let admitted = (0..200)
        .filter(|_| limiter.decide_now(&policy, &request).allowed)
        .count();
    assert_eq!(admitted, 100);
}

/// Changing `shards` from N to M inside a window grants at most
/// `|M − N| / max(M, N)` of the limit on top of it (docs/OPERATIONS.md).
#[tokio::test]
async fn a_reload_changing_shards_grants_at_most_the_stated_extra() {
    for (from, to) in [(2u16, 4u16), (4, 2), (1, 4), (4, 1), (3, 5)] {
        let limiter = Limiter::new(
            policy(from),
            MemoryStore::with_clock(1_000, clock()),
            OnError::Deny,
        );
        let (before, _) = drain(&limiter).await;
        limiter.set_policy(policy(to));
        let (after, _) = drain(&limiter).await;
        let bound = 100 * u64::from(from.abs_diff(to)) / u64::from(from.max(to));
        assert!(
            after <= bound,
            "{from} → {to} shards: {after} more after {before}, bound {bound}"
        );
    }
}

/// A limiter on the remote path for tenant `a` with two shards of a
/// 10-a-minute fixed window (5 each).
fn two_shards() -> Limiter<Remote> {
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 10, per: 1m }]\ntenants:\n  a: { plan: p, shards: 2 }\n";
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "t.yaml").unwrap().limits, true);
    let clock = clock();
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    Limiter::with_options(
        policy,
        Remote::new(MemoryStore::with_clock(1_000, clock)),
        options,
    )
}

fn of_a(cost: u64) -> Request<'static> {
    Request::new("a", "POST /chat", None, cost).unwrap()
}

/// Units of 1 admitted to `a` until refused.
async fn admitted_units(limiter: &Limiter<Remote>) -> u64 {
    let policy = limiter.policy();
    let mut admitted = 0;
    while limiter.decide(&policy, &of_a(1)).await.allowed {
        admitted += 1;
    }
    admitted
}

#[tokio::test]
async fn a_settle_goes_back_to_the_shard_that_admitted() {
    let limiter = two_shards();
    let policy = limiter.policy();
    // The first unit takes shard 0, the reservation of 5 shard 1.
    assert!(limiter.decide(&policy, &of_a(1)).await.allowed);
    let estimate = of_a(5);
    let decision = limiter.decide(&policy, &estimate).await;
    assert!(decision.allowed);
    assert_eq!(decision.shard, 1);
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    assert_eq!(reservation.shard, 1);
    // Nothing used: the 5 go back to shard 1, where they were taken, and
    // the tenant has the rest of its 10 a minute.
    let settled = limiter
        .settle(&policy, &reservation, 0, 60_000)
        .await
        .unwrap();
    assert_eq!(settled.marker, sluice_store::MarkerAnswer::Applied);
    assert_eq!(admitted_units(&limiter).await, 9);
}

#[tokio::test]
async fn a_settles_excess_is_charged_over_the_shards() {
    // The case: 4 shards, 1000 an hour; a settle of 100,000 for
    // an estimate of 1 left 750 units admitted that hour (the excess was
    // owed on one shard).
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 1000, per: 1h }]\ntenants:\n  a: { plan: p, shards: 4 }\n";
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "t.yaml").unwrap().limits, true);
    let store = Remote::new(MemoryStore::with_clock(1_000, clock()));
    let limiter = Limiter::new(policy, store, OnError::Deny);
    let policy = limiter.policy();
    let estimate = of_a(1);
    let decision = limiter.decide(&policy, &estimate).await;
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    let settled = limiter
        .settle(&policy, &reservation, 100_000, 60_000)
        .await
        .unwrap();
    assert_eq!(settled.marker, sluice_store::MarkerAnswer::Applied);
    assert_eq!(admitted_units(&limiter).await, 0, "every shard owes");
    // An identical retry changes nothing on any shard.
    let again = limiter
        .settle(&policy, &reservation, 100_000, 60_000)
        .await
        .unwrap();
    assert_eq!(again.marker, sluice_store::MarkerAnswer::Again);
    assert_eq!(again.forgiven, 0, "nothing charged again");
}

#[tokio::test]
async fn a_report_is_split_over_the_shards() {
    let limiter = two_shards();
    let policy = limiter.policy();
    // 10 spent: 5 on each shard, the minute's whole budget, and nothing
    // forgiven (on one shard, 5 past its 5 would owe its whole max_debt).
    let report = limiter.report(&policy, &of_a(10)).await.unwrap();
    assert_eq!(report.forgiven, 0);
    assert_eq!(admitted_units(&limiter).await, 0);
    // 12 more: 6 owed on each shard, past each one's max_debt of 5.
    let report = limiter.report(&policy, &of_a(12)).await.unwrap();
    assert_eq!(report.forgiven, 2);
}

#[tokio::test]
async fn a_report_cut_short_between_shards_says_what_was_recorded() {
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 10, per: 1m }]\ntenants:\n  a: { plan: p, shards: 2 }\n";
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "t.yaml").unwrap().limits, true);
    let store = Remote::new(MemoryStore::with_clock(1_000, clock())).failing_adjustments_after(1);
    let limiter = Limiter::new(policy, store, OnError::Deny);
    let policy = limiter.policy();
    let error = limiter
        .report(&policy, &of_a(7))
        .await
        .expect_err("the second shard fails");
    assert!(
        matches!(error, sluice_store::AfterError::Partly { recorded: 4, .. }),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_settle_after_a_reload_lowered_the_shards_charges_a_shard_still_read() {
    let limiter = two_shards();
    let policy = limiter.policy();
    assert!(limiter.decide(&policy, &of_a(1)).await.allowed);
    let estimate = of_a(2);
    let decision = limiter.decide(&policy, &estimate).await;
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    assert_eq!(reservation.shard, 1);
    // One shard from now on: 10 a minute, 1 used on shard 0.
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 10, per: 1m }]\ntenants:\n  a: { plan: p, shards: 1 }\n";
    limiter.set_policy(Policy::compile_for(
        &Config::from_yaml(yaml, "t.yaml").unwrap().limits,
        true,
    ));
    let policy = limiter.policy();
    // It cost 7, 5 more than held: the 5 are owed on shard 0, where the
    // tenant's decisions go now.
    let settled = limiter
        .settle(&policy, &reservation, 7, 60_000)
        .await
        .unwrap();
    assert_eq!(settled.marker, sluice_store::MarkerAnswer::Applied);
    assert_eq!(admitted_units(&limiter).await, 4);
}

#[tokio::test]
async fn an_attempt_on_rules_kept_whole_on_shard_zero_concludes_in_one_call() {
    // Failed logins count by outcome: kept whole on shard 0, so an
    // attempt of a sharded tenant is held there once, and concluded in
    // one call (the store here fails any second one).
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 10, per: 1m }]\n    routes:\n      \"POST /login\": [{ name: failures, algorithm: fixed_window, limit: 5, per: 15m, count_if: { status: [401] } }]\ntenants:\n  a: { plan: p, shards: 2 }\n";
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "t.yaml").unwrap().limits, true);
    let store = Remote::new(MemoryStore::with_clock(1_000, clock())).failing_adjustments_after(1);
    let limiter = Limiter::new(policy, store, OnError::Deny);
    let policy = limiter.policy();
    let login = Request::new("a", "POST /login", None, 3).unwrap();
    let decision = limiter.decide(&policy, &login).await;
    assert_eq!(decision.remaining(), Some(2), "3 of 5 held");
    let attempt = limiter.attempt(&policy, &login, &decision).unwrap();
    let concluded = limiter
        .conclude_attempt(&policy, &attempt, Some(401), 60_000)
        .await
        .unwrap();
    // As a request of one unit would find them.
    assert_eq!(
        concluded.decision.remaining(),
        Some(1),
        "3 of 5 counted, once"
    );
}
