//! [`AttentionOps`]: the attention ops of [`KernelOps`](crate::KernelOps).

use super::KernelBackend;
use crate::plain;
use crate::Result;
#[cfg(doc)]
#[allow(unused_imports)]
use crate::*;
use burn_tensor::Int;
use burn_tensor::Tensor;

/// Attention of decoding, verification (dense and sparse) and prefill chunks.
///
/// Part of [`KernelOps`](crate::KernelOps); every method defaults to the plain path.
pub trait AttentionOps: KernelBackend {
    /// Whether the model runs the attention of decoding and verification
    /// ([`KernelOps::verify_attention`](crate::AttentionOps::verify_attention), [`KernelOps::sparse_verify_attention`](crate::AttentionOps::sparse_verify_attention)) and its
    /// cache writes ([`KernelOps::kv_write_pair`](crate::MemoryOps::kv_write_pair)) through this backend's ops unless told
    /// otherwise (`dustin_qwen::Qwen2::with_kernels`, `with_kv_write_kernel`).
    /// [`KernelOps::FUSED`](crate::KernelBackend::FUSED) by default; `true` for [`burn_flex::Flex`], whose host kernels
    /// ([`cpu_attn`]) read the cache in place where the plain path builds masks, score
    /// matrices and gathered copies.
    const ATTENTION_KERNELS: bool = Self::FUSED;

    /// Prefill chunk, in tokens, this backend runs fastest with when no hook needs the
    /// attention probabilities of the chunk (`dustin_qwen::generate::auto_prefill_chunk`):
    /// 512 by default (the score matrix the plain path builds is `[heads, chunk, context]`);
    /// 16384 on CUDA, whose prefill builds no score matrix (at 7B shapes, a 32k prompt's time
    /// to first token on an H200 went from 3.73 s in chunks of 512 to 2.18 s in chunks of
    /// 2048, and from 2.02 s in chunks of 2048 to 1.48 s in chunks of 16384; at batch 8, whose sequences prefill one after
    /// another, from 15.97 s to 12.48 s in chunks of 8192; docs/perf.md, "GPU: prefill and
    /// time to first token"). At most [`MAX_PREFILL_NEW`].
    const PREFILL_CHUNK: usize = 512;

    /// Head widths [`KernelOps::prefill_attention`](crate::AttentionOps::prefill_attention) runs as this backend's kernel; others
    /// return [`KernelError::Unsupported`] and the model takes its plain path, which builds
    /// the chunk's score matrix (so the model's automatic chunk is then
    /// `dustin_qwen::generate::DEFAULT_PREFILL_CHUNK`, not [`KernelOps::PREFILL_CHUNK`](crate::AttentionOps::PREFILL_CHUNK)).
    /// None by default (the plain path everywhere); 64 and 128 on CUDA.
    const PREFILL_HEAD_DIMS: &'static [usize] = &[];

    /// Dense GQA attention of the new tokens over their whole context.
    ///
    /// `q` `[batch, q_heads, n_new, head_dim]`, `k`, `v` `[batch, kv_heads, capacity,
    /// head_dim]`, `ctx_lens` `[batch]`, `scale` (usually `1 / sqrt(head_dim)`).
    /// Returns `[batch, q_heads, n_new, head_dim]` in `q`'s dtype:
    /// `softmax(scale q k^T + mask) v` with the causal rule of the crate docs.
    ///
    /// # Errors
    /// [`KernelError::Shape`] / [`KernelError::InvalidInput`] for inconsistent shapes,
    /// `n_new` of 0 or over [`MAX_NEW`], a context that does not fit the capacity;
    /// [`KernelError::Unsupported`] for what a backend's kernels cannot take (see its docs).
    fn verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        plain::verify_attention(q, k, v, ctx_lens, scale)
    }

    /// Dense GQA attention of a prefill chunk: [`KernelOps::verify_attention`](crate::AttentionOps::verify_attention) for up to
    /// [`MAX_PREFILL_NEW`] new tokens per sequence, with the same shapes, causal rule and
    /// result. On CUDA: a FlashAttention-2 style kernel (no score matrix in memory; a block
    /// of 64 query rows of one head stops at the last key they can see) where the chunk fills
    /// the GPU, else the flash-decoding split kernel ([`KernelConfig::prefill_kernel`]); the plain path
    /// builds the masked score matrix `[batch, kv_heads, group * n_new, ctx + n_new]`.
    ///
    /// # Errors
    /// As [`KernelOps::verify_attention`](crate::AttentionOps::verify_attention), with `n_new` up to [`MAX_PREFILL_NEW`].
    fn prefill_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        plain::prefill_attention(q, k, v, ctx_lens, scale)
    }

    /// Sparse GQA attention: each query head of KV head `h` of sequence `b` attends to the
    /// context positions `indices[b, h, 0 .. counts[b]]` plus the new tokens (causal among
    /// them), reading them straight from the cache.
    ///
    /// `indices` `[batch, kv_heads, budget]`: entries past `counts[b]` are ignored (padding),
    /// listed positions must be distinct (a repeat counts twice); a position outside
    /// `0 .. ctx_lens[b]` is skipped. Shapes and result as [`KernelOps::verify_attention`](crate::AttentionOps::verify_attention).
    ///
    /// # Errors
    /// As [`KernelOps::verify_attention`](crate::AttentionOps::verify_attention), and [`KernelError::InvalidInput`] for
    /// `counts[b] > budget` or a wrong number of counts.
    #[allow(clippy::too_many_arguments)]
    fn sparse_verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        indices: Tensor<Self, 3, Int>,
        counts: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        plain::sparse_verify_attention(q, k, v, ctx_lens, indices, counts, scale)
    }
}
