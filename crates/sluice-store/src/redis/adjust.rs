//! The adjustment script (`adjust.lua`): debits and give-backs after the
//! fact, once per settle marker. It takes its rules exactly as the
//! decision does (see [`args`](super::args)), each rule's cost being the
//! units to change, and runs the decision's own algorithms (decide.lua) to
//! answer for the state after.

use sluice_core::Outcome;
use sluice_core::decision::Outcomes;
use sluice_core::keys::Record;

use super::args::{PackedRules, Selection, TimeSource, header};
use super::keys::Buckets;
use crate::adjust::{Change, MarkerAnswer};
use crate::store::{Batch, StoreError};

/// The adjustment script's source.
pub const ADJUST_LUA: &str = concat!(
    include_str!("common.lua"),
    include_str!("regions/shared.lua"),
    include_str!("decide.lua"),
    include_str!("adjust.lua"),
    "return adjust(KEYS, ARGV)\n"
);

/// One adjustment's keys and arguments.
#[derive(Debug, Clone)]
pub struct AdjustCall {
    rules: PackedRules,
    header: String,
    /// `"D"`, `"P"` or the admission time given back.
    change: String,
    /// The marker's key, value and life, when the call carries one.
    marker: Option<(String, String, u64)>,
    /// Per rule, for a give-back, when its units would have refilled
    /// (little-endian doubles; empty: not known).
    whole_at: Vec<u8>,
    /// While rotating, each rule's record name under the previous pepper,
    /// in rule order (its keys follow the others in `rules.keys`).
    previous: Option<Vec<u8>>,
}

impl AdjustCall {
    /// Changes the selected rules of a batch (`keys` and `records` are
    /// theirs, in selection order; `previous` the same buckets under the
    /// previous pepper while rotating, read where the new ones have
    /// nothing yet, as a decision reads them), with the settle marker at
    /// `marker`'s key when given.
    pub fn new(
        batch: &Batch<'_>,
        selection: Selection<'_>,
        (keys, records, previous): (Vec<String>, &[Record], Option<&Buckets>),
        change: Change,
        marker: Option<(String, String, u64)>,
        time: &TimeSource,
    ) -> AdjustCall {
        let whole_at = match change {
            Change::GiveBack { .. } if !batch.whole_at.is_empty() => selection
                .each(batch.rules.len())
                .flat_map(|i| {
                    let whole = batch.whole_at.get(i).copied().unwrap_or(0);
                    (whole as f64).to_le_bytes()
                })
                .collect(),
            _ => Vec::new(),
        };
        let (mut rules, first) = PackedRules::new(batch, selection, keys, records);
        let previous = previous.map(|p| rules.with_previous(&first, p));
        let change = match change {
            Change::Debit => "D".to_owned(),
            Change::Nothing => "P".to_owned(),
            Change::GiveBack { at, .. } => at.to_string(),
        };
        AdjustCall {
            rules,
            header: header(time, None),
            change,
            marker,
            whole_at,
            previous,
        }
    }

    /// The call as `EVALSHA` and as `EVAL`.
    pub fn commands(&self, script: &redis::Script) -> (redis::Cmd, redis::Cmd) {
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(script.get_hash());
        let mut eval = redis::cmd("EVAL");
        eval.arg(ADJUST_LUA);
        let keys = self.rules.keys.len() + usize::from(self.marker.is_some());
        for cmd in [&mut evalsha, &mut eval] {
            cmd.arg(keys).arg(&self.rules.keys);
            if let Some((key, _, _)) = &self.marker {
                cmd.arg(key);
            }
            cmd.arg(self.rules.packed.as_slice())
                .arg(&self.header)
                .arg(&self.change);
            match &self.marker {
                Some((_, value, ttl)) => cmd.arg(value).arg(*ttl),
                None => cmd.arg("").arg(0),
            };
            if !self.whole_at.is_empty() || self.previous.is_some() {
                cmd.arg(self.whole_at.as_slice());
            }
            if let Some(previous) = &self.previous {
                cmd.arg(previous.as_slice());
            }
        }
        (evalsha, eval)
    }
}

/// The adjustment script's reply, read: the store's time, the marker's
/// answer, per rule the outcome of one unit after the change, and the
/// units forgiven.
#[derive(Debug, Clone)]
pub struct AdjustReply {
    /// The script's time.
    pub now: u64,
    /// Whether the change applied.
    pub marker: MarkerAnswer,
    /// Per rule, in call order.
    pub outcomes: Outcomes,
    /// Summed over the rules.
    pub forgiven: u64,
}

/// Reads the reply (little-endian doubles: now, the marker's answer, then
/// remaining, reset, retry and forgiven per rule; see adjust.lua).
pub fn adjust_reply(bytes: &[u8], rules: usize) -> Result<AdjustReply, StoreError> {
    if bytes.len() != 8 * (2 + 4 * rules) {
        return Err(StoreError::Unavailable(format!(
            "unexpected adjustment reply: {} bytes for {rules} rules",
            bytes.len()
        )));
    }
    let values: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as u64)
        .collect();
    let marker = match values[1] {
        0 => MarkerAnswer::Applied,
        1 => MarkerAnswer::Again,
        _ => MarkerAnswer::Conflict,
    };
    let rules = &values[2..];
    Ok(AdjustReply {
        now: values[0],
        marker,
        outcomes: rules
            .chunks_exact(4)
            .map(|v| Outcome {
                allowed: v[2] == 0,
                remaining: u32::try_from(v[0]).unwrap_or(u32::MAX),
                reset_after_ms: v[1],
                retry_after_ms: v[2],
            })
            .collect(),
        forgiven: rules.chunks_exact(4).map(|v| v[3]).sum(),
    })
}
