//! The decision: a validated request → the rules it reaches → one backend call → a [`Decision`].
//!
//! Pure domain logic: no protobuf, no gRPC. [`crate::service`] converts at the edge and maps
//! [`LimitError`] to a gRPC status.
//!
//! When the backend cannot answer for a bucket, the failure policy of its descriptor decides
//! ([`Basis::Degraded`]): `open` → OK, `closed` → OVER_LIMIT, `local` → the in-process bucket of
//! [`crate::resilience::local`], `error` → the whole call fails with [`LimitError::Unavailable`].
//! Before the backend is asked, the over-limit cache may already know the request is rejected
//! ([`Basis::Cached`]); then nothing is asked and nothing is taken.
//!
//! A rule with `shards: N` (hot-key splitting) keeps each descriptor's bucket as N sub-buckets
//! of `limit / N` ([`RuleTag::Shard`]); a request is judged by one of them, chosen by
//! [`shard_of`] from a per-replica counter, and reports that shard's remaining and retry-after
//! beside the rule's full limit. Under the `local` policy a sharded rule falls back to one
//! in-process bucket of the full limit / replicas, as an unsharded rule does.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::algorithm::{Algorithm, BucketParams, Demand, Verdict};
use crate::backend::{Backend, BackendError, Hit};
use crate::config::{Config, Domain};
use crate::key::{RuleTag, without_shard, write_bucket_key};
use crate::lease::{LeaseStore, Remote, Reservation};
use crate::request::{LimitRequest, RequestDescriptor};
use crate::resilience::Resilience;
use crate::resilience::breaker::BreakerState;
use crate::resilience::over_limit::CachedRejection;
use crate::rule::{FailureMode, Limit, RateLimit, Rule, RuleId};

pub use crate::decision::{AppliedLimit, Basis, Code, Decision, Status};

/// Why no decision could be made.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    /// The backend failed and the failure policy of some descriptor is `error`.
    #[error("rate-limit backend unavailable: {0}")]
    Unavailable(#[source] BackendError),
    /// Too many decisions are in progress (`--max-in-flight`).
    #[error("overloaded: {0} rate-limit decisions already in progress")]
    Overloaded(usize),
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
#[derive(Clone)]
struct Target {
    rule: Option<Arc<Rule>>,
    /// The limit reported (`current_limit`, `x-ratelimit-limit`): the rule's or the override's.
    rate: RateLimit,
    /// The shape the bucket is decided with: `rate`'s, or one shard's share of it.
    params: BucketParams,
    /// The shard of a sharded rule this request is judged by.
    shard: Option<u8>,
    /// The rule's algorithm; for an override without a rule, the domain's.
    algorithm: Algorithm,
    name: Option<Arc<str>>,
    shadow: bool,
    failure_mode: FailureMode,
    /// Index into the deduplicated hit list.
    hit: usize,
}

/// What became of one hit.
enum Outcome {
    /// The backend decided.
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

/// Decides requests against the active config and a backend.
pub struct Limiter<B> {
    config: Arc<ArcSwap<Config>>,
    backend: B,
    options: LimiterOptions,
    resilience: Resilience,
    /// Token leases of the rules with `lease` (`None`: every hit goes to the backend).
    leases: Option<Arc<LeaseStore>>,
    /// Advanced once per request that reaches a sharded rule; [`shard_of`] scatters it over the
    /// shards. Starts at a random value so replicas do not walk the shards in step.
    shard_cursor: AtomicU64,
}

impl<B: Backend> Limiter<B> {
    /// A limiter without over-limit cache or in-flight bound, whose `local` policy assumes one
    /// replica.
    pub fn new(config: Arc<ArcSwap<Config>>, backend: B, options: LimiterOptions) -> Self {
        Self::with_resilience(config, backend, options, Resilience::default())
    }

    pub fn with_resilience(
        config: Arc<ArcSwap<Config>>,
        backend: B,
        options: LimiterOptions,
        resilience: Resilience,
    ) -> Self {
        Limiter {
            config,
            backend,
            options,
            resilience,
            leases: None,
            shard_cursor: AtomicU64::new(rand::random()),
        }
    }

    /// Starts the shard counter at `seq` (tests that want a known sequence of shards).
    pub fn with_shard_cursor(self, seq: u64) -> Self {
        self.shard_cursor.store(seq, Ordering::Relaxed);
        self
    }

    /// Spends the tokens of rules with `lease` from `store` where it can.
    pub fn with_leases(mut self, store: Arc<LeaseStore>) -> Self {
        self.leases = Some(store);
        self
    }

    pub fn leases(&self) -> Option<&Arc<LeaseStore>> {
        self.leases.as_ref()
    }

    /// Hands the tokens of expired leases back to the backend (the sweeper's tick). Returns the
    /// tokens the backend took back.
    pub async fn return_expired_leases(&self) -> u64 {
        let Some(store) = &self.leases else { return 0 };
        let now_ms = self.resilience.clock.now_ms();
        self.give_back(store, store.sweep(now_ms)).await
    }

    /// Hands every leased token back to the backend (shutdown).
    pub async fn return_all_leases(&self) -> u64 {
        let Some(store) = &self.leases else { return 0 };
        self.give_back(store, store.drain()).await
    }

    /// One backend call for all `refunds` (the backend splits it per Cluster slot). Tokens whose
    /// refund fails are lost to the bucket until it refills: under-admission, never over.
    async fn give_back(&self, store: &LeaseStore, refunds: Vec<Hit>) -> u64 {
        if refunds.is_empty() {
            return 0;
        }
        let results = self.backend.check_each(&refunds).await;
        let mut returned = 0u64;
        for (hit, result) in refunds.iter().zip(results) {
            match result {
                Ok(_) => returned = returned.saturating_add(hit.demand.tokens),
                Err(error) => tracing::warn!(
                    key = %hit.key,
                    tokens = hit.demand.tokens,
                    %error,
                    "could not hand leased tokens back"
                ),
            }
        }
        store.note_returned(returned);
        returned
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn resilience(&self) -> &Resilience {
        &self.resilience
    }

    /// Each backend endpoint and the state of its circuit breaker (empty for the memory
    /// backend). Read-only, for readiness and metrics.
    pub fn breaker_states(&self) -> Vec<(String, BreakerState)> {
        self.backend
            .breakers()
            .map(|set| set.states())
            .unwrap_or_default()
    }

    pub fn config(&self) -> &Arc<ArcSwap<Config>> {
        &self.config
    }

    pub fn options(&self) -> &LimiterOptions {
        &self.options
    }

    /// Decides one request. At most one backend call.
    pub async fn decide(&self, request: &LimitRequest) -> Result<Decision, LimitError> {
        let in_flight = &self.resilience.in_flight;
        let Some(_place) = in_flight.enter() else {
            return Err(LimitError::Overloaded(in_flight.limit()));
        };
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
        // One draw per request, shared by all its descriptors: duplicates of one sharded
        // descriptor land on one shard, hence one key, and are paid together.
        let shard_seq = if resolved.iter().flatten().any(|r| r.shards.is_some()) {
            self.shard_cursor.fetch_add(1, Ordering::Relaxed)
        } else {
            0
        };

        let mut statuses: Vec<Option<Status>> = Vec::with_capacity(request.descriptors.len());
        let mut targets: Vec<Option<Target>> = Vec::with_capacity(request.descriptors.len());
        let mut hits: Vec<Hit> = Vec::new();
        let mut hit_index = HitIndex::default();

        for (descriptor, rule) in request.descriptors.iter().zip(resolved) {
            match self.target(domain, descriptor, rule, &replaced, shard_seq) {
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
                    let hits_each = descriptor.hits(request.hits_addend);
                    let demand = Demand {
                        algorithm: target.algorithm,
                        params: target.params,
                        tokens: hits_each.saturating_mul(cost),
                        refund: descriptor.is_negative_hits,
                        shadow: target.shadow,
                        lease: 0,
                    };
                    let rule = target.rule.as_ref().map(|r| r.id);
                    target.hit = merge_hit(&mut hits, &mut hit_index, key, demand, rule);
                    statuses.push(None);
                    targets.push(Some(target));
                }
            }
        }

        let outcomes = self.outcomes(&hits, &targets).await?;
        let statuses: Vec<Status> = statuses
            .into_iter()
            .zip(targets)
            .map(|(status, target)| match (status, target) {
                (Some(status), _) => status,
                (None, Some(t)) => {
                    let outcome = &outcomes[t.hit];
                    status_of(t, outcome)
                }
                (None, None) => unreachable!("every descriptor has a status or a target"),
            })
            .collect();

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

    /// What becomes of each hit: from a local lease, else from the over-limit cache, else from
    /// the backend, with the failure policy of its descriptor where the backend failed.
    async fn outcomes(
        &self,
        hits: &[Hit],
        targets: &[Option<Target>],
    ) -> Result<Vec<Outcome>, LimitError> {
        if hits.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(store) = &self.leases {
            let leases = lease_sizes(hits, targets);
            if leases.iter().any(Option::is_some) {
                return self.leased_outcomes(store, hits, targets, &leases).await;
            }
        }
        self.remote_outcomes(hits, targets).await
    }

    /// [`Limiter::outcomes`] for a request with leased hits. Each leased take is first paid from
    /// its lease; only the hits it cannot pay go to the backend, in the one call, the leased
    /// ones as lease takes of what the lease lacked. Then each lease is settled: tokens the
    /// backend granted beyond the demand go into it, and when the request is rejected every
    /// token it reserved (or that the backend took for it) goes back into it, so a rejected
    /// request spends nothing.
    async fn leased_outcomes(
        &self,
        store: &LeaseStore,
        hits: &[Hit],
        targets: &[Option<Target>],
        leases: &[Option<u64>],
    ) -> Result<Vec<Outcome>, LimitError> {
        let now_ms = self.resilience.clock.now_ms();
        let reservations: Vec<Option<Reservation>> = hits
            .iter()
            .zip(leases)
            .map(|(hit, lease)| lease.map(|_| store.reserve(hit, now_ms)))
            .collect();
        let mut unsettled = Unsettled {
            store,
            hits,
            reservations: &reservations,
            now_ms,
            armed: true,
        };
        // The hits the backend must see, and where each came from.
        let mut sent: Vec<Hit> = Vec::new();
        let mut origin: Vec<usize> = Vec::new();
        for (i, (hit, reservation)) in hits.iter().zip(&reservations).enumerate() {
            match reservation {
                Some(Reservation::Paid { .. }) => {}
                Some(Reservation::Short { taken, refill, .. }) => {
                    let mut hit = hit.clone();
                    hit.demand.tokens -= taken;
                    if *refill {
                        let batch = leases[i].unwrap_or(0);
                        hit.demand.lease = batch.saturating_sub(hit.demand.tokens);
                    }
                    sent.push(hit);
                    origin.push(i);
                }
                None => {
                    sent.push(hit.clone());
                    origin.push(i);
                }
            }
        }
        let mut outcomes: Vec<Outcome> = reservations
            .iter()
            .zip(hits)
            .map(|(reservation, hit)| match reservation {
                Some(Reservation::Paid { left, remote, .. }) => {
                    Outcome::Decided(paid_locally(hit.demand.tokens, *left, *remote))
                }
                _ => Outcome::NotEvaluated,
            })
            .collect();
        if !sent.is_empty() {
            let sent_targets = retarget(targets, &origin);
            let remote = self.remote_outcomes(&sent, &sent_targets).await;
            let remote = match remote {
                Ok(remote) => remote,
                Err(error) => {
                    unsettled.armed = false;
                    settle_leases(
                        store,
                        hits,
                        &reservations,
                        &sent,
                        &origin,
                        &[],
                        true,
                        now_ms,
                    );
                    return Err(error);
                }
            };
            let from_cache = remote.iter().any(|o| matches!(o, Outcome::Cached(_)));
            for (&i, outcome) in origin.iter().zip(remote) {
                outcomes[i] = outcome;
            }
            // Rejected from the cache: like every other bucket, a leased one was not charged.
            if from_cache {
                for (outcome, reservation) in outcomes.iter_mut().zip(&reservations) {
                    if matches!(reservation, Some(Reservation::Paid { .. })) {
                        *outcome = Outcome::NotEvaluated;
                    }
                }
            }
        }
        let rejected = request_rejected(hits, targets, &outcomes);
        let granted: Vec<Option<&Verdict>> = origin
            .iter()
            .map(|&i| match &outcomes[i] {
                Outcome::Decided(v) => Some(v),
                _ => None,
            })
            .collect();
        unsettled.armed = false;
        let left = settle_leases(
            store,
            hits,
            &reservations,
            &sent,
            &origin,
            &granted,
            rejected,
            now_ms,
        );
        // A refilled lease's tokens count as the key's remaining: they are spendable here.
        for (&i, extra) in origin.iter().zip(left) {
            if let (Outcome::Decided(v), Some(extra)) = (&mut outcomes[i], extra) {
                v.remaining = v.remaining.saturating_add(extra);
            }
        }
        if !rejected {
            let local = reservations
                .iter()
                .filter(|r| matches!(r, Some(Reservation::Paid { .. })))
                .count();
            store.note_local(local as u64);
        }
        Ok(outcomes)
    }

    /// Outcomes from the over-limit cache, else from the backend, with the failure policy of
    /// each descriptor where the backend failed.
    async fn remote_outcomes(
        &self,
        hits: &[Hit],
        targets: &[Option<Target>],
    ) -> Result<Vec<Outcome>, LimitError> {
        let cache = self.resilience.over_limit.as_ref();
        let now_ms = self.resilience.clock.now_ms();
        // A refund must reach the backend even when the request is rejected, so a request
        // carrying one is never answered from the cache. Shadow hits cannot reject, so they
        // never make the cache answer for the whole request.
        if let Some(cache) = cache
            && hits.iter().all(|h| !h.demand.refund)
        {
            let cached: Vec<Option<CachedRejection>> = hits
                .iter()
                .map(|h| cache.rejects(&h.key, &h.demand, now_ms))
                .collect();
            if cached.iter().any(Option::is_some) {
                return Ok(cached
                    .into_iter()
                    .map(|c| c.map_or(Outcome::NotEvaluated, Outcome::Cached))
                    .collect());
            }
        }

        let results = self.backend.check_each(hits).await;
        if results.iter().any(Result::is_ok) {
            self.resilience.note_answer(now_ms);
        }
        let mut outcomes = Vec::with_capacity(hits.len());
        for (hit, result) in hits.iter().zip(results) {
            outcomes.push(match result {
                Ok(verdict) => {
                    if let Some(cache) = cache {
                        cache.learn(&hit.key, &hit.demand, &verdict, now_ms);
                    }
                    Outcome::Decided(verdict)
                }
                Err(error) => Outcome::Failed(error),
            });
        }
        if outcomes.iter().any(|o| matches!(o, Outcome::Failed(_))) {
            self.apply_policy(hits, targets, &mut outcomes).await?;
        }
        Ok(outcomes)
    }

    /// Replaces failed outcomes by what their failure policy says: `error` fails the call,
    /// `local` decides on the local buckets; `open` and `closed` stay failed and are answered
    /// by [`status_of`].
    async fn apply_policy(
        &self,
        hits: &[Hit],
        targets: &[Option<Target>],
        outcomes: &mut [Outcome],
    ) -> Result<(), LimitError> {
        // Descriptors sharing a hit share a rule (or an override of one domain), hence a mode.
        let mut mode_of: Vec<Option<FailureMode>> = vec![None; hits.len()];
        for t in targets.iter().flatten() {
            mode_of[t.hit].get_or_insert(t.failure_mode);
        }
        let mut local = Vec::new();
        let mut rejected = false;
        for (i, outcome) in outcomes.iter().enumerate() {
            let shadow = hits[i].demand.shadow;
            match (outcome, mode_of[i]) {
                (Outcome::Failed(error), Some(FailureMode::Error)) => {
                    self.resilience.notices.record(FailureMode::Error, error);
                    return Err(LimitError::Unavailable(error.clone()));
                }
                (Outcome::Failed(_), Some(FailureMode::Local)) => local.push(i),
                (Outcome::Failed(_), Some(FailureMode::Closed)) => rejected |= !shadow,
                (Outcome::Decided(v), _) => rejected |= !v.allowed && !shadow,
                _ => {}
            }
        }
        for (i, outcome) in outcomes.iter().enumerate() {
            if let (Outcome::Failed(error), Some(mode)) = (outcome, mode_of[i]) {
                self.resilience.notices.record(mode, error);
            }
        }
        if local.is_empty() {
            return Ok(());
        }
        // A sharded hit falls back to the descriptor's one local bucket of the full limit (the
        // unsharded key and shape): in-process there is no hot key to split, and dividing each
        // shard again by the replicas would round up N times.
        let mut unsharded: Vec<Option<BucketParams>> = vec![None; hits.len()];
        for t in targets.iter().flatten() {
            if t.shard.is_some() {
                unsharded[t.hit] = Some(t.rate.bucket());
            }
        }
        let local_hits: Vec<Hit> = local
            .iter()
            .map(|&i| {
                let mut hit = hits[i].clone();
                if let Some(full) = unsharded[i] {
                    hit.key = without_shard(&hit.key).into_owned();
                    hit.demand.params = full;
                }
                hit
            })
            .collect();
        let verdicts = self.resilience.local.decide(&local_hits, rejected).await;
        for (&i, verdict) in local.iter().zip(verdicts) {
            outcomes[i] = Outcome::Local(verdict);
        }
        Ok(())
    }

    /// The bucket a descriptor uses, or its final status when no bucket is involved.
    fn target(
        &self,
        domain: &Domain,
        descriptor: &RequestDescriptor,
        rule: Option<Arc<Rule>>,
        replaced: &[Arc<str>],
        shard_seq: u64,
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
                params: rate.bucket(),
                shard: None,
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
        // Overrides (above) are never sharded: they name a limit of their own.
        let (params, shard, tag) = match rule.shards {
            Some(n) => {
                let shard = shard_of(shard_seq, n);
                (rate.split(n).bucket(), Some(shard), RuleTag::Shard(shard))
            }
            None => (rate.bucket(), None, RuleTag::Configured),
        };
        let target = Target {
            name: rule.name.clone(),
            shadow: rule.shadow_mode,
            rate,
            params,
            shard,
            algorithm: rule.algorithm,
            failure_mode,
            rule: Some(rule),
            hit: 0,
        };
        Ok((target, tag))
    }
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

/// The lease size of each hit that may be paid from a lease: a take of at least one token on a
/// rule with `lease`. Refunds and check-only hits always go to the backend.
fn lease_sizes(hits: &[Hit], targets: &[Option<Target>]) -> Vec<Option<u64>> {
    let mut sizes = vec![None; hits.len()];
    for t in targets.iter().flatten() {
        let demand = &hits[t.hit].demand;
        if let Some(lease) = t.rule.as_ref().and_then(|r| r.lease)
            && !demand.refund
            && demand.tokens > 0
        {
            sizes[t.hit].get_or_insert(lease);
        }
    }
    sizes
}

/// The targets of the hits at `origin` (indices into the full hit list), renumbered to index
/// the sublist.
fn retarget(targets: &[Option<Target>], origin: &[usize]) -> Vec<Option<Target>> {
    targets
        .iter()
        .map(|t| {
            let t = t.as_ref()?;
            let hit = origin.iter().position(|&i| i == t.hit)?;
            Some(Target { hit, ..t.clone() })
        })
        .collect()
}

/// Whether some outcome rejects the request (as [`status_of`] will report it).
fn request_rejected(hits: &[Hit], targets: &[Option<Target>], outcomes: &[Outcome]) -> bool {
    let mut mode_of: Vec<Option<FailureMode>> = vec![None; hits.len()];
    for t in targets.iter().flatten() {
        mode_of[t.hit].get_or_insert(t.failure_mode);
    }
    outcomes.iter().enumerate().any(|(i, outcome)| {
        let shadow = hits[i].demand.shadow;
        match outcome {
            Outcome::Decided(v) | Outcome::Local(v) => !v.allowed && !shadow,
            Outcome::Failed(_) => mode_of[i] == Some(FailureMode::Closed) && !shadow,
            Outcome::Cached(_) => !shadow,
            Outcome::NotEvaluated => false,
        }
    })
}

/// The verdict for a take paid from a lease: allowed; what the shared bucket had at the last
/// refill plus what is left in the lease.
fn paid_locally(tokens: u64, left: u64, remote: Remote) -> Verdict {
    Verdict {
        allowed: true,
        remaining: remote.remaining.saturating_add(left),
        retry_after_ms: Some(0),
        until_full_ms: remote.until_full_ms,
        granted: tokens,
    }
}

/// The refilling reservations of a decision until [`settle_leases`] ends them. A decision
/// dropped while its backend call is out (the caller gave up: Envoy's timeout cancels the call)
/// never gets there, so on drop each is abandoned: its taken tokens go back to its lease and
/// the lease is no longer held as being refilled, so the sweep and eviction can drop it again.
struct Unsettled<'a> {
    store: &'a LeaseStore,
    hits: &'a [Hit],
    reservations: &'a [Option<Reservation>],
    now_ms: u64,
    /// Cleared just before `settle_leases`, which ends every reservation itself.
    armed: bool,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for (hit, reservation) in self.hits.iter().zip(self.reservations) {
            if let Some(Reservation::Short {
                taken,
                expires_ms,
                refill: true,
            }) = *reservation
            {
                self.store.abandon(&hit.key, taken, expires_ms, self.now_ms);
            }
        }
    }
}

/// Settles every reservation once the request's fate is known (see
/// [`Limiter::leased_outcomes`]). `verdicts[j]` is the backend's verdict for `sent[j]`, where it
/// decided. Returns, per sent hit, the tokens its lease holds after a refill.
#[allow(clippy::too_many_arguments)]
fn settle_leases(
    store: &LeaseStore,
    hits: &[Hit],
    reservations: &[Option<Reservation>],
    sent: &[Hit],
    origin: &[usize],
    verdicts: &[Option<&Verdict>],
    rejected: bool,
    now_ms: u64,
) -> Vec<Option<u64>> {
    let mut left = vec![None; sent.len()];
    for (j, (&i, hit)) in origin.iter().zip(sent).enumerate() {
        let Some(Reservation::Short {
            taken,
            expires_ms,
            refill,
        }) = reservations[i]
        else {
            continue;
        };
        let verdict = verdicts.get(j).copied().flatten();
        let got = verdict.map_or(0, |v| v.granted);
        if !refill {
            // Not in the store: a plain take, nothing was reserved.
            continue;
        }
        if got == 0 {
            store.abandon(&hit.key, taken, expires_ms, now_ms);
            continue;
        }
        let remote = verdict.map_or(Remote::default(), |v| Remote {
            remaining: v.remaining,
            until_full_ms: v.until_full_ms,
        });
        // Allowed: the request spends its own tokens, the lease keeps the extra. Rejected (by a
        // key of another Cluster slot): nothing is spent, all of it is the lease's.
        let keep = if rejected {
            got
        } else {
            got.saturating_sub(hit.demand.tokens)
        };
        left[j] = Some(store.refilled(&hits[i], keep, remote, now_ms));
        if rejected {
            store.put_back(&hit.key, taken, expires_ms, now_ms);
        }
    }
    if rejected {
        for (hit, reservation) in hits.iter().zip(reservations) {
            if let Some(Reservation::Paid { expires_ms, .. }) = reservation {
                store.put_back(&hit.key, hit.demand.tokens, *expires_ms, now_ms);
            }
        }
    }
    left
}

/// Names replaced by some other rule reached in the same request (envoyproxy/ratelimit's `replaces`).
fn replaced_names(rules: &[Option<Arc<Rule>>]) -> Vec<Arc<str>> {
    rules
        .iter()
        .flatten()
        .flat_map(|r| r.replaces.iter().cloned())
        .collect()
}

/// Up to this many distinct hits, an earlier hit on the same key is found by comparing keys
/// (the common request has 1–4 descriptors: no hashing, no allocation); past it, by a map, so a
/// request with many descriptors does not cost a quadratic number of key comparisons.
const LINEAR_DEDUPE: usize = 16;

/// Where each distinct key's hit is, once there are more than [`LINEAR_DEDUPE`] hits.
#[derive(Default)]
struct HitIndex(Option<HashMap<String, usize>>);

impl HitIndex {
    fn find(&mut self, hits: &[Hit], key: &str) -> Option<usize> {
        if hits.len() < LINEAR_DEDUPE {
            return hits.iter().position(|hit| hit.key == key);
        }
        self.0
            .get_or_insert_with(|| {
                hits.iter()
                    .enumerate()
                    .map(|(i, hit)| (hit.key.clone(), i))
                    .collect()
            })
            .get(key)
            .copied()
    }

    /// Records that `hits[at]` holds `key` (only needed once the map exists).
    fn add(&mut self, key: &str, at: usize) {
        if let Some(map) = &mut self.0 {
            map.insert(key.to_owned(), at);
        }
    }
}

/// Adds a hit, or folds it into an earlier hit on the same key: two descriptors of one request
/// that name one bucket must be paid together, or each would see the same tokens and the bucket
/// could go negative. A take and a refund on one key net out.
fn merge_hit(
    hits: &mut Vec<Hit>,
    index: &mut HitIndex,
    key: String,
    demand: Demand,
    rule: Option<RuleId>,
) -> usize {
    if let Some(i) = index.find(hits, &key) {
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
    index.add(&key, hits.len());
    hits.push(Hit { key, demand, rule });
    hits.len() - 1
}

/// The status of a descriptor from what became of its hit.
fn status_of(target: Target, outcome: &Outcome) -> Status {
    match outcome {
        Outcome::Decided(v) => from_verdict(target, v, Basis::Backend),
        Outcome::Local(v) => from_verdict(target, v, Basis::Degraded(FailureMode::Local)),
        Outcome::Failed(_) => degraded(target),
        Outcome::Cached(c) => cached(target, c),
        Outcome::NotEvaluated => Status {
            code: Code::Ok,
            basis: Basis::NotEvaluated,
            limit: None,
            remaining: 0,
            reset_ms: 0,
            retry_after_ms: None,
            shadow: target.shadow,
            over: false,
            rule: target.rule,
        },
    }
}

fn from_verdict(target: Target, v: &Verdict, basis: Basis) -> Status {
    let over = !v.allowed;
    Status {
        code: if over && !target.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        },
        basis,
        limit: Some(AppliedLimit::new(&target.rate, target.name)),
        remaining: v.remaining,
        reset_ms: v.until_full_ms,
        retry_after_ms: over.then_some(v.retry_after_ms),
        shadow: target.shadow,
        over,
        rule: target.rule,
    }
}

fn cached(target: Target, c: &CachedRejection) -> Status {
    Status {
        code: if target.shadow {
            Code::Ok
        } else {
            Code::OverLimit
        },
        basis: Basis::Cached,
        limit: Some(AppliedLimit::new(&target.rate, target.name)),
        remaining: c.remaining,
        reset_ms: c.until_full_ms,
        retry_after_ms: Some(Some(c.wait_ms)),
        shadow: target.shadow,
        over: true,
        rule: target.rule,
    }
}

/// A status decided by the `open` or `closed` policy (`local` has a verdict of its own, `error`
/// never gets here). `closed` asks for a retry after one second: the outage's end is unknown.
fn degraded(target: Target) -> Status {
    let BucketParams { capacity, .. } = target.params;
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use futures::FutureExt as _;

    use super::*;
    use crate::backend::memory::{MemoryBackend, MemoryOptions};
    use crate::clock::{Clock, ManualClock};
    use crate::config::load_sources;
    use crate::request::Entry;
    use crate::resilience::ResilienceOptions;
    use crate::resilience::local::Replicas;
    use crate::rule::Unit;

    /// A memory backend that counts calls and fails the hits whose key contains a chosen part
    /// (a dead Redis, or one dead Cluster node).
    struct Flaky {
        inner: MemoryBackend,
        calls: AtomicUsize,
        failing: Mutex<HashSet<String>>,
        /// While set, every check waits for ever (a Redis that stopped answering).
        stalled: AtomicBool,
    }

    impl Flaky {
        fn fail(&self, part: &str) {
            self.failing.lock().unwrap().insert(part.to_string());
        }
        fn heal(&self) {
            self.failing.lock().unwrap().clear();
        }
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
        fn is_failing(&self, key: &str) -> bool {
            self.failing.lock().unwrap().iter().any(|p| key.contains(p))
        }
    }

    impl Backend for Flaky {
        async fn check(&self, hits: &[Hit]) -> Result<Vec<Verdict>, BackendError> {
            self.check_each(hits).await.into_iter().collect()
        }
        fn name(&self) -> &'static str {
            "flaky"
        }
        async fn probe(&self) -> Result<(), BackendError> {
            Ok(())
        }
        async fn check_each(&self, hits: &[Hit]) -> Vec<Result<Verdict, BackendError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.stalled.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            let healthy: Vec<Hit> = hits
                .iter()
                .filter(|h| !self.is_failing(&h.key))
                .cloned()
                .collect();
            let mut verdicts = self.inner.check(&healthy).await.unwrap().into_iter();
            hits.iter()
                .map(|h| {
                    if self.is_failing(&h.key) {
                        Err(BackendError::Unavailable("refused".into()))
                    } else {
                        Ok(verdicts.next().unwrap())
                    }
                })
                .collect()
        }
    }

    /// `a` and `b`: 4 per second each; `s`: shadow, 1 per hour; `h`: 8 per hour in 4 shards of 2;
    /// one domain per failure mode.
    const CONFIG: &str = "
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: c
    failure_mode: closed
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: h
    rate_limit: {unit: hour, requests_per_unit: 8, shards: 4}
";

    struct Rig {
        limiter: Limiter<Arc<Flaky>>,
        backend: Arc<Flaky>,
        clock: ManualClock,
    }

    fn rig(replicas: u64, cache: bool, max_in_flight: usize) -> Rig {
        let sources: Vec<(String, String)> = ["open", "closed", "local", "error"]
            .iter()
            .map(|mode| {
                (
                    format!("{mode}.yaml"),
                    format!("domain: {mode}\nfailure_mode: {mode}\n{CONFIG}"),
                )
            })
            .collect();
        let config = Arc::new(ArcSwap::from_pointee(load_sources(&sources).unwrap()));
        let clock = ManualClock::new(1_000_000);
        let backend = Arc::new(Flaky {
            inner: MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default()),
            calls: AtomicUsize::new(0),
            failing: Mutex::new(HashSet::new()),
            stalled: AtomicBool::new(false),
        });
        let resilience = Resilience::new(
            &ResilienceOptions {
                over_limit_cache_keys: cache.then_some(1_000),
                max_in_flight,
                ..ResilienceOptions::default()
            },
            Arc::new(clock.clone()),
            Arc::new(Replicas::fixed(replicas)),
        );
        let limiter = Limiter::with_resilience(
            config,
            backend.clone(),
            LimiterOptions::default(),
            resilience,
        );
        Rig {
            limiter,
            backend,
            clock,
        }
    }

    fn request(domain: &str, descriptors: &[(&str, &str)]) -> LimitRequest {
        LimitRequest {
            domain: domain.into(),
            descriptors: descriptors
                .iter()
                .map(|(k, v)| RequestDescriptor::new(vec![Entry::new(*k, *v)]))
                .collect(),
            hits_addend: 0,
        }
    }

    #[tokio::test]
    async fn each_policy_answers_when_the_backend_fails() {
        let rig = rig(1, false, usize::MAX);
        rig.backend.fail("");
        let open = rig
            .limiter
            .decide(&request("open", &[("a", "1")]))
            .await
            .unwrap();
        assert_eq!(open.overall, Code::Ok);
        assert_eq!(open.statuses[0].basis, Basis::Degraded(FailureMode::Open));
        assert_eq!(open.degraded_modes(), [FailureMode::Open]);
        let closed = rig
            .limiter
            .decide(&request("closed", &[("a", "1")]))
            .await
            .unwrap();
        assert_eq!(closed.overall, Code::OverLimit);
        assert_eq!(
            closed.statuses[0].basis,
            Basis::Degraded(FailureMode::Closed)
        );
        let error = rig.limiter.decide(&request("error", &[("a", "1")])).await;
        assert!(
            matches!(error, Err(LimitError::Unavailable(_))),
            "{error:?}"
        );
        let mut allowed = 0;
        for _ in 0..10 {
            let local = rig
                .limiter
                .decide(&request("local", &[("a", "1")]))
                .await
                .unwrap();
            assert_eq!(local.statuses[0].basis, Basis::Degraded(FailureMode::Local));
            allowed += usize::from(local.overall == Code::Ok);
        }
        assert_eq!(allowed, 4, "one replica: the whole limit, locally");
        // A descriptor's own failure mode wins over its domain's.
        let mixed = rig
            .limiter
            .decide(&request("open", &[("a", "1"), ("c", "1")]))
            .await
            .unwrap();
        assert_eq!(mixed.overall, Code::OverLimit);
        assert_eq!(
            mixed.degraded_modes(),
            [FailureMode::Open, FailureMode::Closed]
        );
    }

    #[tokio::test]
    async fn local_divides_by_the_replica_count_and_a_rejected_request_takes_nothing() {
        let rig = rig(2, false, usize::MAX);
        rig.backend.fail("");
        let mut allowed = 0;
        for _ in 0..10 {
            let d = rig
                .limiter
                .decide(&request("local", &[("a", "x")]))
                .await
                .unwrap();
            allowed += usize::from(d.overall == Code::Ok);
        }
        assert_eq!(allowed, 2, "capacity 4 over 2 replicas");

        // `c` is closed: the request is rejected, so the local bucket of `b` must not pay.
        for _ in 0..3 {
            let d = rig
                .limiter
                .decide(&request("local", &[("b", "y"), ("c", "y")]))
                .await
                .unwrap();
            assert_eq!(d.overall, Code::OverLimit);
            assert_eq!(d.statuses[0].code, Code::Ok);
        }
        let alone = rig
            .limiter
            .decide(&request("local", &[("b", "y")]))
            .await
            .unwrap();
        assert_eq!(alone.overall, Code::Ok);
        assert_eq!(
            alone.statuses[0].remaining, 1,
            "2 - 1: nothing was taken before"
        );
    }

    #[tokio::test]
    async fn only_the_failed_endpoint_is_degraded() {
        let rig = rig(1, false, usize::MAX);
        rig.backend.fail("b=");
        let d = rig
            .limiter
            .decide(&request("open", &[("a", "1"), ("b", "1")]))
            .await
            .unwrap();
        assert_eq!(d.statuses[0].basis, Basis::Backend);
        assert_eq!(d.statuses[0].remaining, 3);
        assert_eq!(d.statuses[1].basis, Basis::Degraded(FailureMode::Open));
        // With `error` on the failed one, the whole call fails.
        assert!(
            rig.limiter
                .decide(&request("error", &[("a", "1"), ("b", "1")]))
                .await
                .is_err()
        );
        rig.backend.heal();
        let d = rig
            .limiter
            .decide(&request("open", &[("b", "1")]))
            .await
            .unwrap();
        assert!(!d.degraded());
    }

    #[tokio::test]
    async fn over_limit_cache_answers_until_the_retry_after_without_asking() {
        let rig = rig(1, true, usize::MAX);
        let hammer = request("error", &[("a", "h")]);
        for _ in 0..4 {
            assert_eq!(rig.limiter.decide(&hammer).await.unwrap().overall, Code::Ok);
        }
        let first = rig.limiter.decide(&hammer).await.unwrap();
        assert_eq!(first.overall, Code::OverLimit);
        assert_eq!(first.statuses[0].basis, Basis::Backend);
        assert_eq!(first.statuses[0].retry_after_ms, Some(Some(250)));
        let asked = rig.backend.calls();
        for step in 0..5 {
            rig.clock.advance(49);
            let d = rig.limiter.decide(&hammer).await.unwrap();
            assert_eq!(d.overall, Code::OverLimit);
            assert_eq!(d.statuses[0].basis, Basis::Cached);
            assert_eq!(
                d.statuses[0].retry_after_ms,
                Some(Some(250 - 49 * (step + 1)))
            );
        }
        assert_eq!(rig.backend.calls(), asked, "Redis was not asked");
        rig.clock.advance(5);
        let d = rig.limiter.decide(&hammer).await.unwrap();
        assert_eq!(d.statuses[0].basis, Basis::Backend);
        assert_eq!(d.overall, Code::Ok, "a token is back after 250 ms");
        assert_eq!(rig.backend.calls(), asked + 1);
        assert_eq!(
            rig.limiter
                .resilience()
                .over_limit_cache()
                .unwrap()
                .answered(),
            5
        );
    }

    #[tokio::test]
    async fn a_cached_key_rejects_the_whole_request_and_charges_no_other() {
        let rig = rig(1, true, usize::MAX);
        for _ in 0..5 {
            rig.limiter
                .decide(&request("error", &[("a", "full")]))
                .await
                .unwrap();
        }
        let asked = rig.backend.calls();
        // `b` has tokens, but `a` is known over limit: nothing is asked, nothing taken.
        for _ in 0..3 {
            let d = rig
                .limiter
                .decide(&request("error", &[("b", "spare"), ("a", "full")]))
                .await
                .unwrap();
            assert_eq!(d.overall, Code::OverLimit);
            assert_eq!(d.statuses[0].basis, Basis::NotEvaluated);
            assert_eq!(d.statuses[0].code, Code::Ok);
            assert_eq!(d.statuses[0].limit, None);
            assert_eq!(d.statuses[1].basis, Basis::Cached);
            assert_eq!(d.statuses[1].code, Code::OverLimit);
        }
        assert_eq!(rig.backend.calls(), asked);
        let b = rig
            .limiter
            .decide(&request("error", &[("b", "spare")]))
            .await
            .unwrap();
        assert_eq!(b.statuses[0].remaining, 3, "b was never charged");
    }

    #[tokio::test]
    async fn shadow_keys_and_refunds_always_reach_the_backend() {
        let rig = rig(1, true, usize::MAX);
        // The shadow rule is over limit after one hit but never rejects: the cache must not
        // turn it into a rejection of the request.
        for _ in 0..3 {
            let d = rig
                .limiter
                .decide(&request("error", &[("s", "1"), ("a", "shadowed")]))
                .await
                .unwrap();
            assert_eq!(d.overall, Code::Ok);
            assert_eq!(d.statuses[0].basis, Basis::Backend);
        }
        for _ in 0..5 {
            rig.limiter
                .decide(&request("error", &[("a", "r")]))
                .await
                .unwrap();
        }
        let asked = rig.backend.calls();
        let mut refund = request("error", &[("a", "r")]);
        refund.descriptors[0].is_negative_hits = true;
        let d = rig.limiter.decide(&refund).await.unwrap();
        assert_eq!(d.statuses[0].basis, Basis::Backend);
        assert_eq!(rig.backend.calls(), asked + 1);
        // The refund gave a token back, and the cache forgot the key: the next take is asked.
        let d = rig
            .limiter
            .decide(&request("error", &[("a", "r")]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::Ok);
        assert_eq!(d.statuses[0].basis, Basis::Backend);
    }

    const LEASED: &str = "domain: lease
descriptors:
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 20, lease: 5}
  - key: one
    rate_limit: {unit: hour, requests_per_unit: 1}
";

    fn leased_rig() -> (Rig, Arc<LeaseStore>) {
        let sources = vec![("lease.yaml".to_owned(), LEASED.to_owned())];
        let config = Arc::new(ArcSwap::from_pointee(load_sources(&sources).unwrap()));
        let clock = ManualClock::new(1_000_000);
        let backend = Arc::new(Flaky {
            inner: MemoryBackend::new(Arc::new(clock.clone()), MemoryOptions::default()),
            calls: AtomicUsize::new(0),
            failing: Mutex::new(HashSet::new()),
            stalled: AtomicBool::new(false),
        });
        let resilience = Resilience::new(
            &ResilienceOptions::default(),
            Arc::new(clock.clone()),
            Arc::new(Replicas::fixed(1)),
        );
        let store = Arc::new(LeaseStore::new(crate::lease::LeaseOptions {
            max_keys: 100,
            lifetime_ms: 1_000,
        }));
        let limiter = Limiter::with_resilience(
            config,
            backend.clone(),
            LimiterOptions::default(),
            resilience,
        )
        .with_leases(store.clone());
        let rig = Rig {
            limiter,
            backend,
            clock,
        };
        (rig, store)
    }

    async fn code(rig: &Rig, descriptors: &[(&str, &str)]) -> Code {
        rig.limiter
            .decide(&request("lease", descriptors))
            .await
            .unwrap()
            .overall
    }

    #[tokio::test]
    async fn leased_hits_cost_one_backend_call_per_batch_and_never_exceed_the_limit() {
        let (rig, store) = leased_rig();
        let mut ok = 0;
        for _ in 0..30 {
            ok += usize::from(code(&rig, &[("hot", "k")]).await == Code::Ok);
        }
        assert_eq!(ok, 20, "the whole limit and no more");
        // Four batches of 5, then one rejected call; the over-limit cache is off here.
        assert_eq!(rig.backend.calls(), 4 + 10);
        assert_eq!(store.local_total(), 16);
        assert_eq!(store.refill_total(), 4);
        let d = rig
            .limiter
            .decide(&request("lease", &[("hot", "r")]))
            .await
            .unwrap();
        assert_eq!(
            d.statuses[0].remaining, 19,
            "15 in the bucket after the first batch, 4 in the lease"
        );
    }

    #[tokio::test]
    async fn a_rejected_request_gives_its_leased_tokens_back() {
        let (rig, store) = leased_rig();
        assert_eq!(code(&rig, &[("hot", "k")]).await, Code::Ok);
        assert_eq!(code(&rig, &[("hot", "k"), ("one", "x")]).await, Code::Ok);
        let calls = rig.backend.calls();
        // `one` is spent: the request is rejected and `hot`'s local token goes back.
        for _ in 0..3 {
            assert_eq!(
                code(&rig, &[("hot", "k"), ("one", "x")]).await,
                Code::OverLimit
            );
        }
        assert_eq!(rig.backend.calls(), calls + 3);
        assert_eq!(store.tokens(rig.clock.now_ms()), 3);
        // A backend failure under `error` fails the call and gives the reservation back too.
        rig.backend.fail("");
        assert!(
            rig.limiter
                .decide(&request("lease", &[("hot", "k"), ("one", "y")]))
                .await
                .is_err()
        );
        rig.backend.heal();
        assert_eq!(store.tokens(rig.clock.now_ms()), 3);
        // A short lease pays what it has and the backend the rest: 3 local + 2 from the bucket.
        let mut five = request("lease", &[("hot", "k")]);
        five.hits_addend = 5;
        let d = rig.limiter.decide(&five).await.unwrap();
        assert_eq!(d.overall, Code::Ok);
        // The bucket had 15: 2 for the request and 3 more for the lease (batch 5).
        assert_eq!(d.statuses[0].remaining, 10 + 3);
        assert_eq!(store.tokens(rig.clock.now_ms()), 3);
    }

    /// A decision dropped while its backend call is out (the caller's deadline) gives back what
    /// it took from its lease and stops holding the lease as being refilled.
    #[tokio::test]
    async fn a_cancelled_decision_gives_its_reservations_back() {
        let (rig, store) = leased_rig();
        rig.backend.stalled.store(true, Ordering::SeqCst);
        let new_key = request("lease", &[("hot", "new")]);
        assert!(rig.limiter.decide(&new_key).now_or_never().is_none());
        rig.backend.stalled.store(false, Ordering::SeqCst);
        // The new lease is empty and expired: nothing holds it, the sweep drops it.
        assert_eq!(rig.limiter.return_expired_leases().await, 0);
        assert!(
            store.is_empty(),
            "the cancelled refill no longer holds the lease"
        );

        assert_eq!(code(&rig, &[("hot", "k")]).await, Code::Ok);
        assert_eq!(store.tokens(rig.clock.now_ms()), 4);
        // Five hits: the lease's 4 are taken, the call for the rest stalls and is dropped.
        rig.backend.stalled.store(true, Ordering::SeqCst);
        let mut five = request("lease", &[("hot", "k")]);
        five.hits_addend = 5;
        assert!(rig.limiter.decide(&five).now_or_never().is_none());
        rig.backend.stalled.store(false, Ordering::SeqCst);
        assert_eq!(store.tokens(rig.clock.now_ms()), 4, "the 4 are back");
        rig.clock.advance(1_000);
        assert_eq!(rig.limiter.return_expired_leases().await, 4);
        assert!(store.is_empty());
    }

    #[tokio::test]
    async fn expired_leases_are_not_spent_and_go_back() {
        let (rig, store) = leased_rig();
        assert_eq!(code(&rig, &[("hot", "k")]).await, Code::Ok);
        assert_eq!(store.tokens(rig.clock.now_ms()), 4);
        rig.clock.advance(1_000);
        let calls = rig.backend.calls();
        assert_eq!(code(&rig, &[("hot", "k")]).await, Code::Ok);
        assert_eq!(
            rig.backend.calls(),
            calls + 1,
            "the expired lease did not pay"
        );
        assert_eq!(rig.limiter.return_expired_leases().await, 4);
        assert_eq!(store.returned_total(), 4);
        // Paid locally: what the bucket said at the last refill (20 - 5 - 5, the refund came
        // after) and the 3 left here.
        let d = rig
            .limiter
            .decide(&request("lease", &[("hot", "k")]))
            .await
            .unwrap();
        assert_eq!(d.statuses[0].remaining, 10 + 3);
        assert_eq!(rig.limiter.return_all_leases().await, 3);
    }

    #[tokio::test]
    async fn repeated_keys_are_paid_together_past_the_linear_dedupe() {
        let rig = rig(1, false, usize::MAX);
        // 20 distinct buckets, then the first and the last again: the repeats are found by
        // comparing keys (first) and through the map built once there are 16 hits (last).
        let mut values: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
        values.push("v0".into());
        values.push("v19".into());
        values.push("v19".into());
        let pairs: Vec<(&str, &str)> = values.iter().map(|v| ("a", v.as_str())).collect();
        let d = rig.limiter.decide(&request("error", &pairs)).await.unwrap();
        let remaining: Vec<u64> = d.statuses.iter().map(|s| s.remaining).collect();
        assert_eq!(remaining[0], 2, "v0: two hits of 4");
        assert_eq!(remaining[19], 1, "v19: three hits of 4");
        assert_eq!(remaining[20], 2);
        assert_eq!(remaining[22], 1);
        assert!(remaining[1..19].iter().all(|&r| r == 3), "{remaining:?}");
        assert_eq!(d.overall, Code::Ok);
    }

    /// Whole tokens shard `i` of `h=<value>` in `domain` holds, asked of the backend directly.
    async fn shard_tokens(rig: &Rig, domain: &str, value: &str, shard: u8) -> u64 {
        let key = crate::key::bucket_key(
            "sluice:",
            domain,
            &[Entry::new("h", value)],
            RuleTag::Shard(shard),
            Algorithm::TokenBucket,
        );
        let check = Hit::new(
            key,
            BucketParams {
                capacity: 2,
                requests_per_unit: 2,
                unit_ms: 3_600_000,
            },
            0,
        );
        rig.backend.inner.check(&[check]).await.unwrap()[0].remaining
    }

    #[test]
    fn consecutive_requests_spread_evenly_over_the_shards() {
        for n in [2u32, 3, 4, 7, 64] {
            for start in [0u64, 1, 12_345, u64::MAX - 3, 1 << 63, 0x9E37_79B9] {
                for per_shard in [1u64, 5, 25] {
                    let mut counts = vec![0u64; n as usize];
                    for k in 0..u64::from(n) * per_shard {
                        let shard = shard_of(start.wrapping_add(k), n);
                        counts[usize::from(shard)] += 1;
                    }
                    assert!(
                        counts.iter().all(|&c| c.abs_diff(per_shard) <= 2),
                        "{n} shards from {start}: {counts:?}"
                    );
                }
            }
        }
        assert_eq!(shard_of(7, 1), 0);
    }

    #[tokio::test]
    async fn a_sharded_rule_admits_its_limit_over_its_shards_and_reports_the_full_limit() {
        let rig = rig(1, false, usize::MAX);
        let mut ok = 0;
        for _ in 0..32 {
            let d = rig
                .limiter
                .decide(&request("error", &[("h", "k")]))
                .await
                .unwrap();
            let status = &d.statuses[0];
            let limit = status.limit.as_ref().unwrap();
            assert_eq!((limit.requests_per_unit, limit.capacity), (8, 8));
            assert!(status.remaining <= 1, "a shard holds 2: {status:?}");
            if d.overall == Code::Ok {
                ok += 1;
            } else {
                // A shard's retry-after: one token of 2 per hour comes back in 30 minutes (the
                // whole rule's would be 7.5), to the millisecond the doubles round to.
                let wait = status.retry_after_ms.flatten().unwrap();
                assert!((1_800_000..=1_800_001).contains(&wait), "{wait}");
            }
        }
        assert_eq!(ok, 8, "4 shards × 2");
        for shard in 0..4 {
            assert_eq!(shard_tokens(&rig, "error", "k", shard).await, 0, "{shard}");
        }
        // One backend call per request: a request reaches one shard only.
        assert_eq!(rig.backend.calls(), 32);
    }

    #[tokio::test]
    async fn duplicates_in_one_request_share_a_shard_and_overrides_are_not_sharded() {
        let rig = rig(1, false, usize::MAX);
        let limiter = rig.limiter.with_shard_cursor(0);
        let rig = Rig { limiter, ..rig };
        let first = shard_of(0, 4);
        let d = rig
            .limiter
            .decide(&request("error", &[("h", "d"), ("h", "d")]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::Ok);
        assert_eq!(d.statuses[0].remaining, 0, "both hits on one shard of 2");
        assert_eq!(d.statuses[1].remaining, 0);
        for shard in 0..4 {
            let expected = if shard == first { 0 } else { 2 };
            assert_eq!(shard_tokens(&rig, "error", "d", shard).await, expected);
        }
        // Three hits need more than a shard holds: rejected, and nothing is taken.
        let second = shard_of(1, 4);
        let d = rig
            .limiter
            .decide(&request("error", &[("h", "e"), ("h", "e"), ("h", "e")]))
            .await
            .unwrap();
        assert_eq!(d.overall, Code::OverLimit);
        assert_eq!(d.statuses[0].retry_after_ms, Some(None), "never: 3 > 2");
        assert_eq!(shard_tokens(&rig, "error", "e", second).await, 2);

        // A request `limit` override has its own, unsharded bucket: 3 per hour, all of it.
        let mut overridden = request("error", &[("h", "o")]);
        overridden.descriptors[0].limit_override = Some(crate::request::LimitOverride {
            requests_per_unit: 3,
            unit: Unit::Hour,
        });
        let mut codes = Vec::new();
        for _ in 0..4 {
            codes.push(rig.limiter.decide(&overridden).await.unwrap().overall);
        }
        assert_eq!(codes, [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit]);
        let key = crate::key::bucket_key(
            "sluice:",
            "error",
            &[Entry::new("h", "o")],
            RuleTag::Override(crate::request::LimitOverride {
                requests_per_unit: 3,
                unit: Unit::Hour,
            }),
            Algorithm::TokenBucket,
        );
        assert!(!key.contains("~s"), "{key}");
        for shard in 0..4 {
            assert_eq!(
                shard_tokens(&rig, "error", "o", shard).await,
                2,
                "untouched"
            );
        }
    }

    #[tokio::test]
    async fn a_sharded_rule_falls_back_to_one_local_bucket_of_the_full_limit() {
        // 3 replicas: the full limit's share is ceil(8 / 3) = 3; per shard it would be
        // 4 × ceil(2 / 3) = 4.
        let rig = rig(3, false, usize::MAX);
        rig.backend.fail("");
        let mut ok = 0;
        for _ in 0..12 {
            let d = rig
                .limiter
                .decide(&request("local", &[("h", "x")]))
                .await
                .unwrap();
            assert_eq!(d.statuses[0].basis, Basis::Degraded(FailureMode::Local));
            ok += usize::from(d.overall == Code::Ok);
        }
        assert_eq!(ok, 3);
        let local = rig.limiter.resilience().local.store().live_buckets();
        assert_eq!(local, 1, "one local bucket, not one per shard");
    }

    #[tokio::test]
    async fn in_flight_bound_refuses_at_once_and_frees_on_completion() {
        let rig = rig(1, false, 1);
        // Hold the one place, as a decision waiting on a stalled Redis would.
        let gate = rig.limiter.resilience().in_flight();
        let place = gate.enter().unwrap();
        let refused = rig.limiter.decide(&request("error", &[("a", "1")])).await;
        assert_eq!(refused, Err(LimitError::Overloaded(1)));
        drop(place);
        assert!(
            rig.limiter
                .decide(&request("error", &[("a", "1")]))
                .await
                .is_ok()
        );
        assert_eq!(gate.current(), 0);
    }
}
