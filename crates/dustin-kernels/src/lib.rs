#![doc = include_str!("../README.md")]
//!
//! ## The ops
//!
//! Fused kernels for speculative verification with sparse attention, behind one backend
//! extension trait, [`KernelOps`]:
//!
//! - [`KernelOps::verify_attention`](crate::AttentionOps::verify_attention): dense grouped-query attention (GQA) of `n_new <= 16` new
//!   tokens per sequence over a ragged KV cache, causal among the new tokens.
//! - [`KernelOps::sparse_verify_attention`](crate::AttentionOps::sparse_verify_attention): the same over an index list per (sequence, KV
//!   head), read straight from the cache, plus the new tokens.
//! - [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores): exact softmax probabilities of a subset of query heads
//!   over the full context, summed per (sequence, KV head, position) (the `dustin` and
//!   `oracle` estimators of `dustin-select`).
//! - [`KernelOps::quest_page_bounds`](crate::SelectionOps::quest_page_bounds) and [`KernelOps::quest_page_scores`](crate::SelectionOps::quest_page_scores): Quest's per-page
//!   key min/max and the upper bound `sum_d max(q_d min_d, q_d max_d)` (Tang et al. 2024).
//! - [`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions): top-k of positions per (sequence, KV head) with forced
//!   sinks and recent window, ties to the lower index, ascending output.
//!
//! Implementations: [`burn_flex::Flex`] (plain Burn ops and host code, f32; the CPU path CI
//! tests against [`reference`](mod@reference)) and, behind the `cuda` feature,
//! `burn_cubecl::CubeBackend<CudaRuntime, F, I, BT>` (CubeCL kernels, bf16/f16 in, f32
//! accumulation; see [`cuda`](crate#cuda-kernels)).
//!
//! ## Conventions (every op)
//! - Queries `q`: `[batch, q_heads, n_new, head_dim]`, query head `h` reads KV head
//!   `h / (q_heads / kv_heads)` (heads of a group are contiguous, as in `dustin-qwen`).
//! - Cache `k`, `v`: `[batch, kv_heads, capacity, head_dim]` (`dustin-kv`'s `DenseKvCache`
//!   layout) with the new tokens already appended.
//! - `ctx_lens[b]`: the context of sequence `b` *before* the new tokens; the new token `i` sits
//!   at position `ctx_lens[b] + i` and sees keys `j <= ctx_lens[b] + i` (the model's mask rule).
//!   Slots at and past `ctx_lens[b] + n_new` are never read (they may hold anything, NaN too).
//!
//! ## CUDA kernels
//! Flash-decoding (Dao et al. 2023, "Flash-Decoding for long-context inference"): the keys of
//! one (sequence, KV head) are split across thread blocks; each block holds the queries of all
//! the heads of the group (`group * n_new` rows, up to 64 rows per block) and reads each key and
//! value once for all of them; a combine kernel merges the per-block `(max, sum, acc)`.
//! Verification and the prefill chunks that fill the GPU ([`KernelConfig::prefill_kernel`]) run
//! on a FlashAttention-2 style kernel (Dao 2023, "FlashAttention-2"): each warp keeps 16 query rows, their scores (`mma.m16n8k16`, bf16 in,
//! f32 accumulate), online softmax and output in registers, and the next K/V tile is copied
//! by `cp.async` while this one is used. Head-subset scoring runs on the earlier split kernel
//! (WMMA 16x16x16, scores through shared memory). See `docs/decisions.md`.
#![warn(missing_docs)]

mod attn_flex;
pub mod check;
pub mod config;
pub mod cpu_amx;
pub mod cpu_attn;
pub mod cpu_prefill;
pub mod cpu_quant;
pub mod cpu_scores;
pub mod cpu_skinny;
pub mod error;
mod ops;
pub mod pinned;
pub mod plain;
mod quant_flex;
pub mod reference;
pub mod ring;
mod selection_flex;
mod shapes;
mod split_plan;

#[cfg(feature = "cuda")]
pub mod cuda;

use burn_tensor::{backend::Backend, Int, Tensor};

pub use config::{
    AttentionKernel, EstimatorKernels, KernelConfig, SkinnyKernel, SplitReduce, Switch, TopkKernel,
};
pub use cpu_quant::{quant_matmul, QuantMatrix, QuantType};
pub use error::{KernelError, Result};
pub use pinned::PinnedHost;
pub use ring::{RingConfig, RING_CONFIG};
pub use shapes::*;

/// Most new tokens per sequence the verify kernels take (`gamma + 1 <= 16`).
pub const MAX_NEW: usize = 16;

/// Most new tokens per sequence of one [`KernelOps::prefill_attention`](crate::AttentionOps::prefill_attention) call (a prefill
/// chunk; the model prefills in chunks of 512 on the CPU and 16384 on CUDA, the last one up
/// to half a chunk longer): 32768, a whole Qwen2.5 context (its `max_position_embeddings`,
/// model card). The CUDA flash kernels keep nothing per new token beyond the output; the
/// flash-decoding split kernel (forced by [`KernelConfig::prefill_kernel`], or where a chunk is too
/// small to fill the GPU) keeps partial results `f32 [batch, kv_heads, splits, group *
/// n_new, head_dim]`, one split once the row blocks fill the GPU: per sequence about 59 MB
/// at 4096 new tokens and 470 MB at 32768 at Qwen2.5-7B shapes (4 KV heads, group 7), 134
/// MB and 1.07 GB at 72B (8 KV heads, group 8). The plain path (`plain::prefill_attention`,
/// the CPU) builds the chunk's score matrix, `[batch, q_heads, n_new, ctx + n_new]`: a
/// caller that chunks a long prompt there keeps the chunk small (the model's automatic chunk
/// on the plain path is 512).
pub const MAX_PREFILL_NEW: usize = 32768;

/// What the top-k step keeps per sequence and KV head: positions `[0, n_sink)` and
/// `[ctx - window, ctx)` always, then the best scores up to `budget` tokens in all
/// (`dustin_select` names it `KeepRule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    /// Positions kept per (sequence, KV head): `min(budget, ctx_b)`. At least 1.
    pub budget: usize,
    /// Leading positions always kept (attention sinks, StreamingLLM, Xiao et al. 2023).
    pub n_sink: usize,
    /// Most recent context positions always kept.
    pub window: usize,
}

impl Keep {
    /// Positions kept whatever the scores, `n_sink + window`, saturating: a config's
    /// `n_sink` or `window` near `usize::MAX` must fail the budget checks, not wrap past them.
    pub fn always_kept(&self) -> usize {
        self.n_sink.saturating_add(self.window)
    }

    /// `n_sink + window` exactly, for messages: [`Keep::always_kept`] saturates, so a sum
    /// past `usize::MAX` would print as `usize::MAX`.
    pub fn always_kept_exact(&self) -> u128 {
        self.n_sink as u128 + self.window as u128
    }

    /// The half-open range `[lo, hi)` of positions the scores choose from in a context of
    /// `ctx` tokens (the rest is forced or absent); empty when sinks and window cover it.
    pub fn free_range(&self, ctx: usize) -> (usize, usize) {
        let lo = self.n_sink.min(ctx);
        let hi = ctx.saturating_sub(self.window).max(lo);
        (lo, hi)
    }
}

/// A selection of context positions per (sequence, KV head), as the top-k step returns it.
#[derive(Debug, Clone)]
pub struct Positions<B: Backend> {
    /// `[batch, kv_heads, k]` positions; entries `0 .. counts[b]` are ascending and distinct,
    /// entries `counts[b] .. k` are padding (0).
    pub indices: Tensor<B, 3, Int>,
    /// Valid entries per sequence (the same for every KV head of a sequence).
    pub counts: Vec<usize>,
}

/// Every kernel trait, for code that calls the ops on a concrete backend type
/// (`Flex::skinny_linear(..)`): `use dustin_kernels::prelude::*;`. Generic code bounded on
/// [`KernelOps`] needs none of them in scope.
pub mod prelude {
    pub use crate::ops::{
        AttentionOps, CollectiveOps, ElementwiseOps, KernelBackend, KernelOps, LinearOps,
        MemoryOps, SelectionOps,
    };
}

pub use ops::{
    check_rope_kv_write, AttentionOps, CollectiveOps, ElementwiseOps, KernelBackend, KernelOps,
    LinearOps, MemoryOps, RopedKv, SelectionOps,
};

/// Most rows of `x` [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear)'s CUDA kernel takes (batch x (gamma + 1)
/// at batch 3 and gamma 4 is 15); the model sends more rows to Burn's matmul, unless
/// [`KernelOps::skinny_max_rows`](crate::LinearOps::skinny_max_rows) allows more (the opt-in tensor-core kernel on CUDA) or
/// there are at least [`PREFILL_GEMM_MIN_ROWS`] ([`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear)).
pub const SKINNY_MAX_ROWS: usize = 16;

/// Fewest rows (`batch x new tokens`) the model sends through [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear):
/// fewer rows (decode, verification, short prompts) take the skinny GEMM or Burn's matmul. On
/// CUDA each `prefill_linear` call waits for the device twice (cubecl's queue, then cuBLAS),
/// about 60-70 us per call on the H200 (docs/perf.md, 2026-11-30), which decode-sized GEMMs
/// (20-150 us) cannot afford. 256 rows is a choice, not a measured break-even: there a
/// Qwen2.5-7B gate projection is 35 GFLOP, about 50 us of cuBLAS work.
pub const PREFILL_GEMM_MIN_ROWS: usize = 256;

/// Fewest rows the model sends through [`KernelOps::prefill_linear_many`](crate::LinearOps::prefill_linear_many) (the q, k and v
/// products, gate and up, together); fewer take one [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear) each. On
/// the H200 (docs/perf.md, "GPU: prefill and time to first token", 7B q+k+v) together took
/// 0.85-0.92x the time of three calls at 16384 rows and 0.89x at 32768, but 1.14-1.52x at
/// 4096 (not understood); 8192, between the two, was not timed.
pub const PREFILL_MANY_MIN_ROWS: usize = 8192;

/// One linear layer's weight `[k, n]` (the `[in, out]` layout) and optional bias `[n]`, as
/// [`KernelOps::skinny_linear3`](crate::LinearOps::skinny_linear3) takes them.
pub type LinearParts<B> = (Tensor<B, 2>, Option<Tensor<B, 1>>);

/// [`KernelOps::skinny_linear3`](crate::LinearOps::skinny_linear3) as three [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear) calls (the default,
/// and the CUDA path's fallback for shapes its kernels do not take).
///
/// # Errors
/// As [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear).
pub fn skinny_linear3_each<B: LinearOps>(
    x: Tensor<B, 2>,
    ws: [LinearParts<B>; 3],
) -> Result<[Tensor<B, 2>; 3]> {
    let [(w0, b0), (w1, b1), (w2, b2)] = ws;
    Ok([
        B::skinny_linear(x.clone(), w0, b0)?,
        B::skinny_linear(x.clone(), w1, b1)?,
        B::skinny_linear(x, w2, b2)?,
    ])
}

/// [`KernelOps::skinny_swiglu`](crate::LinearOps::skinny_swiglu) as two [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear) calls and
/// [`KernelOps::silu_mul`](crate::ElementwiseOps::silu_mul) (the default, and the CUDA path's fallback).
///
/// # Errors
/// As [`check_swiglu`], then [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear)'s.
pub fn skinny_swiglu_each<B: LinearOps>(
    x: Tensor<B, 2>,
    w_gate: Tensor<B, 2>,
    w_up: Tensor<B, 2>,
) -> Result<Tensor<B, 2>> {
    check_swiglu(x.dims(), w_gate.dims(), w_up.dims())?;
    let m = x.dims()[0];
    let n = w_gate.dims()[1];
    let g = B::skinny_linear(x.clone(), w_gate, None)?;
    let u = B::skinny_linear(x, w_up, None)?;
    Ok(B::silu_mul(g.reshape([1, m, n]), u.reshape([1, m, n]))?.reshape([m, n]))
}

/// The CPU backend: host kernels for the attention of decoding and verification, RoPE and
/// cache writes ([`cpu_attn`]), the f32 skinny GEMM of [`cpu_skinny`] and the block kernels of
/// [`cpu_quant`] for decode and verify rows, and the plain path ([`plain`]) for the rest.
impl KernelBackend for burn_flex::Flex {
    /// `cpu: <model name>, <n> threads` (the threads of the rayon pool burn-flex and the host
    /// kernels run on).
    fn device_description(_device: &Self::Device) -> String {
        format!(
            "cpu: {}, {} threads",
            ops::cpu_model_name().unwrap_or_else(|| "unknown processor".into()),
            rayon::current_num_threads()
        )
    }
}

impl AttentionOps for burn_flex::Flex {
    const ATTENTION_KERNELS: bool = true;

    /// Every width: [`cpu_prefill`]'s tiles take multiples of 32 (64 on AVX-512), and the
    /// host kernel of [`cpu_attn`] any other (AVX-512 where it is a multiple of 16).
    const PREFILL_HEAD_DIMS: &'static [usize] = &[32, 64, 80, 96, 128, 256];

    /// 2048: the host kernels build no score matrix, and each prefill product over block
    /// weights decodes every weight once per chunk ([`cpu_amx`]), so longer chunks decode
    /// less; yet 4096 made an 8k-token prefill of the Qwen2.5-Coder pair slower (123.8
    /// against 118.1 s on a 2-core Xeon, 2026-12-07: the MLP and the attention both 5-8%
    /// slower).
    const PREFILL_CHUNK: usize = 2048;

    fn prefill_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attn_flex::attention(q, k, v, ctx_lens, None, scale, MAX_PREFILL_NEW)
    }

    fn verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attn_flex::attention(q, k, v, ctx_lens, None, scale, MAX_NEW)
    }

    fn sparse_verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        indices: Tensor<Self, 3, Int>,
        counts: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attn_flex::attention(q, k, v, ctx_lens, Some((indices, counts)), scale, MAX_NEW)
    }
}

impl ElementwiseOps for burn_flex::Flex {
    const ELEMENTWISE_KERNELS: bool = true;

    fn rope(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 4>,
        sin: Tensor<Self, 4>,
    ) -> Result<Tensor<Self, 4>> {
        attn_flex::rope(x, cos, sin)
    }

    fn silu_mul(gate: Tensor<Self, 3>, up: Tensor<Self, 3>) -> Result<Tensor<Self, 3>> {
        attn_flex::silu_mul(gate, up)
    }
}

impl LinearOps for burn_flex::Flex {
    const SKINNY_GEMM: bool = true;

    fn skinny_linear(
        x: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        cpu_skinny::skinny_linear(x, w, bias)
    }

    fn skinny_max_rows(_config: &KernelConfig) -> usize {
        cpu_skinny::CPU_SKINNY_MAX_ROWS
    }

    const QUANT_KERNELS: bool = true;

    fn quant_linear(
        x: Tensor<Self, 2>,
        w: &cpu_quant::QuantMatrix,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        quant_flex::quant_linear(x, w, bias)
    }

    fn quant_prefill_available() -> bool {
        cpu_amx::available()
    }

    fn quant_prefill_linear(
        x: Tensor<Self, 2>,
        w: &cpu_quant::QuantMatrix,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        quant_flex::amx_linear(x, w, bias)
    }
}

impl MemoryOps for burn_flex::Flex {
    fn kv_write(
        dst: Tensor<Self, 4>,
        src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<Tensor<Self, 4>> {
        attn_flex::kv_write(dst, src, starts)
    }
}

impl CollectiveOps for burn_flex::Flex {}
