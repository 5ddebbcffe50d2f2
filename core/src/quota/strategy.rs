//! What an RLQS assignment tells a data plane to do, in the terms Envoy's `rate_limit_quota`
//! filter enforces.

/// Longest `fill_interval` a share is quantized to: a day, so a rule of `20 per day` shared by up
/// to 20 data planes still gives each a token bucket. A share below one token per this many
/// seconds is no share (the data plane is denied until its demand earns one).
pub const MAX_FILL_INTERVAL_S: u32 = 86_400;

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
    /// [`MAX_FILL_INTERVAL_S`]. Rounds down: a data plane may get less than its share, never more.
    pub fn for_rate(rate_per_s: f64, burst_ms: u64) -> Option<TokenBucket> {
        if !rate_per_s.is_finite() || rate_per_s * f64::from(MAX_FILL_INTERVAL_S) < 1.0 {
            return None;
        }
        let (tokens_per_fill, fill_interval_s) = if rate_per_s >= 1.0 {
            (rate_per_s.floor().min(f64::from(u32::MAX)) as u32, 1)
        } else {
            (1, (1.0 / rate_per_s).ceil() as u32)
        };
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
    fn rates_of_a_token_or_more_fill_every_second_rounded_down() {
        let b = TokenBucket::for_rate(33.9, 200).unwrap();
        assert_eq!((b.tokens_per_fill, b.fill_interval_s), (33, 1));
        // 200 ms of 33/s is 6.6 tokens: the bucket holds 7.
        assert_eq!(b.max_tokens, 7);
        assert!(b.rate_per_s() <= 33.9);
    }

    #[test]
    fn slow_rates_stretch_the_interval_and_never_exceed_the_share() {
        let b = TokenBucket::for_rate(0.3, 200).unwrap();
        assert_eq!(
            (b.tokens_per_fill, b.fill_interval_s, b.max_tokens),
            (1, 4, 1)
        );
        assert!(b.rate_per_s() <= 0.3);
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
