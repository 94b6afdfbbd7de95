//! The README's test command, `scripts/test.sh`, is all a fresh Debian
//! machine with Rust needs: it lists every program the test suite starts
//! (found here by reading the tests and the documents they replay),
//! installs the missing ones with apt-get (through sudo when not root, a
//! message naming them where it cannot), then runs `cargo test
//! --workspace`; and CI runs exactly that command.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::markdown::{blocks, programs, read, repo, steps};
use common::temp_dir;

/// The script's `program:package` pairs.
fn needs() -> Vec<(String, String)> {
    let script = read("scripts/test.sh");
    let list = script
        .split_once("needs=(")
        .and_then(|(_, rest)| rest.split_once("\n)"))
        .expect("scripts/test.sh has a `needs=(…)` list")
        .0;
    list.lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(|pair| {
            let (program, package) = pair.split_once(':').expect("program:package");
            (program.to_owned(), package.to_owned())
        })
        .collect()
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The programs the test code starts by name (`Command::new` or `need` of
/// a string literal) in every crate's tests and in the test kit.
fn spawned_by_tests() -> BTreeSet<String> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(repo().join("crates")).unwrap() {
        let tests = entry.unwrap().path().join("tests");
        if tests.is_dir() {
            sources(&tests, &mut files);
        }
    }
    sources(&repo().join("crates/sluice-testkit/src"), &mut files);
    let mut out = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for marker in ["Command::new(\"", "need(\""] {
            for (at, _) in text.match_indices(marker) {
                let rest = &text[at + marker.len()..];
                let program = &rest[..rest.find('"').unwrap()];
                out.insert(program.rsplit('/').next().unwrap().to_owned());
            }
        }
    }
    out
}

/// Programs a Debian machine always has (its essential packages), the
/// shell, and what the project itself builds, needs to build, or is
/// (`scripts/test.sh`).
const ALWAYS_THERE: &[&str] = &[
    "sh", "bash", "cat", "cp", "mv", "rm", "mkdir", "mktemp", "chmod", "sed", "grep", "sleep",
    "env", "dirname", "basename", "id", "seq", "cargo", "sluice", "test.sh",
];

#[test]
fn the_test_script_lists_every_program_the_tests_start() {
    let listed: BTreeSet<String> = needs().into_iter().map(|(program, _)| program).collect();
    let mut started = spawned_by_tests();
    assert!(
        ["redis-server", "redis-cli", "nginx", "promtool"]
            .iter()
            .all(|p| started.contains(*p)),
        "the search for started programs finds the known ones: {started:?}"
    );
    // And what the documents the tests replay run.
    for doc in ["README.md", "docs/OPERATIONS.md"] {
        for block in blocks(&read(doc)).iter().filter(|b| b.is_commands()) {
            for step in steps(block) {
                started.extend(programs(&step.command));
            }
        }
    }
    let missing: Vec<&String> = started
        .iter()
        .filter(|p| !listed.contains(*p) && !ALWAYS_THERE.contains(&p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the tests start {missing:?}, which scripts/test.sh does not install: add them to its `needs` list"
    );
}

#[test]
fn the_readme_gives_two_commands_and_ci_runs_its_test_command() {
    let readme = read("README.md");
    let block = blocks(&readme)
        .into_iter()
        .find(|b| b.heading == "Two commands" && b.is_commands())
        .expect("README's \"Two commands\" block");
    let commands: Vec<String> = steps(&block)
        .iter()
        .map(|s| s.command.split('#').next().unwrap().trim().to_owned())
        .collect();
    assert_eq!(
        commands,
        [
            "cargo run --release --bin sluice -- serve",
            "scripts/test.sh"
        ],
        "one command serves, one tests"
    );
    let ci = read(".ci/run");
    let run: Vec<&str> = ci
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert!(run.contains(&"scripts/test.sh"), ".ci/run:\n{ci}");
    assert!(
        !run.iter().any(|l| l.starts_with("cargo test")),
        ".ci/run tests through scripts/test.sh only:\n{ci}"
    );
    let mode = std::fs::metadata(repo().join("scripts/test.sh")).unwrap();
    assert!(
        mode.permissions().mode() & 0o111 != 0,
        "scripts/test.sh is executable"
    );
}

/// Runs scripts/test.sh on a PATH of stand-ins only: `apt-get`, `sudo`,
/// `cargo` and `id` record what they are asked; `present` are programs
/// already installed. What was recorded, the exit status and stderr.
fn stand_in_run(uid: u32, sudo: bool, present: &[&str]) -> (String, bool, String) {
    let dir = temp_dir("setup");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = dir.path().join("log");
    let write = |name: &str, body: &str| {
        let path = bin.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    let record = format!("echo \"$(basename \"$0\") $*\" >> {}", log.display());
    write("apt-get", &record);
    write("cargo", &record);
    write("id", &format!("echo {uid}"));
    if sudo {
        write("sudo", &format!("{record}\nexec \"$@\""));
    }
    for program in present {
        write(program, "exit 0");
    }
    for tool in ["dirname", "basename"] {
        std::os::unix::fs::symlink(
            ["/usr/bin", "/bin"]
                .iter()
                .map(|d| Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap(),
            bin.join(tool),
        )
        .unwrap();
    }
    let out = Command::new("/bin/bash")
        .arg(repo().join("scripts/test.sh"))
        .args(["--test", "readme"])
        .env("PATH", &bin)
        .env("SLUICE_TEST_SBIN", "")
        .output()
        .unwrap();
    (
        std::fs::read_to_string(&log).unwrap_or_default(),
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_test_script_installs_what_is_missing_then_runs_the_suite() {
    let packages: BTreeSet<String> = needs().into_iter().map(|(_, package)| package).collect();
    let install = |log: &str| -> BTreeSet<String> {
        let line = log
            .lines()
            .find(|l| l.starts_with("apt-get install"))
            .unwrap_or_else(|| panic!("no apt-get install in:\n{log}"));
        line.split_whitespace()
            .skip(2)
            .filter(|w| !w.starts_with('-'))
            .map(str::to_owned)
            .collect()
    };

    // Nothing installed, not root: every package, through sudo, after an
    // update; then the suite with the arguments given.
    let (log, ok, stderr) = stand_in_run(1000, true, &[]);
    assert!(ok, "{stderr}");
    assert_eq!(install(&log), packages, "{log}");
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines[0].starts_with("sudo apt-get update"), "{log}");
    assert!(
        lines.iter().any(|l| l.starts_with("sudo apt-get install")),
        "{log}"
    );
    assert_eq!(
        lines.last(),
        Some(&"cargo test --workspace --test readme"),
        "{log}"
    );

    // Root, one program present: the others' packages, without sudo.
    let (log, ok, stderr) = stand_in_run(0, false, &["nginx"]);
    assert!(ok, "{stderr}");
    let mut expected = packages.clone();
    expected.remove("nginx");
    assert_eq!(install(&log), expected, "{log}");
    assert!(!log.contains("sudo"), "{log}");

    // Everything present: no apt-get at all.
    let all: Vec<String> = needs().into_iter().map(|(program, _)| program).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let (log, ok, stderr) = stand_in_run(1000, false, &all);
    assert!(ok, "{stderr}");
    assert_eq!(log.trim(), "cargo test --workspace --test readme");

    // Not root and no sudo: a message naming what to install, no tests.
    let (log, ok, stderr) = stand_in_run(1000, false, &[]);
    assert!(!ok);
    assert!(log.is_empty(), "{log}");
    assert!(
        stderr.contains("apt-get install") && stderr.contains("redis-server"),
        "{stderr}"
    );
}
