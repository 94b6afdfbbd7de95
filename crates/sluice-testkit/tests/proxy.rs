//! The delay and partition proxy, against a real redis-server: a round
//! trip takes at least both delays, a pipeline is not held back by them,
//! a cut holds everything until it heals, and a reset drops connections.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sluice_testkit::{DelayProxy, RedisServer};

fn connect(proxy: &DelayProxy) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

/// Reads until `want` bytes came (or the read timeout).
fn read_n(stream: &mut TcpStream, want: usize) -> std::io::Result<Vec<u8>> {
    let mut got = Vec::new();
    let mut buffer = [0u8; 4096];
    while got.len() < want {
        let n = stream.read(&mut buffer)?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buffer[..n]);
    }
    Ok(got)
}

#[test]
fn a_round_trip_takes_both_delays_and_a_pipeline_is_not_held_back() {
    let redis = RedisServer::start();
    let proxy = DelayProxy::start(redis.port(), Duration::from_millis(40));
    let mut stream = connect(&proxy);
    let started = Instant::now();
    stream.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut stream, 7).unwrap(), b"+PONG\r\n");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(80),
        "a round trip in {took:?}"
    );
    // 50 commands at once: one round trip, not 50 (those would be 4 s).
    let started = Instant::now();
    stream.write_all(&b"PING\r\n".repeat(50)).unwrap();
    assert_eq!(
        read_n(&mut stream, 7 * 50).unwrap(),
        b"+PONG\r\n".repeat(50)
    );
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "50 pipelined in {took:?}");
}

#[test]
fn a_cut_holds_everything_until_it_heals_and_a_reset_drops_connections() {
    let redis = RedisServer::start();
    let proxy = DelayProxy::start(redis.port(), Duration::from_millis(5));
    let mut stream = connect(&proxy);
    stream.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut stream, 7).unwrap(), b"+PONG\r\n");

    proxy.cut();
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    stream.write_all(b"INCR cut\r\n").unwrap();
    let held = read_n(&mut stream, 4);
    assert!(held.is_err(), "answered through a cut: {held:?}");
    // Held, not lost: the command has not reached the server either.
    let mut direct = redis.connection();
    let count: Option<i64> = redis::cmd("GET").arg("cut").query(&mut direct).unwrap();
    assert_eq!(count, None, "the command passed the cut");

    proxy.heal();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(read_n(&mut stream, 4).unwrap(), b":1\r\n");

    proxy.reset();
    let mut buffer = [0u8; 16];
    let dropped = stream.read(&mut buffer);
    assert!(
        matches!(dropped, Ok(0) | Err(_)),
        "a reset connection read {dropped:?}"
    );
    let mut again = connect(&proxy);
    again.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_n(&mut again, 7).unwrap(), b"+PONG\r\n");
}
