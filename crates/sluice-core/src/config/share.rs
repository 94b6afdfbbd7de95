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
    /// Max-min fair by plan weight (the default on `gcra` and
    /// `token_bucket` valves, the only ones it is allowed on: see
    /// [`Algorithm::refills`](crate::Algorithm::refills)): a tenant asking
    /// for less than its weighted share is not denied by the valve.
    #[default]
    Fair,
    /// First come, first served: whoever asks most often takes each freed
    /// unit (the default on window and concurrency valves).
    FirstCome,
}

/// The sharing of one valve rule: the `share` (and `reserve`) written on a
/// rule under `global`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValveShare {
    /// The route pattern the valve is under, in its one spelling.
    pub pattern: String,
    /// The valve rule's name.
    pub name: String,
    /// How it is shared.
    pub share: Share,
    /// The parts of the valve held for named plans, in the order written
    /// (empty for none). Together below the whole valve.
    pub reserve: Vec<Reserve>,
    /// Whether its limit follows its downstream (`adaptive`), and how.
    pub adaptive: Option<crate::adaptive::Adaptive>,
}

/// A part of a fair valve held for one plan's tenants: `reserve: { plan:
/// "20%" }`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reserve {
    /// The plan's name.
    pub plan: String,
    /// The part of the valve's limit (and burst) held, above 0 and below 1.
    pub fraction: f64,
}

/// Reads a percent written `"<n>%"` (as `reserve` and `tolerance` are) as
/// a fraction; `None` for any other spelling.
pub fn percent(text: &str) -> Option<f64> {
    let number = text.trim().strip_suffix('%')?.trim_end();
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    value.is_finite().then_some(value / 100.0)
}

#[cfg(test)]
mod tests {
    use super::percent;

    #[test]
    fn a_percent_is_a_number_and_a_percent_sign() {
        assert_eq!(percent("20%"), Some(0.2));
        assert_eq!(percent("2.5%"), Some(0.025));
        assert_eq!(percent(" 0% "), Some(0.0));
        for bad in [
            "20", "%", "-5%", "1e2%", "abc%", "20 %%", "", "nan%", "1..2%",
        ] {
            assert_eq!(percent(bad), None, "{bad}");
        }
    }
}
