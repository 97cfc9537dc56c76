//! Token sampling on the host: temperature, top-k, top-p (nucleus, Holtzman et al. 2020),
//! greedy argmax, with the same transform for target and draft so that speculative
//! acceptance compares the distributions tokens were really drawn from.

use serde::{Deserialize, Serialize};

use crate::{CoreError, Result};

/// How next tokens are chosen from logits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingConfig {
    /// Softmax temperature; `0` means greedy (argmax).
    pub temperature: f32,
    /// Nucleus mass kept, `(0, 1]`; `1` disables top-p.
    pub top_p: f32,
    /// Keep the `top_k` most likely tokens; `0` disables top-k.
    pub top_k: usize,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
        }
    }
}

impl SamplingConfig {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Whether this is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// Checks the values.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming `temperature` or `top_p`.
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(CoreError::invalid(
                "temperature",
                "a finite number >= 0",
                self.temperature,
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(CoreError::invalid(
                "top_p",
                "a number in (0, 1]",
                self.top_p,
            ));
        }
        Ok(())
    }

    /// Turns logits (first `vocab` entries used) into the sampling distribution: softmax of
    /// `logits / temperature` restricted to top-k and top-p, renormalised. For greedy, a
    /// one-hot at the argmax (lowest index on ties).
    ///
    /// # Errors
    /// [`CoreError::NonFinite`] when a logit is NaN or `+inf` (`-inf` is a masked token).
    pub fn probs(&self, logits: &[f32], seq: usize) -> Result<Vec<f32>> {
        if logits.iter().any(|x| x.is_nan() || *x == f32::INFINITY) || logits.is_empty() {
            return Err(CoreError::NonFinite {
                what: "logits".into(),
                seq,
            });
        }
        if self.is_greedy() {
            let mut p = vec![0.0; logits.len()];
            p[argmax(logits)] = 1.0;
            return Ok(p);
        }
        let t = self.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return Err(CoreError::NonFinite {
                what: "logits (all -inf)".into(),
                seq,
            });
        }
        let mut p: Vec<f32> = logits.iter().map(|&x| ((x - max) / t).exp()).collect();
        let needs_cut = (self.top_k > 0 && self.top_k < p.len()) || self.top_p < 1.0;
        if needs_cut {
            let mut order: Vec<usize> = (0..p.len()).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let k = if self.top_k > 0 {
                self.top_k.min(p.len())
            } else {
                p.len()
            };
            let total: f32 = p.iter().sum();
            let mut keep = vec![false; p.len()];
            let mut mass = 0.0f32;
            for &i in order.iter().take(k) {
                // keep the smallest prefix whose mass reaches top_p (the token that crosses
                // the threshold is kept, as in HF `TopPLogitsWarper`)
                keep[i] = true;
                mass += p[i] / total;
                if mass >= self.top_p {
                    break;
                }
            }
            for (pi, k) in p.iter_mut().zip(keep) {
                if !k {
                    *pi = 0.0;
                }
            }
        }
        let sum: f32 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= sum);
        Ok(p)
    }
}

/// One sequence's sampling rule and the random stream of its draws: stream `stream` of the
/// ChaCha8 generator seeded with `seed`. Two sequences with the same rule, seed and stream
/// draw the same values, whatever else runs in their batch.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeqSampling {
    /// The sampling rule (greedy: argmax, no draws).
    pub sampling: SamplingConfig,
    /// Seed of the draws.
    pub seed: u64,
    /// Stream of the generator seeded with `seed`.
    pub stream: u64,
}

impl SeqSampling {
    /// Greedy decoding (no draws).
    pub fn greedy() -> Self {
        Self::new(SamplingConfig::greedy(), 0)
    }

    /// `sampling` drawing from stream 0 of `seed` (what a run of this sequence alone with
    /// `seed` draws from).
    pub fn new(sampling: SamplingConfig, seed: u64) -> Self {
        Self {
            sampling,
            seed,
            stream: 0,
        }
    }

    /// Whether the rule is greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.sampling.is_greedy()
    }
}

/// Index of the largest value (lowest index on ties; NaN never wins).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &v) in x.iter().enumerate() {
        if v > bv {
            bv = v;
            best = i;
        }
    }
    best
}

/// Draws an index from `probs` (summing to about 1) with a uniform `u` in `[0, 1)`, by
/// inverse CDF; falls back to the last index with non-zero mass on rounding.
pub fn sample_with(probs: &[f32], u: f32) -> usize {
    let mut acc = 0.0f32;
    let mut last = 0;
    for (i, &p) in probs.iter().enumerate() {
        if p > 0.0 {
            acc += p;
            last = i;
            if u < acc {
                return i;
            }
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_softmax_matches_hand_values() {
        // softmax([0, ln 2, ln 3] / 1) = [1/6, 2/6, 3/6]
        let cfg = SamplingConfig {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
        };
        let p = cfg.probs(&[0.0, 2f32.ln(), 3f32.ln()], 0).unwrap();
        for (a, b) in p.iter().zip([1.0 / 6.0, 2.0 / 6.0, 0.5]) {
            assert!((a - b).abs() < 1e-6, "{p:?}");
        }
        // temperature 0.5 squares the ratios: [1, 4, 9] / 14
        let cfg = SamplingConfig {
            temperature: 0.5,
            ..cfg
        };
        let p = cfg.probs(&[0.0, 2f32.ln(), 3f32.ln()], 0).unwrap();
        for (a, b) in p.iter().zip([1.0 / 14.0, 4.0 / 14.0, 9.0 / 14.0]) {
            assert!((a - b).abs() < 1e-6, "{p:?}");
        }
    }

    #[test]
    fn top_p_and_top_k_cut() {
        // probs [0.5, 0.3, 0.2]: top_p 0.6 keeps {0, 1} -> [0.625, 0.375, 0]
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let cfg = SamplingConfig {
            temperature: 1.0,
            top_p: 0.6,
            top_k: 0,
        };
        let p = cfg.probs(&logits, 0).unwrap();
        assert!(
            (p[0] - 0.625).abs() < 1e-6 && (p[1] - 0.375).abs() < 1e-6 && p[2] == 0.0,
            "{p:?}"
        );
        let cfg = SamplingConfig {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 1,
        };
        assert_eq!(cfg.probs(&logits, 0).unwrap(), vec![1.0, 0.0, 0.0]);
    }

    #[test]
    fn nan_logits_are_an_error() {
        let cfg = SamplingConfig::default();
        assert!(matches!(
            cfg.probs(&[0.0, f32::NAN], 3),
            Err(CoreError::NonFinite { seq: 3, .. })
        ));
    }

    #[test]
    fn inverse_cdf() {
        assert_eq!(sample_with(&[0.25, 0.25, 0.5], 0.1), 0);
        assert_eq!(sample_with(&[0.25, 0.25, 0.5], 0.3), 1);
        assert_eq!(sample_with(&[0.25, 0.25, 0.5], 0.99), 2);
        assert_eq!(sample_with(&[0.0, 1.0, 0.0], 0.999_999), 1);
    }
}
