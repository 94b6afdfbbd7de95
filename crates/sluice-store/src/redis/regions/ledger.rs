//! The ledger script (`ledger.lua`): what the region link reads of a
//! shared rule's part and how it moves budget (grants made here, totals
//! heard from peers). Each step is a call of its own on the region's
//! Redis; the script's arithmetic is `sluice_core::regions::Stored`'s.

use sluice_core::regions::Heard;
use sluice_core::regions::stored::{Snapshot, View};

use redis::ScriptInvocation;

use super::shared::{Kind, Shared};
use crate::redis::args::{SHARED_BUCKET, SHARED_SLIDING, SHARED_WINDOW, TimeSource, now_arg};
use crate::store::StoreError;

/// The ledger script's source: the helpers and records of the decision,
/// then its own steps.
pub const LEDGER_LUA: &str = concat!(
    include_str!("../common.lua"),
    include_str!("shared.lua"),
    include_str!("../decide.lua"),
    include_str!("ledger.lua"),
    "return ledger(KEYS, ARGV)\n"
);

/// The key of the ledger of the group whose key is `group`: beside it (on
/// Redis Cluster, in its slot).
pub fn ledger_key(group: &str) -> String {
    format!("{group}:r")
}

/// The ledger script, loaded once per process.
pub fn ledger_script() -> &'static redis::Script {
    static SCRIPT: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(LEDGER_LUA));
    &SCRIPT
}

/// What every step of the ledger script is told besides the rule: the
/// time source, how many regions, and on one Redis node the keys of the
/// store's region (see [`received_key`](super::received_key)).
#[derive(Debug, Clone, Copy)]
pub struct Steps<'a> {
    /// Where "now" comes from.
    pub time: &'a TimeSource,
    /// How many regions.
    pub regions: usize,
    /// On one node, the region's own keys; `None` on a cluster, where they
    /// are in another slot than the rule's.
    pub own: Option<Own<'a>>,
}

/// A region's own keys, as a ledger step on one node is told them.
#[derive(Debug, Clone, Copy)]
pub struct Own<'a> {
    /// The key counting what each region's totals added (a `hear` adds to
    /// it).
    pub received: &'a str,
    /// The key of the region's identity, and (for a `hear`) the identity
    /// it must hold: a store that announces another since it was checked
    /// is not merged with.
    pub identity: (&'a str, &'a str),
}

impl Shared {
    /// A step's call of the ledger script, its common arguments set, with
    /// `share` this region's share of the rule's pool.
    fn call(&self, step: &str, steps: Steps<'_>, share: u64) -> ScriptInvocation<'static> {
        let mut call = ledger_script().prepare_invoke();
        call.key(&self.key).key(ledger_key(&self.key));
        if let Some((key, _)) = &self.previous {
            call.key(key).key(ledger_key(key));
        }
        if let Some(own) = steps.own {
            call.key(own.received).key(own.identity.0);
        }
        let previous = self.previous.as_ref().map_or(&[][..], |(_, r)| &r.0[..]);
        call.arg(step)
            .arg(now_arg(steps.time))
            .arg(&self.record.0[..])
            .arg(self.per_ms)
            .arg(steps.regions)
            .arg(previous)
            .arg(share)
            .arg(self.kind_arg());
        call
    }

    /// The ledger script's ARGV[8]: the rule's algorithm code, its
    /// max_debt, and a bucket's fill (written as the shortest decimal that
    /// reads back as the same double).
    fn kind_arg(&self) -> String {
        match self.kind {
            Kind::Window => format!("{SHARED_WINDOW}:{}", self.max_debt),
            Kind::Sliding => format!("{SHARED_SLIDING}:{}", self.max_debt),
            Kind::Bucket { .. } => {
                let fill = self
                    .kind
                    .terms(self.per_ms, self.max_debt)
                    .map_or(0.0, |t| t.fill);
                format!("{SHARED_BUCKET}:{}:{fill}", self.max_debt)
            }
        }
    }

    /// Notes `wanted` units asked in `window` of a rule whose pool is
    /// `pool`; answers 1 when the window was still the store's, else 0.
    pub fn note_call(
        &self,
        steps: Steps<'_>,
        share: u64,
        (window, pool, wanted): (u64, u64, u64),
    ) -> ScriptInvocation<'static> {
        let mut call = self.call("note", steps, share);
        call.arg(window).arg(pool).arg(wanted);
        call
    }

    /// Reads the part of the window of now: see [`snapshot`].
    pub fn read_call(&self, steps: Steps<'_>, share: u64) -> ScriptInvocation<'static> {
        self.call("read", steps, share)
    }

    /// Grants `units` to region `to` in `window` against `share`; answers
    /// the new total granted to it, -1 when it did not fit or the window
    /// is over.
    pub fn grant_call(
        &self,
        steps: Steps<'_>,
        share: u64,
        (window, to, units): (u64, usize, u64),
    ) -> ScriptInvocation<'static> {
        let mut call = self.call("grant", steps, share);
        call.arg(window).arg(to).arg(units);
        call
    }

    /// Applies what a peer shipped; answers the units added, -1 when the
    /// window is over in that store, -2 when it announces another identity
    /// than `steps.own`'s (nothing applied; never on a cluster, whose
    /// identity the shipper checks before).
    pub fn hear_call(&self, steps: Steps<'_>, hearing: &Hearing) -> ScriptInvocation<'static> {
        let mut call = self.call("hear", steps, hearing.share);
        let v = hearing.view;
        call.arg(hearing.window)
            .arg(hearing.pool)
            .arg(hearing.from)
            .arg(hearing.total)
            .arg(v.cap)
            .arg(v.used)
            .arg(v.wanted)
            .arg(v.heard_from_you)
            .arg(steps.own.map_or("", |own| own.identity.1))
            .arg(hearing.yours);
        call
    }
}

/// What a region ships to a peer of one shared rule's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hearing {
    /// The window.
    pub window: u64,
    /// The rule's pool.
    pub pool: u64,
    /// The shipping region's index.
    pub from: usize,
    /// The total it granted the peer.
    pub total: u64,
    /// Its part as it sees it.
    pub view: Heard,
    /// The receiver's share of the pool (what a record of an earlier
    /// window owes is read against it there).
    pub share: u64,
    /// What the shipper last heard the receiver used in the window
    /// (counted again there if its store lost the window: see
    /// `Stored::hear`).
    pub yours: u64,
}

/// Decodes a `read` reply (see ledger.lua). The part's share is left 0:
/// the caller knows the regions' weights.
pub fn snapshot(reply: &[u8], regions: usize) -> Result<Snapshot, StoreError> {
    let n = regions;
    let numbers: Vec<f64> = reply
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    if !reply.len().is_multiple_of(8) || numbers.len() != 7 + 7 * n {
        return Err(StoreError::Unavailable(format!(
            "the ledger script answered {} bytes for {n} regions",
            reply.len()
        )));
    }
    let int = |x: f64| x.max(0.0) as u64;
    let at = |i: usize| int(numbers[i]);
    // The window, used and moved, then the ledger: window, per, pool,
    // wanted, given, heard, views.
    let (used, pool, wanted) = (at(1), at(5), at(6));
    let given = (0..n).map(|r| at(7 + r)).collect();
    let heard = (0..n).map(|r| at(7 + n + r)).collect();
    let views = (0..n)
        .map(|r| {
            let v = 7 + 2 * n + 5 * r;
            (at(v + 4) > 0).then(|| View {
                heard: Heard {
                    cap: at(v),
                    used: at(v + 1),
                    wanted: at(v + 2),
                    heard_from_you: at(v + 3),
                },
                at_ms: at(v + 4),
            })
        })
        .collect();
    Ok(Snapshot {
        window_ms: at(0),
        pool,
        part: sluice_core::regions::Part {
            share: 0,
            used,
            wanted,
            given,
            heard,
        },
        views,
    })
}
