//! The circuit breaker in front of the store.
//!
//! - **Closed**: every decision calls the store. `failures` consecutive
//!   failures or timeouts open the breaker.
//! - **Open**: no decision calls the store; the failure policy decides. After
//!   `cool_down_ms` the breaker lets one probe through (half-open).
//! - **Half-open**: one decision at a time probes the store; the others use
//!   the failure policy. A failed probe re-opens the breaker for another
//!   cool-down; `probes` successful probes in a row close it.
//!
//! The hysteresis (several failures to open, several successes to close)
//! keeps one slow call from flapping the breaker. The closed path costs one
//! atomic load per decision.
//!
//! A store call the breaker lets through is an [`Attempt`], which the caller
//! finishes with the call's result. An attempt dropped unfinished (the
//! caller's future was dropped at the `.await`: a client hung up, Envoy's
//! filter timed out) says nothing about the store; a probe dropped that way
//! gives its turn back, so the next decision probes. No breaker state
//! depends on a future running to completion.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

/// When the breaker opens and closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Consecutive failures or timeouts that open the breaker.
    pub failures: u32,
    /// How long it stays open before probing, in milliseconds.
    pub cool_down_ms: u64,
    /// Consecutive successful probes that close it.
    pub probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> BreakerConfig {
        BreakerConfig {
            failures: 5,
            cool_down_ms: 1_000,
            probes: 3,
        }
    }
}

/// The breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BreakerState {
    /// The store is called.
    Closed = 0,
    /// The store is not called.
    Open = 1,
    /// One probe at a time calls the store.
    HalfOpen = 2,
}

impl BreakerState {
    fn from_u8(v: u8) -> BreakerState {
        match v {
            1 => BreakerState::Open,
            2 => BreakerState::HalfOpen,
            _ => BreakerState::Closed,
        }
    }

    /// The name used in metrics and `/readyz`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// Whether a decision may call the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Call it (breaker closed).
    Call,
    /// Call it as the half-open probe; report the result with
    /// `probe: true`.
    Probe,
    /// Do not call it: use the failure policy.
    Skip,
}

/// A circuit breaker; see the module documentation.
#[derive(Debug)]
pub struct Breaker {
    config: BreakerConfig,
    state: AtomicU8,
    failures: AtomicU32,
    successes: AtomicU32,
    open_until: AtomicU64,
    probing: AtomicBool,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Breaker {
        Breaker {
            config,
            state: AtomicU8::new(BreakerState::Closed as u8),
            failures: AtomicU32::new(0),
            successes: AtomicU32::new(0),
            open_until: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// The current state.
    pub fn state(&self) -> BreakerState {
        BreakerState::from_u8(self.state.load(Ordering::Acquire))
    }

    /// Whether a decision at `now` (ms) may call the store.
    pub fn permit(&self, now: u64) -> Permit {
        match self.state() {
            BreakerState::Closed => Permit::Call,
            BreakerState::Open => {
                if now < self.open_until.load(Ordering::Acquire) {
                    return Permit::Skip;
                }
                if self.transition(BreakerState::Open, BreakerState::HalfOpen) {
                    self.successes.store(0, Ordering::Release);
                    self.probing.store(false, Ordering::Release);
                }
                self.try_probe()
            }
            BreakerState::HalfOpen => self.try_probe(),
        }
    }

    fn try_probe(&self) -> Permit {
        if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            Permit::Probe
        } else {
            Permit::Skip
        }
    }

    /// The store call a decision at `now` (ms) may make, if any: `None`
    /// when the breaker skips the store.
    pub fn attempt(&self, now: u64) -> Option<Attempt<'_>> {
        match self.permit(now) {
            Permit::Skip => None,
            permit => Some(Attempt {
                breaker: self,
                permit,
                finished: false,
            }),
        }
    }

    /// Reports how a store call that `permit` allowed went. Returns the new
    /// state when this report changed it.
    pub fn record(&self, now: u64, permit: Permit, ok: bool) -> Option<BreakerState> {
        match permit {
            Permit::Skip => None,
            Permit::Call => {
                if ok {
                    if self.failures.load(Ordering::Relaxed) != 0 {
                        self.failures.store(0, Ordering::Relaxed);
                    }
                    return None;
                }
                let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
                if failures >= self.config.failures && self.open(now, BreakerState::Closed) {
                    return Some(BreakerState::Open);
                }
                None
            }
            Permit::Probe => {
                self.probing.store(false, Ordering::Release);
                if !ok {
                    return self
                        .open(now, BreakerState::HalfOpen)
                        .then_some(BreakerState::Open);
                }
                let successes = self.successes.fetch_add(1, Ordering::AcqRel) + 1;
                if successes >= self.config.probes
                    && self.transition(BreakerState::HalfOpen, BreakerState::Closed)
                {
                    self.failures.store(0, Ordering::Release);
                    return Some(BreakerState::Closed);
                }
                None
            }
        }
    }

    fn open(&self, now: u64, from: BreakerState) -> bool {
        self.open_until
            .store(now + self.config.cool_down_ms, Ordering::Release);
        self.transition(from, BreakerState::Open)
    }

    fn transition(&self, from: BreakerState, to: BreakerState) -> bool {
        self.state
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }
}

/// A store call the breaker allowed, held across the call's `.await`.
///
/// [`finish`](Attempt::finish) reports the result. Dropped unfinished, a
/// half-open probe releases its turn (the next decision probes) and a
/// closed-state call reports nothing.
#[derive(Debug)]
#[must_use = "finish the attempt with the store call's result"]
pub struct Attempt<'b> {
    breaker: &'b Breaker,
    permit: Permit,
    finished: bool,
}

impl Attempt<'_> {
    /// Whether this call is the half-open probe.
    pub fn is_probe(&self) -> bool {
        self.permit == Permit::Probe
    }

    /// Reports how the call went at `now`; returns the breaker's new state
    /// when this report changed it.
    pub fn finish(mut self, now: u64, ok: bool) -> Option<BreakerState> {
        self.finished = true;
        self.breaker.record(now, self.permit, ok)
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.finished && self.permit == Permit::Probe {
            self.breaker.probing.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(BreakerConfig {
            failures: 3,
            cool_down_ms: 1_000,
            probes: 2,
        })
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = breaker();
        assert_eq!(b.record(0, Permit::Call, false), None);
        assert_eq!(b.record(0, Permit::Call, false), None);
        assert_eq!(
            b.record(0, Permit::Call, true),
            None,
            "a success resets the count"
        );
        assert_eq!(b.record(0, Permit::Call, false), None);
        assert_eq!(b.record(0, Permit::Call, false), None);
        assert_eq!(b.record(10, Permit::Call, false), Some(BreakerState::Open));
        assert_eq!(b.permit(500), Permit::Skip);
    }

    #[test]
    fn probes_one_at_a_time_after_the_cool_down_and_closes_after_successes() {
        let b = breaker();
        for _ in 0..3 {
            b.record(0, Permit::Call, false);
        }
        assert_eq!(b.permit(999), Permit::Skip);
        assert_eq!(b.permit(1_000), Permit::Probe);
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert_eq!(b.permit(1_000), Permit::Skip, "one probe at a time");
        assert_eq!(b.record(1_001, Permit::Probe, true), None);
        assert_eq!(b.permit(1_002), Permit::Probe);
        assert_eq!(
            b.record(1_003, Permit::Probe, true),
            Some(BreakerState::Closed)
        );
        assert_eq!(b.permit(1_004), Permit::Call);
    }

    #[test]
    fn a_dropped_probe_gives_its_turn_back() {
        let b = breaker();
        for _ in 0..3 {
            b.record(0, Permit::Call, false);
        }
        let probe = b.attempt(1_000).expect("the cool-down is over");
        assert!(probe.is_probe());
        assert!(b.attempt(1_000).is_none(), "one probe at a time");
        drop(probe);
        let probe = b
            .attempt(1_001)
            .expect("the dropped probe released its turn");
        assert_eq!(probe.finish(1_002, true), None);
        let probe = b.attempt(1_003).expect("next probe");
        assert_eq!(probe.finish(1_004, true), Some(BreakerState::Closed));
    }

    #[test]
    fn a_failed_probe_reopens_for_another_cool_down() {
        let b = breaker();
        for _ in 0..3 {
            b.record(0, Permit::Call, false);
        }
        assert_eq!(b.permit(1_000), Permit::Probe);
        assert_eq!(
            b.record(1_010, Permit::Probe, false),
            Some(BreakerState::Open)
        );
        assert_eq!(b.permit(2_009), Permit::Skip);
        assert_eq!(b.permit(2_010), Permit::Probe);
    }
}
