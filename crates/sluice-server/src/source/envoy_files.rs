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
    /// Reads `path`: a file, or a directory's files (see [`names`]), from
    /// the one directory it resolves to now.
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
        // directories aside: see `names`).
        let names = names(&real, all_files)?;
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

/// Reads envoyproxy/ratelimit configuration from `path` (a file, or a
/// directory's files as [`names`] lists them, read through the one
/// directory it resolves to: see [`EnvoyFiles`]), with split domains
/// merged when `merge` is set.
pub fn load(path: &Path, all_files: bool, merge: bool) -> Fallible<Vec<EnvoyDomain>> {
    EnvoyFiles::read(path, all_files)?.domains(merge)
}

/// The configuration files under `dir`, relative to it, sorted: every
/// file in it and in its subdirectories, whatever its name, as
/// envoyproxy/ratelimit's runtime loader walks the tree (goruntime reads
/// every file it meets), or with `all_files` unset (`envoy.files: yaml`)
/// only the `*.yaml` and `*.yml` ones, subdirectories included. Dot files
/// and dot directories are skipped (upstream's `RUNTIME_IGNOREDOTFILES=true`:
/// a ConfigMap's `..2024_…` generation directory holds every file a
/// second time), and a link to a directory is not descended, as upstream's
/// walk does not descend one. A link to a file is read through.
pub fn names(dir: &Path, all_files: bool) -> Fallible<Vec<PathBuf>> {
    let mut names = Vec::new();
    walk(dir, Path::new(""), all_files, &mut names)?;
    names.sort();
    Ok(names)
}

fn walk(dir: &Path, under: &Path, all_files: bool, names: &mut Vec<PathBuf>) -> Fallible<()> {
    let here = dir.join(under);
    let entries =
        std::fs::read_dir(&here).map_err(|e| format!("cannot read {}: {e}", here.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", here.display()))?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = under.join(&name);
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(dir, &path, all_files, names)?;
        } else if dir.join(&path).is_file()
            && (all_files || path.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        {
            names.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_of_the_tree_or_its_yaml_files() {
        let dir = tempfile::tempdir().unwrap();
        let at = |p: &str| dir.path().join(p);
        for d in ["sub/deeper", ".hidden", "..2024_01_01"] {
            std::fs::create_dir_all(at(d)).unwrap();
        }
        for f in [
            "a.yaml",
            "b.yml",
            "notes",
            ".dot.yaml",
            "sub/c.yaml",
            "sub/deeper/d",
            ".hidden/e.yaml",
            "..2024_01_01/f.yaml",
        ] {
            std::fs::write(at(f), "").unwrap();
        }
        std::os::unix::fs::symlink(at("sub"), at("linked-dir")).unwrap();
        std::os::unix::fs::symlink(at("notes"), at("linked-file")).unwrap();
        let shown = |all| {
            names(dir.path(), all)
                .unwrap()
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(shown(false), ["a.yaml", "b.yml", "sub/c.yaml"]);
        assert_eq!(
            shown(true),
            [
                "a.yaml",
                "b.yml",
                "linked-file",
                "notes",
                "sub/c.yaml",
                "sub/deeper/d"
            ]
        );
    }
}
