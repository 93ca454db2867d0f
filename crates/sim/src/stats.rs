//! Small statistics helpers: a log-linear histogram of non-negative integers.

/// Values below this are counted exactly.
const LINEAR: u64 = 64;
/// Sub-buckets per power of two above [`LINEAR`] (relative resolution 1/32).
const SUB: u64 = 32;

/// A log-linear histogram of `u64` values: exact below 64, then 32 buckets per power of two
/// (quantiles within about 3 %). The maximum is exact.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    max: u64,
}

fn index(v: u64) -> usize {
    if v < LINEAR {
        return v as usize;
    }
    let e = 63 - u64::from(v.leading_zeros()); // >= 6
    let sub = (v >> (e - 5)) - SUB; // in [0, 32)
    (LINEAR + (e - 6) * SUB + sub) as usize
}

fn lower_bound(i: usize) -> u64 {
    let i = i as u64;
    if i < LINEAR {
        return i;
    }
    let e = (i - LINEAR) / SUB + 6;
    let sub = (i - LINEAR) % SUB;
    (SUB + sub) << (e - 5)
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Histogram::default()
    }

    /// Counts `n` occurrences of `v`.
    pub fn add(&mut self, v: u64, n: u64) {
        if n == 0 {
            return;
        }
        let i = index(v);
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, 0);
        }
        self.buckets[i] += n;
        self.count += n;
        self.max = self.max.max(v);
    }

    /// Number of values counted.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The largest value counted (0 when empty).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The `q`-quantile (0 <= q <= 1): the lower bound of the bucket holding it, capped at
    /// the maximum. 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return lower_bound(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_and_lower_bound_agree() {
        for v in [
            0u64, 1, 63, 64, 65, 100, 127, 128, 1000, 123_456, 10_000_000,
        ] {
            let lb = lower_bound(index(v));
            assert!(lb <= v, "{v}: {lb}");
            assert!(v - lb <= v / 32 + 1, "{v}: {lb}");
        }
    }

    #[test]
    fn quantiles_are_close() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.add(v, 1);
        }
        assert_eq!(h.count(), 10_000);
        assert_eq!(h.max(), 10_000);
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 - 9_900.0).abs() / 9_900.0 < 0.035, "{p99}");
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 5_000.0).abs() / 5_000.0 < 0.035, "{p50}");
        assert_eq!(Histogram::new().quantile(0.5), 0);
    }
}
