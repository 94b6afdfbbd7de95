//! Stopping and continuing a process, for tests of a peer that hangs.
//!
//! `kill -STOP` returns before the process has stopped: the stop begins
//! when one of its threads, woken for it, runs, and on a loaded machine
//! another thread, woken by a request, can answer that request first.
//! [`signal`] with `STOP` therefore waits until every thread is stopped.

use std::process::Command;
use std::time::{Duration, Instant};

/// Sends `signal` (`STOP`, `CONT`, …) to process `pid`. After `STOP`,
/// returns once every thread of it is stopped (Linux: read from `/proc`);
/// panics when that takes more than 10 s.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
    if signal != "STOP" {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !stopped(pid) {
        assert!(
            Instant::now() < deadline,
            "process {pid} did not stop within 10 s of SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether every thread of `pid` is stopped (state `T` in its `stat`).
fn stopped(pid: u32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/task: {e} (the tests need Linux's /proc)"));
    tasks.flatten().all(|task| {
        // `pid (comm) S …`: the state follows the last `)`, as `comm` may
        // hold one.
        std::fs::read_to_string(task.path().join("stat"))
            .ok()
            .and_then(|stat| {
                let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
                Some(state == 'T')
            })
            // A thread that exited meanwhile is no longer running.
            .unwrap_or(true)
    })
}
