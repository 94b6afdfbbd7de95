//! One unary gRPC method served straight on hyper: the request's one
//! message read from the body, the answer written as one message followed
//! by the `grpc-status` trailer.
//!
//! tonic's generated server does the same through its streaming machinery
//! (a decoder stream over the body, the message wrapped in a
//! `tonic::Request` with a metadata map, an encoder stream behind an 8 KiB
//! buffer, a boxed body), which a unary method does not need: counted
//! under callgrind, a `ShouldRateLimit` costs the service about 69
//! thousand instructions this way against 74 thousand through tonic's
//! server (docs/BENCHMARKS.md, "Service CPU per decision").
//!
//! What a client sees is what tonic answers: the message length bounded by
//! `server.limits.grpc_max_message_bytes` (`OUT_OF_RANGE` above it, told
//! from the length prefix before the message is read), compressed messages
//! refused with `UNIMPLEMENTED` (no compression is offered), a request
//! without a message `INTERNAL`, errors as a trailers-only response.

use std::convert::Infallible;
use std::fmt::Display;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tonic::Status;

/// A message's prefix: the compressed flag, then its length (4 bytes, big
/// endian).
const PREFIX: usize = 5;

/// The request header naming the message's compression (a name looked up
/// by `&str` is parsed on every lookup).
const GRPC_ENCODING: HeaderName = HeaderName::from_static("grpc-encoding");
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// Checks that a request whose headers these are sends its message
/// uncompressed (checked before the body is read: the headers need not be
/// kept while it arrives).
pub fn check_encoding(headers: &HeaderMap) -> Result<(), Status> {
    if let Some(encoding) = headers.get(GRPC_ENCODING)
        && encoding != "identity"
    {
        return Err(Status::unimplemented(format!(
            "messages compressed with {encoding:?} are not accepted: this server takes them \
             uncompressed (`grpc-encoding: identity`)"
        )));
    }
    Ok(())
}

/// Reads the one message of a unary request from its `body`, at most `max`
/// bytes long (the prefix not counted); see [`check_encoding`] for its
/// headers.
pub async fn read_message<B>(body: &mut B, max: usize) -> Result<Bytes, Status>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Display,
{
    // The message usually comes in one DATA frame, kept as it is; it is
    // copied together only when split.
    let mut first = Bytes::new();
    let mut joined = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Status::internal(format!("cannot read the request: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers: nothing a unary method reads
        };
        if data.is_empty() {
            // tonic's clients end the stream with an empty frame.
            continue;
        }
        if first.is_empty() && joined.is_empty() {
            first = data;
        } else {
            if joined.is_empty() {
                joined.extend_from_slice(&first);
            }
            joined.extend_from_slice(&data);
        }
        let received = if joined.is_empty() {
            &first
        } else {
            &joined[..]
        };
        check(received, max)?;
    }
    let mut received = if joined.is_empty() {
        first
    } else {
        joined.freeze()
    };
    match length(&received) {
        None if received.is_empty() => Err(Status::internal("Missing request message.")),
        Some(length) if received.len() == PREFIX + length => {
            // Advanced past the prefix rather than sliced: a slice of a
            // frame's bytes would share them through a new allocation.
            received.advance(PREFIX);
            Ok(received)
        }
        _ => Err(Status::internal(
            "the request ended inside its message (a truncated gRPC frame)",
        )),
    }
}

/// The length a message's prefix announces, once the prefix is complete.
fn length(received: &[u8]) -> Option<usize> {
    let prefix: [u8; PREFIX] = received.get(..PREFIX)?.try_into().ok()?;
    let length = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]);
    usize::try_from(length).ok()
}

/// Checks what has arrived so far: an uncompressed message within `max`
/// bytes, and nothing after it (checked after every frame, so what is held
/// never exceeds `PREFIX + max` by more than one HTTP/2 frame, 16 KiB).
fn check(received: &[u8], max: usize) -> Result<(), Status> {
    let Some(length) = length(received) else {
        return Ok(());
    };
    if received[0] != 0 {
        return Err(Status::internal(
            "protocol error: received message with compressed-flag but no grpc-encoding was \
             specified",
        ));
    }
    if length > max {
        return Err(Status::out_of_range(format!(
            "the request's message is {length} bytes; server.limits.grpc_max_message_bytes \
             allows at most {max}"
        )));
    }
    if received.len() > PREFIX + length {
        return Err(Status::internal(
            "a unary method takes one request message; more followed it",
        ));
    }
    Ok(())
}

/// The response to a unary call: `message` as the one message and
/// `grpc-status: 0`, or the error as a trailers-only response.
pub fn respond<M: prost::Message>(answer: Result<M, Status>) -> http::Response<OneMessage> {
    let message = answer.and_then(|message| {
        let length = message.encoded_len();
        let prefix = u32::try_from(length)
            .map_err(|_| Status::internal("the answer is too long for one gRPC message"))?;
        let mut framed = BytesMut::with_capacity(PREFIX + length);
        framed.put_u8(0);
        framed.put_u32(prefix);
        message.encode_raw(&mut framed);
        Ok(framed.freeze())
    });
    match message {
        Ok(framed) => {
            let mut response = http::Response::new(OneMessage {
                message: Some(framed),
                trailers: true,
            });
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            response
        }
        Err(status) => status.into_http(),
    }
}

/// A unary call's response body: its message, then `grpc-status: 0`
/// (empty for a trailers-only error, whose status is in the headers).
#[derive(Debug, Default)]
pub struct OneMessage {
    message: Option<Bytes>,
    trailers: bool,
}

impl Body for OneMessage {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if std::mem::take(&mut self.trailers) {
            let mut trailers = HeaderMap::with_capacity(1);
            // A constant name: from a `&str` it is parsed on every call.
            trailers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && !self.trailers
    }

    fn size_hint(&self) -> SizeHint {
        // At least the message, not exactly: given an exact size, hyper
        // adds a `content-length` header, which no gRPC client reads
        // (tonic's servers send none): a header fewer to encode.
        let mut hint = SizeHint::new();
        hint.set_lower(self.message.as_ref().map_or(0, |m| m.len() as u64));
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    fn read(chunks: &[&[u8]], max: usize) -> Result<Bytes, Status> {
        read_with(&HeaderMap::new(), chunks, max)
    }

    fn read_with(headers: &HeaderMap, chunks: &[&[u8]], max: usize) -> Result<Bytes, Status> {
        // Each chunk its own DATA frame.
        let frames = chunks
            .iter()
            .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::copy_from_slice(c))));
        let mut body =
            http_body_util::StreamBody::new(tokio_stream::iter(frames.collect::<Vec<_>>()));
        check_encoding(headers)?;
        futures_executor(read_message(&mut body, max))
    }

    /// Polls a future that never waits (the test bodies are ready).
    fn futures_executor<F: Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("a ready body made the read wait"),
        }
    }

    #[test]
    fn a_message_is_read_whole_or_split_anywhere() {
        let whole = framed(0, b"hello world");
        assert_eq!(read(&[&whole], 100).unwrap(), &b"hello world"[..]);
        for cut in 1..whole.len() {
            let (a, b) = whole.split_at(cut);
            assert_eq!(
                read(&[a, b], 100).unwrap(),
                &b"hello world"[..],
                "cut at {cut}"
            );
        }
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(read(&bytes, 100).unwrap(), &b"hello world"[..]);
        // Empty frames anywhere (tonic's clients end with one) change
        // nothing.
        let (a, b) = whole.split_at(3);
        assert_eq!(
            read(&[&[], a, &[], b, &[]], 100).unwrap(),
            &b"hello world"[..]
        );
        // An empty message is a message (every field at its default).
        assert_eq!(read(&[&framed(0, b"")], 100).unwrap(), &b""[..]);
    }

    #[test]
    fn the_bound_is_the_message_length_and_holds_at_the_edge() {
        let at = framed(0, &[7; 64]);
        assert_eq!(read(&[&at], 64).unwrap().len(), 64);
        let over = framed(0, &[7; 65]);
        let status = read(&[&over], 64).unwrap_err();
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
        assert!(
            status.message().contains("grpc_max_message_bytes") && status.message().contains("64"),
            "{status:?}"
        );
        // Refused from the prefix alone: the announced length is enough.
        let status = read(&[&over[..PREFIX]], 64).unwrap_err();
        assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
        let huge = [0, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(
            read(&[&huge], 64).unwrap_err().code(),
            tonic::Code::OutOfRange
        );
    }

    #[test]
    fn missing_truncated_extra_and_compressed_messages_are_refused() {
        let missing = read(&[], 100).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Internal);
        assert!(missing.message().contains("Missing"), "{missing:?}");
        let whole = framed(0, b"hello");
        for cut in 1..whole.len() {
            let status = read(&[&whole[..cut]], 100).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Internal, "cut at {cut}");
            assert!(status.message().contains("ended inside"), "{status:?}");
        }
        let mut two = whole.clone();
        two.extend_from_slice(&framed(0, b"again"));
        let status = read(&[&two], 100).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(
            status.message().contains("one request message"),
            "{status:?}"
        );
        let status = read(&[&whole, &[0]], 100).unwrap_err();
        assert!(
            status.message().contains("one request message"),
            "{status:?}"
        );

        let status = read(&[&framed(1, b"hello")], 100).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        let mut gzip = HeaderMap::new();
        gzip.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        let status = read_with(&gzip, &[&framed(1, b"hello")], 100).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        assert!(status.message().contains("gzip"), "{status:?}");
        let mut identity = HeaderMap::new();
        identity.insert("grpc-encoding", HeaderValue::from_static("identity"));
        assert!(read_with(&identity, &[&whole], 100).is_ok());
    }

    /// Every frame of a body, polled to its end.
    fn frames(mut body: OneMessage) -> Vec<Frame<Bytes>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut out = Vec::new();
        while let Poll::Ready(Some(frame)) = Pin::new(&mut body).poll_frame(&mut cx) {
            out.push(frame.unwrap());
        }
        assert!(body.is_end_stream());
        out
    }

    #[test]
    fn an_answer_is_one_framed_message_then_status_ok() {
        let answer = tonic_health::pb::HealthCheckResponse { status: 1 };
        let response = respond(Ok(answer));
        assert_eq!(response.headers()["content-type"], "application/grpc");
        let frames = frames(response.into_body());
        assert_eq!(frames.len(), 2, "{frames:?}");
        let data = frames[0].data_ref().unwrap();
        assert_eq!(
            data[..],
            framed(0, &prost::Message::encode_to_vec(&answer))[..]
        );
        assert_eq!(frames[1].trailers_ref().unwrap()["grpc-status"], "0");
    }

    #[test]
    fn an_error_is_a_trailers_only_response() {
        let response = respond::<tonic_health::pb::HealthCheckResponse>(Err(
            Status::invalid_argument("`domain` must not be empty"),
        ));
        assert_eq!(response.headers()["grpc-status"], "3");
        assert!(response.headers().contains_key("grpc-message"));
        assert!(frames(response.into_body()).is_empty());
    }
}
