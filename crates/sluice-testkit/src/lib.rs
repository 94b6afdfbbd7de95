//! Real Redis servers for sluice's tests.
//!
//! Every test that needs Redis starts its own `redis-server` here, on a free
//! loopback port, with persistence off and its files in a temporary
//! directory, and stops it when dropped. Nothing here touches a Redis the
//! test did not start. When `redis-server` is not installed the test fails
//! with instructions; it never skips.

#![forbid(unsafe_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const INSTALL: &str = "redis-server was not found on PATH: the Redis tests start real Redis servers. \
Install them with `sudo apt-get install redis-server redis-tools` (Debian/Ubuntu) and run the tests again.";

/// A `redis-server` process owned by a test.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// A program `redis-server` runs under (with its arguments), if any.
    wrapper: Vec<String>,
}

impl RedisServer {
    /// Starts a standalone server on a free loopback port.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments
    /// (e.g. `["--cluster-enabled", "yes"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let port = free_port(extra.contains(&"--cluster-enabled"));
        RedisServer::start_on(port, extra)
    }

    /// Starts a server that also listens for TLS (on [`tls_port`]), with a
    /// certificate for 127.0.0.1 signed by a fresh private CA
    /// ([`ca_pem`](Self::ca_pem)). The plain port stays open for assertions.
    ///
    /// [`tls_port`]: Self::tls_port
    pub fn start_tls() -> RedisServer {
        RedisServer::start_tls_on(free_port(false), &certificates(), &[])
    }

    /// Starts a server on `port` that also listens for TLS on a free port,
    /// with the given CA, certificate and key (PEM), and `extra` arguments.
    fn start_tls_on(
        port: u16,
        (ca, cert, key): &(String, String, String),
        extra: &[&str],
    ) -> RedisServer {
        // With `tls-cluster yes` the cluster bus listens on the TLS port
        // plus 10000: that one must be free too. `port` is not bound yet,
        // so the probe could find it again: not that one, nor its bus.
        let tls_port = std::iter::repeat_with(|| free_port(true))
            .take(100)
            .find(|&p| p != port && p != port + 10_000 && p + 10_000 != port)
            .expect("a free port other than the plain one");
        let dir = server_dir(port);
        for (name, pem) in [("ca.pem", ca), ("server.pem", cert), ("server.key", key)] {
            std::fs::write(dir.join(name), pem).expect("write a certificate");
        }
        let path = |name: &str| dir.join(name).display().to_string();
        let mut args = vec![
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            path("server.pem"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            path("ca.pem"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra: args,
            wrapper: Vec::new(),
        };
        server.launch();
        server
    }

    /// The TLS port of a server from [`start_tls`](Self::start_tls).
    pub fn tls_port(&self) -> u16 {
        let at = self
            .extra
            .iter()
            .position(|a| a == "--tls-port")
            .expect("a TLS server");
        self.extra[at + 1].parse().expect("a port")
    }

    /// The CA certificate (PEM) that signed a TLS server's certificate.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.pem")).expect("a TLS server")
    }

    /// Starts a server on `port`.
    pub fn start_on(port: u16, extra: &[&str]) -> RedisServer {
        let dir = server_dir(port);
        let mut server = RedisServer {
            child: None,
            port,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
            wrapper: Vec::new(),
        };
        server.launch();
        server
    }

    /// Starts a standalone server run under `wrapper` (a program and its
    /// arguments, `redis-server` and its own following), e.g. valgrind to
    /// count the instructions a command costs. Slow programs get 60 s to
    /// answer.
    pub fn start_under(wrapper: &[&str]) -> RedisServer {
        let port = free_port(false);
        let mut server = RedisServer {
            child: None,
            port,
            dir: server_dir(port),
            extra: Vec::new(),
            wrapper: wrapper.iter().map(|s| (*s).to_owned()).collect(),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let log =
            std::fs::File::create(self.dir.join("redis.log")).expect("create the server's log");
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg("redis-server");
                command
            }
            None => Command::new("redis-server"),
        };
        let child = command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::from(log.try_clone().expect("log handle")))
            .stderr(Stdio::from(log))
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !self.wrapper.is_empty() => {
                panic!("cannot start {}: {e} (is it installed?)", self.wrapper[0])
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!("{INSTALL}"),
            Err(e) => panic!("cannot start redis-server: {e}"),
        };
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let patience = if self.wrapper.is_empty() { 15 } else { 60 };
        let deadline = Instant::now() + Duration::from_secs(patience);
        loop {
            if let Ok(mut conn) = self
                .client()
                .get_connection_with_timeout(Duration::from_millis(200))
                && redis::cmd("PING").query::<String>(&mut conn).is_ok()
            {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let log = std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default();
                panic!(
                    "redis-server on port {} exited with {status}:\n{log}",
                    self.port
                );
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not start",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server process id (for `SIGSTOP`/`SIGCONT` in chaos tests; under
    /// a wrapper, the wrapper's, which runs the server).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    /// A client for assertions.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid URL")
    }

    /// A synchronous connection for assertions.
    pub fn connection(&self) -> redis::Connection {
        self.client()
            .get_connection()
            .expect("connect to the test server")
    }

    /// Kills the server (its data is lost: persistence is off).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Sends a signal to the server process (`STOP`, `CONT`, ...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            // A stopped process must be continued before it can die cleanly.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn server_dir(port: u16) -> PathBuf {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "sluice-redis-{}-{}-{port}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create the server's directory");
    dir
}

/// A private CA, and a certificate and key for 127.0.0.1 it signed (PEM).
fn certificates() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    // Distinct names: OpenSSL (which Redis uses between cluster nodes)
    // takes a certificate whose subject is its issuer's for self-signed.
    let name = |common: &str| {
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, common);
        name
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.distinguished_name = name("sluice test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("parameters");
    params.distinguished_name = name("127.0.0.1");
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server certificate");
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// A free loopback port; for cluster nodes, one whose bus port (+10000) is
/// free too.
pub fn free_port(with_bus: bool) -> u16 {
    for _ in 0..200 {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local address").port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port found");
}

/// `n` free loopback ports for cluster nodes, chosen before any node
/// starts: distinct, and none another's bus port (the kernel may hand out
/// a port again once the probe that found it has let it go: two nodes on
/// one port left a cluster of five that never formed).
pub fn free_node_ports(n: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::with_capacity(n);
    for _ in 0..n * 100 {
        if ports.len() == n {
            break;
        }
        let port = free_port(true);
        let clashes = ports
            .iter()
            .any(|&p| p == port || p + 10_000 == port || port + 10_000 == p);
        if !clashes {
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), n, "no {n} distinct free loopback ports found");
    ports
}

/// Runs `work` on `threads` new threads at once and calls `meanwhile` once
/// every thread has returned from it but before any ends, while what
/// `work` keeps (its second value: a runtime, say) still stands. Returns
/// whether `work` said true on every thread, and what `meanwhile` returned.
pub fn while_threads_stand<K, T>(
    threads: usize,
    work: impl Fn() -> (bool, K) + Send + Sync + 'static,
    meanwhile: impl FnOnce() -> T,
) -> (bool, T) {
    use std::sync::{Arc, Barrier};
    let work = Arc::new(work);
    let (worked, seen) = (
        Arc::new(Barrier::new(threads + 1)),
        Arc::new(Barrier::new(threads + 1)),
    );
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (work, worked, seen) = (work.clone(), worked.clone(), seen.clone());
            std::thread::spawn(move || {
                let (ok, kept) = work();
                worked.wait();
                seen.wait();
                drop(kept);
                ok
            })
        })
        .collect();
    worked.wait();
    let result = meanwhile();
    seen.wait();
    let oks: Vec<bool> = handles
        .into_iter()
        .map(|h| h.join().expect("a working thread"))
        .collect();
    (oks.into_iter().all(|ok| ok), result)
}

/// A load like `redis-benchmark -c 64 -r TENANTS` for commands it cannot
/// send (binary arguments): `calls` commands to the server on `port`,
/// `command(tenant)` making each for a tenant drawn at random below
/// `tenants`, over `connections` connections that each keep `depth`
/// commands in flight (pipelined). Panics on an error reply. Returns calls
/// per second.
pub fn replay(
    port: u16,
    connections: usize,
    depth: usize,
    calls: usize,
    tenants: u64,
    command: impl Fn(u64) -> redis::Cmd + Sync,
) -> f64 {
    let started = std::time::Instant::now();
    let per_connection = calls.div_ceil(connections);
    std::thread::scope(|scope| {
        for c in 0..connections {
            let command = &command;
            scope.spawn(move || {
                let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                    .expect("a loopback URL");
                let mut conn = client.get_connection().expect("connects");
                // splitmix64: a different stream per connection.
                let mut seed = 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(c as u64 + 1);
                let mut next = move || {
                    seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = seed;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    z ^ (z >> 31)
                };
                let mut sent = 0;
                while sent < per_connection {
                    let mut pipe = redis::pipe();
                    for _ in 0..depth.min(per_connection - sent) {
                        pipe.add_command(command(next() % tenants));
                        sent += 1;
                    }
                    let _: Vec<redis::Value> = pipe.query(&mut conn).expect("every call succeeds");
                }
            });
        }
    });
    (per_connection * connections) as f64 / started.elapsed().as_secs_f64()
}

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

/// A node's answer to a command that answers with text (`CLUSTER INFO`,
/// `INFO replication`...), if it answers within 300 ms.
fn ask(node: &RedisServer, command: &[&str]) -> Option<String> {
    let mut connection = node
        .client()
        .get_connection_with_timeout(Duration::from_millis(300))
        .ok()?;
    let (name, args) = command.split_first()?;
    redis::cmd(name).arg(args).query(&mut connection).ok()
}

/// `CLUSTER INFO` of a node, if it answers.
fn cluster_info(node: &RedisServer) -> Option<String> {
    ask(node, &["CLUSTER", "INFO"])
}

/// Runs a `redis-cli` command to its end, killing it (and failing) past
/// `limit`: `--cluster create` waits for ever for nodes that cannot meet.
fn run_bounded(command: &mut Command, limit: Duration) -> std::process::Output {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install redis-tools"));
    // Drained as it comes: a full pipe would stall redis-cli (a reshard
    // prints a line per slot).
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            text
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for redis-cli") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => std::process::Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "redis-cli did not finish within {limit:?}: {}{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Arguments of every cluster node.
const CLUSTER_NODE: [&str; 12] = [
    "--cluster-enabled",
    "yes",
    "--cluster-node-timeout",
    "1000",
    "--cluster-require-full-coverage",
    "no",
    // A replica fails over however long ago it last heard from its master
    // (the default refuses after ~10 node timeouts, which a fresh test
    // cluster can exceed).
    "--cluster-replica-validity-factor",
    "0",
    // Elections, votes and reasons not to fail over are logged at notice:
    // a failure message quotes the end of every node's log.
    "--loglevel",
    "notice",
    // A replica's first sync starts at once, not after the default 5 s.
    "--repl-diskless-sync-delay",
    "0",
];

/// One line of `CLUSTER NODES`: a node as another node sees it.
#[derive(Debug, Clone)]
pub struct SeenNode {
    /// The node's id.
    pub id: String,
    /// Its client port.
    pub port: u16,
    /// Whether it is a master.
    pub master: bool,
    /// The id of its master, for a replica.
    pub master_id: Option<String>,
    /// Whether the link to it is up and it is not flagged failing or in
    /// handshake.
    pub connected: bool,
}

fn parse_cluster_nodes(text: &str) -> Vec<SeenNode> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = *fields.get(2)?;
            Some(SeenNode {
                id: fields[0].to_owned(),
                port: fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?,
                master: flags.split(',').any(|f| f == "master"),
                master_id: fields
                    .get(3)
                    .filter(|id| **id != "-")
                    .map(|id| (*id).to_owned()),
                connected: fields.get(7) == Some(&"connected")
                    && !flags
                        .split(',')
                        .any(|f| matches!(f, "fail" | "fail?" | "handshake" | "noaddr")),
            })
        })
        .collect()
}

/// `CLUSTER NODES` as `node` sees the cluster, or None if it does not
/// answer.
fn cluster_nodes(node: &RedisServer) -> Option<Vec<SeenNode>> {
    ask(node, &["CLUSTER", "NODES"]).map(|text| parse_cluster_nodes(&text))
}

/// A Redis Cluster of real `redis-server` processes on loopback: masters
/// with replicas, made with `redis-cli --cluster create`.
pub struct RedisCluster {
    /// Every node, masters first as created.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each, a short
    /// `cluster-node-timeout` (1 s) so that failovers are quick, and waits
    /// until the cluster is up.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        RedisCluster::start_on(&free_node_ports(masters * (1 + replicas)), replicas)
    }

    /// Like [`start`](Self::start), on the given ports (masters first):
    /// `ports.len()` must be a multiple of `1 + replicas`.
    pub fn start_on(ports: &[u16], replicas: usize) -> RedisCluster {
        let nodes = ports
            .iter()
            .map(|&port| RedisServer::start_on(port, &CLUSTER_NODE))
            .collect();
        RedisCluster::create(nodes, replicas)
    }

    /// Like [`start`](Self::start), with every node also listening for TLS
    /// (certificates from one private CA, [`ca_pem`](Self::ca_pem)) and the
    /// cluster bus and replication over TLS. Clients that connect over TLS
    /// are told the nodes' TLS ports ([`tls_urls`](Self::tls_urls)); the
    /// plain ports stay open for the harness.
    pub fn start_tls(masters: usize, replicas: usize) -> RedisCluster {
        let certificates = certificates();
        let mut extra = CLUSTER_NODE.to_vec();
        extra.extend(["--tls-cluster", "yes", "--tls-replication", "yes"]);
        let nodes = (0..masters * (1 + replicas))
            .map(|_| RedisServer::start_tls_on(free_port(true), &certificates, &extra))
            .collect();
        RedisCluster::create(nodes, replicas)
    }

    /// `rediss://` seed URLs of every node of a cluster from
    /// [`start_tls`](Self::start_tls).
    pub fn tls_urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("rediss://127.0.0.1:{}", n.tls_port()))
            .collect()
    }

    /// The CA certificate (PEM) of a cluster from [`start_tls`](Self::start_tls).
    pub fn ca_pem(&self) -> Vec<u8> {
        self.nodes[0].ca_pem()
    }

    fn create(nodes: Vec<RedisServer>, replicas: usize) -> RedisCluster {
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let mut create = Command::new("redis-cli");
        create
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = run_bounded(&mut create, Duration::from_secs(30));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok(Duration::from_secs(30));
        cluster.wait_until_formed(replicas, Duration::from_secs(30));
        cluster
    }

    /// Waits until every node knows every other as connected, with
    /// `replicas` replicas under each master, and every replica's link to
    /// its master is up: a replica its peers do not yet know as one gets no
    /// vote when its master fails.
    fn wait_until_formed(&self, replicas: usize, limit: Duration) {
        let masters = self.nodes.len() / (1 + replicas);
        let deadline = Instant::now() + limit;
        let formed = || {
            self.nodes.iter().all(|n| {
                let Some(seen) = cluster_nodes(n) else {
                    return false;
                };
                let linked = seen.iter().filter(|s| s.port == n.port()).all(|me| {
                    me.master
                        || ask(n, &["INFO", "replication"])
                            .is_some_and(|info| info.contains("master_link_status:up"))
                });
                linked
                    && seen.len() == self.nodes.len()
                    && seen.iter().all(|s| s.connected)
                    && seen.iter().filter(|s| s.master).count() == masters
                    && seen.iter().filter(|s| s.master_id.is_some()).count() == masters * replicas
            })
        };
        self.wait(deadline, formed, || {
            format!("the cluster did not form within {limit:?}")
        });
    }

    /// Polls `done` until it holds; past `deadline`, fails with `what` and
    /// every node's view.
    fn wait(&self, deadline: Instant, done: impl Fn() -> bool, what: impl Fn() -> String) {
        while !done() {
            assert!(
                Instant::now() < deadline,
                "{}:\n{}",
                what(),
                self.diagnosis()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every node's view, for a failure message: its `CLUSTER NODES` and
    /// the end of its log.
    pub fn diagnosis(&self) -> String {
        let mut text = String::new();
        for node in &self.nodes {
            let running = node.child.is_some();
            text += &format!(
                "--- node {} ({})\n",
                node.port(),
                if running { "running" } else { "stopped" }
            );
            if running {
                text += &ask(node, &["CLUSTER", "NODES"])
                    .unwrap_or_else(|| "CLUSTER NODES: no answer\n".to_owned());
            }
            let log = std::fs::read_to_string(node.dir.join("redis.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            for line in &lines[lines.len().saturating_sub(20)..] {
                text += line;
                text.push('\n');
            }
        }
        text
    }

    /// Seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Waits until every running node says `cluster_state:ok` and that all
    /// 16384 slots are served by a master that is not failing.
    pub fn wait_until_ok(&self, limit: Duration) {
        self.wait(
            Instant::now() + limit,
            || self.is_ok(),
            || format!("the cluster did not become ok within {limit:?}"),
        );
    }

    /// Waits until the cluster has noticed that the master on `port`
    /// (stopped by the caller) failed, its replica has taken over and
    /// every slot is served again.
    pub fn wait_for_failover(&self, port: u16, limit: Duration) {
        let deadline = Instant::now() + limit;
        let noticed = || {
            self.nodes.iter().filter(|n| n.child.is_some()).any(|n| {
                cluster_info(n).is_some_and(|info| !info.contains("cluster_slots_ok:16384"))
            })
        };
        self.wait(deadline, noticed, || {
            format!("the failure of the master on {port} was not noticed")
        });
        // A replica wins its election within a few node timeouts; should
        // none have by half the time left, its log says why and it is told
        // to take over (what is under test is the client across a
        // promotion, not Redis's election).
        let half = deadline.saturating_duration_since(Instant::now()) / 2;
        let elected = Instant::now() + half;
        while !self.is_ok() && Instant::now() < elected {
            std::thread::sleep(Duration::from_millis(100));
        }
        if !self.is_ok() {
            println!(
                "no replica of the master on {port} was elected in {half:?}; forcing a takeover:\n{}",
                self.diagnosis()
            );
            let topology = self.topology();
            let victim = topology.iter().find(|seen| seen.port == port);
            let replica = topology.iter().find(|seen| {
                victim.is_some_and(|v| seen.master_id.as_ref() == Some(&v.id)) && seen.connected
            });
            if let Some(replica) = replica {
                let node = self.nodes.iter().find(|n| n.port() == replica.port);
                if let Some(node) = node {
                    let _ = ask(node, &["CLUSTER", "FAILOVER", "TAKEOVER"]);
                }
            }
        }
        self.wait_until_ok(deadline.saturating_duration_since(Instant::now()));
    }

    /// Whether every running node says `cluster_state:ok` with all 16384
    /// slots served by a master that is not failing.
    fn is_ok(&self) -> bool {
        self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
            cluster_info(n).is_some_and(|info| {
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            })
        })
    }

    /// `CLUSTER NODES` as seen by the first running node.
    pub fn topology(&self) -> Vec<SeenNode> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a running node");
        let text: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query(&mut node.connection())
            .expect("CLUSTER NODES");
        parse_cluster_nodes(&text)
    }

    /// The running masters, by port.
    pub fn master_ports(&self) -> Vec<u16> {
        self.topology()
            .into_iter()
            .filter(|seen| seen.master && seen.connected)
            .map(|seen| seen.port)
            .collect()
    }

    /// The node listening on `port`.
    pub fn node(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("a node on that port")
    }

    /// Moves `slots` slots from the master on `from` to the master on `to`
    /// with `redis-cli --cluster reshard` (keys move by MIGRATE).
    pub fn reshard(&self, from: u16, to: u16, slots: u32) {
        let id = |port: u16| {
            self.topology()
                .into_iter()
                .find(|seen| seen.port == port)
                .map(|seen| seen.id)
                .expect("a node id")
        };
        let mut reshard = Command::new("redis-cli");
        reshard
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &id(from), "--cluster-to", &id(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .args(["--cluster-pipeline", "10"]);
        let out = run_bounded(&mut reshard, Duration::from_secs(60));
        assert!(
            out.status.success(),
            "reshard failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Keys held by the node on `port`.
    pub fn key_count(&mut self, port: u16) -> u64 {
        redis::cmd("DBSIZE")
            .query(&mut self.node(port).connection())
            .expect("DBSIZE")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ports_are_distinct_and_none_is_anothers_bus() {
        let ports = free_node_ports(24);
        for (i, &a) in ports.iter().enumerate() {
            for &b in &ports[i + 1..] {
                assert!(a != b && a + 10_000 != b && b + 10_000 != a, "{a} and {b}");
            }
        }
    }
}
