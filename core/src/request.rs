//! A rate-limit request after validation at the edge: plain Rust, no protobuf.
//!
//! The service crate builds these from `RateLimitRequest` at its gRPC edge; its limiter decides on them.

use crate::rule::Unit;

/// One `key=value` pair of a descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub key: String,
    pub value: Value,
}

impl Entry {
    pub fn new(key: impl Into<String>, value: impl Into<Value>) -> Self {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A descriptor entry's value: bytes. Envoy copies header values unchanged into descriptor
/// values, and a header value may hold obs-text (0x80–0xFF), which is not UTF-8; such a value is
/// decided like any other. Values that are UTF-8 (nearly all) are held as text, so
/// [`Value::as_str`] costs nothing.
///
/// Equality, ordering and hashing are the bytes'. `Display` writes UTF-8 text as is and each byte
/// of a non-UTF-8 value that is not part of a UTF-8 sequence as `\xNN`: readable and safe for
/// logs, labels and JSON, but lossy (the text `\xFF` and the byte 0xFF look alike), so it never
/// names a bucket — storage keys are written from [`Value::as_bytes`].
#[derive(Clone, PartialEq, Eq)]
pub struct Value(Repr);

/// Canonical: `Bytes` never holds valid UTF-8, so derived equality is the bytes' equality.
#[derive(Clone, PartialEq, Eq)]
enum Repr {
    Text(String),
    Bytes(Box<[u8]>),
}

impl Value {
    /// The value as it arrived.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Text(text) => text.as_bytes(),
            Repr::Bytes(bytes) => bytes,
        }
    }

    /// The value as text, when it is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match &self.0 {
            Repr::Text(text) => Some(text),
            Repr::Bytes(_) => None,
        }
    }

    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }

    /// The value as text for display: [`Value::as_str`] when UTF-8, else the escaped rendering
    /// `Display` writes.
    pub fn to_text(&self) -> std::borrow::Cow<'_, str> {
        match &self.0 {
            Repr::Text(text) => text.as_str().into(),
            Repr::Bytes(_) => self.to_string().into(),
        }
    }
}

impl From<String> for Value {
    fn from(text: String) -> Self {
        Value(Repr::Text(text))
    }
}

impl From<&str> for Value {
    fn from(text: &str) -> Self {
        Value(Repr::Text(text.to_owned()))
    }
}

impl From<&String> for Value {
    fn from(text: &String) -> Self {
        Value(Repr::Text(text.clone()))
    }
}

impl From<Vec<u8>> for Value {
    /// No copy: UTF-8 bytes become text in place.
    fn from(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) => Value(Repr::Text(text)),
            Err(e) => Value(Repr::Bytes(e.into_bytes().into_boxed_slice())),
        }
    }
}

impl From<&[u8]> for Value {
    fn from(bytes: &[u8]) -> Self {
        Value::from(bytes.to_vec())
    }
}

impl PartialEq<str> for Value {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for Value {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl std::hash::Hash for Value {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for Value {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Value {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Repr::Text(text) => f.write_str(text),
            Repr::Bytes(bytes) => {
                for chunk in bytes.utf8_chunks() {
                    f.write_str(chunk.valid())?;
                    for b in chunk.invalid() {
                        write!(f, "\\x{b:02X}")?;
                    }
                }
                Ok(())
            }
        }
    }
}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Repr::Text(text) => std::fmt::Debug::fmt(text, f),
            Repr::Bytes(bytes) => write!(f, "b\"{}\"", bytes.escape_ascii()),
        }
    }
}

/// A per-request limit that replaces the configured rate (`RateLimitDescriptor.limit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// One descriptor of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestDescriptor {
    /// Every key non-empty (checked at the edge). Empty when Envoy sent a descriptor with no
    /// entries (`skip_if_absent` on every action): it reaches no rule and is answered OK.
    pub entries: Vec<Entry>,
    pub limit_override: Option<LimitOverride>,
    /// Descriptor-level `hits_addend`, which wins over the request's when present (0 = check only).
    pub hits_addend: Option<u64>,
    /// The hits are given back instead of taken.
    pub is_negative_hits: bool,
}

impl RequestDescriptor {
    pub fn new(entries: Vec<Entry>) -> Self {
        RequestDescriptor {
            entries,
            limit_override: None,
            hits_addend: None,
            is_negative_hits: false,
        }
    }

    /// Hits this descriptor asks for: its own `hits_addend`, else the request's when above 0,
    /// else 1. Tokens taken are these hits times the rule's `cost`.
    pub fn hits(&self, request_hits_addend: u64) -> u64 {
        match self.hits_addend {
            Some(n) => n,
            None if request_hits_addend > 0 => request_hits_addend,
            None => 1,
        }
    }
}

/// A whole `ShouldRateLimit` call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitRequest {
    pub domain: String,
    /// Never empty (checked at the edge).
    pub descriptors: Vec<RequestDescriptor>,
    /// Request-level `hits_addend`; 0 means 1.
    pub hits_addend: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_its_bytes() {
        let text = Value::from("é|x");
        let bytes = Value::from(vec![0xc3, 0xa9, b'|', b'x']);
        assert_eq!(text, bytes, "UTF-8 bytes are the text");
        assert_eq!(bytes.as_str(), Some("é|x"));
        let raw = Value::from(b"a\xff\xc3(".as_slice());
        assert_eq!(raw.as_str(), None);
        assert_eq!(raw.as_bytes(), b"a\xff\xc3(");
        assert_ne!(raw, Value::from("a\u{FFFD}\u{FFFD}("));
        assert_eq!(raw.len(), 4);
        assert!(Value::from("").is_empty());
        let (a, b) = (Value::from("a"), Value::from("b"));
        assert!(a < raw && raw < b, "byte order");
    }

    #[test]
    fn display_escapes_only_what_is_not_utf8() {
        assert_eq!(Value::from("a\\xFF é").to_string(), "a\\xFF é");
        assert_eq!(
            Value::from(b"ab\xff\xc3(\xe2\x82\xac".as_slice()).to_string(),
            "ab\\xFF\\xC3(€"
        );
        assert_eq!(Value::from(b"\xff".as_slice()).to_text(), "\\xFF");
        assert_eq!(
            format!("{:?}", Value::from(b"a\xff".as_slice())),
            r#"b"a\xff""#
        );
        assert_eq!(format!("{:?}", Value::from("a")), r#""a""#);
    }
}
