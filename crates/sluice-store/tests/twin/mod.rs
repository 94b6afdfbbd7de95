//! A store that is two: the memory store and a Redis store (one node or a
//! cluster) on one hand-set clock. Every call a limiter makes of it is made
//! of both; their answers, and the states they leave (read back at once
//! from both), must be the same, and the first difference is kept with the
//! call that made it. The limiter goes on with the memory store's answer,
//! so everything above the store (fair valves' gates re-rated on every
//! decision, slices' takes and give-backs) runs once, and only the stores
//! are compared: the Lua scripts against their Rust twins, on the batches
//! the limiter really sends.
//!
//! On Redis Cluster a decision with a valve is two calls: the tenant's
//! slot first, then the valve's only if the first admitted, and the first
//! given back (`refund.lua`) when the valve denies. The memory side is then
//! decided the same way (`MemoryStore::refund` for the give-back), so that
//! what is compared is the scripts, not the protocol. The protocol is not
//! the one call's twin, and compared with it would fail: the give-back
//! leaves the tenant's states dated at the denied decision (a `gcra` TAT
//! at least then, which a clock stepped back an hour afterwards reads as
//! exhausted; a gate's tokens refilled up to then at that decision's
//! rate), where one atomic call leaves them as they were.

// Each test file uses part of it.
#![allow(dead_code)]

use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, TestCaseError, TestRunner};
use sluice_core::decision::Outcomes;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{BoundRule, Outcome, Rule, State};
use sluice_store::{
    Adjusted, Batch, Change, Clock, ClusterStore, ConnectOptions, Decided, KeySet, ManualClock,
    Marker, MemoryStore, Partition, Peeked, RedisStore, Store, StoreError, TimeSource,
};

/// One call made of both stores, as the memory store answered it.
#[derive(Debug, Clone)]
pub struct Call {
    pub rules: Vec<BoundRule>,
    /// Per rule, the units it was asked for.
    pub costs: Vec<u64>,
    /// `None` for a decision.
    pub change: Option<Change>,
    pub outcomes: Outcomes,
    /// Whether the call changed a rule's state (on the memory store).
    pub changed: bool,
}

/// What the twin saw.
#[derive(Debug, Default)]
pub struct Log {
    pub calls: Vec<Call>,
    /// The first difference, with the call that made it.
    pub diverged: Option<String>,
}

/// See the module documentation.
pub struct Twin<S> {
    pub memory: Arc<MemoryStore>,
    pub remote: Arc<S>,
    clock: Arc<ManualClock>,
    /// Decided as Redis Cluster decides a valve: see the module
    /// documentation.
    cluster: bool,
    log: Arc<Mutex<Log>>,
}

impl<S> Clone for Twin<S> {
    fn clone(&self) -> Twin<S> {
        Twin {
            memory: self.memory.clone(),
            remote: self.remote.clone(),
            clock: self.clock.clone(),
            cluster: self.cluster,
            log: self.log.clone(),
        }
    }
}

/// Keys under `prefix`: a case of its own on a Redis shared between
/// cases (a valve's key names no tenant).
fn keys(prefix: &str) -> KeySet {
    KeySet {
        current: Keyer::new(prefix, &Pepper::parse(&[7u8; 32]).unwrap()),
        previous: None,
    }
}

/// The memory store and the Redis at `url`, keys under `prefix`, on
/// `clock`.
pub async fn on_redis(url: &str, prefix: &str, clock: &Arc<ManualClock>) -> Twin<RedisStore> {
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let redis = RedisStore::connect(url, keys(prefix), &options)
        .await
        .unwrap()
        .with_time(TimeSource::Client(clock.clone()));
    Twin::new(redis, clock, false)
}

/// The memory store and the Redis Cluster at `urls` (valves kept whole),
/// keys under `prefix`, on `clock`.
pub async fn on_cluster(
    urls: &[String],
    prefix: &str,
    clock: &Arc<ManualClock>,
) -> Twin<ClusterStore> {
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let cluster = ClusterStore::connect(urls, keys(prefix), &options, 1)
        .await
        .unwrap()
        .with_time(TimeSource::Client(clock.clone()));
    Twin::new(cluster, clock, true)
}

/// Runs `cases` cases of `strategy` (regressions kept beside `source`,
/// the caller's `file!()`): each with a clock of its own, from a start
/// of its own, and a twin `connect` makes on it with keys under a prefix
/// of its own (which also names the case), run by `run`.
pub fn run_cases<V: Debug, S: Store, C, R>(
    source: &'static str,
    cases: u32,
    strategy: impl Strategy<Value = V>,
    connect: impl Fn(String, Arc<ManualClock>) -> C,
    run: impl Fn(Twin<S>, Arc<ManualClock>, String, V) -> R,
) where
    C: Future<Output = Twin<S>>,
    R: Future<Output = Result<(), TestCaseError>>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(ProptestConfig {
        cases,
        source_file: Some(source),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    });
    let start = prop_oneof![
        Just(1_764_460_800_000u64),
        1_700_000_000_000u64..1_800_000_000_000
    ];
    let case = std::cell::Cell::new(0);
    runner
        .run(&(start, strategy), |(start, value)| {
            let clock = Arc::new(ManualClock::new(start));
            case.set(case.get() + 1);
            let prefix = format!("c{}", case.get());
            let twin = runtime.block_on(connect(prefix.clone(), clock.clone()));
            runtime.block_on(run(twin, clock, prefix, value))
        })
        .unwrap();
}

impl<S: Store> Twin<S> {
    /// `remote` beside a new memory store, both on `clock` (`remote` told
    /// the time by it); `cluster` when `remote` is a Redis Cluster.
    pub fn new(remote: S, clock: &Arc<ManualClock>, cluster: bool) -> Twin<S> {
        Twin {
            memory: Arc::new(MemoryStore::with_clock(100_000, clock.clone())),
            remote: Arc::new(remote),
            clock: clock.clone(),
            cluster,
            log: Arc::default(),
        }
    }

    /// The first difference found, if any.
    pub fn diverged(&self) -> Option<String> {
        self.log.lock().unwrap().diverged.clone()
    }

    /// Every call made so far.
    pub fn calls(&self) -> Vec<Call> {
        self.log.lock().unwrap().calls.clone()
    }

    /// Keeps the first difference between `memory` and `remote`.
    fn same<T: PartialEq + Debug>(&self, what: &str, batch: &Batch<'_>, memory: &T, remote: &T) {
        if memory == remote {
            return;
        }
        let mut log = self.log.lock().unwrap();
        if log.diverged.is_none() {
            log.diverged = Some(format!(
                "{what} at {} differs ({} calls before)\n  memory: {memory:?}\n  remote: {remote:?}\n  batch: {}",
                self.clock.now_ms(),
                log.calls.len(),
                describe(batch)
            ));
        }
    }

    fn record(
        &self,
        batch: &Batch<'_>,
        change: Option<Change>,
        outcomes: &Outcomes,
        changed: bool,
    ) {
        let call = Call {
            rules: batch.rules.to_vec(),
            costs: (0..batch.rules.len()).map(|i| batch.cost_of(i)).collect(),
            change,
            outcomes: outcomes.clone(),
            changed,
        };
        self.log.lock().unwrap().calls.push(call);
    }

    /// Every rule's state on both stores, read now, compared (a state as
    /// good as fresh counts as fresh: Redis lets such a key expire, on its
    /// own clock).
    async fn same_states(&self, what: &str, batch: &Batch<'_>) -> Vec<State> {
        let memory = self.memory.peek_now(batch);
        let remote = match self.remote.peek(batch).await {
            Ok(peeked) => peeked,
            Err(e) => {
                self.same(what, batch, &"a peek", &format!("{e}").as_str());
                return settled(&memory);
            }
        };
        let (memory, remote) = (settled(&memory), settled(&remote));
        self.same(&format!("{what}: the states"), batch, &memory, &remote);
        memory
    }

    /// `batch` decided on the memory store as the remote store decides
    /// it: at once, or on Redis Cluster in two calls (see the module
    /// documentation).
    fn decide_on_memory(&self, batch: &Batch<'_>) -> Result<Outcomes, StoreError> {
        let valve = |i: usize| batch.partition(i, &batch.rules[i]) == Partition::Global;
        let n = batch.rules.len();
        let (first, valves): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| !valve(i));
        if !self.cluster || first.is_empty() || valves.is_empty() {
            return self.memory.decide_now(batch);
        }
        let part = |indices: &[usize]| {
            let rules: Vec<BoundRule> = indices.iter().map(|&i| batch.rules[i].clone()).collect();
            let costs: Vec<u64> = indices
                .iter()
                .map(|&i| batch.costs.get(i).copied().unwrap_or(batch.cost))
                .collect();
            let partitions: Vec<Partition<'_>> = indices
                .iter()
                .filter_map(|&i| batch.partitions.get(i).copied())
                .collect();
            (rules, costs, partitions)
        };
        let of = |rules, costs, partitions| Batch {
            rules,
            costs,
            partitions,
            ..*batch
        };
        let mut outcomes: Outcomes = (0..n).map(|_| Outcome::default()).collect();
        let (rules, costs, partitions) = part(&first);
        let tenant = of(&rules, &costs, &partitions);
        let decided = self.memory.decide_now(&tenant)?;
        let admitted = |rules: &[BoundRule], outcomes: &Outcomes| {
            rules
                .iter()
                .zip(outcomes)
                .all(|(r, o)| o.allowed || r.shadow())
        };
        let tenant_admitted = admitted(&rules, &decided);
        for (&i, o) in first.iter().zip(&decided) {
            outcomes[i] = *o;
        }
        let (valve_rules, valve_costs, valve_partitions) = part(&valves);
        if !tenant_admitted {
            // The valves are not asked: they report their capacity.
            for (&i, rule) in valves.iter().zip(&valve_rules) {
                let parts = self.remote.valve_parts();
                let capacity = rule.rule().share(rule.rule().shares(parts)).capacity();
                outcomes[i] = Outcome {
                    allowed: true,
                    remaining: u32::try_from(capacity).unwrap_or(u32::MAX),
                    ..Outcome::default()
                };
            }
            return Ok(outcomes);
        }
        let valve_batch = of(&valve_rules, &valve_costs, &valve_partitions);
        let valve_decided = self.memory.decide_now(&valve_batch)?;
        if !admitted(&valve_rules, &valve_decided) {
            self.memory.refund(&tenant, self.clock.now_ms());
        }
        for (&i, o) in valves.iter().zip(&valve_decided) {
            outcomes[i] = *o;
        }
        Ok(outcomes)
    }
}

/// Each row's state, fresh when it is as good as fresh at the time read.
fn settled(peeked: &Peeked) -> Vec<State> {
    peeked
        .rows
        .iter()
        .map(|row| settle(&row.enforced, &row.state, peeked.now))
        .collect()
}

fn settle(rule: &Rule, state: &State, now: u64) -> State {
    if *state != State::Fresh && rule.idle_at(state) <= now {
        State::Fresh
    } else {
        state.clone()
    }
}

/// What a difference is reported with.
fn describe(batch: &Batch<'_>) -> String {
    let rules: Vec<String> = batch
        .rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            format!(
                "{} ({:?}, cost {}): {:?}",
                r.name(),
                r.scope(),
                batch.cost_of(i),
                r.rule()
            )
        })
        .collect();
    format!(
        "tenant {} subject {:?} shard {} whole_at {:?}\n    {}",
        batch.tenant,
        batch.subject,
        batch.shard,
        batch.whole_at,
        rules.join("\n    ")
    )
}

impl<S: Store> Store for Twin<S> {
    async fn decide(&self, batch: &Batch<'_>) -> Result<Decided, StoreError> {
        let before = settled(&self.memory.peek_now(batch));
        let at_ms = self.clock.now_ms();
        let outcomes = self.decide_on_memory(batch)?;
        match self.remote.decide(batch).await {
            Ok(remote) => {
                self.same("a decision", batch, &outcomes, &remote.outcomes);
                self.same("a decision's time", batch, &at_ms, &remote.at_ms);
            }
            Err(e) => self.same("a decision", batch, &"an answer", &format!("{e}").as_str()),
        }
        let after = self.same_states("after a decision", batch).await;
        self.record(batch, None, &outcomes, before != after);
        Ok(Decided {
            outcomes,
            at_ms,
            first_shard_at_ms: None,
        })
    }

    async fn release(&self, batch: &Batch<'_>) -> Result<bool, StoreError> {
        let memory = self.memory.release_now(batch);
        let remote = self.remote.release(batch).await.map_err(|e| e.to_string());
        self.same("a release", batch, &Ok(memory), &remote);
        Ok(memory)
    }

    async fn peek(&self, batch: &Batch<'_>) -> Result<Peeked, StoreError> {
        self.same_states("a peek", batch).await;
        Ok(self.memory.peek_now(batch))
    }

    async fn adjust(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> Result<Adjusted, StoreError> {
        let before = settled(&self.memory.peek_now(batch));
        let memory = self.memory.adjust_now(batch, change, marker)?;
        match self.remote.adjust(batch, change, marker).await {
            Ok(remote) => {
                let answer = |a: &Adjusted| (a.marker, a.forgiven, a.outcomes.clone());
                self.same("an adjustment", batch, &answer(&memory), &answer(&remote));
            }
            Err(e) => self.same(
                "an adjustment",
                batch,
                &"an answer",
                &format!("{e}").as_str(),
            ),
        }
        let after = self.same_states("after an adjustment", batch).await;
        self.record(batch, Some(change), &memory.outcomes, before != after);
        Ok(memory)
    }

    fn valve_parts(&self) -> u64 {
        self.remote.valve_parts()
    }
}
