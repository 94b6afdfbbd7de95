//! Token bucket: `burst` tokens, refilled at `limit` per `per`.
//!
//! Tokens are counted in units of `1/per` so that the refill of `limit/per`
//! tokens per millisecond is the whole number `limit`: a full bucket holds
//! `burst·per` (< 2^52), a request needs `cost·per`, and a millisecond adds
//! `limit`. Everything is an exact integer.

use super::Outcome;
use crate::rule::Rule;

/// Tokens (scaled by `per`) as of `last_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bucket {
    /// Tokens × `per`.
    pub scaled_tokens: u64,
    /// When `scaled_tokens` was last brought up to date.
    pub last_ms: u64,
}

/// Decides a request; `Some(new bucket)` when admitted. `None` as the input
/// is a bucket never used: full.
pub fn decide(
    rule: &Rule,
    bucket: Option<Bucket>,
    now: u64,
    cost: u64,
) -> (Outcome, Option<Bucket>) {
    let per = rule.period_ms();
    let limit = rule.limit();
    let capacity = rule.burst() * per;
    let (available, last) = match bucket {
        None => (capacity, now),
        Some(b) => {
            let elapsed = now.saturating_sub(b.last_ms);
            let refilled = b
                .scaled_tokens
                .saturating_add(elapsed.saturating_mul(limit));
            (refilled.min(capacity), b.last_ms.max(now))
        }
    };
    let need = cost * per;
    if available >= need {
        let left = available - need;
        let outcome = Outcome::allowed(left / per, (capacity - left).div_ceil(limit));
        (
            outcome,
            Some(Bucket {
                scaled_tokens: left,
                last_ms: last,
            }),
        )
    } else {
        let outcome = Outcome::denied(
            available / per,
            (capacity - available).div_ceil(limit),
            (need - available).div_ceil(limit),
        );
        (outcome, None)
    }
}

/// The bucket as it must be read at `now` when it was last refilled later
/// than `now` (the clock stepped back): the same tokens, refilling from
/// `now`.
pub fn repair(bucket: Bucket, now: u64) -> Option<Bucket> {
    (bucket.last_ms > now).then_some(Bucket {
        scaled_tokens: bucket.scaled_tokens,
        last_ms: now,
    })
}

/// Gives back `cost` units (never above the capacity).
pub fn refund(rule: &Rule, bucket: Bucket, cost: u64) -> Bucket {
    let capacity = rule.burst() * rule.period_ms();
    Bucket {
        scaled_tokens: capacity.min(bucket.scaled_tokens + cost * rule.period_ms()),
        last_ms: bucket.last_ms,
    }
}

/// When the bucket has refilled completely.
pub fn idle_at(rule: &Rule, bucket: Bucket) -> u64 {
    let capacity = rule.burst() * rule.period_ms();
    let missing = capacity.saturating_sub(bucket.scaled_tokens);
    bucket.last_ms + missing.div_ceil(rule.limit())
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::{Run, rule};
    use crate::rule::Algorithm;

    #[test]
    fn drains_then_refills_at_the_rate() {
        // 20 per second, bucket of 50.
        let mut run = Run::new(rule(Algorithm::TokenBucket, 20, 1_000, Some(50)));
        let first = run.at(1_000, 50);
        assert!(first.allowed);
        assert_eq!(first.remaining, 0);
        assert_eq!(first.reset_after_ms, 2_500);
        let denied = run.at(1_000, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 50);
        assert!(!run.at(1_049, 1).allowed);
        assert!(run.at(1_050, 1).allowed);
        // Half a second refills 10 tokens.
        let later = run.at(1_550, 10);
        assert!(later.allowed);
        assert_eq!(later.remaining, 0);
    }
}
