//! `streaming`: attention sinks plus the most recent tokens (StreamingLLM, Xiao et al. 2023,
//! "Efficient Streaming Language Models with Attention Sinks").
//!
//! Reads only the context lengths; writes recency scores `[batch, kv_heads, ctx]` (score of
//! position `p` is `p`), so the shared top-k step keeps the sinks it always keeps plus the
//! `budget - n_sink` most recent positions. Static: no state.

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{ImportanceEstimator, Result, ScoreCtx, Scores};

use super::prompt::max_ctx;

/// StreamingLLM: score = position.
#[derive(Debug, Default, Clone, Copy)]
pub struct Streaming;

impl<B: Backend> ImportanceEstimator<B> for Streaming {
    fn name(&self) -> String {
        "streaming".into()
    }

    fn reset(&mut self, _batch: usize, _num_layers: usize) {}

    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        let a = ctx.attn;
        let c = max_ctx(a)?;
        let [b, kvh, _, _] = a.k.dims();
        // exact in f32 up to 2^24 positions
        let s = Tensor::<B, 1, burn_tensor::Int>::arange(0..c as i64, &a.k.device())
            .float()
            .reshape([1, 1, c])
            .expand([b, kvh, c]);
        Ok(Scores::Tokens(s))
    }
}

impl crate::EstimationCost for Streaming {}
