//! Durations as written in the configuration: `500ms`, `1s`, `1m`, `1h`, `1d`.
//!
//! Everything in sluice counts time in whole milliseconds, so a duration is a
//! `u64` of milliseconds; there is no sub-millisecond unit to write.

use std::fmt;

/// Milliseconds in each unit the configuration accepts, longest suffix first
/// so that `ms` is tried before `m`.
const UNITS: [(&str, u64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{input}` is not a duration: write a whole number followed by ms, s, m, h or d (e.g. 500ms, 1s, 1m, 1h, 1d)"
)]
pub struct DurationError {
    input: String,
}

/// Parses `500ms`, `1s`, `10m`, `1h`, `1d` into milliseconds.
///
/// Only whole numbers are accepted: `1.5s` is refused rather than silently
/// rounded, so that what the file says is exactly what is enforced.
pub fn parse_duration_ms(input: &str) -> Result<u64, DurationError> {
    let error = || DurationError {
        input: input.to_owned(),
    };
    let text = input.trim();
    let (digits, unit_ms) = UNITS
        .iter()
        .find_map(|(suffix, ms)| text.strip_suffix(suffix).map(|d| (d, *ms)))
        .ok_or_else(error)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(error());
    }
    let value: u64 = digits.parse().map_err(|_| error())?;
    value.checked_mul(unit_ms).ok_or_else(error)
}

/// Formats milliseconds back into the largest unit that divides them exactly,
/// so that `60000` reads as `1m` in errors and `sluice inspect`.
pub struct HumanDuration(pub u64);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0;
        if ms == 0 {
            return f.write_str("0ms");
        }
        let (suffix, unit) = UNITS
            .iter()
            .rev()
            .find(|(_, unit)| ms.is_multiple_of(*unit))
            .copied()
            .unwrap_or(("ms", 1));
        write!(f, "{}{}", ms / unit, suffix)
    }
}

/// `ms` in whole seconds, rounded up.
pub fn seconds_rounded_up(ms: u64) -> u64 {
    ms.div_ceil(1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("1s"), Ok(1_000));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("7d"), Ok(604_800_000));
        assert_eq!(parse_duration_ms(" 1s "), Ok(1_000));
    }

    #[test]
    fn refuses_what_is_not_a_whole_duration() {
        for bad in [
            "",
            "s",
            "1",
            "1.5s",
            "-1s",
            "1 s",
            "1w",
            "ms1",
            "1sec",
            "99999999999999999999d",
        ] {
            assert!(parse_duration_ms(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        assert_eq!(HumanDuration(60_000).to_string(), "1m");
        assert_eq!(HumanDuration(1_500).to_string(), "1500ms");
        assert_eq!(HumanDuration(86_400_000).to_string(), "1d");
        assert_eq!(HumanDuration(0).to_string(), "0ms");
    }
}
