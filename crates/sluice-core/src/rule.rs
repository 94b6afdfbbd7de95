//! A rule: one algorithm with its parameters, validated once.
//!
//! Every rule counts `limit` units per `period_ms`. Time is whole
//! milliseconds and all arithmetic is on integers: the products
//! `limit × period_ms` and `burst × period_ms` are kept below 2^52 so that the
//! same arithmetic is exact in Redis Lua, whose numbers are doubles. That is
//! what lets the Lua scripts and this crate give bit-identical answers.

use std::fmt;

use crate::duration::HumanDuration;

/// The largest `limit` (and `burst`) a rule may have.
pub const MAX_LIMIT: u64 = 1_000_000_000;
/// The largest `limit` of a `fixed_window` rule: any envoyproxy/ratelimit
/// `requests_per_unit` (a `uint32`). A window only counts, so neither this
/// nor `per` is bound by [`MAX_SCALED`].
pub const FIXED_WINDOW_MAX_LIMIT: u64 = u32::MAX as u64;
/// The longest `per` a rule may have: 366 days.
pub const MAX_PERIOD_MS: u64 = 366 * 86_400_000;
/// The bound on `limit × per` and `burst × per` (in units × milliseconds) that
/// keeps every intermediate value exact in a double.
pub const MAX_SCALED: u64 = 1 << 52;
/// `sliding_log` keeps one entry per admitted unit, so its memory is
/// O(limit); above this limit use `sliding_window`.
pub const SLIDING_LOG_MAX_LIMIT: u64 = 10_000;
/// `concurrency` keeps one entry per lease held, so its `limit` is capped
/// like `sliding_log`'s.
pub const CONCURRENCY_MAX_LIMIT: u64 = 10_000;
/// The least a share of a rule split over several keys holds (see
/// [`Rule::shares`]).
pub const MIN_SHARE: u64 = 25;
/// The longest `lease` of a `concurrency` rule: one day.
pub const MAX_LEASE_MS: u64 = 86_400_000;

/// The rate-limiting algorithms sluice implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Generic cell rate algorithm: one timestamp, exact, `limit` per `per`
    /// with up to `burst` at once.
    Gcra,
    /// Token bucket: `burst` tokens, refilled at `limit` per `per`; exact.
    TokenBucket,
    /// One entry per admitted unit in the last `per`; exact, O(limit) memory.
    SlidingLog,
    /// Two fixed windows, the previous one weighted; approximate, O(1).
    SlidingWindow,
    /// One counter per window; exact per window.
    FixedWindow,
    /// At most `limit` leases held at once, each expiring `per` (the
    /// `lease`) after it was taken unless released first; exact.
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, in the order the documentation lists them.
    pub const ALL: [Algorithm; 6] = [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::Concurrency,
    ];

    /// The name used in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::SlidingLog => "sliding_log",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// Looks an algorithm up by its configuration name.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether the algorithm has a burst capacity distinct from its limit.
    pub fn has_burst(self) -> bool {
        matches!(self, Algorithm::Gcra | Algorithm::TokenBucket)
    }

    /// Whether what a rule of this algorithm has left comes back
    /// continuously, at its rate, as time passes (not when a window moves
    /// on, nor when a lease is released): what a fair valve's level law
    /// reads (see the store crate's `limiter::fair`), so the algorithms a
    /// valve may be `share: fair` on.
    pub fn refills(self) -> bool {
        matches!(self, Algorithm::Gcra | Algorithm::TokenBucket)
    }

    /// Whether the algorithm's state is a set of entries (sliding_log's
    /// admissions, concurrency's leases) rather than a few numbers.
    pub fn keeps_a_set(self) -> bool {
        matches!(self, Algorithm::SlidingLog | Algorithm::Concurrency)
    }

    /// Whether a denied decision of this algorithm can never over-admit.
    pub fn is_exact(self) -> bool {
        !matches!(self, Algorithm::SlidingWindow)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A validated rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rule {
    algorithm: Algorithm,
    limit: u64,
    period_ms: u64,
    burst: u64,
    aligned: bool,
    /// Kept whole on shard 0 of a sharded tenant, not divided between its
    /// shards (see [`for_shards`](Rule::for_shards)).
    whole: bool,
    /// The most units a debit may leave owing past an exhausted bucket
    /// (see [`with_max_debt`](Rule::with_max_debt)).
    max_debt: u64,
}

/// Why a rule's parameters were refused; each names the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// `limit` outside 1..=MAX_LIMIT (FIXED_WINDOW_MAX_LIMIT for
    /// fixed_window).
    #[error("`limit` must be a whole number from 1 to {1}, got {0}")]
    Limit(i128, u64),
    /// `per` outside 1ms..=366d.
    #[error("`per` must be from 1ms to 366d, got {}", HumanDuration(*.0))]
    Period(u64),
    /// `burst` outside 1..=MAX_LIMIT.
    #[error("`burst` must be a whole number from 1 to {MAX_LIMIT}, got {0}")]
    Burst(i128),
    /// `burst` on an algorithm that has none.
    #[error("`burst` is only for gcra and token_bucket; {0} allows exactly `limit` per window")]
    BurstNotAllowed(Algorithm),
    /// `aligned` on an algorithm other than fixed_window.
    #[error("`aligned` is only for fixed_window ({0} windows are {1})")]
    AlignedNotAllowed(Algorithm, &'static str),
    /// `limit × per` or `burst × per` too large to compute exactly.
    #[error(
        "`{field}` × `per` is too large ({value} × {per_ms}ms > 2^52): lower `{field}` or `per`, e.g. {smaller} per {per}",
        per = HumanDuration(*per_ms),
        smaller = MAX_SCALED / per_ms
    )]
    TooLarge {
        /// `limit` or `burst`.
        field: &'static str,
        /// The field's value.
        value: u64,
        /// The rule's period.
        per_ms: u64,
    },
    /// `sliding_log` above its memory cap.
    #[error(
        "sliding_log keeps one entry per admitted unit, so `limit` is capped at {SLIDING_LOG_MAX_LIMIT} (got {0}); use sliding_window for larger limits"
    )]
    SlidingLogTooLarge(u64),
    /// `concurrency` above its cap.
    #[error(
        "concurrency keeps one entry per lease held, so `limit` is capped at {CONCURRENCY_MAX_LIMIT} (got {0})"
    )]
    ConcurrencyTooLarge(u64),
    /// A `concurrency` lease outside 1ms..=1d.
    #[error("`lease` must be from 1ms to 1d, got {}", HumanDuration(*.0))]
    Lease(u64),
    /// `max_debt` outside its range for this rule.
    #[error("`max_debt` must be a whole number from 0 to {1}, got {0}")]
    MaxDebt(i128, u64),
    /// `max_debt` on a rule that never owes (concurrency).
    #[error("`max_debt` is not for concurrency rules: a lease is held or not, never owed")]
    MaxDebtNotAllowed,
}

impl Rule {
    /// Builds a rule, checking every parameter. `burst` defaults to `limit`.
    pub fn new(
        algorithm: Algorithm,
        limit: i128,
        period_ms: u64,
        burst: Option<i128>,
        aligned: bool,
    ) -> Result<Rule, RuleError> {
        let max = if algorithm == Algorithm::FixedWindow {
            FIXED_WINDOW_MAX_LIMIT
        } else {
            MAX_LIMIT
        };
        let limit = u64::try_from(limit)
            .ok()
            .filter(|l| (1..=max).contains(l))
            .ok_or(RuleError::Limit(limit, max))?;
        if !(1..=MAX_PERIOD_MS).contains(&period_ms) {
            return Err(RuleError::Period(period_ms));
        }
        let burst = match burst {
            None => limit,
            Some(_) if !algorithm.has_burst() => return Err(RuleError::BurstNotAllowed(algorithm)),
            Some(b) => u64::try_from(b)
                .ok()
                .filter(|b| (1..=MAX_LIMIT).contains(b))
                .ok_or(RuleError::Burst(b))?,
        };
        if aligned && algorithm != Algorithm::FixedWindow {
            let how = if algorithm == Algorithm::SlidingWindow {
                "always aligned"
            } else {
                "not windows"
            };
            return Err(RuleError::AlignedNotAllowed(algorithm, how));
        }
        for (field, value) in [("limit", limit), ("burst", burst)] {
            if algorithm != Algorithm::FixedWindow && value.saturating_mul(period_ms) > MAX_SCALED {
                return Err(RuleError::TooLarge {
                    field,
                    value,
                    per_ms: period_ms,
                });
            }
        }
        if algorithm == Algorithm::SlidingLog && limit > SLIDING_LOG_MAX_LIMIT {
            return Err(RuleError::SlidingLogTooLarge(limit));
        }
        if algorithm == Algorithm::Concurrency {
            if limit > CONCURRENCY_MAX_LIMIT {
                return Err(RuleError::ConcurrencyTooLarge(limit));
            }
            if period_ms > MAX_LEASE_MS {
                return Err(RuleError::Lease(period_ms));
            }
        }
        Ok(Rule {
            algorithm,
            limit,
            period_ms,
            burst,
            aligned,
            whole: false,
            max_debt: limit.min(debt_bound(algorithm, period_ms, burst)),
        })
    }

    /// This rule owing at most `max_debt` units past an exhausted bucket
    /// (the default is its `limit`; 0: a debit never goes past empty).
    /// Bounded so that a bucket in the deepest debt stays exact in a double
    /// (`(burst + max_debt) × per < 2^52`) and, for `sliding_log`, at most
    /// [`SLIDING_LOG_MAX_LIMIT`]; a concurrency rule never owes.
    pub fn with_max_debt(self, max_debt: i128) -> Result<Rule, RuleError> {
        if self.is_concurrency() {
            return Err(RuleError::MaxDebtNotAllowed);
        }
        let most = debt_bound(self.algorithm, self.period_ms, self.burst);
        let max_debt = u64::try_from(max_debt)
            .ok()
            .filter(|d| *d <= most)
            .ok_or(RuleError::MaxDebt(max_debt, most))?;
        Ok(Rule { max_debt, ..self })
    }

    /// The most units a debit may leave owing past an exhausted bucket: a
    /// bucket in debt denies until it is repaid, and what a debit would
    /// owe beyond this is forgiven (see `sluice_core::algorithm`).
    pub fn max_debt(&self) -> u64 {
        self.max_debt
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Units per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period in milliseconds (a `concurrency` rule's lease).
    pub fn period_ms(&self) -> u64 {
        self.period_ms
    }

    /// The burst (equal to `limit` for algorithms without one).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whether a fixed window is aligned to the Unix epoch (calendar windows).
    pub fn aligned(&self) -> bool {
        self.aligned
    }

    /// This rule cut to one of `parts` equal shares: `max(1, ⌊limit/parts⌋)`
    /// and `max(1, ⌊burst/parts⌋)`. Used when `parts` stores (tenant shards,
    /// or sluice instances falling back to local limits) each enforce a part
    /// of one limit.
    #[inline]
    pub fn share(&self, parts: u64) -> Rule {
        if parts <= 1 {
            return *self;
        }
        let cut = |v: u64| (v / parts).max(1);
        Rule {
            limit: cut(self.limit),
            burst: cut(self.burst),
            max_debt: self.max_debt / parts,
            ..*self
        }
    }

    /// This rule as each of a tenant's `shards` enforces it: its
    /// [`share`](Self::share) when every share is exact (`limit` and
    /// `burst` at least `shards`); else the rule itself, kept whole on
    /// shard 0 ([`is_whole`](Self::is_whole)), since shares of at least 1
    /// each would give the tenant up to `shards` where the rule says less.
    pub fn for_shards(&self, shards: u64) -> Rule {
        if shards > 1 && (self.limit < shards || self.burst < shards) {
            return Rule {
                whole: true,
                ..*self
            };
        }
        self.share(shards)
    }

    /// Whether a sharded tenant keeps this rule whole on shard 0 rather than
    /// a share on each shard.
    pub fn is_whole(&self) -> bool {
        self.whole
    }

    /// This rule with its limit and burst multiplied by `factor` (rounded
    /// down, at least 1), checked like any rule.
    pub fn scaled(&self, factor: f64) -> Result<Rule, RuleError> {
        let scale = |v: u64| ((v as f64) * factor).floor().max(1.0) as i128;
        if self.is_concurrency() {
            return Rule::concurrency(scale(self.limit), self.period_ms);
        }
        let burst = self.algorithm.has_burst().then(|| scale(self.burst));
        let rule = Rule::new(
            self.algorithm,
            scale(self.limit),
            self.period_ms,
            burst,
            self.aligned,
        )?;
        // The debt scales with the limit, within the rule's bound.
        let debt = ((self.max_debt as f64) * factor).floor() as u64;
        Ok(Rule {
            max_debt: debt.min(debt_bound(rule.algorithm, rule.period_ms, rule.burst)),
            ..rule
        })
    }

    /// Into how many shares, of at most `most`, this rule is cut: each
    /// holds at least [`MIN_SHARE`] units of its limit and of its burst
    /// (so the shares add up to at most the rule, and at least the rule
    /// minus one unit per share). A rule too small for that is no hot key
    /// to spread, and a share of a few units would be empty as often as
    /// not.
    pub fn shares(&self, most: u64) -> u64 {
        most.min(self.limit / MIN_SHARE)
            .min(self.burst / MIN_SHARE)
            .max(1)
    }

    /// A `concurrency` rule of `limit` leases at once, each expiring
    /// `lease_ms` after it was taken.
    pub fn concurrency(limit: i128, lease_ms: u64) -> Result<Rule, RuleError> {
        if !(1..=MAX_LEASE_MS).contains(&lease_ms) {
            return Err(RuleError::Lease(lease_ms));
        }
        Rule::new(Algorithm::Concurrency, limit, lease_ms, None, false)
    }

    /// Whether this rule holds leases (`concurrency`) rather than counting
    /// units over time.
    pub fn is_concurrency(&self) -> bool {
        self.algorithm == Algorithm::Concurrency
    }

    /// The units one request consumes of this rule when it costs `cost`:
    /// a lease is one slot whatever the request costs.
    pub fn units(&self, cost: u64) -> u64 {
        if self.is_concurrency() { 1 } else { cost }
    }

    /// The most units one decision can ever consume: `burst` for gcra and
    /// token_bucket, `limit` for the window algorithms. A request costing more
    /// can never pass.
    pub fn capacity(&self) -> u64 {
        if self.algorithm.has_burst() {
            self.burst
        } else {
            self.limit
        }
    }
}

/// The most `max_debt` a rule may have: `(burst + max_debt) × per` stays
/// under [`MAX_SCALED`] (a fixed window only counts), a `sliding_log` owes
/// at most [`SLIDING_LOG_MAX_LIMIT`] entries, a concurrency rule nothing.
fn debt_bound(algorithm: Algorithm, period_ms: u64, burst: u64) -> u64 {
    match algorithm {
        Algorithm::Concurrency => 0,
        Algorithm::SlidingLog => SLIDING_LOG_MAX_LIMIT,
        Algorithm::FixedWindow => MAX_LIMIT,
        _ => (MAX_SCALED / period_ms)
            .saturating_sub(burst)
            .min(MAX_LIMIT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_defaults_to_limit() {
        let rule = Rule::new(Algorithm::Gcra, 20, 1_000, None, false).unwrap();
        assert_eq!(rule.burst(), 20);
        assert_eq!(rule.capacity(), 20);
        let rule = Rule::new(Algorithm::TokenBucket, 20, 1_000, Some(50), false).unwrap();
        assert_eq!(rule.capacity(), 50);
    }

    #[test]
    fn a_share_is_a_part_of_the_limit_and_never_zero() {
        let rule = Rule::new(Algorithm::TokenBucket, 100, 1_000, Some(250), false).unwrap();
        let half = rule.share(2);
        assert_eq!((half.limit(), half.burst()), (50, 125));
        let tiny = rule.share(1_000);
        assert_eq!((tiny.limit(), tiny.burst()), (1, 1));
        assert_eq!(rule.share(1), rule);
    }

    #[test]
    fn refuses_each_bad_parameter_with_its_field() {
        let err = |r: Result<Rule, RuleError>| r.unwrap_err().to_string();
        assert!(err(Rule::new(Algorithm::Gcra, 0, 1_000, None, false)).contains("`limit`"));
        assert!(err(Rule::new(Algorithm::Gcra, -3, 1_000, None, false)).contains("`limit`"));
        assert!(err(Rule::new(Algorithm::Gcra, 1, 0, None, false)).contains("`per`"));
        assert!(err(Rule::new(Algorithm::Gcra, 1, 1_000, Some(0), false)).contains("`burst`"));
        assert!(
            err(Rule::new(Algorithm::FixedWindow, 1, 1_000, Some(5), false))
                .contains("only for gcra and token_bucket")
        );
        assert!(err(Rule::new(Algorithm::Gcra, 1, 1_000, None, true)).contains("`aligned`"));
        assert!(
            err(Rule::new(Algorithm::SlidingLog, 10_001, 1_000, None, false))
                .contains("use sliding_window")
        );
        assert!(
            err(Rule::new(
                Algorithm::Gcra,
                1_000_000_000,
                86_400_000,
                None,
                false
            ))
            .contains("too large")
        );
    }
}
