//! The usage ledger: per tenant, route pattern and minute, the units
//! admitted and denied, appended durably to JSON-lines files — the record
//! a billing system reads (Redis alone is no basis for it: keys expire,
//! a flush or a failover forgets).
//!
//! Decisions are counted in memory; every `flush_every` what was counted
//! since the last flush is appended as one line per (tenant, route
//! pattern, minute), each line a delta to add up, then the file is synced
//! to disk (`fsync`) before the next flush begins. So a crash (`kill -9`,
//! power loss) loses at most the last `flush_every` of counts, and never
//! writes a line twice: every line carries this instance's name and a
//! sequence number. A line cut short by a crash is removed when sluice next
//! starts with the same directory (it truncates each file after its last
//! complete line), and `sluice usage` skips one it meets.
//!
//! A file removed or replaced under the ledger (its directory deleted or
//! swapped) is noticed at the next flush, before and after it writes: the
//! ledger says so (an error) and writes to a new file in `dir` as it is
//! now, made again if need be, so no count goes to a file nobody reads.
//!
//! A flush that cannot write (disk full, directory not writable) keeps its lines,
//! numbered, and the next flush writes them to a new file before what
//! came since (a line the failed write got to disk too is counted once, by
//! its number); at most [`MAX_UNWRITTEN_BYTES`] are kept, the oldest
//! dropped past it, with an error.
//!
//! What is counted between flushes is bounded: at [`MAX_CELLS`] (tenant,
//! route pattern, minute) cells the flush comes early, so a flood of
//! distinct tenant ids costs memory for those cells, not for `flush_every`
//! of them.
//!
//! Files are `usage-<start ms>-<instance>.jsonl`, closed and a new one
//! begun above `max_file_bytes` or after `max_file_age`. Ship them with
//! any log shipper that tails files; a closed file is never written again.
//!
//! ```json
//! {"minute":1764593880000,"tenant":"acme","route":"POST /v1/invoices","admitted":42,"denied":3,"instance":"5f1c…","seq":17}
//! ```

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sluice_core::config::LedgerConfig;
use sluice_core::keys::Keyer;

use crate::Fallible;

/// One line of a ledger file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// The minute counted, as ms since the Unix epoch at its start.
    pub minute: u64,
    /// The tenant, or its HMAC (`ledger.tenants: hmac`).
    pub tenant: String,
    /// The route pattern the requests matched (`*` for none).
    pub route: String,
    /// Units admitted.
    pub admitted: u64,
    /// Units denied.
    pub denied: u64,
    /// The instance that wrote it.
    pub instance: String,
    /// Its sequence number within that instance's run.
    pub seq: u64,
}

/// What one line counts: (tenant, route pattern, minute).
type Cell = (String, String, u64);

/// Cells counted between flushes past which the flush comes early (about
/// 200 bytes each held: some 20 MB).
pub const MAX_CELLS: usize = 100_000;

/// Lines a failed flush keeps for the next one, at most (a few flushes'
/// worth at [`MAX_CELLS`]); past it the oldest are dropped, and said so.
pub const MAX_UNWRITTEN_BYTES: usize = 64 << 20;

struct Open {
    file: File,
    path: PathBuf,
    opened_ms: u64,
    bytes: u64,
}

impl Open {
    /// Whether the file is still the one at its path: not when it, or its
    /// directory, was removed or replaced (appending to it then reaches no
    /// file anyone reads).
    fn in_place(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (self.file.metadata(), std::fs::metadata(&self.path)) {
            (Ok(open), Ok(there)) => open.dev() == there.dev() && open.ino() == there.ino(),
            _ => false,
        }
    }
}

/// The file being appended to, and the lines not yet on disk.
#[derive(Default)]
struct Writer {
    open: Option<Open>,
    /// Whole lines, numbered, that a failed flush could not write.
    unwritten: String,
}

/// Counts usage and appends it to the ledger's files.
pub struct Ledger {
    config: LedgerConfig,
    keyer: Option<Keyer>,
    instance: String,
    seq: AtomicU64,
    counts: Mutex<HashMap<Cell, (u64, u64)>>,
    /// Told when the counts reach [`MAX_CELLS`].
    full: tokio::sync::Notify,
    writer: Mutex<Writer>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("dir", &self.config.dir)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Opens the ledger in `config.dir` (created if missing), first
    /// removing any line a crash cut short. `keyer` HMACs tenant ids when
    /// the configuration asks for it.
    pub fn open(config: &LedgerConfig, keyer: Option<Keyer>) -> Fallible<Ledger> {
        if config.hmac_tenants && keyer.is_none() {
            return Err(
                "ledger.tenants: hmac needs a pepper (keys.pepper_env or keys.pepper_file)".into(),
            );
        }
        std::fs::create_dir_all(&config.dir)
            .map_err(|e| format!("cannot create ledger.dir {}: {e}", config.dir.display()))?;
        for entry in std::fs::read_dir(&config.dir)
            .map_err(|e| format!("cannot read ledger.dir {}: {e}", config.dir.display()))?
        {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "jsonl") {
                repair(&path)?;
            }
        }
        let mut instance = [0u8; 8];
        let _ = getrandom::fill(&mut instance);
        Ok(Ledger {
            config: config.clone(),
            keyer: keyer.filter(|_| config.hmac_tenants),
            instance: instance.iter().map(|b| format!("{b:02x}")).collect(),
            seq: AtomicU64::new(0),
            counts: Mutex::new(HashMap::new()),
            full: tokio::sync::Notify::new(),
            writer: Mutex::new(Writer::default()),
        })
    }

    /// Counts one decision: `cost` units of `tenant` on `route` (the
    /// pattern), admitted or denied, at `now_ms`.
    pub fn record(&self, tenant: &str, route: &str, cost: u64, admitted: bool, now_ms: u64) {
        let minute = now_ms - now_ms % 60_000;
        let tenant = match &self.keyer {
            Some(keyer) => keyer.tenant_tag(tenant, 0).as_str().to_owned(),
            None => tenant.to_owned(),
        };
        let mut counts = self.counts.lock().expect("ledger counts");
        let entry = counts
            .entry((tenant, route.to_owned(), minute))
            .or_default();
        if admitted {
            entry.0 += cost;
        } else {
            entry.1 += cost;
        }
        if counts.len() >= MAX_CELLS {
            self.full.notify_one();
        }
    }

    /// Resolves when the counts have reached [`MAX_CELLS`] (at once if
    /// they did since the last call): flush then, not at the next tick.
    pub async fn full(&self) {
        self.full.notified().await;
    }

    /// How often to flush.
    pub fn flush_every(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.config.flush_every_ms)
    }

    /// Appends what was counted since the last flush, after any lines a
    /// failed flush left, and syncs it to disk. On failure the lines are
    /// kept for the next flush (which writes them to a new file: the
    /// failed one may end in a line cut short), up to
    /// [`MAX_UNWRITTEN_BYTES`]. Blocking: call it off the async runtime.
    pub fn flush(&self, now_ms: u64) -> std::io::Result<()> {
        let counted = std::mem::take(&mut *self.counts.lock().expect("ledger counts"));
        let mut writer = self.writer.lock().expect("ledger writer");
        let Writer { open, unwritten } = &mut *writer;
        let mut lines: Vec<_> = counted.into_iter().collect();
        lines.sort();
        unwritten.reserve(lines.len() * 128);
        for ((tenant, route, minute), (admitted, denied)) in lines {
            let line = Line {
                minute,
                tenant,
                route,
                admitted,
                denied,
                instance: self.instance.clone(),
                seq: self.seq.fetch_add(1, Ordering::Relaxed),
            };
            unwritten.push_str(&serde_json::to_string(&line).expect("lines serialise"));
            unwritten.push('\n');
        }
        if unwritten.is_empty() {
            return Ok(());
        }
        let written = self.append(open, unwritten, now_ms);
        match &written {
            Ok(()) => unwritten.clear(),
            Err(_) => {
                // Never appended to again.
                *open = None;
                keep_newest(unwritten, MAX_UNWRITTEN_BYTES);
            }
        }
        written
    }

    /// Appends `text` (whole lines) to the open file, or to a new one when
    /// there is none or it is due to close, in one write, then syncs it.
    ///
    /// The open file must still be at its path, before the write and after
    /// the sync: a file whose directory was removed or replaced (or that
    /// was removed itself) is let go, with an error, and the lines go to a
    /// new file in the directory as it is now (made again if need be). A
    /// file moved between the two checks holds the lines as well; their
    /// `seq` makes `sluice usage` count them once.
    fn append(&self, open: &mut Option<Open>, text: &str, now_ms: u64) -> std::io::Result<()> {
        for _ in 0..2 {
            self.write_in_place(open, text, now_ms)?;
            if open.as_ref().is_some_and(Open::in_place) {
                return Ok(());
            }
            self.let_go(open);
        }
        Err(std::io::Error::other(
            "the ledger's file was removed or replaced as soon as it was written",
        ))
    }

    /// [`append`](Self::append)'s write and sync, to a file at its path.
    fn write_in_place(
        &self,
        open: &mut Option<Open>,
        text: &str,
        now_ms: u64,
    ) -> std::io::Result<()> {
        let rotate = open.as_ref().is_some_and(|open| {
            open.bytes >= self.config.max_file_bytes
                || now_ms.saturating_sub(open.opened_ms) >= self.config.max_file_age_ms
        });
        if rotate {
            *open = None;
        }
        if open.as_ref().is_some_and(|open| !open.in_place()) {
            self.let_go(open);
        }
        let open = match open {
            Some(open) => open,
            None => {
                std::fs::create_dir_all(&self.config.dir)?;
                let path = self.path(now_ms);
                let handle = OpenOptions::new().create(true).append(true).open(&path)?;
                open.insert(Open {
                    file: handle,
                    path,
                    opened_ms: now_ms,
                    bytes: 0,
                })
            }
        };
        // One write of whole lines, then to disk before anything else.
        open.file.write_all(text.as_bytes())?;
        open.file.sync_data()?;
        open.bytes += text.len() as u64;
        Ok(())
    }

    /// Closes a file no longer at its path, saying so.
    fn let_go(&self, open: &mut Option<Open>) {
        if let Some(gone) = open.take() {
            tracing::error!(
                file = %gone.path.display(),
                dir = %self.config.dir.display(),
                "ledger: the file (or its directory) was removed or replaced; \
                 writing to a new file in ledger.dir, no count lost"
            );
        }
    }

    fn path(&self, now_ms: u64) -> PathBuf {
        self.config
            .dir
            .join(format!("usage-{now_ms}-{}.jsonl", self.instance))
    }
}

/// Drops the oldest whole lines of `text` until it is at most `most`
/// bytes, saying how many went.
fn keep_newest(text: &mut String, most: usize) {
    if text.len() <= most {
        return;
    }
    // The first line start at or after `cut` (`cut` ≥ 1 here).
    let cut = text.len() - most;
    let from = text[cut - 1..].find('\n').map_or(text.len(), |i| cut + i);
    let dropped = text[..from].matches('\n').count();
    text.drain(..from);
    tracing::error!(
        lines = dropped,
        "ledger: usage lines dropped: the ledger could not be written for too long"
    );
}

/// Truncates `path` after its last complete line (a crash may have cut
/// the last one short).
fn repair(path: &Path) -> Fallible<()> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("cannot open ledger file {}: {e}", path.display()))?;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    let mut text = Vec::with_capacity(len as usize);
    file.seek(SeekFrom::Start(0))?;
    file.read_to_end(&mut text)?;
    let keep = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    file.set_len(keep as u64)?;
    file.sync_all()?;
    tracing::warn!(
        file = %path.display(),
        removed_bytes = len - keep as u64,
        "ledger: removed a line a crash cut short"
    );
    Ok(())
}

/// The date and time of `ms` since the Unix epoch, `YYYY-MM-DDTHH:MMZ`.
pub fn minute_text(ms: u64) -> String {
    let minutes = ms / 60_000;
    let (days, minute_of_day) = (minutes / 1_440, minutes % 1_440);
    // Days to a civil date (proleptic Gregorian), as in H. Hinnant's
    // `civil_from_days`.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}Z",
        minute_of_day / 60,
        minute_of_day % 60
    )
}

/// The route a ledger line names: the pattern, or `*` for none.
pub fn route_of(pattern: &str) -> &str {
    match pattern {
        "" => "*",
        pattern => pattern,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood of distinct cells asks for the flush early, once the cap is
    /// reached and not before; the flush empties them.
    #[tokio::test]
    async fn the_flush_comes_early_at_the_cap() {
        let dir = std::env::temp_dir().join(format!("ledger-cap-{}", std::process::id()));
        let config = LedgerConfig {
            dir: dir.clone(),
            hmac_tenants: false,
            flush_every_ms: 60_000,
            max_file_bytes: 1 << 30,
            max_file_age_ms: 3_600_000,
        };
        let ledger = Ledger::open(&config, None).unwrap();
        let full = || tokio::time::timeout(std::time::Duration::from_millis(20), ledger.full());
        for i in 0..MAX_CELLS - 1 {
            ledger.record(&format!("t{i}"), "*", 1, true, 0);
        }
        assert!(full().await.is_err(), "not full one cell under the cap");
        ledger.record("last", "*", 1, true, 0);
        assert!(full().await.is_ok(), "full at the cap");
        ledger.flush(0).unwrap();
        assert!(ledger.counts.lock().unwrap().is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A flush that cannot write (the disk full) keeps its lines; the next
    /// flush writes them, to a file of its own, with what came since, each
    /// line once.
    #[test]
    fn what_a_failed_flush_could_not_write_the_next_one_does() {
        let dir = tempfile::tempdir().unwrap();
        let config = LedgerConfig {
            dir: dir.path().to_owned(),
            hmac_tenants: false,
            flush_every_ms: 1_000,
            max_file_bytes: 1 << 30,
            max_file_age_ms: 3_600_000,
        };
        let ledger = Ledger::open(&config, None).unwrap();
        ledger.record("acme", "*", 3, true, 0);
        // The file the flush at 1 s opens is a device that is always full.
        std::os::unix::fs::symlink("/dev/full", ledger.path(1_000)).unwrap();
        assert!(ledger.flush(1_000).is_err());
        ledger.record("acme", "*", 2, false, 0);
        ledger.record("globex", "*", 1, true, 0);
        ledger.flush(2_000).unwrap();
        let text = std::fs::read_to_string(ledger.path(2_000)).unwrap();
        let lines: Vec<Line> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let of = |tenant: &str| {
            lines
                .iter()
                .filter(|l| l.tenant == tenant)
                .fold((0, 0), |(a, d), l| (a + l.admitted, d + l.denied))
        };
        assert_eq!(of("acme"), (3, 2), "{text}");
        assert_eq!(of("globex"), (1, 0), "{text}");
        let mut seqs: Vec<u64> = lines.iter().map(|l| l.seq).collect();
        seqs.dedup();
        assert_eq!(seqs.len(), lines.len(), "{text}");
    }

    /// The ledger's directory removed, or replaced by another, while a
    /// file is open: the flush finds its file gone from its path, opens a
    /// new one where the directory is now (made again if need be), and
    /// writes every count there (before, it kept appending to the
    /// unlinked file: the counts reached no disk, and nothing was said).
    #[test]
    fn a_directory_removed_or_replaced_loses_no_count() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("ledger");
        let config = LedgerConfig {
            dir: dir.clone(),
            hmac_tenants: false,
            flush_every_ms: 1_000,
            max_file_bytes: 1 << 30,
            max_file_age_ms: 3_600_000,
        };
        let ledger = Ledger::open(&config, None).unwrap();
        let admitted_in = |dir: &Path| -> u64 {
            std::fs::read_dir(dir)
                .unwrap()
                .flat_map(|entry| {
                    let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
                    text.lines()
                        .map(|l| serde_json::from_str::<Line>(l).unwrap().admitted)
                        .collect::<Vec<_>>()
                })
                .sum()
        };
        ledger.record("acme", "*", 1, true, 0);
        ledger.flush(1_000).unwrap();
        assert_eq!(admitted_in(&dir), 1);
        // Removed.
        std::fs::remove_dir_all(&dir).unwrap();
        ledger.record("acme", "*", 2, true, 0);
        ledger.flush(2_000).unwrap();
        assert_eq!(admitted_in(&dir), 2, "made again, the counts since in it");
        // Replaced: moved aside, an empty one in its place.
        let aside = parent.path().join("aside");
        std::fs::rename(&dir, &aside).unwrap();
        std::fs::create_dir(&dir).unwrap();
        ledger.record("acme", "*", 4, true, 0);
        ledger.flush(3_000).unwrap();
        assert_eq!(admitted_in(&dir), 4);
        assert_eq!(
            admitted_in(&aside),
            2,
            "nothing more in the one moved aside"
        );
    }

    #[test]
    fn what_is_kept_unwritten_is_bounded_by_dropping_the_oldest_lines() {
        let mut text = "a\nbb\nccc\n".to_owned();
        keep_newest(&mut text, 100);
        assert_eq!(text, "a\nbb\nccc\n");
        keep_newest(&mut text, 7);
        assert_eq!(text, "bb\nccc\n");
        keep_newest(&mut text, 6);
        assert_eq!(text, "ccc\n");
        keep_newest(&mut text, 3);
        assert_eq!(text, "");
    }

    #[test]
    fn minutes_read_as_dates() {
        assert_eq!(minute_text(0), "1970-01-01T00:00Z");
        assert_eq!(minute_text(1_764_593_880_000), "2025-12-01T12:58Z");
        assert_eq!(minute_text(951_782_400_000), "2000-02-29T00:00Z");
    }

    #[test]
    fn a_torn_last_line_is_removed_and_whole_lines_stay() {
        let path = std::env::temp_dir().join(format!("ledger-repair-{}.jsonl", std::process::id()));
        std::fs::write(&path, b"{\"a\":1}\n{\"b\":2}\n{\"c\":").unwrap();
        repair(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n{\"b\":2}\n");
        repair(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"a\":1}\n{\"b\":2}\n");
        std::fs::remove_file(path).unwrap();
    }
}
