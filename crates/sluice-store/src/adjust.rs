//! Changes made after the fact ([`Store::adjust`](crate::Store::adjust)):
//! a debit (a cost already spent, counted even past the limit) or a
//! give-back (a reservation that cost less than its estimate), applied at
//! most once per settle marker.

use sluice_core::decision::Outcomes;

/// What an adjustment does to every rule of its batch (each by its cost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Charge the units whatever the bucket holds, owing up to the rule's
    /// `max_debt` ([`Rule::debit`](sluice_core::Rule::debit)).
    Debit,
    /// Give back units an admission at `at` (ms, the store's clock)
    /// consumed ([`Rule::refund`](sluice_core::Rule::refund)).
    GiveBack {
        /// When the admission was made.
        at: u64,
        /// When it was made in the slot of the rules a sharded tenant
        /// keeps whole on shard 0 ([`Decided::first_shard_at_ms`]): on
        /// Redis Cluster, their give-back names it. Elsewhere `at`.
        ///
        /// [`Decided::first_shard_at_ms`]: crate::Decided::first_shard_at_ms
        first_shard_at: u64,
    },
    /// Change nothing; only answer (the rest of a settle whose marker was
    /// applied before).
    Nothing,
}

/// A settle's marker: the change applies only if no marker of this id is
/// stored, and then stores `value` for `ttl_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// The reservation's id.
    pub id: [u8; 16],
    /// What was settled (an identical retry finds the same value).
    pub value: String,
    /// How long the marker is kept (at least the reservation's life).
    pub ttl_ms: u64,
    /// The tenant's shard in whose slot it is kept: the shard that
    /// admitted the reservation, whatever the tenant's shards are by the
    /// time it is settled or expires.
    pub shard: u16,
}

/// What the marker said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerAnswer {
    /// No marker was stored: the change applied (or there was no marker).
    Applied,
    /// The same value was stored: applied before, nothing changed now.
    Again,
    /// Another value was stored: nothing changed.
    Conflict,
}

/// What an adjustment left.
#[derive(Debug, Clone)]
pub struct Adjusted {
    /// The store's time (ms).
    pub now: u64,
    /// Whether the change applied.
    pub marker: MarkerAnswer,
    /// Per rule, in batch order, what a request of one unit would get now.
    pub outcomes: Outcomes,
    /// Units owed beyond the rules' `max_debt`, forgiven (summed over the
    /// rules).
    pub forgiven: u64,
    /// Set when a settle applied under its lead marker (the answer is
    /// [`MarkerAnswer::Applied`]) but the store failed before it reached
    /// every slot (Redis Cluster) or shard: the settle counts as made, and
    /// a retry finishes the rest (answering [`MarkerAnswer::Again`]).
    pub unfinished: Option<crate::error::StoreError>,
}
