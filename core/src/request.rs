//! A rate-limit request after validation at the edge: plain Rust, no protobuf.
//!
//! The service crate builds these from `RateLimitRequest` at its gRPC edge; its limiter decides on them.

use crate::rule::Unit;

/// One `key=value` pair of a descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Entry {
    pub key: String,
    pub value: String,
}

impl Entry {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Entry {
            key: key.into(),
            value: value.into(),
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
    /// Never empty; every key non-empty (checked at the edge).
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
