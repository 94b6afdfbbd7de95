//! Decisions whose buckets the caller names in part: a request's own rules,
//! keyed as [`Limiter::decide`] keys them (duplicate guards included),
//! followed by rules counting in buckets the caller names (an Envoy
//! descriptor's domain and entries), each with its own cost. The caller
//! never derives a partition itself: [`Keyed`] does, and
//! [`Limiter::decide_keyed`] and [`Limiter::peek_keyed`] take it.

use sluice_core::policy::Applicable;
use sluice_core::{BoundRule, Decision, Request, Scope};

use super::Limiter;
use super::dedupe::partition_text;
use crate::store::{Batch, Partition, Peeked, Store, StoreError};

/// Where each rule of a keyed decision counts, and what it consumes.
#[derive(Debug, Clone)]
pub struct Keyed<'r> {
    tenant: &'r str,
    subject: Option<&'r str>,
    cost: u64,
    /// How many rules, first, are the request's own.
    own: usize,
    /// The partition text of the request's duplicate guards, if any.
    guard: Option<String>,
    /// Per named rule, after the request's own: its bucket and its cost.
    named: Vec<(String, u64)>,
}

impl<'r> Keyed<'r> {
    /// `request`'s own `rules` (the first rules of the decision), keyed as
    /// [`Limiter::decide`] keys them.
    pub fn request(request: &Request<'r>, rules: &[BoundRule]) -> Keyed<'r> {
        let guarded = rules.iter().any(|r| r.scope() == Scope::Dedupe);
        Keyed {
            tenant: request.tenant,
            subject: request.subject,
            cost: request.cost,
            own: rules.len(),
            guard: guarded.then(|| partition_text(request.subject, request.fingerprint)),
            named: Vec::new(),
        }
    }

    /// No request rules: every rule counts where [`push`](Self::push) names,
    /// under `owner` (what the keys are derived under, in place of a tenant).
    pub fn named(owner: &'r str) -> Keyed<'r> {
        Keyed {
            tenant: owner,
            subject: None,
            cost: 1,
            own: 0,
            guard: None,
            named: Vec::new(),
        }
    }

    /// The next rule counts in the bucket `bucket` names (the store hashes
    /// it; it is never stored plain) and consumes `cost`.
    pub fn push(&mut self, bucket: String, cost: u64) {
        self.named.push((bucket, cost));
    }

    /// What the rule at `index` of the decision consumes.
    pub fn cost_of(&self, index: usize) -> u64 {
        match index.checked_sub(self.own) {
            None => self.cost,
            Some(named) => self.named.get(named).map_or(self.cost, |(_, c)| *c),
        }
    }

    /// Whose request it is, and its cost.
    pub(super) fn who(&self) -> (&'r str, Option<&'r str>, u64) {
        (self.tenant, self.subject, self.cost)
    }

    /// Per rule of `rules`, where it counts and what it consumes.
    pub(super) fn parts<'k>(&'k self, rules: &'k [BoundRule]) -> super::prepared::Parts<'k> {
        assert_eq!(
            rules.len(),
            self.own + self.named.len(),
            "a keyed decision names a bucket for every rule after the request's own"
        );
        let probe = Batch::new(self.tenant, self.subject, self.cost, rules);
        let mut partitions = smallvec::SmallVec::with_capacity(rules.len());
        for (i, rule) in rules.iter().enumerate().take(self.own) {
            partitions.push(match (&self.guard, rule.scope()) {
                (Some(guard), Scope::Dedupe) => Partition::Subject(self.tenant, guard),
                _ => probe.partition(i, rule),
            });
        }
        partitions.extend(self.named.iter().map(|(b, _)| Partition::Tenant(b)));
        let costs = (0..rules.len()).map(|i| self.cost_of(i)).collect();
        (partitions, costs)
    }
}

impl<S: Store> Limiter<S> {
    /// Charges every rule of `applicable` its cost in the bucket `keyed`
    /// names (Envoy's quota descriptors: a cost already spent, counted
    /// even past the limit), within the time budget; the rules' state
    /// after, as a request of one unit would find it.
    pub async fn debit_keyed<'p>(
        &self,
        applicable: Applicable<'p>,
        keyed: &Keyed<'_>,
    ) -> Result<super::Adjustment<'p>, StoreError> {
        let (partitions, costs) = keyed.parts(applicable.rules);
        let batch = Batch {
            partitions: &partitions,
            costs: &costs,
            ..Batch::new(keyed.tenant, keyed.subject, keyed.cost, applicable.rules)
        };
        let adjusted = self
            .adjust_within_budget(&batch, crate::adjust::Change::Debit, None)
            .await?;
        Ok(super::Adjustment {
            decision: Decision::from_outcomes(applicable, adjusted.outcomes, 1, &[]),
            forgiven: adjusted.forgiven,
            marker: adjusted.marker,
            unfinished: None,
        })
    }

    /// The stored state of `rules` where `keyed` says they count, read
    /// without changing anything ([`peek`](Self::peek)).
    pub async fn peek_keyed(
        &self,
        rules: &[BoundRule],
        keyed: &Keyed<'_>,
    ) -> Result<Peeked, StoreError> {
        let (partitions, costs) = keyed.parts(rules);
        let batch = Batch {
            partitions: &partitions,
            costs: &costs,
            ..Batch::new(keyed.tenant, keyed.subject, keyed.cost, rules)
        };
        self.peek(&batch).await
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::config::OnError;
    use sluice_core::{Config, Policy, Request};

    use super::*;
    use crate::memory::MemoryStore;

    const PLANS: &str = r#"
default_plan: free
plans:
  free:
    tenant: [{ name: t, limit: 100, per: 1m }]
    dedupe:
      "POST /pay": { window: 1m }
"#;

    fn limiter() -> Limiter<MemoryStore> {
        let config = Config::from_yaml(PLANS, "t.yaml").unwrap();
        let policy = Policy::compile(&config.limits);
        Limiter::new(policy, MemoryStore::new(1_000), OnError::Deny)
    }

    fn pay<'r>(fingerprint: &'r str) -> Request<'r> {
        Request::new("acme", "POST /pay", Some("u1"), 1)
            .and_then(|r| r.with_fingerprint(Some(fingerprint)))
            .unwrap()
    }

    #[tokio::test]
    async fn a_requests_own_rules_count_where_decide_counts_them() {
        let limiter = limiter();
        let policy = limiter.policy();
        assert!(limiter.decide(&policy, &pay("f1")).await.allowed);
        // The same submission through the keyed door, with a rule of a
        // bucket of its own after the request's: the duplicate guard is
        // the one `decide` placed, so it is a duplicate, and nothing is
        // taken from the named bucket.
        let request = pay("f1");
        let applicable = policy.applicable(request.tenant, request.route, true);
        let mut rules = applicable.rules.to_vec();
        rules.push(applicable.rules[0].clone());
        let mut keyed = Keyed::request(&request, applicable.rules);
        keyed.push("named".to_owned(), 7);
        let combined = Applicable {
            rules: &rules,
            max_cost: u64::MAX,
            ..applicable
        };
        let decision = limiter.decide_keyed(combined, &keyed).await;
        assert!(!decision.allowed, "a duplicate of what decide admitted");
        let named = limiter.peek_keyed(&rules, &keyed).await.unwrap();
        let tenant_rule = &named.rows[0];
        let extra = &named.rows[rules.len() - 1];
        assert_ne!(tenant_rule.state, extra.state, "two buckets");
        assert_eq!(extra.state, sluice_core::State::Fresh, "nothing taken");
        // Another submission passes and takes 7 from the named bucket.
        let other = pay("f2");
        let keyed = {
            let mut k = Keyed::request(&other, applicable.rules);
            k.push("named".to_owned(), 7);
            k
        };
        assert_eq!(keyed.cost_of(rules.len() - 1), 7);
        assert_eq!(keyed.cost_of(0), 1);
        assert!(limiter.decide_keyed(combined, &keyed).await.allowed);
        let after = limiter.peek_keyed(&rules, &keyed).await.unwrap();
        assert_ne!(after.rows[rules.len() - 1].state, sluice_core::State::Fresh);
    }

    #[tokio::test]
    async fn the_keyed_door_holds_the_rules_that_count_by_outcome() {
        let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, limit: 100, per: 1m }]
    subject:
      "POST /login": [{ name: failed, algorithm: sliding_log, limit: 5, per: 15m, count_if: { status: [401] } }]
"#;
        let policy = Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits);
        let limiter = Limiter::new(policy, MemoryStore::new(1_000), OnError::Deny);
        let policy = limiter.policy();
        let login = Request::new("acme", "POST /login", Some("alice"), 1).unwrap();
        // An Envoy descriptor's override adds a rule of its own bucket.
        let applicable = policy.applicable(login.tenant, login.route, true);
        let mut rules = applicable.rules.to_vec();
        rules.push(applicable.rules[0].clone());
        let mut keyed = Keyed::request(&login, applicable.rules);
        keyed.push("override".to_owned(), 1);
        let combined = Applicable {
            rules: &rules,
            ..applicable
        };
        // Five attempts in flight hold the rule's five places.
        for _ in 0..5 {
            assert!(limiter.decide_keyed(combined, &keyed).await.allowed);
        }
        let decision = limiter.decide_keyed(combined, &keyed).await;
        assert!(!decision.allowed, "a sixth attempt beside five");
        assert_eq!(decision.policy().map(|r| r.name()), Some("failed"));
    }
}
