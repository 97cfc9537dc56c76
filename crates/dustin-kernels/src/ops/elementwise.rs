//! [`ElementwiseOps`]: the elementwise ops of [`KernelOps`](crate::KernelOps).

use super::KernelBackend;
use crate::plain;
use crate::Result;
#[cfg(doc)]
#[allow(unused_imports)]
use crate::*;
use crate::{check_rms_norm, check_same};
use burn_tensor::Int;
use burn_tensor::Tensor;

/// Element-wise and normalisation ops of the model: RMSNorm (with the residual add), the
/// SwiGLU product, RoPE and the dequantization of packed weights.
///
/// Part of [`KernelOps`](crate::KernelOps); every method defaults to the plain path.
pub trait ElementwiseOps: KernelBackend {
    /// Whether the model runs RoPE, RMSNorm and the SwiGLU product through this backend's
    /// ops unless told otherwise (`dustin_qwen::Qwen2::with_fused_elementwise`).
    /// [`KernelOps::FUSED`](crate::KernelBackend::FUSED) by default; `true` for [`burn_flex::Flex`], whose RoPE is one
    /// host loop with the plain path's rounding (the others are the plain ops there).
    const ELEMENTWISE_KERNELS: bool = Self::FUSED;

    /// The residual add and the RMSNorm after it in one op: returns `(s, rms_norm(s))` with
    /// `s = a + x` (`a`, `x` `[batch, n, hidden]`, `s` in their dtype, rounded once as Burn's
    /// add rounds it) and the RMSNorm of [`KernelOps::rms_norm`](crate::ElementwiseOps::rms_norm) over `s`. A decoder layer
    /// runs this pair twice (after attention and after the MLP, the second time with the next
    /// layer's input norm); on CUDA it is one kernel where the separate ops take two
    /// launches.
    ///
    /// # Errors
    /// [`KernelError::Shape`] when `x` is not `a`'s shape or `weight` is not `[hidden]`;
    /// [`KernelError::InvalidInput`] for a negative or non-finite `eps`.
    fn add_rms_norm(
        a: Tensor<Self, 3>,
        x: Tensor<Self, 3>,
        weight: Tensor<Self, 1>,
        eps: f64,
    ) -> Result<(Tensor<Self, 3>, Tensor<Self, 3>)> {
        check_same("x", a.dims(), x.dims())?;
        check_rms_norm(a.dims(), weight.dims(), eps)?;
        let s = a + x;
        let normed = Self::rms_norm(s.clone(), weight, eps)?;
        Ok((s, normed))
    }

    /// RMSNorm (Zhang & Sennrich 2019) over the last dimension of `x` `[batch, n, hidden]`,
    /// `weight` `[hidden]`: `x / sqrt(mean(x^2) + eps) * weight`, in `x`'s dtype. Fused
    /// kernels follow HF `Qwen2RMSNorm`: the mean and the scaling in f32, the normalised value
    /// rounded to the dtype before the multiply by `weight`.
    ///
    /// # Errors
    /// [`KernelError::Shape`] when `weight` is not `[hidden]`; [`KernelError::InvalidInput`]
    /// for a negative or non-finite `eps`.
    fn rms_norm(x: Tensor<Self, 3>, weight: Tensor<Self, 1>, eps: f64) -> Result<Tensor<Self, 3>> {
        plain::rms_norm(x, weight, eps)
    }

    /// The SwiGLU product of the MLP, `silu(gate) * up`, both `[batch, n, intermediate]`
    /// (`silu(x) = x / (1 + exp(-x))`, Ramachandran et al. 2017; Qwen2's `hidden_act`).
    /// Fused kernels compute `silu` in f32 and round it once to the dtype (as PyTorch's
    /// `F.silu` on bf16 does), then multiply by `up` in the dtype.
    ///
    /// # Errors
    /// [`KernelError::Shape`] when the shapes differ.
    fn silu_mul(gate: Tensor<Self, 3>, up: Tensor<Self, 3>) -> Result<Tensor<Self, 3>> {
        plain::silu_mul(gate, up)
    }

    /// Rotate-half RoPE (Su et al. 2021; HF `apply_rotary_pos_emb`) of `x` `[batch, heads, n,
    /// head_dim]` (any strides) with tables `cos` `[batch, 1, n, head_dim]` holding `[cos,
    /// cos]` and `sin` holding `[-sin, sin]` at each token's position:
    /// `x * cos + [x2, x1] * sin`. Returns a contiguous `[batch, heads, n, head_dim]`.
    ///
    /// # Errors
    /// [`KernelError::Shape`] for tables of another shape; [`KernelError::InvalidInput`] for
    /// an odd `head_dim`.
    fn rope(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 4>,
        sin: Tensor<Self, 4>,
    ) -> Result<Tensor<Self, 4>> {
        plain::rope(x, cos, sin)
    }

    /// Dequantizes a packed group-quantized matrix (a SubSpec substitute's layout,
    /// `dustin_qwen::substitute::PackedWeight`): `words` `[groups, words_per_group, cols]`
    /// hold `32 / bits` codes each, row `r` of group `g` at word `r / (32 / bits)`, bits
    /// `(r % (32 / bits)) * bits ..`; `scale` and `min` `[groups, 1, cols]`. Returns `w[r, c] =
    /// code * scale[g, c] + min[g, c]` `[rows, cols]` in the float dtype (the multiply and the
    /// add each rounded to it), `g = r / group`.
    ///
    /// # Errors
    /// [`KernelError::InvalidInput`] for `bits` outside 1..=8 or a `group` / `rows` the words
    /// do not cover; [`KernelError::Shape`] for `scale` / `min` of another shape.
    fn dequantize_packed(
        words: Tensor<Self, 3, Int>,
        scale: Tensor<Self, 3>,
        min: Tensor<Self, 3>,
        bits: u32,
        group: usize,
        rows: usize,
    ) -> Result<Tensor<Self, 2>> {
        plain::dequantize_packed(words, scale, min, bits, group, rows)
    }
}
