//! A small, self-contained, seedable random number generator and the distributions the model
//! needs.
//!
//! The generator is xoshiro256++ (Blackman and Vigna), seeded through SplitMix64. It is written
//! out here rather than taken from a crate so that the benchmark's numbers cannot change when a
//! dependency changes its algorithm or its seeding: the same scenario file gives the same report
//! on every machine and with every lock file.
//!
//! Each part of the model draws from its own stream ([`SimRng::stream`]), so that, for example,
//! the arrival process is identical across the policies compared on one scenario (common random
//! numbers), and a change in how often workers poll does not shift the arrivals.

/// xoshiro256++ state.
#[derive(Clone, Debug)]
pub struct SimRng {
    s: [u64; 4],
}

/// SplitMix64 step, used to expand seeds.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mixes a stream name into a seed (FNV-1a over the bytes, then SplitMix64).
fn mix(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    let mut st = seed ^ h.rotate_left(17);
    splitmix64(&mut st)
}

impl SimRng {
    /// A generator seeded from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut st = seed;
        let s = [
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ];
        SimRng { s }
    }

    /// An independent stream named `name` of the scenario seed `seed`.
    pub fn stream(seed: u64, name: &str) -> Self {
        SimRng::new(mix(seed, name))
    }

    /// A seed for stream `name` number `index` (for example one per worker controller).
    pub fn derive_seed(seed: u64, name: &str, index: u64) -> u64 {
        let mut st = mix(seed, name) ^ index.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        splitmix64(&mut st)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[0]
            .wrapping_add(self.s[3])
            .rotate_left(23)
            .wrapping_add(self.s[0]);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in (0, 1] (safe to take the logarithm of).
    pub fn uniform_open0(&mut self) -> f64 {
        1.0 - self.uniform()
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Uniform integer in [0, n) (n > 0), by Lemire's multiply-shift (bias below 2^-64 * n).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p`.
    pub fn bernoulli(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            false
        } else if p >= 1.0 {
            true
        } else {
            self.uniform() < p
        }
    }

    /// Exponential with the given mean.
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * self.uniform_open0().ln()
    }

    /// Standard normal (Box-Muller; one of the pair is discarded to keep the state simple).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform_open0();
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Log-normal with the given *mean* and log-space standard deviation `sigma`.
    pub fn lognormal(&mut self, mean: f64, sigma: f64) -> f64 {
        if sigma <= 0.0 {
            return mean;
        }
        let mu = mean.ln() - 0.5 * sigma * sigma;
        (mu + sigma * self.normal()).exp()
    }

    /// Poisson with mean `lambda`: multiplication method below 30, Hörmann's PTRS above.
    pub fn poisson(&mut self, lambda: f64) -> u64 {
        if lambda.is_nan() || lambda <= 0.0 {
            return 0;
        }
        if lambda < 30.0 {
            let limit = (-lambda).exp();
            let mut k = 0u64;
            let mut p = self.uniform_open0();
            while p > limit {
                k += 1;
                p *= self.uniform_open0();
            }
            return k;
        }
        // W. Hörmann, "The transformed rejection method for generating Poisson random
        // variables", Insurance: Mathematics and Economics 12 (1993).
        let slam = lambda.sqrt();
        let loglam = lambda.ln();
        let b = 0.931 + 2.53 * slam;
        let a = -0.059 + 0.02483 * b;
        let inv_alpha = 1.1239 + 1.1328 / (b - 3.4);
        let vr = 0.9277 - 3.6224 / (b - 2.0);
        loop {
            let u = self.uniform() - 0.5;
            let v = self.uniform();
            let us = 0.5 - u.abs();
            let k = ((2.0 * a / us + b) * u + lambda + 0.43).floor();
            if us >= 0.07 && v <= vr {
                return k as u64;
            }
            if k < 0.0 || (us < 0.013 && v > us) {
                continue;
            }
            let lhs = v.ln() + inv_alpha.ln() - (a / (us * us) + b).ln();
            let rhs = -lambda + k * loglam - ln_factorial(k as u64);
            if lhs <= rhs {
                return k as u64;
            }
        }
    }
}

/// ln(k!): exact sum below 20, Stirling's series above (error below 1e-12).
fn ln_factorial(k: u64) -> f64 {
    if k < 20 {
        (2..=k).map(|i| (i as f64).ln()).sum()
    } else {
        let x = k as f64;
        x * x.ln() - x + 0.5 * (std::f64::consts::TAU * x).ln() + 1.0 / (12.0 * x)
            - 1.0 / (360.0 * x * x * x)
            + 1.0 / (1260.0 * x.powi(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_var(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let m = xs.iter().sum::<f64>() / n;
        let v = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0);
        (m, v)
    }

    #[test]
    fn same_seed_same_sequence_and_streams_differ() {
        let mut a = SimRng::new(42);
        let mut b = SimRng::new(42);
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut c = SimRng::stream(42, "arrivals");
        let mut d = SimRng::stream(42, "dependency");
        assert_ne!(c.next_u64(), d.next_u64());
    }

    #[test]
    fn uniform_is_in_range_with_the_right_mean() {
        let mut r = SimRng::new(1);
        let xs: Vec<f64> = (0..200_000).map(|_| r.uniform()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let (m, v) = mean_var(&xs);
        assert!((m - 0.5).abs() < 0.005, "{m}");
        assert!((v - 1.0 / 12.0).abs() < 0.002, "{v}");
    }

    #[test]
    fn poisson_mean_and_variance_small_and_large() {
        for &lambda in &[0.3, 4.0, 29.0, 31.0, 55.0, 400.0] {
            let mut r = SimRng::new(7);
            let xs: Vec<f64> = (0..100_000).map(|_| r.poisson(lambda) as f64).collect();
            let (m, v) = mean_var(&xs);
            let tol = 4.0 * (lambda / 100_000.0).sqrt() + 0.01 * lambda;
            assert!((m - lambda).abs() < tol, "lambda {lambda}: mean {m}");
            assert!(
                (v - lambda).abs() < 0.05 * lambda + 0.05,
                "lambda {lambda}: var {v}"
            );
        }
    }

    #[test]
    fn lognormal_has_the_requested_mean() {
        let mut r = SimRng::new(3);
        let xs: Vec<f64> = (0..200_000).map(|_| r.lognormal(1.5, 0.5)).collect();
        let (m, _) = mean_var(&xs);
        assert!((m - 1.5).abs() < 0.02, "{m}");
        assert!(xs.iter().all(|x| *x > 0.0));
    }

    #[test]
    fn below_is_in_range() {
        let mut r = SimRng::new(9);
        let mut counts = [0u32; 5];
        for _ in 0..50_000 {
            counts[r.below(5) as usize] += 1;
        }
        assert!(
            counts.iter().all(|c| (9_000..11_000).contains(c)),
            "{counts:?}"
        );
    }

    #[test]
    fn ln_factorial_matches_the_exact_sum() {
        let exact: f64 = (2..=40u64).map(|i| (i as f64).ln()).sum();
        assert!((ln_factorial(40) - exact).abs() < 1e-9);
    }
}
