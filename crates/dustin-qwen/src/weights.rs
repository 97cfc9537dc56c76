//! Weight sources: a name -> host tensor map in Hugging Face naming and layout.
//!
//! Every loader (safetensors directory, GGUF file, random init) implements [`WeightSource`]
//! and returns tensors with HF names (`model.layers.0.self_attn.q_proj.weight`) and HF shapes
//! (`Linear` weights `[out_features, in_features]`), converted to `f32` on the host. The model
//! builder then checks shapes against the config and moves them to the device.

use crate::error::Result;

/// A tensor on the host in `f32`, row-major, with its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Shape, outermost dimension first (HF / PyTorch order).
    pub shape: Vec<usize>,
    /// Values, row-major, `shape.iter().product()` of them.
    pub data: Vec<f32>,
}

/// A source of named model weights in HF naming and layout.
pub trait WeightSource {
    /// Human-readable description for errors (a path).
    fn describe(&self) -> String;
    /// Whether a tensor of that HF name exists.
    fn contains(&self, name: &str) -> bool;
    /// Loads one tensor converted to `f32`.
    ///
    /// # Errors
    /// [`crate::QwenError::MissingTensor`] when absent, [`crate::QwenError::UnsupportedDtype`]
    /// for a dtype or quantisation we do not read, [`crate::QwenError::Format`] for truncated
    /// data.
    fn load(&self, name: &str) -> Result<HostTensor>;
}
