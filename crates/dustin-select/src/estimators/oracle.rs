//! `oracle`: exact top-k of the full target attention of the current verification, all heads
//! (the fidelity ceiling of any selection at a given budget; as in Quest's and H2O's oracle
//! baselines, Tang et al. 2024 / Zhang et al. 2023).
//!
//! Reads, at every verification: queries `[batch, heads, n, head_dim]` and keys
//! `[batch, kv_heads, keys, head_dim]`; computes `softmax(q k^T * scale)` with the model's
//! causal rule (new query `i` of sequence `b` sees keys `<= ctx_b + i`, new tokens included,
//! so the probabilities are exactly the dense ones), sums them over the group's heads and the
//! new queries, and writes the context part `[batch, kv_heads, ctx]`.
//!
//! Costs a dense attention per layer (it is a ceiling, not a method). No state.

use dustin_core::{ImportanceEstimator, Result, ScoreCtx, Scores};
use dustin_kernels::{KernelError, KernelOps};

use super::prompt::score_width;
use crate::attn::{fit_last, grouped_probs};
use crate::topk::kernel_error;

/// The oracle: exact attention mass of the verification queries.
#[derive(Debug, Default, Clone, Copy)]
pub struct Oracle;

impl<B: KernelOps> ImportanceEstimator<B> for Oracle {
    fn name(&self) -> String {
        "oracle".into()
    }

    fn reset(&mut self, _batch: usize, _num_layers: usize) {}

    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        let a = ctx.attn;
        // over the keys' (padded) width, not max(ctx): see `score_width`
        let w = score_width(a)?;
        let [b, kvh, l, _] = a.k.dims();
        if B::SELECTION_KERNELS {
            let all: Vec<usize> = (0..a.q.dims()[1]).collect();
            match B::head_subset_scores(a.q.clone(), a.k.clone(), a.ctx_lens, &all, a.scale) {
                Ok(m) => return Ok(Scores::Tokens(fit_last(m, w))),
                Err(KernelError::Unsupported(_)) => {}
                Err(e) => return Err(kernel_error(e)),
            }
        }
        let mass = grouped_probs(a.q.clone(), a.k.clone(), a.ctx_lens, a.scale)
            .sum_dims(&[2, 3])
            .reshape([b, kvh, l]);
        Ok(Scores::Tokens(fit_last(mass, w)))
    }
}

/// The keys of every KV head over the whole context (0.5 token-equivalent per position).
impl crate::EstimationCost for Oracle {
    fn score_reads(&self, _layer: usize, ctx: usize, kv_heads: usize, _heads: usize) -> f64 {
        0.5 * (kv_heads * ctx) as f64
    }
}
