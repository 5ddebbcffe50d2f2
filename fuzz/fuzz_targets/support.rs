#![allow(dead_code)] // each target uses part of this module
//! Shared by the decision and wire targets: a limiter on the memory backend with a manual clock
//! over the example configs, and the checks every decision must pass.

use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use sluice::backend::memory::{MemoryBackend, MemoryOptions};
use sluice::clock::ManualClock;
use sluice::config::{Config, load_sources};
use sluice::limiter::{Code, Limiter, LimiterOptions};
use sluice::rls::caller::CallerPolicy;
use sluice::rls::wire::WireRequest;
use sluice::rls::{HeaderOptions, RequestBounds, to_limit_request, to_response};

const MAX_BUCKETS: usize = 64;

fn config() -> Arc<ArcSwap<Config>> {
    static CONFIG: OnceLock<Arc<ArcSwap<Config>>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let sources = [
                ("edge.yaml", include_str!("../../config/edge.yaml")),
                ("internal.yaml", include_str!("../../config/internal.yaml")),
            ]
            .map(|(n, t)| (n.to_string(), t.to_string()));
            let config = load_sources(&sources).expect("the example configs load");
            Arc::new(ArcSwap::from_pointee(config))
        })
        .clone()
}

#[derive(Arbitrary, Debug, Default, Clone, Copy)]
pub struct Policy {
    ignore_limit_override: bool,
    ignore_negative_hits: bool,
    max_hits_addend: Option<u64>,
}

/// Words that reach rules of the example configs, so matching goes deep; or free text.
#[derive(Arbitrary, Debug)]
pub enum Word {
    Known(u8),
    Free(String),
}

const VOCABULARY: &[&str] = &[
    "tenant",
    "route",
    "export",
    "login",
    "internal-billing",
    "remote_address",
    "plan",
    "free",
    "acme",
    "10.0.0.1",
    "service",
    "api",
    "internal",
    "",
    "*",
    "{",
    "}",
    "|",
    "=",
    "%",
];

impl Word {
    fn text(&self) -> String {
        match self {
            Word::Known(i) => VOCABULARY[usize::from(*i) % VOCABULARY.len()].to_string(),
            Word::Free(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
pub enum DomainChoice {
    Edge,
    Internal,
    Other(String),
}

#[derive(Arbitrary, Debug)]
pub struct FuzzDescriptor {
    entries: Vec<(Word, Word)>,
    limit: Option<(u32, i32)>,
    hits_addend: Option<u64>,
    is_negative_hits: bool,
}

#[derive(Arbitrary, Debug)]
pub struct FuzzRequest {
    domain: DomainChoice,
    descriptors: Vec<FuzzDescriptor>,
    hits_addend: u32,
}

pub fn to_proto(r: &FuzzRequest) -> RateLimitRequest {
    RateLimitRequest {
        domain: match &r.domain {
            DomainChoice::Edge => "edge".into(),
            DomainChoice::Internal => "internal".into(),
            DomainChoice::Other(s) => s.clone(),
        },
        descriptors: r
            .descriptors
            .iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: k.text(),
                        value: v.text(),
                    })
                    .collect(),
                limit: d.limit.map(|(n, u)| RateLimitOverride {
                    requests_per_unit: n,
                    unit: u,
                }),
                hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                is_negative_hits: d.is_negative_hits,
            })
            .collect(),
        hits_addend: r.hits_addend,
    }
}

pub struct Harness {
    pub clock: ManualClock,
    backend: Arc<MemoryBackend>,
    limiter: Limiter<Arc<MemoryBackend>>,
    bounds: RequestBounds,
}

impl Harness {
    pub fn new(policy: Policy) -> Harness {
        let clock = ManualClock::new(1_000_000);
        let backend = Arc::new(MemoryBackend::new(
            Arc::new(clock.clone()),
            MemoryOptions {
                max_buckets: MAX_BUCKETS,
                shards: 4,
                max_buckets_per_rule: Some(16),
            },
        ));
        let limiter = Limiter::new(config(), backend.clone(), LimiterOptions::default());
        let bounds = RequestBounds {
            policy: CallerPolicy {
                ignore_limit_override: policy.ignore_limit_override,
                ignore_negative_hits: policy.ignore_negative_hits,
            },
            max_hits_addend: policy
                .max_hits_addend
                .filter(|&n| n > 0)
                .unwrap_or(RequestBounds::default().max_hits_addend),
            ..RequestBounds::default()
        };
        Harness {
            clock,
            backend,
            limiter,
            bounds,
        }
    }

    /// One request end to end, with every invariant checked.
    pub fn run(&self, request: impl Into<WireRequest>) {
        let limit_request = match to_limit_request(request, &self.bounds) {
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                let field = status.message().split(':').next().unwrap_or_default();
                assert!(
                    field == "message"
                        || field == "domain"
                        || field == "hits_addend"
                        || field.starts_with("descriptors"),
                    "{status:?}"
                );
                return;
            }
            Ok(r) => r,
        };
        let b = &self.bounds;
        assert!(!limit_request.domain.is_empty());
        assert!(!limit_request.descriptors.is_empty());
        assert!(limit_request.descriptors.len() <= b.max_descriptors);
        for d in &limit_request.descriptors {
            assert!(d.entries.len() <= b.max_entries);
            for e in &d.entries {
                assert!(!e.key.is_empty() && e.key.len() <= b.max_key_bytes);
            }
            if b.policy.ignore_limit_override {
                assert!(d.limit_override.is_none());
            }
            assert!(d.hits_addend.is_none_or(|h| h <= b.max_hits_addend));
            assert!(limit_request.hits_addend <= b.max_hits_addend);
            if b.policy.ignore_negative_hits && d.is_negative_hits {
                assert_eq!(d.hits_addend, Some(0));
            }
        }

        let decision = futures::executor::block_on(self.limiter.decide(&limit_request))
            .expect("the memory backend always answers");
        assert_eq!(decision.statuses.len(), limit_request.descriptors.len());
        let any_over = decision.statuses.iter().any(|s| s.code == Code::OverLimit);
        assert_eq!(decision.overall == Code::OverLimit, any_over);
        for (status, d) in decision.statuses.iter().zip(&limit_request.descriptors) {
            if d.entries.is_empty() {
                assert!(status.code == Code::Ok && status.limit.is_none(), "{status:?}");
            }
            if let Some(limit) = &status.limit {
                assert!(status.remaining <= limit.capacity, "{status:?}");
                if !status.over {
                    assert_eq!(status.retry_after_ms, None);
                }
            }
            if status.shadow {
                assert_eq!(status.code, Code::Ok);
            }
        }
        let response = to_response(&decision, &HeaderOptions::default());
        assert_eq!(response.statuses.len(), decision.statuses.len());
        for h in &response.response_headers_to_add {
            assert!(!h.value.is_empty() && h.value.is_ascii(), "{h:?}");
        }
        assert!(self.backend.live_buckets() <= MAX_BUCKETS);
    }
}
