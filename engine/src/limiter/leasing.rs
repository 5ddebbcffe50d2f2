//! The leased path: buckets of rules with `lease` are paid from this replica's
//! [`LeaseStore`] where it can, and the store's expired tokens are handed back to the backend.
//!
//! Each leased take is first paid from its lease (a [`Reservation`]); only the buckets it
//! cannot pay go to the backend, in the one call, the leased ones as lease takes of what the
//! lease lacked. Then each reservation is settled: tokens the backend granted beyond the demand
//! go into the lease, and when the request is rejected every token it reserved (or that the
//! backend took for it) goes back into it, so a rejected request spends nothing.

use crate::algorithm::Verdict;
use crate::backend::{Backend, Hit};
use crate::limiter::lease::{LeaseStore, Remote, Reservation};

use super::plan::{Bucket, Outcome, rejected};
use super::{LimitError, Limiter};

impl<B: Backend> Limiter<B> {
    /// Charges a request with leasable buckets: reserve from the leases, ask the backend for
    /// the rest, settle (see the module docs).
    pub(super) async fn charge_with_leases(
        &self,
        store: &LeaseStore,
        buckets: &mut [Bucket],
    ) -> Result<(), LimitError> {
        let now_ms = self.resilience.clock.now_ms();
        for bucket in buckets.iter_mut() {
            reserve(store, bucket, now_ms);
        }
        let unsettled = Unsettled {
            store,
            buckets,
            now_ms,
            armed: true,
        };
        if let Err(error) = self.ask_backend(unsettled.buckets).await {
            unsettled.give_up();
            return Err(error);
        }
        let rejected = rejected(unsettled.buckets);
        let paid = unsettled
            .buckets
            .iter()
            .filter(|b| matches!(b.reservation, Some(Reservation::Paid { .. })))
            .count();
        unsettled.settle(rejected);
        if !rejected {
            store.note_local(paid as u64);
        }
        Ok(())
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
}

/// Reserves a leasable bucket's tokens from its lease. Paid in full, the bucket is decided
/// here: allowed, reporting what the shared bucket had at the last refill plus what is left in
/// the lease.
fn reserve(store: &LeaseStore, bucket: &mut Bucket, now_ms: u64) {
    if bucket.lease_batch().is_none() {
        return;
    }
    let reservation = store.reserve(&bucket.hit, now_ms);
    if let Reservation::Paid { left, remote, .. } = reservation {
        bucket.outcome = Outcome::Decided(Verdict {
            allowed: true,
            remaining: remote.remaining.saturating_add(left),
            retry_after_ms: Some(0),
            until_full_ms: remote.until_full_ms,
            granted: bucket.hit.demand.tokens,
        });
    }
    bucket.reservation = Some(reservation);
}

/// The reservations of a decision until [`Unsettled::settle`] ends them. A decision dropped
/// while its backend call is out (the caller gave up: Envoy's timeout cancels the call) never
/// gets there, so on drop each refilling one is abandoned: its taken tokens go back to its lease
/// and the lease is no longer held as being refilled, so the sweep and eviction can drop it
/// again.
struct Unsettled<'a> {
    store: &'a LeaseStore,
    buckets: &'a mut [Bucket],
    now_ms: u64,
    /// Cleared by `settle` and `give_up`, which end every reservation themselves.
    armed: bool,
}

impl Unsettled<'_> {
    /// Settles every reservation once the request's fate is known: a refilling one takes in
    /// what the backend granted beyond the demand (all of it when the request is `rejected`),
    /// and when the request is rejected every token a lease gave goes back to it.
    fn settle(mut self, rejected: bool) {
        self.armed = false;
        for bucket in self.buckets.iter_mut() {
            match bucket.reservation {
                Some(Reservation::Paid { expires_ms, .. }) if rejected => {
                    let tokens = bucket.hit.demand.tokens;
                    self.store
                        .put_back(&bucket.hit.key, tokens, expires_ms, self.now_ms);
                }
                Some(Reservation::Short {
                    taken,
                    expires_ms,
                    refill: true,
                }) => settle_refill(self.store, bucket, taken, expires_ms, rejected, self.now_ms),
                // Paid and spent, or a plain take (not in the store, nothing reserved).
                _ => {}
            }
        }
    }

    /// The backend call failed: every token a lease gave goes back to it; what the backend
    /// granted before failing elsewhere is not kept.
    fn give_up(mut self) {
        self.armed = false;
        for bucket in self.buckets.iter() {
            let key = &bucket.hit.key;
            match bucket.reservation {
                Some(Reservation::Paid { expires_ms, .. }) => {
                    let tokens = bucket.hit.demand.tokens;
                    self.store.put_back(key, tokens, expires_ms, self.now_ms);
                }
                Some(Reservation::Short {
                    taken,
                    expires_ms,
                    refill: true,
                }) => self.store.abandon(key, taken, expires_ms, self.now_ms),
                _ => {}
            }
        }
    }
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for bucket in self.buckets.iter() {
            if let Some(Reservation::Short {
                taken,
                expires_ms,
                refill: true,
            }) = bucket.reservation
            {
                self.store
                    .abandon(&bucket.hit.key, taken, expires_ms, self.now_ms);
            }
        }
    }
}

/// Ends a refilling reservation that lent `taken` tokens. Nothing granted: they go back to the
/// lease. Granted: the request spends its own tokens and the lease keeps the extra (all of it
/// when the request was rejected, by a key of another Cluster slot, and then `taken` goes back
/// too); the lease's tokens count as the key's remaining, being spendable here.
fn settle_refill(
    store: &LeaseStore,
    bucket: &mut Bucket,
    taken: u64,
    expires_ms: u64,
    rejected: bool,
    now_ms: u64,
) {
    let key = &bucket.hit.key;
    let verdict = match &mut bucket.outcome {
        Outcome::Decided(v) if v.granted > 0 => v,
        _ => {
            store.abandon(key, taken, expires_ms, now_ms);
            return;
        }
    };
    let got = verdict.granted;
    let remote = Remote {
        remaining: verdict.remaining,
        until_full_ms: verdict.until_full_ms,
    };
    let asked = bucket.hit.demand.tokens - taken;
    let keep = if rejected {
        got
    } else {
        got.saturating_sub(asked)
    };
    let left = store.refilled(&bucket.hit, keep, remote, now_ms);
    verdict.remaining = verdict.remaining.saturating_add(left);
    if rejected {
        store.put_back(key, taken, expires_ms, now_ms);
    }
}
