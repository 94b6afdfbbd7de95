//! A TCP proxy on a free loopback port that delays what it forwards and
//! can be cut: the link between two regions, for tests and benchmarks of
//! sluice across regions.
//!
//! Every byte is forwarded `one_way` after it was read, each way, without
//! holding back what follows it (a pipeline keeps its throughput). A cut
//! is a partition as a network makes one: nothing passes either way, and
//! connections are neither closed nor reset (a black hole); what was sent
//! meanwhile is held, and delivered when the link heals (as TCP's
//! retransmissions would, for a partition shorter than their timeout).
//! [`DelayProxy::reset`] instead drops every connection: a peer down.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ports::free_port;

/// A delaying, cuttable proxy to a loopback port; stopped when dropped.
pub struct DelayProxy {
    port: u16,
    link: Arc<Link>,
}

/// What every connection of a proxy reads.
struct Link {
    /// The delay each way, in microseconds.
    one_way_us: AtomicU64,
    cut: AtomicBool,
    stopped: AtomicBool,
    /// Open connections (both sides of each), for `reset` and drop.
    open: Mutex<Vec<TcpStream>>,
}

impl DelayProxy {
    /// A proxy to `127.0.0.1:target` adding `one_way` each way.
    pub fn start(target: u16, one_way: Duration) -> DelayProxy {
        let port = free_port(false);
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the proxy's port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let link = Arc::new(Link {
            one_way_us: AtomicU64::new(one_way.as_micros() as u64),
            cut: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
        });
        let accepting = link.clone();
        std::thread::spawn(move || accept(&listener, target, &accepting));
        DelayProxy { port, link }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Changes the delay each way, for what is read from now on.
    pub fn set_delay(&self, one_way: Duration) {
        self.link
            .one_way_us
            .store(one_way.as_micros() as u64, Ordering::SeqCst);
    }

    /// Cuts the link: nothing passes either way until [`heal`](Self::heal).
    pub fn cut(&self) {
        self.link.cut.store(true, Ordering::SeqCst);
    }

    /// Heals a cut: what was held is delivered, then everything passes.
    pub fn heal(&self) {
        self.link.cut.store(false, Ordering::SeqCst);
    }

    /// Drops every open connection (a peer that went down; new ones are
    /// accepted as before).
    pub fn reset(&self) {
        for stream in self.link.open.lock().expect("the open list").drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.link.stopped.store(true, Ordering::SeqCst);
        self.reset();
    }
}

fn accept(listener: &TcpListener, target: u16, link: &Arc<Link>) {
    while !link.stopped.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(_) => continue,
        };
        let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nonblocking(false);
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let clones = (client.try_clone(), server.try_clone());
        let (Ok(client_out), Ok(server_out)) = clones else {
            continue;
        };
        {
            let mut open = link.open.lock().expect("the open list");
            if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                open.push(c);
                open.push(s);
            }
        }
        pump(client, server_out, link.clone());
        pump(server, client_out, link.clone());
    }
}

/// Forwards what `from` reads to `to`, each chunk `one_way` after it was
/// read (and not while the link is cut), on two threads: one reads, one
/// writes, so that a chunk waiting out its delay never holds back the
/// reading of the next.
fn pump(mut from: TcpStream, mut to: TcpStream, link: Arc<Link>) {
    let (send, receive) = mpsc::channel::<Option<(Instant, Vec<u8>)>>();
    let reading = link.clone();
    std::thread::spawn(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => {
                    let _ = send.send(None);
                    return;
                }
                Ok(n) => {
                    let delay = reading.one_way_us.load(Ordering::SeqCst);
                    let due = Instant::now() + Duration::from_micros(delay);
                    if send.send(Some((due, buffer[..n].to_vec()))).is_err() {
                        return;
                    }
                }
            }
        }
    });
    std::thread::spawn(move || {
        while let Ok(Some((due, bytes))) = receive.recv() {
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            while link.cut.load(Ordering::SeqCst) && !link.stopped.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            if link.stopped.load(Ordering::SeqCst) || to.write_all(&bytes).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
