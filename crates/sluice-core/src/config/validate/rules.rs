//! A list of rules, and each rule in it.

use serde_saphyr::Location;

use super::{MAX_NAME_BYTES, Validator};
use crate::config::raw::{RawCountIf, RawRule, RawStatus, S};
use crate::config::{NamedRule, RegionScope};
use crate::duration::parse_duration_ms;
use crate::rule::{Algorithm, Rule};
use crate::status::StatusSet;

/// Most rules in one list (a plan's `tenant` rules, one pattern's
/// `routes` or `subject` rules, one `global` valve). A request is decided
/// against at most four lists, all in one call to the store: bounded, so
/// that call's arguments and answer are (Redis's Lua gives up on more than
/// about 2,000 rules in a call; 4 × 64 stays far below).
pub const MAX_RULES_PER_LIST: usize = 64;

impl Validator<'_> {
    pub(in crate::config) fn rules(&mut self, raw: Vec<S<RawRule>>, scope: &str) -> Vec<NamedRule> {
        if let Some(extra) = raw.get(MAX_RULES_PER_LIST) {
            self.push(
                extra.referenced,
                format!(
                    "a list of `{scope}` rules holds at most {MAX_RULES_PER_LIST} rules, got {}",
                    raw.len()
                ),
            );
        }
        let mut out: Vec<NamedRule> = Vec::with_capacity(raw.len());
        for (index, rule) in raw.into_iter().enumerate() {
            let at = rule.referenced;
            self.no_share(&rule.value, scope);
            let name = match &rule.value.name {
                Some(n) => {
                    let ok = !n.value.is_empty()
                        && n.value.len() <= MAX_NAME_BYTES
                        && n.value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
                    if !ok {
                        self.push(
                            n.referenced,
                            format!("`name` must be 1 to {MAX_NAME_BYTES} letters, digits, `_`, `-` or `.`, got `{}`", n.value),
                        );
                    }
                    if out.iter().any(|r| r.name == n.value) {
                        self.push(
                            n.referenced,
                            format!("`name` `{}` is used twice in this list", n.value),
                        );
                    }
                    n.value.clone()
                }
                None => format!("{scope}-{index}"),
            };
            let shadow = rule.value.shadow.as_ref().is_some_and(|s| s.value);
            let count_if = self.count_if(rule.value.count_if.as_ref(), at);
            if let (Some(raw), Some(algorithm)) = (&rule.value.count_if, &rule.value.algorithm)
                && algorithm.value == "concurrency"
            {
                self.push(
                    raw.referenced,
                    "`count_if` is not for `algorithm: concurrency`: a check only asks whether a slot is free, so it could hold no attempt; count outcomes with a rate rule (gcra, token_bucket, fixed_window, sliding_window or sliding_log)",
                );
            }
            let tolerance = rule.value.tolerance.clone();
            let regions = rule.value.regions.clone();
            if let Some(rule) = self.rule(rule.value, at) {
                let regions = self.region_scope(regions, &rule, scope);
                let tolerance =
                    self.tolerance(tolerance.as_ref(), &rule, scope, count_if.is_some());
                self.bucket_across_regions(&rule, (regions, scope), tolerance, at);
                out.push(NamedRule {
                    name,
                    rule,
                    shadow,
                    count_if,
                    tolerance,
                    regions,
                });
            }
        }
        out
    }

    /// A `gcra` or `token_bucket` shared across regions holds in each
    /// region the region's share of its burst ([`crate::regions::bucket`]):
    /// refused when some region's share holds less than one unit (no
    /// region could admit anything).
    fn bucket_across_regions(
        &mut self,
        rule: &Rule,
        (regions, scope): (Option<RegionScope>, &str),
        tolerance: crate::tolerance::Tolerance,
        at: Location,
    ) {
        use crate::regions::bucket::Terms;
        use crate::scope::Scope;
        let Some(weights) = self.region_weights.clone() else {
            return;
        };
        let scope = match scope {
            "tenant" => Scope::Tenant,
            "route" => Scope::Route,
            "subject" => Scope::Subject,
            "descriptor" => Scope::Descriptor,
            _ => Scope::Global,
        };
        let shared = regions.unwrap_or_else(|| RegionScope::default_for(scope, rule));
        if shared != RegionScope::Shared || !rule.algorithm().has_burst() {
            return;
        }
        let (per, burst) = (rule.period_ms(), rule.burst());
        let pool = crate::regions::pool(rule.limit(), tolerance);
        let least = (0..weights.len())
            .map(|i| crate::regions::share(pool, &weights, i))
            .min()
            .unwrap_or(pool);
        let regions = weights.len();
        if least == 0 {
            self.push(
                at,
                format!(
                    "`limit` {} is too small to share across {regions} regions by their weights: a region's share of it is 0; raise `limit`, or `regions: local`",
                    rule.limit()
                ),
            );
            return;
        }
        // As the scripts compute it: the least share's capacity, units × per.
        let holds =
            |burst: u64| Terms::new(burst, per, pool, 0).capacity(least as i64) >= per as i64;
        if !holds(burst) {
            let need = (pool.div_ceil(least)..).find(|&b| holds(b)).unwrap_or(pool);
            self.push(
                at,
                format!(
                    "`burst` {burst} is too small to share across {regions} regions: each holds its share of it (the least {least} of {pool} per `per`), less than one unit; set `burst` to at least {need}, or `regions: local`"
                ),
            );
        }
    }

    /// `regions: shared | local`; shared is refused where a region's own
    /// budget is the only one that makes sense, or its state cannot be
    /// shared out (yet).
    fn region_scope(
        &mut self,
        value: Option<S<String>>,
        rule: &Rule,
        scope: &str,
    ) -> Option<RegionScope> {
        let value = value?;
        match value.value.as_str() {
            "shared" => {}
            "local" => return Some(RegionScope::Local),
            other => {
                self.push(
                    value.referenced,
                    format!(
                        "unknown `regions` `{other}`; allowed: shared (one budget across regions), local (one budget per region)"
                    ),
                );
                return None;
            }
        }
        let refused = if scope == "global" {
            Err("a valve protects each region's own downstream")
        } else {
            RegionScope::shareable(rule)
        };
        if let Err(why) = refused {
            self.push(
                value.referenced,
                format!("`regions: shared` is not for this rule: {why}; use `regions: local`"),
            );
            return None;
        }
        Some(RegionScope::Shared)
    }

    fn rule(&mut self, raw: RawRule, at: Location) -> Option<Rule> {
        let algorithm = match &raw.algorithm {
            None => Algorithm::Gcra,
            Some(a) => self.algorithm(a)?,
        };
        if algorithm == Algorithm::Concurrency {
            return self.concurrency_rule(&raw, at);
        }
        if let Some(lease) = &raw.lease {
            self.push(
                lease.referenced,
                "`lease` is only for `algorithm: concurrency`; rate rules take `per`",
            );
            return None;
        }
        let Some(limit) = &raw.limit else {
            self.push(at, "rule needs `limit`, the number of units per `per`");
            return None;
        };
        let Some(per) = &raw.per else {
            self.push(at, "rule needs `per`, a duration such as 1s, 1m or 1h");
            return None;
        };
        let per_ms = match parse_duration_ms(&per.value) {
            Ok(ms) => ms,
            Err(e) => {
                self.push(per.referenced, format!("`per`: {e}"));
                return None;
            }
        };
        let aligned = raw.aligned.as_ref().is_some_and(|a| a.value);
        match Rule::new(
            algorithm,
            limit.value.into(),
            per_ms,
            raw.burst.as_ref().map(|b| b.value.into()),
            aligned,
        ) {
            Ok(rule) => match &raw.max_debt {
                None => Some(rule),
                Some(debt) => match rule.with_max_debt(debt.value.into()) {
                    Ok(rule) => Some(rule),
                    Err(e) => {
                        self.push(debt.referenced, e.to_string());
                        None
                    }
                },
            },
            Err(e) => {
                use crate::rule::RuleError as E;
                let place = match e {
                    E::Limit(..) | E::SlidingLogTooLarge(_) => limit.referenced,
                    E::TooLarge { field: "limit", .. } => limit.referenced,
                    E::Period(_) => per.referenced,
                    E::Burst(_) | E::BurstNotAllowed(_) | E::TooLarge { .. } => {
                        raw.burst.as_ref().map_or(at, |b| b.referenced)
                    }
                    E::AlignedNotAllowed(..) => raw.aligned.as_ref().map_or(at, |a| a.referenced),
                    E::ConcurrencyTooLarge(_) | E::Lease(_) => at,
                    E::MaxDebt(..) | E::MaxDebtNotAllowed => at,
                };
                self.push(place, e.to_string());
                None
            }
        }
    }

    /// The algorithm `a` names; `None`, with an error listing the algorithms
    /// allowed, when it names none.
    pub(in crate::config) fn algorithm(&mut self, a: &S<String>) -> Option<Algorithm> {
        let algorithm = Algorithm::from_name(&a.value);
        if algorithm.is_none() {
            let allowed: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
            self.push(
                a.referenced,
                format!(
                    "unknown `algorithm` `{}`; allowed: {}",
                    a.value,
                    allowed.join(", ")
                ),
            );
        }
        algorithm
    }

    /// `count_if: { status: [...] }`: which responses the rule counts.
    fn count_if(&mut self, raw: Option<&S<RawCountIf>>, at: Location) -> Option<StatusSet> {
        let raw = raw?;
        let Some(status) = &raw.value.status else {
            self.push(
                raw.referenced,
                "`count_if` needs `status`, a list of codes (401) or classes (\"4xx\")",
            );
            return None;
        };
        if status.value.is_empty() {
            self.push(status.referenced, "`count_if.status` lists no status: name at least one code (401) or class (\"4xx\")");
            return None;
        }
        let texts: Vec<String> = status
            .value
            .iter()
            .map(|s| match &s.value {
                RawStatus::Code(code) => code.to_string(),
                RawStatus::Text(text) => text.clone(),
            })
            .collect();
        match StatusSet::parse(texts.iter().map(String::as_str)) {
            Ok(set) => Some(set),
            Err(e) => {
                let place = status
                    .value
                    .iter()
                    .zip(&texts)
                    .find(|(_, t)| **t == e.0)
                    .map_or(at, |(s, _)| s.referenced);
                self.push(place, e.to_string());
                None
            }
        }
    }

    /// `{algorithm: concurrency, limit, lease}`.
    fn concurrency_rule(&mut self, raw: &RawRule, at: Location) -> Option<Rule> {
        for (field, place) in [
            ("per", raw.per.as_ref().map(|p| p.referenced)),
            ("burst", raw.burst.as_ref().map(|b| b.referenced)),
            ("aligned", raw.aligned.as_ref().map(|a| a.referenced)),
            ("max_debt", raw.max_debt.as_ref().map(|d| d.referenced)),
        ] {
            if let Some(place) = place {
                self.push(
                    place,
                    format!("`{field}` is not for `algorithm: concurrency`, which takes `limit` (leases at once) and `lease` (how long one may be held)"),
                );
                return None;
            }
        }
        let Some(limit) = &raw.limit else {
            self.push(
                at,
                "a concurrency rule needs `limit`, the number of leases held at once",
            );
            return None;
        };
        let Some(lease) = &raw.lease else {
            self.push(at, "a concurrency rule needs `lease`, how long one may be held before it expires, such as 30s");
            return None;
        };
        let lease_ms = match parse_duration_ms(&lease.value) {
            Ok(ms) => ms,
            Err(e) => {
                self.push(lease.referenced, format!("`lease`: {e}"));
                return None;
            }
        };
        match Rule::concurrency(limit.value.into(), lease_ms) {
            Ok(rule) => Some(rule),
            Err(e) => {
                let place = match e {
                    crate::rule::RuleError::Lease(_) => lease.referenced,
                    _ => limit.referenced,
                };
                self.push(place, e.to_string());
                None
            }
        }
    }
}
