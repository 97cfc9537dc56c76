//! 95% confidence intervals for the fidelity tables: the Wilson score interval of a
//! proportion, and percentile bootstrap intervals of a mean or of a ratio of sums (resampling
//! whole groups, such as the verification windows of a run, with a fixed seed so that a
//! report is reproducible).

use serde::{Deserialize, Serialize};

/// The 0.975 quantile of the standard normal distribution: the `z` of a two-sided 95%
/// interval (Python's `statistics.NormalDist().inv_cdf(0.975)`).
pub const Z95: f64 = 1.959_963_984_540_053_6;

/// Resamples of the tables' bootstrap intervals: 1000, a common choice for a 95% percentile
/// interval (its end points move by about 0.01 standard errors between seeds).
pub const BOOTSTRAP_RESAMPLES: usize = 1000;

/// The seed of the tables' bootstrap intervals.
pub const BOOTSTRAP_SEED: u64 = 0x5eed_f1de;

/// A two-sided interval `[lo, hi]`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Lower end.
    pub lo: f64,
    /// Upper end.
    pub hi: f64,
}

/// Bad input to an interval.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum IntervalError {
    /// No observations.
    #[error("{what}: no observations")]
    Empty {
        /// What was being estimated.
        what: &'static str,
    },
    /// More successes than trials.
    #[error("wilson: {successes} successes of {trials} trials")]
    TooManySuccesses {
        /// Successes.
        successes: usize,
        /// Trials.
        trials: usize,
    },
    /// A parameter outside its range.
    #[error("{what}: {value} is out of range")]
    OutOfRange {
        /// The parameter.
        what: &'static str,
        /// Its value.
        value: f64,
    },
}

/// The Wilson score interval of `successes` out of `trials` at normal quantile `z` (use
/// [`Z95`] for 95%): `(p + z²/2n ± z sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n)`, clamped to
/// `[0, 1]`.
///
/// # Errors
/// [`IntervalError::Empty`] when `trials` is 0, [`IntervalError::TooManySuccesses`] when
/// `successes > trials`, [`IntervalError::OutOfRange`] for a `z` that is not positive and
/// finite.
pub fn wilson(successes: usize, trials: usize, z: f64) -> Result<Interval, IntervalError> {
    if trials == 0 {
        return Err(IntervalError::Empty { what: "wilson" });
    }
    if successes > trials {
        return Err(IntervalError::TooManySuccesses { successes, trials });
    }
    if !z.is_finite() || z <= 0.0 {
        return Err(IntervalError::OutOfRange {
            what: "wilson z",
            value: z,
        });
    }
    let n = trials as f64;
    let p = successes as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    Ok(Interval {
        lo: (centre - half).max(0.0),
        hi: (centre + half).min(1.0),
    })
}

/// SplitMix64 (Steele, Lea and Flood 2014): a small, fixed, seedable generator, so that an
/// interval does not depend on a dependency's version.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (multiply-shift; the bias is below 2^-40 for the sizes used here).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// The `q` quantile of sorted `xs` by linear interpolation between order statistics (type 7
/// of Hyndman and Fan, numpy's default).
fn quantile_sorted(xs: &[f64], q: f64) -> f64 {
    let h = (xs.len() - 1) as f64 * q;
    let (lo, hi) = (h.floor() as usize, h.ceil() as usize);
    xs[lo] + (h - lo as f64) * (xs[hi] - xs[lo])
}

/// Checks a bootstrap's settings: at least one resample, a `level` inside `(0, 1)`.
fn check_bootstrap(resamples: usize, level: f64) -> Result<(), IntervalError> {
    if resamples == 0 {
        return Err(IntervalError::OutOfRange {
            what: "bootstrap resamples",
            value: 0.0,
        });
    }
    if level.is_nan() || level <= 0.0 || level >= 1.0 {
        return Err(IntervalError::OutOfRange {
            what: "bootstrap level",
            value: level,
        });
    }
    Ok(())
}

/// The `(1 - level) / 2` and `(1 + level) / 2` quantiles of the resampled statistics.
fn percentile_interval(mut stats: Vec<f64>, level: f64) -> Interval {
    stats.sort_by(f64::total_cmp);
    let tail = (1.0 - level) / 2.0;
    Interval {
        lo: quantile_sorted(&stats, tail),
        hi: quantile_sorted(&stats, 1.0 - tail),
    }
}

/// Percentile bootstrap interval at `level` (0.95 for 95%) of the ratio of sums
/// `Σ num / Σ den` over `groups` of `(num, den)`: `resamples` times, as many groups as there
/// are are drawn with replacement (SplitMix64 from `seed`) and the ratio of the drawn sums
/// taken; the interval is the `(1 - level) / 2` and `(1 + level) / 2` quantiles of those
/// ratios. With one group per verification window, `num` the window's summed KL and `den` its
/// positions, this is the interval of the mean KL per position resampling whole windows.
///
/// # Errors
/// [`IntervalError::Empty`] without groups, [`IntervalError::OutOfRange`] for `resamples`
/// 0, a `level` outside `(0, 1)`, or a group whose `den` is not positive.
pub fn bootstrap_ratio(
    groups: &[(f64, f64)],
    resamples: usize,
    level: f64,
    seed: u64,
) -> Result<Interval, IntervalError> {
    if groups.is_empty() {
        return Err(IntervalError::Empty { what: "bootstrap" });
    }
    check_bootstrap(resamples, level)?;
    if let Some(&(_, d)) = groups
        .iter()
        .find(|g| g.1.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater))
    {
        return Err(IntervalError::OutOfRange {
            what: "bootstrap group size",
            value: d,
        });
    }
    let mut rng = SplitMix64(seed);
    let n = groups.len();
    let stats: Vec<f64> = (0..resamples)
        .map(|_| {
            let (mut num, mut den) = (0.0, 0.0);
            for _ in 0..n {
                let (a, b) = groups[rng.below(n)];
                num += a;
                den += b;
            }
            num / den
        })
        .collect();
    Ok(percentile_interval(stats, level))
}

/// Percentile bootstrap interval at `level` of the mean of `values` (each resampled on its
/// own): [`bootstrap_ratio`] with groups of one.
///
/// # Errors
/// As [`bootstrap_ratio`].
pub fn bootstrap_mean(
    values: &[f64],
    resamples: usize,
    level: f64,
    seed: u64,
) -> Result<Interval, IntervalError> {
    let groups: Vec<(f64, f64)> = values.iter().map(|&v| (v, 1.0)).collect();
    bootstrap_ratio(&groups, resamples, level, seed)
}

/// Percentile bootstrap interval at `level` of `mean(a) / mean(b)` for two independent
/// samples: each resample draws `a` and `b` with replacement, each from its own elements
/// (one SplitMix64 stream from `seed`), and takes the ratio of the two means.
///
/// # Errors
/// [`IntervalError::Empty`] when either sample is empty, [`IntervalError::OutOfRange`] for
/// `resamples` 0 or a `level` outside `(0, 1)`.
pub fn bootstrap_ratio_of_means(
    a: &[f64],
    b: &[f64],
    resamples: usize,
    level: f64,
    seed: u64,
) -> Result<Interval, IntervalError> {
    if a.is_empty() || b.is_empty() {
        return Err(IntervalError::Empty {
            what: "bootstrap ratio of means",
        });
    }
    check_bootstrap(resamples, level)?;
    let mut rng = SplitMix64(seed);
    let draw = |xs: &[f64], rng: &mut SplitMix64| {
        (0..xs.len()).map(|_| xs[rng.below(xs.len())]).sum::<f64>() / xs.len() as f64
    };
    let stats: Vec<f64> = (0..resamples)
        .map(|_| {
            let ma = draw(a, &mut rng);
            ma / draw(b, &mut rng)
        })
        .collect();
    Ok(percentile_interval(stats, level))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wilson intervals computed independently in float64 by Python 3 (`math`, and
    /// `statistics.NormalDist().inv_cdf(0.975)` for z) from the textbook formula; 81 of 263
    /// is the worked example of the Wikipedia article on binomial proportion confidence
    /// intervals (0.2553, 0.3662).
    #[test]
    fn wilson_matches_an_independent_float64_computation() {
        let cases = [
            (81, 263, 0.255_288_519_878_274_3, 0.366_209_576_982_800_1),
            (0, 10, 0.0, 0.277_532_799_862_889_15),
            (10, 10, 0.722_467_200_137_110_9, 1.0),
            (450, 480, 0.912_179_949_032_467_8, 0.955_872_989_266_163_9),
            (1, 1, 0.206_549_314_377_237_45, 1.0),
        ];
        for (k, n, lo, hi) in cases {
            let w = wilson(k, n, Z95).unwrap();
            assert!((w.lo - lo).abs() < 1e-12, "{k}/{n}: lo {}", w.lo);
            assert!((w.hi - hi).abs() < 1e-12, "{k}/{n}: hi {}", w.hi);
        }
    }

    #[test]
    fn z95_is_the_normal_quantile() {
        // Python: statistics.NormalDist().inv_cdf(0.975)
        assert_eq!(Z95, 1.959_963_984_540_053_6);
    }

    #[test]
    fn bad_input_is_an_error_naming_it() {
        assert_eq!(
            wilson(1, 0, Z95),
            Err(IntervalError::Empty { what: "wilson" })
        );
        assert!(wilson(3, 2, Z95)
            .unwrap_err()
            .to_string()
            .contains("3 successes of 2"));
        assert!(wilson(1, 2, f64::NAN).is_err());
        assert!(bootstrap_mean(&[], 10, 0.95, 1).is_err());
        assert!(bootstrap_mean(&[1.0], 0, 0.95, 1).is_err());
        assert!(bootstrap_mean(&[1.0], 10, 1.0, 1).is_err());
        assert!(bootstrap_ratio(&[(1.0, 0.0)], 10, 0.95, 1)
            .unwrap_err()
            .to_string()
            .contains("group size"));
    }

    /// A constant sample has a point interval; a sample whose every value is equal gives the
    /// same interval for any seed.
    #[test]
    fn constant_samples_give_point_intervals() {
        let i = bootstrap_mean(&[2.5; 7], 200, 0.95, 3).unwrap();
        assert_eq!((i.lo, i.hi), (2.5, 2.5));
        let r = bootstrap_ratio(&[(3.0, 2.0), (6.0, 4.0)], 200, 0.95, 9).unwrap();
        assert_eq!((r.lo, r.hi), (1.5, 1.5));
    }

    /// On a large sample the percentile bootstrap of a mean agrees with the normal-theory
    /// interval `mean ± 1.96 s / sqrt(n)` (s with divisor n, the bootstrap's own variance) to
    /// within a few percent of its width; the sample is 0, 1, .., 399 (mean 199.5, s =
    /// sqrt((400² - 1) / 12) = 115.47).
    #[test]
    fn bootstrap_mean_agrees_with_normal_theory_on_a_large_sample() {
        let xs: Vec<f64> = (0..400).map(f64::from).collect();
        let i = bootstrap_mean(&xs, 4000, 0.95, 7).unwrap();
        let s = ((400.0f64 * 400.0 - 1.0) / 12.0).sqrt();
        let half = Z95 * s / 20.0; // 11.316
        let (lo, hi) = (199.5 - half, 199.5 + half);
        assert!((i.lo - lo).abs() < 0.05 * 2.0 * half, "lo {} vs {lo}", i.lo);
        assert!((i.hi - hi).abs() < 0.05 * 2.0 * half, "hi {} vs {hi}", i.hi);
    }

    /// The ratio of two large independent samples' means agrees with the delta-method
    /// interval `r ± 1.96 r sqrt(va / (n ma²) + vb / (n mb²))`: a = 0..399 (mean 199.5),
    /// b = 100..499 (mean 299.5), both with s² = (400² - 1) / 12.
    #[test]
    fn ratio_of_means_agrees_with_the_delta_method() {
        let a: Vec<f64> = (0..400).map(f64::from).collect();
        let b: Vec<f64> = (100..500).map(f64::from).collect();
        let i = bootstrap_ratio_of_means(&a, &b, 4000, 0.95, 11).unwrap();
        let (ma, mb, v) = (199.5f64, 299.5f64, (400.0f64 * 400.0 - 1.0) / 12.0);
        let r = ma / mb;
        let half = Z95 * r * (v / (400.0 * ma * ma) + v / (400.0 * mb * mb)).sqrt();
        assert!(
            (i.lo - (r - half)).abs() < 0.06 * 2.0 * half,
            "lo {} vs {}",
            i.lo,
            r - half
        );
        assert!(
            (i.hi - (r + half)).abs() < 0.06 * 2.0 * half,
            "hi {} vs {}",
            i.hi,
            r + half
        );
        let c = bootstrap_ratio_of_means(&[2.0; 5], &[4.0; 3], 100, 0.95, 1).unwrap();
        assert_eq!((c.lo, c.hi), (0.5, 0.5));
        assert!(bootstrap_ratio_of_means(&[], &[1.0], 10, 0.95, 1).is_err());
    }

    /// Resampling groups of different sizes estimates the pooled ratio: its interval holds
    /// the pooled mean, and the same seed gives the same interval.
    #[test]
    fn bootstrap_ratio_is_reproducible_and_holds_the_pooled_ratio() {
        let groups: Vec<(f64, f64)> = (0..50)
            .map(|i| (f64::from(i % 7) * 0.1, f64::from(1 + i % 3)))
            .collect();
        let pooled =
            groups.iter().map(|g| g.0).sum::<f64>() / groups.iter().map(|g| g.1).sum::<f64>();
        let a = bootstrap_ratio(&groups, 500, 0.95, 42).unwrap();
        let b = bootstrap_ratio(&groups, 500, 0.95, 42).unwrap();
        assert_eq!(a, b);
        assert!(a.lo < pooled && pooled < a.hi, "{a:?} vs {pooled}");
    }
}
