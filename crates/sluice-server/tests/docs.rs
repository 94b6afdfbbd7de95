//! The commands docs/OPERATIONS.md tells its reader to run, replayed as a
//! reader would: in one shell, from a copy of the repository's files,
//! `sluice` on the PATH, each `… &` left running, every `console` block's
//! shown lines printed (up to the clock's figures). The addresses the
//! documents use (Redis on 6379, sluice on 8080, …) are moved to free
//! loopback ports, in the commands and in the files they read, so nothing
//! already running on this machine is touched. Every command block of
//! OPERATIONS.md and the README is replayed here or by readme.rs and
//! setup.rs.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use common::markdown::{Block, Step, blocks, read, repo, steps, timeless};
use common::{Server, temp_dir};
use tempfile::TempDir;

const DONE: &str = "__sluice_docs_done__";

/// One shell a reader types into, in a directory of its own holding copies
/// of the repository files its commands name, and whatever it started.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// (the port a document says, the free one used instead)
    ports: Vec<(u16, u16)>,
    dir: TempDir,
}

impl Shell {
    /// A shell for `commands`, with `env` set, where each (document's
    /// port, port used) of `ports` is moved.
    fn start(ports: Vec<(u16, u16)>, commands: &[Step], env: &[(&str, &str)]) -> Shell {
        let dir = temp_dir("docs");
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        // The repository files the commands name, their ports moved.
        for step in commands {
            for word in step.command.split_whitespace() {
                let word = word.trim_matches(['\'', '"']);
                let source = repo().join(word);
                if word.contains('/') && !word.starts_with('/') && source.is_file() {
                    let copy = dir.path().join(word);
                    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
                    let text = std::fs::read_to_string(&source).unwrap();
                    std::fs::write(copy, moved(&ports, &text)).unwrap();
                }
            }
        }
        let sluice = Path::new(env!("CARGO_BIN_EXE_sluice")).parent().unwrap();
        let path = format!(
            "{}:{}:/usr/local/sbin:/usr/sbin:/sbin",
            sluice.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let log = std::fs::File::create(dir.path().join("stderr")).unwrap();
        let mut child = Command::new("bash")
            .arg("--norc")
            .current_dir(dir.path())
            .env("PATH", path)
            .env("TMPDIR", &tmp)
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            // Its own process group: what it leaves running is stopped
            // with it.
            .process_group(0)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Shell {
            stdin: child.stdin.take().unwrap(),
            child,
            lines,
            ports,
            dir,
        }
    }

    /// The free ports standing for the documents' ports `command` names.
    fn named_ports(&self, command: &str) -> Vec<u16> {
        self.ports
            .iter()
            .filter(|(doc, _)| {
                command
                    .split(|c: char| !c.is_ascii_digit())
                    .any(|n| n == doc.to_string())
            })
            .map(|&(_, real)| real)
            .collect()
    }

    /// Waits until something listens on each of `ports`.
    fn wait_for(&self, ports: &[u16], command: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for &port in ports {
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(
                    Instant::now() < deadline,
                    "nothing listens on {port} for `{command}`; the shell's stderr:\n{}",
                    self.stderr()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }

    /// Types `command` (as the document writes it) and returns what it
    /// printed, after asserting it succeeded. A command left running
    /// (`… &`) is waited for until the ports it names listen; one that
    /// talks to ports waits for them first.
    fn run(&mut self, command: &str) -> Vec<String> {
        let background = command.trim_end().ends_with('&') && !command.trim_end().ends_with("&&");
        if !background {
            self.wait_for(&self.named_ports(command), command);
        }
        let typed = moved(&self.ports, command);
        writeln!(self.stdin, "{typed}\nprintf '\\n{DONE} %s\\n' \"$?\"").unwrap();
        self.stdin.flush().unwrap();
        let mut printed = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| {
                    panic!(
                        "`{typed}` did not finish: printed {printed:?}; stderr:\n{}",
                        self.stderr()
                    )
                });
            if let Some(status) = line.strip_prefix(DONE) {
                assert_eq!(
                    status.trim(),
                    "0",
                    "`{typed}` failed: printed {printed:?}; stderr:\n{}",
                    self.stderr()
                );
                break;
            }
            printed.push(line.replace('\r', ""));
        }
        // The newline before the marker.
        if printed.last().is_some_and(String::is_empty) {
            printed.pop();
        }
        if background {
            self.wait_for(&self.named_ports(command), command);
        }
        printed
    }

    /// Runs every step of `block`, checking each line the block shows is
    /// printed, both sides through `same`.
    fn replay(&mut self, block: &Block, same: fn(&str) -> String) {
        for step in steps(block) {
            let printed: Vec<String> = self
                .run(&step.command)
                .iter()
                .map(|l| same(l.trim_end()))
                .collect();
            for line in &step.shown {
                assert!(
                    printed.contains(&same(line.trim_end())),
                    "OPERATIONS.md line {}: `{}`\nshows: {line}\nprinted:\n{}",
                    block.line,
                    step.command,
                    printed.join("\n")
                );
            }
        }
    }
}

/// Each of `ports` with a free loopback port to stand for it.
fn free_ports(ports: &[u16]) -> Vec<(u16, u16)> {
    // All held at once, so that none is handed out twice.
    let held: Vec<TcpListener> = ports
        .iter()
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    ports
        .iter()
        .zip(&held)
        .map(|(&doc, l)| (doc, l.local_addr().unwrap().port()))
        .collect()
}

/// `text` with the documents' ports replaced by the free ones standing
/// for them.
fn moved(ports: &[(u16, u16)], text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut digits = String::new();
    let flush = |digits: &mut String, out: &mut String| {
        let port = digits.parse::<u16>().ok();
        match ports.iter().find(|(doc, _)| Some(*doc) == port) {
            Some((_, real)) => out.push_str(&real.to_string()),
            None => out.push_str(digits),
        }
        digits.clear();
    };
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            flush(&mut digits, &mut out);
            out.push(c);
        }
    }
    flush(&mut digits, &mut out);
    out
}

impl Drop for Shell {
    fn drop(&mut self) {
        // SIGTERM to the shell's group, then whatever still stands.
        let group = format!("-{}", self.child.id());
        let kill = |signal: &str| {
            let _ = Command::new("kill")
                .args([signal, "--", &group])
                .stderr(Stdio::null())
                .status();
        };
        kill("-TERM");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.child.try_wait().ok().flatten().is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        kill("-KILL");
        let _ = self.child.wait();
    }
}

/// A line with every figure and every word holding one masked, and the
/// spacing of a table's columns ignored: for tables whose counts and
/// times depend on the clock and whose keys on the pepper.
fn shape(line: &str) -> String {
    line.split_whitespace()
        .map(|w| {
            if w == "full" || w.chars().any(|c| c.is_ascii_digit()) {
                "#"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn operations() -> Vec<Block> {
    blocks(&read("docs/OPERATIONS.md"))
        .into_iter()
        .filter(Block::is_commands)
        .collect()
}

/// The sections whose blocks a test below replays.
const FLEET: &str = "From one instance to a fleet";
const INSPECT: &str = "Inspecting a tenant";
const OVERRIDES: &str = "Overrides at runtime";

#[test]
fn every_command_block_of_operations_and_the_readme_is_replayed() {
    for block in operations() {
        assert!(
            [FLEET, INSPECT, OVERRIDES].contains(&block.heading.as_str()),
            "OPERATIONS.md line {} (under \"{}\") is a command block no test replays: \
             replay it in tests/docs.rs, or make it prose if it is not for running",
            block.line,
            block.heading
        );
    }
    for block in blocks(&read("README.md")) {
        if block.is_commands() {
            assert!(
                // setup.rs checks the first; readme.rs replays the tour.
                ["Two commands", "One-minute tour"].contains(&block.heading.as_str()),
                "README.md line {} is a command block no test replays",
                block.line
            );
        }
    }
}

/// Redis, two instances sharing it, nginx in front, as OPERATIONS.md walks
/// through them; then `sluice inspect` on that Redis.
#[test]
fn the_operations_walk_from_one_instance_to_a_fleet_runs_as_written() {
    let blocks: Vec<Block> = operations()
        .into_iter()
        .filter(|b| [FLEET, INSPECT].contains(&b.heading.as_str()))
        .collect();
    assert!(
        blocks.iter().filter(|b| b.heading == FLEET).count() >= 5,
        "{blocks:?}"
    );
    let all: Vec<Step> = blocks.iter().flat_map(steps).collect();
    let ports = free_ports(&[6379, 8080, 8081, 8090, 8091, 8000, 9000]);
    let mut shell = Shell::start(ports, &all, &[]);
    for block in blocks.iter().filter(|b| b.heading == FLEET) {
        shell.replay(block, timeless);
    }
    for block in blocks.iter().filter(|b| b.heading == INSPECT) {
        shell.replay(block, shape);
    }
}

/// The admin API's override, against the example configuration with the
/// token set as the section says.
#[test]
fn the_operations_override_runs_as_written() {
    let token = "docs-test-admin-token-0123456789";
    let config = common::temp_file(
        "admin.yaml",
        &format!(
            "{}\nadmin:\n  token_env: SLUICE_ADMIN_TOKEN\n",
            std::fs::read_to_string(common::example()).unwrap()
        ),
    );
    let server = Server::start_with_env(
        &["--config", config.to_str().unwrap()],
        &[("SLUICE_ADMIN_TOKEN", token)],
    )
    .keep(config);
    let port: u16 = server.base.rsplit(':').next().unwrap().parse().unwrap();
    let blocks: Vec<Block> = operations()
        .into_iter()
        .filter(|b| b.heading == OVERRIDES)
        .collect();
    assert!(!blocks.is_empty());
    let all: Vec<Step> = blocks.iter().flat_map(steps).collect();
    let mut shell = Shell::start(vec![(8080, port)], &all, &[("SLUICE_ADMIN_TOKEN", token)]);
    for block in &blocks {
        shell.replay(block, timeless);
    }
}

/// docs/BENCHMARKS.md is a page, not a notebook: short, opening on sluice
/// beside its peers and floors with the machine and date, every row with
/// the command that reproduces it, the detail in docs/benchmarks/.
#[test]
fn the_benchmark_page_is_short_and_opens_with_the_comparison() {
    let page = read("docs/BENCHMARKS.md");
    assert!(
        page.lines().count() <= 150,
        "{} lines",
        page.lines().count()
    );
    let first = page.split("\n## ").nth(1).expect("a section");
    assert!(
        first.starts_with("sluice against its peers and floors"),
        "{first}"
    );
    for peer in [
        "governor",
        "limitador",
        "rate-limiter-flexible",
        "limits ",
        "floor",
        "Run 20",
    ] {
        assert!(first.contains(peer), "the first section names {peer}");
    }
    for row in page
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| figure"))
    {
        let reproduce = row.trim_end_matches(" |").rsplit(" | ").next().unwrap();
        assert!(
            reproduce.contains('`'),
            "a row without the command that reproduces it: {row}"
        );
    }
    assert_eq!(
        page.matches("benchmarks/notes.md").count(),
        2,
        "the notes linked once (its text and its target)"
    );
    for (at, _) in page.match_indices("](benchmarks/") {
        let target = &page[at + 2..];
        let target = &target[..target.find(')').unwrap()];
        assert!(repo().join("docs").join(target).is_file(), "{target}");
    }
}
