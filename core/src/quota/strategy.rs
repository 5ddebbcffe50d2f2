//! What an RLQS assignment tells a data plane to do, in the terms Envoy's `rate_limit_quota`
//! filter enforces.

/// Longest `fill_interval` a share is quantized to: a day, so a rule of `20 per day` shared by up
/// to 20 data planes still gives each a token bucket. A share below one token per this many
/// seconds is no share (the data plane is denied until its demand earns one).
pub const MAX_FILL_INTERVAL_S: u32 = 86_400;

/// Longest `fill_interval` tried to bring a share of a few tokens a second closer than whole
/// tokens per second would: a share of 1.67/s (5/s over three data planes) is 5 per 3 s, where
/// 1 per second would lose 40 % of it.
pub const FINE_FILL_INTERVAL_S: u32 = 10;

/// A data plane's instruction for one bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    AllowAll,
    DenyAll,
    TokenBucket(TokenBucket),
}

impl Strategy {
    /// The `kind` label of the assignment metric.
    pub const fn kind(&self) -> &'static str {
        match self {
            Strategy::AllowAll => "allow_all",
            Strategy::DenyAll => "deny_all",
            Strategy::TokenBucket(_) => "token_bucket",
        }
    }

    /// Tokens per ms the data plane may admit under this strategy (0 for DENY_ALL; ALLOW_ALL has
    /// no bound and is never a prepaid strategy).
    pub fn rate_per_ms(&self) -> f64 {
        match self {
            Strategy::TokenBucket(b) => b.rate_per_ms(),
            Strategy::DenyAll | Strategy::AllowAll => 0.0,
        }
    }

    /// Tokens a fresh local bucket of this strategy starts with (Envoy starts a new token bucket
    /// full).
    pub fn burst(&self) -> f64 {
        match self {
            Strategy::TokenBucket(b) => f64::from(b.max_tokens),
            Strategy::DenyAll | Strategy::AllowAll => 0.0,
        }
    }
}

/// `envoy.type.v3.TokenBucket` as Envoy's filter reads it: a bucket of `max_tokens` that starts
/// full and refills `tokens_per_fill` every `fill_interval_s` (Envoy converts the interval to
/// whole seconds, so it is kept whole here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucket {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    pub fill_interval_s: u32,
}

impl TokenBucket {
    /// The largest bucket Envoy can express whose rate is at most `rate_per_s` tokens a second,
    /// holding `burst_ms` of that rate (at least one token); `None` below one token per
    /// [`MAX_FILL_INTERVAL_S`]. The rate is `tokens_per_fill` per `fill_interval_s` whole seconds
    /// (Envoy refills continuously at their quotient), the closest one at or below the share over
    /// intervals of up to [`FINE_FILL_INTERVAL_S`] (2.5/s is 5 per 2 s, not 2 per second), or one
    /// token per however many seconds a slower share needs. Rounds down: a data plane may get less
    /// than its share, never more.
    pub fn for_rate(rate_per_s: f64, burst_ms: u64) -> Option<TokenBucket> {
        if !rate_per_s.is_finite() || rate_per_s * f64::from(MAX_FILL_INTERVAL_S) < 1.0 {
            return None;
        }
        let slowest = (1.0 / rate_per_s).ceil().max(1.0) as u32;
        let fill = |interval: u32| {
            let tokens = (rate_per_s * f64::from(interval))
                .floor()
                .min(f64::from(u32::MAX)) as u32;
            (tokens, interval)
        };
        let (tokens_per_fill, fill_interval_s) = (1..=FINE_FILL_INTERVAL_S)
            .chain(std::iter::once(slowest))
            .map(fill)
            .filter(|&(tokens, interval)| {
                tokens >= 1 && f64::from(tokens) / f64::from(interval) <= rate_per_s
            })
            // The highest rate; of equal rates the shortest interval (fewer tokens per fill).
            .max_by(|a, b| {
                let rate = |(t, i): &(u32, u32)| f64::from(*t) / f64::from(*i);
                rate(a).total_cmp(&rate(b)).then(b.1.cmp(&a.1))
            })?;
        let bucket = TokenBucket {
            max_tokens: 1,
            tokens_per_fill,
            fill_interval_s,
        };
        let burst = (bucket.rate_per_ms() * burst_ms as f64).ceil();
        Some(TokenBucket {
            max_tokens: burst.clamp(1.0, f64::from(u32::MAX)) as u32,
            ..bucket
        })
    }

    pub fn rate_per_ms(&self) -> f64 {
        f64::from(self.tokens_per_fill) / (f64::from(self.fill_interval_s) * 1000.0)
    }

    pub fn rate_per_s(&self) -> f64 {
        self.rate_per_ms() * 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_take_the_closest_rate_at_or_below_over_whole_second_intervals() {
        let b = TokenBucket::for_rate(33.9, 200).unwrap();
        assert_eq!((b.tokens_per_fill, b.fill_interval_s), (339, 10));
        // 200 ms of 33.9/s is 6.78 tokens: the bucket holds 7.
        assert_eq!(b.max_tokens, 7);
        assert!(b.rate_per_s() <= 33.9);
        let fill = |rate: f64| {
            let b = TokenBucket::for_rate(rate, 1_000).unwrap();
            assert!(b.rate_per_s() <= rate, "{b:?} above {rate}");
            (b.tokens_per_fill, b.fill_interval_s)
        };
        assert_eq!(fill(5.0), (5, 1));
        assert_eq!(fill(2.5), (5, 2));
        assert_eq!(fill(5.0 / 3.0), (5, 3));
        assert_eq!(fill(4.99), (49, 10));
        assert_eq!(fill(1e6 + 0.5), (2_000_001, 2));
    }

    #[test]
    fn slow_rates_stretch_the_interval_and_never_exceed_the_share() {
        let b = TokenBucket::for_rate(0.3, 200).unwrap();
        assert_eq!(
            (b.tokens_per_fill, b.fill_interval_s, b.max_tokens),
            (3, 10, 1)
        );
        assert!(b.rate_per_s() <= 0.3);
        let b = TokenBucket::for_rate(0.15, 200).unwrap();
        assert_eq!((b.tokens_per_fill, b.fill_interval_s), (1, 7));
        // `20 per day` for one data plane: a token every 72 minutes.
        let b = TokenBucket::for_rate(20.0 / 86_400.0, 1_000).unwrap();
        assert_eq!(
            (b.tokens_per_fill, b.fill_interval_s, b.max_tokens),
            (1, 4_320, 1)
        );
        assert_eq!(TokenBucket::for_rate(1.0 / 86_401.0, 200), None);
        assert_eq!(TokenBucket::for_rate(0.0, 200), None);
        assert_eq!(TokenBucket::for_rate(f64::NAN, 200), None);
    }

    #[test]
    fn huge_rates_saturate() {
        let b = TokenBucket::for_rate(1e12, 1000).unwrap();
        assert_eq!(b.tokens_per_fill, u32::MAX);
        assert_eq!(b.max_tokens, u32::MAX);
    }
}
