//! The scripts of a rule shared across regions and their Rust twin,
//! `sluice_core::regions::stored::Stored`, give identical answers.
//!
//! Random sequences of steps run through a real Redis (the decision, the
//! debit and the give-back of `decide.lua` and `adjust.lua`, the ledger
//! steps of `ledger.lua`) and through the twin, on the same hand-driven
//! clock: decisions, grants, totals heard from peers (late, repeated, out
//! of order, from a peer that lost its ledger), notes of demand, reads,
//! debits and give-backs, with the clock moving within a window, across
//! windows, and a window back (a clock step), and reloads changing the
//! rule's period or limit. After every step, a
//! read-only check (peek) finds what a decision would.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use proptest::test_runner::TestCaseError;
use sluice_core::config::{NamedRule, RegionScope};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::regions::Heard;
use sluice_core::regions::bucket::{Bucket, Terms};
use sluice_core::regions::sliding::Slide;
use sluice_core::regions::stored::{Record, SharedRecord, Stored, window_of};
use sluice_core::{Algorithm, BoundRule, Rule, Scope};
use sluice_store::redis::regions::{
    Hearing, Kind, Own, Regions, Shared, Steps, identity_key, ledger_script, received_key, snapshot,
};
use sluice_store::{
    Batch, Change, Clock, ConnectOptions, KeySet, ManualClock, RedisStore, Store, TimeSource,
};
use sluice_testkit::RedisServer;

const REGIONS: usize = 3;

#[derive(Debug, Clone)]
enum Step {
    Wait(u64),
    Decide(u64),
    Debit(u64),
    /// Gives back what the admission this many decisions ago took.
    GiveBack(usize),
    Note(u64),
    Read,
    Grant(usize, u64),
    /// From a peer: the total it granted here, what it heard from here,
    /// its view, the window it names (0: now's, 1: the one before), and
    /// what it heard this region used.
    Hear(usize, u64, u64, u64, u64, u64),
    /// The region's Redis loses the rule's keys (a flush, a restart
    /// without persistence).
    Flush,
    /// A reload changes the rule's period.
    Reper(u64),
    /// A reload changes the rule's limit (so each region's share).
    Relimit(i128),
    /// The clock steps back (a failover to a Redis whose clock lags).
    Back(u64),
}

fn steps(per: u64) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => (0..per / 4).prop_map(Step::Wait),
        1 => (per / 2..2 * per).prop_map(Step::Wait),
        6 => (1u64..=4).prop_map(Step::Decide),
        1 => prop_oneof![1u64..=6, 20u64..=150].prop_map(Step::Debit),
        1 => (0usize..4).prop_map(Step::GiveBack),
        1 => (1u64..=20).prop_map(Step::Note),
        1 => Just(Step::Read),
        2 => (0..REGIONS + 1, 0u64..=12).prop_map(|(to, units)| Step::Grant(to, units)),
        3 => (0..REGIONS, 0u64..=30, 0u64..=20, 0u64..=40, prop::bool::weighted(0.15), prop_oneof![Just(0u64), 1u64..=30])
            .prop_map(|(from, total, back, cap, late, yours)| Step::Hear(from, total, back, cap, u64::from(late), yours)),
        1 => Just(Step::Flush),
        1 => prop_oneof![Just(per), Just(per * 3), Just((per / 2).max(1)), 1u64..=5_000].prop_map(Step::Reper),
        1 => (1u64..=2 * per).prop_map(Step::Back),
        1 => (1i128..=60).prop_map(Step::Relimit),
    ];
    proptest::collection::vec(step, 1..80)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A store on `server` (its keys and it), regions not set yet.
fn connect(server: &RedisServer, runtime: &tokio::runtime::Runtime) -> (KeySet, RedisStore) {
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[7u8; 32]).unwrap()),
        previous: None,
    };
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let store = runtime.block_on(RedisStore::connect(&server.url(), keys.clone(), &options));
    (keys, store.unwrap())
}

/// The algorithms a shared rule can have, by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Window,
    Sliding,
    /// A gcra or a token_bucket of this burst.
    Bucket(Algorithm, i128),
}

fn shared_rule(shape: Shape, limit: i128, per: u64, max_debt: u64) -> BoundRule {
    let rule = match shape {
        Shape::Sliding => Rule::new(Algorithm::SlidingWindow, limit, per, None, false),
        Shape::Window => Rule::new(Algorithm::FixedWindow, limit, per, None, true),
        Shape::Bucket(algorithm, burst) => Rule::new(algorithm, limit, per, Some(burst), false),
    };
    let rule = rule.unwrap().with_max_debt(i128::from(max_debt)).unwrap();
    let named = NamedRule {
        name: "minute".into(),
        rule,
        shadow: false,
        count_if: None,
        tolerance: sluice_core::tolerance::Tolerance::EXACT,
        regions: Some(RegionScope::Shared),
    };
    BoundRule::new(Scope::Tenant, "", &named, 0.8)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_shared_window_scripts_and_their_twin_answer_alike(
        shape in prop_oneof![
            Just(Shape::Window),
            Just(Shape::Sliding),
            (1i128..=90).prop_map(|b| Shape::Bucket(Algorithm::Gcra, b)),
            (1i128..=90).prop_map(|b| Shape::Bucket(Algorithm::TokenBucket, b)),
        ],
        limit in 1i128..=60,
        per in prop_oneof![Just(1_000u64), Just(60_000), 1u64..=5_000],
        max_debt in prop_oneof![0u64..=5, 50u64..=200],
        weights in proptest::collection::vec(1u32..=3, REGIONS),
        me in 0..REGIONS,
        steps in (1_000u64..=5_000).prop_flat_map(steps),
    ) {
        let case = Case { shape, limit, per, max_debt, weights, me };
        match shape {
            Shape::Sliding => differential::<Slide>(case, steps, |_, _| max_debt)?,
            Shape::Window => differential::<Record>(case, steps, |_, _| max_debt)?,
            Shape::Bucket(_, burst) => {
                let terms = |per, pool| Terms::new(burst as u64, per, pool, max_debt);
                differential::<Bucket>(case, steps, terms)?
            }
        }
    }
}

/// One case of the differential: the rule, and this region among the
/// regions.
#[derive(Debug)]
struct Case {
    shape: Shape,
    limit: i128,
    per: u64,
    max_debt: u64,
    weights: Vec<u32>,
    me: usize,
}

/// Runs `steps` through the scripts and the twin of kind `K` (a shared
/// `fixed_window`, `sliding_window` or bucket, whose terms for a period
/// and a pool `terms` gives), comparing their answers.
fn differential<K: SharedRecord>(
    case: Case,
    steps: Vec<Step>,
    terms: impl Fn(u64, u64) -> K::Terms,
) -> Result<(), TestCaseError> {
    let Case {
        shape,
        limit,
        per,
        max_debt,
        weights,
        me,
    } = case;
    let server = RedisServer::start();
    let runtime = runtime();
    let clock = Arc::new(ManualClock::new(1_764_460_800_000 + 7));
    let names: Vec<String> = (0..REGIONS).map(|r| format!("r{r}")).collect();
    let in_order: Vec<(&str, u32)> = names
        .iter()
        .map(String::as_str)
        .zip(weights.iter().copied())
        .collect();
    let regions = Arc::new(Regions::new(&in_order, &names[me], 100).unwrap());
    let (keys, store) = connect(&server, &runtime);
    let store = store
        .with_time(TimeSource::Client(clock.clone()))
        .with_regions(regions.clone());
    let (mut per, mut limit) = (per, limit);
    let mut rules = [shared_rule(shape, limit, per, max_debt)];
    // Named as the store names them, linking regions.
    let keyer = keys.current.clone().linking_regions();
    let record_of = |rules: &[BoundRule]| {
        let batch = Batch::new("tenant", None, 1, rules);
        sluice_store::redis::KeySet::keys(&keyer, &batch, sluice_store::redis::Valve::WHOLE)
    };
    let buckets = record_of(&rules);
    let mut shared = Shared {
        key: buckets.keys[0].clone(),
        record: buckets.records[0],
        per_ms: per,
        kind: Kind::of(&rules[0]),
        max_debt,
        previous: None,
    };
    let mut pool = Regions::pool(&rules[0]);
    let mut share = regions.share(pool);
    let mut t = terms(per, pool);
    let time = TimeSource::Client(clock.clone());
    let received = received_key("sl");
    let identity = identity_key("sl");
    let ledger = Steps {
        time: &time,
        regions: REGIONS,
        own: Some(Own {
            received: &received,
            identity: (&identity, "its identity"),
        }),
    };
    let mut connection = runtime
        .block_on(server.client().get_multiplexed_async_connection())
        .unwrap();
    runtime
        .block_on(
            redis::cmd("SET")
                .arg(&identity)
                .arg("its identity")
                .query_async::<()>(&mut connection),
        )
        .unwrap();
    // A shipping checked against another identity changes nothing.
    let other = Steps {
        own: Some(Own {
            received: &received,
            identity: (&identity, "another"),
        }),
        ..ledger
    };
    let view = Heard {
        cap: 1,
        used: 1,
        wanted: 1,
        heard_from_you: 0,
    };
    let window = window_of(clock.now_ms(), K::period(per));
    let hearing = Hearing {
        window,
        pool,
        share,
        from: 1,
        total: 5,
        view,
        yours: 0,
    };
    let refused: i64 = runtime
        .block_on(
            shared
                .hear_call(other, &hearing)
                .invoke_async(&mut connection),
        )
        .unwrap();
    prop_assert_eq!(refused, -2);
    let mut twin: Stored<K> = Stored::default();
    // The twins of a bucket's records under the other periods it had.
    let mut others: std::collections::HashMap<sluice_core::keys::Record, Stored<K>> =
        std::collections::HashMap::new();
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    for (i, step) in steps.into_iter().enumerate() {
        let now = clock.now_ms();
        let window = window_of(now, K::period(per));
        let said = format!("step {i} {step:?} at {now} (window {window})");
        match step {
            Step::Wait(ms) => clock.set(now + ms),
            Step::Back(ms) => clock.set(now - ms),
            Step::Flush => {
                // Everything goes (the records of other periods too),
                // then the link announces the region again.
                runtime
                    .block_on(
                        redis::pipe()
                            .cmd("FLUSHDB")
                            .ignore()
                            .cmd("SET")
                            .arg(&identity)
                            .arg("its identity")
                            .ignore()
                            .query_async::<()>(&mut connection),
                    )
                    .unwrap();
                twin = Stored::default();
                others.clear();
                admitted.clear();
            }
            Step::Reper(to) => {
                per = to;
                rules = [shared_rule(shape, limit, per, max_debt)];
                shared.per_ms = per;
                t = terms(per, pool);
                // A bucket of another period has a record of its own, read
                // afresh.
                // (and the store keeps each period's as it was, until a
                // write of the group drops it once idle: the twin takes the
                // record back as the store holds it).
                let record = record_of(&rules).records[0];
                if record != shared.record {
                    let mut kept = others.remove(&record).unwrap_or_default();
                    let value: Option<Vec<u8>> = runtime
                        .block_on(
                            redis::cmd("GET")
                                .arg(&shared.key)
                                .query_async(&mut connection),
                        )
                        .unwrap();
                    kept.record = value
                        .and_then(|v| sluice_store::redis::inspect::find_numbers(&v, record))
                        .map(K::stored);
                    others.insert(shared.record, std::mem::replace(&mut twin, kept));
                    shared.record = record;
                    admitted.clear();
                }
            }
            Step::Relimit(to) => {
                limit = to;
                rules = [shared_rule(shape, limit, per, max_debt)];
                pool = Regions::pool(&rules[0]);
                share = regions.share(pool);
                shared.kind = Kind::of(&rules[0]);
                t = terms(per, pool);
            }
            Step::Decide(cost) => {
                let batch = Batch::new("tenant", None, cost, &rules);
                let lua = runtime.block_on(store.decide(&batch)).unwrap();
                let rust = twin.decide(now, cost, share, per, t);
                let o = lua.outcomes[0];
                prop_assert_eq!(
                    (
                        o.allowed,
                        u64::from(o.remaining),
                        o.reset_after_ms,
                        o.retry_after_ms
                    ),
                    (
                        rust.allowed,
                        rust.remaining.min(u64::from(u32::MAX)),
                        rust.reset_ms,
                        rust.retry_ms
                    ),
                    "{}",
                    said
                );
                if rust.allowed {
                    admitted.push((lua.at_ms, cost));
                }
            }
            Step::Debit(cost) => {
                let batch = Batch::new("tenant", None, cost, &rules);
                let lua = runtime
                    .block_on(store.adjust(&batch, Change::Debit, None))
                    .unwrap();
                let rust = twin.debit(now, cost, share, per, t);
                prop_assert_eq!(lua.forgiven, rust, "{}", said);
            }
            Step::GiveBack(back) => {
                if let Some(&(at, cost)) = admitted.iter().rev().nth(back) {
                    let change = Change::GiveBack {
                        at,
                        first_shard_at: at,
                    };
                    let batch = Batch::new("tenant", None, cost, &rules);
                    runtime
                        .block_on(store.adjust(&batch, change, None))
                        .unwrap();
                    twin.give_back((at, cost), now, (share, per), t);
                }
            }
            Step::Note(wanted) => {
                let call = shared.note_call(ledger, share, (window, pool, wanted));
                let noted: i64 = runtime
                    .block_on(call.invoke_async(&mut connection))
                    .unwrap();
                let rust = twin.note(now, window, per, pool, wanted, REGIONS);
                prop_assert_eq!(noted == 1, rust, "{}", said);
            }
            Step::Read => {}
            Step::Grant(to, units) => {
                let call = shared.grant_call(ledger, share, (window, to, units));
                let lua: i64 = runtime
                    .block_on(call.invoke_async(&mut connection))
                    .unwrap();
                let rust = twin.grant(now, window, (per, t), share, (to, units), REGIONS);
                prop_assert_eq!(u64::try_from(lua).ok(), rust, "{}", said);
            }
            Step::Hear(from, total, back, cap, late, yours) => {
                let named = window.saturating_sub(late * K::period(per));
                let view = Heard {
                    cap,
                    used: cap / 2,
                    wanted: cap,
                    heard_from_you: back,
                };
                let hearing = Hearing {
                    window: named,
                    pool,
                    share,
                    from,
                    total,
                    view,
                    yours,
                };
                let call = shared.hear_call(ledger, &hearing);
                let lua: i64 = runtime
                    .block_on(call.invoke_async(&mut connection))
                    .unwrap();
                let rust = twin.hear(
                    now,
                    (named, per, t),
                    (pool, share),
                    from,
                    total,
                    view,
                    yours,
                    REGIONS,
                );
                prop_assert_eq!(u64::try_from(lua).ok(), rust, "{}", said);
            }
        }
        // After every step, the part as the link reads it.
        let now = clock.now_ms();
        let mut reply_call = redis::pipe();
        reply_call.load_script(ledger_script()).ignore();
        reply_call.invoke_script(&shared.read_call(ledger, share));
        let (reply,): (Vec<u8>,) = runtime
            .block_on(reply_call.query_async(&mut connection))
            .unwrap();
        let mut lua = snapshot(&reply, REGIONS).unwrap();
        lua.part.share = share;
        prop_assert_eq!(
            lua,
            twin.read(now, (per, t), share, REGIONS),
            "after {}",
            said
        );
        // A read-only check (peek) finds what a decision would: what
        // is left here, at most the rule's limit.
        let peeked = runtime
            .block_on(store.peek(&Batch::new("tenant", None, 1, &rules)))
            .unwrap();
        let row = &peeked.rows[0];
        // (A bucket's: at most its burst.)
        let limit = rules[0].rule().capacity();
        // A region past what it may admit owes (at most max_debt: a rule
        // that never owes reads as spent).
        let (_, owed) = twin.standing(now, share, per, t);
        prop_assert_eq!(
            row.enforced.owes(&row.state, peeked.now),
            owed > 0 && max_debt > 0,
            "owing {} after {}",
            owed,
            said
        );
        for cost in [1, 2].into_iter().filter(|&c| c <= limit) {
            // As the read-only checks ask it: a cost past what the rule
            // read holds (a region's bucket holds less than the rule's
            // burst) never passes.
            let holds = row.enforced.capacity();
            let (mut seen, _) = row.enforced.decide(&row.state, peeked.now, cost.min(holds));
            seen.allowed &= cost <= holds;
            let would = twin.clone().decide(now, cost, share, per, t);
            if cost > holds {
                prop_assert!(!would.allowed, "peek of {} after {}", cost, said);
                continue;
            }
            let left = |allowed: bool, remaining: u64| remaining + if allowed { cost } else { 0 };
            prop_assert_eq!(
                seen.allowed,
                would.allowed,
                "peek of {} after {}",
                cost,
                said
            );
            prop_assert_eq!(
                left(seen.allowed, u64::from(seen.remaining)),
                left(would.allowed, would.remaining).min(holds),
                "peek of {} after {}",
                cost,
                said
            );
        }
    }

    Ok(())
}
