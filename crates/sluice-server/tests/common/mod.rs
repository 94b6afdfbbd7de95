//! What the binary tests share: running `sluice` and talking to it.

#![allow(dead_code)]

pub mod markdown;
pub mod regions;
pub mod traces;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

pub fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

pub fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/sluice.yaml")
}

/// A directory of its own under the system's temporary one (named
/// `sluice-PURPOSE-…`), removed with what it holds when dropped: a test run
/// leaves nothing behind.
pub fn temp_dir(purpose: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("sluice-{purpose}-"))
        .tempdir()
        .unwrap()
}

/// A file `name` holding `text`, in a directory of its own removed when
/// the file is dropped.
pub fn temp_file(name: &str, text: &str) -> TempPath {
    let path = temp_path("test", name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Where `name` would be (nothing is made there) in a directory of its own,
/// removed with what it then holds when the path is dropped.
pub fn temp_path(purpose: &str, name: &str) -> TempPath {
    let dir = temp_dir(purpose);
    TempPath {
        path: dir.path().join(name),
        _dir: dir,
    }
}

/// What [`temp_file`] and [`temp_path`] give: used as its path.
pub struct TempPath {
    path: PathBuf,
    _dir: TempDir,
}

impl Deref for TempPath {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TempPath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<OsStr> for TempPath {
    fn as_ref(&self) -> &OsStr {
        self.path.as_os_str()
    }
}

/// A running `sluice serve`, stopped (SIGTERM) when dropped.
pub struct Server {
    pub child: Child,
    pub base: String,
    pub grpc: String,
    pub log: std::sync::Arc<std::sync::Mutex<String>>,
    /// Files and directories the server reads, removed after it stops.
    kept: Vec<Box<dyn std::any::Any>>,
}

impl Server {
    /// Keeps `thing` (a temporary file or directory the server reads)
    /// until the server is dropped.
    pub fn keep(mut self, thing: impl std::any::Any) -> Server {
        self.kept.push(Box::new(thing));
        self
    }

    pub fn start(args: &[&str]) -> Server {
        Server::start_with_env(args, &[])
    }

    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = sluice()
            .arg("serve")
            .args(["--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
            .args(args)
            .current_dir(std::env::temp_dir())
            .env("SLUICE_LOG", "info")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let field = |name: &str| {
                    line.find(name).map(|at| {
                        line[at + name.len()..]
                            .chars()
                            .take_while(|c| !c.is_whitespace())
                            .collect::<String>()
                    })
                };
                if let (Some(http), Some(grpc)) = (field("http="), field("grpc=")) {
                    let _ = tx.send((http, grpc));
                }
                sink.lock().unwrap().push_str(&line);
                sink.lock().unwrap().push('\n');
            }
        });
        let (addr, grpc) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("sluice serve logs the address it listens on");
        Server {
            child,
            base: format!("http://{addr}"),
            grpc: format!("http://{grpc}"),
            log,
            kept: Vec::new(),
        }
    }

    /// Waits until the log contains `text` (or panics after 15 s).
    pub fn wait_for_log(&self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.log.lock().unwrap().contains(text) {
            assert!(
                Instant::now() < deadline,
                "the log never said {text:?}:\n{}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not stop on SIGTERM:\n{}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Only now, the server gone, its files.
        self.kept.clear();
    }
}

/// What `command` prints, after asserting it succeeded: (stdout, stderr).
pub fn succeeds(command: &mut Command) -> (String, String) {
    let out = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

pub async fn post(client: &reqwest::Client, base: &str, body: Value) -> (u16, Value) {
    post_to(client, &format!("{base}/v1/check"), body).await
}

/// `POST url` with a JSON body: the status and the JSON answer.
pub async fn post_to(client: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    let response = client.post(url).json(&body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// The text of `GET {server}{path}`.
pub async fn get_text(client: &reqwest::Client, server: &Server, path: &str) -> String {
    client
        .get(format!("{}{path}", server.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of every sample of a Prometheus text whose line starts with
/// `prefix`.
pub fn metric_total(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// The whitespace-separated cells of the row of `policy` in a table printed
/// by `sluice inspect` (scope, policy, algorithm, limit, used, remaining,
/// full in, key).
pub fn inspect_row<'t>(table: &'t str, policy: &str) -> Vec<&'t str> {
    table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(policy))
        .unwrap_or_else(|| panic!("no row for {policy}:\n{table}"))
        .split_whitespace()
        .collect()
}

/// An Envoy descriptor of these entries.
pub fn descriptor(
    entries: &[(&str, &str)],
) -> envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}
