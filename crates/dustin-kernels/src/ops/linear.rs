//! [`LinearOps`]: the linear ops of [`KernelOps`](crate::KernelOps).

use super::ElementwiseOps;
use crate::plain;
use crate::skinny_linear3_each;
use crate::skinny_swiglu_each;
use crate::KernelConfig;
use crate::KernelError;
use crate::LinearParts;
use crate::Result;
use crate::SKINNY_MAX_ROWS;
#[cfg(doc)]
#[allow(unused_imports)]
use crate::*;
use burn_tensor::Tensor;

/// Linear layers: the skinny GEMMs of decoding and verification, the prefill GEMMs and
/// the quantized products.
///
/// Part of [`KernelOps`](crate::KernelOps); every method defaults to the plain path. Built on
/// [`ElementwiseOps`]: the grouped SwiGLU's plain path ends in its SiLU product.
pub trait LinearOps: ElementwiseOps {
    /// Whether the model runs linear layers of at most [`KernelOps::skinny_max_rows`](crate::LinearOps::skinny_max_rows) rows
    /// (decoding and verification) through [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear) unless told otherwise
    /// (`dustin_qwen::Qwen2::with_skinny_gemm`). [`KernelOps::FUSED`](crate::KernelBackend::FUSED) by default; `true` for
    /// [`burn_flex::Flex`], whose f32 skinny GEMM reads each weight once for all rows
    /// ([`cpu_skinny`]) where Burn's matmul packs the weight from 2 rows on.
    const SKINNY_GEMM: bool = Self::FUSED;

    /// The linear layer of decoding and verification: `x` `[m, k]` times `w` `[k, n]` (the
    /// `[in, out]` weight) plus `bias` `[n]`, `[m, n]` in the dtype. On CUDA, for `m` up to
    /// [`SKINNY_MAX_ROWS`] and a contiguous `w` with `n` a multiple of 4, one split-K kernel
    /// that reads `w` once for all rows (memory-bound: the weight read is the cost) and one
    /// that sums the splits, adds the bias and rounds once (as PyTorch's `addmm` epilogue);
    /// from 2 rows up to 48 rows (128 when forced) with `k` a multiple of 16 and `n` of 8, the
    /// tensor-core
    /// kernel ([`KernelConfig::skinny_kernel`]) instead; other shapes take Burn's matmul.
    ///
    /// # Errors
    /// [`KernelError::Shape`] naming `w` or `bias` when they do not fit `x`.
    fn skinny_linear(
        x: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        plain::skinny_linear(x, w, bias)
    }

    /// Three [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear) products of one `x` `[m, k]` (the q, k and v
    /// projections of a decode or verify step): `x . w_i + b_i` `[m, n_i]` for the three
    /// `(w_i [k, n_i], b_i [n_i])` of `ws`. On CUDA one GEMM launch per weight writes into one
    /// partial-sum buffer and one launch sums, adds the biases and rounds all three (4
    /// launches where three `skinny_linear` calls take 6); the same values as three
    /// `skinny_linear` calls. The default is [`skinny_linear3_each`].
    ///
    /// # Errors
    /// As [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear), naming the weight or bias that does not fit `x`.
    fn skinny_linear3(
        x: Tensor<Self, 2>,
        ws: [LinearParts<Self>; 3],
    ) -> Result<[Tensor<Self, 2>; 3]> {
        skinny_linear3_each(x, ws)
    }

    /// The first half of a SwiGLU MLP (HF `Qwen2MLP`: `act_fn(gate_proj(x)) * up_proj(x)`, no
    /// bias) for a decode or verify step: `silu(x . w_gate) * (x . w_up)` `[m, inter]` from
    /// `x` `[m, k]` and `w_gate`, `w_up` `[k, inter]`, rounded as [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear)
    /// then [`KernelOps::silu_mul`](crate::ElementwiseOps::silu_mul) round (each product once to the dtype, silu in f32 rounded
    /// once, the product in the dtype). On CUDA two GEMM launches and one launch for the sum
    /// and the activation (3 where the separate calls take 5). The default is
    /// [`skinny_swiglu_each`].
    ///
    /// # Errors
    /// [`KernelError::Shape`] naming `w_gate` or `w_up` when they do not fit `x` or each
    /// other.
    fn skinny_swiglu(
        x: Tensor<Self, 2>,
        w_gate: Tensor<Self, 2>,
        w_up: Tensor<Self, 2>,
    ) -> Result<Tensor<Self, 2>> {
        skinny_swiglu_each(x, w_gate, w_up)
    }

    /// The linear layer of prefill: `x` `[m, k]` times `w` `[k, n]` (the `[in, out]` weight,
    /// row-major or a transposed view of a row-major `[n, k]`) plus `bias` `[n]`, `[m, n]` in
    /// the dtype. For the tall, compute-bound products of prefill chunks; the model calls it
    /// from [`PREFILL_GEMM_MIN_ROWS`] rows up ([`KernelOps::prefill_gemm_name`](crate::LinearOps::prefill_gemm_name) says which
    /// library runs it).
    ///
    /// On CUDA, bf16 and f16 go to cuBLAS's `cublasGemmEx` (f32 accumulation; with a bias the
    /// output starts as the broadcast bias and the GEMM adds into it with `beta = 1`, so the
    /// sum is rounded once, as PyTorch's `addmm`) where `libcublas` loads; cubecl-cuda 0.10
    /// does not expose its stream, so the call waits for the device to finish queued work
    /// first and for cuBLAS after (docs/decisions.md, "cuBLAS for prefill GEMMs"). Elsewhere,
    /// and for other dtypes, Burn's matmul then the bias add ([`plain::linear`]).
    ///
    /// # Errors
    /// [`KernelError::Shape`] naming `w` or `bias` when they do not fit `x`;
    /// [`KernelError::Driver`] when cuBLAS refuses the call.
    fn prefill_linear(
        x: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        plain::linear(x, w, bias)
    }

    /// [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear) of one `x` `[m, k]` with each of `parts` (weight `[k,
    /// n_i]`, optional bias `[n_i]`), in order: `[m, n_i]` each. For the products of one
    /// input (the q, k and v projections; gate and up), which a backend may issue together:
    /// on CUDA through cuBLAS the call's two device waits (before, for cubecl's queue, and
    /// after, for cuBLAS) are paid once for all of them instead of once each, which is most
    /// of a small product's time (a 7B k or v projection of 16384 rows is about 100 us of
    /// GEMM behind 60-70 us of waits; `docs/perf/cublas-prefill-gemm-2026-11-30/`); there, a part cuBLAS
    /// does not take (another dtype, a size past its 32-bit integers) sends every part to
    /// Burn's matmul. Each product by [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear) by default.
    ///
    /// # Errors
    /// As [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear), for the first part that fails.
    fn prefill_linear_many(
        x: Tensor<Self, 2>,
        parts: Vec<LinearParts<Self>>,
    ) -> Result<Vec<Tensor<Self, 2>>> {
        parts
            .into_iter()
            .map(|(w, bias)| Self::prefill_linear(x.clone(), w, bias))
            .collect()
    }

    /// Most rows (`batch x new tokens`) [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear) and the grouped skinny
    /// GEMMs run as a skinny GEMM under `config`; the model sends larger products to Burn's matmul (or from
    /// [`PREFILL_GEMM_MIN_ROWS`] rows to [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear)). [`SKINNY_MAX_ROWS`]
    /// by default; on CUDA 48 (`cuda::AUTO_MMA_MAX_ROWS`), 128 with the tensor-core kernel
    /// forced, 16 with the CUDA-core kernel only ([`KernelConfig::skinny_kernel`]); on the CPU
    /// [`cpu_skinny::CPU_SKINNY_MAX_ROWS`] (64: at 1.5B shapes its skinny GEMM took about half
    /// the time of Burn's matmul at every `m` from 2 to 64, `benches/skinny_gemm.rs`).
    fn skinny_max_rows(_config: &KernelConfig) -> usize {
        SKINNY_MAX_ROWS
    }

    /// Whether [`KernelOps::quant_linear`](crate::LinearOps::quant_linear) multiplies weights kept in their GGUF block
    /// formats ([`cpu_quant::QuantMatrix`]) with block kernels on this backend: `true` for
    /// [`burn_flex::Flex`] ([`cpu_quant`]: about a sixth of the bytes of f32 weights per
    /// decode step at Q4_K), `false` by default. Where `false`, a model keeps dense weights
    /// (`dustin_qwen::WeightFormat::Dense`) or dequantizes a block weight for each product.
    const QUANT_KERNELS: bool = false;

    /// `x` `[m, k]` times the block weight `w` (`[n, k]`: `n` rows of `k` values in GGUF's
    /// layout, [`cpu_quant::QuantMatrix`]) transposed, plus `bias` `[n]`: `[m, n]`. Only
    /// backends with [`KernelOps::QUANT_KERNELS`](crate::LinearOps::QUANT_KERNELS) implement it.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] on a backend without block kernels (the default);
    /// [`KernelError::Shape`] naming `x` or `bias` when they do not fit `w`.
    fn quant_linear(
        x: Tensor<Self, 2>,
        w: &crate::cpu_quant::QuantMatrix,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        let _ = (x, bias);
        Err(KernelError::Unsupported(format!(
            "{} block weights: this backend has no block kernels (load dense weights)",
            w.quant_type().name()
        )))
    }

    /// Whether [`KernelOps::quant_prefill_linear`](crate::LinearOps::quant_prefill_linear) runs on this machine: `false` by default;
    /// on [`burn_flex::Flex`], whether the CPU has AMX ([`crate::cpu_amx::available`]).
    fn quant_prefill_available() -> bool {
        false
    }

    /// `x` `[m, k]` times the block weight `w` (`[n, k]`, GGUF layout) transposed, plus
    /// `bias` `[n]`: `[m, n]`, for prefill-sized `m`, at close to f32 accuracy (unlike
    /// [`KernelOps::quant_linear`](crate::LinearOps::quant_linear), which rounds the activations to int8). On
    /// [`burn_flex::Flex`]: [`crate::cpu_amx::amx_matmul`].
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] where [`KernelOps::quant_prefill_available`](crate::LinearOps::quant_prefill_available) is false;
    /// [`KernelError::Shape`] naming `x` or `bias` when they do not fit `w`.
    fn quant_prefill_linear(
        x: Tensor<Self, 2>,
        w: &crate::cpu_quant::QuantMatrix,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        let _ = (x, bias);
        Err(KernelError::Unsupported(format!(
            "{} block weights: this backend has no prefill product for them",
            w.quant_type().name()
        )))
    }

    /// Which library runs [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear) on `device`: `"cublas"`, or
    /// `"burn"` (Burn's matmul; the default, and CUDA when `libcublas` does not load). For
    /// benchmark reports.
    fn prefill_gemm_name(_device: &Self::Device) -> &'static str {
        "burn"
    }
}
