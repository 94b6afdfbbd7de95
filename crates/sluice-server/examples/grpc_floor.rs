//! The floor under a gRPC decision: a canned `ShouldRateLimit` answer
//! (`OK`, no decision, nothing read from the request) served through
//! hyper's HTTP/2 server as sluice's listener is (`hyper`), or straight on
//! the `h2` crate with every stream answered in its connection's task
//! (`h2`: no hyper, no task per stream). `scripts/grpc_floor.sh` counts the
//! instructions each executes per request under `sluice bench`'s load, as
//! `scripts/service_instructions.sh` counts the service's.
//!
//! Run: `cargo run --release -p sluice-server --example grpc_floor -- MODE
//! PORT SECONDS` (MODE `hyper`, `h2` or `inline`; it serves on
//! 127.0.0.1:PORT for SECONDS, then exits).

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// One gRPC message: uncompressed, 2 bytes, a `RateLimitResponse` whose
/// `overall_code` is `OK` (field 1, varint 1).
const ANSWER: [u8; 7] = [0, 0, 0, 0, 2, 0x08, 0x01];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, port, seconds] = args.as_slice() else {
        eprintln!("usage: grpc_floor hyper|h2|inline PORT SECONDS");
        std::process::exit(2);
    };
    let (port, seconds): (u16, u64) = (
        port.parse().expect("PORT is a port number"),
        seconds.parse().expect("SECONDS is a whole number"),
    );
    assert!(
        ["hyper", "h2", "inline"].contains(&mode.as_str()),
        "MODE is hyper, h2 or inline, not {mode:?}"
    );
    let mode = mode.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("the port is free");
        let stop = tokio::time::sleep(Duration::from_secs(seconds));
        tokio::pin!(stop);
        loop {
            let io = tokio::select! {
                accepted = listener.accept() => accepted.expect("a connection").0,
                () = &mut stop => return,
            };
            io.set_nodelay(true).expect("TCP_NODELAY");
            match mode.as_str() {
                "h2" => tokio::spawn(on_h2(io)),
                "inline" => tokio::spawn(on_hyper_inline(io)),
                _ => tokio::spawn(on_hyper(io)),
            };
        }
    });
}

fn trailers() -> http::HeaderMap {
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    trailers
}

/// The canned answer as a hyper service: the body read, the answer a body
/// with trailers.
async fn canned(
    request: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<impl hyper::body::Body<Data = Bytes, Error = Infallible>>, Infallible> {
    let _ = request.into_body().collect().await;
    let body = Full::new(Bytes::from_static(&ANSWER))
        .with_trailers(async { Some(Ok::<_, Infallible>(trailers())) });
    Ok(http::Response::builder()
        .header("content-type", "application/grpc")
        .body(body)
        .expect("a valid response"))
}

/// hyper's HTTP/2 server: a task per stream.
async fn on_hyper(io: tokio::net::TcpStream) {
    let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .auto_date_header(false)
        .serve_connection(
            hyper_util::rt::TokioIo::new(io),
            hyper::service::service_fn(canned),
        )
        .await;
}

/// Streams hyper hands its executor, waiting for the connection's task.
#[derive(Clone, Default)]
struct Inbox(Arc<Mutex<Vec<Answering>>>);

impl<F: Future<Output = ()> + Send + 'static> hyper::rt::Executor<F> for Inbox {
    fn execute(&self, stream: F) {
        self.0.lock().expect("not poisoned").push(Box::pin(stream));
    }
}

/// hyper's HTTP/2 server, its streams polled by the connection's task.
async fn on_hyper_inline(io: tokio::net::TcpStream) {
    let inbox = Inbox::default();
    let mut connection = pin!(
        hyper::server::conn::http2::Builder::new(inbox.clone())
            .auto_date_header(false)
            .serve_connection(
                hyper_util::rt::TokioIo::new(io),
                hyper::service::service_fn(canned),
            )
    );
    let mut streams: Vec<Answering> = Vec::new();
    poll_fn(|cx| {
        let closed = connection.as_mut().poll(cx).is_ready();
        streams.append(&mut inbox.0.lock().expect("not poisoned"));
        streams.retain_mut(|stream| stream.as_mut().poll(cx).is_pending());
        if closed {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

type Answering = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Straight on h2: the connection and its streams polled by one task.
async fn on_h2(io: tokio::net::TcpStream) {
    let Ok(mut connection) = h2::server::handshake(io).await else {
        return;
    };
    let mut answering: Vec<Answering> = Vec::new();
    poll_fn(|cx| {
        loop {
            match connection.poll_accept(cx) {
                Poll::Ready(Some(Ok((request, respond)))) => {
                    answering.push(Box::pin(answer(request, respond)));
                }
                Poll::Ready(_) => return Poll::Ready(()),
                Poll::Pending => break,
            }
        }
        answering.retain_mut(|stream| stream.as_mut().poll(cx).is_pending());
        Poll::Pending
    })
    .await;
}

async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let mut body = request.into_body();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let response = http::Response::builder()
        .header("content-type", "application/grpc")
        .body(())
        .expect("a valid response");
    let Ok(mut send) = respond.send_response(response, false) else {
        return;
    };
    if send.send_data(Bytes::from_static(&ANSWER), false).is_ok() {
        let _ = send.send_trailers(trailers());
    }
}
