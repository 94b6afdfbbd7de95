//! Edge tests of a `gcra` / `token_bucket` shared across regions, as
//! the scripts run it (`shared_bucket` in regions/shared.lua, code 9) on a
//! real redis-server: the read-only checks, a reload to a local rule, and
//! the key's expiry.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::{NamedRule, RegionScope};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::regions::bucket::epoch;
use sluice_core::regions::stored::window_of;
use sluice_core::{Algorithm, BoundRule, Rule, Scope};
use sluice_store::redis::regions::{Kind, Regions, Shared, Steps, identity_key, received_key};
use sluice_store::{
    Batch, Clock, ConnectOptions, KeySet, ManualClock, RedisStore, Store, TimeSource,
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
/// limit's standing, `sluice inspect`) read a shared bucket as the rule's
/// own gcra at its whole limit: region a (a share of 10 of 30/s) spent, a
/// decision says retry in 100 ms (one unit at 10/s), the peek's rule says
/// a third of that, and admits at a moment where a decision denies.
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
    runtime
        .block_on(
            redis::cmd("SET")
                .arg(&identity)
                .arg("it")
                .query_async::<()>(&mut connection),
        )
        .unwrap();
    let time = TimeSource::Server;
    let steps = Steps {
        time: &time,
        regions: 3,
        received: &received,
        identity: (&identity, "it"),
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
