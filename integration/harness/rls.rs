//! Talking to sluice as Envoy does: RLS requests and descriptors, the response codes and
//! headers, raw request bytes (what no well-behaved client sends), and plain HTTP/1.0 GETs for
//! the admin listener.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use prost::bytes::{Buf, BufMut};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// `RateLimitResponse.Code` OK and OVER_LIMIT.
pub const OK: i32 = 1;
pub const OVER_LIMIT: i32 = 2;

/// A descriptor from `k=v` pairs.
pub fn desc(pairs: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

pub fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

/// The value of a response header, if present.
pub fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

/// A request of one descriptor per `(key, value)`.
pub fn request(domain: &str, descriptors: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|(k, v)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: k.to_string(),
                    value: v.to_string(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// The gRPC path of `ShouldRateLimit`, as Envoy calls it.
const SHOULD_RATE_LIMIT_PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `bytes` sent as the `RateLimitRequest` of a `ShouldRateLimit` call to `addr`: the decoded
/// answer, or the status it was refused with.
pub async fn raw_call(
    addr: SocketAddr,
    bytes: Vec<u8>,
) -> Result<RateLimitResponse, tonic::Status> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc.unary(
        tonic::Request::new(bytes),
        http::uri::PathAndQuery::from_static(SHOULD_RATE_LIMIT_PATH),
        RawCodec,
    )
    .await
    .map(|r| r.into_inner())
}

/// The encoding of `request` with the first `needle` replaced by same-length `with` (e.g. a
/// value made invalid UTF-8).
pub fn patched(request: &RateLimitRequest, needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut bytes = request.encode_to_vec();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("needle present");
    bytes[at..at + with.len()].copy_from_slice(with);
    bytes
}

/// Sends raw bytes as a `RateLimitRequest` and decodes the answer.
#[derive(Clone, Copy, Default)]
struct RawCodec;
struct RawEncoder;
struct ResponseDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = RateLimitResponse;
    type Encoder = RawEncoder;
    type Decoder = ResponseDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> ResponseDecoder {
        ResponseDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for ResponseDecoder {
    type Item = RateLimitResponse;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut DecodeBuf<'_>,
    ) -> Result<Option<RateLimitResponse>, tonic::Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        RateLimitResponse::decode(bytes)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

/// A minimal HTTP/1.0 GET: (status code, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path)
}

/// One minimal HTTP/1.0 exchange of `method` (the server closes the connection after answering):
/// (status code, body).
pub fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    http_with(addr, method, path, &[("Host", "localhost")])
}

/// The operator token of test servers started with `--admin-write` ([`operator_token_file`]).
pub const OPERATOR_TOKEN: &str = "operator-token-for-tests";

/// A file holding [`OPERATOR_TOKEN`], for `--admin-token-file` (kept until the process ends).
pub fn operator_token_file() -> std::path::PathBuf {
    let file = tempfile::NamedTempFile::new().expect("a temp file");
    std::fs::write(file.path(), format!("{OPERATOR_TOKEN}\n")).unwrap();
    file.into_temp_path().keep().expect("kept")
}

/// One HTTP/1.0 exchange as an operator would make it: the listener's `Host` and the
/// [`OPERATOR_TOKEN`] as a bearer token.
pub fn http_as_operator(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let bearer = format!("Bearer {OPERATOR_TOKEN}");
    http_with(
        addr,
        method,
        path,
        &[("Host", "localhost"), ("Authorization", &bearer)],
    )
}

/// [`http`] with these header lines (and no other).
pub fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("{method} {path} HTTP/1.0\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
