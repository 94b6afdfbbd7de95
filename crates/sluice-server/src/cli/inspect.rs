use std::process::ExitCode;

use sluice_core::duration::HumanDuration;
use sluice_core::{BoundRule, Policy, Request, Rule, Scope, State};
use sluice_store::Batch;

use super::InspectArgs;
use crate::backend::Backend;
use crate::source::Source;

pub(super) fn run(args: InspectArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(inspect(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn inspect(args: InspectArgs) -> crate::Fallible<()> {
    let config = Source::from_arg(args.config).load()?;
    let store = Backend::connect(&config.storage, &config.keys).await?;
    if store.memory().is_some() {
        return Err("inspect reads a shared store; with `storage.backend: memory` each `sluice serve` keeps its state in its own process".into());
    }
    let policy = Policy::compile_for(&config.limits, store.shards_tenants());
    // Without --route only the tenant's own rules are shown.
    let route = args.route.as_deref().unwrap_or("*");
    let request = Request::new(&args.tenant, route, args.subject.as_deref(), 1)?;
    let applicable = policy.applicable(request.tenant, route, request.subject.is_some());
    let rules: Vec<BoundRule> = applicable
        .rules
        .iter()
        .filter(|r| args.route.is_some() || r.scope() == Scope::Tenant)
        .cloned()
        .collect();
    println!(
        "tenant {:?}: plan {}, {} shard{}",
        args.tenant,
        applicable.plan.map_or("-", |p| p.name()),
        applicable.shards,
        if applicable.shards == 1 { "" } else { "s" }
    );
    println!(
        "{:<8} {:<16} {:<15} {:<22} {:>10} {:>10} {:>10}  key",
        "scope", "policy", "algorithm", "limit", "used", "remaining", "full in"
    );
    for shard in 0..applicable.shards {
        if applicable.shards > 1 {
            println!("shard {shard}:");
        }
        let batch = Batch {
            tenant: request.tenant,
            subject: request.subject,
            shard,
            cost: 1,
            rules: &rules,
            partitions: &[],
            costs: &[],
            lease: None,
        };
        let peeked = store
            .peek(&batch)
            .await
            .ok_or("the memory store cannot be inspected")??;
        for (rule, (key, state, enforced)) in rules.iter().zip(peeked.rows) {
            print_row(rule, &enforced, &key, &state, peeked.now);
        }
    }
    if let Backend::Cluster(cluster) = &store
        && rules.iter().any(|r| r.scope() == Scope::Global)
    {
        println!(
            "global limits are split over up to {} keys on Redis Cluster (storage.global_shards): their rows show shard 0 and its share",
            cluster.valve_shards()
        );
    }
    Ok(())
}

/// One rule's row; `r` is the rule as the store enforces it (on Redis
/// Cluster, a global valve's shard holds a share of the limit).
fn print_row(rule: &BoundRule, r: &Rule, key: &str, state: &State, now: u64) {
    let capacity = r.capacity();
    // What one more unit would find: its `remaining` is after that unit.
    let (probe, _) = r.decide(state, now, 1);
    let remaining = if probe.allowed {
        u64::from(probe.remaining) + 1
    } else {
        u64::from(probe.remaining)
    };
    let full_in = r.idle_at(state).saturating_sub(now);
    let mut limit = format!("{}/{}", r.limit(), HumanDuration(r.period_ms()));
    if r.algorithm().has_burst() && r.burst() != r.limit() {
        limit.push_str(&format!(" burst {}", r.burst()));
    }
    let full_in = if full_in == 0 {
        "full".to_owned()
    } else {
        approximately(full_in)
    };
    println!(
        "{:<8} {:<16} {:<15} {:<22} {:>10} {:>10} {:>10}  {key}",
        rule.scope().name(),
        rule.name(),
        r.algorithm().name(),
        limit,
        capacity.saturating_sub(remaining),
        remaining,
        full_in,
    );
}

/// A wait for people to read: its two largest units (`1h5m`, `4.2s`).
fn approximately(ms: u64) -> String {
    const S: u64 = 1_000;
    const M: u64 = 60 * S;
    const H: u64 = 60 * M;
    const D: u64 = 24 * H;
    match ms {
        0..S => format!("{ms}ms"),
        S..M => format!("{}.{}s", ms / S, ms % S / 100),
        M..H => format!("{}m{}s", ms / M, ms % M / S),
        H..D => format!("{}h{}m", ms / H, ms % H / M),
        _ => format!("{}d{}h", ms / D, ms % D / H),
    }
}

#[cfg(test)]
mod tests {
    use super::approximately;

    #[test]
    fn waits_read_in_their_two_largest_units() {
        assert_eq!(approximately(8), "8ms");
        assert_eq!(approximately(4_250), "4.2s");
        assert_eq!(approximately(3_599_968), "59m59s");
        assert_eq!(approximately(86_399_960), "23h59m");
        assert_eq!(approximately(90_000_000), "1d1h");
    }
}
