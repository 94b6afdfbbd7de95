//! A Redis Cluster of real `redis-server` processes, made with
//! `redis-cli --cluster create`, and what its tests ask of it: topology,
//! failover, resharding.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::server::certificates;
use crate::{RedisServer, free_node_ports, free_port};

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
            let running = node.is_running();
            text += &format!(
                "--- node {} ({})\n",
                node.port(),
                if running { "running" } else { "stopped" }
            );
            if running {
                text += &ask(node, &["CLUSTER", "NODES"])
                    .unwrap_or_else(|| "CLUSTER NODES: no answer\n".to_owned());
            }
            let log = node.log();
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
            self.nodes.iter().filter(|n| n.is_running()).any(|n| {
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
        self.nodes.iter().filter(|n| n.is_running()).all(|n| {
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
            .find(|n| n.is_running())
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
