//! Fair valves at their edges (issue 45, B), each scenario run on the
//! store a test file gives it (`fair_edges.rs`: memory; `fair_redis.rs`:
//! a real Redis).

use super::{HEAVY, Run, Sender, VALVE, config, sender, steady};

/// Runs senders against a configuration: `(yaml, senders, run_ms,
/// measure_from_ms)`.
pub type Runner<'a> = &'a dyn Fn(&str, &[Sender], u64, u64) -> Run;

/// `n` tenants asking once a second each, in step (on the same
/// millisecond), from `from_ms` to `until_ms`.
pub fn herd(n: usize, from_ms: u64, until_ms: u64) -> Vec<Sender> {
    (0..n)
        .map(|i| Sender {
            from_ms,
            until_ms,
            ..steady(&format!("herd-{i}"), 1.0)
        })
        .collect()
}

/// Three noisy tenants saturate the valve (a share of 33/s each); once,
/// at 0, a herd of 95 empties it. The polite tenant, asking once a second,
/// is admitted just after, while its share is tiny: back within the
/// valve's period (θ, a second), it is denied at most once and told to
/// wait no more than the least wait, a second.
pub fn a_tenant_admitted_while_the_valve_was_nearly_empty_is_not_shut_out(run: Runner<'_>) {
    let yaml = config(VALVE, HEAVY);
    let mut senders = herd(95, 0, 1);
    senders.extend((1..=3).map(|i| sender(&format!("noisy-{i}"), 150.0)));
    senders.push(Sender {
        from_ms: 10,
        ..steady("polite", 1.0)
    });
    let run = run(&yaml, &senders, 15_000, 0);
    let polite = run.counts[98];
    assert_eq!(polite.sent, 15);
    assert!(
        polite.denied <= 1 && polite.longest_retry_ms <= 1_000,
        "polite (1/s of a 33/s share): {polite:?}"
    );
}

/// A herd of `n` tenants asking once a second each, in step (a cron job
/// on each), beside a polite tenant asking 10/s: together under the
/// valve's 100/s, so nobody's share is reached. Each second the herd
/// takes much of the valve at once, which the valve's burst is there to
/// absorb: the polite tenant is denied at most 2%, never told to wait
/// more than a second, and the herd itself is not denied.
pub fn a_herd_in_step_leaves_a_polite_tenant_alone(run: Runner<'_>, n: usize) {
    let yaml = config(VALVE, HEAVY);
    let mut senders = herd(n, 0, u64::MAX);
    senders.push(sender("polite", 10.0));
    let run = run(&yaml, &senders, 30_000, 2_000);
    let polite = run.counts[n];
    assert!(
        polite.denied * 100 <= polite.sent * 2 && polite.longest_retry_ms <= 1_000,
        "herd of {n}: polite {polite:?}"
    );
    let herd_denied: u64 = run.counts[..n].iter().map(|c| c.denied).sum();
    assert_eq!(herd_denied, 0, "herd of {n}");
}

/// A valve of each windowed algorithm, written without `share`, saturated
/// by three tenants (150/s each, inside ceilings of 60/s): it admits its
/// whole 100/s (first come, its default), never half.
pub fn a_window_valve_keeps_its_whole_capacity(run: Runner<'_>) {
    for algorithm in ["fixed_window", "sliding_window", "sliding_log"] {
        let valve = format!("{{ name: orders, algorithm: {algorithm}, limit: 100, per: 1s }}");
        let yaml = config(&valve, HEAVY);
        let senders: Vec<Sender> = (1..=3)
            .map(|i| sender(&format!("noisy-{i}"), 150.0))
            .collect();
        let run = run(&yaml, &senders, 12_000, 2_000);
        let admitted: u64 = run.counts.iter().map(|c| c.admitted).sum();
        let rate = admitted as f64 / 10.0;
        assert!(rate >= 95.0, "{algorithm}: {rate:.1}/s of 100/s");
    }
}
