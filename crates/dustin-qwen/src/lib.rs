#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! Every model type is generic over `B: Backend`.
//!
//! - [`config`]: hyperparameters from HF `config.json`, validated;
//! - [`weights`], [`safetensors_loader`], [`gguf`]: weight loaders (HF directory with
//!   safetensors shards, GGUF v3 with dequantisation);
//! - [`tokenizer`]: `tokenizer.json` or the tokenizer embedded in GGUF metadata;
//! - [`chat`]: the model's chat template (GGUF metadata or `tokenizer_config.json`), rendered
//!   as transformers' `apply_chat_template` renders it, and its end-of-turn tokens;
//! - [`model`]: the forward pass with a preallocated ragged KV cache, chunked prefill and an
//!   [`dustin_core::AttentionHook`] per layer for sparse attention and signal taps;
//! - [`generate`]: autoregressive generation with greedy and temperature / top-p / top-k
//!   sampling;
//! - [`substitute`]: group-quantized substitute layers for SubSpec drafting (a draft that is
//!   the target with some layers replaced by low-bit copies);
//! - [`offload`]: target layers kept in host memory and the plan of what fits a GPU budget;
//! - [`check`]: the whole-model check of the backend's kernels (`dustin-bench kernel-check`);
//! - [`tp`]: tensor parallelism (heads, KV cache and MLP split over a device group, one
//!   all-reduce per attention and MLP block).
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod blocks;
pub mod chat;
pub mod check;
pub mod config;
mod error;
pub mod generate;
pub mod gguf;
pub mod load;
pub mod model;
pub mod offload;
pub mod profile;
pub mod safetensors_loader;
pub mod substitute;
pub mod tokenizer;
pub mod tp;
pub mod weights;

pub use blocks::{Embedding, WeightFormat};
pub use chat::ChatTemplate;
pub use config::{Family, QwenConfig};
pub use error::{QwenError, Result};
pub use load::ModelFiles;
pub use model::{ForwardOpts, ForwardOut, HeadVocab, LogitsMode, Qwen2, Weight, KV_VIEW_MULTIPLE};
pub use offload::{plan_offload, OffloadPlan};
pub use safetensors_loader::SafetensorsDir;
pub use substitute::{substitute_model, SubstituteConfig};
pub use tokenizer::{StreamDecoder, Tokenizer};
pub use tp::{TpGroup, TpRank};
pub use weights::{HostTensor, WeightSource};
