//! What an untrusted caller of the RLS edge may not decide: request fields only a trusted caller
//! should control (`limit` overrides, `is_negative_hits`) are neutralised before validation.
//! `hits_addend` is bounded for every caller (`--max-hits-addend`, checked with the other request
//! bounds in [`super::validate`]).

use envoy_types::pb::google::protobuf::UInt64Value;

use super::wire::WireRequest;

/// What an untrusted caller may not decide. The default trusts callers fully, as
/// envoyproxy/ratelimit does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallerPolicy {
    /// Drop `RateLimitDescriptor.limit`: a caller cannot pick its own, larger rate (each override
    /// is also a new bucket, so ignoring them also stops bucket creation at will).
    pub ignore_limit_override: bool,
    /// Answer `is_negative_hits` as a refund of zero tokens: the descriptor is reported, nothing
    /// is given back, nothing is taken. A caller cannot refill a bucket it (or others) drained.
    pub ignore_negative_hits: bool,
}

impl CallerPolicy {
    /// Rewrites the fields this policy overrules, before validation: an ignored override is
    /// neither validated nor applied.
    pub fn apply(&self, request: &mut WireRequest) {
        for d in &mut request.descriptors {
            if self.ignore_limit_override {
                d.limit = None;
            }
            if self.ignore_negative_hits && d.is_negative_hits {
                d.hits_addend = Some(UInt64Value { value: 0 });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;

    use super::*;
    use crate::rls::wire::{WireDescriptor, WireEntry};

    fn descriptor(hits: Option<u64>, negative: bool, limit: bool) -> WireDescriptor {
        WireDescriptor {
            entries: vec![WireEntry {
                key: "k".into(),
                value: b"v".to_vec(),
            }],
            limit: limit.then_some(RateLimitOverride {
                requests_per_unit: 1_000_000,
                unit: 1,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        }
    }

    fn request(hits_addend: u32, descriptors: Vec<WireDescriptor>) -> WireRequest {
        WireRequest {
            domain: "d".into(),
            descriptors,
            hits_addend,
        }
    }

    #[test]
    fn default_policy_changes_nothing() {
        let original = request(
            u32::MAX,
            vec![
                descriptor(Some(u64::MAX), true, true),
                descriptor(None, false, false),
            ],
        );
        let mut r = original.clone();
        CallerPolicy::default().apply(&mut r);
        assert_eq!(r, original);
    }

    #[test]
    fn each_rule_of_the_policy() {
        let original = request(
            u32::MAX,
            vec![
                descriptor(Some(u64::MAX), false, true),
                descriptor(Some(5), true, false),
                descriptor(None, true, false),
                descriptor(Some(0), false, false),
            ],
        );

        let mut r = original.clone();
        CallerPolicy {
            ignore_limit_override: true,
            ..Default::default()
        }
        .apply(&mut r);
        assert!(r.descriptors.iter().all(|d| d.limit.is_none()));
        assert_eq!(r.hits_addend, u32::MAX);

        let mut r = original.clone();
        CallerPolicy {
            ignore_negative_hits: true,
            ..Default::default()
        }
        .apply(&mut r);
        let hits: Vec<_> = r
            .descriptors
            .iter()
            .map(|d| d.hits_addend.as_ref().map(|h| h.value))
            .collect();
        assert_eq!(hits, [Some(u64::MAX), Some(0), Some(0), Some(0)]);
    }
}
