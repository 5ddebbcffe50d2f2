//! What a client is told about one descriptor's limit: the numbers of the `x-ratelimit-*`
//! headers, sluice's own and the ones Envoy writes from a status's `current_limit` and
//! `limit_remaining`.
//!
//! Everything is counted in **hits** (requests, or `hits_addend` units), not tokens: a rule with
//! `cost: 10` and `burst: 50` holds 5 hits. The contract, for every limited status:
//!
//! - `remaining ≤ limit`, where `limit` is the hits a full bucket holds;
//! - the policy `limit;w=window_secs` says the bucket refills `limit` hits in `window_secs` (the
//!   IETF draft's quota policy, as sluice writes it);
//! - `per_unit` is the same rate as Envoy's `RateLimit` can carry it (a whole number per unit),
//!   in the smallest unit, no smaller than the rule's, where that number is at least `limit`. So
//!   Envoy's own header (`x-ratelimit-limit: <per_unit>, …` beside `x-ratelimit-remaining`) never
//!   shows more remaining than its limit. A rule of cost 1 without a burst above its rate is
//!   advertised exactly as configured (`requests_per_unit` per `unit`), as envoyproxy/ratelimit
//!   answers.

use crate::decision::AppliedLimit;
use crate::rule::Unit;

/// One limited status as a client reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advertised {
    /// Hits a full bucket holds.
    pub limit: u64,
    /// Hits that would pass now.
    pub remaining: u64,
    /// Seconds an empty bucket takes to hold `limit` hits again (at least 1).
    pub window_secs: u64,
    /// The refill rate in hits per unit, as Envoy's `current_limit` carries it.
    pub per_unit: (u32, Unit),
}

/// `limit` and the bucket's `remaining_tokens`, for a rule that takes `cost` tokens per hit.
pub fn advertise(limit: &AppliedLimit, remaining_tokens: u64, cost: u64) -> Advertised {
    let cost = cost.max(1);
    let capacity = limit.capacity / cost;
    let remaining = (remaining_tokens / cost).min(capacity);
    let unit_secs = limit.window_secs();
    let rate = u128::from(limit.requests_per_unit);
    if rate == 0 {
        return Advertised {
            limit: capacity,
            remaining,
            window_secs: unit_secs,
            per_unit: (0, limit.unit),
        };
    }
    // Tokens to fill `capacity` hits, at `rate` tokens per `unit_secs`, rounded up to a second.
    let fill = u128::from(capacity) * u128::from(cost) * u128::from(unit_secs);
    let window_secs = u64::try_from(fill.div_ceil(rate))
        .unwrap_or(u64::MAX)
        .max(1);
    Advertised {
        limit: capacity,
        remaining,
        window_secs,
        per_unit: per_unit(limit, cost, capacity),
    }
}

/// The first unit, from the shortest one at least as long as the rule's window up, whose whole
/// number of hits per unit reaches `capacity`; the largest unit, saturated, when none does. (A
/// window of `unit_multiplier` units is advertised in a unit as long as the window or longer:
/// 60 per 30 s is 120 per minute, since Envoy's `RateLimit` has no multiplier.)
fn per_unit(limit: &AppliedLimit, cost: u64, capacity: u64) -> (u32, Unit) {
    let window = limit.window_secs();
    let hits_in = |unit: Unit| -> u32 {
        let hits = u128::from(limit.requests_per_unit) * u128::from(unit.seconds())
            / (u128::from(window) * u128::from(cost));
        u32::try_from(hits).unwrap_or(u32::MAX)
    };
    let mut candidates = Unit::ALL.into_iter().filter(|u| u.seconds() >= window);
    let first = candidates.next().unwrap_or(Unit::Year);
    let mut last = (hits_in(first), first);
    if u64::from(last.0) >= capacity {
        return last;
    }
    for unit in candidates {
        last = (hits_in(unit), unit);
        if u64::from(last.0) >= capacity {
            break;
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(requests_per_unit: u32, unit: Unit, capacity: u64) -> AppliedLimit {
        AppliedLimit {
            requests_per_unit,
            unit,
            unit_multiplier: 1,
            capacity,
            name: None,
        }
    }

    #[test]
    fn a_plain_rule_is_advertised_as_configured() {
        let a = advertise(&applied(20, Unit::Minute, 20), 7, 1);
        assert_eq!(a.limit, 20);
        assert_eq!(a.remaining, 7);
        assert_eq!(a.window_secs, 60);
        assert_eq!(a.per_unit, (20, Unit::Minute));
    }

    fn windowed(requests_per_unit: u32, unit: Unit, multiplier: u32) -> AppliedLimit {
        AppliedLimit {
            unit_multiplier: multiplier,
            ..applied(requests_per_unit, unit, u64::from(requests_per_unit))
        }
    }

    #[test]
    fn a_multiplied_window_is_the_real_window_and_envoys_rate_in_a_longer_unit() {
        // 60 per 30 seconds: refilled over 30 s; Envoy's RateLimit has no multiplier, so the
        // same rate goes out as 120 per minute.
        let a = advertise(&windowed(60, Unit::Second, 30), 60, 1);
        assert_eq!((a.limit, a.window_secs), (60, 30));
        assert_eq!(a.per_unit, (120, Unit::Minute));
        // 100 per 5 minutes: 1,200 per hour.
        let a = advertise(&windowed(100, Unit::Minute, 5), 3, 1);
        assert_eq!((a.limit, a.remaining, a.window_secs), (100, 3, 300));
        assert_eq!(a.per_unit, (1_200, Unit::Hour));
        // 10,000 per 7 days is exactly a week.
        let a = advertise(&windowed(10_000, Unit::Day, 7), 0, 1);
        assert_eq!(
            (a.window_secs, a.per_unit),
            (7 * 86_400, (10_000, Unit::Week))
        );
        // A window of a whole unit keeps that unit.
        let a = advertise(&windowed(5, Unit::Minute, 60), 5, 1);
        assert_eq!((a.window_secs, a.per_unit), (3_600, (5, Unit::Hour)));
    }

    #[test]
    fn cost_counts_hits_not_tokens() {
        // config/edge.yaml's export rule: 5 tokens/s, burst 50, cost 10.
        let a = advertise(&applied(5, Unit::Second, 50), 40, 10);
        assert_eq!((a.limit, a.remaining), (5, 4));
        assert_eq!(a.window_secs, 10, "5 hits of 10 tokens at 5 tokens/s");
        assert_eq!(
            a.per_unit,
            (30, Unit::Minute),
            "0.5 hits/s = 30 per minute ≥ 5"
        );
    }

    #[test]
    fn a_burst_above_the_rate_moves_to_a_larger_unit() {
        let a = advertise(&applied(5, Unit::Second, 50), 50, 1);
        assert_eq!((a.limit, a.remaining, a.window_secs), (50, 50, 10));
        assert_eq!(a.per_unit, (300, Unit::Minute));
        // A burst below the rate keeps the rule's unit.
        let a = advertise(&applied(600, Unit::Minute, 100), 100, 1);
        assert_eq!((a.window_secs, a.per_unit), (10, (600, Unit::Minute)));
    }

    #[test]
    fn a_blocking_rule_advertises_nothing_left() {
        let a = advertise(&applied(0, Unit::Hour, 0), 0, 3);
        assert_eq!((a.limit, a.remaining, a.window_secs), (0, 0, 3_600));
        assert_eq!(a.per_unit, (0, Unit::Hour));
    }

    #[test]
    fn remaining_never_exceeds_limit_nor_per_unit() {
        for rate in [1u32, 3, 5, 7, 60, 1_000, u32::MAX] {
            for unit in Unit::ALL {
                for capacity in [0u64, 1, 9, 50, 1_000, 1 << 33] {
                    for cost in [1u64, 2, 10, 1_000] {
                        let l = applied(rate, unit, capacity);
                        let a = advertise(&l, capacity, cost);
                        assert!(a.remaining <= a.limit);
                        assert!(a.window_secs >= 1);
                        let saturated = a.per_unit.1 == Unit::Year || a.per_unit.0 == u32::MAX;
                        assert!(
                            u64::from(a.per_unit.0) >= a.limit || saturated,
                            "{l:?} cost {cost}: {a:?}"
                        );
                    }
                }
            }
        }
    }
}
