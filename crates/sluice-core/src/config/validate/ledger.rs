//! The `ledger:` section: where usage is recorded, and how often.

use std::path::PathBuf;

use super::Validator;
use crate::config::LedgerConfig;
use crate::config::raw::{RawLedger, S};

impl Validator<'_> {
    pub(super) fn ledger(&mut self, raw: S<RawLedger>) -> LedgerConfig {
        let at = raw.referenced;
        let raw = raw.value;
        let dir = match raw.dir {
            Some(d) if !d.value.is_empty() => PathBuf::from(d.value),
            Some(d) => {
                self.push(d.referenced, "`ledger.dir` must be a directory path");
                PathBuf::new()
            }
            None => {
                self.push(at, "`ledger` needs `dir`, the directory its files go in");
                PathBuf::new()
            }
        };
        let hmac_tenants = match raw.tenants {
            None => false,
            Some(t) if t.value == "clear" => false,
            Some(t) if t.value == "hmac" => true,
            Some(t) => {
                self.push(
                    t.referenced,
                    format!(
                        "`ledger.tenants` must be `clear` or `hmac`, got `{}`",
                        t.value
                    ),
                );
                false
            }
        };
        LedgerConfig {
            dir,
            hmac_tenants,
            flush_every_ms: self.duration_in(
                raw.flush_every.as_ref(),
                "ledger.flush_every",
                10_000,
                100..=60_000,
            ),
            max_file_bytes: self.integer_in(
                raw.max_file_bytes.as_ref(),
                "ledger.max_file_bytes",
                64 * 1024 * 1024,
                4_096..=(1 << 40),
            ),
            max_file_age_ms: self.duration_in(
                raw.max_file_age.as_ref(),
                "ledger.max_file_age",
                3_600_000,
                60_000..=31 * 86_400_000,
            ),
        }
    }
}
