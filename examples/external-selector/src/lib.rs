//! A KV-selection method outside the dustin workspace: **strided** selection, the most recent
//! positions plus every `stride`-th one (a regular sample of the older context, as the
//! strided pattern of sparse transformers, Child et al. 2019, "Generating Long Sequences with
//! Sparse Transformers").
//!
//! It is written as any project would write one, against the public traits only: an
//! [`ImportanceEstimator`] that *scores* context positions, the [`EstimationCost`] of its
//! scoring (nothing: it reads only the context lengths), and `Clone`. Wrapped in a
//! [`dustin_select::Selector`], it becomes a [`dustin_core::SelectionPolicy`] that a verifier
//! runs its target with; the selector's shared top-k step adds the attention sinks, the recent
//! window and the budget.
//!
//! Scores, `[batch, kv_heads, width]` over positions `0 .. width` (`width` the longest context
//! of the batch): position `p` scores `p`, plus `width` when `p` is a multiple of `stride`. So
//! every strided position outranks every other one, and within each kind the more recent
//! position ranks higher: a budget too small for all strided positions keeps the most recent
//! of them, and a budget left over after them goes to the most recent other positions.
//!
//! ```
//! use dustin_select::{SelectConfig, Selector};
//! use external_selector::Strided;
//!
//! type B = burn_flex::Flex;
//! let cfg = SelectConfig { budget: 256, n_sink: 4, window: 64, ..SelectConfig::default() };
//! let policy = Selector::<B, _>::new(Strided::new(8)?, cfg)?;
//! assert_eq!(policy.estimator().stride(), 8);
//! # Ok::<(), dustin_core::CoreError>(())
//! ```
#![warn(missing_docs)]

use burn_tensor::{backend::Backend, Tensor, TensorData};
use dustin_core::{CoreError, ImportanceEstimator, Result, ScoreCtx, Scores};
use dustin_select::EstimationCost;

/// Strided selection: every `stride`-th context position first (most recent first), then the
/// most recent others (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strided {
    stride: usize,
}

impl Strided {
    /// Every `stride`-th position ranks above the others.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming `stride` when it is 0.
    pub fn new(stride: usize) -> Result<Self> {
        if stride == 0 {
            return Err(CoreError::invalid("stride", "at least 1", stride));
        }
        Ok(Self { stride })
    }

    /// The stride, in positions.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The scores of positions `0 .. width` (the same for every sequence and KV head).
    pub fn position_scores(&self, width: usize) -> Vec<f32> {
        (0..width)
            .map(|p| {
                let bonus = if p % self.stride == 0 { width } else { 0 };
                // exact in f32 while 2 * width <= 2^24
                (p + bonus) as f32
            })
            .collect()
    }
}

impl<B: Backend> ImportanceEstimator<B> for Strided {
    fn name(&self) -> String {
        format!("strided({})", self.stride)
    }

    fn reset(&mut self, _batch: usize, _num_layers: usize) {}

    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        let a = ctx.attn;
        let width = a.ctx_lens.iter().copied().max().unwrap_or(0);
        let [batch, kv_heads, _, _] = a.k.dims();
        let row = TensorData::new(self.position_scores(width), [1, 1, width]);
        let scores = Tensor::<B, 3>::from_data(row, &a.k.device()).expand([batch, kv_heads, width]);
        Ok(Scores::Tokens(scores))
    }
}

/// Reads nothing of the KV cache (the context lengths only): every estimation read is 0.
impl EstimationCost for Strided {}
