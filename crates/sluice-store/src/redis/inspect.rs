//! Reading a bucket's state back out of Redis (`sluice inspect`, peeks):
//! what a key holds, decoded into the state `sluice-core` decides on.

use sluice_core::algorithm::{
    State, concurrency, fixed_window, gcra, sliding_log, sliding_window, token_bucket,
};
use sluice_core::keys::Record;
use sluice_core::{Algorithm, BoundRule};

use super::keys::is_sorted_set;
use crate::store::StoreError;

/// What `GET` (or `ZRANGE … WITHSCORES` for a set) returned for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Raw {
    /// The key does not exist.
    Missing,
    /// A group's records (see [`RECORD_BYTES`]).
    Records(Vec<u8>),
    /// Sorted-set members with their scores.
    Log(Vec<(String, u64)>),
}

/// The command that reads `rule`'s bucket at `key`: `GET`, or `ZRANGE …
/// WITHSCORES` for a sorted set.
pub fn read_command(key: &str, rule: &BoundRule) -> redis::Cmd {
    if is_sorted_set(rule) {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(key).arg(0).arg(-1).arg("WITHSCORES");
        cmd
    } else {
        let mut cmd = redis::cmd("GET");
        cmd.arg(key);
        cmd
    }
}

/// What [`read_command`] for `rule` answered; anything unreadable reads
/// as missing.
pub fn raw(rule: &BoundRule, value: &redis::Value) -> Raw {
    if is_sorted_set(rule) {
        let members: Vec<(String, u64)> = redis::from_redis_value_ref(value).unwrap_or_default();
        if members.is_empty() {
            Raw::Missing
        } else {
            Raw::Log(members)
        }
    } else {
        match redis::from_redis_value_ref::<Option<Vec<u8>>>(value) {
            Ok(Some(v)) => Raw::Records(v),
            _ => Raw::Missing,
        }
    }
}

/// The time `TIME` answered, in ms since the Unix epoch.
pub fn time_ms(value: &redis::Value) -> Result<u64, StoreError> {
    let (secs, micros): (u64, u64) =
        redis::from_redis_value_ref(value).map_err(|e| StoreError::Unavailable(e.to_string()))?;
    Ok(secs * 1_000 + micros / 1_000)
}

/// The bytes of one record in a group's value: its name (8 bytes), then
/// when its state goes idle (ms) and up to three numbers of state, as
/// little-endian doubles (decide.lua's `RECORD`).
pub const RECORD_BYTES: usize = 40;

/// The numbers of `record`'s state in a group's value: when it goes idle,
/// then the state's three numbers (unused ones 0); `None` when the value
/// has no such record.
pub fn find_record(value: &[u8], record: Record) -> Option<[u64; 4]> {
    find_numbers(value, record).map(|numbers| numbers.map(|n| n as u64))
}

/// [`find_record`]'s numbers as stored (a shared window's `moved` may be
/// below 0).
pub fn find_numbers(value: &[u8], record: Record) -> Option<[f64; 4]> {
    value
        .chunks_exact(RECORD_BYTES)
        .find(|r| r[..8] == record.0)
        .map(|r| {
            let mut numbers = [0.0; 4];
            for (n, b) in numbers.iter_mut().zip(r[8..].chunks_exact(8)) {
                *n = f64::from_le_bytes(b.try_into().expect("8 bytes"));
            }
            numbers
        })
}

/// Decodes a stored value into the state `sluice-core` decides on; a value
/// without the rule's record reads as fresh.
pub fn decode(rule: &BoundRule, raw: &Raw, record: Record) -> State {
    match (rule.rule().algorithm(), raw) {
        (_, Raw::Missing) => State::Fresh,
        (Algorithm::Concurrency, Raw::Log(members)) => {
            State::Leases(Box::new(concurrency::Leases::from_held(
                members.iter().filter_map(|(id, expires)| {
                    Some((*expires, u128::from_str_radix(id, 16).ok()?))
                }),
            )))
        }
        (Algorithm::SlidingLog, Raw::Log(members)) => {
            let mut entries: Vec<(u64, u64)> = Vec::new();
            for (_, at) in members {
                match entries.last_mut() {
                    Some((last, units)) if last == at => *units += 1,
                    _ => entries.push((*at, 1)),
                }
            }
            State::SlidingLog(Box::new(sliding_log::Log::from_entries(entries)))
        }
        (Algorithm::SlidingWindow, Raw::Records(value)) => match find_numbers(value, record) {
            None => State::Fresh,
            Some([_idle, a, b, c]) => {
                let limit = rule.rule().limit();
                // A shared window's (negative: what moved to its region
                // counted apart), read after a reload made the rule local:
                // spent, as decide.lua's as_read reads it.
                let (prev, cur) = if b < 0.0 || c < 0.0 {
                    ((b.max(0.0) as u64).min(limit), limit)
                } else {
                    (b as u64, c as u64)
                };
                State::SlidingWindow(sliding_window::Windows {
                    start_ms: a as u64,
                    prev,
                    cur,
                })
            }
        },
        (algorithm, Raw::Records(value)) => match find_record(value, record) {
            None => State::Fresh,
            Some([_idle, a, b, _]) => match algorithm {
                Algorithm::Gcra => State::Gcra(gcra::Tat { ms: a, frac: b }),
                Algorithm::TokenBucket => State::TokenBucket(token_bucket::Bucket {
                    scaled_tokens: a,
                    last_ms: b,
                }),
                Algorithm::FixedWindow => State::FixedWindow(fixed_window::Window {
                    start_ms: a,
                    count: b,
                }),
                // A sliding window is read above (its counts may be below 0).
                Algorithm::SlidingWindow | Algorithm::SlidingLog | Algorithm::Concurrency => {
                    State::Fresh
                }
            },
        },
        _ => State::Fresh,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doubles(values: &[u64]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|v| (*v as f64).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_record_is_found_only_where_records_start() {
        let record = |name: [u8; 8], numbers: [u64; 4]| -> Vec<u8> {
            let mut r = name.to_vec();
            r.extend(doubles(&numbers));
            r
        };
        // The second record's numbers contain the first's name, misaligned.
        let name = Record([0, 0, 0, 0, 0, 0, 0x45, 0x40]);
        let mut value = record([7; 8], [1, 42, 0, 0]);
        value.extend(record(name.0, [9, 1, 2, 3]));
        assert_eq!(find_record(&value, name), Some([9, 1, 2, 3]));
        assert_eq!(find_record(&value, Record([7; 8])), Some([1, 42, 0, 0]));
        assert_eq!(find_record(&value, Record([8; 8])), None);
        assert_eq!(find_record(&value[..70], name), None);
    }
}
