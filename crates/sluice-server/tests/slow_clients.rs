//! Slow and idle clients do not exhaust the server: hundreds of idle,
//! slow-header and slow-body connections are held while decisions keep
//! succeeding, the server closes them after its timeouts, an oversize
//! `Content-Length` is refused at once, connections beyond
//! `server.limits.max_connections` are closed, and gRPC messages are
//! bounded in size and in the time they take to arrive.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Server, post, temp_file};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::json;

fn start(limits: &str) -> Server {
    let path = temp_file(
        &format!("slow-{}.yaml", limits.len()),
        &format!(
            "server:\n  limits: {limits}\ndefault_plan: p\nplans:\n  p:\n    tenant: [{{ limit: 100000, per: 1h }}]\n"
        ),
    );
    Server::start(&["--config", path.to_str().unwrap()])
}

fn address(server: &Server) -> String {
    server.base.trim_start_matches("http://").to_owned()
}

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

/// Whether the server closed `stream` (EOF or reset) by `deadline`, as
/// opposed to keeping it open.
fn closed_by_server(mut stream: &TcpStream, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    stream
        .set_read_timeout(Some(left.max(Duration::from_millis(10))))
        .unwrap();
    let mut buf = [0u8; 256];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // an answer (408) before the close
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_idle_and_slow_clients_do_not_stop_decisions() {
    let server = start("{ max_connections: 2000, header_timeout: 1s, request_timeout: 1s }");
    let addr = address(&server);
    // 400 connections that never send a byte, 100 that send half a header
    // line, 20 that send headers and then a body one byte at a time.
    let idle: Vec<TcpStream> = (0..400).map(|_| connect(&addr)).collect();
    let slow_headers: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = connect(&addr);
            s.write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    let mut slow_bodies: Vec<TcpStream> = (0..20)
        .map(|_| {
            let mut s = connect(&addr);
            s.write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n{")
                .unwrap();
            s
        })
        .collect();
    // Decisions go on meanwhile.
    let client = reqwest::Client::new();
    for i in 0..50 {
        let (status, _) = post(
            &client,
            &server.base,
            json!({"tenant": format!("t{i}"), "route": "GET /"}),
        )
        .await;
        assert_eq!(status, 200);
    }
    // A body announced above the limit is refused at once, not waited for.
    let mut oversize = connect(&addr);
    oversize
        .write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{")
        .unwrap();
    let mut answer = [0u8; 512];
    let n = oversize.read(&mut answer).expect("an answer, not a hang");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    // The server ends them all after its timeouts (1 s; wait up to 6).
    let deadline = Instant::now() + Duration::from_secs(6);
    let (blocking, sb) = (
        tokio::task::spawn_blocking(move || {
            let idle = idle
                .iter()
                .filter(|s| closed_by_server(s, deadline))
                .count();
            let headers = slow_headers
                .iter()
                .filter(|s| closed_by_server(s, deadline))
                .count();
            (idle, headers)
        }),
        tokio::task::spawn_blocking(move || {
            slow_bodies
                .iter_mut()
                .map(|s| {
                    // One more byte now and then: never the whole body.
                    let _ = s.write_all(b" ");
                    closed_by_server(s, deadline)
                })
                .filter(|closed| *closed)
                .count()
        }),
    );
    let (idle_closed, headers_closed) = blocking.await.unwrap();
    assert_eq!(idle_closed, 400, "idle connections are closed");
    assert_eq!(headers_closed, 100, "slow headers are cut off");
    assert_eq!(sb.await.unwrap(), 20, "slow bodies are cut off");
    // And the server still decides.
    let (status, _) = post(
        &client,
        &server.base,
        json!({"tenant": "after", "route": "GET /"}),
    )
    .await;
    assert_eq!(status, 200);
}

#[test]
fn a_body_sent_too_slowly_gets_a_408_problem() {
    let server = start("{ request_timeout: 300ms }");
    let mut slow = connect(&address(&server));
    slow.write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{")
        .unwrap();
    let mut answer = Vec::new();
    let _ = slow.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let server = start("{ max_connections: 20, header_timeout: 30s }");
    let addr = address(&server);
    let held: Vec<TcpStream> = (0..30).map(|_| connect(&addr)).collect();
    let closed = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_millis(1_500);
        let closed = held
            .iter()
            .filter(|s| closed_by_server(s, deadline))
            .count();
        (closed, held)
    });
    let (closed, held) = closed.await.unwrap();
    assert_eq!(closed, 10, "the 10 beyond max_connections");
    drop(held);
    // Places come back once connections close.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = post(
        &reqwest::Client::new(),
        &server.base,
        json!({"tenant": "a", "route": "GET /"}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn grpc_messages_above_the_limit_are_refused() {
    let server = start("{ grpc_max_message_bytes: 1024 }");
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let request = |value: String| RateLimitRequest {
        domain: "sluice".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value,
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    assert!(client.should_rate_limit(request("a".into())).await.is_ok());
    let status = client
        .should_rate_limit(request("x".repeat(2_000)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            status.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
        ),
        "{status:?}"
    );
    assert!(client.should_rate_limit(request("b".into())).await.is_ok());
}

#[tokio::test]
async fn a_grpc_message_over_several_http2_frames_is_read_whole() {
    // HTTP/2 frames carry at most 16 KiB: this message takes three.
    let server = start("{ grpc_max_message_bytes: 65536 }");
    let mut client = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let entry = |key: &str, fill: char| Entry {
        key: key.into(),
        value: fill.to_string().repeat(15_000),
    };
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: "sluice".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![
                    Entry {
                        key: "tenant".into(),
                        value: "a".into(),
                    },
                    entry("x", 'b'),
                    entry("y", 'c'),
                    entry("z", 'd'),
                ],
                ..Default::default()
            }],
            hits_addend: 1,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.statuses.len(), 1, "{answer:?}");
}

#[tokio::test]
async fn a_grpc_message_that_never_arrives_gets_deadline_exceeded() {
    let server = start("{ request_timeout: 300ms }");
    let channel = tonic::transport::Endpoint::from_shared(server.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    // The request's headers go out; its message never does.
    let started = Instant::now();
    let status = grpc
        .client_streaming(
            tonic::Request::new(tokio_stream::pending::<RateLimitRequest>()),
            http::uri::PathAndQuery::from_static(
                "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            ),
            tonic_prost::ProstCodec::<RateLimitRequest, RateLimitResponse>::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("request_timeout"), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The connection keeps serving.
    let mut client = RateLimitServiceClient::new(channel);
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: "sluice".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "tenant".into(),
                    value: "a".into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .await;
    assert!(answer.is_ok(), "{answer:?}");
}

#[test]
fn the_open_file_soft_limit_is_raised_to_the_hard_limit() {
    let hard = std::process::Command::new("sh")
        .args(["-c", "ulimit -H -n"])
        .output()
        .unwrap();
    let hard = String::from_utf8_lossy(&hard.stdout).trim().to_owned();
    let mut child = std::process::Command::new("sh")
        .args([
            "-c",
            "ulimit -S -n 256 && exec \"$0\" serve --http 127.0.0.1:0 --grpc 127.0.0.1:0",
            env!("CARGO_BIN_EXE_sluice"),
        ])
        .env("NO_COLOR", "1")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let line = std::io::BufRead::lines(std::io::BufReader::new(stderr))
        .map_while(Result::ok)
        .find(|l| l.contains("sluice listening"))
        .expect("sluice starts");
    let _ = child.kill();
    let _ = child.wait();
    let open_files: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("open_files="))
        .expect("the start-up line names the open-file limit")
        .parse()
        .unwrap();
    match hard.parse::<u64>() {
        Ok(hard) => assert_eq!(open_files, hard, "{line}"),
        Err(_) => assert!(open_files > 256, "hard limit {hard}: {line}"),
    }
}
