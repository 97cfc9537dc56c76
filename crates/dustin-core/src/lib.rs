//! # dustin-core
//!
//! The traits and plain types that every part of dustin passes around: [`KvStore`],
//! [`Drafter`], [`Verifier`], [`ImportanceEstimator`], the per-layer [`LayerSelection`] they
//! exchange, and the one error type [`CoreError`].
//!
//! This crate depends on the Burn tensor API and `thiserror` only, so that a selector or a
//! model can be written against it without pulling in the engine or the CLI.
//!
//! Tensor shapes are written `[batch, kv_heads, seq, head_dim]` in the docs; `batch` is the
//! number of *active* sequences of the current step (finished ones leave the batch).
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod cancel;
mod error;
mod estimator;
mod kv;
pub mod memory;
pub mod sampling;
mod spec;

pub use cancel::CancelToken;
pub use error::{CoreError, Result};
pub use estimator::{
    AttentionHook, DenseHook, ImportanceEstimator, LayerAttnCtx, LayerSelection, Phase,
    PrefillSignal, ScoreCtx, Scores, SelectionPolicy,
};
pub use kv::{KvStore, KvView};
pub use sampling::{argmax, sample_with, SamplingConfig};
pub use spec::{DraftCtx, Drafter, Proposal, Verification, Verifier, VerifyCtx};

/// A token id of the model's vocabulary.
pub type TokenId = u32;
