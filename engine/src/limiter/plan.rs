//! The plan of one request: what each descriptor comes to, and one [`Bucket`] per storage key
//! it charges, holding everything about that bucket until the decision (hit, lease reservation,
//! outcome).

use std::collections::HashMap;
use std::sync::Arc;

use crate::algorithm::in_flight::holder_id;
use crate::algorithm::{self, Algorithm, BucketParams, Demand, Verdict};
use crate::backend::{Backend, BackendError, Hit};
use crate::config::Domain;
use crate::holder;
use crate::key::{RuleTag, without_shard, write_shared_bucket_key};
use crate::limiter::lease::Reservation;
use crate::request::{Entry, LimitRequest, RequestDescriptor};
use crate::resilience::over_limit::CachedRejection;
use crate::rule::{FailureMode, Rule};

use super::Limiter;
use super::targets::{Resolver, Target};
use crate::decision::{Code, Status};

/// What became of one bucket.
pub(super) enum Outcome {
    /// Not decided yet: the over-limit cache or the backend will be asked.
    Pending,
    /// The backend decided (or the lease paid: [`super::leasing`]).
    Decided(Verdict),
    /// The backend could not decide.
    Failed(BackendError),
    /// Decided on the local bucket under the `local` policy.
    Local(Verdict),
    /// Rejected from the over-limit cache.
    Cached(CachedRejection),
    /// Not asked: the request is rejected from the cache.
    NotEvaluated,
}

/// One bucket a request charges. Descriptors of one request that name one storage key share it
/// and are paid together; they reach one rule (the key names the entries, the rule's tag and its
/// algorithm), so the first one's failure mode, lease and shape are the bucket's.
pub(super) struct Bucket {
    /// Key, demand (every descriptor's hits on the key, netted) and rule.
    pub(super) hit: Hit,
    /// What answers when the backend cannot.
    pub(super) failure_mode: FailureMode,
    /// The rule's `lease` batch.
    lease: Option<u64>,
    /// A sharded rule's full shape: its one local bucket under the `local` policy.
    unsharded: Option<BucketParams>,
    /// What its lease paid or lent (only on the leased path, for a leasable bucket).
    pub(super) reservation: Option<Reservation>,
    pub(super) outcome: Outcome,
}

impl Bucket {
    fn new(hit: Hit, target: &Target) -> Self {
        Bucket {
            hit,
            failure_mode: target.failure_mode,
            // Whether a quota demand is taken depends on the request's other quota demands,
            // which only the one backend call sees together; a lease would pay it alone.
            lease: target
                .rule
                .as_ref()
                .and_then(|r| r.lease)
                .filter(|_| !target.quota),
            unsharded: matches!(target.tag, RuleTag::Shard(_)).then(|| target.rate.bucket()),
            reservation: None,
            outcome: Outcome::Pending,
        }
    }

    /// The lease batch when this bucket may be paid from a lease: a take of at least one token
    /// on a rule with `lease`. Refunds and check-only hits always go to the backend.
    pub(super) fn lease_batch(&self) -> Option<u64> {
        let demand = &self.hit.demand;
        self.lease.filter(|_| !demand.refund && demand.tokens > 0)
    }

    /// A take that is counted whatever the answer (`charge: always`, at least one hit).
    pub(super) fn lands_anyway(&self) -> bool {
        let demand = &self.hit.demand;
        demand.always && !demand.refund && demand.tokens > 0
    }

    pub(super) fn is_pending(&self) -> bool {
        matches!(self.outcome, Outcome::Pending)
    }

    /// The hit the backend is asked for: the demand less what the lease gave, and where the
    /// lease may be refilled, a lease take of the rest of its batch.
    pub(super) fn asked(&self) -> Hit {
        let mut hit = self.hit.clone();
        if let Some(Reservation::Short { taken, refill, .. }) = self.reservation {
            hit.demand.tokens -= taken;
            if refill {
                let batch = self.lease_batch().unwrap_or(0);
                hit.demand.lease = batch.saturating_sub(hit.demand.tokens);
            }
        }
        hit
    }

    /// The hit decided on the in-process buckets under the `local` policy: the asked one. A
    /// sharded hit falls back to the descriptor's one local bucket of the full limit (the
    /// unsharded key and shape): in-process there is no hot key to split, and dividing each
    /// shard again by the replicas would round up N times.
    pub(super) fn local_hit(&self) -> Hit {
        let mut hit = self.asked();
        if let Some(full) = self.unsharded {
            hit.key = without_shard(&hit.key).into_owned();
            hit.demand.params = full;
        }
        hit
    }

    /// Whether its outcome fits the bucket (as [`status_of`] will report it); `None` while
    /// nothing is known (pending, or not evaluated).
    fn fits(&self) -> Option<bool> {
        match &self.outcome {
            Outcome::Decided(v) | Outcome::Local(v) => Some(v.allowed),
            Outcome::Failed(_) => Some(self.failure_mode != FailureMode::Closed),
            Outcome::Cached(_) => Some(false),
            Outcome::Pending | Outcome::NotEvaluated => None,
        }
    }
}

impl Bucket {
    /// Whether its outcome is known and passes: fits, or cannot reject (shadow).
    pub(super) fn passes(&self) -> bool {
        self.fits()
            .is_some_and(|fits| fits || self.hit.demand.shadow)
    }
}

/// Whether the outcomes known so far reject the request, by the rule the backend decides with
/// ([`algorithm::allows`]: ordinary demands all pass, one quota demand does if any).
pub(super) fn rejected(buckets: &[Bucket]) -> bool {
    !algorithm::allows(
        buckets
            .iter()
            .filter_map(|b| Some((&b.hit.demand, b.fits()?))),
    )
}

/// What one descriptor comes to.
pub(super) enum Slot {
    /// Answered without a bucket: no rule, an unlimited, replaced or blocking rule.
    Answered(Status),
    /// Answered by the outcome of `Plan::buckets[bucket]`, reported against `target`.
    Charged { target: Target, bucket: usize },
    /// A descriptor with several limits (`rate_limits`): one bucket each, all charged together;
    /// answered by the most constraining limit (`settle.rs`).
    Limits(Vec<(Target, usize)>),
}

/// One request: its descriptors in request order and the buckets they charge.
pub(super) struct Plan {
    pub(super) slots: Vec<Slot>,
    pub(super) buckets: Vec<Bucket>,
}

impl<B: Backend> Limiter<B> {
    /// Each descriptor's target and the buckets they charge, before anything is asked.
    pub(super) fn plan(&self, domain: &Domain, request: &LimitRequest) -> Plan {
        let rules: Vec<Option<Arc<Rule>>> = request
            .descriptors
            .iter()
            .map(|d| domain.find(&d.entries).cloned())
            .collect();
        let resolver = Resolver::new(
            domain,
            &rules,
            &self.shard_cursor,
            (self.options.default_failure_mode, self.options.quota_all),
            &*self.resilience.clock,
        );
        let mut plan = Plan {
            slots: Vec::with_capacity(request.descriptors.len()),
            buckets: Vec::new(),
        };
        let mut index = KeyIndex::default();
        for (descriptor, rule) in request.descriptors.iter().zip(rules) {
            // A request's own `limit` replaces every configured limit of its descriptor.
            let slot = match rule {
                Some(rule) if !rule.also.is_empty() && descriptor.limit_override.is_none() => {
                    self.plan_limits(&mut plan, &mut index, &resolver, request, descriptor, &rule)
                }
                rule => match resolver.target(descriptor, rule) {
                    Err(status) => Slot::Answered(status),
                    Ok(target) => {
                        let bucket =
                            self.charge_target(&mut plan, &mut index, request, descriptor, &target);
                        Slot::Charged { target, bucket }
                    }
                },
            };
            plan.slots.push(slot);
        }
        plan
    }

    /// The slot of a descriptor whose rule has several limits: a bucket per limit (a limit
    /// another rule of the request `replaces` is dropped, as a replaced rule is); answered without
    /// a bucket only when every limit is.
    fn plan_limits(
        &self,
        plan: &mut Plan,
        index: &mut KeyIndex,
        resolver: &Resolver<'_>,
        request: &LimitRequest,
        descriptor: &RequestDescriptor,
        rule: &Arc<Rule>,
    ) -> Slot {
        let mut charged = Vec::with_capacity(1 + rule.also.len());
        let mut first_answer = None;
        for limit in rule.limits() {
            match resolver.target(descriptor, Some(limit.clone())) {
                Ok(target) => {
                    let bucket = self.charge_target(plan, index, request, descriptor, &target);
                    charged.push((target, bucket));
                }
                Err(status) => {
                    first_answer.get_or_insert(status);
                }
            }
        }
        match (charged.is_empty(), first_answer) {
            (true, Some(status)) => Slot::Answered(status),
            _ => Slot::Limits(charged),
        }
    }

    /// Adds (or joins) the bucket `target` charges for `descriptor`; returns its place.
    fn charge_target(
        &self,
        plan: &mut Plan,
        index: &mut KeyIndex,
        request: &LimitRequest,
        descriptor: &RequestDescriptor,
        target: &Target,
    ) -> usize {
        let (entries, holder) = holder_of(target, &descriptor.entries);
        let mut key = String::new();
        // A request's own `limit` is its own bucket, never a shared one.
        let shared = match (&target.rule, target.tag) {
            (_, RuleTag::Override(_)) | (None, _) => &[][..],
            (Some(rule), _) => &rule.shared_values[..],
        };
        write_shared_bucket_key(
            &mut key,
            &self.options.key_prefix,
            &request.domain,
            entries,
            shared,
            target.tag,
            target.algorithm,
        );
        let cost = target.rule.as_ref().map_or(1, |r| r.cost);
        let demand = Demand {
            refund: descriptor.is_negative_hits,
            shadow: target.shadow,
            quota: target.quota,
            always: target.always,
            holder: match holder {
                Holder::Slot(id) => id,
                Holder::Nobody | Holder::Reserves(_) => 0,
            },
            ..Demand::take(
                target.algorithm,
                target.params,
                descriptor.hits(request.hits_addend).saturating_mul(cost),
            )
        };
        if let Holder::Reserves(holder) = holder
            && let Some(ledger) = ledger_of(target, holder, &demand, &key)
            && index.find(&plan.buckets, &key).is_none()
        {
            // Right before its bucket, where the backends look for it.
            plan.add_hit(index, ledger.0, ledger.1, target);
        }
        plan.add_hit(index, key, demand, target)
    }
}

/// The ledger key and demand of `holder`'s reservation on a rule with `reserve`
/// ([`crate::algorithm::reservation`]): `<bucket key>~rv<holder>`, in the bucket's slot. A
/// refund is an ordinary hit. A request whose bucket an earlier descriptor already names is
/// charged as an ordinary hit too (the ledger must come right before its bucket).
fn ledger_of(
    target: &Target,
    holder: &[u8],
    demand: &Demand,
    bucket_key: &str,
) -> Option<(String, Demand)> {
    let reserve = target.rule.as_ref()?.reserve.as_ref()?;
    if demand.refund {
        return None;
    }
    let key = format!("{bucket_key}~rv{:016x}", holder_id(holder));
    let ledger = Demand {
        algorithm: Algorithm::Reservation,
        params: BucketParams {
            capacity: 0,
            requests_per_unit: 0,
            unit_ms: reserve.max_hold_ms,
        },
        quota: false,
        shadow: false,
        always: false,
        ..*demand
    };
    Some((key, ledger))
}

/// What a descriptor's holder entry (split off once, by [`holder_of`]) is for.
#[derive(Clone, Copy)]
enum Holder<'a> {
    /// No holder: the rule holds nothing, or a reserving descriptor came without its holder
    /// entry (an ordinary take).
    Nobody,
    /// An in-flight cap's slot: the holder entry's [`holder_id`], or, when the descriptor has
    /// no holder entry, an anonymous holder of its own, whose slot only `max_hold` frees.
    Slot(u64),
    /// A reservation's holder, which names its ledger key ([`ledger_of`]).
    Reserves(&'a [u8]),
}

/// The entries that name a descriptor's bucket (the holder entry left out) and its holder.
fn holder_of<'a>(target: &Target, entries: &'a [Entry]) -> (&'a [Entry], Holder<'a>) {
    let Some(rule) = target.rule.as_ref() else {
        return (entries, Holder::Nobody);
    };
    let Some(holding) = rule.holding() else {
        return (entries, Holder::Nobody);
    };
    let (bucket, holder) = holder::split(holding, entries);
    let holder = match (rule.reserve.is_some(), holder) {
        (true, Some(value)) => Holder::Reserves(value),
        (true, None) => Holder::Nobody,
        (false, Some(value)) => Holder::Slot(holder_id(value)),
        (false, None) => Holder::Slot(rand::random()),
    };
    (bucket, holder)
}

impl Plan {
    /// Adds a bucket for `key`, or folds the demand into the bucket already on it: two
    /// descriptors of one request that name one bucket must be paid together, or each would see
    /// the same tokens and the bucket could go negative. A take and a refund on one key net out.
    /// Returns the bucket's place in [`Plan::buckets`].
    fn add_hit(
        &mut self,
        index: &mut KeyIndex,
        key: String,
        demand: Demand,
        target: &Target,
    ) -> usize {
        if let Some(i) = index.find(&self.buckets, &key) {
            let prior = &mut self.buckets[i].hit.demand;
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
            prior.quota &= demand.quota;
            return i;
        }
        index.add(&key, self.buckets.len());
        let rule = target.rule.as_ref().map(|r| r.id);
        self.buckets
            .push(Bucket::new(Hit { key, demand, rule }, target));
        self.buckets.len() - 1
    }

    /// Applies what the descriptors answered without a bucket say about the request, before
    /// anything is charged. When one of them rejects it (an ordinary blocking
    /// `requests_per_unit: 0` rule, or blocked quota descriptors with no quota bucket left to
    /// pass), the request is rejected whatever the buckets say, so none is asked or charged:
    /// they become [`Outcome::NotEvaluated`], as when the over-limit cache rejects one — but the
    /// always-charged ones ([`Bucket::lands_anyway`]), which stay pending. Returns whether it
    /// did.
    ///
    /// When a quota descriptor already passed without a bucket (no rule under `--quota-mode`, a
    /// blocked shadow one), the quota demands of the buckets can no longer reject the request:
    /// they are asked as shadow demands, which are taken if they fit and never reject.
    pub(super) fn reject_before_charging(&mut self) -> bool {
        let answered = self.slots.iter().filter_map(|slot| match slot {
            Slot::Answered(status) => Some(status),
            Slot::Charged { .. } | Slot::Limits(_) => None,
        });
        let (mut ordinary_over, mut quota_over, mut quota_passed) = (false, false, false);
        for status in answered {
            let over = status.code == Code::OverLimit;
            match (status.quota, over) {
                (false, over) => ordinary_over |= over,
                (true, true) => quota_over = true,
                (true, false) => quota_passed = true,
            }
        }
        let quota_pending = self.buckets.iter().any(|b| b.hit.demand.quota);
        let rejected = ordinary_over || (quota_over && !quota_passed && !quota_pending);
        if quota_passed {
            for bucket in &mut self.buckets {
                let demand = &mut bucket.hit.demand;
                demand.shadow |= demand.quota;
            }
        }
        if rejected {
            for bucket in self.buckets.iter_mut().filter(|b| !b.lands_anyway()) {
                bucket.outcome = Outcome::NotEvaluated;
            }
        }
        rejected
    }
}

/// Up to this many distinct buckets, an earlier one on the same key is found by comparing keys
/// (the common request has 1–4 descriptors: no hashing, no allocation); past it, by a map, so a
/// request with many descriptors does not cost a quadratic number of key comparisons.
const LINEAR_DEDUPE: usize = 16;

/// Where each distinct key's bucket is, once there are more than [`LINEAR_DEDUPE`] buckets.
#[derive(Default)]
struct KeyIndex(Option<HashMap<String, usize>>);

impl KeyIndex {
    fn find(&mut self, buckets: &[Bucket], key: &str) -> Option<usize> {
        if buckets.len() < LINEAR_DEDUPE {
            return buckets.iter().position(|b| b.hit.key == key);
        }
        self.0
            .get_or_insert_with(|| {
                buckets
                    .iter()
                    .enumerate()
                    .map(|(i, b)| (b.hit.key.clone(), i))
                    .collect()
            })
            .get(key)
            .copied()
    }

    /// Records that `buckets[at]` holds `key` (only needed once the map exists).
    fn add(&mut self, key: &str, at: usize) {
        if let Some(map) = &mut self.0 {
            map.insert(key.to_owned(), at);
        }
    }
}
