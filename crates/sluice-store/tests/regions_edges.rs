//! Edge tests of rules shared across regions, as the scripts run them on
//! a real redis-server: a `gcra` / `token_bucket`'s read-only checks,
//! reloads to a local rule and key's expiry (`shared_bucket` in
//! regions/shared.lua, code 9), script and function alike, and a shared
//! window's debt and reload to local.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::{NamedRule, RegionScope};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::regions::Heard;
use sluice_core::regions::bucket::epoch;
use sluice_core::regions::stored::window_of;
use sluice_core::{Algorithm, BoundRule, Rule, Scope};
use sluice_store::redis::regions::{
    Hearing, Kind, Own, Regions, Shared, Steps, identity_key, received_key,
};
use sluice_store::{
    Batch, Change, Clock, ConnectOptions, KeySet, ManualClock, RedisStore, Store, TimeSource,
};
use sluice_testkit::RedisServer;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn connect(server: &RedisServer, runtime: &tokio::runtime::Runtime) -> (KeySet, RedisStore) {
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[7u8; 32]).unwrap()),
        previous: None,
    };
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let store = runtime.block_on(RedisStore::connect(&server.url(), keys.clone(), &options));
    (keys, store.unwrap())
}

fn bucket_rule(
    algorithm: Algorithm,
    (limit, per, burst): (i128, u64, i128),
    scope: RegionScope,
) -> BoundRule {
    let rule = Rule::new(algorithm, limit, per, Some(burst), false).unwrap();
    let named = NamedRule {
        name: "rate".into(),
        rule,
        shadow: false,
        count_if: None,
        tolerance: sluice_core::tolerance::Tolerance::EXACT,
        regions: Some(scope),
    };
    BoundRule::new(Scope::Tenant, "", &named, 0.8)
}

fn three_regions() -> Arc<Regions> {
    Arc::new(Regions::new(&[("a", 1), ("b", 1), ("c", 1)], "a", 100).unwrap())
}

/// The read-only checks (`peek`: Envoy's `hits_addend: 0`, a zero
/// limit's standing, `sluice inspect`) read a shared bucket as this
/// region's own: region a (a share of 10 of 30/s) spent, a decision says
/// retry in 100 ms (one unit at 10/s), and so does the check (read at the
/// rule's whole limit, it said a third of that, and admitted where a
/// decision denies).
#[test]
fn a_read_only_check_of_a_shared_gcra_never_retries_earlier_than_a_decision() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let server = RedisServer::start();
        let runtime = runtime();
        let clock = Arc::new(ManualClock::new(1_764_460_800_000 + 7));
        let (_, store) = connect(&server, &runtime);
        let store = store
            .with_time(TimeSource::Client(clock.clone()))
            .with_regions(three_regions());
        let rules = [bucket_rule(algorithm, (30, 1_000, 30), RegionScope::Shared)];
        let batch = Batch::new("tenant", None, 1, &rules);
        let admitted = (0..40)
            .filter(|_| runtime.block_on(store.decide(&batch)).unwrap().outcomes[0].allowed)
            .count();
        assert_eq!(admitted, 10, "a share of 10 of 30");
        let denied = runtime.block_on(store.decide(&batch)).unwrap().outcomes[0];
        assert!(!denied.allowed);
        let peeked = runtime.block_on(store.peek(&batch)).unwrap();
        let row = &peeked.rows[0];
        let (seen, _) = row.enforced.decide(&row.state, peeked.now, 1);
        assert!(!seen.allowed);
        // At the moment the peek says it fits, a decision denies.
        let at = clock.now_ms() + seen.retry_after_ms;
        let peeked_then = {
            clock.set(at);
            let p = runtime.block_on(store.peek(&batch)).unwrap();
            let row = &p.rows[0];
            row.enforced.decide(&row.state, p.now, 1).0.allowed
        };
        let decided_then = runtime.block_on(store.decide(&batch)).unwrap().outcomes[0].allowed;
        assert!(
            seen.retry_after_ms >= denied.retry_after_ms && peeked_then == decided_then,
            "{algorithm:?}: a decision says retry in {} ms, the read-only check {} ms; \
             {} ms on the check says {} and a decision {}",
            denied.retry_after_ms,
            seen.retry_after_ms,
            seen.retry_after_ms,
            if peeked_then { "admitted" } else { "denied" },
            if decided_then { "admitted" } else { "denied" },
        );
    }
}

/// A shared gcra of 100 000 a day (a share of 33 334, its burst the
/// limit) made local by a reload: the same record, read by the local gcra.
/// The shared record's tokens (units × per, 33 334 × 86 400 000 ≈ 2.9e12)
/// stand where a local gcra keeps its TAT: read as a TAT far ahead of now,
/// the bucket is "repaired" to empty. A tenant that used one unit is then
/// held to the refill (about one unit a second) instead of its burst.
#[test]
fn a_shared_daily_gcra_made_local_is_not_read_as_empty() {
    let server = RedisServer::start();
    let runtime = runtime();
    let clock = Arc::new(ManualClock::new(1_764_460_800_000 + 7));
    let (_, store) = connect(&server, &runtime);
    let store = store
        .with_time(TimeSource::Client(clock.clone()))
        .with_regions(three_regions());
    let day = 86_400_000;
    let shared = [bucket_rule(
        Algorithm::Gcra,
        (100_000, day, 100_000),
        RegionScope::Shared,
    )];
    let o = runtime
        .block_on(store.decide(&Batch::new("tenant", None, 1, &shared)))
        .unwrap()
        .outcomes[0];
    assert!(o.allowed);
    let local = [bucket_rule(
        Algorithm::Gcra,
        (100_000, day, 100_000),
        RegionScope::Local,
    )];
    let admitted = (0..100)
        .filter(|_| {
            runtime
                .block_on(store.decide(&Batch::new("tenant", None, 1, &local)))
                .unwrap()
                .outcomes[0]
                .allowed
        })
        .count();
    assert_eq!(
        admitted, 100,
        "one unit of 100 000 used, made local: {admitted} of 100 admitted"
    );
}

/// The same reload below 2^41 ms of tokens (an hourly rule) reads as full,
/// and a local token_bucket reads the daily one as full: what held.
#[test]
fn smaller_shared_buckets_made_local_read_as_full() {
    for (algorithm, per, limit) in [
        (Algorithm::Gcra, 3_600_000u64, 10_000i128),
        (Algorithm::TokenBucket, 86_400_000, 100_000),
    ] {
        let server = RedisServer::start();
        let runtime = runtime();
        let clock = Arc::new(ManualClock::new(1_764_460_800_000 + 7));
        let (_, store) = connect(&server, &runtime);
        let store = store
            .with_time(TimeSource::Client(clock.clone()))
            .with_regions(three_regions());
        let shared = [bucket_rule(
            algorithm,
            (limit, per, limit),
            RegionScope::Shared,
        )];
        let decide = |rules: &[BoundRule]| {
            runtime
                .block_on(store.decide(&Batch::new("tenant", None, 1, rules)))
                .unwrap()
                .outcomes[0]
                .allowed
        };
        assert!(decide(&shared));
        let local = [bucket_rule(
            algorithm,
            (limit, per, limit),
            RegionScope::Local,
        )];
        let admitted = (0..100).filter(|_| decide(&local)).count();
        assert_eq!(admitted, 100, "{algorithm:?} per {per}");
    }
}

/// The key's expiry, as the scripts set it. Region a (a share of 10/s of
/// 30/s and a burst of 300: 100 at once) grants 9/s away: it keeps 1/s
/// and 10 at once, full. Its record goes idle at the epoch's end (the key
/// expires a SLACK of 1 s later), but a kept record reads as a fresh one
/// only once it has refilled from 10 to 100 at its share's 10/s: 9 s
/// after the epoch's end. Until then, an expired key is 90 units too many.
#[test]
fn a_giver_key_lives_until_its_record_reads_as_fresh() {
    let server = RedisServer::start();
    let runtime = runtime();
    let (keys, store) = connect(&server, &runtime);
    let store = store.with_regions(three_regions());
    let per = 1_000;
    let rules = [bucket_rule(
        Algorithm::Gcra,
        (30, per, 300),
        RegionScope::Shared,
    )];
    let batch = Batch::new("tenant", None, 1, &rules);
    let mut connection = runtime
        .block_on(server.client().get_multiplexed_async_connection())
        .unwrap();
    let (s, us): (u64, u64) = runtime
        .block_on(redis::cmd("TIME").query_async(&mut connection))
        .unwrap();
    let now = s * 1_000 + us / 1_000;
    let e = epoch(per);
    let start = window_of(now, e);
    assert!(runtime.block_on(store.decide(&batch)).unwrap().outcomes[0].allowed);
    let buckets =
        sluice_store::redis::KeySet::keys(&keys.current, &batch, sluice_store::redis::Valve::WHOLE);
    let shared = Shared {
        key: buckets.keys[0].clone(),
        record: buckets.records[0],
        per_ms: per,
        kind: Kind::of(&rules[0]),
        max_debt: 0,
        previous: None,
    };
    let identity = identity_key("sl");
    let received = received_key("sl");
    announce(&runtime, &mut connection, &identity);
    let time = TimeSource::Server;
    let steps = Steps {
        time: &time,
        regions: 3,
        own: Some(Own {
            received: &received,
            identity: (&identity, "it"),
        }),
    };
    let granted: i64 = runtime
        .block_on(
            shared
                .grant_call(steps, 10, (start, 1, 9))
                .invoke_async(&mut connection),
        )
        .unwrap();
    assert_eq!(
        granted, 9,
        "granted in the epoch of {start} (crossed an epoch?)"
    );
    let expires: u64 = runtime
        .block_on(
            redis::cmd("PEXPIRETIME")
                .arg(&shared.key)
                .query_async(&mut connection),
        )
        .unwrap();
    let fresh_at = start + e + 9_000;
    assert!(
        expires >= fresh_at,
        "the giver's key expires at {expires} ({} ms after the epoch's end); its record reads \
         as a fresh one only at {fresh_at} (9 000 ms after): dropped early, it reads 100 where \
         it holds 10 plus the refill",
        expires - (start + e)
    );
}

/// A shared rule decided by a script (EVALSHA: a Redis without functions)
/// answers as by the function: the shared rules' Lua functions, made on
/// first use in either, are the same.
#[test]
fn shared_rules_decide_alike_by_script_and_by_function() {
    let runtime = runtime();
    let rules = [
        bucket_rule(Algorithm::Gcra, (30, 1_000, 20), RegionScope::Shared),
        window_rule(Algorithm::FixedWindow, (30, 1_000, 0)),
    ];
    let mut answers = Vec::new();
    for scripts in [false, true] {
        let server = RedisServer::start();
        let url = if scripts {
            server.scripts_only_url()
        } else {
            server.url()
        };
        let keys = KeySet {
            current: Keyer::new("sl", &Pepper::parse(&[7u8; 32]).unwrap()),
            previous: None,
        };
        let options = ConnectOptions::with_timeout(Duration::from_secs(5));
        let clock = Arc::new(ManualClock::new(1_764_460_800_000 + 7));
        let store = runtime
            .block_on(RedisStore::connect(&url, keys, &options))
            .unwrap()
            .with_time(TimeSource::Client(clock.clone()))
            .with_regions(three_regions());
        let mut seen = Vec::new();
        for i in 0..40u64 {
            clock.set(1_764_460_800_007 + i * 37);
            let batch = Batch::new("tenant", None, 1 + i % 3, &rules);
            let decided = runtime.block_on(store.decide(&batch)).unwrap();
            seen.push(
                decided
                    .outcomes
                    .iter()
                    .map(|o| (o.allowed, o.remaining, o.retry_after_ms))
                    .collect::<Vec<_>>(),
            );
        }
        answers.push(seen);
    }
    assert!(answers[0].iter().flatten().any(|o| o.0) && answers[0].iter().flatten().any(|o| !o.0));
    assert_eq!(answers[0], answers[1]);
}

/// A shared window of `limit` per `per` ms (aligned, as shared windows
/// are), owing at most `max_debt`.
fn window_rule(algorithm: Algorithm, (limit, per, max_debt): (i128, u64, u64)) -> BoundRule {
    let aligned = algorithm == Algorithm::FixedWindow;
    let rule = Rule::new(algorithm, limit, per, None, aligned)
        .unwrap()
        .with_max_debt(i128::from(max_debt))
        .unwrap();
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

/// A shared rule's debt outlives its window in the store: the key lives
/// until the share has repaid it (on Redis's own clock, in real time; the
/// proptest above moves a hand clock that Redis's expiry never sees).
#[test]
fn a_shared_rules_debt_is_kept_until_repaid() {
    let server = RedisServer::start();
    let runtime = runtime();
    let names = ["a", "b", "c"];
    let in_order: Vec<(&str, u32)> = names.iter().map(|&n| (n, 1)).collect();
    let regions = Arc::new(Regions::new(&in_order, "a", 100).unwrap());
    let (_, store) = connect(&server, &runtime);
    let store = store.with_regions(regions);
    // 30 per 300 ms over three regions: a share of 10 a window.
    let rules = [window_rule(Algorithm::FixedWindow, (30, 300, 1_000))];
    let batch = |cost| Batch::new("tenant", None, cost, &rules);
    let debited = runtime
        .block_on(store.adjust(&batch(200), Change::Debit, None))
        .unwrap();
    assert_eq!(debited.forgiven, 0);
    // Past the window and a second of slack: about five windows repaid
    // of the nineteen owed.
    std::thread::sleep(Duration::from_millis(1_500));
    let decided = runtime.block_on(store.decide(&batch(1))).unwrap();
    assert!(
        !decided.outcomes[0].allowed,
        "the debt was forgotten: {:?}",
        decided.outcomes[0]
    );
}

/// A reload that makes a shared sliding_window local (same name, same
/// record) never admits past the limit in the window of the change: the
/// shared record counts what moved to the region apart (its `net` below
/// 0 when grants went unspent), and reads as spent.
#[test]
fn a_shared_sliding_window_made_local_never_admits_past_its_limit() {
    let server = RedisServer::start();
    let runtime = runtime();
    let clock = Arc::new(ManualClock::new(1_764_460_800_000 + 7));
    let in_order = [("a", 1u32), ("b", 1), ("c", 1)];
    let regions = Arc::new(Regions::new(&in_order, "a", 100).unwrap());
    let (keys, store) = connect(&server, &runtime);
    let time = TimeSource::Client(clock.clone());
    let shared_store = store.with_time(time.clone()).with_regions(regions.clone());
    let shared = [window_rule(Algorithm::SlidingWindow, (30, 60_000, 0))];
    // Region a (share 10) hears 20 granted to it, and admits 5.
    let buckets = KeySet::keys(
        &keys.current,
        &Batch::new("tenant", None, 1, &shared),
        sluice_store::redis::Valve::WHOLE,
    );
    let shared_key = Shared {
        key: buckets.keys[0].clone(),
        record: buckets.records[0],
        per_ms: 60_000,
        kind: Kind::Sliding,
        max_debt: 0,
        previous: None,
    };
    let mut connection = runtime
        .block_on(server.client().get_multiplexed_async_connection())
        .unwrap();
    let identity = identity_key("sl");
    let received = received_key("sl");
    announce(&runtime, &mut connection, &identity);
    let steps = Steps {
        time: &time,
        regions: 3,
        own: Some(Own {
            received: &received,
            identity: (&identity, "it"),
        }),
    };
    let view = Heard {
        cap: 0,
        used: 0,
        wanted: 0,
        heard_from_you: 0,
    };
    let window = window_of(clock.now_ms(), 60_000);
    let hearing = Hearing {
        window,
        pool: 30,
        share: 10,
        from: 1,
        total: 20,
        view,
        yours: 0,
    };
    let added: i64 = runtime
        .block_on(
            shared_key
                .hear_call(steps, &hearing)
                .invoke_async(&mut connection),
        )
        .unwrap();
    assert_eq!(added, 20);
    let batch = Batch::new("tenant", None, 5, &shared);
    assert!(
        runtime
            .block_on(shared_store.decide(&batch))
            .unwrap()
            .outcomes[0]
            .allowed
    );
    // Reloaded as local (limit 30 in this region alone).
    let (_, local_store) = connect(&server, &runtime);
    let local_store = local_store.with_time(time);
    let mut local = window_rule(Algorithm::SlidingWindow, (30, 60_000, 0));
    local = BoundRule::new(
        Scope::Tenant,
        "",
        &NamedRule {
            name: "minute".into(),
            rule: *local.rule(),
            shadow: false,
            count_if: None,
            tolerance: sluice_core::tolerance::Tolerance::EXACT,
            regions: Some(RegionScope::Local),
        },
        0.8,
    );
    let rules = [local];
    let admitted = (0..60)
        .filter(|_| {
            let batch = Batch::new("tenant", None, 1, &rules);
            runtime
                .block_on(local_store.decide(&batch))
                .unwrap()
                .outcomes[0]
                .allowed
        })
        .count();
    assert!(
        5 + admitted <= 30,
        "{} admitted in one window by a rule of 30 in this region",
        5 + admitted
    );
}

/// Writes the identity "it" a shipping checks this region's store has.
fn announce(
    runtime: &tokio::runtime::Runtime,
    connection: &mut redis::aio::MultiplexedConnection,
    identity: &str,
) {
    runtime
        .block_on(
            redis::cmd("SET")
                .arg(identity)
                .arg("it")
                .query_async::<()>(connection),
        )
        .unwrap();
}
