//! The push: every push interval, each pool re-plans its data planes' shares, takes from (or
//! gives back to) the shared bucket, and its assignments are queued for their streams.
//!
//! RLQS must never cost RLS its decisions: the pools are planned and asked of the backend
//! [`PUSH_CHUNK`] at a time, one call in flight, the state's lock released and the worker
//! yielded between chunks. So RLS calls queue behind at most one chunk of RLQS keys in Redis (or
//! the memory backend's maps), report handling waits for at most one chunk's planning, and a
//! replica with more pools than a push interval can serve pushes less often instead of
//! starving RLS (each push still renews every pool; `--rlqs-assignment-ttl` must cover a whole
//! push for assignments not to lapse).

use std::collections::HashMap;
use std::time::Duration;

use super::{Action, Binding, EndReason, PoolEntry, Quotas, State, StreamId};
use crate::algorithm::{Demand, Verdict};
use crate::backend::{Backend, BackendError, Hit};
use crate::rule::Rule;
use sluice_core::quota::{Answer, Ask, MemberId, PoolOptions, Strategy};

/// Pools planned and asked of the backend in one call (the default `--redis-max-batch`: one
/// script call). The push awaits each call before planning the next chunk.
pub(super) const PUSH_CHUNK: usize = 128;

impl<B: Backend> Quotas<B> {
    /// One push: rebind after a reload, abandon idle subscriptions, re-send standing
    /// assignments about to expire; then, [`PUSH_CHUNK`] pools at a time, plan, one backend
    /// call, settle and queue each stream its assignments; then end the streams half-closed
    /// before the push began.
    pub async fn push(&self) {
        let now = self.now_ms();
        let mut outgoing: HashMap<StreamId, Vec<Action>> = HashMap::new();
        let (keys, number) = {
            let mut state = self.lock();
            state.pushes += 1;
            self.rebind(&mut state, now, &mut outgoing);
            self.abandon_idle(&mut state, now, &mut outgoing);
            self.resend_standing(&mut state, now, &mut outgoing);
            deliver(&state, outgoing);
            let keys: Vec<String> = state.pools.keys().cloned().collect();
            (keys, state.pushes)
        };
        for chunk in keys.chunks(PUSH_CHUNK) {
            self.push_chunk(chunk).await;
            tokio::task::yield_now().await;
        }
        self.end_half_closed(number);
    }

    /// Plans the pools of `keys`, asks the backend for all of them in one call, settles and
    /// queues their assignments.
    async fn push_chunk(&self, keys: &[String]) {
        let now = self.now_ms();
        let mut outgoing: HashMap<StreamId, Vec<Action>> = HashMap::new();
        let (hits, asked) = {
            let mut state = self.lock();
            self.plan(&mut state, keys, now, &mut outgoing)
        };
        let results = if hits.is_empty() {
            Vec::new()
        } else {
            self.limiter.backend().check_each(&hits).await
        };
        self.forget_refunded(&hits, &results);
        let replicas = self.limiter.resilience().replicas().current();
        let now = self.now_ms();
        let mut state = self.lock();
        for ((key, ask), result) in asked.into_iter().zip(results) {
            let Some(entry) = state.pools.get_mut(&key) else {
                continue;
            };
            let answer = answer(entry, ask, result, replicas);
            let assigned = entry.pool.settle(now, &self.options.pool, answer);
            emit(entry, assigned, &self.options.pool, &mut outgoing);
        }
        deliver(&state, outgoing);
    }

    /// A pool's tokens given back to a key make this replica's cached rejection of it stale (it
    /// was learnt while the pool held them): the over-limit cache forgets the key, as it does
    /// for an RLS refund, so RLS asks the backend again.
    fn forget_refunded(&self, hits: &[Hit], results: &[Result<Verdict, BackendError>]) {
        let Some(cache) = self.limiter.resilience().over_limit.as_ref() else {
            return;
        };
        for (hit, result) in hits.iter().zip(results) {
            if hit.demand.refund && result.is_ok() {
                cache.forget(&hit.key);
            }
        }
    }

    /// Ends (status OK) and closes the streams half-closed before push number `number` began:
    /// that push answered their last report.
    fn end_half_closed(&self, number: u64) {
        let mut state = self.lock();
        let answered: Vec<StreamId> = state
            .streams
            .iter()
            .filter(|(_, s)| s.half_closed.is_some_and(|n| n < number))
            .map(|(id, _)| *id)
            .collect();
        for id in answered {
            if let Some(s) = state.streams.get(&id) {
                s.outbox.end(
                    EndReason::HalfClosed,
                    "the data plane closed its reports; the last one was answered".into(),
                );
            }
            self.remove_stream(&mut state, id);
        }
    }

    /// Queues again each standing assignment that would expire less than half a push interval
    /// after the next push (the margin for a late push and the delivery).
    fn resend_standing(
        &self,
        state: &mut State,
        now: u64,
        outgoing: &mut HashMap<StreamId, Vec<Action>>,
    ) {
        let ttl = self.standing_ttl();
        let push = self.options.push_interval;
        let due_after =
            u64::try_from(ttl.saturating_sub(push + push / 2).as_millis()).unwrap_or(u64::MAX);
        for (stream_id, stream) in &mut state.streams {
            for (bucket, sub) in &mut stream.buckets {
                let Binding::Standing(strategy) = sub.binding else {
                    continue;
                };
                if now.saturating_sub(sub.standing_sent_ms) < due_after {
                    continue;
                }
                sub.standing_sent_ms = now;
                outgoing
                    .entry(*stream_id)
                    .or_default()
                    .push(Action::Assign {
                        bucket: bucket.clone(),
                        strategy,
                        ttl,
                    });
            }
        }
    }

    /// `assignment_time_to_live` of a standing assignment: `--rlqs-assignment-ttl` rounded up to
    /// whole seconds (Envoy reads only the seconds; nothing is prepaid, so longer costs nothing
    /// and a reload's change is pushed at once).
    pub(super) fn standing_ttl(&self) -> Duration {
        let ttl = self.options.pool.ttl_ms.max(1);
        Duration::from_secs(ttl.div_ceil(1000))
    }

    /// Plans the pools of `keys` (those still there); returns the backend hits and, for each,
    /// its pool and ask. A pool left without members gives back what it holds and is dropped.
    fn plan(
        &self,
        state: &mut State,
        keys: &[String],
        now: u64,
        outgoing: &mut HashMap<StreamId, Vec<Action>>,
    ) -> (Vec<Hit>, Vec<(String, Ask)>) {
        let mut hits = Vec::new();
        let mut asked = Vec::new();
        let mut empty = Vec::new();
        for key in keys {
            let Some(entry) = state.pools.get_mut(key) else {
                continue;
            };
            if entry.pool.is_empty() {
                empty.push(key.clone());
                continue;
            }
            let mut ask = entry.pool.plan(now, &self.options.pool);
            if let (Ask::Take(n), Some(limit)) = (ask, entry.take_limit) {
                ask = Ask::Take(n.min(limit));
            }
            let hit = match ask {
                Ask::Nothing => None,
                Ask::Take(n) => Some(take_hit(key, &entry.rule, entry.pool.params(), n)),
                Ask::Refund(n) => Some(refund_hit(key, &entry.rule, entry.pool.params(), n)),
            };
            match hit {
                Some(hit) => {
                    hits.push(hit);
                    asked.push((key.clone(), ask));
                }
                None => {
                    let assigned = entry
                        .pool
                        .settle(now, &self.options.pool, Answer::Granted(0));
                    emit(entry, assigned, &self.options.pool, outgoing);
                }
            }
        }
        for key in empty {
            if let Some(mut entry) = state.pools.remove(&key)
                && let Some(tokens) = entry.pool.drain()
                && tokens > 0
            {
                hits.push(refund_hit(&key, &entry.rule, entry.pool.params(), tokens));
                asked.push((key, Ask::Refund(tokens)));
            }
        }
        super::shrink(&mut state.pools);
        (hits, asked)
    }
}

/// Queues each stream's actions in its outbox.
fn deliver(state: &State, outgoing: HashMap<StreamId, Vec<Action>>) {
    for (stream, actions) in outgoing {
        if let Some(s) = state.streams.get(&stream) {
            s.outbox.push(actions);
        }
    }
}

/// The pool's answer from the backend's result for its hit.
fn answer(
    entry: &mut PoolEntry,
    ask: Ask,
    result: Result<Verdict, BackendError>,
    replicas: u64,
) -> Answer {
    match (ask, result) {
        (_, Err(_)) => Answer::Failed {
            mode: entry.failure_mode,
            replicas,
        },
        (Ask::Take(_), Ok(verdict)) => {
            // Only a window's exact take needs a smaller ask after a refusal; a lease take already
            // gives whatever the key holds (a limit of 0 made its next ask a lease of 0 - 1 tokens).
            entry.take_limit = (!verdict.allowed && !entry.rule.algorithm.takes_lease())
                .then_some(verdict.remaining);
            Answer::Granted(verdict.granted)
        }
        (Ask::Refund(n), Ok(_)) => Answer::Refunded(n),
        (Ask::Nothing, Ok(_)) => Answer::Granted(0),
    }
}

/// A take of up to `n` tokens: a lease take (at least one token, then as many more as the key
/// holds) where the algorithm leases; an exact take for a window, whose count cannot give part.
fn take_hit(key: &str, rule: &Rule, params: crate::algorithm::BucketParams, n: u64) -> Hit {
    let leases = rule.algorithm.takes_lease();
    Hit {
        key: key.to_owned(),
        demand: Demand {
            lease: if leases { n - 1 } else { 0 },
            ..Demand::take(rule.algorithm, params, if leases { 1 } else { n })
        },
        rule: Some(rule.id),
    }
}

fn refund_hit(key: &str, rule: &Rule, params: crate::algorithm::BucketParams, n: u64) -> Hit {
    Hit {
        key: key.to_owned(),
        demand: Demand {
            refund: true,
            ..Demand::take(rule.algorithm, params, n)
        },
        rule: Some(rule.id),
    }
}

/// Queues a pool's assignments for their streams.
fn emit(
    entry: &PoolEntry,
    assigned: Vec<(MemberId, Strategy)>,
    options: &PoolOptions,
    outgoing: &mut HashMap<StreamId, Vec<Action>>,
) {
    let ttl = Duration::from_millis(options.ttl_ms);
    for (member, strategy) in assigned {
        if let Some((stream, bucket)) = entry.members.get(&member) {
            outgoing.entry(*stream).or_default().push(Action::Assign {
                bucket: bucket.clone(),
                strategy,
                ttl,
            });
        }
    }
}
