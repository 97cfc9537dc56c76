//! `snapkv`: observation-window voting with pooling, per KV head (SnapKV, Li et al. 2024,
//! "SnapKV: LLM Knows What You are Looking for Before Generation").
//!
//! Reads, on the last prefill chunk of sequence `s` only: queries `[1, heads, n, head_dim]`
//! and keys `[1, kv_heads, P, head_dim]` (`P` = prompt length). The last `obs_window` queries'
//! causal attention over the prompt is summed over those queries and the heads of each KV
//! group (votes `[kv_heads, P - w]` over the prefix before the window), 1-D max-pooled with
//! kernel `kernel` (stride 1, same length), and stored per (sequence, layer); the
//! observation window's own positions get the largest finite score (SnapKV always keeps them).
//! Writes, at verification, those rows as scores `[batch, kv_heads, ctx]` (0 for positions
//! generated after the prompt).
//!
//! Static after prefill: nothing to roll back.

use burn_tensor::{backend::Backend, module::max_pool1d, Tensor};
use dustin_core::{CoreError, ImportanceEstimator, LayerAttnCtx, Result, ScoreCtx, Scores};
use serde::{Deserialize, Serialize};

use super::prompt::{prefill_keys, prefill_seq, score_width, PromptRows};
use crate::attn::grouped_probs;

/// Knobs of [`SnapKv`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SnapKvConfig {
    /// Queries at the end of the prompt that vote. Default 32: SnapKV's observation window.
    pub obs_window: usize,
    /// Max-pooling kernel over positions. Default 7: SnapKV's pooling kernel.
    pub kernel: usize,
}

impl Default for SnapKvConfig {
    fn default() -> Self {
        Self {
            obs_window: 32,
            kernel: 7,
        }
    }
}

impl SnapKvConfig {
    /// Checks `obs_window >= 1` and an odd `kernel >= 1`.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.obs_window == 0 {
            return Err(CoreError::invalid("obs_window", "at least 1", 0));
        }
        if self.kernel.is_multiple_of(2) {
            return Err(CoreError::invalid(
                "kernel",
                "an odd size (same-length pooling)",
                self.kernel,
            ));
        }
        Ok(())
    }
}

/// SnapKV's pooled observation-window votes, static after prefill.
#[derive(Debug, Clone)]
pub struct SnapKv<B: Backend> {
    cfg: SnapKvConfig,
    votes: PromptRows<B>,
}

impl<B: Backend> SnapKv<B> {
    /// An estimator with `cfg`.
    ///
    /// # Errors
    /// [`SnapKvConfig::validate`]'s.
    pub fn new(cfg: SnapKvConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            votes: PromptRows::default(),
        })
    }
}

impl<B: Backend> ImportanceEstimator<B> for SnapKv<B> {
    fn name(&self) -> String {
        "snapkv".into()
    }

    fn reset(&mut self, batch: usize, num_layers: usize) {
        self.votes.reset(batch, num_layers);
    }

    fn observe_prefill(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<()> {
        let Some((seq, true)) = prefill_seq(ctx)? else {
            return Ok(());
        };
        let [_, nh, n, d] = ctx.q.dims();
        // the prompt's keys, not the padded view's
        let keys = prefill_keys(ctx);
        let [_, kvh, l, _] = keys.dims();
        let w = self.cfg.obs_window.min(n);
        let q = ctx.q.clone().slice([0..1, 0..nh, n - w..n, 0..d]);
        let first = [ctx.ctx_lens[0] + n - w];
        let votes = grouped_probs(q, keys.clone(), &first, ctx.scale)
            .sum_dims(&[2, 3])
            .reshape([1, kvh, l]);
        let prefix = l - w;
        let device = ctx.k.device();
        let keep = Tensor::<B, 3>::full([1, kvh, w], f32::MAX, &device);
        let row = if prefix == 0 {
            keep
        } else {
            let k = self.cfg.kernel;
            let pooled = max_pool1d(votes.narrow(2, 0, prefix), k, 1, k / 2, 1, false);
            Tensor::cat(vec![pooled, keep], 2)
        };
        self.votes.set(seq, ctx.layer, row.reshape([kvh, l]));
        Ok(())
    }

    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        let a = ctx.attn;
        let w = score_width(a)?;
        let [b, kvh, _, _] = a.k.dims();
        Ok(Scores::Tokens(self.votes.batched(
            a.layer,
            b,
            kvh,
            w,
            &a.k.device(),
        )))
    }

    fn retain(&mut self, keep: &[usize]) {
        self.votes.retain(keep);
    }
}

/// Nothing read at verification (prefill or draft state only).
impl<B: Backend> crate::EstimationCost for SnapKv<B> {}
