//! The decision script (`decide.lua`): one batch in, every rule's outcome
//! out, in one call whatever the number of rules.
//!
//! `decide.lua` implements every algorithm of `sluice-core` with the same
//! integer arithmetic (each Lua function names its Rust twin); keys are
//! opaque (see `sluice_core::keys`): the script never sees a tenant id,
//! subject, route or plan name.

use sluice_core::Outcome;
use sluice_core::decision::Outcomes;
use sluice_core::keys::Record;
use smallvec::SmallVec;

use super::args::{PackedRules, Selection, TimeSource, header};
use super::keys::Buckets;
use crate::store::{Batch, StoreError};

/// The decision's code: the helpers and `decide(KEYS, ARGV)`.
pub(super) const DECIDE_BODY: &str = concat!(
    include_str!("common.lua"),
    include_str!("regions/shared.lua"),
    include_str!("decide.lua")
);

/// The decision script's source (as `EVAL` runs it; see [`Decide`](super::function::Decide) for the
/// Redis Function).
pub const DECIDE_LUA: &str = concat!(
    include_str!("common.lua"),
    include_str!("regions/shared.lua"),
    include_str!("decide.lua"),
    "return decide(KEYS, ARGV)\n"
);

/// The helpers every script starts with (common.lua), for tests of their
/// arithmetic.
pub const COMMON_LUA: &str = include_str!("common.lua");

/// One decision's keys and arguments for the decision script, owned so
/// that a call can go out from a task of its own.
#[derive(Debug, Clone)]
pub struct DecideCall {
    /// The distinct keys and the rules packed; while rotating, the keys
    /// are followed by the same under the previous pepper.
    rules: PackedRules,
    /// `""` (not sent unless rotating), or `"NOW;LEASE"` (see decide.lua).
    header: String,
    /// While rotating, each rule's record name under the previous pepper,
    /// in rule order.
    previous: Option<Vec<u8>>,
}

impl DecideCall {
    /// The selected rules of a batch: `keys` and `records` are theirs (in
    /// selection order), `previous` the same buckets under the previous
    /// pepper when rotating. Rules sharing a key name it once.
    pub fn new(
        batch: &Batch<'_>,
        selection: Selection<'_>,
        keys: Vec<String>,
        records: &[Record],
        previous: Option<&Buckets>,
        time: &TimeSource,
    ) -> DecideCall {
        let (mut rules, first) = PackedRules::new(batch, selection, keys, records);
        let previous = previous.map(|p| rules.with_previous(&first, p));
        DecideCall {
            rules,
            header: header(time, batch.lease),
            previous,
        }
    }

    /// The rules as this call sends them, for its refund (see
    /// [`RefundCall::of`](super::RefundCall::of)). While rotating, the keys
    /// under the previous pepper stay after the others, named by no rule.
    pub fn into_rules(self) -> PackedRules {
        self.rules
    }

    /// Appends the key count, the keys and the arguments to `cmd` (an
    /// `FCALL`, `EVALSHA` or `EVAL` named already).
    pub fn fill(&self, cmd: &mut redis::Cmd) {
        cmd.arg(self.rules.keys.len())
            .arg(&self.rules.keys)
            .arg(self.rules.packed.as_slice());
        // The commonest header, "", is left out (one argument less for
        // Redis to read and set up) unless the previous names follow it.
        if !self.header.is_empty() || self.previous.is_some() {
            cmd.arg(&self.header);
        }
        if let Some(previous) = &self.previous {
            cmd.arg(previous);
        }
    }
}

/// Values per rule in the decision script's reply (after the admission
/// time).
const REPLY_WIDTH: usize = 3;

/// The decision script's reply, read: each rule's outcome, and the
/// admission time (ms) a refund of this decision names.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// One per rule decided, in call order.
    pub outcomes: Outcomes,
    /// When the script decided, on its clock.
    pub admitted_at: u64,
}

/// Reads the decision script's reply (little-endian doubles: the admission
/// time, then remaining, reset and retry per rule; see decide.lua). A rule
/// admitted when its retry is 0: every denial's is at least 1 ms.
pub fn reply(bytes: &[u8], rules: usize) -> Result<Reply, StoreError> {
    if bytes.len() != 8 * (1 + REPLY_WIDTH * rules) {
        return Err(StoreError::Unavailable(format!(
            "unexpected script reply: {} bytes for {rules} rules",
            bytes.len()
        )));
    }
    // Whole numbers below 2^53 as the script computes them; anything else
    // (which it never sends) saturates rather than wraps.
    let values: SmallVec<[u64; 17]> = bytes
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as u64)
        .collect();
    let (&admitted_at, rules) = values.split_first().expect("at least the time");
    Ok(Reply {
        outcomes: rules
            .chunks_exact(REPLY_WIDTH)
            .map(|v| Outcome {
                allowed: v[2] == 0,
                remaining: u32::try_from(v[0]).unwrap_or(u32::MAX),
                reset_after_ms: v[1],
                retry_after_ms: v[2],
            })
            .collect(),
        admitted_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doubles(values: &[u64]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|v| (*v as f64).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_reply_reads_as_the_time_then_three_values_per_rule() {
        // A rule admitted has no retry; one denied a retry of 1 ms or more.
        let bytes = doubles(&[1_764_600_000_123, 9, 100, 0, 0, 250, 40]);
        let read = reply(&bytes, 2).unwrap();
        assert_eq!(read.admitted_at, 1_764_600_000_123);
        assert_eq!(
            read.outcomes.as_slice(),
            [
                Outcome {
                    allowed: true,
                    remaining: 9,
                    reset_after_ms: 100,
                    retry_after_ms: 0
                },
                Outcome {
                    allowed: false,
                    remaining: 0,
                    reset_after_ms: 250,
                    retry_after_ms: 40
                },
            ]
        );
    }

    #[test]
    fn a_reply_of_another_length_is_an_error_not_a_guess() {
        let bytes = doubles(&[1, 9, 100, 0]);
        let error = reply(&bytes, 2).unwrap_err();
        assert!(
            error.to_string().contains("32 bytes for 2 rules"),
            "{error}"
        );
        assert!(reply(&bytes[..31], 1).is_err());
    }
}
