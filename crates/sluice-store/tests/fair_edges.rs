//! Fair valves at their edges (issue 45, B) on the memory store with a
//! hand-set clock: the scenarios of `arrivals/edges.rs`.

mod arrivals;
mod remote;
use arrivals::{edges, run};

#[test]
fn a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out() {
    edges::a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out(&run);
}

#[test]
fn a_herd_in_step_leaves_a_polite_tenant_alone() {
    for n in [60, 80] {
        edges::a_herd_in_step_leaves_a_polite_tenant_alone(&run, n);
    }
}

#[test]
fn a_window_valve_keeps_its_whole_capacity() {
    edges::a_window_valve_keeps_its_whole_capacity(&run);
}

#[test]
fn weights_are_scale_free() {
    edges::weights_are_scale_free(&run);
}

#[test]
fn weights_at_both_ends_in_one_valve() {
    edges::weights_at_both_ends_in_one_valve(&run);
}

#[test]
fn many_light_ids_outweigh_a_heavy_one_unless_it_reserves() {
    edges::many_light_ids_outweigh_a_heavy_one_unless_it_reserves(&run);
}

/// Saturated, a fair valve's denials are mostly decided without the
/// store (what the over-limit cache does for first come), and shares hold.
#[test]
fn a_saturated_fair_valve_denies_mostly_without_the_store() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use sluice_store::{Limiter, ManualClock, MemoryStore};

    let yaml = arrivals::config(arrivals::VALVE, arrivals::HEAVY);
    let clock = Arc::new(ManualClock::new(arrivals::START_MS));
    let remote = remote::Remote::new(MemoryStore::with_clock(100_000, clock.clone()));
    let calls = remote.calls.clone();
    let mut options = arrivals::options(&clock);
    options.denial_cache = true;
    let limiter = Limiter::with_options(arrivals::policy(&yaml), remote, options);
    let senders = [
        arrivals::sender("noisy-1", 150.0),
        arrivals::sender("noisy-2", 150.0),
        arrivals::sender("noisy-3", 150.0),
        arrivals::sender("polite", 10.0),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let run = runtime.block_on(arrivals::run_on(
        &limiter, &clock, &senders, 20_000, 2_000, None,
    ));
    let per_decision = calls.load(Ordering::Relaxed) as f64 / run.decided as f64;
    assert!(
        per_decision <= 0.5,
        "{per_decision:.2} store calls per decision, {:?}",
        run.counts
    );
    let polite = run.counts[3];
    assert!(polite.denied * 100 <= polite.sent * 2, "{polite:?}");
    // Answered here or by the store, a fair-share denial says a second.
    for noisy in &run.counts[..3] {
        assert!(noisy.shortest_retry_ms >= Some(1_000), "{noisy:?}");
    }
    for i in 0..3 {
        let rate = run.rate(i, 18.0);
        assert!(
            (22.5..=37.5).contains(&rate),
            "noisy-{i}: {rate:.1}/s, {:?}",
            run.counts
        );
    }
}
