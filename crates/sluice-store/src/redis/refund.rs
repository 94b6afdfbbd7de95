//! The refund script (`refund.lua`): gives back what an admitted decision
//! consumed (Redis Cluster's two-call valve decisions), and releases a
//! concurrency lease. It takes its rules exactly as the decision does
//! (see [`args`](super::args)), so that a decision's refund is the
//! decision's own rules and the admission time its reply named.

use sluice_core::keys::Record;

use super::args::{PackedRules, Selection, TimeSource, header};
use crate::store::Batch;

/// The refund script's source.
pub const REFUND_LUA: &str = concat!(
    include_str!("common.lua"),
    include_str!("regions/shared.lua"),
    include_str!("refund.lua")
);

/// One refund's keys and arguments, owned so that it can be sent after the
/// batch is gone: the rules in the decision's layout, the header (naming
/// the lease to release) and the admission time.
#[derive(Debug, Clone)]
pub struct RefundCall {
    rules: PackedRules,
    /// `""`, or `"NOW;LEASE"` (see common.lua).
    header: String,
    admitted_at: u64,
}

impl RefundCall {
    /// Gives back what the selected rules of a batch consumed when a
    /// decision admitted them at `admitted_at` (`keys` and `records` are
    /// theirs, in selection order), and releases `batch.lease` from its
    /// concurrency rules.
    pub fn new(
        batch: &Batch<'_>,
        selection: Selection<'_>,
        keys: Vec<String>,
        records: &[Record],
        time: &TimeSource,
        admitted_at: u64,
    ) -> RefundCall {
        let (rules, _) = PackedRules::new(batch, selection, keys, records);
        RefundCall::of(rules, batch.lease, time, admitted_at)
    }

    /// Gives back what `rules`, as a decision packed them (see
    /// [`DecideCall::into_rules`](super::DecideCall::into_rules)), consumed
    /// when it admitted them at `admitted_at`, releasing `lease`.
    pub fn of(
        rules: PackedRules,
        lease: Option<u128>,
        time: &TimeSource,
        admitted_at: u64,
    ) -> RefundCall {
        RefundCall {
            rules,
            header: header(time, lease),
            admitted_at,
        }
    }

    /// The refund as `EVALSHA` and as `EVAL` (for a node that does not
    /// have the script cached).
    pub fn commands(&self, script: &redis::Script) -> (redis::Cmd, redis::Cmd) {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.get_hash());
        let mut eval = redis::cmd("EVAL");
        eval.arg(REFUND_LUA);
        for cmd in [&mut evalsha, &mut eval] {
            cmd.arg(self.rules.keys.len())
                .arg(&self.rules.keys)
                .arg(self.rules.packed.as_slice())
                .arg(&self.header)
                .arg(self.admitted_at);
        }
        (evalsha, eval)
    }
}
