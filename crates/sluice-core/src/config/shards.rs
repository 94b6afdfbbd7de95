//! A sharded tenant's plan: every tenant, route and subject rule cut into
//! one shard's share.
//!
//! A tenant with `shards: N` has N sets of buckets, each enforcing
//! `⌊limit/N⌋` and `⌊burst/N⌋` of every rule, so it gets at most `limit`
//! in all. A rule whose `limit` or `burst` is below N is not divided (a
//! share of at least 1 on each of N shards gave the tenant up to N where
//! the rule says less: `factor: 0.05` of 40 over 8 shards admitted 8, not
//! 2): it is kept whole on shard 0, exact, like concurrency rules and the
//! duplicate guard (see [`Rule::share`](crate::Rule::share)).

use super::{NamedRule, PlanSpec, RouteRules};

/// The plan `spec` as one of `shards` shards enforces it.
pub fn shard_share(spec: &PlanSpec, shards: u16) -> PlanSpec {
    let share = |named: &NamedRule| NamedRule {
        // Counted by outcome: kept whole on shard 0 (see
        // `BoundRule::on_first_shard`).
        rule: if named.rule.is_concurrency() || named.count_if.is_some() {
            named.rule
        } else {
            named.rule.for_shards(u64::from(shards))
        },
        ..named.clone()
    };
    let table = |rules: &[RouteRules]| -> Vec<RouteRules> {
        rules
            .iter()
            .map(|r| RouteRules {
                pattern: r.pattern.clone(),
                rules: r.rules.iter().map(share).collect(),
            })
            .collect()
    };
    PlanSpec {
        name: spec.name.clone(),
        tenant: spec.tenant.iter().map(share).collect(),
        routes: table(&spec.routes),
        subject: table(&spec.subject),
        dedupe: spec.dedupe.clone(),
        on_error: spec.on_error,
        weight: spec.weight,
        priority: spec.priority,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    #[test]
    fn a_rule_below_the_shard_count_is_kept_whole() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ name: t, limit: 40, per: 1m }]\n    routes:\n      \"*\": [{ name: r, algorithm: token_bucket, limit: 40, per: 1s, burst: 4 }]\n";
        let spec = &Config::from_yaml(yaml, "t.yaml").unwrap().limits.plans[0];
        let cut = shard_share(spec, 8);
        let tenant = cut.tenant[0].rule;
        assert_eq!((tenant.limit(), tenant.is_whole()), (5, false));
        let route = cut.routes[0].rules[0].rule;
        assert_eq!(
            (route.limit(), route.burst(), route.is_whole()),
            (40, 4, true)
        );
        assert_eq!(shard_share(spec, 4).routes[0].rules[0].rule.burst(), 1);
    }
}
