//! Two stores behind one [`Backend`]: the buckets of rules whose unit is a second in one, every
//! other bucket in the main one (envoyproxy/ratelimit's `REDIS_PERSECOND`), so the per-second
//! keys — the most written and the shortest lived — get a Redis of their own.
//!
//! A request's hits are routed by their rule's unit (`params.unit_ms`); each store gets at most
//! one call per request, both calls run concurrently, and the outcomes come back in hit order.
//! Refunds and the over-limit cache need nothing more: a key's unit never changes, so it always
//! reaches the same store.

use std::sync::Arc;

use crate::algorithm::Verdict;
use crate::backend::breaker::BreakerSet;
use crate::backend::{Backend, BackendError, Hit, KeyPeek};

/// `params.unit_ms` of a rule whose unit is a second: the hits the per-second store holds.
const PER_SECOND_UNIT_MS: u64 = 1_000;

/// Whether `hit` belongs to a per-second rule (envoyproxy/ratelimit routes by the unit `SECOND`,
/// which is exactly `unit_ms == 1000` here).
pub fn is_per_second(hit: &Hit) -> bool {
    hit.demand.params.unit_ms == PER_SECOND_UNIT_MS
}

/// The main backend, and optionally one for per-second rules (without it every hit goes to the
/// main backend, exactly as if there were no split).
///
/// Atomicity: each store decides its own hits of a request all-or-nothing, in one call; the
/// two stores are independent, so a rejection in one does not undo a deduction in the other.
/// That is the contract Redis Cluster mode already has for a request whose keys fall in
/// different slots (one atomic call per slot, concurrently, `redis::cluster`), and the one
/// envoyproxy/ratelimit has between its two pools; making the stores agree would cost a
/// second round trip (reserve, then commit or refund) on every mixed request.
pub struct SplitBackend<M, S> {
    main: M,
    per_second: Option<S>,
    /// Both stores' breakers in one view, so readiness and metrics see the per-second endpoints.
    breakers: Option<Arc<BreakerSet>>,
}

/// Which stores a request's hits need.
enum Route {
    Main,
    PerSecond,
    Both,
}

impl<M: Backend, S: Backend> SplitBackend<M, S> {
    pub fn new(main: M, per_second: Option<S>) -> Self {
        let breakers = match (main.breakers(), per_second.as_ref().and_then(S::breakers)) {
            (Some(main), Some(per_second)) => Some(BreakerSet::joined(&main, &[per_second])),
            (main, per_second) => main.or(per_second),
        };
        SplitBackend {
            main,
            per_second,
            breakers,
        }
    }

    pub fn main(&self) -> &M {
        &self.main
    }

    pub fn per_second(&self) -> Option<&S> {
        self.per_second.as_ref()
    }

    fn route(&self, hits: &[Hit]) -> Route {
        if self.per_second.is_none() {
            return Route::Main;
        }
        match hits.iter().filter(|hit| is_per_second(hit)).count() {
            0 => Route::Main,
            n if n == hits.len() => Route::PerSecond,
            _ => Route::Both,
        }
    }

    /// One call to each store that has hits, concurrently; outcomes in hit order.
    async fn decide_each(&self, hits: &[Hit]) -> Vec<Result<Verdict, BackendError>> {
        let per_second = match (self.route(hits), &self.per_second) {
            (Route::PerSecond, Some(per_second)) => return per_second.check_each(hits).await,
            (Route::Both, Some(per_second)) => per_second,
            _ => return self.main.check_each(hits).await,
        };
        let (fast, slow): (Vec<Hit>, Vec<Hit>) = hits.iter().cloned().partition(is_per_second);
        let (fast, slow) =
            futures::future::join(per_second.check_each(&fast), self.main.check_each(&slow)).await;
        let (mut fast, mut slow) = (fast.into_iter(), slow.into_iter());
        hits.iter()
            .map(|hit| {
                let from = if is_per_second(hit) {
                    &mut fast
                } else {
                    &mut slow
                };
                // A store answers once per hit; one that did not is a bug, failed, not trusted.
                from.next().unwrap_or_else(|| {
                    Err(BackendError::Protocol(
                        "backend returned fewer outcomes than hits".into(),
                    ))
                })
            })
            .collect()
    }
}

impl<M: Backend, S: Backend> Backend for SplitBackend<M, S> {
    async fn check_each(&self, hits: &[Hit]) -> Vec<Result<Verdict, BackendError>> {
        self.decide_each(hits).await
    }

    fn name(&self) -> &'static str {
        self.main.name()
    }

    /// Probes both stores (concurrently, so each probe can close its own store's breaker) and
    /// fails when either fails, as a Redis Cluster probe fails when one master does.
    async fn probe(&self) -> Result<(), BackendError> {
        let Some(per_second) = &self.per_second else {
            return self.main.probe().await;
        };
        let (main, per_second) = futures::future::join(self.main.probe(), per_second.probe()).await;
        main.and(per_second)
    }

    fn breakers(&self) -> Option<Arc<BreakerSet>> {
        self.breakers.clone()
    }

    /// Each key from the store its unit routes it to.
    async fn peek(&self, hits: &[Hit]) -> Vec<Result<KeyPeek, BackendError>> {
        let mut out = Vec::with_capacity(hits.len());
        for hit in hits {
            let one = std::slice::from_ref(hit);
            let mut got = match &self.per_second {
                Some(per_second) if is_per_second(hit) => per_second.peek(one).await,
                _ => self.main.peek(one).await,
            };
            out.push(got.pop().unwrap_or_else(|| Err(no_outcome())));
        }
        out
    }

    async fn reset(&self, hits: &[Hit]) -> Vec<Result<bool, BackendError>> {
        let mut out = Vec::with_capacity(hits.len());
        for hit in hits {
            let one = std::slice::from_ref(hit);
            let mut got = match &self.per_second {
                Some(per_second) if is_per_second(hit) => per_second.reset(one).await,
                _ => self.main.reset(one).await,
            };
            out.push(got.pop().unwrap_or_else(|| Err(no_outcome())));
        }
        out
    }
}

/// A store answered a hit with nothing: a bug, failed, not trusted.
fn no_outcome() -> BackendError {
    BackendError::Protocol("backend returned fewer outcomes than hits".into())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::sync::Barrier;

    use super::*;
    use crate::algorithm::BucketParams;
    use crate::backend::memory::{MemoryBackend, MemoryOptions};
    use crate::clock::ManualClock;

    const PER_SECOND: BucketParams = BucketParams {
        capacity: 5,
        requests_per_unit: 5,
        unit_ms: 1_000,
    };
    const PER_MINUTE: BucketParams = BucketParams {
        capacity: 10,
        requests_per_unit: 10,
        unit_ms: 60_000,
    };

    /// A memory store that counts its calls, fails every hit while `down`, and, with a `gate`,
    /// holds each call until the other store's call has started too.
    struct Store {
        inner: MemoryBackend,
        calls: AtomicUsize,
        down: AtomicBool,
        gate: Option<Arc<Barrier>>,
    }

    impl Store {
        fn new(gate: Option<Arc<Barrier>>) -> Store {
            Store {
                inner: MemoryBackend::new(
                    Arc::new(ManualClock::new(1_000_000)),
                    MemoryOptions::default(),
                ),
                calls: AtomicUsize::new(0),
                down: AtomicBool::new(false),
                gate,
            }
        }

        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }

        /// Tokens left in `key`, read with a check-only hit.
        async fn level(&self, key: &str, params: BucketParams) -> u64 {
            self.inner.check(&[Hit::new(key, params, 0)]).await.unwrap()[0].remaining
        }
    }

    impl Backend for Store {
        fn name(&self) -> &'static str {
            "store"
        }

        async fn probe(&self) -> Result<(), BackendError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(BackendError::Unavailable("down".into()));
            }
            Ok(())
        }

        async fn check_each(&self, hits: &[Hit]) -> Vec<Result<Verdict, BackendError>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if let Some(gate) = &self.gate {
                gate.wait().await;
            }
            if self.down.load(Ordering::SeqCst) {
                return vec![Err(BackendError::Unavailable("down".into())); hits.len()];
            }
            self.inner.check_each(hits).await
        }
    }

    fn split(gate: Option<Arc<Barrier>>) -> SplitBackend<Store, Store> {
        SplitBackend::new(Store::new(gate.clone()), Some(Store::new(gate)))
    }

    /// Minute, second, minute, second: the hits of both stores interleaved.
    fn mixed(tokens: [u64; 4]) -> Vec<Hit> {
        vec![
            Hit::new("m1", PER_MINUTE, tokens[0]),
            Hit::new("s1", PER_SECOND, tokens[1]),
            Hit::new("m2", PER_MINUTE, tokens[2]),
            Hit::new("s2", PER_SECOND, tokens[3]),
        ]
    }

    fn remaining(outcomes: &[Result<Verdict, BackendError>]) -> Vec<Option<u64>> {
        outcomes
            .iter()
            .map(|o| o.as_ref().ok().map(|v| v.remaining))
            .collect()
    }

    #[tokio::test]
    async fn hits_go_to_the_store_of_their_unit_and_come_back_in_order() {
        let backend = split(None);
        let outcomes = backend.check_each(&mixed([1, 2, 3, 4])).await;
        assert_eq!(remaining(&outcomes), [Some(9), Some(3), Some(7), Some(1)]);
        let main = backend.main();
        let per_second = backend.per_second().unwrap();
        assert_eq!((main.calls(), per_second.calls()), (1, 1));
        assert_eq!(main.inner.live_buckets(), 2);
        assert_eq!(per_second.inner.live_buckets(), 2);
        assert_eq!(per_second.level("s1", PER_SECOND).await, 3);
        assert_eq!(main.level("m2", PER_MINUTE).await, 7);
        assert_eq!(main.level("s1", PER_SECOND).await, 5, "never charged here");

        let verdicts = backend.check(&mixed([1, 1, 1, 1])).await.unwrap();
        let left: Vec<u64> = verdicts.iter().map(|v| v.remaining).collect();
        assert_eq!(left, [8, 2, 6, 0]);
    }

    #[tokio::test]
    async fn a_request_of_one_unit_calls_one_store() {
        let backend = split(None);
        let minute_only = [Hit::new("m", PER_MINUTE, 1)];
        let second_only = [Hit::new("a", PER_SECOND, 1), Hit::new("b", PER_SECOND, 2)];
        assert_eq!(backend.check(&minute_only).await.unwrap()[0].remaining, 9);
        let outcomes = backend.check_each(&second_only).await;
        assert_eq!(remaining(&outcomes), [Some(4), Some(3)]);
        assert_eq!(backend.main().calls(), 1);
        assert_eq!(backend.per_second().unwrap().calls(), 1);
        assert!(backend.check_each(&[]).await.is_empty());
    }

    /// Each store's call waits at a barrier of two: the request completes only because both
    /// calls are under way at once (the timeout turns a serialising regression into a failure
    /// instead of a hang).
    #[tokio::test]
    async fn both_stores_are_called_concurrently() {
        let backend = split(Some(Arc::new(Barrier::new(2))));
        let outcomes = tokio::time::timeout(
            Duration::from_secs(30),
            backend.check_each(&mixed([1, 1, 1, 1])),
        )
        .await
        .expect("the two calls run concurrently");
        assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    }

    #[tokio::test]
    async fn a_failing_per_second_store_fails_only_its_hits() {
        let backend = split(None);
        backend
            .per_second()
            .unwrap()
            .down
            .store(true, Ordering::SeqCst);
        let outcomes = backend.check_each(&mixed([1, 1, 1, 1])).await;
        assert_eq!(remaining(&outcomes), [Some(9), None, Some(9), None]);
        assert!(matches!(outcomes[1], Err(BackendError::Unavailable(_))));
        // All-or-nothing `check` fails the request, having decided the main store's share.
        assert!(backend.check(&mixed([1, 1, 1, 1])).await.is_err());
        assert_eq!(backend.main().level("m1", PER_MINUTE).await, 8);
        assert_eq!(
            backend.probe().await,
            Err(BackendError::Unavailable("down".into()))
        );

        backend
            .per_second()
            .unwrap()
            .down
            .store(false, Ordering::SeqCst);
        backend.main().down.store(true, Ordering::SeqCst);
        let outcomes = backend.check_each(&mixed([1, 1, 1, 1])).await;
        assert_eq!(remaining(&outcomes), [None, Some(4), None, Some(4)]);
        assert!(backend.probe().await.is_err());
        backend.main().down.store(false, Ordering::SeqCst);
        assert_eq!(backend.probe().await, Ok(()));
    }

    /// Each store is all-or-nothing over its own hits, independently of the other (as the slots
    /// of one request in Redis Cluster): a rejection in the main store leaves its other hit
    /// uncharged but does not undo the per-second store's deduction.
    #[tokio::test]
    async fn each_store_is_atomic_on_its_own() {
        let backend = split(None);
        let outcomes = backend.check_each(&mixed([1, 1, 11, 1])).await;
        let allowed: Vec<bool> = outcomes
            .iter()
            .map(|o| o.as_ref().unwrap().allowed)
            .collect();
        assert_eq!(allowed, [true, true, false, true]);
        assert_eq!(
            backend.main().level("m1", PER_MINUTE).await,
            10,
            "rejected with m2"
        );
        assert_eq!(
            backend.per_second().unwrap().level("s1", PER_SECOND).await,
            4
        );
    }

    #[tokio::test]
    async fn without_a_per_second_store_everything_goes_to_the_main_one() {
        let backend: SplitBackend<Store, Store> = SplitBackend::new(Store::new(None), None);
        let outcomes = backend.check_each(&mixed([1, 2, 3, 4])).await;
        assert_eq!(remaining(&outcomes), [Some(9), Some(3), Some(7), Some(1)]);
        assert_eq!(backend.main().calls(), 1);
        assert_eq!(backend.main().inner.live_buckets(), 4);
        assert_eq!(backend.name(), "store");
        assert!(backend.breakers().is_none());
        assert_eq!(backend.probe().await, Ok(()));
    }
}
