//! The strict wire decoding of `RateLimitRequest`: the codec [`crate::service::RateLimitServer`]
//! serves `ShouldRateLimit` with.
//!
//! tonic's prost codec answers any decode failure with INTERNAL, which blames the server for the
//! caller's bytes — typically invalid UTF-8 in a string field, since Envoy copies header values
//! into descriptor values. [`StrictCodec`] answers INVALID_ARGUMENT and names the field the way
//! [`crate::service::to_limit_request`] does (`descriptors[2].entries[0].value: not valid
//! UTF-8`). Encoding is prost's.
//!
//! The codec also holds `--max-message-bytes` against the encoded message as it arrived, before
//! decoding: unknown fields are bytes too, and prost skips them, so the decoded request's size
//! says nothing about what the caller sent.

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use prost::bytes::Buf;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

/// gRPC path of the one method.
pub const SHOULD_RATE_LIMIT_PATH: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Decodes a `RateLimitRequest`; a malformed one is INVALID_ARGUMENT naming the first field that
/// is not valid UTF-8, or saying why the bytes are not a `RateLimitRequest` at all.
pub fn decode_request(bytes: &[u8]) -> Result<RateLimitRequest, Status> {
    RateLimitRequest::decode(bytes).map_err(|error| explain(bytes, error))
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
/// decodes wherever the real message fails on UTF-8 alone and shows where.
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
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
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
                if bad(&e.value) {
                    return Some(format!("descriptors[{i}].entries[{j}].value"));
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

/// The codec of `ShouldRateLimit`: prost encoding; decoding refuses a message over
/// `max_message_bytes` (encoded, unknown fields included), then [`decode_request`].
#[derive(Clone, Copy, Debug)]
pub struct StrictCodec {
    pub max_message_bytes: usize,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct ResponseEncoder;

#[derive(Clone, Copy, Debug)]
pub struct RequestDecoder {
    max_message_bytes: usize,
}

impl Codec for StrictCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ResponseEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> ResponseEncoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder {
            max_message_bytes: self.max_message_bytes,
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
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<RateLimitRequest>, Status> {
        let len = src.remaining();
        if let Err(status) = check_encoded_len(len, self.max_message_bytes) {
            src.advance(len);
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
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
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
                    hits_addend: Some(envoy_types::pb::google::protobuf::UInt64Value { value: 3 }),
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
            request()
        );
        assert_eq!(decode_request(&[]).unwrap(), RateLimitRequest::default());
    }

    #[test]
    fn invalid_utf8_names_the_field() {
        assert_eq!(
            message_of(&patched(b"edge", b"ed\xffe")),
            "domain: not valid UTF-8"
        );
        assert_eq!(
            message_of(&patched(b"acme", b"\xc3\x28me")),
            "descriptors[0].entries[0].value: not valid UTF-8"
        );
        assert_eq!(
            message_of(&patched(b"route", b"ro\xed\xa0\x80")),
            "descriptors[1].entries[1].key: not valid UTF-8",
            "an encoded surrogate is not UTF-8"
        );
        assert_eq!(
            message_of(&patched(b"VALUE", b"VAL\xf8\x88")),
            "descriptors[1].entries[1].value: not valid UTF-8"
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
