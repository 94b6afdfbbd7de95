//! A decision through fair valves' gates: each gated valve's rule set for
//! this request's share before the store call, and what the answer tells
//! of the valve's level learned after it (see `fair`).

use sluice_core::Decision;

use super::{Limiter, fair};
use crate::store::Store;

impl<S: Store> Limiter<S> {
    /// What `decision`, of a request of `cost`, tells of its fair valves'
    /// levels.
    /// It also makes the wait a tenant past its share is given at least a
    /// second (see `fair::at_least_a_second`).
    pub(super) fn learn(&self, gates: &fair::Gates, decision: &mut Decision<'_>, cost: u64) {
        let now = self.options.clock.now_ms();
        self.fair
            .observe(gates, decision, cost, self.store.valve_parts(), now);
        fair::at_least_a_second(decision);
    }
}
