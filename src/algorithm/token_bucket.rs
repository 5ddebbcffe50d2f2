//! Token bucket: refill against elapsed time, take only when every bucket of the request can pay.
//!
//! The contract shared with `lua/token_bucket.lua` (keep them in step):
//! 1. `refill`: missing state is a full bucket; `elapsed = max(0, now - updated)`;
//!    `tokens = min(capacity, tokens + elapsed * rate)`; the new `updated` is `max(updated, now)`
//!    so a clock that steps back never refills twice.
//! 2. `need = max(tokens_demanded, 1)` for takes; a take is allowed when `tokens >= need`.
//! 3. The request is allowed when every non-shadow take is; only then are takes deducted (a shadow
//!    take is deducted only when it alone can pay, so a bucket never goes negative). Refunds are
//!    always applied, capped at capacity.
//! 4. `remaining = floor(tokens_after)`; `retry_after = ceil((need - tokens) / rate)` for a
//!    rejected take, `None` when `need > capacity`; `until_full = ceil((capacity - tokens_after) / rate)`.

use super::{BucketParams, BucketState, Demand, Verdict};

/// Tokens in the bucket at `now_ms`, and the refill timestamp to store.
pub fn refill(state: Option<BucketState>, now_ms: u64, params: &BucketParams) -> (f64, u64) {
    let capacity = params.capacity as f64;
    match state {
        None => (capacity, now_ms),
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.updated_ms) as f64;
            let tokens = (s.tokens + elapsed * params.rate_per_ms()).min(capacity);
            (tokens, s.updated_ms.max(now_ms))
        }
    }
}

/// Decides one request over its buckets (keys distinct) and updates `states` in place.
///
/// `states[i]` belongs to `demands[i]`; on return every entry is `Some` (the state to store).
pub fn decide(now_ms: u64, demands: &[Demand], states: &mut [Option<BucketState>]) -> Vec<Verdict> {
    assert_eq!(demands.len(), states.len(), "one state per demand");
    let mut levels = Vec::with_capacity(demands.len());
    let mut all_allowed = true;
    for (demand, state) in demands.iter().zip(states.iter()) {
        let (tokens, updated) = refill(*state, now_ms, &demand.params);
        let fits = demand.refund || tokens >= need(demand);
        if !fits && !demand.shadow {
            all_allowed = false;
        }
        levels.push((tokens, updated, fits));
    }

    demands
        .iter()
        .zip(states.iter_mut())
        .zip(levels)
        .map(|((demand, state), (tokens, updated, fits))| {
            let capacity = demand.params.capacity as f64;
            let rate = demand.params.rate_per_ms();
            let after = if demand.refund {
                (tokens + demand.tokens as f64).min(capacity)
            } else if all_allowed && fits {
                tokens - demand.tokens as f64
            } else {
                tokens
            };
            *state = Some(BucketState {
                tokens: after,
                updated_ms: updated,
            });
            let needed = need(demand);
            let retry_after_ms = if fits {
                Some(0)
            } else if needed > capacity {
                None
            } else {
                Some(((needed - tokens) / rate).ceil() as u64)
            };
            Verdict {
                allowed: fits,
                remaining: after.floor() as u64,
                retry_after_ms,
                until_full_ms: ((capacity - after) / rate).ceil() as u64,
            }
        })
        .collect()
}

fn need(demand: &Demand) -> f64 {
    demand.tokens.max(1) as f64
}
