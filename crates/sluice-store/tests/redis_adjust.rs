//! The adjustment script (`adjust.lua`) held to its Rust twins
//! (`Rule::debit`, `Rule::refund`, the memory store's markers): random
//! decisions, debits past the limit, give-backs and settle markers, on
//! every algorithm with a random `max_debt`, against a real Redis and the
//! memory store on one hand-driven clock; every answer must be identical,
//! and so must every decision after. Also peeks (what a check of rules
//! that count by outcome reads) and rules re-rated between steps (a fair
//! valve's gate, whose rate changes on every decision, with limits in the
//! thousands; a reload raising or lowering a limit). On one Redis and on
//! Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Algorithm, Config, Policy};
use sluice_store::{
    Batch, Change, Clock, ClusterStore, ConnectOptions, KeySet, ManualClock, Marker, MemoryStore,
    RedisStore, Store, TimeSource,
};
use sluice_testkit::{RedisCluster, RedisServer};

/// A rule: algorithm, limit, per (ms), extra burst, aligned, max_debt.
#[derive(Debug, Clone)]
struct RuleSpec {
    algorithm: Algorithm,
    limit: u64,
    per: u64,
    extra: u64,
    aligned: bool,
    debt: Option<u64>,
}

impl RuleSpec {
    /// The rule in YAML, its limit (and burst) `scale` times: the same
    /// buckets (a rule's parameters are not part of its identity) under
    /// another rate, as a fair valve's gate is on every decision and a
    /// reload leaves a rule.
    fn yaml(&self, scale: u64) -> String {
        let (a, per) = (self.algorithm, self.per);
        let limit = self.limit * scale;
        if a == Algorithm::Concurrency {
            return format!("{{ algorithm: concurrency, limit: {limit}, lease: {per}ms }}");
        }
        let mut s = format!("{{ algorithm: {}, limit: {limit}, per: {per}ms", a.name());
        if a.has_burst() {
            s.push_str(&format!(", burst: {}", limit + self.extra * scale));
        }
        if self.aligned && a == Algorithm::FixedWindow {
            s.push_str(", aligned: true");
        }
        if let Some(debt) = self.debt {
            s.push_str(&format!(", max_debt: {}", debt * scale));
        }
        s.push_str(" }");
        s
    }
}

fn rule() -> impl Strategy<Value = RuleSpec> {
    let algorithm = prop_oneof![
        Just(Algorithm::Gcra),
        Just(Algorithm::TokenBucket),
        Just(Algorithm::SlidingLog),
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::Concurrency),
    ];
    let per = prop_oneof![1u64..=30, 100u64..=2_000, Just(1_000u64)];
    (
        algorithm,
        1u64..=12,
        per,
        0u64..=6,
        any::<bool>(),
        prop::option::of(0u64..=30),
    )
        .prop_map(|(algorithm, limit, per, extra, aligned, debt)| RuleSpec {
            algorithm,
            limit,
            per,
            extra,
            aligned,
            debt,
        })
}

/// The policy of `tenant` and `subject` rules at `scale` times their
/// limits (`sliding_log` and `concurrency` at most 4 times: their entries
/// are members).
fn policy_of(tenant: &[RuleSpec], subject: &RuleSpec, scale: u64) -> (Policy, String) {
    let scaled = |r: &RuleSpec| {
        let scale = match r.algorithm {
            Algorithm::SlidingLog | Algorithm::Concurrency => scale.min(4),
            _ => scale,
        };
        r.yaml(scale)
    };
    let tenant: Vec<String> = tenant.iter().map(scaled).collect();
    let yaml = format!(
        "default_plan: p\nplans:\n  p:\n    tenant: [{}]\n    subject:\n      \"*\": [{}]\n",
        tenant.join(", "),
        scaled(subject)
    );
    let config = Config::from_yaml(&yaml, "adjust.yaml").unwrap();
    (Policy::compile(&config.limits), yaml)
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Decide,
    Debit,
    /// Give back part of an admission still open (the one picked, modulo
    /// their number), naming when each rule would have refilled or not:
    /// what it returns depends on the time since, and on give-backs made
    /// in between.
    GiveBack(u8, bool),
    /// A debit under a settle marker: a new one, the same one again, or
    /// the same id with another value.
    Settle(u8),
    /// The rules' states read without a change, as a check of rules that
    /// count by outcome reads them (`Store::peek`), each decided for the
    /// cost as the limiter decides them.
    Peek,
    /// The same rules at this many times their limits from now on (a fair
    /// valve's gate re-rated, a reload raising or lowering a limit): 1 is
    /// the rules as generated.
    Rerate(u64),
    Back,
    Forward,
}

fn steps() -> impl Strategy<Value = Vec<(u64, u64, bool, Step)>> {
    let gap = prop_oneof![3 => Just(0u64), 4 => 0u64..40, 2 => 0u64..2_500, 1 => Just(1_000u64)];
    let step = prop_oneof![
        6 => Just(Step::Decide),
        4 => Just(Step::Debit),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(pick, whole)| Step::GiveBack(pick, whole)),
        2 => (0u8..3).prop_map(Step::Settle),
        2 => Just(Step::Peek),
        1 => prop_oneof![Just(1u64), Just(3), Just(250), Just(1_000)].prop_map(Step::Rerate),
        1 => Just(Step::Back),
        1 => Just(Step::Forward),
    ];
    proptest::collection::vec((gap, 1u64..=40, any::<bool>(), step), 1..50)
}

/// Runs `steps` against the memory store and `remote` on `clock`, for
/// `tenant`: every answer must be identical.
fn run<S: Store>(
    runtime: &tokio::runtime::Runtime,
    remote: &S,
    clock: &Arc<ManualClock>,
    tenant: &str,
    (tenant_rules, subject_rule): (&[RuleSpec], &RuleSpec),
    steps: Vec<(u64, u64, bool, Step)>,
) -> Result<(), TestCaseError> {
    let memory = MemoryStore::with_clock(10_000, clock.clone());
    let (mut policy, mut yaml) = policy_of(tenant_rules, subject_rule, 1);
    // Admissions not yet given back: when, their cost, with the subject
    // or not, and per rule when it would have refilled.
    let mut admitted: Vec<(u64, u64, bool, Vec<u64>)> = Vec::new();
    let mut whole_at = Vec::new();
    let mut settles = 0u8;
    for (i, (gap, cost, with_subject, step)) in steps.into_iter().enumerate() {
        clock.advance(gap);
        let applicable = policy.applicable(tenant, "GET /x", with_subject);
        let subject = with_subject.then_some("user-1");
        let (change, cost, marker) = match step {
            Step::Back => {
                clock.set(clock.now_ms() - 3_600_000);
                continue;
            }
            Step::Forward => {
                clock.advance(3_600_000);
                continue;
            }
            Step::Rerate(scale) => {
                (policy, yaml) = policy_of(tenant_rules, subject_rule, scale);
                continue;
            }
            Step::Decide => {
                if cost > applicable.max_cost {
                    continue;
                }
                let batch = Batch::new(tenant, subject, cost, applicable.rules);
                let expected = memory.decide_now(&batch).unwrap();
                let actual = runtime.block_on(remote.decide(&batch)).unwrap().outcomes;
                prop_assert_eq!(
                    expected.as_slice(),
                    actual.as_slice(),
                    "step {} decide at {}: {}",
                    i,
                    clock.now_ms(),
                    yaml
                );
                if expected.iter().all(|o| o.allowed) {
                    let now = clock.now_ms();
                    let whole = expected.iter().map(|o| now + o.reset_after_ms).collect();
                    admitted.push((now, cost, with_subject, whole));
                }
                continue;
            }
            Step::Peek => {
                let batch = Batch::new(tenant, subject, cost, applicable.rules);
                let decided = |peeked: sluice_store::Peeked| -> Vec<sluice_core::Outcome> {
                    peeked
                        .rows
                        .iter()
                        .map(|row| {
                            let cost = cost.min(row.enforced.capacity());
                            row.enforced.decide(&row.state, peeked.now, cost).0
                        })
                        .collect()
                };
                let expected = decided(memory.peek_now(&batch));
                let actual = decided(runtime.block_on(remote.peek(&batch)).unwrap());
                prop_assert_eq!(
                    expected,
                    actual,
                    "step {} peek at {}: {}",
                    i,
                    clock.now_ms(),
                    yaml
                );
                continue;
            }
            Step::Debit => (Change::Debit, cost, None),
            Step::GiveBack(pick, whole) => {
                let open: Vec<usize> = (0..admitted.len())
                    .filter(|&k| admitted[k].2 == with_subject)
                    .collect();
                if open.is_empty() {
                    continue;
                }
                let (at, spent, _, whole_of) =
                    admitted.remove(open[usize::from(pick) % open.len()]);
                whole_at = if whole { whole_of } else { Vec::new() };
                (
                    Change::GiveBack {
                        at,
                        first_shard_at: at,
                    },
                    1 + cost % spent,
                    None,
                )
            }
            Step::Settle(kind) => {
                if kind == 0 {
                    settles += 1;
                }
                let value = if kind == 2 {
                    "other".to_owned()
                } else {
                    format!("c={cost}")
                };
                let marker = Marker {
                    id: [settles; 16],
                    value,
                    ttl_ms: 30 * 86_400_000,
                    shard: 0,
                };
                (Change::Debit, cost, Some(marker))
            }
        };
        let batch = Batch {
            whole_at: &whole_at,
            ..Batch::new(tenant, subject, cost, applicable.rules)
        };
        let expected = memory.adjust_now(&batch, change, marker.as_ref()).unwrap();
        let actual = runtime
            .block_on(remote.adjust(&batch, change, marker.as_ref()))
            .unwrap();
        prop_assert_eq!(
            expected.marker,
            actual.marker,
            "step {} {:?} marker",
            i,
            step
        );
        prop_assert_eq!(
            expected.forgiven,
            actual.forgiven,
            "step {} {:?} forgiven: {}",
            i,
            step,
            yaml
        );
        prop_assert_eq!(
            expected.outcomes.as_slice(),
            actual.outcomes.as_slice(),
            "step {} {:?} cost {} at {}: {}",
            i,
            step,
            cost,
            clock.now_ms(),
            yaml
        );
    }
    Ok(())
}

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[42u8; 32]).unwrap()),
        previous: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 160,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn redis_and_memory_adjust_identically(
        tenant in proptest::collection::vec(rule(), 1..=2),
        subject in rule(),
        start in prop_oneof![Just(1_764_460_800_000u64), 1_700_000_000_000u64..1_800_000_000_000],
        steps in steps(),
    ) {
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let clock = Arc::new(ManualClock::new(start));
        let redis = runtime
            .block_on(RedisStore::connect(&server.url(), keys(), &ConnectOptions::with_timeout(Duration::from_secs(5))))
            .unwrap()
            .with_time(TimeSource::Client(clock.clone()));
        run(&runtime, &redis, &clock, "tenant-a", (&tenant, &subject), steps)?;
    }
}

/// One Redis Cluster for every case of the test below (each case a
/// tenant of its own).
fn cluster() -> &'static RedisCluster {
    static CLUSTER: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 60,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn redis_cluster_and_memory_adjust_identically(
        tenant in proptest::collection::vec(rule(), 1..=2),
        subject in rule(),
        start in prop_oneof![Just(1_764_460_800_000u64), 1_700_000_000_000u64..1_800_000_000_000],
        steps in steps(),
    ) {
        static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let clock = Arc::new(ManualClock::new(start));
        let options = ConnectOptions::with_timeout(Duration::from_secs(5));
        let store = runtime
            .block_on(ClusterStore::connect(&cluster().urls(), keys(), &options, 1))
            .unwrap()
            .with_time(TimeSource::Client(clock.clone()));
        let tenant_id = format!("tenant-{case}-{start}");
        run(&runtime, &store, &clock, &tenant_id, (&tenant, &subject), steps)?;
    }
}
