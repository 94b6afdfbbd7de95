//! A rule's `tolerance`: how much over its limit the fleet may admit in
//! one of its windows so that a hot key can be decided from local slices
//! (see `sluice_store::limiter::slice` for the mechanism and the argument
//! that bounds it).
//!
//! Kept as parts per million, so that `"0.5%"` is exact and the arithmetic
//! stays on integers.

use std::fmt;

use crate::rule::Algorithm;

/// The largest tolerance a rule may declare: 10 %.
pub const MAX_PPM: u32 = 100_000;

/// The smallest slice: two requests of one unit (a slice that would not
/// hold two is never taken, see `sluice_store::limiter::slice`).
pub const MIN_SLICE: u64 = 2;

/// A rule's tolerance; [`Tolerance::EXACT`] (the default) keeps every
/// decision exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Tolerance {
    ppm: u32,
}

impl Tolerance {
    /// No tolerance: every decision is one store call.
    pub const EXACT: Tolerance = Tolerance { ppm: 0 };

    /// A tolerance of `fraction` (`0.01` for 1 %), rounded down to a part
    /// per million; `None` outside `0..=10 %`.
    pub fn from_fraction(fraction: f64) -> Option<Tolerance> {
        if !(0.0..=f64::from(MAX_PPM) / 1e6).contains(&fraction) {
            return None;
        }
        // The tiny slack keeps 0.29 (0.28999…×1e6) at 290000 ppm.
        let ppm = (fraction * 1e6 + 1e-6).floor() as u32;
        Some(Tolerance {
            ppm: ppm.min(MAX_PPM),
        })
    }

    /// A tolerance of `ppm` parts per million (at most [`MAX_PPM`]).
    pub fn from_ppm(ppm: u32) -> Tolerance {
        Tolerance {
            ppm: ppm.min(MAX_PPM),
        }
    }

    /// Parts per million.
    pub fn ppm(self) -> u32 {
        self.ppm
    }

    /// Whether decisions stay exact.
    pub fn is_exact(self) -> bool {
        self.ppm == 0
    }

    /// The tolerance's share of `units`, rounded down: the most a rule of
    /// limit `units` may over-admit in one window.
    pub fn of(self, units: u64) -> u64 {
        let share = u128::from(units) * u128::from(self.ppm) / 1_000_000;
        u64::try_from(share).unwrap_or(u64::MAX)
    }

    /// Whether this tolerance of a rule of `limit` makes a slice at all:
    /// its share of the limit holds [`MIN_SLICE`] units.
    pub fn can_slice(self, limit: u64) -> bool {
        self.of(limit) >= MIN_SLICE
    }

    /// Whether a tolerance can apply to `algorithm`: those whose guarantee
    /// over a span grows by `limit × span / per` when the span grows (gcra,
    /// token_bucket), and fixed_window, whose slices end with their
    /// window. sliding_log's guarantee over a longer span is not
    /// proportional (a whole limit can fall in its last moment),
    /// sliding_window is already an estimate, concurrency holds leases.
    pub fn applies_to(algorithm: Algorithm) -> bool {
        matches!(
            algorithm,
            Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::FixedWindow
        )
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", crate::number::shown(f64::from(self.ppm) / 1e4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tolerance_is_a_fraction_of_at_most_ten_percent() {
        assert_eq!(Tolerance::from_fraction(0.01).unwrap().ppm(), 10_000);
        assert_eq!(Tolerance::from_fraction(0.005).unwrap().ppm(), 5_000);
        assert_eq!(Tolerance::from_fraction(0.0).unwrap(), Tolerance::EXACT);
        assert_eq!(Tolerance::from_fraction(0.1).unwrap().ppm(), MAX_PPM);
        assert_eq!(Tolerance::from_fraction(0.11), None);
        assert_eq!(Tolerance::from_fraction(-0.01), None);
        assert_eq!(Tolerance::from_fraction(0.01).unwrap().to_string(), "1%");
        assert_eq!(Tolerance::from_ppm(10_000).of(20_000), 200);
        assert_eq!(Tolerance::from_ppm(10_000).of(99), 0);
    }
}
