//! What an instance's slices hold: per rule for metrics, per tenant for
//! `sluice inspect`.

use sluice_core::Scope;

use super::Slices;

/// A tenant's slice of one rule, as [`Slices::of_tenant`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSlice {
    /// The rule's name.
    pub rule: String,
    /// Its scope.
    pub scope: Scope,
    /// Units held here, unspent.
    pub units: u64,
    /// Until when the latest of them may be spent, in ms from now.
    pub expires_in_ms: u64,
}

/// What slices of one rule this instance holds, summed over its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceLevel {
    /// The rule's name.
    pub rule: String,
    /// Its scope.
    pub scope: Scope,
    /// Units held, unspent, over every key of the rule.
    pub units: u64,
    /// The declared bound on over-admission per window: `tolerance × limit`.
    pub bound: u64,
}

impl Slices {
    /// The slices held, per rule (summed over keys), with each rule's
    /// declared bound.
    pub fn levels(&self, now: u64) -> Vec<SliceLevel> {
        let mut levels: Vec<SliceLevel> = Vec::new();
        self.entries.each(|map| {
            for entry in map.values() {
                let units = entry.held(now);
                let rule = &entry.rule;
                match levels
                    .iter_mut()
                    .find(|l| l.rule == rule.name() && l.scope == rule.scope())
                {
                    Some(level) => level.units += units,
                    None => levels.push(SliceLevel {
                        rule: rule.name().to_owned(),
                        scope: rule.scope(),
                        units,
                        bound: rule.tolerance().of(rule.rule().limit()),
                    }),
                }
            }
        });
        levels
    }

    /// The slices held for `tenant`'s keys, by rule name.
    pub fn of_tenant(&self, tenant: &str, now: u64) -> Vec<HeldSlice> {
        let mut held = Vec::new();
        self.entries.each(|map| {
            for (key, entry) in map.iter() {
                let units = entry.held(now);
                if units == 0 || key.tenant() != tenant.as_bytes() {
                    continue;
                }
                let expires = entry
                    .pieces
                    .iter()
                    .filter(|p| p.live(now))
                    .map(|p| p.expires_ms)
                    .max()
                    .unwrap_or(now);
                held.push(HeldSlice {
                    rule: entry.rule.name().to_owned(),
                    scope: entry.rule.scope(),
                    units,
                    expires_in_ms: expires - now,
                });
            }
        });
        held.sort_by(|a, b| (&a.rule, a.expires_in_ms).cmp(&(&b.rule, b.expires_in_ms)));
        held
    }
}
