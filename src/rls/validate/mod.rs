//! What a decoded `ShouldRateLimit` request must be to be decided: the bounds, the caller policy
//! and each field, into a plain [`LimitRequest`].
//!
//! Under Envoy's default `failure_mode_deny: false` every error is an allow, so a request is
//! refused only for what no Envoy request contains (an empty domain or key, no descriptors) or
//! for a shape that comes from the operator's route configuration, not from clients (more
//! descriptors, entries or key bytes than the bounds, a message over `--max-message-bytes`): the
//! latter are [`Problem`]s, logged at WARN once per cause and counted, so an operator can alert
//! on them. What a client controls — descriptor values — is always decided: values are bytes of
//! any length, and a descriptor with no entries (Envoy's `skip_if_absent`) is answered OK with no
//! limit. [`crate::rls`] maps [`RequestError`] to a gRPC status.

use crate::request::{Entry, LimitOverride, LimitRequest, RequestDescriptor};
use crate::rls::caller::CallerPolicy;
use crate::rls::wire::{WireDescriptor, WireEntry, WireRequest};
use crate::rule::Unit;

/// Size bounds on incoming requests; past them a request is refused ([`RequestError`]).
#[derive(Clone, Debug)]
pub struct RequestBounds {
    pub max_message_bytes: usize,
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    /// Largest `hits_addend` honoured, request- or descriptor-level (`--max-hits-addend`); a
    /// larger one counts as this.
    pub max_hits_addend: u64,
    /// What untrusted callers may not decide (applied before validation).
    pub policy: CallerPolicy,
}

impl RequestBounds {
    pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
    pub const DEFAULT_MAX_DESCRIPTORS: usize = 64;
    pub const DEFAULT_MAX_ENTRIES: usize = 32;
    pub const DEFAULT_MAX_KEY_BYTES: usize = 256;
    /// The range of Envoy's own request-level `hits_addend` (uint32).
    pub const DEFAULT_MAX_HITS_ADDEND: u64 = u32::MAX as u64;
}

impl Default for RequestBounds {
    /// Every bound at its default; callers trusted.
    fn default() -> Self {
        RequestBounds {
            max_message_bytes: Self::DEFAULT_MAX_MESSAGE_BYTES,
            max_descriptors: Self::DEFAULT_MAX_DESCRIPTORS,
            max_entries: Self::DEFAULT_MAX_ENTRIES,
            max_key_bytes: Self::DEFAULT_MAX_KEY_BYTES,
            max_hits_addend: Self::DEFAULT_MAX_HITS_ADDEND,
            policy: CallerPolicy::default(),
        }
    }
}

/// Why a request cannot be decided. Each message names the offending field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("message: {len} bytes exceed the limit of {max}")]
    MessageBytes { len: usize, max: usize },
    #[error("domain: must not be empty")]
    EmptyDomain,
    #[error("descriptors: at least one descriptor is required")]
    NoDescriptors,
    #[error("descriptors: {count} descriptors exceed the limit of {max}")]
    Descriptors { count: usize, max: usize },
    #[error("descriptors[{i}].entries: {count} entries exceed the limit of {max}")]
    Entries { i: usize, count: usize, max: usize },
    #[error("descriptors[{i}].entries[{j}].key: must not be empty")]
    EmptyKey { i: usize, j: usize },
    #[error("descriptors[{i}].entries[{j}].key: {len} bytes exceed the limit of {max}")]
    KeyBytes {
        i: usize,
        j: usize,
        len: usize,
        max: usize,
    },
}

impl RequestError {
    /// The operator-side cause, when a real Envoy can send such a request: its route
    /// configuration (how many rate limits and actions, descriptor key names) or its header
    /// sizes decide it, not a client. `None` for what only a non-Envoy caller sends.
    pub fn problem(&self) -> Option<Problem> {
        match self {
            RequestError::MessageBytes { .. } => Some(Problem::MessageBytes),
            RequestError::Descriptors { .. } => Some(Problem::Descriptors),
            RequestError::Entries { .. } => Some(Problem::Entries),
            RequestError::KeyBytes { .. } => Some(Problem::KeyBytes),
            RequestError::EmptyDomain
            | RequestError::NoDescriptors
            | RequestError::EmptyKey { .. } => None,
        }
    }
}

/// A request Envoy can send that sluice does not decide as sent: refused past a bound, or decided
/// without its `limit` override. The `problem` label of `sluice_request_problems_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Over `--max-message-bytes` (refused).
    MessageBytes,
    /// Over `--max-descriptors` (refused).
    Descriptors,
    /// Over `--max-entries` (refused).
    Entries,
    /// A key over `--max-key-bytes` (refused).
    KeyBytes,
    /// A `limit` override with unit UNKNOWN or unrecognised: decided by the configured rule.
    OverrideUnit,
}

impl Problem {
    pub const ALL: [Problem; 5] = [
        Problem::MessageBytes,
        Problem::Descriptors,
        Problem::Entries,
        Problem::KeyBytes,
        Problem::OverrideUnit,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Problem::MessageBytes => "message_bytes",
            Problem::Descriptors => "descriptors",
            Problem::Entries => "entries",
            Problem::KeyBytes => "key_bytes",
            Problem::OverrideUnit => "override_unit",
        }
    }

    pub const fn index(self) -> usize {
        self as usize
    }
}

/// A request that can be decided, and what was dropped from it on the way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checked {
    pub request: LimitRequest,
    /// `descriptors[i].limit` overrides dropped for their unit: (descriptor index, unit as sent).
    pub dropped_overrides: Vec<(usize, i32)>,
}

/// Validates a decoded request and converts it: the size bound, the caller policy, then each
/// field.
pub fn check_request(
    mut request: WireRequest,
    bounds: &RequestBounds,
) -> Result<Checked, RequestError> {
    // The codec holds the bound against the bytes as they arrived; this holds it for callers
    // that hand over a decoded message.
    let encoded_len = prost::Message::encoded_len(&request);
    if encoded_len > bounds.max_message_bytes {
        return Err(RequestError::MessageBytes {
            len: encoded_len,
            max: bounds.max_message_bytes,
        });
    }
    bounds.policy.apply(&mut request);
    if request.domain.is_empty() {
        return Err(RequestError::EmptyDomain);
    }
    let count = request.descriptors.len();
    if count == 0 {
        return Err(RequestError::NoDescriptors);
    }
    if count > bounds.max_descriptors {
        let max = bounds.max_descriptors;
        return Err(RequestError::Descriptors { count, max });
    }
    let mut dropped_overrides = Vec::new();
    let mut descriptors = Vec::with_capacity(count);
    for (i, d) in request.descriptors.into_iter().enumerate() {
        let (descriptor, dropped) = to_descriptor(i, d, bounds)?;
        dropped_overrides.extend(dropped.map(|unit| (i, unit)));
        descriptors.push(descriptor);
    }
    let request = LimitRequest {
        domain: request.domain,
        descriptors,
        hits_addend: u64::from(request.hits_addend).min(bounds.max_hits_addend),
    };
    Ok(Checked {
        request,
        dropped_overrides,
    })
}

/// `descriptors[i]`: its entries (none is fine), its `limit` override and its hits; with the unit
/// of an override dropped for it.
fn to_descriptor(
    i: usize,
    d: WireDescriptor,
    bounds: &RequestBounds,
) -> Result<(RequestDescriptor, Option<i32>), RequestError> {
    if d.entries.len() > bounds.max_entries {
        let (count, max) = (d.entries.len(), bounds.max_entries);
        return Err(RequestError::Entries { i, count, max });
    }
    let mut entries = Vec::with_capacity(d.entries.len());
    for (j, e) in d.entries.into_iter().enumerate() {
        entries.push(to_entry(i, j, e, bounds)?);
    }
    // Envoy reads an override's unit by name from dynamic metadata, so `UNKNOWN` can arrive: no
    // rate sluice can apply, but the request is still decided, by the configured rule.
    let (limit_override, dropped) = match d.limit {
        None => (None, None),
        Some(l) => match Unit::from_proto(l.unit) {
            Some(unit) => {
                let requests_per_unit = l.requests_per_unit;
                (
                    Some(LimitOverride {
                        requests_per_unit,
                        unit,
                    }),
                    None,
                )
            }
            None => (None, Some(l.unit)),
        },
    };
    let descriptor = RequestDescriptor {
        entries,
        limit_override,
        // Clamped, not refused: a refusal is an error Envoy lets through by default
        // (`failure_mode_deny: false`), so a huge count must stay a decision (OVER_LIMIT).
        hits_addend: d.hits_addend.map(|h| h.value.min(bounds.max_hits_addend)),
        is_negative_hits: d.is_negative_hits,
    };
    Ok((descriptor, dropped))
}

/// `descriptors[i].entries[j]`: a non-empty key within its byte bound; the value as sent, any
/// bytes, any length (`--max-message-bytes` bounds it with the rest of the message).
fn to_entry(
    i: usize,
    j: usize,
    e: WireEntry,
    bounds: &RequestBounds,
) -> Result<Entry, RequestError> {
    if e.key.is_empty() {
        return Err(RequestError::EmptyKey { i, j });
    }
    if e.key.len() > bounds.max_key_bytes {
        let (len, max) = (e.key.len(), bounds.max_key_bytes);
        return Err(RequestError::KeyBytes { i, j, len, max });
    }
    Ok(Entry::new(e.key, e.value))
}

#[cfg(test)]
mod tests;
