//! Token bucket: `burst` tokens, refilled at `limit` per `per`.
//!
//! Tokens are counted in units of `1/per` so that the refill of `limit/per`
//! tokens per millisecond is the whole number `limit`: a full bucket holds
//! `burst·per` (< 2^52), a request needs `cost·per`, and a millisecond adds
//! `limit`. Everything is an exact integer.
//!
//! # Debt
//!
//! A bucket in debt owes `d` scaled tokens: it is stored as refilling from
//! a moment in the future, `last_ms = now + ⌈d/limit⌉`, holding the
//! `⌈d/limit⌉·limit − d` tokens that make up the rounding. Read at `now`,
//! it holds `tokens − (last_ms − now)·limit`, below zero until the debt is
//! repaid, with no field of its own. A `last_ms` further ahead than the
//! deepest debt (`max_debt`) can be is a clock that stepped back.

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
        Some(b) if b.last_ms > now => {
            // Owing, or repaid since the debit: read as of now.
            let ahead = (b.last_ms - now) * limit;
            if b.scaled_tokens < ahead {
                let deficit = ahead - b.scaled_tokens;
                let outcome = Outcome::denied(
                    0,
                    (capacity + deficit).div_ceil(limit),
                    (cost * per + deficit).div_ceil(limit),
                );
                return (outcome, None);
            }
            ((b.scaled_tokens - ahead).min(capacity), now)
        }
        Some(b) => {
            let elapsed = now - b.last_ms;
            let refilled = b
                .scaled_tokens
                .saturating_add(elapsed.saturating_mul(limit));
            (refilled.min(capacity), now)
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

/// The bucket as it must be read at `now` when it refills from further
/// ahead than its deepest debt allows (the clock stepped back): the same
/// tokens, refilling from `now`.
pub fn repair(rule: &Rule, bucket: Bucket, now: u64) -> Option<Bucket> {
    let deepest_ms = (rule.max_debt() * rule.period_ms()).div_ceil(rule.limit());
    (bucket.last_ms > now && bucket.last_ms - now > deepest_ms).then_some(Bucket {
        scaled_tokens: bucket.scaled_tokens,
        last_ms: now,
    })
}

/// Charges `cost` units whatever the bucket holds (`None`: never used,
/// full), owing at most `max_debt`: the new bucket and the whole units
/// forgiven beyond it.
pub fn debit(rule: &Rule, bucket: Option<Bucket>, now: u64, cost: u64) -> (Bucket, u64) {
    let per = rule.period_ms();
    let limit = rule.limit();
    let capacity = rule.burst() * per;
    let charged = cost.min(rule.burst() + rule.max_debt());
    // What the bucket holds at now, as tokens minus what it owes.
    let (held, owed) = match bucket {
        None => (capacity, 0),
        Some(b) if b.last_ms > now => {
            let ahead = (b.last_ms - now) * limit;
            if b.scaled_tokens >= ahead {
                ((b.scaled_tokens - ahead).min(capacity), 0)
            } else {
                (0, ahead - b.scaled_tokens)
            }
        }
        Some(b) => {
            let elapsed = now - b.last_ms;
            let refilled = b
                .scaled_tokens
                .saturating_add(elapsed.saturating_mul(limit));
            (refilled.min(capacity), 0)
        }
    };
    let need = charged * per;
    if owed == 0 && held >= need {
        let bucket = Bucket {
            scaled_tokens: held - need,
            last_ms: now,
        };
        return (bucket, cost - charged);
    }
    let deepest = rule.max_debt() * per;
    let owed = owed + need - held;
    let (owed, excess) = if owed > deepest {
        (deepest, owed - deepest)
    } else {
        (owed, 0)
    };
    let ahead_ms = owed.div_ceil(limit);
    let bucket = Bucket {
        scaled_tokens: ahead_ms * limit - owed,
        last_ms: now + ahead_ms,
    };
    (bucket, cost - charged + excess.div_ceil(per))
}

/// Gives back `cost` units (never above the capacity).
pub fn refund(rule: &Rule, bucket: Bucket, cost: u64) -> Bucket {
    refund_scaled(rule, bucket, cost * rule.period_ms())
}

/// Gives back `scaled` tokens × `per` (a part of a token included), never
/// above the capacity.
pub fn refund_scaled(rule: &Rule, bucket: Bucket, scaled: u64) -> Bucket {
    let capacity = rule.burst() * rule.period_ms();
    Bucket {
        scaled_tokens: capacity.min(bucket.scaled_tokens + scaled),
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
