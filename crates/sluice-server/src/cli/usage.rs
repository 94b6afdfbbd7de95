//! `sluice usage FILES`: the usage ledger summed per tenant and period.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashSet};
use std::io::BufRead;
use std::process::ExitCode;

use super::{Period, UsageArgs};
use crate::ledger::{Line, minute_text};

pub(super) fn run(args: UsageArgs) -> ExitCode {
    let mut files = Vec::new();
    for path in &args.files {
        if path.is_dir() {
            match std::fs::read_dir(path) {
                Ok(entries) => files.extend(
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|e| e == "jsonl")),
                ),
                Err(e) => {
                    eprintln!("error: cannot read {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
        } else {
            files.push(path.clone());
        }
    }
    files.sort();
    let span = match args.by {
        Period::Minute => 60_000,
        Period::Hour => 3_600_000,
        Period::Day => 86_400_000,
        Period::All => u64::MAX,
    };
    // (tenant, period start) → (admitted, denied)
    let mut totals: BTreeMap<(String, u64), (u64, u64)> = BTreeMap::new();
    let mut seen = HashSet::new();
    let (mut skipped, mut repeated) = (0u64, 0u64);
    for file in &files {
        let reader = match std::fs::File::open(file) {
            Ok(f) => std::io::BufReader::new(f),
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", file.display());
                return ExitCode::from(2);
            }
        };
        for (number, line) in reader.split(b'\n').enumerate() {
            let Ok(line) = line else {
                skipped += 1;
                continue;
            };
            let Ok(line) = serde_json::from_slice::<Line>(&line) else {
                skipped += 1;
                continue;
            };
            if !seen.insert((line.instance.clone(), line.seq)) {
                repeated += 1;
                continue;
            }
            let start = if span == u64::MAX {
                0
            } else {
                line.minute - line.minute % span
            };
            let slot = totals.entry((line.tenant, start));
            let (admitted, denied) = match &slot {
                Entry::Occupied(o) => *o.get(),
                Entry::Vacant(_) => (0, 0),
            };
            // No instance counts 2^64 units in a minute: a total past that
            // comes of a corrupt line, and is refused rather than wrapped.
            let (Some(admitted), Some(denied)) = (
                admitted.checked_add(line.admitted),
                denied.checked_add(line.denied),
            ) else {
                let what = if admitted.checked_add(line.admitted).is_none() {
                    "admitted"
                } else {
                    "denied"
                };
                let period = if span == u64::MAX {
                    "in all".to_owned()
                } else {
                    format!("in {}", minute_text(start))
                };
                eprintln!(
                    "error: the {what} units of tenant {:?} {period} add up past {} at {} line {}: \
                     the ledger holds a corrupt line",
                    crate::shown(&slot.key().0),
                    u64::MAX,
                    file.display(),
                    number + 1
                );
                return ExitCode::from(2);
            };
            *slot.or_default() = (admitted, denied);
        }
    }
    if args.json {
        for ((tenant, start), (admitted, denied)) in &totals {
            let period = (span != u64::MAX).then(|| minute_text(*start));
            println!(
                "{}",
                serde_json::json!({"tenant": tenant, "period": period, "admitted": admitted, "denied": denied})
            );
        }
    } else {
        println!(
            "{:<32} {:<18} {:>12} {:>12}",
            "tenant", "period", "admitted", "denied"
        );
        for ((tenant, start), (admitted, denied)) in &totals {
            let period = if span == u64::MAX {
                "all".to_owned()
            } else {
                minute_text(*start)
            };
            println!("{tenant:<32} {period:<18} {admitted:>12} {denied:>12}");
        }
    }
    if skipped > 0 || repeated > 0 {
        eprintln!(
            "note: {skipped} lines skipped (cut short or not ledger lines), {repeated} repeated lines counted once"
        );
    }
    ExitCode::SUCCESS
}
