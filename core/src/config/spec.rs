//! The checked model of one file: every field known good, what `compile` builds rules from.

use super::raw::Sp;
use super::yaml::Pos;
use crate::algorithm::Algorithm;
use crate::rule::{Charge, FailureMode, InFlightRule, Limit};

/// One domain whose every field is known good.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DomainSpec {
    pub name: Sp<String>,
    pub failure_mode: Option<FailureMode>,
    /// The domain's default algorithm, where its value is written.
    pub algorithm: Option<Sp<Algorithm>>,
    /// The domain's default `charge`, where its value is written.
    pub charge: Option<Sp<Charge>>,
    pub descriptors: Vec<DescriptorSpec>,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DescriptorSpec {
    pub at: Pos,
    pub key: String,
    /// `None` for a bare key; an empty `value: ""` counts as none, as in envoyproxy/ratelimit.
    pub value: Option<String>,
    pub rule: Option<RuleSpec>,
    pub children: Vec<DescriptorSpec>,
    /// `share_threshold`: every value this wildcard matches shares one bucket.
    pub share_threshold: bool,
    /// `value_to_metric`: the request's value, not the pattern, names this level in metrics.
    pub value_to_metric: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RuleSpec {
    pub limit: Limit,
    pub name: Option<String>,
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    /// envoyproxy/ratelimit's `quota_mode`.
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// envoyproxy/ratelimit's `metadata` of the descriptor holding the rule.
    pub metadata: Option<serde_json::Value>,
    pub cost: u64,
    /// The descriptor's own `charge`, where its value is written.
    pub charge: Option<Sp<Charge>>,
    pub failure_mode: Option<FailureMode>,
    /// The rule's own `rate_limit.algorithm`, where its value is written.
    pub algorithm: Option<Sp<Algorithm>>,
    /// Where `burst` is written, if it is: whether it means anything depends on the algorithm,
    /// known only once the domain (and, when merging, its other files) has been read.
    pub burst_at: Option<Pos>,
    /// `rate_limit.lease`, checked against the bucket's capacity here and against the algorithm
    /// with `burst`.
    pub lease: Option<u64>,
    pub lease_at: Option<Pos>,
    /// `rate_limit.shards`, checked against the rate, burst, lease and cost here; it applies to
    /// every algorithm.
    pub shards: Option<u32>,
    /// `in_flight`: the rule caps requests in flight.
    pub in_flight: Option<InFlightRule>,
    /// `reserve`: a holder's first call reserves its hits, its next one settles them.
    pub reserve: Option<InFlightRule>,
    /// Where `reserve` is written: whether it applies depends on the algorithm.
    pub reserve_at: Option<Pos>,
    /// A limit of a `rate_limits` list: its window in seconds, which tags its storage key so
    /// each limit keeps its own state (and keeps it when another limit is added or removed).
    /// `None` for a `rate_limit`.
    pub window_tag: Option<u64>,
    /// The other limits of a `rate_limits` list, after this first one.
    pub also: Vec<RuleSpec>,
}

impl RuleSpec {
    /// This limit and the others of its `rate_limits` list.
    pub fn limits(&self) -> impl Iterator<Item = &RuleSpec> {
        std::iter::once(self).chain(self.also.iter())
    }
}

impl DescriptorSpec {
    /// Every limit this descriptor defines: none, its `rate_limit`, or its `rate_limits`.
    pub fn limits(&self) -> impl Iterator<Item = &RuleSpec> {
        self.rule.iter().flat_map(RuleSpec::limits)
    }
}
