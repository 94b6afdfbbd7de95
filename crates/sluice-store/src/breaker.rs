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
