//! Instructions per embedded decision, sluice next to governor, counted
//! under valgrind's callgrind: the same code counts the same to well under
//! 1%, where nanoseconds move ±20% from run to run on a shared machine.
//! The cases are `benches/decision.rs`'s (10,000 tenants cycled, every
//! request admitted): one gcra rule through `Limiter::decide_now` (and
//! through the async `Limiter::decide`, polled once) against one governor
//! keyed check, and three rules (tenant, route, subject)
//! against three governor checks.
//!
//! Each case runs twice under callgrind, with `SMALL` and `LARGE`
//! decisions after the same setup; the difference divided by
//! `LARGE - SMALL` is the cost of one decision, setup excluded. Counts
//! say nothing of cache misses: the criterion bench is what measures time.
//!
//! Run: `cargo run --release -p sluice-store --example embedded_instructions`
//! (needs valgrind: `apt-get install valgrind`).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::Command;

use governor::{Quota, RateLimiter};
use sluice_core::Request;

#[path = "../benches/cases/mod.rs"]
mod cases;
use cases::{SINGLE, TENANTS, THREE, VALVE_FAIR, VALVE_FIRST_COME, limiter, now};

const SMALL: usize = 50_000;
const LARGE: usize = 250_000;

const CASES: [&str; 7] = [
    "sluice_single_gcra",
    "governor_single",
    "sluice_async_single_gcra",
    "sluice_three_scopes",
    "governor_three",
    "sluice_valve_first_come",
    "sluice_valve_fair",
];

fn main() {
    let mut args = std::env::args().skip(1);
    if let (Some(case), Some(n)) = (args.next(), args.next()) {
        run(&case, n.parse().expect("a number of decisions"));
        return;
    }
    let me = std::env::current_exe().expect("this example's path");
    let mut per = Vec::new();
    for case in CASES {
        let small = count(&me, case, SMALL);
        let large = count(&me, case, LARGE);
        let each = (large - small) as f64 / (LARGE - SMALL) as f64;
        println!("{case}: {each:.0} instructions per decision");
        per.push(each);
    }
    println!(
        "ratio sluice / governor: one rule {:.2} ({:.2} async), three rules {:.2} (against three checks)",
        per[0] / per[1],
        per[2] / per[1],
        per[3] / per[4]
    );
}

/// Instructions callgrind counted for `n` decisions of `case`, setup
/// included.
fn count(me: &std::path::Path, case: &str, n: usize) -> u64 {
    let out = Command::new("valgrind")
        .args(["--tool=callgrind", "--callgrind-out-file=/dev/null"])
        .arg(me)
        .args([case, &n.to_string()])
        .output()
        .expect("valgrind runs (install it: apt-get install valgrind)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "callgrind failed: {stderr}");
    stderr
        .lines()
        .find_map(|line| line.split("Collected : ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no instruction count in callgrind's output: {stderr}"))
}

/// `n` decisions of `case` after every tenant's keys are in place.
fn run(case: &str, n: usize) {
    let tenants = cases::tenants();
    let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap());
    let mut admitted = 0usize;
    match case {
        "sluice_single_gcra"
        | "sluice_async_single_gcra"
        | "sluice_three_scopes"
        | "sluice_valve_first_come"
        | "sluice_valve_fair" => {
            let three = case == "sluice_three_scopes";
            let waiting = case == "sluice_async_single_gcra";
            let limiter = limiter(match case {
                "sluice_three_scopes" => THREE,
                "sluice_valve_first_come" => VALVE_FIRST_COME,
                "sluice_valve_fair" => VALVE_FAIR,
                _ => SINGLE,
            });
            let policy = limiter.policy();
            let subject = three.then_some("user-1");
            for i in 0..TENANTS + n {
                let request =
                    Request::new(&tenants[i % TENANTS], "GET /v1/things", subject, 1).unwrap();
                let decision = if waiting {
                    now(limiter.decide(&policy, &request))
                } else {
                    limiter.decide_now(&policy, &request)
                };
                admitted += usize::from(black_box(decision.allowed));
            }
        }
        "governor_single" => {
            let governor = RateLimiter::keyed(quota);
            for i in 0..TENANTS + n {
                admitted +=
                    usize::from(black_box(governor.check_key(&tenants[i % TENANTS]).is_ok()));
            }
        }
        "governor_three" => {
            let by_tenant = RateLimiter::keyed(quota);
            let by_route = RateLimiter::keyed(quota);
            let by_subject = RateLimiter::keyed(quota);
            let routes: Vec<(String, &str)> = tenants
                .iter()
                .map(|t| (t.clone(), "GET /v1/things"))
                .collect();
            let subjects: Vec<(String, &str, &str)> = tenants
                .iter()
                .map(|t| (t.clone(), "GET /v1/things", "user-1"))
                .collect();
            for i in 0..TENANTS + n {
                let k = i % TENANTS;
                let ok = by_tenant.check_key(&tenants[k]).is_ok()
                    && by_route.check_key(&routes[k]).is_ok()
                    && by_subject.check_key(&subjects[k]).is_ok();
                admitted += usize::from(black_box(ok));
            }
        }
        other => panic!("unknown case {other}; one of {CASES:?}"),
    }
    assert_eq!(admitted, TENANTS + n, "every request is admitted");
}
