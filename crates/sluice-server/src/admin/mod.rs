//! The admin API's state: per-tenant overrides (another plan, limits
//! scaled, rules of their own, shadow mode), each with an optional expiry,
//! applied on top of the configuration's limits.
//!
//! On the memory backend overrides live in this process. On Redis and
//! Redis Cluster they live in Redis (see [`persist`]), so that every
//! instance applies the same ones: a change bumps a version counter, and
//! every instance reads the counter twice a second, reloading the
//! overrides when it moved. A change therefore reaches every instance
//! within one second, and an instance that missed one (restarted, cut off
//! for a while) heals on its next read. Writes are compare-and-set on a
//! per-tenant version (`If-Match`), so concurrent edits cannot silently
//! overwrite each other.

pub mod heavy;
pub mod persist;
mod stored;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sluice_core::Policy;
use sluice_core::config::Limits;
use sluice_core::policy::TenantOverride;
use sluice_store::{Clock, Limiter};

use crate::backend::Backend;
pub use stored::{Shadow, Stored};

/// Why a change was refused.
#[derive(Debug)]
pub enum Refused {
    /// A field is invalid: which, and why.
    Invalid(String, String),
    /// `If-Match` named another version than the stored one.
    Conflict(u64),
    /// No override for the tenant.
    Missing,
    /// The store did not answer.
    Store(String),
}

/// The admin API's state.
#[derive(Debug)]
pub struct Admin {
    token: Option<Vec<u8>>,
    inner: Mutex<State>,
    persist: Option<persist::Persist>,
    /// Decisions per tenant, for heavy hitters (counted only where the
    /// admin API can serve them: a token here, or a shared store).
    heavy: heavy::HeavyHitters,
    /// This instance's name among those publishing heavy hitters.
    instance: String,
    /// The window in which instances gone silent were last forgotten.
    swept: AtomicU64,
    /// The time overrides expire and heavy-hitter windows turn by.
    clock: WallClock,
}

/// The admin API's clock: the wall clock as it reads (override expiries
/// are wall times other instances compare too), or a hand-set one in
/// tests.
#[derive(Clone)]
struct WallClock(Arc<dyn Clock>);

/// The wall clock, read as it is ([`now_ms`]).
struct Wall;

impl Clock for Wall {
    fn now_ms(&self) -> u64 {
        now_ms()
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WallClock")
    }
}

/// One instance's heavy-hitter windows, as published.
#[derive(Debug, Serialize, Deserialize)]
struct Published {
    /// The number of the window `current` counts.
    number: u64,
    previous: heavy::Window,
    current: heavy::Window,
}

#[derive(Debug, Default)]
struct State {
    overrides: BTreeMap<String, Stored>,
    /// The configuration's limits and whether the store shards tenants.
    limits: Option<(Limits, bool)>,
    /// The last version given (memory store).
    version: u64,
    /// What the store said of its overrides when they were last read
    /// (shared stores).
    stamp: persist::Stamp,
}

impl Admin {
    /// The admin API with `token` (`None`: off), persisting overrides in
    /// `backend` when it is shared.
    pub fn new(token: Option<Vec<u8>>, backend: &Backend) -> Admin {
        Admin {
            token,
            inner: Mutex::new(State::default()),
            persist: persist::Persist::for_backend(backend),
            heavy: heavy::HeavyHitters::default(),
            instance: instance_name(),
            swept: AtomicU64::new(0),
            clock: WallClock(Arc::new(Wall)),
        }
    }

    /// The same admin API on `clock` (tests set the time by hand).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Admin {
        self.clock = WallClock(clock);
        self
    }

    /// The admin API's time, in ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.clock.0.now_ms()
    }

    /// An admin API that is off (no token).
    pub fn off() -> Admin {
        Admin {
            token: None,
            inner: Mutex::new(State::default()),
            persist: None,
            heavy: heavy::HeavyHitters::default(),
            instance: instance_name(),
            swept: AtomicU64::new(0),
            clock: WallClock(Arc::new(Wall)),
        }
    }

    /// Counts a decision of `tenant` for heavy hitters.
    pub fn record(&self, tenant: &str, allowed: bool, fair_share_denied: bool) {
        if self.token.is_some() || self.persist.is_some() {
            self.heavy
                .record(tenant, allowed, fair_share_denied, self.now_ms());
        }
    }

    /// The top `limit` tenants `by` a count, over the recent window, this
    /// instance's counts added to every other live instance's on a shared
    /// store.
    pub async fn heavy_hitters(
        &self,
        limiter: &Limiter<Backend>,
        by: heavy::By,
        limit: usize,
    ) -> heavy::Report {
        let now = self.now_ms();
        let (number, previous, current) = self.heavy.snapshot(now);
        let mut windows = vec![previous, current];
        if let Some(persist) = &self.persist {
            match persist.read_heavy::<Published>(limiter.store()).await {
                Ok(published) => {
                    for (instance, p) in published {
                        if instance == self.instance {
                            continue;
                        }
                        if p.number == number {
                            windows.push(p.previous);
                            windows.push(p.current);
                        } else if p.number + 1 == number {
                            windows.push(p.current);
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "other instances' heavy hitters not read; this instance's only")
                }
            }
        }
        heavy::report(&windows, by, limit, now)
    }

    /// Publishes this instance's heavy-hitter windows and, once a window,
    /// forgets those of instances silent for two windows (reading only
    /// which window each last published).
    pub async fn publish_heavy(&self, limiter: &Limiter<Backend>) {
        let Some(persist) = &self.persist else { return };
        let (number, previous, current) = self.heavy.snapshot(self.now_ms());
        let published = Published {
            number,
            previous,
            current,
        };
        let backend = limiter.store();
        if let Err(e) = persist
            .publish_heavy(backend, &self.instance, number, &published)
            .await
        {
            tracing::debug!(error = %e, "heavy hitters not published");
            return;
        }
        if self.swept.swap(number, Ordering::Relaxed) == number {
            return;
        }
        if let Ok(all) = persist.heavy_numbers(backend).await {
            for (instance, last) in all {
                if last + 2 <= number {
                    let _ = persist.forget_heavy(backend, &instance).await;
                }
            }
        }
    }

    /// Whether it answers at all.
    pub fn enabled(&self) -> bool {
        self.token.is_some()
    }

    /// Whether its overrides need keeping in step: the API is on, or they
    /// are shared through the store.
    pub fn needs_sync(&self) -> bool {
        self.enabled() || self.persist.is_some()
    }

    /// Whether `presented` is the token, compared in constant time.
    pub fn authorised(&self, presented: &[u8]) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        let mut differ = u8::from(presented.len() != token.len());
        for (i, byte) in token.iter().enumerate() {
            differ |= byte ^ presented.get(i).copied().unwrap_or(!byte);
        }
        differ == 0
    }

    /// Takes `limits` (the configuration's, just installed in `limiter`)
    /// as the base the overrides apply to, and applies them.
    pub fn install(&self, limiter: &Limiter<Backend>, limits: &Limits, sharded: bool) {
        let mut state = self.inner.lock().expect("admin state");
        state.limits = Some((limits.clone(), sharded));
        if !state.overrides.is_empty() {
            self.apply(limiter, &state);
        }
    }

    /// Applies the current overrides to the running policy.
    fn apply(&self, limiter: &Limiter<Backend>, state: &State) {
        if let Some(policy) = compiled(state, self.now_ms()) {
            let current = limiter.policy();
            limiter.set_policy(policy.sharing_descriptors(&current));
        }
    }

    /// Every override in force: on a shared store, as the store holds
    /// them now (not this instance's copy, which may be half a second
    /// behind, or hold what a store that lost its data no longer has).
    pub async fn list(&self, limiter: &Limiter<Backend>) -> Result<Vec<Stored>, Refused> {
        let stored = match &self.persist {
            Some(persist) => persist
                .read_all(limiter.store())
                .await
                .map_err(persist::store)?,
            None => {
                let state = self.inner.lock().expect("admin state");
                state.overrides.values().cloned().collect()
            }
        };
        let now = self.now_ms();
        let mut live: Vec<Stored> = stored
            .into_iter()
            .filter(|o| o.expires_at_ms.is_none_or(|at| at > now))
            .collect();
        live.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        Ok(live)
    }

    /// The override of `tenant`, if one is in force (on a shared store, as
    /// the store holds it now).
    pub async fn get(
        &self,
        limiter: &Limiter<Backend>,
        tenant: &str,
    ) -> Result<Option<Stored>, Refused> {
        let stored = match &self.persist {
            Some(persist) => persist
                .read_one(limiter.store(), tenant)
                .await
                .map_err(persist::store)?,
            None => {
                let state = self.inner.lock().expect("admin state");
                state.overrides.get(tenant).cloned()
            }
        };
        let now = self.now_ms();
        Ok(stored.filter(|o| o.expires_at_ms.is_none_or(|at| at > now)))
    }

    /// Stores `wanted` (its version ignored) for its tenant, when `expected`
    /// (an `If-Match`) is the stored version or absent.
    pub async fn put(
        &self,
        limiter: &Limiter<Backend>,
        mut wanted: Stored,
        expected: Option<u64>,
    ) -> Result<Stored, Refused> {
        let limits = {
            let state = self.inner.lock().expect("admin state");
            state.limits.as_ref().map(|(l, _)| l.clone())
        };
        if let Some(limits) = &limits {
            wanted
                .compile(limits)
                .map_err(|(field, why)| Refused::Invalid(field, why))?;
        }
        match &self.persist {
            Some(persist) => {
                let version = persist
                    .write(limiter.store(), &wanted.tenant, Some(&wanted), expected)
                    .await?;
                wanted.version = version;
                self.sync(limiter, true).await;
            }
            None => {
                let mut state = self.inner.lock().expect("admin state");
                let stored = state.overrides.get(&wanted.tenant).map_or(0, |o| o.version);
                if let Some(expected) = expected
                    && expected != stored
                {
                    return Err(Refused::Conflict(stored));
                }
                state.version += 1;
                wanted.version = state.version;
                state
                    .overrides
                    .insert(wanted.tenant.clone(), wanted.clone());
                self.apply(limiter, &state);
            }
        }
        tracing::info!(
            target: "sluice::audit",
            by = "admin token",
            action = "put",
            tenant = %wanted.tenant,
            version = wanted.version,
            change = %serde_json::to_string(&wanted).unwrap_or_default(),
            "override stored"
        );
        Ok(wanted)
    }

    /// Removes `tenant`'s override.
    pub async fn delete(
        &self,
        limiter: &Limiter<Backend>,
        tenant: &str,
        expected: Option<u64>,
    ) -> Result<(), Refused> {
        match &self.persist {
            Some(persist) => {
                // The store says whether there is one to remove.
                persist
                    .write(limiter.store(), tenant, None, expected)
                    .await?;
                self.sync(limiter, true).await;
            }
            None => {
                if self.get(limiter, tenant).await?.is_none() {
                    return Err(Refused::Missing);
                }
                let mut state = self.inner.lock().expect("admin state");
                let stored = state.overrides.get(tenant).map_or(0, |o| o.version);
                if let Some(expected) = expected
                    && expected != stored
                {
                    return Err(Refused::Conflict(stored));
                }
                state.overrides.remove(tenant);
                state.version += 1;
                self.apply(limiter, &state);
            }
        }
        tracing::info!(target: "sluice::audit", by = "admin token", action = "delete", tenant = %tenant, "override removed");
        Ok(())
    }

    /// Reads the overrides from the store when their version moved (or
    /// when `force`d), drops expired ones, and applies what changed.
    pub async fn sync(&self, limiter: &Limiter<Backend>, force: bool) {
        let Some(persist) = &self.persist else {
            let mut state = self.inner.lock().expect("admin state");
            let now = self.now_ms();
            let before = state.overrides.len();
            state
                .overrides
                .retain(|_, o| o.expires_at_ms.is_none_or(|at| at > now));
            if state.overrides.len() != before {
                self.apply(limiter, &state);
            }
            return;
        };
        let known = self.inner.lock().expect("admin state").stamp;
        let stamp = match persist.stamp(limiter.store()).await {
            Ok(stamp) => stamp,
            Err(e) => {
                tracing::debug!(error = ?e, "overrides not synchronised");
                return;
            }
        };
        let drift = stamp.against(known);
        match drift {
            persist::Drift::CounterGone => tracing::error!(
                "the store lost the overrides: their change counter is gone (FLUSHALL, a restart without persistence?); reading them again"
            ),
            persist::Drift::Lost => tracing::error!(
                "the store lost the overrides: it holds fewer than it did at the same change counter (lost, then changed as many times since?); reading them again"
            ),
            persist::Drift::CounterBack => tracing::warn!(
                known = known.version,
                now = stamp.version,
                "the overrides' change counter went backwards (a failover to a replica behind?); reading them again"
            ),
            persist::Drift::Same | persist::Drift::Changed => {}
        }
        let expiring = {
            let state = self.inner.lock().expect("admin state");
            let now = self.now_ms();
            state
                .overrides
                .values()
                .any(|o| o.expires_at_ms.is_some_and(|at| at <= now))
        };
        if drift == persist::Drift::Same && !force && !expiring {
            return;
        }
        let overrides = match persist.read_all(limiter.store()).await {
            Ok(overrides) => overrides,
            Err(e) => {
                tracing::warn!(error = ?e, "overrides not read; the previous ones stay in force");
                return;
            }
        };
        // Expired ones are removed from the store (each only if unchanged
        // since it was read: a new `PUT` meanwhile wins; of several
        // instances, one removes it and the others are told it changed).
        // Kept, they would stay there for good, and keep every instance
        // reading every override on each tick.
        let now = self.now_ms();
        let (live, expired): (Vec<Stored>, Vec<Stored>) = overrides
            .into_iter()
            .partition(|o| o.expires_at_ms.is_none_or(|at| at > now));
        for gone in &expired {
            let removed = persist
                .expire(limiter.store(), &gone.tenant, gone.version)
                .await;
            if removed.is_ok() {
                tracing::info!(
                    target: "sluice::audit",
                    by = "expiry",
                    action = "delete",
                    tenant = %gone.tenant,
                    version = gone.version,
                    "override expired and removed"
                );
            }
        }
        let mut state = self.inner.lock().expect("admin state");
        state.stamp = stamp;
        let before = state.overrides.len();
        state.overrides = live.into_iter().map(|o| (o.tenant.clone(), o)).collect();
        if matches!(drift, persist::Drift::CounterGone | persist::Drift::Lost) {
            tracing::error!(
                before,
                now = state.overrides.len(),
                "overrides in force after the store's loss: PUT again those that should be"
            );
        }
        self.apply(limiter, &state);
    }
}

/// The policy of `state`'s limits with the overrides in force at `now`
/// (`None` before any limits were installed).
fn compiled(state: &State, now: u64) -> Option<Policy> {
    let (limits, sharded) = state.limits.as_ref()?;
    let active: Vec<(String, TenantOverride)> = state
        .overrides
        .values()
        .filter(|o| o.expires_at_ms.is_none_or(|at| at > now))
        .filter_map(|o| o.compile(limits).ok().map(|c| (o.tenant.clone(), c)))
        .collect();
    let refs: Vec<(&str, &TenantOverride)> = active.iter().map(|(t, o)| (t.as_str(), o)).collect();
    Some(Policy::compile_overridden(limits, *sharded, &refs))
}

/// A random name for this instance.
fn instance_name() -> String {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the admin token. Errors name where it was looked for, never its
/// value.
pub fn read_token(source: &sluice_core::config::SecretSource) -> crate::Fallible<Vec<u8>> {
    use sluice_core::config::SecretSource;
    let token = match source {
        SecretSource::Env(name) => std::env::var(name).map_err(|_| {
            format!("admin.token_env names the environment variable {name}, which is not set")
        })?,
        SecretSource::File(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read admin.token_file {}: {e}", path.display()))?,
    };
    let token = token.trim();
    if token.len() < 16 {
        return Err("the admin token must be at least 16 characters (generate one with `openssl rand -hex 32`)".into());
    }
    Ok(token.as_bytes().to_vec())
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
