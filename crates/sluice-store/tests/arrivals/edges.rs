//! Fair valves at their edges (issue 45, B), and appendix E's core
//! promises, each scenario run on the store a test file gives it
//! (`fair_edges.rs` and `fair.rs`: memory; `fair_redis.rs`: a real Redis;
//! `fair_cluster.rs`: a real Redis Cluster).

use super::{Count, HEAVY, Run, Sender, VALVE, config, sender, steady};

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

/// Plans `p` (the default), `big` and `small`, each inside a ceiling of
/// 60/s, of the weights given; tenants `big-*` on `big`, `small-*` on
/// `small`; the valve of 100/s.
fn weighted(p: f64, big: f64, small: f64) -> String {
    let plan = |name: &str, weight: f64| {
        format!(
            "  {name}:\n    weight: {weight}\n    tenant: [{{ name: ceiling, algorithm: gcra, limit: 60, per: 1s }}]\n"
        )
    };
    let tenants: String = (1..=3)
        .flat_map(|i| {
            [
                format!("  big-{i}: {{ plan: big }}\n"),
                format!("  small-{i}: {{ plan: small }}\n"),
            ]
        })
        .collect();
    format!(
        "default_plan: p\nplans:\n{}{}{}tenants:\n{tenants}global:\n  \"POST /v1/orders\": [{VALVE}]\n",
        plan("p", p),
        plan("big", big),
        plan("small", small)
    )
}

/// Whether `polite` (of `run`, sent by the sender at `i`) was denied at
/// most 2% of its requests, never told to wait more than a second.
fn spared(run: &Run, i: usize, what: &str) {
    let polite = run.counts[i];
    assert!(
        polite.denied * 100 <= polite.sent * 2 && polite.longest_retry_ms <= 1_000,
        "{what}: polite {polite:?}, all {:?}",
        run.counts
    );
}

/// Whether `run` (10 s measured) used the valve's 100/s, within 5%.
fn whole_valve_used(run: &Run) {
    let total: u64 = run.counts.iter().map(|c| c.admitted).sum();
    assert!(
        total >= 950,
        "{total} of the valve's 1000 in 10 s, {:?}",
        run.counts
    );
}

/// Every weight multiplied by the same factor changes nothing: three noisy
/// tenants and a polite one (10/s) of one plan, at weights from 0.001 to
/// 1000: the polite one is spared, the noisy ones split the rest evenly.
pub fn weights_are_scale_free(run: Runner<'_>) {
    for weight in [0.001, 0.01, 1.0, 1000.0] {
        let yaml = weighted(weight, weight, weight);
        let senders = [
            sender("noisy-1", 150.0),
            sender("noisy-2", 150.0),
            sender("noisy-3", 150.0),
            sender("polite", 10.0),
        ];
        let run = run(&yaml, &senders, 12_000, 2_000);
        spared(&run, 3, &format!("weight {weight}"));
        for i in 0..3 {
            let rate = run.rate(i, 10.0);
            assert!(
                (22.5..=37.5).contains(&rate),
                "weight {weight}: noisy-{} {rate:.1}/s, {:?}",
                i + 1,
                run.counts
            );
        }
    }
}

/// Weights at both ends of their range in one valve. Weighted max-min:
/// a tenant of weight 1000 (at its ceiling of 60/s) and a polite one of
/// weight 1 (10/s) get what they ask; two of weight 0.001 split the rest
/// (15/s each) rather than leave it unused.
pub fn weights_at_both_ends_in_one_valve(run: Runner<'_>) {
    let yaml = weighted(1.0, 1000.0, 0.001);
    let senders = [
        sender("big-1", 150.0),
        sender("small-1", 150.0),
        sender("small-2", 150.0),
        sender("polite", 10.0),
    ];
    let both = run(&yaml, &senders, 12_000, 2_000);
    spared(&both, 3, "1000, 0.001 and 1");
    let big = both.rate(0, 10.0);
    assert!(big >= 57.0, "big-1 {big:.1}/s, {:?}", both.counts);
    whole_valve_used(&both);

    // Only the light ones saturate, beside a polite one of weight 1000:
    // they still have the valve between them.
    let senders = [
        sender("small-1", 150.0),
        sender("small-2", 150.0),
        sender("small-3", 150.0),
        sender("big-1", 10.0),
    ];
    let light = run(&yaml, &senders, 12_000, 2_000);
    spared(&light, 3, "0.001 beside 1000");
    whole_valve_used(&light);

    // Heavy ones start saturating too, once the light ones are the
    // reference: the heavy ones share the valve (a light one's share is a
    // millionth of theirs) and a polite heavy one is spared.
    let later = |s: Sender| Sender {
        from_ms: 4_000,
        ..s
    };
    let senders = [
        sender("small-1", 150.0),
        sender("small-2", 150.0),
        later(sender("big-1", 150.0)),
        later(sender("big-2", 150.0)),
        later(sender("big-3", 10.0)),
    ];
    let heavy = run(&yaml, &senders, 18_000, 8_000);
    spared(&heavy, 4, "1000 beside 1000 and 0.001");
    for i in 2..4 {
        let rate = heavy.rate(i, 10.0);
        assert!(
            (33.75..=56.25).contains(&rate),
            "big-{}: {rate:.1}/s, {:?}",
            i - 1,
            heavy.counts
        );
    }
}

/// Forty tenant ids of weight 1 (10/s each) beside one of weight 10
/// (asking 150/s): weights are per tenant, so the forty together weigh 40
/// against 10 and take about 80% of the valve. A reserve for the heavy
/// plan is what holds its part (CONFIG.md, "Weights").
pub fn many_light_ids_outweigh_a_heavy_one_unless_it_reserves(run: Runner<'_>) {
    let yaml = |reserve: &str| {
        format!(
            r#"
default_plan: p
plans:
  p:
    tenant: [{{ name: ceiling, algorithm: gcra, limit: 60, per: 1s }}]
  heavy:
    weight: 10
    tenant: [{{ name: ceiling, algorithm: gcra, limit: 1000, per: 1s }}]
tenants:
  heavy: {{ plan: heavy }}
global:
  "POST /v1/orders": [{{ name: orders, algorithm: gcra, limit: 100, per: 1s{reserve} }}]
"#
        )
    };
    let mut senders: Vec<Sender> = (0..40).map(|i| sender(&format!("id-{i}"), 10.0)).collect();
    senders.push(sender("heavy", 150.0));
    let plain = run(&yaml(""), &senders, 12_000, 2_000);
    let heavy = plain.rate(40, 10.0);
    assert!(
        (15.0..=30.0).contains(&heavy),
        "without a reserve: heavy {heavy:.1}/s"
    );
    let reserved = run(
        &yaml(r#", reserve: { heavy: "50%" }"#),
        &senders,
        12_000,
        2_000,
    );
    let heavy = reserved.rate(40, 10.0);
    // At least its reserve, within the noise of Poisson arrivals (5%).
    assert!(
        heavy >= 50.0 * 0.95,
        "with a 50% reserve: heavy {heavy:.1}/s, {:?}",
        reserved.counts[40]
    );
}

/// Three noisy tenants inside their ceilings saturate a valve of 100/s; a
/// polite one asking 10/s, below its share, is (almost) never denied, the
/// noisy ones share the rest evenly, and the valve's limit holds.
pub fn a_polite_tenant_below_its_share_is_not_starved(run: Runner<'_>) {
    let yaml = config(VALVE, HEAVY);
    let senders = [
        sender("noisy-1", 150.0),
        sender("noisy-2", 150.0),
        sender("noisy-3", 150.0),
        sender("polite", 10.0),
    ];
    let run = run(&yaml, &senders, 20_000, 2_000);
    let Count { sent, denied, .. } = run.counts[3];
    assert!(
        denied * 100 <= sent * 2,
        "the polite tenant was denied {denied} of {sent} by the valve"
    );
    // The noisy ones share what is left (90/s) evenly: 30/s each, ±25%.
    for (i, &Count { admitted, .. }) in run.counts[..3].iter().enumerate() {
        let rate = admitted as f64 / 18.0;
        assert!(
            (22.5..=37.5).contains(&rate),
            "noisy-{}: {rate:.1}/s admitted, {:?}",
            i + 1,
            run.counts
        );
    }
    // The valve's own limit holds: at most 100 a second, and its burst
    // once.
    let total: u64 = run.admitted_per_second.iter().sum();
    assert!(total <= 100 * 20 + 100, "{total} admitted in 20 s");
}

/// A valve of 100/s reserving `reserve` of itself for plan `ent`, whose
/// tenants `ent-1` and `ent-2` have a ceiling above the valve; everyone
/// else is inside a ceiling of 60/s.
pub fn reserved(reserve: &str) -> String {
    format!(
        r#"
default_plan: p
plans:
  p:
    tenant: [{{ name: ceiling, algorithm: gcra, limit: 60, per: 1s }}]
  ent:
    tenant: [{{ name: ceiling, algorithm: gcra, limit: 1000, per: 1s }}]
tenants:
  ent-1: {{ plan: ent }}
  ent-2: {{ plan: ent }}
global:
  "POST /v1/orders": [{{ name: orders, algorithm: gcra, limit: 100, per: 1s, reserve: {{ ent: "{reserve}" }} }}]
"#
    )
}

pub fn a_reserve_holds_its_part_for_its_plan_while_others_saturate_the_valve(run: Runner<'_>) {
    // Without a reserve, the four tenants' fair share is 25/s: `ent-1`
    // asking for 35/s would be held to about 25 (denied some 30%).
    let senders = [
        sender("noisy-1", 150.0),
        sender("noisy-2", 150.0),
        sender("noisy-3", 150.0),
        sender("ent-1", 35.0),
    ];
    let reserving = run(&reserved("40%"), &senders, 20_000, 2_000);
    let Count {
        sent,
        admitted,
        denied,
        ..
    } = reserving.counts[3];
    assert!(
        denied * 100 <= sent * 2,
        "ent-1 under its reserve was denied {denied} of {sent} ({admitted} admitted)"
    );
    // The others share what is left of the valve (about 65/s) evenly.
    for (i, &Count { admitted, .. }) in reserving.counts[..3].iter().enumerate() {
        let rate = admitted as f64 / 18.0;
        assert!(
            (65.0 / 3.0 * 0.75..=65.0 / 3.0 * 1.25).contains(&rate),
            "noisy-{}: {rate:.1}/s, {:?}",
            i + 1,
            reserving.counts
        );
    }
    let total: u64 = reserving.admitted_per_second.iter().sum();
    assert!(total <= 100 * 20 + 100, "{total} admitted in 20 s");

    // The same load on a valve without the reserve: ent-1 is held to its
    // fair share (what the reserve changes).
    let plain = reserved("40%").replace(", reserve: { ent: \"40%\" }", "");
    let plain = run(&plain, &senders, 20_000, 2_000);
    let Count { sent, denied, .. } = plain.counts[3];
    assert!(denied * 100 > sent * 10, "{denied} of {sent}");
}
