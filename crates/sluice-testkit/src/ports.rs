//! Free loopback ports for the servers a test starts.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

/// Every port handed out in this process (and the bus ports of cluster
/// nodes'): never handed out again, so that tests running at once, each
/// choosing ports before its servers start, never choose the same (two
/// clusters formed on one node and neither finished).
static GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A free loopback port; for cluster nodes, one whose bus port (+10000) is
/// free too. None is handed out twice in one process.
pub fn free_port(with_bus: bool) -> u16 {
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    for _ in 0..200 {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local address").port();
        let bus = port.checked_add(10_000);
        let taken = given.contains(&port) || bus.is_some_and(|b| given.contains(&b));
        if taken {
            continue;
        }
        if !with_bus {
            given.insert(port);
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            given.insert(port);
            given.insert(port + 10_000);
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
