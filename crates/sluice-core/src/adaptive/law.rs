//! The law of an adaptive valve: its effective limit `L`, moved between
//! `min` and `limit` by what its downstream shows.
//!
//! # The law
//!
//! Every instance gathers what it sees of the valve's downstream (each
//! request's latency and, where known, whether it failed; whether the valve
//! denied anything) and, about every 100 ms, steps the law with it
//! ([`Law::step`]). The law's state lives in the valve's own keys, so every
//! instance steps the same state and reads the same `L`:
//!
//! - **The latency estimate** `x` moves towards the mean `m` of the `n`
//!   latencies seen by `w = 1 − 2^(−n/8)`: eight requests move it half way,
//!   so it weighs requests, not instances or steps.
//! - **Overloaded** when `x` is past `latency_target` `T`, or more than
//!   10% of the requests seen failed. Then `L` is cut to `L · T/x`, at
//!   least by a tenth and at most by half, and not cut again before
//!   `max(T, x)` has passed: the time the requests admitted under the old
//!   `L` take to finish, after which the cut shows in what is seen.
//! - **Full and not overloaded** (the valve denied something, and the
//!   downstream keeps its target): `L` grows by `max(L/16, 1)` per `T` of
//!   time since the law last stepped (at most a second of it), from
//!   `max(T, x)` after the last cut on. Growth follows time, not steps, so
//!   it is the same however many instances step the law.
//! - Otherwise `L` stays: a valve that is not full has no need to grow.
//!
//! # Why it settles
//!
//! Let `L*` be the effective limit at which the downstream's latency
//! reaches `T` (for a downstream of `C` workers each taking `s`, past `C`
//! requests queue: `x = s·L/C` above `C`, so `L* = C·T/s`). Below `L*`, a
//! full valve grows `L` by a sixteenth per `T`; the latency follows within
//! `x ≤ T`, so `L` passes `L*` by at most about a sixteenth before a cut.
//! Above `L*` the cut takes `L` to `L·T/x ≤ 0.9 L`, so back under `L*` in
//! one cut (two at most: the estimate lags by a few requests). `L` then
//! cycles between about `0.9 L*` and `1.07 L*`, a cycle of about
//! `16·ln(1/0.9)·T ≈ 2 T`: the downstream's latency stays within about
//! `1.1 T`, and it is kept busy (`L ≥ C`) whenever `0.9 L* ≥ C`, that is
//! whenever `T` is at least `1.1 s`, as a target above the downstream's own
//! service time is. When the downstream slows (its capacity halves), `x`
//! rises past `T` within a few requests and `L` halves within two cuts.
//!
//! No integral term: every instance reads the same state, so there is
//! nothing for instances to drift apart on (the trap `limiter/fair.rs`
//! describes), and a cut is proportional to the overshoot instead.

use super::Adaptive;

/// Requests that move the latency estimate half way to their mean.
const HALF_WAY: f64 = 8.0;
/// The share of failed requests past which the downstream is overloaded.
const FAILING: f64 = 0.1;
/// How much `L` grows per latency target while full.
const GROWTH: f64 = 1.0 / 16.0;
/// A cut keeps at least this much of `L`, and at most this much.
const CUT: (f64, f64) = (0.5, 0.9);
/// The most time one step grows `L` for (ms): after a quiet spell, `L`
/// does not jump.
const MOST_GROWTH_MS: f64 = 1_000.0;
/// A law not stepped for this long (ms) starts afresh: a valve idle for
/// ten minutes, or made adaptive again, starts at its limit.
pub const FORGET_MS: u64 = 600_000;
/// The longest latency a request is counted with (ms): an hour.
const MOST_LATENCY_MS: f64 = 3_600_000.0;

/// What the instances saw of a valve's downstream since they last stepped
/// its law.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Seen {
    /// Requests whose latency was seen.
    pub requests: u64,
    /// Their latencies, summed (ms).
    pub latency_ms: f64,
    /// How many of them failed (a status of 5xx, or 429).
    pub failed: u64,
    /// Whether the valve denied a request.
    pub full: bool,
}

impl Seen {
    /// `other` seen as well.
    pub fn merge(&mut self, other: Seen) {
        self.requests += other.requests;
        self.latency_ms += other.latency_ms;
        self.failed += other.failed;
        self.full |= other.full;
    }

    /// One request of `latency_ms` (at most an hour; one that is not a
    /// finite number is not counted), failed or not.
    pub fn request(&mut self, latency_ms: f64, failed: bool) {
        if !latency_ms.is_finite() {
            return;
        }
        self.requests += 1;
        self.latency_ms += latency_ms.clamp(0.0, MOST_LATENCY_MS);
        self.failed += u64::from(failed);
    }
}

/// The law's state, as the valve's keys hold it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Law {
    /// The effective limit (0: never stepped; the valve's limit).
    pub limit: f64,
    /// The latency estimate (ms; 0: nothing seen yet).
    pub latency_ms: f64,
    /// When `L` was last cut (ms).
    pub cut_at_ms: u64,
    /// When the law last stepped (ms; 0: never).
    pub at_ms: u64,
}

impl Law {
    /// The law stepped at `now` with what was `seen`, for a valve of
    /// `limit` and `terms`.
    pub fn step(self, now: u64, seen: Seen, limit: u64, terms: Adaptive) -> Law {
        let (least, most) = (terms.min.max(1) as f64, limit.max(1) as f64);
        let target = terms.latency_target_ms.max(1) as f64;
        let mut law = self;
        if law.at_ms != 0 && now.saturating_sub(law.at_ms) > FORGET_MS {
            law = Law::default();
        }
        if law.limit <= 0.0 {
            law.limit = most;
        }
        // Terms changed by a reload: within them.
        law.limit = law.limit.clamp(least.min(most), most);
        let elapsed = if law.at_ms == 0 {
            0.0
        } else {
            (now.saturating_sub(law.at_ms) as f64).min(MOST_GROWTH_MS)
        };
        let mut failing = false;
        if seen.requests > 0 {
            let n = seen.requests as f64;
            let mean = seen.latency_ms / n;
            law.latency_ms = if law.latency_ms <= 0.0 {
                mean
            } else {
                // (0.5^x rather than 2^−x: the script's `^` is C's pow.)
                let weight = 1.0 - 0.5f64.powf(n / HALF_WAY);
                law.latency_ms + weight * (mean - law.latency_ms)
            };
            failing = seen.failed as f64 > FAILING * n;
        }
        let overloaded = seen.requests > 0 && (law.latency_ms > target || failing);
        // (A cut "after" now: the clock stepped back; long settled.)
        let since_cut = match now.checked_sub(law.cut_at_ms) {
            Some(ms) => ms as f64,
            None => f64::INFINITY,
        };
        let settled = since_cut >= target.max(law.latency_ms);
        if overloaded {
            if settled {
                let factor = (target / law.latency_ms.max(target)).clamp(CUT.0, CUT.1);
                law.limit = (law.limit * factor).max(least.min(most));
                law.cut_at_ms = now;
            }
        } else if seen.full && settled {
            let growth = (law.limit * GROWTH).max(1.0) * elapsed / target;
            law.limit = (law.limit + growth).min(most);
        }
        law.at_ms = now;
        law
    }

    /// The effective limit of a valve of `limit` and `terms`: at least
    /// `min`, at most `limit`.
    pub fn effective(&self, limit: u64, terms: Adaptive) -> u64 {
        let most = limit.max(1);
        if self.limit <= 0.0 {
            return most;
        }
        (self.limit.floor() as u64).clamp(terms.min.clamp(1, most), most)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: Adaptive = Adaptive {
        latency_target_ms: 100,
        min: 5,
    };

    /// A downstream of `workers`, each request taking `service_ms` alone;
    /// past `workers` in flight they share them (latency grows with the
    /// queue).
    fn latency(in_flight: f64, workers: f64, service_ms: f64) -> f64 {
        service_ms * (in_flight / workers).max(1.0)
    }

    /// A concurrency valve of `limit` before the downstream, offered
    /// `offered` requests in flight, stepped every 100 ms for `ms`: each
    /// step's effective limit, latency and in-flight.
    fn run(
        law: &mut Law,
        now: &mut u64,
        ms: u64,
        (offered, workers, service_ms): (f64, f64, f64),
        limit: u64,
    ) -> Vec<(u64, f64, f64)> {
        let mut seen = Vec::new();
        let end = *now + ms;
        while *now < end {
            let l = law.effective(limit, TERMS) as f64;
            let in_flight = offered.min(l);
            let x = latency(in_flight, workers, service_ms);
            // What finished in 100 ms.
            let requests = (in_flight * 100.0 / x).round().max(1.0) as u64;
            let s = Seen {
                requests,
                latency_ms: x * requests as f64,
                failed: 0,
                full: offered > l,
            };
            *now += 100;
            *law = law.step(*now, s, limit, TERMS);
            seen.push((law.effective(limit, TERMS), x, in_flight));
        }
        seen
    }

    #[test]
    fn it_settles_near_its_target_keeps_the_downstream_busy_and_follows_a_halving() {
        let (mut law, mut now) = (Law::default(), 1_000_000);
        // 40 workers of 40 ms, offered twice what they hold; a limit far
        // above: L* = 40 × 100 / 40 = 100.
        let downstream = (80.0 * 100.0 / 40.0 * 2.0, 40.0, 40.0);
        run(&mut law, &mut now, 10_000, downstream, 2_000);
        let settled = run(&mut law, &mut now, 10_000, downstream, 2_000);
        let worst = settled.iter().map(|s| s.1).fold(0.0, f64::max);
        let busy = settled.iter().filter(|s| s.2 >= 40.0 * 0.85).count();
        assert!(
            worst <= 1.2 * 100.0,
            "latency up to {worst} ms: {settled:?}"
        );
        assert_eq!(busy, settled.len(), "kept busy: {settled:?}");
        // Halved: 20 workers. Within 10 s, back within its target.
        let halved = (downstream.0, 20.0, 40.0);
        let after = run(&mut law, &mut now, 10_000, halved, 2_000);
        let late = &after[after.len() / 2..];
        let worst = late.iter().map(|s| s.1).fold(0.0, f64::max);
        assert!(
            worst <= 1.2 * 100.0,
            "after halving, up to {worst} ms: {after:?}"
        );
        assert!(late.iter().all(|s| s.2 >= 20.0 * 0.85), "{after:?}");
    }

    #[test]
    fn it_stays_within_min_and_limit_and_grows_only_when_full() {
        let mut law = Law::default();
        // Terribly slow: cut to min, never below.
        for t in 1..100 {
            let seen = Seen {
                requests: 10,
                latency_ms: 10.0 * 10_000.0,
                failed: 0,
                full: true,
            };
            law = law.step(t * 1_000, seen, 50, TERMS);
        }
        assert_eq!(law.effective(50, TERMS), 5);
        // Fast and not full: stays.
        let quiet = Seen {
            requests: 100,
            latency_ms: 100.0,
            failed: 0,
            full: false,
        };
        let before = law;
        let law2 = (0..50).fold(law, |l, t| l.step(200_000 + t * 100, quiet, 50, TERMS));
        assert_eq!(law2.effective(50, TERMS), before.effective(50, TERMS));
        // Fast and full: grows to the limit, never past it.
        let full = Seen {
            full: true,
            ..quiet
        };
        let law3 = (0..2_000).fold(law2, |l, t| l.step(300_000 + t * 100, full, 50, TERMS));
        assert_eq!(law3.effective(50, TERMS), 50);
        // Failing (most requests 5xx), however fast: cut.
        let failing = Seen { failed: 90, ..full };
        let law4 = law3.step(600_000, failing, 50, TERMS);
        assert!(law4.effective(50, TERMS) < 50, "{law4:?}");
    }

    /// A clock stepped back an hour, a latency that is not a number, a law
    /// left alone for ten minutes: none of them freezes or poisons it.
    #[test]
    fn a_clock_stepped_back_or_a_bad_latency_never_freezes_it() {
        let slow = Seen {
            requests: 10,
            latency_ms: 10.0 * 400.0,
            failed: 0,
            full: true,
        };
        let mut law = Law::default().step(10_000_000, slow, 100, TERMS);
        assert!(law.effective(100, TERMS) < 100, "{law:?}");
        let cut = law.effective(100, TERMS);
        // Back an hour: still stepped, still cut when slow.
        for t in 1..=20 {
            law = law.step(10_000_000 - 3_600_000 + t * 500, slow, 100, TERMS);
        }
        assert!(law.effective(100, TERMS) < cut, "{law:?}");
        // Infinite and NaN latencies: not counted; an hour and more, an hour.
        let mut seen = Seen::default();
        seen.request(f64::INFINITY, false);
        seen.request(f64::NAN, false);
        seen.request(1e12, false);
        assert_eq!((seen.requests, seen.latency_ms), (1, 3_600_000.0));
        let law2 = law.step(6_500_000, seen, 100, TERMS);
        assert!(law2.latency_ms.is_finite(), "{law2:?}");
        // Ten minutes alone: afresh, at the limit.
        let fresh = law.step(6_500_000 + FORGET_MS + 1_000, Seen::default(), 100, TERMS);
        assert_eq!(fresh.effective(100, TERMS), 100);
    }

    /// Growth follows time: four instances stepping every 25 ms grow the
    /// limit as one stepping every 100 ms does.
    #[test]
    fn growth_is_the_same_however_many_instances_step_it() {
        let full = Seen {
            requests: 4,
            latency_ms: 4.0 * 10.0,
            failed: 0,
            full: true,
        };
        let start = Law {
            limit: 10.0,
            latency_ms: 10.0,
            cut_at_ms: 0,
            at_ms: 1_000_000,
        };
        let one = (1..=100).fold(start, |l, t| {
            l.step(1_000_000 + t * 100, full, 1_000, TERMS)
        });
        let quarter = Seen {
            requests: 1,
            latency_ms: 10.0,
            ..full
        };
        let four = (1..=400).fold(start, |l, t| {
            l.step(1_000_000 + t * 25, quarter, 1_000, TERMS)
        });
        let ratio = four.limit / one.limit;
        assert!(
            (0.95..=1.05).contains(&ratio),
            "{} vs {}",
            four.limit,
            one.limit
        );
    }
}
