use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sluice_core::{Config, Policy, State};

use super::*;
use crate::clock::ManualClock;

fn policy(yaml: &str) -> Policy {
    Policy::compile(&Config::from_yaml(yaml, "test.yaml").unwrap().limits)
}

const PLAN: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 50, per: 1s }]
    routes:
      "GET /a": [{ algorithm: token_bucket, limit: 5, per: 1s, burst: 8 },
                 { algorithm: sliding_log, limit: 6, per: 2s }]
      "*": [{ algorithm: fixed_window, limit: 7, per: 1s }]
    subject:
      "*": [{ algorithm: sliding_window, limit: 4, per: 1s }]
global:
  "GET /a": [{ algorithm: gcra, limit: 9, per: 1s, share: first_come }]
"#;

fn batch<'a>(
    p: &'a Policy,
    tenant: &'a str,
    route: &'a str,
    subject: Option<&'a str>,
    cost: u64,
) -> Batch<'a> {
    Batch::new(
        tenant,
        subject,
        cost,
        p.applicable(tenant, route, subject.is_some()).rules,
    )
}

#[test]
fn two_threads_on_one_tenant_never_over_admit() {
    let p = policy("default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 1000, per: 1h }]\n");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = MemoryStore::with_clock(10_000, clock);
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..5_000 {
                    let b = batch(&p, "acme", "GET /", None, 1);
                    if store.decide_now(&b).unwrap()[0].allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    // Time stands still: exactly the burst (= limit) passes, no more.
    assert_eq!(admitted.load(Ordering::Relaxed), 1_000);
}

#[test]
fn concurrent_multi_rule_decisions_keep_every_rule_exact() {
    // Threads contend on the same tenant and global keys through different
    // routes and subjects; every rule must still count exactly.
    let p = policy(PLAN);
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = MemoryStore::with_clock(10_000, clock);
    let admitted_a = AtomicU64::new(0);
    let admitted_all = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4 {
            let (store, p, admitted_a, admitted_all) = (&store, &p, &admitted_a, &admitted_all);
            s.spawn(move || {
                for i in 0..500 {
                    let route = if i % 2 == 0 { "GET /a" } else { "GET /b" };
                    let subject = ["u1", "u2", "u3"][(i + t) % 3];
                    let b = batch(p, "acme", route, Some(subject), 1);
                    if store.decide_now(&b).unwrap().iter().all(|o| o.allowed) {
                        admitted_all.fetch_add(1, Ordering::Relaxed);
                        if route == "GET /a" {
                            admitted_a.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    // GET /a: token bucket burst 8 and sliding log 6 → at most 6.
    assert!(admitted_a.load(Ordering::Relaxed) <= 6);
    // Subjects: 3 × 4 per second; tenant: 50. So at most 12 in all.
    assert!(admitted_all.load(Ordering::Relaxed) <= 12);
    assert!(admitted_all.load(Ordering::Relaxed) >= 1);
}

#[test]
fn sweep_drops_only_idle_keys() {
    let p = policy(PLAN);
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = MemoryStore::with_clock(10_000, clock.clone());
    let b = batch(&p, "acme", "GET /a", Some("u1"), 1);
    assert!(store.decide_now(&b).unwrap().iter().all(|o| o.allowed));
    let held = store.len();
    assert_eq!(held, b.rules.len());
    assert_eq!(store.sweep(), 0, "nothing is idle yet");
    // gcra (20ms), the valve (112ms) and the token bucket (200ms) go idle
    // first; the sliding log and sliding window (2s) last.
    clock.advance(1_999);
    assert_eq!(store.sweep(), 3);
    assert_eq!(store.len(), 2);
    clock.advance(1);
    assert_eq!(store.sweep(), 2);
    assert!(store.is_empty());
}

#[test]
fn sweeping_during_decisions_loses_no_admission() {
    // A sweeper running flat out beside deciders must never drop an entry
    // holding live consumption.
    let p = policy("default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 300, per: 1h }]\n");
    let clock = Arc::new(ManualClock::new(5_000_000));
    let store = MemoryStore::with_clock(10_000, clock);
    let admitted = AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                store.sweep();
            }
        });
        let deciders: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    for _ in 0..2_000 {
                        let b = batch(&p, "acme", "GET /", None, 1);
                        if store.decide_now(&b).unwrap()[0].allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for d in deciders {
            d.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!(admitted.load(Ordering::Relaxed), 300);
}

#[test]
fn a_full_store_refuses_new_keys_only() {
    let p = policy("default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 10, per: 1s }]\n");
    let store = MemoryStore::with_clock(2, Arc::new(ManualClock::new(0)));
    assert!(store.decide_now(&batch(&p, "a", "GET /", None, 1)).is_ok());
    assert!(store.decide_now(&batch(&p, "b", "GET /", None, 1)).is_ok());
    assert_eq!(
        store.decide_now(&batch(&p, "c", "GET /", None, 1)),
        Err(StoreError::Full(2))
    );
    assert!(store.decide_now(&batch(&p, "a", "GET /", None, 1)).is_ok());
}

#[test]
fn a_tenant_making_keys_takes_at_most_its_share_of_the_store() {
    // One tenant sending a new subject every request (an hour's window
    // each: nothing goes idle) fills its share, not the store: other
    // tenants' new keys keep being taken.
    let p = policy(
        "default_plan: p\nplans:\n  p:\n    subject:\n      \"*\": [{ algorithm: sliding_window, limit: 10, per: 1h }]\n",
    );
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::with_clock(100, clock.clone()).with_tenant_share(25);
    let mut refused = 0;
    for i in 0..100 {
        let subject = format!("s{i}");
        match store.decide_now(&batch(&p, "noisy", "GET /", Some(&subject), 1)) {
            Ok(_) => {}
            Err(e) => {
                assert_eq!(e, StoreError::TenantFull(25));
                refused += 1;
            }
        }
    }
    assert_eq!(refused, 75, "the noisy tenant holds its 25 keys");
    for tenant in ["polite-1", "polite-2", "polite-3"] {
        for i in 0..20 {
            let subject = format!("u{i}");
            assert!(
                store
                    .decide_now(&batch(&p, tenant, "GET /", Some(&subject), 1))
                    .is_ok(),
                "{tenant}'s user {i}"
            );
        }
    }
    // The noisy tenant's keys it holds keep working; once they go idle and
    // are swept, its share is free again.
    assert!(
        store
            .decide_now(&batch(&p, "noisy", "GET /", Some("s0"), 1))
            .is_ok()
    );
    clock.advance(3 * 3_600_000);
    store.sweep();
    assert!(
        store
            .decide_now(&batch(&p, "noisy", "GET /", Some("s99"), 1))
            .is_ok()
    );
}

#[test]
fn tenant_shares_are_given_back_whatever_the_race() {
    // Four threads insert the same keys of three tenants at once (most
    // inserts lose the race to another thread's), the sweeper runs
    // meanwhile; once everything is idle and swept, no place is held.
    let p = policy(
        "default_plan: p\nplans:\n  p:\n    subject:\n      \"*\": [{ limit: 10, per: 1s }]\n",
    );
    let clock = Arc::new(ManualClock::new(0));
    let store = MemoryStore::with_clock(1_000, clock.clone()).with_tenant_share(100);
    std::thread::scope(|scope| {
        for _ in 0..4 {
            let (store, p) = (&store, &p);
            scope.spawn(move || {
                for i in 0..300 {
                    let tenant = format!("t{}", i % 3);
                    let subject = format!("s{}", i / 3);
                    let _ = store.decide_now(&batch(p, &tenant, "GET /", Some(&subject), 1));
                    if i % 50 == 0 {
                        store.sweep();
                    }
                }
            });
        }
    });
    for tenant in ["t0", "t1", "t2"] {
        let id = store.hasher.hash_one(tenant.as_bytes());
        assert_eq!(
            store.per_tenant.lock().get(&id).copied(),
            Some(100),
            "{tenant} holds its share"
        );
    }
    clock.advance(10_000);
    store.sweep();
    assert!(store.per_tenant.lock().is_empty());
    assert_eq!(store.held.load(Ordering::Relaxed), 0);
}

#[test]
fn concurrent_inserts_never_overshoot_the_cap() {
    let p = policy("default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 10, per: 1s }]\n");
    for _ in 0..20 {
        let store = MemoryStore::with_clock(64, Arc::new(ManualClock::new(0)));
        let full = AtomicU64::new(0);
        std::thread::scope(|scope| {
            for t in 0..4 {
                let (store, p, full) = (&store, &p, &full);
                scope.spawn(move || {
                    for i in 0..200 {
                        let tenant = format!("t{t}-{i}");
                        if store
                            .decide_now(&batch(p, &tenant, "GET /", None, 1))
                            .is_err()
                        {
                            full.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(store.len(), 64, "the cap holds under concurrent inserts");
        assert_eq!(full.load(Ordering::Relaxed), 800 - 64);
    }
}

#[test]
fn partitions_are_separate_buckets() {
    let p = policy(PLAN);
    let store = MemoryStore::with_clock(10_000, Arc::new(ManualClock::new(0)));
    // Tenants with a shared prefix or an empty-looking subject never alias.
    for (tenant, subject) in [("ab", Some("c")), ("a", Some("bc")), ("abc", None)] {
        let b = batch(&p, tenant, "GET /x", subject, 4);
        assert!(
            store.decide_now(&b).unwrap().iter().all(|o| o.allowed),
            "{tenant} {subject:?}"
        );
    }
}

#[test]
fn shares_cut_every_rule_of_a_multi_rule_decision() {
    // Local fallback with 4 instances: the tenant's 40 becomes 10, the
    // route's 8 becomes 2.
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 40, per: 1h }]\n    routes:\n      \"*\": [{ algorithm: fixed_window, limit: 8, per: 1h }]\n";
    let p = policy(yaml);
    let store = MemoryStore::with_clock(100, Arc::new(ManualClock::new(0)));
    let b = batch(&p, "a", "GET /", None, 1);
    let admitted = (0..20)
        .filter(|_| store.decide_parts(&b, 4).unwrap().iter().all(|o| o.allowed))
        .count();
    assert_eq!(admitted, 2);
}

#[test]
fn a_shadow_rule_never_blocks_and_consumes_only_when_it_admits() {
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ name: real, limit: 5, per: 1h }, { name: trial, limit: 2, per: 1h, shadow: true }]\n";
    let p = policy(yaml);
    let store = MemoryStore::with_clock(100, Arc::new(ManualClock::new(0)));
    let b = batch(&p, "a", "GET /", None, 1);
    let mut shadow_denials = 0;
    for _ in 0..5 {
        let outcomes = store.decide_now(&b).unwrap();
        assert!(outcomes[0].allowed, "the enforced rule decides");
        shadow_denials += usize::from(!outcomes[1].allowed);
    }
    assert_eq!(shadow_denials, 3);
    assert!(!store.decide_now(&b).unwrap()[0].allowed);
}

fn snapshot(store: &MemoryStore, b: &Batch<'_>) -> Vec<State> {
    (0..b.rules.len()).map(|i| store.peek_rule(b, i)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// Whatever the interleaving of tenants, routes, subjects, costs and
    /// times, a denied request leaves every rule of every scope untouched,
    /// and an admitted one is admitted by every rule.
    #[test]
    fn a_denied_request_consumes_nothing(
        steps in proptest::collection::vec(
            (0u64..400, 0usize..2, 0usize..3, 0usize..3, 1u64..=7),
            1..150,
        )
    ) {
        let p = policy(PLAN);
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let store = MemoryStore::with_clock(10_000, clock.clone());
        for (gap, tenant, route, subject, cost) in steps {
            clock.advance(gap);
            let tenant = ["acme", "globex"][tenant];
            let route = ["GET /a", "GET /b", "POST /c"][route];
            let subject = [None, Some("u1"), Some("u2")][subject];
            let b = batch(&p, tenant, route, subject, cost);
            if b.rules.iter().any(|r| cost > r.rule().capacity()) {
                continue;
            }
            let before = snapshot(&store, &b);
            let outcomes = store.decide_now(&b).unwrap();
            let after = snapshot(&store, &b);
            if outcomes.iter().all(|o| o.allowed) {
                // Every algorithm's state moves when it admits a unit.
                for (x, y) in before.iter().zip(&after) {
                    prop_assert_ne!(x, y, "an admitted request left a rule unconsumed");
                }
            } else {
                prop_assert_eq!(before, after, "a denied request changed some rule's state");
            }
        }
    }
}

#[test]
fn a_rule_named_twice_in_one_decision_is_locked_once_and_read_as_it_was() {
    // An Envoy request can carry one descriptor twice: two rules of one
    // batch on one entry. The entry is locked once (locking it again would
    // deadlock), both rules decide on the state as it was, and the
    // decision stays all or nothing: on the stack (2 rules) and in vectors
    // (6).
    let p = policy("default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 3, per: 1h }]\n");
    let rule = p.applicable("a", "GET /", false).rules[0].clone();
    for copies in [2, 6] {
        let rules = vec![rule.clone(); copies];
        let store = MemoryStore::with_clock(100, Arc::new(ManualClock::new(0)));
        let b = Batch::new("a", None, 1, &rules);
        let mut admitted = 0;
        for _ in 0..5 {
            let outcomes = store.decide_now(&b).unwrap();
            assert_eq!(outcomes.len(), copies);
            assert!(outcomes.iter().all(|o| *o == outcomes[0]), "{outcomes:?}");
            admitted += usize::from(outcomes[0].allowed);
        }
        assert_eq!(admitted, 3, "{copies} copies");
        assert_eq!(store.len(), 1);
    }
}
