//! Acceptance rules of speculative decoding.
//!
//! Stochastic rule (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
//! Decoding", Algorithm 1; Chen et al. 2023): draft token `x_i ~ q_i` is accepted with
//! probability `min(1, p_i(x_i) / q_i(x_i))`; at the first rejection the next token is drawn
//! from `norm(max(p_i - q_i, 0))`; when all `gamma` are accepted a bonus token is drawn from
//! `p_gamma`. The emitted tokens are then distributed exactly as the target's own samples.
//! Greedy rule: accept while the draft token equals the target argmax; the next token is the
//! target argmax at the first mismatch (or after the last draft).

use dustin_core::{argmax, sample_with, CoreError};

/// Outcome for one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// Draft tokens accepted, `0 ..= gamma`.
    pub accepted: usize,
    /// The token the target emits after them (correction or bonus).
    pub next: u32,
}

/// Greedy acceptance. `target_argmax` has `gamma + 1` entries (argmax of the target at each
/// verified position), `draft` has `gamma`.
pub fn greedy(draft: &[u32], target_argmax: &[u32]) -> Accepted {
    let a = draft
        .iter()
        .zip(target_argmax)
        .take_while(|(d, t)| d == t)
        .count();
    Accepted {
        accepted: a,
        next: target_argmax.get(a).copied().unwrap_or(0),
    }
}

/// Stochastic acceptance. `p[i]` and `q[i]` are the target and draft sampling distributions
/// at draft step `i` (after the same temperature / top-p / top-k transform); `p` has
/// `gamma + 1` rows. `uniform()` yields independent draws in `[0, 1)`.
///
/// # Errors
/// [`CoreError::NonFinite`] when a distribution has no mass.
pub fn stochastic(
    draft: &[u32],
    p: &[Vec<f32>],
    q: &[Vec<f32>],
    seq: usize,
    uniform: &mut dyn FnMut() -> f32,
) -> Result<Accepted, CoreError> {
    for (i, &x) in draft.iter().enumerate() {
        let (pi, qi) = (&p[i], &q[i]);
        let px = pi.get(x as usize).copied().unwrap_or(0.0);
        let qx = qi.get(x as usize).copied().unwrap_or(0.0);
        let u = uniform();
        // accept with prob min(1, p/q); q(x) > 0 since x was drawn from q
        if qx > 0.0 && u < (px / qx).min(1.0) {
            continue;
        }
        let mut residual: Vec<f32> = pi
            .iter()
            .enumerate()
            .map(|(j, &pj)| (pj - qi.get(j).copied().unwrap_or(0.0)).max(0.0))
            .collect();
        let sum: f32 = residual.iter().sum();
        let next = if sum > 0.0 && sum.is_finite() {
            residual.iter_mut().for_each(|r| *r /= sum);
            sample_with(&residual, uniform())
        } else {
            // p == q up to rounding: any draw from p is exact
            sample_with(pi, uniform())
        };
        return Ok(Accepted {
            accepted: i,
            next: next as u32,
        });
    }
    let last = p.get(draft.len()).ok_or_else(|| CoreError::NonFinite {
        what: "target distribution for the bonus token".into(),
        seq,
    })?;
    Ok(Accepted {
        accepted: draft.len(),
        next: sample_with(last, uniform()) as u32,
    })
}

/// Argmax of each row (helper for greedy verification on host rows).
pub fn row_argmax(rows: &[Vec<f32>]) -> Vec<u32> {
    rows.iter().map(|r| argmax(r) as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_counts_leading_matches() {
        assert_eq!(
            greedy(&[1, 2, 3], &[1, 2, 9, 4]),
            Accepted {
                accepted: 2,
                next: 9
            }
        );
        assert_eq!(
            greedy(&[1, 2, 3], &[1, 2, 3, 4]),
            Accepted {
                accepted: 3,
                next: 4
            }
        );
        assert_eq!(
            greedy(&[5], &[1, 2]),
            Accepted {
                accepted: 0,
                next: 1
            }
        );
    }

    #[test]
    fn stochastic_rejects_token_the_target_cannot_emit() {
        // p puts no mass on token 0, so a drafted 0 must be rejected and the residual
        // norm(max(p - q, 0)) = token 1 with certainty.
        let p = vec![vec![0.0, 1.0], vec![0.5, 0.5]];
        let q = vec![vec![1.0, 0.0]];
        let mut u = || 0.0f32;
        let a = stochastic(&[0], &p, &q, 0, &mut u).unwrap();
        assert_eq!(
            a,
            Accepted {
                accepted: 0,
                next: 1
            }
        );
    }
}
