//! How a saturated global valve is shared between tenants (appendix E of
//! the specification): the valve's `share` and `reserve`, and each plan's
//! `weight`.

/// The most a plan's `weight` may be.
pub const MAX_WEIGHT: f64 = 1_000.0;
/// The least a plan's `weight` may be.
pub const MIN_WEIGHT: f64 = 0.001;

/// How one valve is shared when it is saturated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Share {
    /// Max-min fair by plan weight (the default): a tenant asking for less
    /// than its weighted share is not denied by the valve.
    #[default]
    Fair,
    /// First come, first served: whoever asks most often takes each freed
    /// unit.
    FirstCome,
}

/// The sharing of one valve rule: the `share` (and `reserve`) written on a
/// rule under `global`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValveShare {
    /// The route pattern the valve is under, in its one spelling.
    pub pattern: String,
    /// The valve rule's name.
    pub name: String,
    /// How it is shared.
    pub share: Share,
}
