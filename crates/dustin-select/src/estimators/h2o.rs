//! `h2o`: heavy hitters by accumulated attention mass (H2O, Zhang et al. 2023, "H2O:
//! Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models").
//!
//! Reads, at every prefill chunk of sequence `s`: queries `[1, heads, n, head_dim]` and keys
//! `[1, kv_heads, c + n, head_dim]`; computes the chunk's causal attention
//! `softmax(q k^T * scale)` (chunk query `i` sits at position `c + i`) and adds its sum over
//! the queries and the heads of each KV group to a record `[kv_heads, len]` per
//! (sequence, layer). Writes, at verification, that record as the scores
//! `[batch, kv_heads, ctx]` (0 for positions generated after the prompt).
//!
//! Static after prefill, as a one-shot eviction decision: the "recent" half of H2O is the
//! shared top-k step's window, and nothing is rolled back because nothing is learnt from
//! verification queries.

use burn_tensor::backend::Backend;
use dustin_core::{ImportanceEstimator, LayerAttnCtx, Result, ScoreCtx, Scores};

use super::prompt::{prefill_keys, prefill_seq, score_width, PromptRows};
use crate::attn::grouped_probs;

/// H2O's accumulated attention mass, static after prefill.
#[derive(Debug, Clone, Default)]
pub struct H2o<B: Backend> {
    mass: PromptRows<B>,
    batch: usize,
}

impl<B: Backend> H2o<B> {
    /// A fresh estimator (no knobs: H2O's heavy/recent split is the selector's budget and
    /// window).
    pub fn new() -> Self {
        Self {
            mass: PromptRows::default(),
            batch: 0,
        }
    }
}

impl<B: Backend> ImportanceEstimator<B> for H2o<B> {
    fn name(&self) -> String {
        "h2o".into()
    }

    fn reset(&mut self, batch: usize, num_layers: usize) {
        self.batch = batch;
        self.mass.reset(batch, num_layers);
    }

    fn observe_prefill(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<()> {
        let Some((seq, _)) = prefill_seq(ctx)? else {
            return Ok(());
        };
        // the prompt's keys, not the padded view's
        let keys = prefill_keys(ctx);
        let [_, kvh, l, _] = keys.dims();
        let probs = grouped_probs(ctx.q.clone(), keys.clone(), ctx.ctx_lens, ctx.scale);
        let mass = probs.sum_dims(&[2, 3]).reshape([kvh, l]);
        self.mass.add(seq, ctx.layer, mass);
        Ok(())
    }

    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        let a = ctx.attn;
        let w = score_width(a)?;
        let [b, kvh, _, _] = a.k.dims();
        Ok(Scores::Tokens(self.mass.batched(
            a.layer,
            b,
            kvh,
            w,
            &a.k.device(),
        )))
    }

    fn retain(&mut self, keep: &[usize]) {
        self.mass.retain(keep);
        self.batch = keep.len();
    }
}

/// Nothing read at verification (prefill or draft state only).
impl<B: Backend> crate::EstimationCost for H2o<B> {}
