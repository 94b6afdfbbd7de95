//! A rule bound to its place in the policy: its name, scope and the
//! identity its state is stored under.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::config::{NamedRule, RegionScope};
use crate::duration::seconds_rounded_up;
use crate::rule::{Algorithm, Rule};
use crate::scope::Scope;
use crate::status::StatusSet;
use crate::tolerance::Tolerance;

/// A rule bound to its place in the policy: its name, scope and stable
/// identity, plus what the hot path would otherwise compute per request.
#[derive(Debug, Clone)]
pub struct BoundRule {
    /// What a rule's copies share: a copy (a fair valve's gate at the rate
    /// of one decision, an Envoy descriptor's rules) costs one reference
    /// count, not one per text.
    texts: Arc<Texts>,
    scope: Scope,
    rule: Rule,
    shadow: bool,
    tolerance: Tolerance,
    /// One budget across regions (`regions: shared`, SPEC appendix H),
    /// where `storage.regions` links them.
    shared: bool,
    /// A shared `gcra` or `token_bucket`'s identity across linked regions
    /// (see [`Keyer::linking_regions`](crate::keys::Keyer::linking_regions)):
    /// its identity and its period.
    shared_identity: Option<Arc<[u8]>>,
    /// An adaptive valve (appendix I): its limit is set per decision.
    adaptive: bool,
    /// The length of the identity's scope and pattern (see `group`).
    group_len: usize,
    uid: u64,
    near_at_remaining: u64,
}

/// A bound rule's texts.
#[derive(Debug)]
struct Texts {
    name: Box<str>,
    pattern: Box<str>,
    identity: Box<[u8]>,
    policy_item: Box<str>,
    count_if: Option<StatusSet>,
}

impl Texts {
    /// The same texts under another identity.
    fn with_identity(&self, identity: Vec<u8>) -> Arc<Texts> {
        Arc::new(Texts {
            name: self.name.clone(),
            pattern: self.pattern.clone(),
            identity: identity.into(),
            policy_item: self.policy_item.clone(),
            count_if: self.count_if.clone(),
        })
    }
}

impl BoundRule {
    /// Binds a rule to its scope and pattern (`""` for tenant rules; the
    /// descriptor path for Envoy descriptors). Clones are cheap: the text is
    /// shared.
    pub fn new(scope: Scope, pattern: &str, named: &NamedRule, near_limit: f64) -> BoundRule {
        let rule = named.rule;
        // The identity names the bucket across reloads and restarts: same
        // scope, pattern, name and algorithm → same state. Parameters are
        // left out so that raising a limit keeps the budget already used.
        let mut identity = Vec::with_capacity(64);
        let mut group_len = 0;
        for (i, part) in [scope.name(), pattern, &named.name, rule.algorithm().name()]
            .into_iter()
            .enumerate()
        {
            identity.extend_from_slice(part.as_bytes());
            identity.push(0x1f);
            if i == 1 {
                group_len = identity.len();
            }
        }
        let digest = Sha256::digest(&identity);
        let uid = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
        let capacity = rule.capacity();
        let used_at_near = ((capacity as f64) * near_limit).ceil() as u64;
        BoundRule {
            texts: Arc::new(Texts {
                name: named.name.as_str().into(),
                pattern: pattern.into(),
                identity: identity.into(),
                policy_item: policy_item(&named.name, &rule).into(),
                count_if: named.count_if.clone(),
            }),
            scope,
            rule,
            shadow: named.shadow,
            tolerance: named.tolerance,
            shared: named
                .regions
                .unwrap_or_else(|| RegionScope::default_for(scope, &rule))
                == RegionScope::Shared,
            shared_identity: None,
            adaptive: false,
            group_len,
            uid,
            near_at_remaining: capacity.saturating_sub(used_at_near.min(capacity)),
        }
        .with_shared_identity()
    }

    /// The gate of fair valve `valve` (see [`Scope::Share`]): named by the
    /// valve, in the valve's shadow mode, with the valve's rule until the
    /// limiter gives it a rate ([`with_rule`](Self::with_rule)). Its state
    /// is a record among the tenant's tenant-scope ones (one storage key
    /// fewer to read and write per decision), named by the valve's
    /// identity: the same across reloads that keep the valve.
    pub fn gate(valve: &BoundRule) -> BoundRule {
        let mut identity = Vec::with_capacity(valve.texts.identity.len() + 24);
        identity.extend_from_slice(Scope::Tenant.name().as_bytes());
        identity.extend_from_slice(&[0x1f, 0x1f]);
        let group_len = identity.len();
        identity.extend_from_slice(b"share:");
        identity.extend_from_slice(&valve.texts.identity);
        identity.push(0x1f);
        // A token bucket (its tokens are units whatever its rate); named
        // so, a gcra gate's state of an older release is not read as one.
        identity.extend_from_slice(Algorithm::TokenBucket.name().as_bytes());
        identity.push(0x1f);
        let digest = Sha256::digest(&identity);
        let uid = u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"));
        BoundRule {
            texts: valve.texts.with_identity(identity),
            scope: Scope::Share,
            shared: false,
            adaptive: false,
            group_len,
            uid,
            near_at_remaining: 0,
            ..valve.clone()
        }
    }

    /// The part of valve `valve` reserved for plan `plan`, holding `rule`
    /// (see [`crate::valve`]): named by the valve (its denials are the
    /// valve's), in its shadow mode, with state of its own.
    pub fn reserve_part(valve: &BoundRule, plan: &str, rule: Rule) -> BoundRule {
        let mut identity = Vec::with_capacity(valve.texts.identity.len() + plan.len() + 10);
        identity.extend_from_slice(&valve.texts.identity);
        identity.extend_from_slice(b"reserve:");
        identity.extend_from_slice(plan.as_bytes());
        identity.push(0x1f);
        let digest = Sha256::digest(&identity);
        BoundRule {
            texts: valve.texts.with_identity(identity),
            rule,
            uid: u64::from_le_bytes(digest[..8].try_into().expect("8 bytes")),
            ..valve.clone()
        }
    }

    /// The same rule (name, scope, identity: the same state) with other
    /// parameters: a fair valve's gate at the rate of one decision.
    pub fn with_rule(&self, rule: Rule) -> BoundRule {
        let bound = BoundRule {
            rule,
            shared: self.shared && RegionScope::shareable(&rule).is_ok(),
            ..self.clone()
        };
        let same = (bound.shared, rule.algorithm(), rule.period_ms())
            == (self.shared, self.rule.algorithm(), self.rule.period_ms());
        if same {
            bound
        } else {
            bound.with_shared_identity()
        }
    }

    /// With its identity across linked regions, when it is a shared
    /// bucket.
    fn with_shared_identity(mut self) -> BoundRule {
        self.shared_identity = (self.shared && self.rule.algorithm().has_burst()).then(|| {
            let mut identity = self.texts.identity.to_vec();
            identity.extend_from_slice(b"shared per ");
            identity.extend_from_slice(self.rule.period_ms().to_string().as_bytes());
            identity.into()
        });
        self
    }

    /// A shared `gcra` or `token_bucket`'s identity across linked regions:
    /// its state is a region's part of a rate in units of its period, kept
    /// apart from its state in one region (`None` for other rules).
    pub fn shared_identity(&self) -> Option<&[u8]> {
        self.shared_identity.as_deref()
    }

    /// Whether its budget is one across regions, where `storage.regions`
    /// links them (see [`crate::regions`]).
    pub fn shared_across_regions(&self) -> bool {
        self.shared
    }

    /// The policy name shown in headers and denials.
    pub fn name(&self) -> &str {
        &self.texts.name
    }

    /// The scope.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// Whether the rule only observes: its denials are counted, never
    /// enforced.
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// Whether it is an adaptive valve, whose limit the limiter sets per
    /// decision (appendix I).
    pub fn adaptive(&self) -> bool {
        self.adaptive
    }

    /// The same rule, marked adaptive.
    pub(crate) fn made_adaptive(mut self) -> BoundRule {
        self.adaptive = true;
        self
    }

    /// How far over its limit a hot key of this rule may be admitted
    /// from local slices ([`Tolerance::EXACT`]: never).
    pub fn tolerance(&self) -> Tolerance {
        self.tolerance
    }

    /// The route pattern the rule was configured under (`""` for tenant
    /// rules).
    pub fn pattern(&self) -> &str {
        &self.texts.pattern
    }

    /// The algorithm and its parameters.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }

    /// The units a request costing `cost` consumes of this rule: one
    /// admission of a duplicate guard, one slot of a concurrency rule,
    /// `cost` of any other. Only the latter take part in cost.
    #[inline]
    pub fn units(&self, cost: u64) -> u64 {
        if self.counts_once() { 1 } else { cost }
    }

    /// Whether this rule's keys stay on shard 0 of a sharded tenant,
    /// whichever shard a decision uses: a duplicate guard (one fingerprint,
    /// one key), a concurrency rule (one lease, one place to release it
    /// from), a rule too small to divide ([`Rule::is_whole`]) and a rule
    /// that counts by outcome (an attempt is concluded where it was held).
    pub fn on_first_shard(&self) -> bool {
        self.scope == Scope::Dedupe
            || self.rule.is_concurrency()
            || self.rule.is_whole()
            || self.texts.count_if.is_some()
    }

    /// The responses this rule counts (`count_if`), when it counts by
    /// outcome: a decision holds the request there as an attempt, kept
    /// when the response's status is one of these.
    pub fn count_if(&self) -> Option<&StatusSet> {
        self.texts.count_if.as_ref()
    }

    /// Whether this rule counts a response of `status` (false for a rule
    /// that does not count by outcome).
    pub fn counts(&self, status: u16) -> bool {
        self.count_if().is_some_and(|set| set.matches(status))
    }

    /// Whether a request takes one unit of this rule whatever it costs.
    pub(crate) fn counts_once(&self) -> bool {
        self.scope == Scope::Dedupe || self.rule.is_concurrency()
    }

    /// Stable bytes naming this bucket (scope, pattern, name, algorithm);
    /// storage keys are derived from them.
    pub fn identity(&self) -> &[u8] {
        &self.texts.identity
    }

    /// The part of the identity that names the rule's scope and pattern:
    /// the rules of one group whose state is a few numbers share one
    /// storage key (see `keys`).
    pub fn group(&self) -> &[u8] {
        &self.texts.identity[..self.group_len]
    }

    /// A 64-bit digest of [`identity`](Self::identity).
    pub fn uid(&self) -> u64 {
        self.uid
    }

    /// Whether clients are told about this rule: never about a hidden one,
    /// nor about a shadow rule (it is not enforced).
    pub fn advertised(&self) -> bool {
        !self.hidden() && !self.shadow
    }

    /// Whether what this rule holds is kept from clients, in every answer
    /// (headers, Envoy descriptor statuses): a global valve's remaining
    /// capacity, or its gates' (the tenant's share of it), would show
    /// other tenants' traffic; a duplicate guard's would show what it
    /// remembers. A denial by one is still a denial.
    pub fn hidden(&self) -> bool {
        matches!(self.scope, Scope::Global | Scope::Dedupe | Scope::Share)
    }

    /// This rule's `RateLimit-Policy` item.
    pub fn policy_item(&self) -> &str {
        &self.texts.policy_item
    }

    /// Whether `remaining` units left put the rule at or past the
    /// `near_limit` threshold.
    pub fn is_near(&self, remaining: u64) -> bool {
        remaining <= self.near_at_remaining
    }
}

/// The `RateLimit-Policy` value of `rules`: the items of those advertised,
/// in order. Compiled once per rule set (a plan's class, a descriptor's
/// limit), never per request.
pub fn policy_header(rules: &[BoundRule]) -> String {
    rules
        .iter()
        .filter(|r| r.advertised())
        .map(BoundRule::policy_item)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One `RateLimit-Policy` item, computed once per rule when the policy is
/// compiled.
pub fn policy_item(name: &str, rule: &Rule) -> String {
    if rule.is_concurrency() {
        // Requests in flight, not per window.
        return format!("\"{name}\";q={};qu=\"concurrent-requests\"", rule.limit());
    }
    format!(
        "\"{name}\";q={};w={}",
        rule.capacity(),
        seconds_rounded_up(refill_ms(rule)).max(1)
    )
}

/// How long `rule` takes to refill its whole capacity from empty, in ms
/// rounded up: `capacity × per / limit` (its `per` when the capacity is
/// the limit). The configuration keeps `burst × per` under 2^52; 128 bits
/// only so that no rule built otherwise can overflow it.
fn refill_ms(rule: &Rule) -> u64 {
    let ms = (u128::from(rule.capacity()) * u128::from(rule.period_ms()))
        .div_ceil(u128::from(rule.limit().max(1)));
    u64::try_from(ms).unwrap_or(u64::MAX)
}
