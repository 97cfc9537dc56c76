#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod accept;
mod decoder;
mod drafter;
mod error;
pub mod join;
mod run;
mod verifier;

pub use decoder::{
    autoregressive, autoregressive_with_barrier, AutoregressiveDecoder, IterationStats, NoDraft,
    PhaseBarrier, SpecConfig, SpecOutput, SpecSummary, SpeculativeDecoder, MAX_GAMMA,
};
pub use drafter::{
    DraftSelection, LookaheadConfig, LookaheadLayers, LookaheadScoring, ModelDrafter,
};
pub use dustin_core::{Drafter, SelectionPolicy, Verifier};
pub use error::{Result, SpecError};
pub use join::{JoinDrafter, JoinPolicy, JoinVerifier, PerRow};
pub use run::{SeqLimits, SpecRun, HOLD_UNTIL};
pub use verifier::{ModelVerifier, TargetKv};

/// Rows `rows` (ascending) along the first axis of `t`: `t` itself when `rows` is every
/// row, else one gather.
pub(crate) fn select_rows<B: burn_tensor::backend::Backend, const D: usize>(
    t: burn_tensor::Tensor<B, D>,
    rows: &[usize],
) -> burn_tensor::Tensor<B, D> {
    if rows.len() == t.dims()[0] {
        return t;
    }
    let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let idx = burn_tensor::Tensor::<B, 1, burn_tensor::Int>::from_data(
        burn_tensor::TensorData::new(idx, [rows.len()]),
        &t.device(),
    );
    t.select(0, idx)
}
