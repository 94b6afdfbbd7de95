//! The README's tour, replayed: its commands, run in order against a fresh
//! `sluice serve` on the example configuration, print what the README
//! shows (the status line, every header shown, the body), up to the
//! figures that depend on the clock (`t=`, `reset_after_ms`,
//! `retry_after_ms`, `Retry-After`).

mod common;

use std::process::Command;

use common::Server;
use common::markdown::timeless;

/// The README's `$ command` lines with what follows them, in order, and
/// the loop the text asks to run first.
fn tour(readme: &str) -> Vec<(String, Vec<String>)> {
    let mut steps = Vec::new();
    let mut in_console = false;
    for line in readme.lines() {
        if line.starts_with("```console") {
            in_console = true;
            continue;
        }
        if line.starts_with("```") {
            in_console = false;
            continue;
        }
        if let Some(start) = line.find("`for i in") {
            let end = line[start + 1..].find('`').unwrap() + start + 1;
            steps.push((line[start + 1..end].to_owned(), Vec::new()));
        }
        if in_console {
            match line.strip_prefix("$ ") {
                Some(command) => steps.push((command.to_owned(), Vec::new())),
                None => steps.last_mut().unwrap().1.push(line.to_owned()),
            }
        }
    }
    steps
}

#[test]
fn the_readme_tour_prints_what_the_readme_shows() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let mut server = Server::start(&[]);
    let address = server.base.trim_start_matches("http://").to_owned();
    let steps = tour(&readme);
    assert!(steps.len() >= 4, "{steps:?}");
    for (command, shown) in steps {
        let command = command.replace("localhost:8080", &address);
        let out = Command::new("sh").args(["-c", &command]).output().unwrap();
        assert!(
            out.status.success(),
            "{command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout).replace('\r', "");
        let printed: Vec<String> = printed.lines().map(timeless).collect();
        for line in shown.iter().filter(|l| !l.is_empty()) {
            assert!(
                printed.contains(&timeless(line)),
                "{command}\nshows: {line}\nprinted:\n{}",
                printed.join("\n")
            );
        }
    }
    server.stop();
}

#[test]
fn the_readme_map_names_every_crate() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for entry in std::fs::read_dir(crates).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            readme.contains(&format!("`crates/{name}`")),
            "README's map lacks crates/{name}"
        );
    }
}
