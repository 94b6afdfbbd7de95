//! The refund script (`refund.lua`): gives back what an admitted decision
//! consumed (Redis Cluster's two-call valve decisions), and releases a
//! concurrency lease.

use sluice_core::keys::Record;

use super::args::{Selection, TimeSource, lease_arg, now_arg, rule_values};
use crate::store::Batch;

fn evalsha_and_eval(
    script: &redis::Script,
    source: &str,
    keys: &[String],
    args: &[Vec<u8>],
) -> (redis::Cmd, redis::Cmd) {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(script.get_hash());
    let mut eval = redis::cmd("EVAL");
    eval.arg(source);
    for cmd in [&mut evalsha, &mut eval] {
        cmd.arg(keys.len()).arg(keys);
        for arg in args {
            cmd.arg(arg.as_slice());
        }
    }
    (evalsha, eval)
}

/// The refund as `EVALSHA` and as `EVAL`, from [`refund_args`], giving
/// back `lease` of the concurrency rules among them.
pub fn refund_commands(
    script: &redis::Script,
    keys: &[String],
    args: &[u64],
    lease: Option<u128>,
    time: &TimeSource,
) -> (redis::Cmd, redis::Cmd) {
    let (n, rules) = args.split_first().expect("refund_args starts with n");
    let mut all: Vec<Vec<u8>> = Vec::with_capacity(args.len() + 2);
    all.push(now_arg(time).into_bytes());
    all.push(n.to_string().into_bytes());
    all.push(lease_arg(lease).into_bytes());
    for rule in rules.chunks_exact(REFUND_WIDTH) {
        for (k, value) in rule.iter().enumerate() {
            all.push(if k == REFUND_RECORD {
                value.to_le_bytes().to_vec()
            } else {
                value.to_string().into_bytes()
            });
        }
    }
    evalsha_and_eval(script, REFUND_LUA, keys, &all)
}

/// The refund script's source.
pub const REFUND_LUA: &str = concat!(include_str!("common.lua"), include_str!("refund.lua"));

/// Values per rule in [`refund_args`]: algorithm, limit, per, burst,
/// aligned, cost, the record's name (8 bytes read as a little-endian
/// integer), and last the admission time.
pub const REFUND_WIDTH: usize = 8;
const REFUND_RECORD: usize = 6;

/// The refund script's arguments giving back what the selected rules
/// consumed (`records` are theirs, in selection order), given the admission
/// times the decision returned. Owned, so a refund can be sent after the
/// batch is gone.
pub fn refund_args(
    batch: &Batch<'_>,
    selection: Selection<'_>,
    records: &[Record],
    admitted_at: &[u64],
) -> Vec<u64> {
    let mut args = vec![selection.len(batch.rules.len()) as u64];
    for ((i, at), record) in selection
        .each(batch.rules.len())
        .zip(admitted_at)
        .zip(records)
    {
        args.extend(rule_values(batch, i, selection.valve_parts));
        args.push(u64::from_le_bytes(record.0));
        args.push(*at);
    }
    args
}
