//! A log-linear latency histogram in the spirit of HdrHistogram: exact below 128 ns, then 64
//! sub-buckets per power of two, so any recorded value is known to within 1/64 (1.6 %) of itself.
//! Fixed size (3,776 counters), no allocation per record, mergeable across workers.

/// Values below this are their own bucket.
const LINEAR: u64 = 128;
/// Sub-buckets per power of two above [`LINEAR`].
const SUB: u64 = 64;
const BUCKETS: usize = (64 * 59) as usize;

#[derive(Clone)]
pub struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let msb = 63 - u64::from(v.leading_zeros());
    let shift = msb - 6;
    (shift * SUB + (v >> shift)) as usize
}

/// The smallest and largest value of bucket `i`.
fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < LINEAR {
        return (i, i);
    }
    let shift = i / SUB - 1;
    let low = (i - shift * SUB) << shift;
    (low, low + ((1 << shift) - 1))
}

impl Histogram {
    pub fn record(&mut self, value: u64) {
        self.counts[index(value)] += 1;
        self.total += 1;
        self.sum += u128::from(value);
        self.max = self.max.max(value);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    pub fn mean(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum as f64 / self.total as f64
        }
    }

    /// The value at quantile `q` (0..=1): the midpoint of the bucket holding that rank, capped
    /// at the largest value seen.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, high) = bounds(i);
                return (low + (high - low) / 2).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        let mut expected_low = 0;
        for i in 0..BUCKETS {
            let (low, high) = bounds(i);
            assert_eq!(low, expected_low, "bucket {i}");
            assert!(high >= low);
            assert_eq!(index(low), i);
            assert_eq!(index(high), i);
            assert!(
                (high - low) as f64 <= low.max(1) as f64 / 63.0,
                "bucket {i} too wide"
            );
            if high == u64::MAX {
                break;
            }
            expected_low = high + 1;
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_within_precision() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 1_000);
        }
        for (q, exact) in [
            (0.5, 50_000_000.0),
            (0.99, 99_000_000.0),
            (0.999, 99_900_000.0),
        ] {
            let got = h.quantile(q) as f64;
            assert!((got - exact).abs() / exact < 0.02, "q{q}: {got} vs {exact}");
        }
        assert_eq!(h.quantile(1.0), 100_000_000);
        assert_eq!(h.count(), 100_000);
        let mut other = Histogram::default();
        other.record(5);
        h.merge(&other);
        assert_eq!(h.quantile(0.0), 5);
        assert_eq!(h.count(), 100_001);
    }
}
