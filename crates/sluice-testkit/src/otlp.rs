//! An OTLP receiver: the trace service of an OpenTelemetry collector, over
//! gRPC (`TraceService/Export`) and over HTTP (`POST /v1/traces`,
//! protobuf), each on a free loopback port, keeping every span it receives
//! for the test to read. It runs on a thread of its own (its own runtime),
//! so that sync and async tests alike use it; it stops when dropped, and
//! [`OtlpReceiver::stop`] makes it unreachable mid-test (a collector gone
//! away).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// One span as the receiver got it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// Its name.
    pub name: String,
    /// The trace id, 32 hex digits.
    pub trace_id: String,
    /// Its span id, 16 hex digits.
    pub span_id: String,
    /// The parent's span id, 16 hex digits; empty for a root.
    pub parent_span_id: String,
    /// `SPAN_KIND_*` as OTLP numbers it (2: server, 3: client).
    pub kind: i32,
    /// Its attributes, each value as text.
    pub attributes: BTreeMap<String, String>,
    /// Its resource's attributes (`service.name`...), as text.
    pub resource: BTreeMap<String, String>,
    /// How it arrived: `grpc` or `http`.
    pub via: &'static str,
}

impl ReceivedSpan {
    /// The attribute `key`, as text.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

/// The receiver; stopped when dropped.
pub struct OtlpReceiver {
    grpc: SocketAddr,
    http: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtlpReceiver {
    /// Starts both endpoints.
    pub fn start() -> OtlpReceiver {
        let grpc = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let http = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let (grpc_at, http_at) = (grpc.local_addr().unwrap(), http.local_addr().unwrap());
        for listener in [&grpc, &http] {
            listener
                .set_nonblocking(true)
                .expect("a non-blocking listener");
        }
        let spans = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let kept = spans.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the receiver's runtime");
            runtime.block_on(serve(grpc, http, kept, stopped));
        });
        OtlpReceiver {
            grpc: grpc_at,
            http: http_at,
            spans,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The gRPC endpoint, `http://127.0.0.1:PORT`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The HTTP endpoint's base, `http://127.0.0.1:PORT` (spans are
    /// posted to `/v1/traces` under it).
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits (up to `within`) until the spans received satisfy `done`, and
    /// returns them all; panics with what arrived when they never do.
    pub fn wait_for(
        &self,
        within: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + within;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "the receiver did not get the spans expected within {within:?}; it got: {spans:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops both endpoints: connections are refused from now on.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Both endpoints until `stopped`.
async fn serve(
    grpc: std::net::TcpListener,
    http: std::net::TcpListener,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let grpc = tokio::net::TcpListener::from_std(grpc).expect("the gRPC listener");
    let http = tokio::net::TcpListener::from_std(http).expect("the HTTP listener");
    let service = TraceServiceServer::new(Receiver(spans.clone()));
    let grpc_server = tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(grpc));
    let router = axum::Router::new()
        .route("/v1/traces", axum::routing::post(posted))
        .with_state(spans);
    let http_server = axum::serve(http, router);
    tokio::select! {
        _ = grpc_server => {}
        _ = http_server => {}
        _ = stopped => {}
    }
}

/// The gRPC trace service.
struct Receiver(Arc<Mutex<Vec<ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner(), "grpc");
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// `POST /v1/traces`, a protobuf body.
async fn posted(
    axum::extract::State(spans): axum::extract::State<Arc<Mutex<Vec<ReceivedSpan>>>>,
    body: Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) => {
            keep(&spans, request, "http");
            let answer = ExportTraceServiceResponse::default().encode_to_vec();
            (
                [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                answer,
            )
                .into_response()
        }
        Err(e) => (axum::http::StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

/// Keeps the spans of `request`.
fn keep(spans: &Mutex<Vec<ReceivedSpan>>, request: ExportTraceServiceRequest, via: &'static str) {
    let mut kept = spans.lock().unwrap();
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| attributes(r.attributes))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                kept.push(ReceivedSpan {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    kind: span.kind,
                    attributes: attributes(span.attributes),
                    resource: resource.clone(),
                    via,
                });
            }
        }
    }
}

fn attributes(
    attributes: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
) -> BTreeMap<String, String> {
    attributes
        .into_iter()
        .map(|kv| {
            let value = match kv.value.and_then(|v| v.value) {
                Some(Value::StringValue(s)) => s,
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                Some(other) => format!("{other:?}"),
                None => String::new(),
            };
            (kv.key, value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
