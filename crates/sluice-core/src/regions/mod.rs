//! One budget across regions (SPEC appendix H): each region's part of a
//! shared rule's window, and how parts move between regions while every
//! decision stays local.
//!
//! This module is the arithmetic, without stores or network: what a
//! region's store keeps for one key and window ([`Part`]), the parts a
//! window starts from ([`pool`], [`shares`]), and when a region hands
//! budget to its peers ([`grants`]). The region link ships what it
//! decides, store to store; the decision scripts read the part as
//! [`Part::cap`] and [`Part::admit`] do.
//!
//! # The bound
//!
//! Per key and window the fleet's pool is `T = limit + ⌊limit ×
//! tolerance⌋`. Region `r` starts the window with its share `s_r` (by
//! weight; `Σ s_r = T` exactly). It decides alone, against its cap
//!
//! ```text
//! c_r = s_r − Σ_q g(r→q) + Σ_q h(q→r)
//! ```
//!
//! where `g(r→q)` is the running total `r` has granted `q` this window and
//! `h(q→r)` the total it has heard `q` granted it. It admits a cost `k`
//! when `u_r + k ≤ c_r`, `u_r` being what it has admitted this window.
//!
//! Budget moves only by grants, and a grant is made in two steps, in this
//! order: `r` raises `g(r→q)` in its own store, atomically with the check
//! that `u_r ≤ c_r` still holds afterwards (a grant never takes what was
//! admitted); then the link ships the total `g(r→q)` to `q`'s store, which
//! keeps `h(q→r) = max(h(q→r), shipped)`. So at every instant `h(q→r) ≤
//! g(q→r)`, and
//!
//! ```text
//! Σ_r u_r ≤ Σ_r c_r = Σ_r s_r − Σ g + Σ h ≤ T.
//! ```
//!
//! What the regions admit together in a window never exceeds the pool,
//! whatever the delays, losses, duplicates, reorderings or partitions
//! between them: a unit is in exactly one region's cap, or in flight
//! (granted, not yet heard), where it counts for none. No consensus is
//! needed: a region only ever lowers its own cap by its own decision, and
//! raises it by what a peer has already given up.
//!
//! A grant shipped again, late, twice or after a partition changes
//! nothing (a total, applied as a maximum): when a link heals, nothing is
//! counted twice, and nothing granted is lost while its window lasts. A
//! grant heard after its window has ended is dropped: that budget ended
//! with its window either way. `u_r` itself never crosses regions: each
//! region counts only what it admitted.
//!
//! A `sliding_window` ([`sliding`]) and a `gcra` or `token_bucket`
//! ([`bucket`]: its rate moves, a window's units of rate within an epoch)
//! build on the same grants; their bounds are beside them.
//!
//! With `tolerance: 0%` the fleet never exceeds the limit, and may
//! under-admit: by what is in flight, by what an idle region keeps
//! ([`grants`]' floor), and by what demand the grants have not yet
//! followed. (A rule whose tolerance also lets its hot keys be decided
//! from slices, appendix G, spends it there: the slices bound each
//! region's overshoot by its cap.)
//!
//! # Parts that follow demand
//!
//! [`grants`] moves budget toward the regions that ask for it: from the
//! caps, usage and demand a region last heard from its peers, each region
//! computes every region's remaining need for the window (its demand so
//! far, as a rate, over the time left) and a target for what each should
//! hold of the remaining budget, in proportion; a region holding more than
//! its target (beyond a floor it keeps for its own next requests) grants
//! the excess to those below theirs. Regions decide from stale views, so
//! targets differ between them; the bound does not depend on them (see
//! above), only how fast parts follow demand does.
//!
//! # Partitions
//!
//! A region cut off keeps its cap: it can neither hear grants nor have
//! its own reach their peer (they are stranded until the link heals: an
//! under-admission, never an over-admission). With no link at all each
//! region gets its share, by weight.

pub mod bucket;
mod giving;
mod part;
pub mod record;
pub mod replica;
mod share;
pub mod sliding;
pub mod stored;
pub mod window;

pub use giving::{FLOOR_DIVISOR, Heard, grants};
pub use part::Part;
pub use share::{pool, share, shares};
