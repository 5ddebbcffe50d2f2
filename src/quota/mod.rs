//! The Rate Limit Quota Service (RLQS): the limiter's rules enforced inside the data planes.
//!
//! A data plane (Envoy's `rate_limit_quota` filter, a proxyless gRPC server) holds one stream
//! open and reports, per bucket id, what it admitted and denied; [`Quotas`] answers with
//! assignments it has already paid for from the shared bucket (`sluice_core::quota::pool` states
//! the contract and the bound). One request path, in hops:
//!
//! 1. `service.rs` (the tonic adapter) validates each report and calls [`Quotas::report`];
//! 2. the first report of a bucket id subscribes it: [`sluice_core::config::Domain::place`]
//!    finds its rule and storage key — the key an RLS descriptor of the same entries charges —
//!    and the subscription joins that key's [`Pool`] (a rule-less, unlimited, shadow or blocking
//!    bucket gets a standing ALLOW_ALL or DENY_ALL instead);
//! 3. every push interval [`Quotas::push`] plans each pool, asks the backend for all of them in
//!    one call, settles and sends each stream its assignments (a rule's failure policy assigns
//!    where the backend failed); subscriptions that stopped reporting, or whose rule a reload
//!    removed, are abandoned.

mod outbox;
mod push;
mod service;
mod stats;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::backend::Backend;
use crate::config::Config;
use crate::key::{RuleTag, write_shared_bucket_key};
use crate::limiter::Limiter;
use crate::request::Entry;
use crate::rule::{FailureMode, Limit, Rule};
use sluice_core::quota::{MemberId, Pool, PoolOptions, Strategy};

pub use outbox::{End, Next, Outbox};
pub use service::QuotaHandler;
pub use stats::{EndReason, Ignored, QuotaStats};

/// A bucket id as the data plane sent it (sorted by key).
pub type BucketId = Arc<BTreeMap<String, String>>;

/// `--rlqs-*` settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuotaOptions {
    pub push_interval: Duration,
    pub pool: PoolOptions,
    /// A subscription with no report for this long is abandoned.
    pub idle_timeout: Duration,
    pub max_buckets_per_stream: usize,
    /// Most subscriptions on this replica, all streams together.
    pub max_subscriptions: usize,
    pub max_bucket_entries: usize,
    /// A stream that sends no first report for this long is ended.
    pub first_report_timeout: Duration,
}

impl QuotaOptions {
    pub const DEFAULT_PUSH_INTERVAL: Duration = Duration::from_secs(1);
    pub const DEFAULT_ASSIGNMENT_TTL: Duration = Duration::from_secs(3);
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
    pub const DEFAULT_MAX_BUCKETS_PER_STREAM: usize = 10_000;
    pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 100_000;
    pub const DEFAULT_MAX_BUCKET_ENTRIES: usize = 16;
    pub const DEFAULT_FIRST_REPORT_TIMEOUT: Duration = Duration::from_secs(10);

    /// A pool's shape for pushes every `push_interval` of assignments that live
    /// `assignment_ttl`: a token bucket holds one push interval of its rate, and plans one ahead.
    pub fn pool(push_interval: Duration, assignment_ttl: Duration) -> PoolOptions {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        PoolOptions {
            ttl_ms: ms(assignment_ttl),
            burst_ms: ms(push_interval),
            horizon_ms: ms(push_interval),
        }
    }
}

impl Default for QuotaOptions {
    fn default() -> Self {
        QuotaOptions {
            push_interval: Self::DEFAULT_PUSH_INTERVAL,
            pool: Self::pool(Self::DEFAULT_PUSH_INTERVAL, Self::DEFAULT_ASSIGNMENT_TTL),
            idle_timeout: Self::DEFAULT_IDLE_TIMEOUT,
            max_buckets_per_stream: Self::DEFAULT_MAX_BUCKETS_PER_STREAM,
            max_subscriptions: Self::DEFAULT_MAX_SUBSCRIPTIONS,
            max_bucket_entries: Self::DEFAULT_MAX_BUCKET_ENTRIES,
            first_report_timeout: Self::DEFAULT_FIRST_REPORT_TIMEOUT,
        }
    }
}

/// One bucket's usage in a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    pub bucket: BucketId,
    pub allowed: u64,
    pub denied: u64,
}

/// One instruction for one bucket of a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// `ttl` is `assignment_time_to_live`: every assignment expires (Envoy reads an unset one as
    /// 0 s), so each is re-sent before it does.
    Assign {
        bucket: BucketId,
        strategy: Strategy,
        ttl: Duration,
    },
    Abandon {
        bucket: BucketId,
    },
}

type StreamId = u64;

/// Where a subscription's assignments come from.
#[derive(Clone, Debug, PartialEq)]
enum Binding {
    /// The pool of a storage key.
    Pool(PoolBinding),
    /// A standing assignment: no rule, `unlimited`, shadow mode (ALLOW_ALL), a blocking
    /// `requests_per_unit: 0` rule (DENY_ALL).
    Standing(Strategy),
}

/// A bucket's storage key and the rule that shapes it. Equal when the key is: a reload that keeps
/// the key keeps the subscription (and its pool takes the rule's new shape).
#[derive(Clone, Debug)]
struct PoolBinding {
    key: String,
    rule: Arc<Rule>,
    failure_mode: FailureMode,
}

impl PartialEq for PoolBinding {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

struct Subscription {
    member: MemberId,
    binding: Binding,
    last_report_ms: u64,
    /// When a standing assignment was last queued (a pool's are re-sent every push).
    standing_sent_ms: u64,
}

struct Stream {
    domain: String,
    outbox: Arc<Outbox>,
    buckets: HashMap<BucketId, Subscription>,
    /// The data plane half-closed during push number `n`: the first push that starts after it
    /// answers its last report and ends the stream.
    half_closed: Option<u64>,
}

/// One storage key's pool and who is in it.
struct PoolEntry {
    pool: Pool,
    rule: Arc<Rule>,
    failure_mode: FailureMode,
    members: HashMap<MemberId, (StreamId, BucketId)>,
    /// A window rule's last refused take: ask no more than this next time (a window's count
    /// cannot give a part of a take).
    take_limit: Option<u64>,
}

impl PoolEntry {
    /// Takes a reloaded rule's limit and failure mode; members and held tokens stay.
    fn reshape(&mut self, binding: &PoolBinding) {
        if let Limit::Bucket(rate) = binding.rule.limit {
            self.pool.set_params(rate.bucket());
        }
        self.rule = binding.rule.clone();
        self.failure_mode = binding.failure_mode;
        self.take_limit = None;
    }
}

#[derive(Default)]
struct State {
    streams: HashMap<StreamId, Stream>,
    pools: HashMap<String, PoolEntry>,
    next_id: u64,
    /// Pushes started so far.
    pushes: u64,
    /// The config the subscriptions were bound with (a reload rebinds them).
    config: Option<Arc<Config>>,
}

/// Share of the push interval a push may come early by (see [`Quotas::run`]).
const PUSH_JITTER: f64 = 0.2;

/// How long shutdown waits for the pools' last refund.
const GIVE_BACK_DEADLINE: Duration = Duration::from_secs(1);

/// A reported count above this in one report is not a count (2^40: over a trillion requests).
const ABSURD_COUNT: u64 = 1 << 40;

/// The RLQS side of one replica, over the limiter's config, backend and failure policies.
pub struct Quotas<B> {
    limiter: Arc<Limiter<B>>,
    options: QuotaOptions,
    state: Mutex<State>,
    wake: Notify,
    stats: Arc<QuotaStats>,
}

impl<B: Backend> Quotas<B> {
    pub fn new(limiter: Arc<Limiter<B>>, options: QuotaOptions) -> Self {
        Quotas {
            limiter,
            options,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            stats: Arc::new(QuotaStats::default()),
        }
    }

    pub fn stats(&self) -> &Arc<QuotaStats> {
        &self.stats
    }

    pub fn options(&self) -> &QuotaOptions {
        &self.options
    }

    fn now_ms(&self) -> u64 {
        self.limiter.resilience().clock.now_ms()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What this replica's pool of storage key `key` holds, if a subscription shares it: tokens
    /// held (negative: owed) and members.
    pub fn pool_holding(&self, key: &str) -> Option<(f64, usize)> {
        let state = self.lock();
        let entry = state.pools.get(key)?;
        Some((entry.pool.held(), entry.members.len()))
    }

    /// Forgets what the pool of `key` holds or owes, for a reset bucket: members and their
    /// assignments stay, and the next push takes from the fresh bucket what the assignments it
    /// keeps need. The tokens held and members before, if there is such a pool.
    pub fn forget_held(&self, key: &str) -> Option<(f64, usize)> {
        let mut state = self.lock();
        let entry = state.pools.get_mut(key)?;
        entry.take_limit = None;
        Some((entry.pool.forget_held(), entry.members.len()))
    }

    /// Opens a stream for `domain`: its id, and where its assignments arrive.
    pub fn open(&self, domain: &str) -> (StreamId, Arc<Outbox>) {
        let outbox = Arc::new(Outbox::new(domain, self.stats.clone()));
        let mut state = self.lock();
        state.next_id += 1;
        let id = state.next_id;
        state.streams.insert(
            id,
            Stream {
                domain: domain.to_owned(),
                outbox: outbox.clone(),
                buckets: HashMap::new(),
                half_closed: None,
            },
        );
        (id, outbox)
    }

    /// Closes a stream: its subscriptions leave their pools, what they may still admit counted
    /// as spent. Its outbox is left as it is (whoever closes it has ended it).
    pub fn close(&self, stream: StreamId) {
        let mut state = self.lock();
        self.remove_stream(&mut state, stream);
    }

    fn remove_stream(&self, state: &mut State, stream: StreamId) {
        let Some(s) = state.streams.remove(&stream) else {
            return;
        };
        self.stats.unsubscribed(s.buckets.len() as u64);
        for sub in s.buckets.into_values() {
            leave(&mut state.pools, &sub);
        }
        shrink(&mut state.streams);
    }

    /// The data plane half-closed `stream`: the next push answers its last report, then ends it
    /// (status OK) and closes it.
    pub fn half_close(&self, stream: StreamId) {
        let mut state = self.lock();
        let pushes = state.pushes;
        if let Some(s) = state.streams.get_mut(&stream) {
            s.half_closed = Some(pushes);
            self.wake.notify_one();
        }
    }

    /// Ends every stream (the server is stopping): the data planes keep their assignments until
    /// they expire and reconnect to another replica.
    pub fn close_all(&self) {
        let streams: Vec<(StreamId, Arc<Outbox>)> = self
            .lock()
            .streams
            .iter()
            .map(|(id, s)| (*id, s.outbox.clone()))
            .collect();
        for (id, outbox) in streams {
            outbox.end(
                EndReason::Stopping,
                "this sluice replica is stopping: reconnect to another".into(),
            );
            self.close(id);
        }
    }

    /// The usage reports of one message, in order, under one lock; a bucket's first report
    /// subscribes it.
    pub fn report_all(&self, stream: StreamId, usages: Vec<Usage>) {
        let now = self.now_ms();
        let config = self.limiter.config().load_full();
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.config.is_none() {
            state.config = Some(config.clone());
        }
        for usage in usages {
            if usage.allowed > ABSURD_COUNT || usage.denied > ABSURD_COUNT {
                self.stats.count_ignored(Ignored::AbsurdCount);
                continue;
            }
            self.apply_usage(state, &config, stream, usage, now);
        }
    }

    fn apply_usage(
        &self,
        state: &mut State,
        config: &Arc<Config>,
        stream: StreamId,
        usage: Usage,
        now: u64,
    ) {
        let Usage {
            bucket,
            allowed,
            denied,
        } = usage;
        let Some(s) = state.streams.get_mut(&stream) else {
            return;
        };
        if !s.buckets.contains_key(&bucket) {
            if s.buckets.len() >= self.options.max_buckets_per_stream {
                self.stats.count_ignored(Ignored::TooManyBuckets);
                return;
            }
            // The gauge changes only under the state's lock: exact here.
            if self.stats.subscriptions() >= self.options.max_subscriptions as u64 {
                self.stats.count_ignored(Ignored::TooManySubscriptions);
                return;
            }
            state.next_id += 1;
            let member = state.next_id;
            let binding = self.bind(config, &s.domain, &bucket);
            let sub = Subscription {
                member,
                binding,
                last_report_ms: now,
                standing_sent_ms: now,
            };
            match &sub.binding {
                Binding::Standing(strategy) => s.outbox.push([Action::Assign {
                    bucket: bucket.clone(),
                    strategy: *strategy,
                    ttl: self.standing_ttl(),
                }]),
                Binding::Pool(binding) => {
                    join(&mut state.pools, binding, &bucket, member, stream);
                    self.wake.notify_one();
                }
            }
            s.buckets.insert(bucket.clone(), sub);
            self.stats.subscribed(1);
        }
        let sub = s.buckets.get_mut(&bucket).expect("subscribed above");
        sub.last_report_ms = now;
        self.stats.count_reported(allowed, denied);
        if let Binding::Pool(binding) = &sub.binding
            && let Some(entry) = state.pools.get_mut(&binding.key)
        {
            let reported = entry.pool.report(sub.member, now, allowed, denied);
            self.stats.count_slack(reported.slack);
        }
    }

    /// Where `bucket`'s assignments come from under `config`.
    fn bind(&self, config: &Config, domain: &str, bucket: &BucketId) -> Binding {
        let entries: Vec<Entry> = bucket.iter().map(|(k, v)| Entry::new(k, v)).collect();
        let Some(placed) = config.domain(domain).and_then(|d| d.place(&entries).ok()) else {
            return Binding::Standing(Strategy::AllowAll);
        };
        let (descriptor, rule) = placed;
        match rule.limit {
            Limit::Unlimited => Binding::Standing(Strategy::AllowAll),
            Limit::Blocked { .. } => Binding::Standing(Strategy::DenyAll),
            // An in-flight cap needs each request's release, which RLQS never sends.
            Limit::Bucket(_) if rule.shadow_mode || rule.in_flight.is_some() => {
                Binding::Standing(Strategy::AllowAll)
            }
            Limit::Bucket(_) => {
                let mut key = String::new();
                write_shared_bucket_key(
                    &mut key,
                    &self.limiter.options().key_prefix,
                    domain,
                    &descriptor,
                    &rule.shared_values,
                    RuleTag::configured(&rule),
                    rule.algorithm,
                );
                // A compiled rule's failure mode already falls back to its domain's.
                let failure_mode = rule
                    .failure_mode
                    .unwrap_or(self.limiter.options().default_failure_mode);
                Binding::Pool(PoolBinding {
                    key,
                    rule,
                    failure_mode,
                })
            }
        }
    }

    /// Runs [`Quotas::push`] every push interval less up to [`PUSH_JITTER`] of it, at random,
    /// and soon after a new subscription, until `stop` turns true. Never later than the
    /// interval: each assignment is paid until the next push. The jitter keeps replicas' pushes
    /// from holding one order: the shared bucket serves takes first come, first served, and a
    /// replica always pushing just after another would find it empty every time.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let period = || {
            self.options
                .push_interval
                .mul_f64(1.0 - PUSH_JITTER * rand::random::<f64>())
        };
        let mut next = tokio::time::Instant::now() + period();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {
                    next = next.max(tokio::time::Instant::now()) + period();
                }
                () = self.wake.notified() => {
                    // Let the subscriptions of a burst of first reports gather into one push.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ = stop.changed() => {
                    self.close_all();
                    // The emptied pools give back what their data planes can no longer spend.
                    let _ = tokio::time::timeout(GIVE_BACK_DEADLINE, self.push()).await;
                    return;
                }
            }
            self.push().await;
        }
    }

    /// After a reload, re-places every subscription: one whose rule is gone is abandoned; one
    /// whose rule or key changed moves.
    fn rebind(&self, state: &mut State, now: u64, outgoing: &mut HashMap<StreamId, Vec<Action>>) {
        let config = self.limiter.config().load_full();
        let same = state
            .config
            .as_ref()
            .is_some_and(|c| Arc::ptr_eq(c, &config));
        if same {
            return;
        }
        state.config = Some(config.clone());
        let State { streams, pools, .. } = state;
        for (stream_id, stream) in streams.iter_mut() {
            let mut gone = Vec::new();
            for (bucket, sub) in stream.buckets.iter_mut() {
                let binding = self.bind(&config, &stream.domain, bucket);
                if binding == sub.binding {
                    if let Binding::Pool(b) = &binding
                        && let Some(entry) = pools.get_mut(&b.key)
                    {
                        entry.reshape(b);
                    }
                    sub.binding = binding;
                    continue;
                }
                leave(pools, sub);
                let actions = outgoing.entry(*stream_id).or_default();
                match &binding {
                    Binding::Standing(Strategy::AllowAll)
                        if matches!(sub.binding, Binding::Pool(_)) =>
                    {
                        // The rule that limited this bucket is gone.
                        actions.push(Action::Abandon {
                            bucket: bucket.clone(),
                        });
                        self.stats.unsubscribed(1);
                        gone.push(bucket.clone());
                        continue;
                    }
                    Binding::Standing(strategy) => {
                        sub.standing_sent_ms = now;
                        actions.push(Action::Assign {
                            bucket: bucket.clone(),
                            strategy: *strategy,
                            ttl: self.standing_ttl(),
                        });
                    }
                    Binding::Pool(binding) => {
                        join(pools, binding, bucket, sub.member, *stream_id);
                    }
                }
                sub.binding = binding;
            }
            for bucket in gone {
                stream.buckets.remove(&bucket);
            }
        }
    }

    /// Abandons subscriptions that have not reported for `--rlqs-idle-timeout`.
    fn abandon_idle(
        &self,
        state: &mut State,
        now: u64,
        outgoing: &mut HashMap<StreamId, Vec<Action>>,
    ) {
        let idle_ms = u64::try_from(self.options.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        let State { streams, pools, .. } = state;
        for (stream_id, stream) in streams.iter_mut() {
            stream.buckets.retain(|bucket, sub| {
                if now.saturating_sub(sub.last_report_ms) < idle_ms {
                    return true;
                }
                leave(pools, sub);
                self.stats.unsubscribed(1);
                outgoing
                    .entry(*stream_id)
                    .or_default()
                    .push(Action::Abandon {
                        bucket: bucket.clone(),
                    });
                false
            });
        }
    }
}

/// Adds `member` (`bucket` of `stream`) to the pool of its binding, creating the pool.
fn join(
    pools: &mut HashMap<String, PoolEntry>,
    binding: &PoolBinding,
    bucket: &BucketId,
    member: MemberId,
    stream: StreamId,
) {
    let Limit::Bucket(rate) = binding.rule.limit else {
        return;
    };
    let entry = pools
        .entry(binding.key.clone())
        .or_insert_with(|| PoolEntry {
            pool: Pool::new(rate.bucket()),
            failure_mode: binding.failure_mode,
            rule: binding.rule.clone(),
            members: HashMap::new(),
            take_limit: None,
        });
    entry.pool.join(member);
    entry.members.insert(member, (stream, bucket.clone()));
}

/// Takes `sub` out of its pool, if it is in one.
fn leave(pools: &mut HashMap<String, PoolEntry>, sub: &Subscription) {
    if let Binding::Pool(binding) = &sub.binding
        && let Some(entry) = pools.get_mut(&binding.key)
    {
        entry.pool.leave(sub.member);
        entry.members.remove(&sub.member);
        shrink(&mut entry.members);
    }
}

/// Gives a map's memory back once it holds under a quarter of its capacity (the streams and
/// pools of a burst of subscriptions are not kept allocated after they go).
pub(super) fn shrink<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}
