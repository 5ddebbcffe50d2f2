//! What the generator asks: domain, descriptors per request, which key each descriptor names
//! (uniform, Zipf or sequential over K keys) and the share of requests aimed at over-limit keys.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// How a key index in `0..keys` is drawn.
#[derive(Clone, Debug, PartialEq)]
pub enum Distribution {
    Uniform,
    /// Zipf with exponent `s` (rank 1 the hottest): a few tenants carry most of the traffic.
    Zipf(f64),
    /// Request n names key n mod K (touches every key once per K requests: populates state).
    Sequential,
}

impl std::str::FromStr for Distribution {
    type Err = String;

    /// `uniform`, `sequential`, `zipf` (s = 1) or `zipf:S`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "uniform" => Ok(Distribution::Uniform),
            "sequential" => Ok(Distribution::Sequential),
            "zipf" => Ok(Distribution::Zipf(1.0)),
            _ => match s.strip_prefix("zipf:").map(str::parse::<f64>) {
                Some(Ok(exp)) if exp > 0.0 => Ok(Distribution::Zipf(exp)),
                _ => Err(format!(
                    "unknown distribution `{s}` (uniform, sequential, zipf or zipf:S with S > 0)"
                )),
            },
        }
    }
}

impl std::fmt::Display for Distribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Distribution::Uniform => f.write_str("uniform"),
            Distribution::Sequential => f.write_str("sequential"),
            Distribution::Zipf(s) => write!(f, "zipf:{s}"),
        }
    }
}

/// The request mix, as given on the command line.
#[derive(Clone, Debug)]
pub struct MixSpec {
    pub domain: String,
    pub descriptors: usize,
    pub keys: u64,
    pub distribution: Distribution,
    /// Entry key of ordinary descriptors and the prefix of their values (`k`, `v` → `k=v17`).
    pub key_name: String,
    pub value_prefix: String,
    /// Share of requests (0..=1) whose descriptors name an over-limit key instead.
    pub over_limit_share: f64,
    pub over_key_name: String,
    pub over_keys: u64,
}

/// Draws key indexes; shared read-only by all workers (the Zipf table is built once).
pub struct Sampler {
    spec: MixSpec,
    /// Cumulative Zipf weights, normalised to end at 1; empty unless Zipf.
    zipf_cdf: Vec<f64>,
}

/// SplitMix64: tiny, fast and good enough to pick keys; seeded per worker so runs repeat.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (n ≥ 1), by multiply-shift.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

impl Sampler {
    pub fn new(spec: MixSpec) -> Result<Sampler, String> {
        if spec.keys == 0 || spec.over_keys == 0 || spec.descriptors == 0 {
            return Err("--keys, --over-keys and --descriptors must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&spec.over_limit_share) {
            return Err("--over-limit-share must be within 0..=1".into());
        }
        let zipf_cdf = match spec.distribution {
            Distribution::Zipf(s) => {
                let mut acc = 0.0;
                let mut cdf: Vec<f64> = (1..=spec.keys)
                    .map(|rank| {
                        acc += (rank as f64).powf(-s);
                        acc
                    })
                    .collect();
                for c in &mut cdf {
                    *c /= acc;
                }
                cdf
            }
            _ => Vec::new(),
        };
        Ok(Sampler { spec, zipf_cdf })
    }

    pub fn spec(&self) -> &MixSpec {
        &self.spec
    }

    fn key_index(&self, rng: &mut Rng, sequence: u64) -> u64 {
        match self.spec.distribution {
            Distribution::Uniform => rng.below(self.spec.keys),
            Distribution::Sequential => sequence % self.spec.keys,
            Distribution::Zipf(_) => {
                let u = rng.unit();
                self.zipf_cdf.partition_point(|&c| c < u) as u64
            }
        }
    }

    /// The `sequence`-th request of this run (sequence drives the sequential distribution).
    pub fn request(&self, rng: &mut Rng, sequence: u64) -> RateLimitRequest {
        let spec = &self.spec;
        let over = spec.over_limit_share > 0.0 && rng.unit() < spec.over_limit_share;
        let descriptors = (0..spec.descriptors as u64)
            .map(|d| {
                let (key, value) = if over {
                    (
                        spec.over_key_name.clone(),
                        format!("o{}", rng.below(spec.over_keys)),
                    )
                } else {
                    let seq = sequence
                        .wrapping_mul(spec.descriptors as u64)
                        .wrapping_add(d);
                    (
                        spec.key_name.clone(),
                        format!("{}{}", spec.value_prefix, self.key_index(rng, seq)),
                    )
                };
                RateLimitDescriptor {
                    entries: vec![Entry { key, value }],
                    ..Default::default()
                }
            })
            .collect();
        RateLimitRequest {
            domain: spec.domain.clone(),
            descriptors,
            hits_addend: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(distribution: Distribution, keys: u64) -> MixSpec {
        MixSpec {
            domain: "bench".into(),
            descriptors: 1,
            keys,
            distribution,
            key_name: "k".into(),
            value_prefix: "v".into(),
            over_limit_share: 0.0,
            over_key_name: "over".into(),
            over_keys: 1,
        }
    }

    fn counts(sampler: &Sampler, n: u64) -> Vec<u64> {
        let mut rng = Rng::new(7);
        let mut counts = vec![0; sampler.spec.keys as usize];
        for i in 0..n {
            counts[sampler.key_index(&mut rng, i) as usize] += 1;
        }
        counts
    }

    #[test]
    fn zipf_rank_frequencies_follow_the_law() {
        let sampler = Sampler::new(spec(Distribution::Zipf(1.0), 100)).unwrap();
        let c = counts(&sampler, 200_000);
        // P(rank r) ∝ 1/r: rank 1 twice rank 2, ten times rank 10.
        let ratio2 = c[0] as f64 / c[1] as f64;
        let ratio10 = c[0] as f64 / c[9] as f64;
        assert!((1.8..2.2).contains(&ratio2), "{ratio2}");
        assert!((8.5..11.5).contains(&ratio10), "{ratio10}");
    }

    #[test]
    fn uniform_and_sequential_cover_every_key() {
        let uniform = counts(
            &Sampler::new(spec(Distribution::Uniform, 10)).unwrap(),
            10_000,
        );
        assert!(
            uniform.iter().all(|&n| (800..1200).contains(&n)),
            "{uniform:?}"
        );
        let seq = counts(
            &Sampler::new(spec(Distribution::Sequential, 10)).unwrap(),
            100,
        );
        assert!(seq.iter().all(|&n| n == 10));
    }

    #[test]
    fn over_limit_share_redirects_requests() {
        let mut s = spec(Distribution::Uniform, 10);
        s.over_limit_share = 0.25;
        s.descriptors = 2;
        let sampler = Sampler::new(s).unwrap();
        let mut rng = Rng::new(1);
        let over = (0..10_000)
            .map(|i| sampler.request(&mut rng, i))
            .inspect(|r| assert_eq!(r.descriptors.len(), 2))
            .filter(|r| r.descriptors[0].entries[0].key == "over")
            .count();
        assert!((2_200..2_800).contains(&over), "{over}");
        assert!("zipf:0".parse::<Distribution>().is_err());
        assert_eq!("zipf:1.2".parse(), Ok(Distribution::Zipf(1.2)));
    }
}
