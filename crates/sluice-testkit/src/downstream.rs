//! A downstream with a capacity: an HTTP service on a free loopback port
//! with `workers` workers, each request taking `service` of one of them;
//! past `workers` requests in flight, requests queue for a free worker, in
//! order (its latency rises sharply past its capacity, as a database's or
//! a model server's does). The number of workers can change while it runs.
//! For tests and benchmarks of adaptive valves.
//!
//! Every request (`GET` or `POST`, any path; a body is read by its
//! `Content-Length`) is answered `200 ok`, on keep-alive connections, each
//! served by a thread of its own.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::ports::free_port;

/// A downstream of limited capacity; stopped when dropped.
pub struct Downstream {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    /// Workers free and all, guarded together.
    workers: Mutex<Workers>,
    freed: Condvar,
    service_us: AtomicU64,
    stopped: AtomicBool,
    served: AtomicU64,
    open: Mutex<Vec<TcpStream>>,
}

struct Workers {
    busy: usize,
    all: usize,
    /// Tickets, so that waiting requests get workers in arrival order.
    next: u64,
    serving: u64,
}

impl Downstream {
    /// A downstream of `workers` workers, each request taking `service`.
    pub fn start(workers: usize, service: Duration) -> Downstream {
        let port = free_port(false);
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the downstream's port");
        let shared = Arc::new(Shared {
            workers: Mutex::new(Workers {
                busy: 0,
                all: workers.max(1),
                next: 0,
                serving: 0,
            }),
            freed: Condvar::new(),
            service_us: AtomicU64::new(service.as_micros() as u64),
            stopped: AtomicBool::new(false),
            served: AtomicU64::new(0),
            open: Mutex::new(Vec::new()),
        });
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accepting.stopped.load(Ordering::Acquire) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let _ = stream.set_nodelay(true);
                if let Ok(clone) = stream.try_clone() {
                    accepting.open.lock().unwrap().push(clone);
                }
                let serving = accepting.clone();
                std::thread::spawn(move || serve(stream, &serving));
            }
        });
        Downstream { port, shared }
    }

    /// Its URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Changes how many workers it has (at least 1), at once: requests
    /// being served finish; no more than `workers` are served after them.
    pub fn set_workers(&self, workers: usize) {
        self.shared.workers.lock().unwrap().all = workers.max(1);
        self.shared.freed.notify_all();
    }

    /// Requests it has answered.
    pub fn served(&self) -> u64 {
        self.shared.served.load(Ordering::Relaxed)
    }
}

impl Drop for Downstream {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::Release);
        self.shared.freed.notify_all();
        // Unblocks the accepting thread.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for stream in self.shared.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Serves one connection's requests until it closes.
fn serve(stream: TcpStream, shared: &Shared) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        // The request line and headers, up to the blank line.
        let mut length = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if line == "\r\n" || line == "\n" {
                if first {
                    continue;
                }
                break;
            }
            first = false;
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length.min(1 << 20)];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if !work(shared) {
            return;
        }
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok";
        if writer.write_all(answer).is_err() {
            return;
        }
        shared.served.fetch_add(1, Ordering::Relaxed);
    }
}

/// Waits for a worker, in arrival order, and holds it for the service
/// time; false when the downstream stopped.
fn work(shared: &Shared) -> bool {
    let mut workers = shared.workers.lock().unwrap();
    let ticket = workers.next;
    workers.next += 1;
    while !(workers.serving == ticket && workers.busy < workers.all) {
        if shared.stopped.load(Ordering::Acquire) {
            return false;
        }
        workers = shared
            .freed
            .wait_timeout(workers, Duration::from_millis(50))
            .unwrap()
            .0;
    }
    workers.serving += 1;
    workers.busy += 1;
    drop(workers);
    shared.freed.notify_all();
    std::thread::sleep(Duration::from_micros(
        shared.service_us.load(Ordering::Relaxed),
    ));
    shared.workers.lock().unwrap().busy -= 1;
    shared.freed.notify_all();
    true
}
