//! `draft-only`: the draft model's lookahead alone (an ablation of `dustin`, in the spirit of
//! SpecAttn: the draft's attention decides what the target reads).
//!
//! Reads the lookahead `[batch, ctx']` from [`ImportanceEstimator::observe_lookahead`] (the
//! draft's attention mass per context position for the coming verification, normalised per
//! sequence); writes it, zero-padded or truncated to the largest context, broadcast to every
//! layer and KV head: `[batch, kv_heads, ctx]`.
//!
//! The lookahead is used for the verification it was observed for and dropped at
//! [`commit`](ImportanceEstimator::commit); scoring without one is an error (the drafter
//! must be asked for it: [`wants_lookahead`](ImportanceEstimator::wants_lookahead) is true).

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{CoreError, ImportanceEstimator, Result, ScoreCtx, Scores};

use super::prompt::score_width;
use crate::attn::fit_last;

/// The draft lookahead as scores, for every layer.
#[derive(Debug, Clone, Default)]
pub struct DraftOnly<B: Backend> {
    lookahead: Option<Tensor<B, 2>>,
}

impl<B: Backend> DraftOnly<B> {
    /// A fresh estimator.
    pub fn new() -> Self {
        Self { lookahead: None }
    }
}

/// The lookahead `[batch, ctx']` fitted to `[batch, c]`, or an error naming `lookahead`.
pub(crate) fn lookahead_for<B: Backend>(
    la: Option<&Tensor<B, 2>>,
    batch: usize,
    c: usize,
) -> Result<Tensor<B, 2>> {
    let la = la.ok_or_else(|| {
        CoreError::invalid(
            "lookahead",
            "a draft lookahead for this verification (observe_lookahead before scoring)",
            "none",
        )
    })?;
    let [lb, lc] = la.dims();
    if lb != batch {
        return Err(CoreError::Shape {
            name: "lookahead".into(),
            expected: vec![batch, c],
            found: vec![lb, lc],
        });
    }
    Ok(fit_last(la.clone(), c))
}

impl<B: Backend> ImportanceEstimator<B> for DraftOnly<B> {
    fn name(&self) -> String {
        "draft-only".into()
    }

    fn reset(&mut self, _batch: usize, _num_layers: usize) {
        self.lookahead = None;
    }

    fn observe_lookahead(&mut self, lookahead: &Tensor<B, 2>) {
        self.lookahead = Some(lookahead.clone());
    }

    fn wants_lookahead(&self) -> bool {
        true
    }

    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        let a = ctx.attn;
        let w = score_width(a)?;
        let [b, kvh, _, _] = a.k.dims();
        let la = lookahead_for(self.lookahead.as_ref(), b, w)?;
        Ok(Scores::Tokens(la.reshape([b, 1, w]).expand([b, kvh, w])))
    }

    fn commit(&mut self, _accepted: &[usize]) -> Result<()> {
        self.lookahead = None;
        Ok(())
    }

    fn retain(&mut self, _keep: &[usize]) {
        self.lookahead = None;
    }
}

/// Nothing read at verification (prefill or draft state only).
impl<B: Backend> crate::EstimationCost for DraftOnly<B> {}
