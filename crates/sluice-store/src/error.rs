//! Why a store could not do what it was asked.

/// Why a store could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The memory store holds `max_entries` keys and this decision needs a
    /// new one.
    #[error("the memory store is full ({0} keys); raise storage.max_entries")]
    Full(usize),
    /// The tenant of this decision holds its share of the memory store
    /// (`max_entries_per_tenant` keys) and this decision needs a new one.
    #[error(
        "the tenant holds its share of the memory store ({0} keys); raise storage.max_entries_per_tenant"
    )]
    TenantFull(usize),
    /// The call did not finish within its time budget.
    #[error("store call timed out after {0}ms")]
    Timeout(u64),
    /// The store could not be reached or answered with an error.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store refused our credentials: a configuration error, not an
    /// outage.
    #[error("store refused the credentials: {0}")]
    Refused(String),
}

impl StoreError {
    /// Every kind [`kind`](Self::kind) names, at its
    /// [`kind_index`](Self::kind_index).
    pub const KINDS: [&'static str; 4] = ["timeout", "unavailable", "refused", "full"];

    /// The error's kind, as metrics and traces label it: `timeout`,
    /// `unavailable`, `refused` or `full`.
    pub fn kind(&self) -> &'static str {
        StoreError::KINDS[self.kind_index()]
    }

    /// The index of its kind in [`KINDS`](Self::KINDS).
    pub fn kind_index(&self) -> usize {
        match self {
            StoreError::Timeout(_) => 0,
            StoreError::Unavailable(_) => 1,
            StoreError::Refused(_) => 2,
            StoreError::Full(_) | StoreError::TenantFull(_) => 3,
        }
    }
}
