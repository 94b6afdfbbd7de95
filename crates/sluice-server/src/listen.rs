//! Accepting connections without letting clients exhaust the server.
//!
//! Both listeners (HTTP and gRPC) go through [`serve`]: a connection takes
//! one of `server.limits.max_connections` places or is closed at once; HTTP/1
//! connections must deliver a request's headers within `header_timeout`
//! (which also ends idle keep-alive connections); HTTP/2 connections are
//! pinged every `grpc_keepalive` and dropped when a ping goes unanswered,
//! with at most `grpc_max_streams` streams each. Running out of file
//! descriptors does not stop the accept loop: it waits a moment and goes
//! on, while the decisions on open connections continue.
//!
//! [`on_threads`] runs the listeners on one single-threaded runtime per
//! core, each accepting from the same sockets and running its connections
//! start to finish: a request never hops between threads. On a
//! work-stealing runtime every HTTP/2 stream is a task that another
//! thread wakes up for, which made a gRPC decision cost a third more
//! service CPU than an HTTP one (BENCHMARKS.md).
//!
//! [`raise_open_files`] lifts the soft limit on open files to the hard one
//! at start-up: the common soft limit of 1024 would otherwise cap the
//! connections long before `max_connections`.

use std::convert::Infallible;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use sluice_core::config::ConnectionLimits;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Which protocols a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocols {
    /// HTTP/1.1 and HTTP/2 (the HTTP API).
    Any,
    /// HTTP/2 only (gRPC).
    Http2,
}

/// Connections refused because the listener was full, across listeners
/// (logged once per thousand).
static REFUSED: AtomicU64 = AtomicU64::new(0);

/// The places of one listener: `server.limits.max_connections`, shared by
/// the threads that accept from it.
pub fn places(limits: &ConnectionLimits) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(
        usize::try_from(limits.max_connections).unwrap_or(usize::MAX),
    ))
}

/// Serves `service` on `listener` within `limits` until `shutdown`
/// resolves, a connection taking one of `places` (shared by the threads
/// accepting from the same socket); then stops accepting and waits for the
/// open connections to finish their requests (idle ones are closed).
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    limits: &ConnectionLimits,
    protocols: Protocols,
    shutdown: impl std::future::Future<Output = ()>,
    places: Arc<Semaphore>,
) where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<B>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let builder = builder(limits, protocols);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: the connections already open keep
                    // working; try again shortly.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            if REFUSED
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(1_000)
            {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "connection refused: server.limits.max_connections are open"
                );
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        // HTTP handlers learn who connected (for the client's IP behind
        // trusted proxies); gRPC's never ask, and an extension costs each
        // request an allocation.
        let tag_peer = protocols == Protocols::Any;
        let service = tower::ServiceExt::map_request(
            service.clone(),
            move |mut request: http::Request<hyper::body::Incoming>| {
                if tag_peer {
                    request.extensions_mut().insert(sluice_tower::Peer(peer));
                }
                request
            },
        );
        let watcher = graceful.watcher();
        let header_timeout = Duration::from_millis(limits.header_timeout_ms);
        tokio::spawn(async move {
            // The protocol is told from the first bytes: a client that
            // sends none is dropped after the header timeout (hyper's own
            // timer only starts once HTTP/1 is chosen).
            let mut first = [0u8; 1];
            let sent = tokio::time::timeout(header_timeout, stream.peek(&mut first)).await;
            if matches!(sent, Ok(Ok(1..))) {
                let connection = builder.serve_connection_with_upgrades(
                    TokioIo::new(stream),
                    TowerToHyperService::new(service),
                );
                let _ = watcher.watch(connection.into_owned()).await;
            }
            drop(place);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

fn builder(limits: &ConnectionLimits, protocols: Protocols) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if protocols == Protocols::Http2 {
        builder = builder.http2_only();
    }
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_timeout_ms))
        .keep_alive(true);
    let keepalive = Duration::from_millis(limits.grpc_keepalive_ms);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(keepalive)
        .keep_alive_timeout(keepalive)
        .max_concurrent_streams(limits.grpc_max_streams)
        // gRPC answers carry no `date`, which no gRPC client reads:
        // a header fewer to encode on every answer. HTTP answers keep it.
        .auto_date_header(protocols != Protocols::Http2);
    builder
}

/// `future`'s output, or `Elapsed` when it takes longer than `limit`
/// (`server.limits.request_timeout` for a request): `tokio::time::timeout`,
/// except that the timer is armed only once the future has to wait. Most
/// requests are answered on their first poll (the body came with the
/// headers, the store is in process), and arming and dropping a timer
/// costs more than such an answer.
pub async fn within<F: Future>(
    limit: Duration,
    future: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    let mut future = pin!(future);
    if let Poll::Ready(output) = poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await {
        return Ok(output);
    }
    tokio::time::timeout(limit, future).await
}

/// How many listener threads [`on_threads`] starts: one per core.
pub fn io_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Runs `serve` on `threads` threads, each with a single-threaded runtime
/// of its own, and resolves once every one has returned. `serve` is called
/// on each thread, inside its runtime (where it turns duplicates of the
/// listening sockets into its own listeners).
pub async fn on_threads<F, Fut>(threads: usize, serve: F) -> Result<(), String>
where
    F: Fn() -> Result<Fut, String> + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let serve = Arc::new(serve);
    let mut finished = Vec::with_capacity(threads);
    for i in 0..threads.max(1) {
        let (done, finish) = tokio::sync::oneshot::channel::<Result<(), String>>();
        let serve = serve.clone();
        std::thread::Builder::new()
            .name(format!("sluice-io-{i}"))
            .spawn(move || {
                let ran = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot start a listener runtime: {e}"))
                    .and_then(|runtime| {
                        runtime.block_on(async {
                            serve()?.await;
                            Ok(())
                        })
                    });
                let _ = done.send(ran);
            })
            .map_err(|e| format!("cannot start a listener thread: {e}"))?;
        finished.push(finish);
    }
    for finish in finished {
        finish
            .await
            .map_err(|_| "a listener thread stopped unexpectedly".to_owned())??;
    }
    Ok(())
}

/// Raises this process's soft limit on open files to its hard limit;
/// returns the limit now in force (`None` where there is none to raise).
pub fn raise_open_files() -> Option<u64> {
    rlimit::increase_nofile_limit(u64::MAX).ok()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::within;

    // On tokio's paused clock: the timer and the timeout advance it, so the
    // test runs at once and a slow machine cannot make it flaky.
    #[tokio::test(start_paused = true)]
    async fn within_answers_what_is_ready_waits_for_what_comes_in_time_and_stops_the_rest() {
        let limit = Duration::from_millis(200);
        assert_eq!(within(limit, async { 1 }).await, Ok(1));
        let soon = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            2
        };
        assert_eq!(within(limit, soon).await, Ok(2));
        let never = std::future::pending::<()>();
        let started = tokio::time::Instant::now();
        assert!(within(limit, never).await.is_err());
        assert!(started.elapsed() >= limit, "{:?}", started.elapsed());
    }
}
