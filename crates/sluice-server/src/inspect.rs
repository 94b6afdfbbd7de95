//! What a tenant's buckets hold, read without changing them: for
//! `sluice inspect` (straight from a shared store) and the admin API's
//! `GET /v1/admin/inspect` (a running service, memory store included, with
//! its overrides).

use serde::Serialize;
use sluice_core::duration::HumanDuration;
use sluice_core::{BoundRule, Policy, Request, Rule, Scope, State};
use sluice_store::{Batch, Store};

use crate::Fallible;
use crate::backend::Backend;

/// One bucket.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Row {
    /// The tenant's shard it is in.
    pub shard: u16,
    /// `tenant`, `route`, `subject`, `global`, …
    pub scope: String,
    /// The policy name.
    pub policy: String,
    /// The algorithm.
    pub algorithm: String,
    /// `LIMIT/PER` (and the burst).
    pub limit: String,
    /// Units used (of a rule shared across regions, by every region,
    /// peers as they last said).
    pub used: u64,
    /// Units that would pass now (of a rule shared across regions, in
    /// this region).
    pub remaining: u64,
    /// Milliseconds until it is full again (0: full).
    pub full_in_ms: u64,
    /// Its key in the store.
    pub key: String,
}

/// A tenant's buckets.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Inspection {
    /// The tenant.
    pub tenant: String,
    /// Its plan.
    pub plan: String,
    /// Its shards.
    pub shards: u16,
    /// Every bucket, shard by shard.
    pub rows: Vec<Row>,
    /// A note on what the rows cannot show, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The slices of hot keys the service asked holds for the tenant
    /// (rules with a `tolerance`): units taken from the rows above, not
    /// yet spent. Only a running service knows its own (`--url`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slices: Vec<SliceRow>,
    /// With `storage.regions`: each region's part of the tenant's shared
    /// rules in the current window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<RegionRow>,
}

/// One region's part of one shared rule's window.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RegionRow {
    /// The tenant's shard it is of.
    #[serde(default)]
    pub shard: u16,
    /// The policy name.
    pub policy: String,
    /// The region (`self` marks this one).
    pub region: String,
    /// Its share of the pool.
    pub share: u64,
    /// What it may admit in the window, in all (as it last said, for a
    /// peer; `None`: not heard this window).
    pub cap: Option<u64>,
    /// What it admitted.
    pub used: Option<u64>,
}

/// A slice held for one of the tenant's rules.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct SliceRow {
    /// `tenant`, `route`, `subject`, `descriptor`.
    pub scope: String,
    /// The policy name.
    pub policy: String,
    /// Units held, unspent.
    pub units: u64,
    /// Milliseconds until the last of them may no longer be spent.
    pub expires_in_ms: u64,
}

impl SliceRow {
    /// The rows of what a limiter holds.
    pub fn of(held: Vec<sluice_store::limiter::slice::HeldSlice>) -> Vec<SliceRow> {
        held.into_iter()
            .map(|s| SliceRow {
                scope: s.scope.name().to_owned(),
                policy: s.rule,
                units: s.units,
                expires_in_ms: s.expires_in_ms,
            })
            .collect()
    }
}

/// Reads `tenant`'s buckets under `policy`: its own rules, and with
/// `route` that route's (and with `subject` the subject's).
pub async fn inspect(
    policy: &Policy,
    store: &Backend,
    tenant: &str,
    route: Option<&str>,
    subject: Option<&str>,
) -> Fallible<Inspection> {
    let pattern = route.unwrap_or("*");
    let request = Request::new(tenant, pattern, subject, 1)?;
    let applicable = policy.applicable(request.tenant, pattern, request.subject.is_some());
    // The rules a decision consumes (those that count by outcome among
    // them: each check holds its attempt there).
    let rules: Vec<BoundRule> = applicable
        .rules
        .iter()
        .filter(|r| route.is_some() || r.scope() == Scope::Tenant)
        .cloned()
        .collect();
    let mut rows = Vec::new();
    let mut regions = Vec::new();
    for shard in 0..applicable.shards {
        let batch = Batch {
            shard,
            ..Batch::new(request.tenant, request.subject, 1, &rules)
        };
        // Per rule, what every region used of a shared one in this shard
        // (peers as they last said): its row's `used`.
        let mut fleet_used = vec![None; rules.len()];
        if store.regions().is_some() {
            let parts = store.region_parts(&batch).await?;
            let own = store.regions().map(|r| r.names[r.index].clone());
            for ((rule, parts), used) in rules.iter().zip(parts).zip(&mut fleet_used) {
                // (A bucket's parts are rates: its row is this region's
                // own bucket.)
                if let Some(parts) = &parts
                    && parts.iter().any(|p| p.used.is_some())
                {
                    *used = Some(parts.iter().filter_map(|p| p.used).sum::<u64>());
                }
                for part in parts.into_iter().flatten() {
                    let region = if Some(&part.region) == own.as_ref() {
                        format!("{} (self)", part.region)
                    } else {
                        part.region
                    };
                    regions.push(RegionRow {
                        shard,
                        policy: rule.name().to_owned(),
                        region,
                        share: part.share,
                        cap: part.cap,
                        used: part.used,
                    });
                }
            }
        }
        let peeked = store.peek(&batch).await?;
        for ((rule, read), used) in rules.iter().zip(peeked.rows).zip(&fleet_used) {
            let mut row = row(
                shard,
                rule,
                &read.enforced,
                read.key,
                &read.state,
                peeked.now,
            );
            if let Some(used) = used {
                row.used = *used;
            }
            rows.push(row);
        }
    }
    let note = match store {
        Backend::Cluster(cluster) if rules.iter().any(|r| r.scope() == Scope::Global) => {
            Some(format!(
                "global limits are split over up to {} keys on Redis Cluster (storage.global_shards): their rows show shard 0 and its share",
                cluster.valve_shards()
            ))
        }
        _ => None,
    };
    Ok(Inspection {
        tenant: tenant.to_owned(),
        plan: applicable.plan.map_or("-", |p| p.name()).to_owned(),
        shards: applicable.shards,
        rows,
        note,
        slices: Vec::new(),
        regions,
    })
}

/// One rule's row; `r` is the rule as the store enforces it (on Redis
/// Cluster, a global valve's shard holds a share of the limit).
fn row(shard: u16, rule: &BoundRule, r: &Rule, key: String, state: &State, now: u64) -> Row {
    let capacity = r.capacity();
    // What one more unit would find: its `remaining` is after that unit.
    let (probe, _) = r.decide(state, now, 1);
    let remaining = if probe.allowed {
        u64::from(probe.remaining) + 1
    } else {
        u64::from(probe.remaining)
    };
    let mut limit = format!("{}/{}", r.limit(), HumanDuration(r.period_ms()));
    if r.algorithm().has_burst() && r.burst() != r.limit() {
        limit.push_str(&format!(" burst {}", r.burst()));
    }
    Row {
        shard,
        scope: rule.scope().name().to_owned(),
        policy: rule.name().to_owned(),
        algorithm: r.algorithm().name().to_owned(),
        limit,
        used: capacity.saturating_sub(remaining),
        remaining,
        full_in_ms: r.idle_at(state).saturating_sub(now),
        key,
    }
}

/// The inspection as the table `sluice inspect` prints.
pub fn table(inspection: &Inspection) -> String {
    let mut out = format!(
        "tenant {:?}: plan {}, {} shard{}\n",
        inspection.tenant,
        inspection.plan,
        inspection.shards,
        if inspection.shards == 1 { "" } else { "s" }
    );
    out.push_str(&format!(
        "{:<8} {:<16} {:<15} {:<22} {:>10} {:>10} {:>10}  key\n",
        "scope", "policy", "algorithm", "limit", "used", "remaining", "full in"
    ));
    let mut shard = None;
    for row in &inspection.rows {
        if inspection.shards > 1 && shard != Some(row.shard) {
            out.push_str(&format!("shard {}:\n", row.shard));
            shard = Some(row.shard);
        }
        let full_in = if row.full_in_ms == 0 {
            "full".to_owned()
        } else {
            approximately(row.full_in_ms)
        };
        out.push_str(&format!(
            "{:<8} {:<16} {:<15} {:<22} {:>10} {:>10} {:>10}  {}\n",
            row.scope,
            row.policy,
            row.algorithm,
            row.limit,
            row.used,
            row.remaining,
            full_in,
            row.key
        ));
    }
    if let Some(note) = &inspection.note {
        out.push_str(note);
        out.push('\n');
    }
    if !inspection.regions.is_empty() {
        out.push_str(
            "across regions, this window (peers as they last said; a shared rule's row above shows what every region used, and what this one may still admit; a shared gcra or token_bucket's share and cap are rates per its period, and its row above is this region's own bucket):\n",
        );
        out.push_str(&format!(
            "{:<16} {:<20} {:>10} {:>10} {:>10}\n",
            "policy", "region", "share", "cap", "used"
        ));
        let known = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        let mut shard = None;
        for r in &inspection.regions {
            if inspection.shards > 1 && shard != Some(r.shard) {
                out.push_str(&format!("shard {}:\n", r.shard));
                shard = Some(r.shard);
            }
            out.push_str(&format!(
                "{:<16} {:<20} {:>10} {:>10} {:>10}\n",
                r.policy,
                r.region,
                r.share,
                known(r.cap),
                known(r.used)
            ));
        }
    }
    if !inspection.slices.is_empty() {
        out.push_str("slices held by this instance (taken from the rows above, unspent):\n");
        for slice in &inspection.slices {
            out.push_str(&format!(
                "{:<8} {:<16} {:>10} units, spendable for {}\n",
                slice.scope,
                slice.policy,
                slice.units,
                approximately(slice.expires_in_ms)
            ));
        }
    }
    out
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

    #[tokio::test]
    async fn rules_that_count_by_outcome_are_shown_with_the_others() {
        let yaml = r#"
default_plan: p
plans:
  p:
    routes:
      "POST /login": [{ name: logins, algorithm: gcra, limit: 100, per: 1s }]
    subject:
      "POST /login": [{ name: failed, algorithm: sliding_log, limit: 5, per: 15m, count_if: { status: [401] } }]
"#;
        let config = sluice_core::Config::from_yaml(yaml, "t.yaml").unwrap();
        let policy = sluice_core::Policy::compile(&config.limits);
        let store = crate::backend::Backend::Memory(sluice_store::MemoryStore::new(100));
        let seen = super::inspect(&policy, &store, "acme", Some("POST /login"), Some("alice"))
            .await
            .unwrap();
        let names: Vec<&str> = seen.rows.iter().map(|r| r.policy.as_str()).collect();
        assert_eq!(names, ["logins", "failed"]);
    }

    #[test]
    fn waits_read_in_their_two_largest_units() {
        assert_eq!(approximately(8), "8ms");
        assert_eq!(approximately(4_250), "4.2s");
        assert_eq!(approximately(3_599_968), "59m59s");
        assert_eq!(approximately(86_399_960), "23h59m");
        assert_eq!(approximately(90_000_000), "1d1h");
    }
}
