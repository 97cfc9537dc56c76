//! `dense`: no selection, every layer attends to the whole context.
//!
//! The upper bound on fidelity and the lower bound on speed (the reference every other
//! estimator is measured against). Reads nothing; writes [`Scores::Dense`].

use burn_tensor::backend::Backend;
use dustin_core::{ImportanceEstimator, Result, ScoreCtx, Scores};

/// The dense "estimator": always [`Scores::Dense`].
#[derive(Debug, Default, Clone, Copy)]
pub struct Dense;

impl<B: Backend> ImportanceEstimator<B> for Dense {
    fn name(&self) -> String {
        "dense".into()
    }

    fn reset(&mut self, _batch: usize, _num_layers: usize) {}

    fn score(&mut self, _ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        Ok(Scores::Dense)
    }
}

impl crate::EstimationCost for Dense {}
