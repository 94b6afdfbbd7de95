//! What a server saw: the commands clients sent (`redis-cli monitor`) and
//! the calls and CPU time it counted per command (`INFO commandstats`).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::RedisServer;

/// Numbers from `INFO commandstats`: calls per command (lowercase name).
pub fn command_calls(conn: &mut redis::Connection) -> std::collections::HashMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Microseconds of Redis CPU per call of `command`, from `INFO commandstats`.
pub fn command_usec(conn: &mut redis::Connection, command: &str) -> Option<(u64, u64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).ok()?;
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))?;
    let field = |name: &str| {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("calls=")?, field("usec=")?))
}

/// `redis-cli monitor` on a server: the commands clients send, as Redis
/// sees them (commands a script runs inside Redis are left out).
pub struct Monitor {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Monitor {
    /// Starts monitoring; returns once the monitor is attached.
    pub fn start(server: &RedisServer) -> Monitor {
        let mut child = Command::new("redis-cli")
            .args(["-p", &server.port().to_string(), "monitor"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install redis-tools"));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // `redis-cli monitor` prints OK once attached.
        let first = lines
            .recv_timeout(Duration::from_secs(10))
            .expect("monitor attaches");
        assert_eq!(first.trim(), "OK", "unexpected monitor output: {first}");
        Monitor { child, lines }
    }

    /// Stops monitoring and returns the lowercase names of the commands
    /// clients sent since it started.
    pub fn stop(mut self) -> Vec<String> {
        // Let the last commands reach the monitor.
        std::thread::sleep(Duration::from_millis(200));
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.lines
            .try_iter()
            .filter(|line| !line.contains(" lua]"))
            .filter_map(|line| {
                let command = line.split("] \"").nth(1)?.split('"').next()?.to_lowercase();
                Some(command)
            })
            .collect()
    }
}
