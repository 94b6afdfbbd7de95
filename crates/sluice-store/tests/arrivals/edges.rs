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
