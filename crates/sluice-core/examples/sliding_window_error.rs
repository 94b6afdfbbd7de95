//! Measures how far `sliding_window` strays from an exact sliding limit.
//!
//! Random traffic (exponential gaps, random costs) at several loads is run
//! through a sliding_window rule; after every admission the units admitted
//! in the trailing `per` are counted exactly. Printed per load: the share of
//! admissions after which the trailing span held more than `limit`, and the
//! worst overshoot as a fraction of `limit`.
//!
//! Run: `cargo run --release -p sluice-core --example sliding_window_error`.

use std::collections::VecDeque;

use sluice_core::algorithm::State;
use sluice_core::{Algorithm, Rule};

/// xorshift64*: a small deterministic generator, so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn main() {
    let limit = 100;
    let per = 1_000;
    let rule = Rule::new(Algorithm::SlidingWindow, limit, per, None, false).expect("valid rule");
    println!("sliding_window limit={limit} per={per}ms, 2,000,000 requests per load");
    println!(
        "{:>14} {:>16} {:>22}",
        "offered load", "over-limit spans", "worst overshoot"
    );
    for load in [0.5, 0.9, 1.0, 1.5, 2.0, 5.0] {
        let mut rng = Rng(0x5eed_0000 + (load * 100.0) as u64);
        let mean_gap = per as f64 / (limit as f64 * load);
        let mut state = State::Fresh;
        let mut now = 1_764_460_800_000f64;
        let mut window: VecDeque<(u64, u64)> = VecDeque::new();
        let mut in_window = 0u64;
        let (mut admitted, mut over, mut worst) = (0u64, 0u64, 0u64);
        for _ in 0..2_000_000 {
            now += -mean_gap * (1.0 - rng.unit()).ln();
            let t = now as u64;
            let cost = 1;
            let (outcome, step) = rule.decide(&state, t, cost);
            rule.commit(&mut state, step);
            if !outcome.allowed {
                continue;
            }
            admitted += 1;
            window.push_back((t, cost));
            in_window += cost;
            while let Some(&(at, c)) = window.front() {
                if at + per > t {
                    break;
                }
                window.pop_front();
                in_window -= c;
            }
            if in_window > limit as u64 {
                over += 1;
                worst = worst.max(in_window - limit as u64);
            }
        }
        println!(
            "{:>13.1}x {:>15.4}% {:>21.1}%",
            load,
            100.0 * over as f64 / admitted as f64,
            100.0 * worst as f64 / limit as f64
        );
    }
}
