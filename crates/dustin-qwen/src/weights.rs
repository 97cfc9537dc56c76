//! Weight sources: a name -> host tensor map in Hugging Face naming and layout.
//!
//! Every loader (safetensors directory, GGUF file, random init) implements [`WeightSource`]
//! and returns tensors with HF names (`model.layers.0.self_attn.q_proj.weight`) and HF shapes
//! (`Linear` weights `[out_features, in_features]`), converted to `f32` on the host. The model
//! builder then checks shapes against the config and moves them to the device.

use dustin_kernels::cpu_quant::QuantMatrix;

use crate::error::Result;

/// A tensor on the host in `f32`, row-major, with its shape.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Shape, outermost dimension first (HF / PyTorch order).
    pub shape: Vec<usize>,
    /// Values, row-major, `shape.iter().product()` of them.
    pub data: Vec<f32>,
}

/// A source of named model weights in HF naming and layout (`Sync`: a model is built from it
/// inside [`dustin_core::memory::persistent`], which may run on another thread).
pub trait WeightSource: Sync {
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

    /// Loads a 2-D tensor `[out, in]` as its stored blocks, undecoded, where the source holds
    /// it in a block format the CPU kernels read ([`dustin_kernels::cpu_quant::QuantType`]);
    /// `None` for any other storage (f32, f16, bf16, other quantisations, rows that need
    /// reordering), which [`WeightSource::load`] then serves as f32. The default: `None`.
    ///
    /// # Errors
    /// As [`WeightSource::load`]; [`crate::QwenError::Format`] when the blocks do not fit the
    /// tensor's shape.
    fn load_blocks(&self, name: &str) -> Result<Option<QuantMatrix>> {
        let _ = name;
        Ok(None)
    }
}
