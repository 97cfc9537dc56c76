//! `history-only`: the target's historical attention record alone (an ablation of `dustin`,
//! arXiv 2606.24957: `alpha = 0`, no draft lookahead).
//!
//! Reads and writes exactly what [`Dustin`] does (prefill seeds and head calibration, the
//! estimator heads' exact attention at verification `[batch, e, n, keys]`, pending
//! contributions folded at commit for the accepted rows only), without the lookahead; writes
//! the normalised history `[batch, kv_heads, ctx]`.

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{ImportanceEstimator, LayerAttnCtx, Phase, Result, ScoreCtx, Scores};

use super::dustin::{Dustin, DustinConfig};
use crate::{EstimationCost, SelectConfig};

/// [`Dustin`] with `alpha = 0` (its `alpha` is ignored).
#[derive(Debug, Clone)]
pub struct HistoryOnly<B: Backend>(Dustin<B>);

impl<B: Backend> HistoryOnly<B> {
    /// An estimator with `cfg` (`alpha` ignored) for a selector configured by `select`.
    ///
    /// # Errors
    /// As [`Dustin::new`].
    pub fn new(cfg: DustinConfig, select: &SelectConfig) -> Result<Self> {
        Ok(Self(Dustin::new(cfg, select)?.without_lookahead()))
    }

    /// An estimator with `cfg` (`alpha` ignored); see [`Dustin::with_config`].
    ///
    /// # Errors
    /// As [`Dustin::with_config`].
    pub fn with_config(cfg: DustinConfig) -> Result<Self> {
        Ok(Self(Dustin::with_config(cfg)?.without_lookahead()))
    }

    /// The underlying estimator (history, estimator heads).
    pub fn inner(&self) -> &Dustin<B> {
        &self.0
    }
}

impl<B: dustin_kernels::KernelOps> ImportanceEstimator<B> for HistoryOnly<B> {
    fn name(&self) -> String {
        self.0.name()
    }
    fn reset(&mut self, batch: usize, num_layers: usize) {
        self.0.reset(batch, num_layers);
    }
    fn observe_prefill(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<()> {
        self.0.observe_prefill(ctx)
    }
    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        self.0.score(ctx)
    }
    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        self.0.wants_probs(layer, phase)
    }
    fn observe_probs(&mut self, layer: usize, phase: Phase, probs: &Tensor<B, 4>) -> Result<()> {
        self.0.observe_probs(layer, phase, probs)
    }
    fn observe_verify(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<()> {
        self.0.observe_verify(ctx)
    }
    fn commit(&mut self, accepted: &[usize]) -> Result<()> {
        self.0.commit(accepted)
    }
    fn retain(&mut self, keep: &[usize]) {
        self.0.retain(keep);
    }
}

impl<B: Backend> EstimationCost for HistoryOnly<B> {
    fn score_reads(&self, layer: usize, ctx: usize, kv_heads: usize, heads: usize) -> f64 {
        self.0.score_reads(layer, ctx, kv_heads, heads)
    }
    fn observe_reads(&self, layer: usize, ctx: usize, kv_heads: usize, heads: usize) -> f64 {
        self.0.observe_reads(layer, ctx, kv_heads, heads)
    }
}
