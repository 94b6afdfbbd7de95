//! Instances of the limiter sharing one memory store (behind the remote
//! path) and one clock driven by hand: the slices' tests' fleet.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_core::config::OnError;
use sluice_core::{Config, Policy, Request, State};
use sluice_store::{Batch, Clock, Limiter, LimiterOptions, ManualClock, MemoryStore};

use super::Remote;

/// Instances sharing one store and one clock.
pub struct Fleet {
    pub clock: Arc<ManualClock>,
    pub store: Arc<MemoryStore>,
    pub calls: Arc<AtomicU64>,
    pub down: Arc<AtomicBool>,
    pub instances: Vec<Limiter<Remote>>,
    pub denial_cache: bool,
    /// Adjustments that still succeed, when counted (see [`Remote`]).
    pub adjusts_left: Option<Arc<AtomicU64>>,
}

impl Fleet {
    pub fn new(yaml: &str, instances: usize) -> Fleet {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let store = Arc::new(MemoryStore::with_clock(100_000, clock.clone()));
        let calls = Arc::new(AtomicU64::new(0));
        let mut fleet = Fleet {
            clock,
            store,
            calls,
            down: Arc::new(AtomicBool::new(false)),
            instances: Vec::new(),
            denial_cache: true,
            adjusts_left: None,
        };
        for _ in 0..instances {
            fleet.start(yaml);
        }
        fleet
    }

    pub fn start(&mut self, yaml: &str) {
        let mut options = LimiterOptions::new(OnError::Deny);
        options.clock = self.clock.clone();
        options.denial_cache = self.denial_cache;
        let remote = Remote {
            calls: self.calls.clone(),
            down: self.down.clone(),
            adjusts_left: self.adjusts_left.clone(),
            ..Remote::new(self.store.clone())
        };
        self.instances
            .push(Limiter::with_options(policy(yaml), remote, options));
    }

    /// Moves the clock to the start of the next aligned window of
    /// `per_ms`.
    pub fn to_next_window(&self, per_ms: u64) {
        let now = self.clock.now_ms();
        self.clock.advance(per_ms - now % per_ms);
    }

    /// Store calls so far (decisions and adjustments).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    pub async fn decide(&self, instance: usize, tenant: &str) -> bool {
        let limiter = &self.instances[instance];
        let policy = limiter.policy();
        let request = Request::new(tenant, "GET /", None, 1).unwrap();
        limiter.decide(&policy, &request).await.allowed
    }

    /// The units instance `instance` holds in slices for `tenant`.
    pub fn held(&self, instance: usize, tenant: &str) -> u64 {
        self.instances[instance]
            .slices_of(tenant)
            .iter()
            .map(|s| s.units)
            .sum()
    }
}

pub fn policy(yaml: &str) -> Policy {
    Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits)
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// The store's fixed window of `tenant`'s first rule under `yaml`: its
/// start and count.
pub fn window_of(fleet: &Fleet, yaml: &str, tenant: &str) -> Option<(u64, u64)> {
    let policy = policy(yaml);
    let rules = policy.applicable(tenant, "GET /", false).rules;
    match fleet
        .store
        .peek_rule(&Batch::new(tenant, None, 1, rules), 0)
    {
        State::FixedWindow(window) => Some((window.start_ms, window.count)),
        _ => None,
    }
}
