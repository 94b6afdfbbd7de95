//! One fair valve's level as this instance has seen it, and the `α` read
//! off it (the law is argued in the parent module).

use std::sync::Arc;

use sluice_core::{Algorithm, Rule};
use smallvec::SmallVec;

use super::{K, OPEN, SET_POINT, drain_ms, rate_per_ms};

/// One valve's level, as this instance has seen it.
#[derive(Debug)]
pub(super) struct Level {
    pub(super) name: Arc<str>,
    /// Whether this is a part of the valve reserved for a plan (the
    /// metrics show the level of the rest).
    pub(super) reserve: bool,
    /// The valve's rule (or the part's), as last seen.
    pub(super) valve: Rule,
    /// Per key of the valve (one, unless it is split), what decisions
    /// found there.
    keys: SmallVec<[Key; 4]>,
    /// The weights of the tenants its gates held back lately: `α` is a
    /// rate per unit of the heaviest of them (see the parent module's
    /// "Weights").
    held_back: Peak,
    /// The weights of the tenants that asked lately: the heaviest is the
    /// reference while nobody is held back.
    asked: Peak,
    /// The reference as last known, while nobody has asked lately.
    reference: f64,
    /// Since when the valve has been empty (see [`EMPTY`]), if it is.
    empty_since: Option<u64>,
}

/// What decisions found on one key of a valve: the level the latest
/// found and when, and the highest found, falling since at the valve's
/// rate, which `α` is read off while it is higher.
#[derive(Debug, Clone, Copy)]
struct Key {
    level: f64,
    at: u64,
    /// The highest level found, and when (see [`Key::held`]).
    high: f64,
    high_at: u64,
}

/// A valve at most this full is empty: every gate is about as tight as
/// the level makes it, so a tenant who keeps draining it for long is
/// heavier than the reference.
const EMPTY: f64 = 0.05;

/// How long the valve must stay empty, in `θ`, for the reference to be
/// raised: longer than a heavy tenant's own burst drains it.
const EMPTY_FOR: f64 = 2.0;

/// How long the weight of a tenant held back is remembered as the
/// reference, as a share of `θ` (at least this, at most twice this).
const REFERENCE_HOLD: f64 = 0.5;

impl Key {
    /// A key nobody has told of: as full as nobody drained it, with
    /// nothing found to hold.
    fn new(at: u64) -> Key {
        Key {
            level: 1.0,
            at,
            high: 0.0,
            high_at: at,
        }
    }

    /// The level found at `now_ms`, as it is now (`theta` being `θ`).
    fn observe(&mut self, seen: f64, now_ms: u64, theta: f64) {
        // A clock that stepped back would hold the highest for as long as
        // the step: it starts afresh.
        if seen >= self.fallen(now_ms, theta) || now_ms < self.high_at {
            (self.high, self.high_at) = (seen, now_ms);
        }
        self.level = seen;
        // A clock that stepped back keeps the later time.
        self.at = self.at.max(now_ms);
    }

    /// The level now: as last found, refilled at the valve's rate for the
    /// time since.
    fn now(&self, now_ms: u64, theta: f64) -> f64 {
        (self.level + now_ms.saturating_sub(self.at) as f64 / theta).min(1.0)
    }

    /// The highest level found, less what the valve's rate would have
    /// drained of it since: as low as a load the valve cannot carry takes
    /// it, never lower than that.
    fn fallen(&self, now_ms: u64, theta: f64) -> f64 {
        self.high - now_ms.saturating_sub(self.high_at) as f64 / theta
    }

    /// The level `α` is read off: [`now`](Self::now), or the highest found
    /// falling at the valve's rate when that is higher. A burst takes the
    /// level down at once; saturation at the rate the gates let through
    /// beyond the valve's, which is slower: only the burst is held.
    fn held(&self, now_ms: u64, theta: f64) -> f64 {
        self.now(now_ms, theta).max(self.fallen(now_ms, theta))
    }
}

/// The highest of the values noted over the last one to two `window`s
/// (two halves, the older dropped as a new one starts: no list kept).
#[derive(Debug, Clone, Copy)]
struct Peak {
    /// The highest noted since `since`, and in the window before.
    high: f64,
    before: f64,
    since: u64,
}

impl Peak {
    const NONE: Peak = Peak {
        high: f64::NEG_INFINITY,
        before: f64::NEG_INFINITY,
        since: 0,
    };

    fn note(&mut self, value: f64, now_ms: u64, window: u64) {
        if now_ms < self.since {
            // The clock stepped back: what was noted is from a time that
            // would last as long as the step.
            *self = Peak::NONE;
            self.since = now_ms;
        }
        if now_ms >= self.since.saturating_add(window) {
            let recent = now_ms < self.since.saturating_add(window.saturating_mul(2));
            self.before = if recent { self.high } else { f64::NEG_INFINITY };
            self.high = value;
            self.since = now_ms;
        } else {
            self.high = self.high.max(value);
        }
    }

    /// The highest noted over the last one to two `window`s, if any.
    fn get(&self, now_ms: u64, window: u64) -> Option<f64> {
        let age = now_ms.saturating_sub(self.since);
        let peak = if age < window {
            self.high.max(self.before)
        } else if age < window.saturating_mul(2) {
            self.high
        } else {
            f64::NEG_INFINITY
        };
        (peak > f64::NEG_INFINITY).then_some(peak)
    }
}

impl Level {
    pub(super) fn new(name: Arc<str>, reserve: bool) -> Level {
        Level {
            name,
            reserve,
            valve: Rule::new(Algorithm::Gcra, 1, 1, None, false).expect("a valid rule"),
            keys: SmallVec::new(),
            held_back: Peak::NONE,
            asked: Peak::NONE,
            reference: 1.0,
            empty_since: None,
        }
    }

    /// Notes that a tenant of weight `weight` asked at `now_ms`, and
    /// whether its gate held it back.
    pub(super) fn asked(&mut self, valve: &Rule, weight: f64, held_back: bool, now_ms: u64) {
        let window = (REFERENCE_HOLD * drain_ms(valve)) as u64;
        self.asked.note(weight, now_ms, window);
        if held_back {
            self.held_back.note(weight, now_ms, window);
        }
        self.reference = self.reference(valve, now_ms);
    }

    /// The weight `α` is a rate per unit of: the heaviest of the tenants
    /// held back lately; while nobody is, or while the valve is empty
    /// (gates too loose for someone heavier), the heaviest that asked
    /// lately if heavier; else as last known.
    fn reference(&self, valve: &Rule, now_ms: u64) -> f64 {
        let window = (REFERENCE_HOLD * drain_ms(valve)) as u64;
        let asked = self.asked.get(now_ms, window);
        match self.held_back.get(now_ms, window) {
            Some(held) if self.empty_for(valve, now_ms) => held.max(asked.unwrap_or(held)),
            Some(held) => held,
            None => asked.unwrap_or(self.reference),
        }
    }

    /// Notes the level a decision found at `now_ms` on key `key` of a valve
    /// split over `keys` (1 when whole).
    pub(super) fn observe(
        &mut self,
        valve: &Rule,
        key: usize,
        keys: usize,
        seen: f64,
        now_ms: u64,
    ) {
        self.valve = *valve;
        if self.keys.len() != keys {
            // New, or split anew (a reload): keys not seen yet count full.
            self.keys = smallvec::smallvec![Key::new(now_ms); keys];
        }
        self.keys[key].observe(seen, now_ms, drain_ms(valve));
        let empty = self.held(valve, now_ms) <= EMPTY;
        self.empty_since = empty.then(|| self.empty_since.unwrap_or(now_ms));
    }

    /// Whether the valve has been empty for a whole `θ`: longer than a
    /// gate's overshoot lasts, so a tenant heavier than the reference is
    /// draining it.
    fn empty_for(&self, valve: &Rule, now_ms: u64) -> bool {
        self.empty_since
            .is_some_and(|since| now_ms.saturating_sub(since) as f64 >= EMPTY_FOR * drain_ms(valve))
    }

    /// The valve's level now: the mean of its keys' levels as last found,
    /// each refilled at its rate for the time since (a key nobody told of
    /// is one nobody drained).
    pub(super) fn now(&self, valve: &Rule, now_ms: u64) -> f64 {
        self.mean(valve, |key, theta| key.now(now_ms, theta))
    }

    /// The level `α` is read off: the mean of its keys' levels, each the
    /// highest found lately where that is higher than it is now.
    fn held(&self, valve: &Rule, now_ms: u64) -> f64 {
        self.mean(valve, |key, theta| key.held(now_ms, theta))
    }

    /// The mean over the keys of `level` (given `θ`); full when none is
    /// known.
    fn mean(&self, valve: &Rule, level: impl Fn(&Key, f64) -> f64) -> f64 {
        if self.keys.is_empty() {
            return 1.0;
        }
        let theta = drain_ms(valve);
        let sum: f64 = self.keys.iter().map(|key| level(key, theta)).sum();
        sum / self.keys.len() as f64
    }

    /// A turn (see [`Batch::valve_turn`](crate::Batch::valve_turn)) that
    /// puts a decision on the key of a split valve it knows to be fullest
    /// (the first of those within a unit of it, from `random`'s key on;
    /// `random` itself for a whole valve): joining the fullest key keeps
    /// the keys level, so that a request finds one empty only when the
    /// whole valve nearly is.
    pub(super) fn fullest(&self, valve: &Rule, now_ms: u64, random: u64) -> u64 {
        let keys = self.keys.len() as u64;
        if keys <= 1 {
            return random;
        }
        let theta = drain_ms(valve);
        let unit = keys as f64 / valve.capacity().max(1) as f64;
        let level = |k: u64| self.keys[k as usize].now(now_ms, theta);
        let best = (0..keys).map(level).fold(0.0, f64::max);
        let start = random % keys;
        (0..keys)
            .map(|i| (start + i) % keys)
            .find(|&k| level(k) >= best - unit)
            .unwrap_or(start)
    }

    /// `α` now, in units per ms per unit of weight (infinite while it
    /// holds nobody back): read off the level now per unit of the
    /// [`reference`](Self::reference) weight. What a gate refills at.
    pub(super) fn alpha(&self, valve: &Rule, now_ms: u64) -> f64 {
        let alpha = rate_per_ms(valve) * (K * (self.now(valve, now_ms) - SET_POINT)).exp();
        if alpha >= OPEN * rate_per_ms(valve) {
            f64::INFINITY
        } else {
            alpha / self.reference(valve, now_ms)
        }
    }

    /// `α` read off the [`held`](Self::held) level instead (a burst read
    /// as the level before it), at most the valve's rate per unit of the
    /// reference: what a gate may hold (its burst, a quarter of `θ` at
    /// this rate). Higher, a gate open a moment ago left every tenant a
    /// whole valve's worth to spend at once as it closed.
    pub(super) fn alpha_saved(&self, valve: &Rule, now_ms: u64) -> f64 {
        let level = self.held(valve, now_ms).min(SET_POINT);
        rate_per_ms(valve) * (K * (level - SET_POINT)).exp() / self.reference(valve, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valve() -> Rule {
        Rule::new(Algorithm::Gcra, 100, 1_000, None, false).unwrap()
    }

    #[test]
    fn alpha_is_the_valves_rate_at_the_set_point_and_falls_as_it_drains() {
        let valve = valve();
        let mut level = Level::new("v".into(), false);
        assert!(level.alpha(&valve, 1_000).is_infinite(), "a full valve");
        for t in 0..100 {
            level.observe(&valve, 0, 1, SET_POINT, 1_000 + t);
        }
        // At the set point, α is the valve's rate: one tenant may have it all.
        let alpha = level.alpha(&valve, 1_099);
        assert!((alpha - 0.1).abs() < 1e-3, "{alpha}");
        // Draining for longer than a level is held: α falls with the
        // level, e^12 over the whole valve.
        for t in 0..600 {
            level.observe(&valve, 0, 1, 0.2, 1_100 + t);
        }
        let lower = level.alpha(&valve, 1_699);
        assert!((lower - 0.1 * (-K * 0.4f64).exp()).abs() < 1e-4, "{lower}");
        // Full again: nobody held back.
        for t in 0..200 {
            level.observe(&valve, 0, 1, 1.0, 1_700 + t);
        }
        assert!(level.alpha(&valve, 1_900).is_infinite());
    }

    #[test]
    fn a_burst_is_read_as_the_level_before_it_falling_at_the_valves_rate() {
        let valve = valve();
        let mut level = Level::new("v".into(), false);
        let near =
            |alpha: f64, of: f64| (alpha / (0.1 * (K * (of - SET_POINT)).exp()) - 1.0).abs() < 0.01;
        for t in 0..300 {
            level.observe(&valve, 0, 1, SET_POINT, 1_000 + t);
        }
        // A herd takes half the valve at once; the level refills from
        // there (0.9 a θ, a tenth of the valve's rate still asked for).
        level.observe(&valve, 0, 1, 0.1, 1_300);
        for t in 1..=100 {
            level.observe(&valve, 0, 1, 0.1 + 0.9 * t as f64 / 1_000.0, 1_300 + t);
        }
        // What a gate may have saved is read as the level before it,
        // falling at the valve's rate since: 0.499 a tenth of θ later; what
        // it refills at, as the level is: the 0.19 found.
        let alpha = level.alpha_saved(&valve, 1_400);
        assert!(near(alpha, 0.499), "{alpha}");
        let now = level.alpha(&valve, 1_400);
        assert!(near(now, 0.19), "{now}");
        // Once the valve has refilled past that, as found.
        for t in 1..=300 {
            level.observe(&valve, 0, 1, 0.19 + 0.9 * t as f64 / 1_000.0, 1_400 + t);
        }
        let alpha = level.alpha_saved(&valve, 1_700);
        assert!(near(alpha, 0.46), "{alpha}");
        // A level that stays low is read as it is within the time the
        // valve's rate takes to drain what was above it.
        for t in 1..=400 {
            level.observe(&valve, 0, 1, 0.2, 1_700 + t);
        }
        let lower = level.alpha_saved(&valve, 2_100);
        assert!(near(lower, 0.2), "{lower}");
    }

    #[test]
    fn a_split_valve_is_as_full_as_its_keys_on_average() {
        let valve = valve();
        let mut level = Level::new("v".into(), false);
        // Four keys: two empty, one half, one never seen (full).
        level.observe(&valve, 0, 4, 0.0, 1_000);
        level.observe(&valve, 1, 4, 0.0, 1_000);
        level.observe(&valve, 2, 4, 0.5, 1_000);
        assert!((level.now(&valve, 1_000) - 0.375).abs() < 1e-9);
        // Split anew (a reload): what was seen is forgotten.
        level.observe(&valve, 0, 2, 0.2, 1_000);
        assert!((level.now(&valve, 1_000) - 0.6).abs() < 1e-9);
    }

    #[test]
    fn a_decision_joins_the_fullest_key_of_a_split_valve() {
        let valve = valve();
        let mut level = Level::new("v".into(), false);
        for (key, seen) in [0.1, 0.9, 0.3, 0.88].into_iter().enumerate() {
            level.observe(&valve, key, 4, seen, 1_000);
        }
        // Keys 1 and 3 are within a unit (4 %) of each other: the first
        // from the random key on.
        assert_eq!(level.fullest(&valve, 1_000, 0), 1);
        assert_eq!(level.fullest(&valve, 1_000, 2), 3);
        assert_eq!(level.fullest(&valve, 1_000, 7), 3);
        // Whole: the random turn as it is.
        let whole = Level::new("w".into(), false);
        assert_eq!(whole.fullest(&valve, 1_000, 12_345), 12_345);
    }

    #[test]
    fn a_clock_stepping_back_keeps_the_later_time() {
        let valve = valve();
        let mut level = Level::new("v".into(), false);
        level.observe(&valve, 0, 1, 0.3, 10_000);
        level.observe(&valve, 0, 1, 0.3, 5_000);
        assert_eq!(level.keys[0].at, 10_000);
        // No time has passed for a clock behind: the level as found.
        assert!((level.now(&valve, 5_000) - 0.3).abs() < 1e-9);
        assert!(level.alpha(&valve, 5_000).is_finite());
        // Nor is the highest level found before the step held for as long
        // as the step, nor the weights noted before it.
        let mut stepped = Level::new("s".into(), false);
        stepped.observe(&valve, 0, 1, 0.7, 10_000);
        stepped.asked(&valve, 1_000.0, true, 10_000);
        stepped.observe(&valve, 0, 1, 0.2, 5_000);
        stepped.asked(&valve, 0.001, true, 5_000);
        let read = stepped.alpha(&valve, 5_000) * 0.001;
        let at = |l: f64| 0.1 * (K * (l - SET_POINT)).exp();
        assert!(
            (read / at(0.2) - 1.0).abs() < 1e-6,
            "{read} for {}",
            at(0.2)
        );
    }

    #[test]
    fn silence_refills_the_valve_as_time_passes() {
        let valve = valve();
        let mut level = Level::new("v".into(), false);
        for t in 0..200 {
            level.observe(&valve, 0, 1, 0.0, 1_000 + t);
        }
        let shut = level.alpha(&valve, 1_200);
        // No news for half a θ: half the valve back.
        let opening = level.alpha(&valve, 1_700);
        assert!(opening > shut * 100.0, "{shut} → {opening}");
        // No news for a θ: full, nobody held back.
        assert!(level.alpha(&valve, 2_300).is_infinite());
    }

    #[test]
    fn alpha_is_per_unit_of_the_heaviest_weight_held_back() {
        let valve = valve();
        let mut level = Level::new("v".into(), false);
        for t in 0..600 {
            level.observe(&valve, 0, 1, SET_POINT, 1_000 + t);
        }
        let near = |alpha: f64| (alpha / 0.1 - 1.0).abs() < 0.02;
        // Nobody asked yet: per unit of weight 1.
        assert!(near(level.alpha(&valve, 1_599)));
        // Tenants of weight 1000 ask (none held back): per unit of 1000,
        // so each of them may have what one of weight 1 had.
        level.asked(&valve, 1_000.0, false, 1_600);
        level.asked(&valve, 0.001, false, 1_600);
        assert!(near(level.alpha(&valve, 1_600) * 1_000.0));
        // Tenants of weight 0.001 are held back, the heavy one is not:
        // per unit of 0.001.
        level.asked(&valve, 0.001, true, 1_610);
        level.observe(&valve, 0, 1, SET_POINT, 1_610);
        assert!(near(level.alpha(&valve, 1_610) * 0.001));
        // Nobody held back or asking for a while: as last known.
        level.observe(&valve, 0, 1, SET_POINT, 9_000);
        assert!(near(level.alpha(&valve, 9_000) * 0.001));
    }

    #[test]
    fn a_valve_kept_empty_raises_the_reference_to_the_heaviest_asking() {
        let valve = valve();
        let mut level = Level::new("v".into(), false);
        // Light tenants held back, a heavy one asking: light reference.
        let mut t = 1_000;
        let step = |level: &mut Level, seen: f64, t: u64| {
            level.asked(&valve, 0.001, true, t);
            level.asked(&valve, 1_000.0, false, t);
            level.observe(&valve, 0, 1, seen, t);
        };
        while t < 2_000 {
            step(&mut level, 0.4, t);
            t += 10;
        }
        assert!((level.reference(&valve, t) - 0.001).abs() < 1e-12);
        // Empty for a θ (a heavy tenant's burst): still light.
        while t < 3_000 {
            step(&mut level, 0.0, t);
            t += 10;
        }
        assert!((level.reference(&valve, t) - 0.001).abs() < 1e-12);
        // Empty for two (from when the level held from before is gone):
        // the heavy one drains it; its weight is the reference, so its
        // gate holds it.
        while t < 4_600 {
            step(&mut level, 0.0, t);
            t += 10;
        }
        assert_eq!(level.reference(&valve, t), 1_000.0);
    }
}
