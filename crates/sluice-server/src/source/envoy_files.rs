//! envoyproxy/ratelimit configuration files, read once through one
//! resolved directory.
//!
//! A runtime directory is usually swapped whole: a Kubernetes ConfigMap
//! points its `..data` symlink at a new generation, envoyproxy/ratelimit's
//! `RUNTIME_ROOT` is a `current` symlink moved to a new tree. Read file by
//! file through the directory's own path, a read can meet two generations
//! (one file before the swap, the next after). So the directory is
//! resolved once, its symlinks followed and then its `..data` if it has
//! one, and every file is read from that one real directory. The reloader
//! fingerprints this one read, waits for it to settle and applies the very
//! same [`EnvoyFiles`]: nothing is read again between the settle check
//! and the apply.

use std::path::{Path, PathBuf};

use sluice_core::config::envoy::EnvoyDomain;

use crate::Fallible;

/// The name of a ConfigMap's link to its current generation.
const DATA: &str = "..data";

/// The files of an envoyproxy/ratelimit configuration, as read at once:
/// each file's name (under the configured path) and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyFiles {
    files: Vec<(String, String)>,
}

impl EnvoyFiles {
    /// Reads `path`: a file, or a directory's `*.yaml` files (with
    /// `all_files`, every file but dot files), from the one directory it
    /// resolves to now.
    pub fn read(path: &Path, all_files: bool) -> Fallible<EnvoyFiles> {
        if !path.is_dir() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            return Ok(EnvoyFiles {
                files: vec![(path.display().to_string(), text)],
            });
        }
        let real = resolved(path)?;
        // The whole tree, as envoyproxy/ratelimit walks it (dot files and
        // directories aside: see `envoy::files`).
        let names = crate::envoy::files::names(&real, all_files)?;
        let mut files = Vec::with_capacity(names.len());
        for name in names {
            let shown = path.join(&name);
            let text = std::fs::read_to_string(real.join(&name))
                .map_err(|e| format!("cannot read {}: {e}", shown.display()))?;
            files.push((shown.display().to_string(), text));
        }
        Ok(EnvoyFiles { files })
    }

    /// Appends what tells this read from another (names and texts).
    pub fn fingerprint_into(&self, out: &mut String) {
        for (name, text) in &self.files {
            out.push_str(name);
            out.push('\0');
            out.push_str(text);
            out.push('\0');
        }
    }

    /// The domains these files define, split domains merged when `merge`
    /// is set.
    pub fn domains(&self, merge: bool) -> Fallible<Vec<EnvoyDomain>> {
        Ok(sluice_core::config::envoy::load_with(&self.files, merge)?)
    }
}

/// The real directory `dir` stands for now: its symlinks followed, then
/// its `..data` generation when it has one (resolved once, so that every
/// file comes from one generation).
fn resolved(dir: &Path) -> Fallible<PathBuf> {
    let real =
        std::fs::canonicalize(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    match std::fs::canonicalize(real.join(DATA)) {
        Ok(generation) if generation.is_dir() => Ok(generation),
        _ => Ok(real),
    }
}
