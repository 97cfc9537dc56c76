#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod cancel;
mod error;
mod estimator;
pub mod greedy;
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
pub use sampling::{argmax, sample_with, SamplingConfig, SeqSampling};
pub use spec::{zero_held, DraftCtx, Drafter, Proposal, Verification, Verifier, VerifyCtx};

/// A token id of the model's vocabulary.
pub type TokenId = u32;
