//! Adaptive valves in the limiter (appendix I; the law and priorities are
//! `sluice_core::adaptive`).
//!
//! - Each decision enforces every adaptive valve among its rules at the
//!   valve's effective limit `L` as last stepped, times its request's
//!   priority's share ([`Adaptives::retuned`]): `⌊L × share⌋`, at least 1.
//! - What a decision tells (a valve that denied: it is full) and what the
//!   caller reports of the downstream ([`Limiter::observe`]: a request's
//!   latency, and its status when known) are gathered per valve.
//! - Every 100 ms at most, an instance steps each valve's law with what it
//!   gathered: in the valve's own key on a shared store
//!   ([`Store::adapt`]), so every instance reads one `L`; here, for a
//!   store in this process. A step that fails keeps what it carried for
//!   the next.

use std::hash::BuildHasherDefault;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use sluice_core::adaptive::law::{FORGET_MS, Law, Seen};
use sluice_core::adaptive::{Adaptive, AdaptiveValve, Priority};
use sluice_core::policy::Applicable;
use sluice_core::{BoundRule, Decision, Policy, Request};
use smallvec::SmallVec;

use super::Limiter;
use crate::bucket::PassThrough;
use crate::store::Store;

/// How often an instance steps a valve's law, at most (ms).
const STEP_EVERY_MS: u64 = 100;

/// Each adaptive valve as this instance knows it, by the valve's uid.
#[derive(Default)]
pub(crate) struct Adaptives {
    valves: papaya::HashMap<u64, Arc<Valve>, BuildHasherDefault<PassThrough>>,
}

/// One adaptive valve.
struct Valve {
    /// The valve's name, for metrics.
    name: Arc<str>,
    /// Its effective limit as last stepped (0: not stepped yet; its limit).
    effective: AtomicU64,
    /// What was seen since the last step.
    seen: parking_lot::Mutex<Seen>,
    /// When this instance last stepped it (ms).
    stepped_at: AtomicU64,
    /// Whether a step is under way.
    stepping: AtomicBool,
    /// The law, for a store that keeps none (in this process).
    law: parking_lot::Mutex<Law>,
    /// The valve's rule and terms as last observed, for a refresh.
    terms: parking_lot::Mutex<Option<(BoundRule, Adaptive)>>,
    /// The latency estimate as last stepped, for metrics (f64 bits).
    latency_ms: AtomicU64,
    /// Requests the valve denied, by priority (lowest first).
    shed: [AtomicU64; 4],
}

/// What the metrics show of one adaptive valve.
#[derive(Debug, Clone)]
pub struct AdaptiveLevel {
    /// The valve rule's name.
    pub valve: Arc<str>,
    /// Its effective limit.
    pub effective_limit: u64,
    /// Its downstream's latency as the law last estimated it (ms; 0 when
    /// nothing was seen yet).
    pub latency_ms: f64,
    /// Requests it denied here, by priority.
    pub shed: [(Priority, u64); 4],
}

/// Clears a valve's step under way when dropped (a caller gone mid-step
/// leaves the valve steppable).
struct Stepping<'a>(&'a AtomicBool);

impl Drop for Stepping<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Adaptives {
    fn valve(&self, rule: &BoundRule) -> Arc<Valve> {
        let valves = self.valves.pin();
        if let Some(valve) = valves.get(&rule.uid()) {
            return valve.clone();
        }
        valves
            .get_or_insert_with(rule.uid(), || {
                Arc::new(Valve {
                    name: rule.name().into(),
                    effective: AtomicU64::new(0),
                    seen: parking_lot::Mutex::default(),
                    stepped_at: AtomicU64::new(0),
                    stepping: AtomicBool::new(false),
                    law: parking_lot::Mutex::default(),
                    terms: parking_lot::Mutex::default(),
                    latency_ms: AtomicU64::new(0),
                    shed: Default::default(),
                })
            })
            .clone()
    }

    /// `rules` (those of `applicable`) with each adaptive valve's limit
    /// set for the request's priority; `None` when none is adaptive.
    pub(crate) fn retuned(
        &self,
        applicable: &Applicable<'_>,
        rules: &[BoundRule],
        now: u64,
    ) -> Option<SmallVec<[BoundRule; 6]>> {
        if applicable.adaptive.is_empty() {
            return None;
        }
        let mut retuned: SmallVec<[BoundRule; 6]> = rules.iter().cloned().collect();
        for &AdaptiveValve { index, terms } in applicable.adaptive {
            let Some(rule) = retuned.get(index) else {
                continue;
            };
            let limit = rule.rule().limit();
            let valve = self.valve(rule);
            {
                // Known for a refresh from its first decision on (its
                // observations keep it current).
                let mut known = valve.terms.lock();
                if known.is_none() {
                    *known = Some((rule.clone(), terms));
                }
            }
            // Not stepped for as long as the law is kept: its limit is
            // as forgotten as the law (a valve made adaptive again).
            let stale = now.saturating_sub(valve.stepped_at.load(Ordering::Relaxed)) > FORGET_MS;
            let effective = match valve.effective.load(Ordering::Relaxed) {
                0 => limit,
                _ if stale => limit,
                known => known.clamp(terms.min.clamp(1, limit), limit),
            };
            let own = ((effective as f64 * applicable.priority.share()).floor() as u64).max(1);
            if own == limit {
                continue;
            }
            // (Half a unit up: the scaling floors, and must not lose one.)
            let factor = (own as f64 + 0.5) / limit as f64;
            if let Ok(scaled) = rule.rule().scaled(factor) {
                retuned[index] = rule.with_rule(scaled);
            }
        }
        Some(retuned)
    }

    /// What `decision` tells of its adaptive valves: one that denied is
    /// full (the law may grow it), and shed a request of its priority.
    pub(crate) fn learn(&self, applicable: &Applicable<'_>, decision: &Decision<'_>) {
        for &AdaptiveValve { index, .. } in applicable.adaptive {
            let denied = decision.outcome(index).is_some_and(|o| !o.allowed);
            if denied && let Some(rule) = applicable.rules.get(index) {
                let valve = self.valve(rule);
                valve.seen.lock().full = true;
                let p = Priority::ALL
                    .iter()
                    .position(|&p| p == applicable.priority)
                    .unwrap_or(0);
                valve.shed[p].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Every adaptive valve this instance knows.
    pub(crate) fn levels(&self) -> Vec<AdaptiveLevel> {
        self.valves
            .pin()
            .values()
            .map(|valve| AdaptiveLevel {
                valve: valve.name.clone(),
                effective_limit: valve.effective.load(Ordering::Relaxed),
                latency_ms: f64::from_bits(valve.latency_ms.load(Ordering::Relaxed)),
                shed: std::array::from_fn(|p| {
                    (Priority::ALL[p], valve.shed[p].load(Ordering::Relaxed))
                }),
            })
            .collect()
    }
}

impl<S: Store> Limiter<S> {
    /// What a request's downstream showed, reported by the caller (a
    /// settle, a report, a release, the tower layer timing its inner
    /// service): it took `latency_ms`, and answered `status` when known
    /// (5xx and 429 count as failures). Gathered for each adaptive valve
    /// the request's rules hold; a valve due for a step (every 100 ms at
    /// most) is stepped now, within the time budget.
    pub async fn observe(
        &self,
        policy: &Policy,
        request: &Request<'_>,
        latency_ms: f64,
        status: Option<u16>,
    ) {
        let applicable =
            policy.applicable(request.tenant, request.route, request.subject.is_some());
        if applicable.adaptive.is_empty() {
            return;
        }
        let failed = status.is_some_and(|s| s >= 500 || s == 429);
        let now = self.options.clock.now_ms();
        for &AdaptiveValve { index, terms } in applicable.adaptive {
            let Some(rule) = applicable.rules.get(index) else {
                continue;
            };
            let valve = self.adaptive.valve(rule);
            valve.seen.lock().request(latency_ms, failed);
            *valve.terms.lock() = Some((rule.clone(), terms));
            self.step(&valve, rule, terms, now).await;
        }
    }

    /// Steps every adaptive valve this instance has observed and not
    /// stepped for 100 ms, with whatever it saw since (perhaps nothing):
    /// an instance that decides but hears no signal still reads the law
    /// every instance steps. `sluice serve` calls it every 100 ms; the
    /// tower layer observes every request it passes.
    pub async fn refresh_adaptive(&self) {
        let now = self.options.clock.now_ms();
        let valves: Vec<Arc<Valve>> = self.adaptive.valves.pin().values().cloned().collect();
        for valve in valves {
            let known = valve.terms.lock().clone();
            if let Some((rule, terms)) = known {
                self.step(&valve, &rule, terms, now).await;
            }
        }
    }

    /// Steps `valve`'s law with what was seen, when it is due.
    async fn step(&self, valve: &Valve, rule: &BoundRule, terms: Adaptive, now: u64) {
        // (A step "after" now: the clock stepped back; due.)
        let since = now.checked_sub(valve.stepped_at.load(Ordering::Relaxed));
        if since.is_some_and(|ms| ms < STEP_EVERY_MS) || valve.stepping.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let _stepping = Stepping(&valve.stepping);
        valve.stepped_at.store(now, Ordering::Relaxed);
        let seen = std::mem::take(&mut *valve.seen.lock());
        let limit = rule.rule().limit();
        let law = match self.store.adapt(rule, terms, seen).await {
            Ok(Some(law)) => law,
            Ok(None) => {
                let mut law = valve.law.lock();
                *law = law.step(now, seen, limit, terms);
                *law
            }
            Err(error) => {
                tracing::debug!(%error, "an adaptive valve's law could not be stepped; kept for the next step");
                valve.seen.lock().merge(seen);
                return;
            }
        };
        valve
            .latency_ms
            .store(law.latency_ms.to_bits(), Ordering::Relaxed);
        valve
            .effective
            .store(law.effective(limit, terms), Ordering::Relaxed);
    }
}
