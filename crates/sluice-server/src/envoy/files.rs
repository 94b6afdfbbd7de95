//! Which files of a directory are envoyproxy/ratelimit configuration.
//!
//! By default (`envoy.files: yaml`) the directory's own `*.yaml` and
//! `*.yml` files, not its subdirectories'. As upstream's runtime directory (`envoy.files: all`,
//! which `serve --envoyproxy-env` sets), every file in it and in its
//! subdirectories, whatever its name, as upstream's runtime loader walks
//! the tree; but dot files and dot directories are skipped (upstream's
//! `RUNTIME_IGNOREDOTFILES=true`: a ConfigMap's `..2024_…` generation
//! directory holds every file a second time), and a link to a directory
//! is not descended, as upstream's walk does not descend one. A link to a
//! file is read through.

use std::path::{Path, PathBuf};

use crate::Fallible;

/// The configuration files under `dir`, relative to it, sorted.
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
        let text = name.to_string_lossy();
        let path = under.join(&name);
        let real_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if all_files {
            if text.starts_with('.') {
                continue;
            }
            if real_dir {
                walk(dir, &path, all_files, names)?;
            } else if dir.join(&path).is_file() {
                names.push(path);
            }
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            && dir.join(&path).is_file()
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
    fn yaml_files_of_the_directory_or_every_file_of_the_tree() {
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
        assert_eq!(shown(false), [".dot.yaml", "a.yaml", "b.yml"]);
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
