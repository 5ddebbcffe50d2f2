//! The decision: a validated request → the rules it reaches → one backend call → a [`Decision`].
//!
//! Pure domain logic: no protobuf, no gRPC. [`crate::service`] converts at the edge and maps
//! [`LimitError`] to a gRPC status.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::algorithm::{Algorithm, BucketParams, Demand, Verdict};
use crate::backend::{Backend, BackendError, Hit};
use crate::config::{Config, Domain};
use crate::key::{RuleTag, write_bucket_key};
use crate::request::{LimitRequest, RequestDescriptor};
use crate::rule::{FailureMode, Limit, RateLimit, Rule, RuleId, Unit};

/// The outcome of one descriptor, or of the whole request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status reports (`current_limit` in Envoy's response).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub capacity: u64,
    pub name: Option<Arc<str>>,
}

impl AppliedLimit {
    fn new(rate: &RateLimit, name: Option<Arc<str>>) -> Self {
        AppliedLimit {
            requests_per_unit: rate.requests_per_unit,
            unit: rate.unit,
            capacity: rate.capacity(),
            name,
        }
    }
}

/// How a descriptor was judged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// No rule reached (or the domain is unknown): not limited.
    NoRule,
    /// An `unlimited: true` rule, or a rule replaced by another one in the same request.
    Unlimited,
    /// The shared backend answered.
    Backend,
    /// The backend could not answer; the failure policy decided.
    Degraded(FailureMode),
}

/// One descriptor's answer, in request order.
#[derive(Clone, Debug, PartialEq)]
pub struct Status {
    pub code: Code,
    pub basis: Basis,
    pub limit: Option<AppliedLimit>,
    pub remaining: u64,
    /// ms until the bucket is full again (Envoy's `duration_until_reset`).
    pub reset_ms: u64,
    /// Only when this descriptor's bucket could not pay: ms until it can (`None` = never).
    pub retry_after_ms: Option<Option<u64>>,
    /// A shadow-mode rule: over-limit is reported here but never rejects.
    pub shadow: bool,
    /// The bucket could not pay (also true for shadow rules, whose `code` stays OK).
    pub over: bool,
    /// The rule that decided, for metrics and explain.
    pub rule: Option<Arc<Rule>>,
}

impl Status {
    fn unlimited(basis: Basis, rule: Option<Arc<Rule>>) -> Self {
        Status {
            code: Code::Ok,
            basis,
            limit: None,
            remaining: if basis == Basis::Unlimited {
                u32::MAX as u64
            } else {
                0
            },
            reset_ms: 0,
            retry_after_ms: None,
            shadow: false,
            over: false,
            rule,
        }
    }
}

/// The answer to a whole request.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub overall: Code,
    pub statuses: Vec<Status>,
    pub unknown_domain: bool,
}

impl Decision {
    /// True when a failure policy, not the backend, decided at least one descriptor.
    pub fn degraded(&self) -> bool {
        self.statuses
            .iter()
            .any(|s| matches!(s.basis, Basis::Degraded(_)))
    }
}

/// Why no decision could be made.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    /// The backend failed and the failure policy of some descriptor is `error`.
    #[error("rate-limit backend unavailable: {0}")]
    Unavailable(#[source] BackendError),
}

/// Settings of the decision path that do not come from the descriptor config.
#[derive(Clone, Debug)]
pub struct LimiterOptions {
    /// Prepended to every storage key (contains no `{` or `}`).
    pub key_prefix: String,
    /// Failure mode for rules and domains that set none.
    pub default_failure_mode: FailureMode,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        LimiterOptions {
            key_prefix: "sluice:".to_string(),
            default_failure_mode: FailureMode::Error,
        }
    }
}

/// What one descriptor resolved to before the backend is asked.
struct Target {
    rule: Option<Arc<Rule>>,
    rate: RateLimit,
    /// The rule's algorithm; for an override without a rule, the domain's.
    algorithm: Algorithm,
    name: Option<Arc<str>>,
    shadow: bool,
    failure_mode: FailureMode,
    /// Index into the deduplicated hit list.
    hit: usize,
}

/// Decides requests against the active config and a backend.
pub struct Limiter<B> {
    config: Arc<ArcSwap<Config>>,
    backend: B,
    options: LimiterOptions,
}

impl<B: Backend> Limiter<B> {
    pub fn new(config: Arc<ArcSwap<Config>>, backend: B, options: LimiterOptions) -> Self {
        Limiter {
            config,
            backend,
            options,
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn config(&self) -> &Arc<ArcSwap<Config>> {
        &self.config
    }

    pub fn options(&self) -> &LimiterOptions {
        &self.options
    }

    /// Decides one request. At most one backend call.
    pub async fn decide(&self, request: &LimitRequest) -> Result<Decision, LimitError> {
        let config = self.config.load();
        let Some(domain) = config.domain(&request.domain) else {
            return Ok(Decision {
                overall: Code::Ok,
                statuses: request
                    .descriptors
                    .iter()
                    .map(|_| Status::unlimited(Basis::NoRule, None))
                    .collect(),
                unknown_domain: true,
            });
        };

        let resolved: Vec<Option<Arc<Rule>>> = request
            .descriptors
            .iter()
            .map(|d| domain.find(&d.entries).cloned())
            .collect();
        let replaced = replaced_names(&resolved);

        let mut statuses: Vec<Option<Status>> = Vec::with_capacity(request.descriptors.len());
        let mut targets: Vec<Option<Target>> = Vec::with_capacity(request.descriptors.len());
        let mut hits: Vec<Hit> = Vec::new();
        let mut hit_index: HashMap<String, usize> = HashMap::new();

        for (descriptor, rule) in request.descriptors.iter().zip(resolved) {
            match self.target(domain, descriptor, rule, &replaced) {
                Err(status) => {
                    statuses.push(Some(status));
                    targets.push(None);
                }
                Ok((mut target, tag)) => {
                    let mut key = String::new();
                    write_bucket_key(
                        &mut key,
                        &self.options.key_prefix,
                        &request.domain,
                        &descriptor.entries,
                        tag,
                        target.algorithm,
                    );
                    let cost = target.rule.as_ref().map_or(1, |r| r.cost);
                    let hits_each = match descriptor.hits_addend {
                        Some(n) => n,
                        None if request.hits_addend > 0 => request.hits_addend,
                        None => 1,
                    };
                    let demand = Demand {
                        algorithm: target.algorithm,
                        params: target.rate.bucket(),
                        tokens: hits_each.saturating_mul(cost),
                        refund: descriptor.is_negative_hits,
                        shadow: target.shadow,
                    };
                    let rule = target.rule.as_ref().map(|r| r.id);
                    target.hit = merge_hit(&mut hits, &mut hit_index, key, demand, rule);
                    statuses.push(None);
                    targets.push(Some(target));
                }
            }
        }

        let verdicts = if hits.is_empty() {
            Ok(Vec::new())
        } else {
            self.backend.check(&hits).await
        };

        let statuses: Vec<Status> = match verdicts {
            Ok(verdicts) => statuses
                .into_iter()
                .zip(targets)
                .map(|(status, target)| match (status, target) {
                    (Some(status), _) => status,
                    (None, Some(t)) => from_verdict(t, &verdicts),
                    (None, None) => unreachable!("every descriptor has a status or a target"),
                })
                .collect(),
            Err(error) => {
                if targets
                    .iter()
                    .flatten()
                    .any(|t| t.failure_mode == FailureMode::Error)
                {
                    return Err(LimitError::Unavailable(error));
                }
                statuses
                    .into_iter()
                    .zip(targets)
                    .map(|(status, target)| match (status, target) {
                        (Some(status), _) => status,
                        (None, Some(t)) => degraded(t),
                        (None, None) => unreachable!("every descriptor has a status or a target"),
                    })
                    .collect()
            }
        };

        let overall = if statuses.iter().any(|s| s.code == Code::OverLimit) {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Decision {
            overall,
            statuses,
            unknown_domain: false,
        })
    }

    /// The bucket a descriptor uses, or its final status when no bucket is involved.
    fn target(
        &self,
        domain: &Domain,
        descriptor: &RequestDescriptor,
        rule: Option<Arc<Rule>>,
        replaced: &[Arc<str>],
    ) -> Result<(Target, RuleTag), Status> {
        let failure_mode = rule
            .as_ref()
            .and_then(|r| r.failure_mode)
            .or(domain.failure_mode)
            .unwrap_or(self.options.default_failure_mode);
        if let Some(o) = descriptor.limit_override {
            // As in envoyproxy/ratelimit: an override needs only a known domain, carries no name
            // and is never in shadow mode; the matched rule still prices the hit (cost) and
            // chooses the algorithm.
            let rate = RateLimit {
                requests_per_unit: o.requests_per_unit,
                unit: o.unit,
                burst: None,
            };
            let target = Target {
                algorithm: rule.as_ref().map_or(domain.algorithm, |r| r.algorithm),
                rule,
                rate,
                name: None,
                shadow: false,
                failure_mode,
                hit: 0,
            };
            return Ok((target, RuleTag::Override(o)));
        }
        let Some(rule) = rule else {
            return Err(Status::unlimited(Basis::NoRule, None));
        };
        let rate = match rule.limit {
            Limit::Unlimited => return Err(Status::unlimited(Basis::Unlimited, Some(rule))),
            Limit::Bucket(rate) => rate,
        };
        if let Some(name) = &rule.name
            && replaced.iter().any(|r| r == name)
        {
            return Err(Status::unlimited(Basis::Unlimited, Some(rule)));
        }
        let target = Target {
            name: rule.name.clone(),
            shadow: rule.shadow_mode,
            rate,
            algorithm: rule.algorithm,
            failure_mode,
            rule: Some(rule),
            hit: 0,
        };
        Ok((target, RuleTag::Configured))
    }
}

/// Names replaced by some other rule reached in the same request (envoyproxy/ratelimit's `replaces`).
fn replaced_names(rules: &[Option<Arc<Rule>>]) -> Vec<Arc<str>> {
    rules
        .iter()
        .flatten()
        .flat_map(|r| r.replaces.iter().cloned())
        .collect()
}

/// Adds a hit, or folds it into an earlier hit on the same key: two descriptors of one request
/// that name one bucket must be paid together, or each would see the same tokens and the bucket
/// could go negative. A take and a refund on one key net out.
fn merge_hit(
    hits: &mut Vec<Hit>,
    index: &mut HashMap<String, usize>,
    key: String,
    demand: Demand,
    rule: Option<RuleId>,
) -> usize {
    if let Some(&i) = index.get(&key) {
        let prior = &mut hits[i].demand;
        let signed = |d: &Demand| {
            if d.refund {
                -(d.tokens as i128)
            } else {
                d.tokens as i128
            }
        };
        let net = signed(prior) + signed(&demand);
        prior.refund = net < 0;
        prior.tokens = net.unsigned_abs().min(u64::MAX as u128) as u64;
        prior.shadow &= demand.shadow;
        return i;
    }
    index.insert(key.clone(), hits.len());
    hits.push(Hit { key, demand, rule });
    hits.len() - 1
}

fn from_verdict(target: Target, verdicts: &[Verdict]) -> Status {
    let v = verdicts[target.hit];
    let over = !v.allowed;
    Status {
        code: if over && !target.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        },
        basis: Basis::Backend,
        limit: Some(AppliedLimit::new(&target.rate, target.name)),
        remaining: v.remaining,
        reset_ms: v.until_full_ms,
        retry_after_ms: over.then_some(v.retry_after_ms),
        shadow: target.shadow,
        over,
        rule: target.rule,
    }
}

/// A status decided by the failure policy (`open` or `closed`; `local` arrives with the
/// resilience layer, `error` never gets here).
fn degraded(target: Target) -> Status {
    let BucketParams { capacity, .. } = target.rate.bucket();
    let over = target.failure_mode == FailureMode::Closed;
    Status {
        code: if over && !target.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        },
        basis: Basis::Degraded(target.failure_mode),
        limit: Some(AppliedLimit::new(&target.rate, target.name)),
        remaining: if over { 0 } else { capacity },
        reset_ms: 0,
        retry_after_ms: over.then_some(Some(1_000)),
        shadow: target.shadow,
        over,
        rule: target.rule,
    }
}
