//! The downstream's capacity: past its workers, requests queue, in order;
//! its workers change while it runs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sluice_testkit::Downstream;

/// One request on a fresh connection: how long it took.
fn request(port: u16) -> Duration {
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"POST /work HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
        .unwrap();
    let mut answer = [0u8; 128];
    let mut read = 0;
    while !answer[..read].ends_with(b"ok") {
        let n = stream.read(&mut answer[read..]).unwrap();
        assert!(n > 0, "closed early");
        read += n;
    }
    assert!(answer.starts_with(b"HTTP/1.1 200 OK"));
    started.elapsed()
}

/// `n` requests at once: each one's time, sorted.
fn burst(port: u16, n: usize) -> Vec<Duration> {
    let threads: Vec<_> = (0..n)
        .map(|_| std::thread::spawn(move || request(port)))
        .collect();
    let mut times: Vec<Duration> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    times.sort();
    times
}

#[test]
fn past_its_workers_requests_queue_and_workers_change_while_it_runs() {
    let downstream = Downstream::start(2, Duration::from_millis(100));
    let port: u16 = downstream
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let times = burst(port, 4);
    assert!(
        times[1] < Duration::from_millis(180),
        "two served at once: {times:?}"
    );
    assert!(
        times[2] >= Duration::from_millis(195),
        "two queued: {times:?}"
    );
    downstream.set_workers(4);
    let times = burst(port, 4);
    assert!(
        times[3] < Duration::from_millis(180),
        "four at once now: {times:?}"
    );
    assert_eq!(downstream.served(), 8);
}
