//! The strict wire decoding of `RateLimitRequest`: the codec [`crate::rls::RateLimitServer`]
//! serves `ShouldRateLimit` with.
//!
//! Envoy copies header values unchanged into descriptor values, and a header value may hold
//! obs-text (0x80–0xFF), which is not UTF-8: envoy-types' `RateLimitRequest` (prost `String`
//! fields) cannot carry such a request. [`StrictCodec`] decodes into [`WireRequest`] instead, the
//! same message on the wire with entry values as `bytes`, so such a value is decided like any
//! other. The domain and entry keys come from Envoy's configuration, which is UTF-8: one that is
//! not is INVALID_ARGUMENT naming the field the way [`crate::rls::to_limit_request`] does
//! (`descriptors[2].entries[0].key: not valid UTF-8`), where tonic's prost codec would answer
//! INTERNAL, blaming the server for the caller's bytes. Encoding is prost's.
//!
//! The codec also holds `--max-message-bytes` against the encoded message as it arrived, before
//! decoding: unknown fields are bytes too, and prost skips them, so the decoded request's size
//! says nothing about what the caller sent.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::Message;
use prost::bytes::Buf;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// `envoy.service.ratelimit.v3.RateLimitRequest` field for field (same tags, same wire format),
/// with descriptor entry values as `bytes`: what [`StrictCodec`] decodes.
#[derive(Clone, PartialEq, Message)]
pub struct WireRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<WireDescriptor>,
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`, entry values as `bytes`.
#[derive(Clone, PartialEq, Message)]
pub struct WireDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<WireEntry>,
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.Entry` with its `value` as `bytes`.
#[derive(Clone, PartialEq, Message)]
pub struct WireEntry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

impl From<RateLimitRequest> for WireRequest {
    /// No copy: each string's buffer becomes the bytes.
    fn from(request: RateLimitRequest) -> Self {
        WireRequest {
            domain: request.domain,
            descriptors: request
                .descriptors
                .into_iter()
                .map(WireDescriptor::from)
                .collect(),
            hits_addend: request.hits_addend,
        }
    }
}

impl From<RateLimitDescriptor> for WireDescriptor {
    fn from(d: RateLimitDescriptor) -> Self {
        WireDescriptor {
            entries: d
                .entries
                .into_iter()
                .map(|e| WireEntry {
                    key: e.key,
                    value: e.value.into_bytes(),
                })
                .collect(),
            limit: d.limit,
            hits_addend: d.hits_addend,
            is_negative_hits: d.is_negative_hits,
        }
    }
}

/// gRPC path of the one method.
pub const SHOULD_RATE_LIMIT_PATH: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Decodes a `RateLimitRequest` (entry values may be any bytes); a malformed one is
/// INVALID_ARGUMENT naming the first domain or key that is not valid UTF-8, or saying why the
/// bytes are not a `RateLimitRequest` at all.
pub fn decode_request(bytes: &[u8]) -> Result<WireRequest, Status> {
    WireRequest::decode(bytes).map_err(|error| explain(bytes, error))
}

fn explain(bytes: &[u8], error: prost::DecodeError) -> Status {
    if let Ok(raw) = RawRequest::decode(bytes)
        && let Some(field) = raw.first_invalid_utf8()
    {
        return Status::invalid_argument(format!("{field}: not valid UTF-8"));
    }
    Status::invalid_argument(format!(
        "message: not a valid envoy.service.ratelimit.v3.RateLimitRequest ({error})"
    ))
}

/// `RateLimitRequest` with its string fields as bytes and every other field skipped, so it
/// decodes wherever [`WireRequest`] fails on UTF-8 alone and shows where.
#[derive(Clone, PartialEq, Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
}

#[derive(Clone, PartialEq, Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
}

impl RawRequest {
    fn first_invalid_utf8(&self) -> Option<String> {
        let bad = |b: &[u8]| std::str::from_utf8(b).is_err();
        if bad(&self.domain) {
            return Some("domain".into());
        }
        for (i, d) in self.descriptors.iter().enumerate() {
            for (j, e) in d.entries.iter().enumerate() {
                if bad(&e.key) {
                    return Some(format!("descriptors[{i}].entries[{j}].key"));
                }
            }
        }
        None
    }
}

/// A request whose encoding is larger than `max` bytes: INVALID_ARGUMENT naming the message, the
/// same answer as every other size bound.
pub fn check_encoded_len(len: usize, max: usize) -> Result<(), Status> {
    if len > max {
        return Err(Status::invalid_argument(format!(
            "message: {len} bytes exceed the limit of {max}"
        )));
    }
    Ok(())
}

/// Told of each message refused for its size, before decoding: (encoded length, bound).
pub type OversizeHook = std::sync::Arc<dyn Fn(usize, usize) + Send + Sync>;

/// The codec of `ShouldRateLimit`: prost encoding; decoding refuses a message over
/// `max_message_bytes` (encoded, unknown fields included), telling `on_oversize`, then
/// [`decode_request`].
#[derive(Clone)]
pub struct StrictCodec {
    pub max_message_bytes: usize,
    pub on_oversize: Option<OversizeHook>,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ResponseEncoder;

#[derive(Clone)]
pub struct RequestDecoder {
    max_message_bytes: usize,
    on_oversize: Option<OversizeHook>,
}

impl Codec for StrictCodec {
    type Encode = RateLimitResponse;
    type Decode = WireRequest;
    type Encoder = ResponseEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> ResponseEncoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder {
            max_message_bytes: self.max_message_bytes,
            on_oversize: self.on_oversize.clone(),
        }
    }
}

impl Encoder for ResponseEncoder {
    type Item = RateLimitResponse;
    type Error = Status;

    fn encode(&mut self, item: RateLimitResponse, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::new(Code::Internal, format!("encoding the response: {e}")))
    }
}

impl Decoder for RequestDecoder {
    type Item = WireRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<WireRequest>, Status> {
        let len = src.remaining();
        if let Err(status) = check_encoded_len(len, self.max_message_bytes) {
            src.advance(len);
            if let Some(hook) = &self.on_oversize {
                hook(len, self.max_message_bytes);
            }
            return Err(status);
        }
        // tonic hands over one message in one contiguous buffer; copy only if it ever does not.
        let decoded = if src.chunk().len() == len {
            decode_request(src.chunk())
        } else {
            decode_request(&src.copy_to_bytes(len))
        };
        src.advance(src.remaining());
        decoded.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    use super::*;

    fn request() -> RateLimitRequest {
        let entry = |k: &str, v: &str| Entry {
            key: k.into(),
            value: v.into(),
        };
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![entry("tenant", "acme")],
                    ..Default::default()
                },
                RateLimitDescriptor {
                    entries: vec![entry("tenant", "globex"), entry("route", "VALUE")],
                    hits_addend: Some(UInt64Value { value: 3 }),
                    is_negative_hits: true,
                    ..Default::default()
                },
            ],
            hits_addend: 7,
        }
    }

    /// The encoded request with the first occurrence of `needle` replaced by `with` (same length).
    fn patched(needle: &[u8], with: &[u8]) -> Vec<u8> {
        assert_eq!(needle.len(), with.len());
        let mut bytes = request().encode_to_vec();
        let at = bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("needle present");
        bytes[at..at + with.len()].copy_from_slice(with);
        bytes
    }

    fn message_of(bytes: &[u8]) -> String {
        let status = decode_request(bytes).expect_err("rejected");
        assert_eq!(status.code(), Code::InvalidArgument);
        status.message().to_string()
    }

    #[test]
    fn valid_requests_decode_unchanged() {
        assert_eq!(
            decode_request(&request().encode_to_vec()).unwrap(),
            WireRequest::from(request())
        );
        assert_eq!(decode_request(&[]).unwrap(), WireRequest::default());
        assert_eq!(
            WireRequest::from(request()).encode_to_vec(),
            request().encode_to_vec(),
            "the same message on the wire"
        );
    }

    #[test]
    fn values_are_bytes() {
        let decoded = decode_request(&patched(b"acme", b"\xc3\x28m\xff")).unwrap();
        assert_eq!(decoded.descriptors[0].entries[0].value, b"\xc3\x28m\xff");
        let decoded = decode_request(&patched(b"VALUE", b"VAL\xf8\x88")).unwrap();
        assert_eq!(decoded.descriptors[1].entries[1].value, b"VAL\xf8\x88");
        assert_eq!(
            decoded.descriptors[1].hits_addend,
            Some(UInt64Value { value: 3 })
        );
        assert!(decoded.descriptors[1].is_negative_hits);
        assert_eq!(decoded.hits_addend, 7);
    }

    #[test]
    fn a_domain_or_key_that_is_not_utf8_names_the_field() {
        assert_eq!(
            message_of(&patched(b"edge", b"ed\xffe")),
            "domain: not valid UTF-8"
        );
        assert_eq!(
            message_of(&patched(b"route", b"ro\xed\xa0\x80")),
            "descriptors[1].entries[1].key: not valid UTF-8",
            "an encoded surrogate is not UTF-8"
        );
        assert_eq!(
            message_of(&patched(b"tenant", b"te\xffant")),
            "descriptors[0].entries[0].key: not valid UTF-8"
        );
    }

    #[test]
    fn malformed_protobuf_is_invalid_argument() {
        let mut truncated = request().encode_to_vec();
        truncated.truncate(truncated.len() - 3);
        for bytes in [
            truncated,
            vec![0xff; 8],
            vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f],
        ] {
            let message = message_of(&bytes);
            assert!(message.starts_with("message: not a valid"), "{message}");
        }
    }
}
