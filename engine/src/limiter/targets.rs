//! Descriptor → target: the rule (or request override) a descriptor reaches, the limit it
//! reports, the bucket shape and key tag it is judged by (one shard of a sharded rule), and its
//! failure policy — or its final status when no bucket is involved (no rule, `unlimited`, a
//! replaced rule, or a blocking `requests_per_unit: 0` rule or override).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::algorithm::{Algorithm, BucketParams};
use crate::clock::Clock;
use crate::config::Domain;
use crate::key::RuleTag;
use crate::request::{LimitOverride, RequestDescriptor};
use crate::rule::{Charge, FailureMode, Limit, RateLimit, Rule};

use super::{Basis, Status};

/// What one descriptor resolved to before the backend is asked.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) rule: Option<Arc<Rule>>,
    /// The limit reported (`current_limit`, `x-ratelimit-limit`): the rule's or the override's.
    pub(super) rate: RateLimit,
    /// The shape the bucket is decided with: `rate`'s, or one shard's share of it.
    pub(super) params: BucketParams,
    /// Which bucket of the descriptor the storage key names: the rule's, the shard of a sharded
    /// rule this request is judged by, or an override's.
    pub(super) tag: RuleTag,
    /// The rule's algorithm; for an override without a rule, the domain's.
    pub(super) algorithm: Algorithm,
    pub(super) name: Option<Arc<str>>,
    pub(super) shadow: bool,
    /// A quota-mode descriptor: the rule's `quota_mode`, or `--quota-mode` for an override.
    pub(super) quota: bool,
    pub(super) failure_mode: FailureMode,
    /// Its hits are counted whatever the answer (`charge: always`): the rule's charge, else the
    /// domain's (an override without a rule).
    pub(super) always: bool,
}

/// Resolves the descriptors of one request, which share what their rules replace and one shard
/// draw.
pub(super) struct Resolver<'a> {
    domain: &'a Domain,
    /// Names replaced by some rule reached in the request (envoyproxy/ratelimit's `replaces`).
    replaced: Vec<Arc<str>>,
    shard_seq: u64,
    default_failure_mode: FailureMode,
    /// `--quota-mode`: descriptors no rule limits are quota descriptors too.
    quota_all: bool,
    /// The limiter's clock, read only for a blocked rule or override (where its unit resets).
    clock: &'a dyn Clock,
}

impl<'a> Resolver<'a> {
    /// The resolver for a request whose descriptors reach `rules` (in request order). Advances
    /// `cursor` when one of them is sharded: one draw per request, shared by all its
    /// descriptors, so duplicates of one sharded descriptor land on one shard, hence one key,
    /// and are paid together.
    pub(super) fn new(
        domain: &'a Domain,
        rules: &[Option<Arc<Rule>>],
        cursor: &AtomicU64,
        (default_failure_mode, quota_all): (FailureMode, bool),
        clock: &'a dyn Clock,
    ) -> Self {
        let replaced = rules
            .iter()
            .flatten()
            .flat_map(|r| r.replaces.iter().cloned())
            .collect();
        let shard_seq = if rules.iter().flatten().any(|r| r.shards.is_some()) {
            cursor.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };
        Resolver {
            domain,
            replaced,
            shard_seq,
            default_failure_mode,
            quota_all,
            clock,
        }
    }

    /// The bucket `descriptor` uses, having reached `rule`, or its final status when no bucket
    /// is involved.
    pub(super) fn target(
        &self,
        descriptor: &RequestDescriptor,
        rule: Option<Arc<Rule>>,
    ) -> Result<Target, Status> {
        // No entries: Envoy sends this when `skip_if_absent` dropped every action of a rate
        // limit. It names nothing, so it is answered OK with no limit whatever override it
        // carries (as envoyproxy/ratelimit answers it), and it is no quota descriptor, so the
        // request's other descriptors are decided as if it were absent.
        if descriptor.entries.is_empty() {
            return Err(Status::unlimited(Basis::NoRule, None));
        }
        let failure_mode = rule
            .as_ref()
            .and_then(|r| r.failure_mode)
            .or(self.domain.failure_mode)
            .unwrap_or(self.default_failure_mode);
        if let Some(o) = descriptor.limit_override {
            return self.overridden(o, rule, failure_mode);
        }
        // envoyproxy/ratelimit's global quota mode counts a descriptor without a limit as a quota
        // descriptor under its limit (an `unlimited` rule's is not counted at all).
        let no_rule = Status {
            quota: self.quota_all,
            ..Status::unlimited(Basis::NoRule, None)
        };
        let Some(rule) = rule else {
            return Err(no_rule);
        };
        if let Some(name) = &rule.name
            && self.replaced.iter().any(|r| r == name)
        {
            // Dropped as envoyproxy/ratelimit drops it: no limit, 0 remaining, no metadata.
            return Err(no_rule);
        }
        let rate = match rule.limit {
            Limit::Unlimited => return Err(Status::unlimited(Basis::Unlimited, Some(rule))),
            Limit::Blocked { unit } => {
                let name = rule.name.clone();
                return Err(Status::blocked(rule, unit, name, self.clock.now_ms()));
            }
            Limit::Bucket(rate) => rate,
        };
        // Overrides (above) are never sharded: they name a limit of their own.
        let (params, tag) = match rule.shards {
            Some(n) => {
                let shard = shard_of(self.shard_seq, n);
                (rate.split(n).bucket(), RuleTag::Shard(shard))
            }
            None => (
                held_for(Some(&rule), rate.bucket()),
                RuleTag::configured(&rule),
            ),
        };
        Ok(Target {
            name: rule.name.clone(),
            shadow: rule.shadow_mode,
            quota: rule.quota_mode,
            rate,
            params,
            tag,
            algorithm: rule.algorithm,
            failure_mode,
            always: rule.charge == Charge::Always,
            rule: Some(rule),
        })
    }
}

impl Resolver<'_> {
    /// The target of a descriptor carrying its own `limit` (`o`), whatever rule it reached.
    fn overridden(
        &self,
        o: LimitOverride,
        rule: Option<Arc<Rule>>,
        failure_mode: FailureMode,
    ) -> Result<Target, Status> {
        if o.requests_per_unit == 0 {
            return Err(Status {
                quota: self.quota_all,
                ..Status::blocked_by_override(rule, o.unit, self.clock.now_ms())
            });
        }
        // As in envoyproxy/ratelimit: an override needs only a known domain, carries no name and
        // is never in shadow mode, nor in quota mode but under `--quota-mode`; the matched rule
        // still prices the hit (cost) and chooses the algorithm.
        let rate = RateLimit {
            requests_per_unit: o.requests_per_unit,
            unit: o.unit,
            unit_multiplier: 1,
            burst: None,
        };
        let charge = rule.as_ref().map_or(self.domain.charge, |r| r.charge);
        Ok(Target {
            algorithm: rule.as_ref().map_or(self.domain.algorithm, |r| r.algorithm),
            always: charge == Charge::Always,
            params: held_for(rule.as_deref(), rate.bucket()),
            rule,
            rate,
            tag: RuleTag::Override(o),
            name: None,
            shadow: false,
            quota: self.quota_all,
            failure_mode,
        })
    }
}

/// An in-flight cap's shape: `capacity` slots (the limit's `requests_per_unit`), each held at
/// most `max_hold` (carried as `unit_ms`, see [`crate::algorithm::in_flight`]).
fn held_for(rule: Option<&Rule>, mut params: BucketParams) -> BucketParams {
    if let Some(cap) = rule.and_then(|r| r.in_flight.as_ref()) {
        params.unit_ms = cap.max_hold_ms;
    }
    params
}

/// 2^64 / φ: multiplying by it scatters consecutive counts evenly over the unit interval
/// (Fibonacci hashing; the Weyl sequence `k / φ mod 1` has the lowest discrepancy known).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// The shard (`< shards`) of the request numbered `seq`: the top bits of `seq / φ mod 1`, scaled
/// to `shards`. Any run of consecutive numbers — and any arithmetic progression, such as the
/// requests of one rule interleaved with another's — is spread nearly evenly, so the shards of a
/// hot key drain together.
pub fn shard_of(seq: u64, shards: u32) -> u8 {
    let fraction = seq.wrapping_mul(GOLDEN) >> 32;
    ((fraction * u64::from(shards.max(1))) >> 32) as u8
}
