#![doc = include_str!("../README.md")]
//!
//! ## The ops
//!
//! Fused kernels for speculative verification with sparse attention, behind one backend
//! extension trait, [`KernelOps`]:
//!
//! - [`KernelOps::verify_attention`]: dense grouped-query attention (GQA) of `n_new <= 16` new
//!   tokens per sequence over a ragged KV cache, causal among the new tokens.
//! - [`KernelOps::sparse_verify_attention`]: the same over an index list per (sequence, KV
//!   head), read straight from the cache, plus the new tokens.
//! - [`KernelOps::head_subset_scores`]: exact softmax probabilities of a subset of query heads
//!   over the full context, summed per (sequence, KV head, position) (the `dustin` and
//!   `oracle` estimators of `dustin-select`).
//! - [`KernelOps::quest_page_bounds`] and [`KernelOps::quest_page_scores`]: Quest's per-page
//!   key min/max and the upper bound `sum_d max(q_d min_d, q_d max_d)` (Tang et al. 2024).
//! - [`KernelOps::top_k_positions`]: top-k of positions per (sequence, KV head) with forced
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
pub mod cpu_attn;
pub mod cpu_quant;
pub mod cpu_skinny;
pub mod error;
pub mod pinned;
pub mod plain;
mod quant_flex;
pub mod reference;
pub mod ring;
mod split_plan;

#[cfg(feature = "cuda")]
pub mod cuda;

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};

pub use config::{
    AttentionKernel, EstimatorKernels, KernelConfig, SkinnyKernel, SplitReduce, Switch, TopkKernel,
};
pub use cpu_quant::{quant_matmul, QuantMatrix, QuantType};
pub use error::{KernelError, Result};
pub use pinned::PinnedHost;
pub use ring::{RingConfig, RING_CONFIG};

/// Most new tokens per sequence the verify kernels take (`gamma + 1 <= 16`).
pub const MAX_NEW: usize = 16;

/// Most new tokens per sequence of one [`KernelOps::prefill_attention`] call (a prefill
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

/// Which positions the top-k step always keeps and how many it keeps in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    /// Positions kept per (sequence, KV head): `min(budget, ctx_b)`. At least 1.
    pub budget: usize,
    /// Leading positions always kept (attention sinks, StreamingLLM, Xiao et al. 2023).
    pub n_sink: usize,
    /// Most recent context positions always kept.
    pub window: usize,
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

/// Fused attention, scoring and selection ops; implemented per backend.
///
/// Every method validates its input and returns [`KernelError`] instead of panicking. Every
/// method defaults to the plain path ([`plain`], Burn tensor ops, correct on any backend), so
/// another backend joins with `impl KernelOps for MyBackend {}` and overrides what it fuses.
pub trait KernelOps: Backend {
    /// Whether this backend runs the ops as fused device kernels. Callers with an equivalent
    /// plain path of their own (the model's attention, the selectors' top-k) use the ops only
    /// when this is true, so CPU numerics stay those of the plain path; `false` for
    /// [`burn_flex::Flex`], `true` for the CUDA backend.
    const FUSED: bool = false;

    /// Whether the model runs linear layers of at most [`KernelOps::skinny_max_rows`] rows
    /// (decoding and verification) through [`KernelOps::skinny_linear`] unless told otherwise
    /// (`dustin_qwen::Qwen2::with_skinny_gemm`). [`KernelOps::FUSED`] by default; `true` for
    /// [`burn_flex::Flex`], whose f32 skinny GEMM reads each weight once for all rows
    /// ([`cpu_skinny`]) where Burn's matmul packs the weight from 2 rows on.
    const SKINNY_GEMM: bool = Self::FUSED;

    /// Whether the model runs the attention of decoding and verification
    /// ([`KernelOps::verify_attention`], [`KernelOps::sparse_verify_attention`]) and its
    /// cache writes ([`KernelOps::kv_write_pair`]) through this backend's ops unless told
    /// otherwise (`dustin_qwen::Qwen2::with_kernels`, `with_kv_write_kernel`).
    /// [`KernelOps::FUSED`] by default; `true` for [`burn_flex::Flex`], whose host kernels
    /// ([`cpu_attn`]) read the cache in place where the plain path builds masks, score
    /// matrices and gathered copies.
    const ATTENTION_KERNELS: bool = Self::FUSED;

    /// Whether the model runs RoPE, RMSNorm and the SwiGLU product through this backend's
    /// ops unless told otherwise (`dustin_qwen::Qwen2::with_fused_elementwise`).
    /// [`KernelOps::FUSED`] by default; `true` for [`burn_flex::Flex`], whose RoPE is one
    /// host loop with the plain path's rounding (the others are the plain ops there).
    const ELEMENTWISE_KERNELS: bool = Self::FUSED;

    /// Prefill chunk, in tokens, this backend runs fastest with when no hook needs the
    /// attention probabilities of the chunk (`dustin_qwen::generate::auto_prefill_chunk`):
    /// 512 by default (the score matrix the plain path builds is `[heads, chunk, context]`);
    /// 16384 on CUDA, whose prefill builds no score matrix (at 7B shapes, a 32k prompt's time
    /// to first token on an H200 went from 3.73 s in chunks of 512 to 2.18 s in chunks of
    /// 2048, and from 2.02 s in chunks of 2048 to 1.48 s in chunks of 16384; at batch 8, whose sequences prefill one after
    /// another, from 15.97 s to 12.48 s in chunks of 8192; docs/perf.md, "GPU: prefill and
    /// time to first token"). At most [`MAX_PREFILL_NEW`].
    const PREFILL_CHUNK: usize = 512;

    /// Head widths [`KernelOps::prefill_attention`] runs as this backend's kernel; others
    /// return [`KernelError::Unsupported`] and the model takes its plain path, which builds
    /// the chunk's score matrix (so the model's automatic chunk is then
    /// `dustin_qwen::generate::DEFAULT_PREFILL_CHUNK`, not [`KernelOps::PREFILL_CHUNK`]).
    /// None by default (the plain path everywhere); 64 and 128 on CUDA.
    const PREFILL_HEAD_DIMS: &'static [usize] = &[];

    /// Installs `config` as the kernel choices of `device`: the launch paths of every op on
    /// that device read them from then on (until the next call). The model installs its
    /// [`KernelConfig`] at the start of each forward pass. Nothing by default (one kernel per
    /// op); on CUDA the config, [`KernelConfig::normalized`], per device.
    fn set_kernel_config(_device: &Self::Device, _config: &KernelConfig) {}

    /// The kernel choices installed for `device` ([`KernelOps::set_kernel_config`];
    /// [`KernelConfig::default`] where none was).
    fn kernel_config(_device: &Self::Device) -> KernelConfig {
        KernelConfig::default()
    }

    /// Which of the `dustin` estimator's history fold ([`KernelOps::fold_rows`]) and
    /// normalise-and-mix ([`KernelOps::mix_scores`]) run as this backend's kernels on
    /// `device`; the others run through the estimator's own Burn-op path. By default neither
    /// (every step on Burn ops); on CUDA [`KernelConfig::estimator_kernels`] of the device's
    /// config, both kernels by default. The same values up to rounding either way.
    fn estimator_kernels(_device: &Self::Device) -> EstimatorKernels {
        EstimatorKernels::NONE
    }

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

    /// Dense GQA attention of a prefill chunk: [`KernelOps::verify_attention`] for up to
    /// [`MAX_PREFILL_NEW`] new tokens per sequence, with the same shapes, causal rule and
    /// result. On CUDA: a FlashAttention-2 style kernel (no score matrix in memory; a block
    /// of 64 query rows of one head stops at the last key they can see) where the chunk fills
    /// the GPU, else the flash-decoding split kernel ([`KernelConfig::prefill_kernel`]); the plain path
    /// builds the masked score matrix `[batch, kv_heads, group * n_new, ctx + n_new]`.
    ///
    /// # Errors
    /// As [`KernelOps::verify_attention`], with `n_new` up to [`MAX_PREFILL_NEW`].
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
    /// `0 .. ctx_lens[b]` is skipped. Shapes and result as [`KernelOps::verify_attention`].
    ///
    /// # Errors
    /// As [`KernelOps::verify_attention`], and [`KernelError::InvalidInput`] for
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

    /// Exact attention probabilities of the query heads `heads` over the full context (the
    /// softmax of the dense verify attention, causal rule included), summed over those heads
    /// of each KV head and over the `n_new` query rows.
    ///
    /// `q` `[batch, q_heads, n_new, head_dim]`, `k` `[batch, kv_heads, capacity, head_dim]`.
    /// Returns f32 `[batch, kv_heads, capacity]`: entry `(b, h, j)` is
    /// `sum_{q in heads, q / group = h} sum_i p_{q,i}(j)`; 0 for KV heads without a chosen
    /// head and for `j >= ctx_lens[b] + n_new`.
    ///
    /// The width is `k`'s, not `max(ctx) + n_new`: the model passes a view whose length
    /// changes once every `KV_VIEW_MULTIPLE` (64, `dustin_qwen`) tokens, so the estimator's
    /// tensors keep their shape from step to step (a new shape can mean a new kernel to
    /// compile on CUDA; docs/decisions.md).
    ///
    /// # Errors
    /// As [`KernelOps::verify_attention`]; [`KernelError::InvalidInput`] for an empty,
    /// repeated or out-of-range head list.
    fn head_subset_scores(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        heads: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 3>> {
        plain::head_subset_scores(q, k, ctx_lens, heads, scale)
    }

    /// [`KernelOps::head_subset_scores`] before the sum over the query rows: f32
    /// `[batch, kv_heads, n_new, capacity]` (`k`'s length), entry `(b, h, i, j)` =
    /// `sum_{q in heads, q / group = h} p_{q,i}(j)` (0 for KV heads without a chosen head and
    /// for `j > ctx_lens[b] + i`). The `dustin` estimator weighs the rows by acceptance.
    ///
    /// # Errors
    /// As [`KernelOps::head_subset_scores`].
    fn head_subset_row_scores(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        heads: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        plain::head_subset_row_scores(q, k, ctx_lens, heads, scale)
    }

    /// The `dustin` estimator's fold of one verification's row scores into its history
    /// (docs/decisions.md, "Kernels on the GPU"): entry `(b, h, j)` of the result is
    /// `factor[b] * hist[b, h, j] + sum_i w[b * n + i] * (own[h] * rows[b, h, i, j] +
    /// all[h] * sum_h' rows[b, h', i, j])`. With `own[h]` the reciprocal of KV head `h`'s
    /// estimator-head count and `all[h]` that of the whole estimator set for a KV head
    /// without one, `own * rows + all * sum` is the estimator's per-KV-head attention; `w`
    /// and `factor` are its decay weights (the paper's historical attention, decayed per
    /// accepted token).
    ///
    /// `hist` `[batch, kv_heads, len]` (`None`: zeros), `rows` `[batch, kv_heads, n, len]`
    /// (what [`KernelOps::head_subset_row_scores`] returns), `factor` `[batch]`, `w`
    /// `[batch * n]` (row-major), `own` and `all` `[kv_heads]`. Returns `[batch, kv_heads,
    /// len]`, f32 on CUDA.
    ///
    /// # Errors
    /// [`KernelError::InvalidInput`] naming the argument whose length or shape does not match
    /// `rows`.
    fn fold_rows(
        hist: Option<Tensor<Self, 3>>,
        factor: &[f32],
        rows: Tensor<Self, 4>,
        w: &[f32],
        own: &[f32],
        all: &[f32],
    ) -> Result<Tensor<Self, 3>> {
        plain::fold_rows(hist, factor, rows, w, own, all)
    }

    /// The `dustin` estimator's normalise-and-mix (docs/decisions.md): entry `(b, h, p)`,
    /// `p < width`, is `alpha * la[b, p] / S_la(b) + (1 - alpha) * hist[b, h, p] /
    /// S_hist(b, h)` on the free range `free[b] = (lo, hi)` (`lo <= p < hi`: the positions
    /// the top-k step chooses among, between the sinks and the window), 0 elsewhere; the
    /// sums run over the free range and are clamped below at 1e-30. Without `la` the entry
    /// is `hist[b, h, p] / S_hist(b, h)` and `alpha` is unused. Columns past an input's
    /// width read 0.
    ///
    /// `hist` `[batch, kv_heads, len]`, `la` `[batch, len']` (the draft's lookahead).
    /// Returns `[batch, kv_heads, width]` in `hist`'s dtype.
    ///
    /// # Errors
    /// [`KernelError::InvalidInput`] for `free` or `la` of another batch, `lo > hi`, or
    /// `alpha` outside `[0, 1]`.
    fn mix_scores(
        hist: Tensor<Self, 3>,
        la: Option<Tensor<Self, 2>>,
        free: &[(usize, usize)],
        alpha: f32,
        width: usize,
    ) -> Result<Tensor<Self, 3>> {
        plain::mix_scores(hist, la, free, alpha, width)
    }

    /// Quest's page key bounds: the context of `b` (positions `< ctx_lens[b]`) cut into pages
    /// of `page_size`; per page and KV head the elementwise min and max of its keys.
    ///
    /// `k` `[batch, kv_heads, capacity, head_dim]`. Returns `(kmin, kmax)`, each
    /// `[batch, kv_heads, ceil(max ctx / page_size), head_dim]` in `k`'s dtype; pages that
    /// start at or past `ctx_lens[b]` are 0.
    ///
    /// # Errors
    /// [`KernelError::InvalidInput`] for `page_size` 0 or a context over the capacity.
    fn quest_page_bounds(
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        page_size: usize,
    ) -> Result<(Tensor<Self, 4>, Tensor<Self, 4>)> {
        plain::quest_page_bounds(k, ctx_lens, page_size)
    }

    /// Quest's page scores (upper bounds of `q . k` over a page, Tang et al. 2024):
    /// `max over the group's heads and the n_new rows of sum_d max(q_d min_d, q_d max_d)`.
    ///
    /// `q` `[batch, q_heads, n_new, head_dim]`, `kmin`, `kmax` `[batch, kv_heads, pages,
    /// head_dim]`. Returns f32 `[batch, kv_heads, pages]`; pages starting at or past
    /// `ctx_lens[b]` score 0.
    ///
    /// # Errors
    /// [`KernelError::Shape`] for inconsistent shapes, [`KernelError::InvalidInput`] for
    /// `page_size` 0.
    fn quest_page_scores(
        q: Tensor<Self, 4>,
        kmin: Tensor<Self, 4>,
        kmax: Tensor<Self, 4>,
        ctx_lens: &[usize],
        page_size: usize,
    ) -> Result<Tensor<Self, 3>> {
        plain::quest_page_scores(q, kmin, kmax, ctx_lens, page_size)
    }

    /// Top-k positions per (sequence, KV head) of `scores` `[batch, kv_heads, c]`
    /// (`c >= max ctx`): keeps the sinks `[0, n_sink)` and the window
    /// `[ctx_b - window, ctx_b)` always, fills up to `min(budget, ctx_b)` with the highest
    /// scores among the other positions `< ctx_b` (NaN lowest, `+-inf` like the extreme finite
    /// values, ties to the lower position), and returns them ascending.
    ///
    /// Returns [`Positions`] with `k = min(budget, max ctx)` columns.
    ///
    /// # Errors
    /// [`KernelError::Shape`] when `scores` is too short or has another batch;
    /// [`KernelError::InvalidInput`] for `budget` 0 or `budget < n_sink + window`.
    fn top_k_positions(
        scores: Tensor<Self, 3>,
        ctx_lens: &[usize],
        keep: Keep,
    ) -> Result<Positions<Self>> {
        plain::top_k_positions(scores, ctx_lens, keep)
    }

    /// Writes the new keys (or values) of every sequence into a layer's cache at that
    /// sequence's own position: `dst[b, h, starts[b] + i, :] = src[b, h, i, :]` for
    /// `i < n`. `dst` `[batch, kv_heads, capacity, head_dim]`, `src` `[batch, kv_heads, n,
    /// head_dim]`, `starts` `[batch]` (the cached lengths). Returns the updated `dst` (in place
    /// where the backend can). The plain path is one slice-assign for equal starts and one
    /// slice and one slice-assign per sequence otherwise (a ragged batch after unequal
    /// acceptance: `batch` to `2 batch` launches per tensor and layer on CUDA, where the kernel
    /// takes one).
    ///
    /// # Errors
    /// [`KernelError::Shape`] when `src` does not match `dst`'s batch, heads and width;
    /// [`KernelError::InvalidInput`] for a wrong number of starts or `starts[b] + n` past the
    /// capacity.
    fn kv_write(
        dst: Tensor<Self, 4>,
        src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<Tensor<Self, 4>> {
        plain::kv_write(dst, src, starts)
    }

    /// [`KernelOps::kv_write`] of a layer's keys and values together:
    /// `k_dst[b, h, starts[b] + i, :] = k_src[b, h, i, :]` and the same for `v`, shapes as
    /// there. Returns the updated `(k_dst, v_dst)`. The default is two `kv_write` calls; on
    /// CUDA it is one launch for both, equal starts included (where `kv_write` takes two of Burn's slice-assigns, each
    /// with its tensors' metadata uploaded: 9-10 us of host time a launch against 4.5-5.4 for
    /// a kernel with array arguments, `dustin-kernels-gpu launchcost`, docs/perf.md).
    ///
    /// # Errors
    /// As [`KernelOps::kv_write`], for either pair; [`KernelError::Shape`] when `v_dst` or
    /// `v_src` does not match its key counterpart's shape. Checked before anything is
    /// written.
    fn kv_write_pair(
        k_dst: Tensor<Self, 4>,
        v_dst: Tensor<Self, 4>,
        k_src: Tensor<Self, 4>,
        v_src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<(Tensor<Self, 4>, Tensor<Self, 4>)> {
        check_kv_write_pair(
            [k_dst.dims(), v_dst.dims()],
            [k_src.dims(), v_src.dims()],
            starts,
        )?;
        Ok((
            Self::kv_write(k_dst, k_src, starts)?,
            Self::kv_write(v_dst, v_src, starts)?,
        ))
    }

    /// The residual add and the RMSNorm after it in one op: returns `(s, rms_norm(s))` with
    /// `s = a + x` (`a`, `x` `[batch, n, hidden]`, `s` in their dtype, rounded once as Burn's
    /// add rounds it) and the RMSNorm of [`KernelOps::rms_norm`] over `s`. A decoder layer
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

    /// Three [`KernelOps::skinny_linear`] products of one `x` `[m, k]` (the q, k and v
    /// projections of a decode or verify step): `x . w_i + b_i` `[m, n_i]` for the three
    /// `(w_i [k, n_i], b_i [n_i])` of `ws`. On CUDA one GEMM launch per weight writes into one
    /// partial-sum buffer and one launch sums, adds the biases and rounds all three (4
    /// launches where three `skinny_linear` calls take 6); the same values as three
    /// `skinny_linear` calls. The default is [`skinny_linear3_each`].
    ///
    /// # Errors
    /// As [`KernelOps::skinny_linear`], naming the weight or bias that does not fit `x`.
    fn skinny_linear3(
        x: Tensor<Self, 2>,
        ws: [LinearParts<Self>; 3],
    ) -> Result<[Tensor<Self, 2>; 3]> {
        skinny_linear3_each(x, ws)
    }

    /// The first half of a SwiGLU MLP (HF `Qwen2MLP`: `act_fn(gate_proj(x)) * up_proj(x)`, no
    /// bias) for a decode or verify step: `silu(x . w_gate) * (x . w_up)` `[m, inter]` from
    /// `x` `[m, k]` and `w_gate`, `w_up` `[k, inter]`, rounded as [`KernelOps::skinny_linear`]
    /// then [`KernelOps::silu_mul`] round (each product once to the dtype, silu in f32 rounded
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
    /// from [`PREFILL_GEMM_MIN_ROWS`] rows up ([`KernelOps::prefill_gemm_name`] says which
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

    /// [`KernelOps::prefill_linear`] of one `x` `[m, k]` with each of `parts` (weight `[k,
    /// n_i]`, optional bias `[n_i]`), in order: `[m, n_i]` each. For the products of one
    /// input (the q, k and v projections; gate and up), which a backend may issue together:
    /// on CUDA through cuBLAS the call's two device waits (before, for cubecl's queue, and
    /// after, for cuBLAS) are paid once for all of them instead of once each, which is most
    /// of a small product's time (a 7B k or v projection of 16384 rows is about 100 us of
    /// GEMM behind 60-70 us of waits; `docs/perf/cublas-prefill-gemm-2026-11-30/`); there, a part cuBLAS
    /// does not take (another dtype, a size past its 32-bit integers) sends every part to
    /// Burn's matmul. Each product by [`KernelOps::prefill_linear`] by default.
    ///
    /// # Errors
    /// As [`KernelOps::prefill_linear`], for the first part that fails.
    fn prefill_linear_many(
        x: Tensor<Self, 2>,
        parts: Vec<LinearParts<Self>>,
    ) -> Result<Vec<Tensor<Self, 2>>> {
        parts
            .into_iter()
            .map(|(w, bias)| Self::prefill_linear(x.clone(), w, bias))
            .collect()
    }

    /// Most rows (`batch x new tokens`) [`KernelOps::skinny_linear`] and the grouped skinny
    /// GEMMs run as a skinny GEMM under `config`; the model sends larger products to Burn's matmul (or from
    /// [`PREFILL_GEMM_MIN_ROWS`] rows to [`KernelOps::prefill_linear`]). [`SKINNY_MAX_ROWS`]
    /// by default; on CUDA 48 (`cuda::AUTO_MMA_MAX_ROWS`), 128 with the tensor-core kernel
    /// forced, 16 with the CUDA-core kernel only ([`KernelConfig::skinny_kernel`]); on the CPU
    /// [`cpu_skinny::CPU_SKINNY_MAX_ROWS`] (64: at 1.5B shapes its skinny GEMM took about half
    /// the time of Burn's matmul at every `m` from 2 to 64, `benches/skinny_gemm.rs`).
    fn skinny_max_rows(_config: &KernelConfig) -> usize {
        SKINNY_MAX_ROWS
    }

    /// Whether [`KernelOps::quant_linear`] multiplies weights kept in their GGUF block
    /// formats ([`cpu_quant::QuantMatrix`]) with block kernels on this backend: `true` for
    /// [`burn_flex::Flex`] ([`cpu_quant`]: about a sixth of the bytes of f32 weights per
    /// decode step at Q4_K), `false` by default. Where `false`, a model keeps dense weights
    /// (`dustin_qwen::WeightFormat::Dense`) or dequantizes a block weight for each product.
    const QUANT_KERNELS: bool = false;

    /// `x` `[m, k]` times the block weight `w` (`[n, k]`: `n` rows of `k` values in GGUF's
    /// layout, [`cpu_quant::QuantMatrix`]) transposed, plus `bias` `[n]`: `[m, n]`. Only
    /// backends with [`KernelOps::QUANT_KERNELS`] implement it.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] on a backend without block kernels (the default);
    /// [`KernelError::Shape`] naming `x` or `bias` when they do not fit `w`.
    fn quant_linear(
        x: Tensor<Self, 2>,
        w: &cpu_quant::QuantMatrix,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        let _ = (x, bias);
        Err(KernelError::Unsupported(format!(
            "{} block weights: this backend has no block kernels (load dense weights)",
            w.quant_type().name()
        )))
    }

    /// Which library runs [`KernelOps::prefill_linear`] on `device`: `"cublas"`, or
    /// `"burn"` (Burn's matmul; the default, and CUDA when `libcublas` does not load). For
    /// benchmark reports.
    fn prefill_gemm_name(_device: &Self::Device) -> &'static str {
        "burn"
    }

    /// The first `len` positions of a KV-cache tensor `k` `[batch, kv_heads, capacity,
    /// head_dim]`: `[batch, kv_heads, len, head_dim]` (`len` clamped to `capacity`), a view
    /// where the backend can make one. Burn's `narrow` by default.
    ///
    /// Why the CUDA backend overrides it: burn-cubecl 0.21's `slice` is a view only when the
    /// bytes it drops from the end of the buffer are a multiple of the allocator's alignment;
    /// for a cache cut at `len` that is `head_dim * 2 * (capacity - len)` bytes, so about
    /// half of all lengths (head_dim 128) or three quarters (64) copied the whole layer's
    /// cache, K and V, at every layer of every step (seen in the H200 trace of 2026-11-30:
    /// two 85 us slice kernels per layer at batch 1, 32k). The override keeps the buffer and
    /// the strides and shortens the shape.
    fn kv_prefix(k: Tensor<Self, 4>, len: usize) -> Tensor<Self, 4> {
        let cap = k.dims()[2];
        k.narrow(2, 0, len.min(cap))
    }

    /// What the device allocator of the calling thread's stream holds, bytes: `(in use,
    /// reserved)`; `None` where the backend does not say (the CPU backend). Reserved includes
    /// freed blocks the pool keeps for reuse: it is what `nvidia-smi` sees of this stream.
    fn memory_usage(_device: &Self::Device) -> Option<(u64, u64)> {
        None
    }

    /// Frees the host staging buffers of finished uploads issued on the calling thread's
    /// stream, waiting for the copies first. CubeCL keeps each upload's host buffer in a
    /// per-stream queue that it empties only when that stream launches enough kernels or is
    /// flushed twice (the queue is double-buffered behind a fence); a stream that only uploads
    /// (the offload prefetch thread) would otherwise keep every buffer. No-op by default.
    fn release_uploads(_device: &Self::Device) {}

    /// Copies `data`, a `[rows, cols]` matrix in this backend's float dtype, into page-locked
    /// host memory on `device`'s side, for [`KernelOps::upload_pinned`] (offloaded layers,
    /// copied in for every forward pass). `Ok(None)` where the backend has no page-locked
    /// memory (the default; the CPU), so callers keep their pageable copy.
    ///
    /// # Errors
    /// [`KernelError::Shape`] for data that is not 2-D or whose bytes do not match its shape
    /// and dtype; [`KernelError::Driver`] when the driver cannot lock that much host memory.
    fn pin_host(data: &TensorData, device: &Self::Device) -> Result<Option<PinnedHost>> {
        let _ = (data, device);
        Ok(None)
    }

    /// A device copy `[rows, cols]` of a page-locked matrix made by [`KernelOps::pin_host`]:
    /// one host-to-device DMA transfer into a buffer of the device allocator, finished before
    /// this returns (so the tensor is ready for any stream). It waits for the work queued on
    /// the calling thread's stream first, since the allocator may hand back a block that work
    /// still reads. On CUDA from the prefetch thread's own stream that wait is for uploads
    /// only.
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] on backends without page-locked memory (the default);
    /// [`KernelError::Driver`] for a failed copy.
    fn upload_pinned(host: &PinnedHost, device: &Self::Device) -> Result<Tensor<Self, 2>> {
        let _ = (host, device);
        Err(KernelError::Unsupported(
            "page-locked uploads on this backend (it has no page-locked memory)".into(),
        ))
    }

    /// Whether [`KernelOps::all_reduce_sum`] runs on the device (NCCL on CUDA); `false`: the
    /// backend has no collective and a tensor-parallel group sums on the host instead
    /// (`dustin_qwen::tp`).
    const COLLECTIVE: bool = false;

    /// All-reduce (sum) of `x` over the devices of a tensor-parallel group: every rank calls
    /// it with a tensor of the same shape and dtype, with the same `group` (the devices in
    /// rank order, each listed once), in the same order of calls; each gets the elementwise
    /// sum over the ranks. `x` `[batch, seq, hidden]` in the compute dtype.
    ///
    /// On CUDA this is NCCL's `ncclAllReduce` through Burn 0.21's `DistributedBackend`
    /// (cubecl-cuda's communicator, one per device group, made at the first call, on a
    /// stream of its own that the compute stream then waits on).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] on backends without a collective (the default; see
    /// [`KernelOps::COLLECTIVE`]); [`KernelError::InvalidInput`] for a group of fewer than two
    /// devices or one that lists a device twice.
    fn all_reduce_sum(x: Tensor<Self, 3>, group: &[Self::Device]) -> Result<Tensor<Self, 3>> {
        let _ = (x, group);
        Err(KernelError::Unsupported(
            "all-reduce on this backend (no device collective; sum on the host)".into(),
        ))
    }
}

/// Checks a tensor-parallel device group: at least two devices, none twice.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming the group.
pub fn check_group<D: PartialEq + std::fmt::Debug>(group: &[D]) -> Result<()> {
    if group.len() < 2 {
        return Err(KernelError::invalid(
            "all-reduce group",
            "at least two devices",
            format!("{group:?}"),
        ));
    }
    for (i, d) in group.iter().enumerate() {
        if group[..i].contains(d) {
            return Err(KernelError::invalid(
                "all-reduce group",
                "each device once",
                format!("{group:?} (device {d:?} twice)"),
            ));
        }
    }
    Ok(())
}

/// Shapes of a verify-attention call, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    /// Sequences.
    pub batch: usize,
    /// Query heads.
    pub q_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// New tokens per sequence.
    pub n_new: usize,
    /// Head width.
    pub head_dim: usize,
    /// Cache capacity per sequence.
    pub capacity: usize,
    /// Keys of the longest sequence, `max ctx + n_new`.
    pub keys: usize,
}

impl AttnDims {
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }
}

/// Checks `q` `[batch, q_heads, n_new, head_dim]` against a cache `[batch, kv_heads,
/// capacity, head_dim]` and `ctx_lens`.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::InvalidInput`] naming the first problem.
pub fn check_attn(q: [usize; 4], k: [usize; 4], ctx_lens: &[usize]) -> Result<AttnDims> {
    check_attn_upto(q, k, ctx_lens, MAX_NEW)
}

/// [`check_attn`] with `n_new` allowed up to `max_new` ([`MAX_PREFILL_NEW`] for
/// [`KernelOps::prefill_attention`]).
///
/// # Errors
/// As [`check_attn`].
pub fn check_attn_upto(
    q: [usize; 4],
    k: [usize; 4],
    ctx_lens: &[usize],
    max_new: usize,
) -> Result<AttnDims> {
    let [b, hq, n, d] = q;
    let [kb, kvh, cap, kd] = k;
    if kb != b || kd != d || kvh == 0 {
        return Err(KernelError::Shape {
            name: "k",
            expected: vec![b, kvh.max(1), cap, d],
            found: k.to_vec(),
        });
    }
    if hq == 0 || hq % kvh != 0 {
        return Err(KernelError::invalid(
            "q_heads",
            format!("a positive multiple of kv_heads = {kvh}"),
            hq,
        ));
    }
    if n == 0 || n > max_new {
        return Err(KernelError::invalid("n_new", format!("1 ..= {max_new}"), n));
    }
    if d == 0 {
        return Err(KernelError::invalid("head_dim", "at least 1", d));
    }
    if ctx_lens.len() != b {
        return Err(KernelError::invalid(
            "ctx_lens",
            format!("{b} lengths"),
            ctx_lens.len(),
        ));
    }
    if let Some((s, &l)) = ctx_lens.iter().enumerate().find(|(_, &l)| l + n > cap) {
        return Err(KernelError::invalid(
            "ctx_lens",
            format!("ctx + n_new <= capacity {cap} (sequence {s})"),
            l,
        ));
    }
    let keys = ctx_lens.iter().copied().max().unwrap_or(0) + n;
    Ok(AttnDims {
        batch: b,
        q_heads: hq,
        kv_heads: kvh,
        n_new: n,
        head_dim: d,
        capacity: cap,
        keys,
    })
}

/// Checks a [`KernelOps::kv_write`]: `src` `[batch, kv_heads, n, head_dim]` against `dst`
/// `[batch, kv_heads, capacity, head_dim]` and one start per sequence with room for `n`.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::InvalidInput`] naming the first problem.
pub fn check_kv_write(dst: [usize; 4], src: [usize; 4], starts: &[usize]) -> Result<()> {
    let [b, h, cap, d] = dst;
    let [sb, sh, n, sd] = src;
    if (sb, sh, sd) != (b, h, d) {
        return Err(KernelError::Shape {
            name: "src",
            expected: vec![b, h, n, d],
            found: src.to_vec(),
        });
    }
    if starts.len() != b {
        return Err(KernelError::invalid(
            "starts",
            format!("{b} starts (one per sequence)"),
            starts.len(),
        ));
    }
    if let Some((s, &st)) = starts.iter().enumerate().find(|(_, &st)| st + n > cap) {
        return Err(KernelError::invalid(
            "starts",
            format!("start + {n} new <= capacity {cap} (sequence {s})"),
            st,
        ));
    }
    Ok(())
}

/// Checks [`KernelOps::kv_write_pair`]'s inputs: `dst` `[k, v]` caches of one shape, `src`
/// `[k, v]` new rows of one shape, and those as [`check_kv_write`] wants them.
///
/// # Errors
/// [`KernelError::Shape`] naming `v_dst` or `v_src`, else as [`check_kv_write`].
pub fn check_kv_write_pair(
    dst: [[usize; 4]; 2],
    src: [[usize; 4]; 2],
    starts: &[usize],
) -> Result<()> {
    check_same("v_dst", dst[0], dst[1])?;
    check_same("v_src", src[0], src[1])?;
    check_kv_write(dst[0], src[0], starts)
}

/// Checks a sparse selection `[batch, kv_heads, budget]` and its counts against `dims`.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::InvalidInput`].
pub fn check_selection(dims: &AttnDims, idx: [usize; 3], counts: &[usize]) -> Result<()> {
    let [b, h, budget] = idx;
    if b != dims.batch || h != dims.kv_heads {
        return Err(KernelError::Shape {
            name: "indices",
            expected: vec![dims.batch, dims.kv_heads, budget],
            found: idx.to_vec(),
        });
    }
    if counts.len() != b {
        return Err(KernelError::invalid(
            "counts",
            format!("{b} counts"),
            counts.len(),
        ));
    }
    if let Some(&c) = counts.iter().find(|&&c| c > budget) {
        return Err(KernelError::invalid(
            "counts",
            format!("at most the budget {budget}"),
            c,
        ));
    }
    Ok(())
}

/// Checks a packed matrix ([`KernelOps::dequantize_packed`]) and returns `32 / bits`, the
/// codes per word.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming `bits`, `group` or `rows`; [`KernelError::Shape`]
/// naming `scale` or `min`.
pub fn check_packed(
    words: [usize; 3],
    scale: [usize; 3],
    min: [usize; 3],
    bits: u32,
    group: usize,
    rows: usize,
) -> Result<usize> {
    if !(1..=8).contains(&bits) {
        return Err(KernelError::invalid("bits", "1 ..= 8", bits));
    }
    let per = (32 / bits) as usize;
    let [groups, wpg, cols] = words;
    if wpg == 0 {
        return Err(KernelError::invalid(
            "words",
            "at least one word per group",
            0,
        ));
    }
    if group == 0 || wpg * per < group {
        return Err(KernelError::invalid(
            "group",
            format!("1 ..= {} (codes per group the words hold)", wpg * per),
            group,
        ));
    }
    if rows > groups * group || rows + group <= groups * group {
        return Err(KernelError::invalid(
            "rows",
            format!(
                "{} ..= {} ({groups} groups of {group})",
                (groups.max(1) - 1) * group + 1,
                groups * group
            ),
            rows,
        ));
    }
    check_same("scale", [groups, 1, cols], scale)?;
    check_same("min", [groups, 1, cols], min)?;
    Ok(per)
}

/// Most rows of `x` [`KernelOps::skinny_linear`]'s CUDA kernel takes (batch x (gamma + 1)
/// at batch 3 and gamma 4 is 15); the model sends more rows to Burn's matmul, unless
/// [`KernelOps::skinny_max_rows`] allows more (the opt-in tensor-core kernel on CUDA) or
/// there are at least [`PREFILL_GEMM_MIN_ROWS`] ([`KernelOps::prefill_linear`]).
pub const SKINNY_MAX_ROWS: usize = 16;

/// Fewest rows (`batch x new tokens`) the model sends through [`KernelOps::prefill_linear`]:
/// fewer rows (decode, verification, short prompts) take the skinny GEMM or Burn's matmul. On
/// CUDA each `prefill_linear` call waits for the device twice (cubecl's queue, then cuBLAS),
/// about 60-70 us per call on the H200 (docs/perf.md, 2026-11-30), which decode-sized GEMMs
/// (20-150 us) cannot afford. 256 rows is a choice, not a measured break-even: there a
/// Qwen2.5-7B gate projection is 35 GFLOP, about 50 us of cuBLAS work.
pub const PREFILL_GEMM_MIN_ROWS: usize = 256;

/// Fewest rows the model sends through [`KernelOps::prefill_linear_many`] (the q, k and v
/// products, gate and up, together); fewer take one [`KernelOps::prefill_linear`] each. On
/// the H200 (docs/perf.md, "GPU: prefill and time to first token", 7B q+k+v) together took
/// 0.85-0.92x the time of three calls at 16384 rows and 0.89x at 32768, but 1.14-1.52x at
/// 4096 (not understood); 8192, between the two, was not timed.
pub const PREFILL_MANY_MIN_ROWS: usize = 8192;

/// One linear layer's weight `[k, n]` (the `[in, out]` layout) and optional bias `[n]`, as
/// [`KernelOps::skinny_linear3`] takes them.
pub type LinearParts<B> = (Tensor<B, 2>, Option<Tensor<B, 1>>);

/// [`KernelOps::skinny_linear3`] as three [`KernelOps::skinny_linear`] calls (the default,
/// and the CUDA path's fallback for shapes its kernels do not take).
///
/// # Errors
/// As [`KernelOps::skinny_linear`].
pub fn skinny_linear3_each<B: KernelOps>(
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

/// [`KernelOps::skinny_swiglu`] as two [`KernelOps::skinny_linear`] calls and
/// [`KernelOps::silu_mul`] (the default, and the CUDA path's fallback).
///
/// # Errors
/// As [`check_swiglu`], then [`KernelOps::skinny_linear`]'s.
pub fn skinny_swiglu_each<B: KernelOps>(
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

/// Checks `w_gate` and `w_up` `[k, inter]` against `x` `[m, k]` and each other
/// ([`KernelOps::skinny_swiglu`]).
///
/// # Errors
/// [`KernelError::Shape`] naming `w_gate` or `w_up`.
pub fn check_swiglu(x: [usize; 2], w_gate: [usize; 2], w_up: [usize; 2]) -> Result<()> {
    if w_gate[0] != x[1] {
        return Err(KernelError::Shape {
            name: "w_gate",
            expected: vec![x[1], w_gate[1]],
            found: w_gate.to_vec(),
        });
    }
    check_same("w_up", w_gate, w_up)
}

/// Checks `w` `[k, n]` and `bias` `[n]` against `x` `[m, k]` ([`KernelOps::skinny_linear`]).
///
/// # Errors
/// [`KernelError::Shape`] naming `w` or `bias`.
pub fn check_skinny(x: [usize; 2], w: [usize; 2], bias: Option<[usize; 1]>) -> Result<()> {
    if w[0] != x[1] {
        return Err(KernelError::Shape {
            name: "w",
            expected: vec![x[1], w[1]],
            found: w.to_vec(),
        });
    }
    if let Some(b) = bias {
        check_same("bias", [w[1]], b)?;
    }
    Ok(())
}

/// Checks `weight` `[hidden]` against `x` `[batch, n, hidden]` and `eps`
/// ([`KernelOps::rms_norm`]).
///
/// # Errors
/// [`KernelError::Shape`] naming `weight`; [`KernelError::InvalidInput`] naming `eps` when it
/// is negative or not finite.
pub fn check_rms_norm(x: [usize; 3], weight: [usize; 1], eps: f64) -> Result<()> {
    if !eps.is_finite() || eps < 0.0 {
        return Err(KernelError::invalid("eps", "a finite value >= 0", eps));
    }
    if weight[0] != x[2] {
        return Err(KernelError::Shape {
            name: "weight",
            expected: vec![x[2]],
            found: weight.to_vec(),
        });
    }
    Ok(())
}

/// Checks that `found` has the shape `expected` ([`KernelOps::silu_mul`]).
///
/// # Errors
/// [`KernelError::Shape`] naming the argument.
pub fn check_same<const D: usize>(
    name: &'static str,
    expected: [usize; D],
    found: [usize; D],
) -> Result<()> {
    if expected != found {
        return Err(KernelError::Shape {
            name,
            expected: expected.to_vec(),
            found: found.to_vec(),
        });
    }
    Ok(())
}

/// Checks the RoPE tables `[batch, 1, n, head_dim]` against `x` `[batch, heads, n,
/// head_dim]` and that `head_dim` is even ([`KernelOps::rope`]).
///
/// # Errors
/// [`KernelError::Shape`] naming `cos` or `sin`; [`KernelError::InvalidInput`] naming `x`.
pub fn check_rope(x: [usize; 4], cos: [usize; 4], sin: [usize; 4]) -> Result<()> {
    let [b, _, n, d] = x;
    if d % 2 != 0 {
        return Err(KernelError::invalid("x", "an even head_dim", d));
    }
    check_same("cos", [b, 1, n, d], cos)?;
    check_same("sin", [b, 1, n, d], sin)
}

/// Checks [`KernelOps::fold_rows`]'s arguments against `rows` `[batch, kv_heads, n, len]`.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming the first argument that does not match.
pub fn check_fold(
    hist: Option<[usize; 3]>,
    factor: &[f32],
    rows: [usize; 4],
    w: &[f32],
    own: &[f32],
    all: &[f32],
) -> Result<()> {
    let [b, kvh, n, l] = rows;
    if let Some(h) = hist {
        if h != [b, kvh, l] {
            return Err(KernelError::invalid(
                "hist",
                format!("[{b}, {kvh}, {l}] (rows' batch, kv_heads, len)"),
                format!("{h:?}"),
            ));
        }
    }
    for (name, got, want) in [
        ("factor", factor.len(), b),
        ("w", w.len(), b * n),
        ("own", own.len(), kvh),
        ("all", all.len(), kvh),
    ] {
        if got != want {
            return Err(KernelError::invalid(
                name,
                format!("{want} values (rows {rows:?})"),
                got,
            ));
        }
    }
    Ok(())
}

/// Checks [`KernelOps::mix_scores`]'s arguments for `batch` sequences.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming the first argument that does not match.
pub fn check_mix(
    batch: usize,
    la: Option<[usize; 2]>,
    free: &[(usize, usize)],
    alpha: f32,
) -> Result<()> {
    if free.len() != batch {
        return Err(KernelError::invalid(
            "free",
            format!("{batch} ranges (one per sequence)"),
            free.len(),
        ));
    }
    if let Some((b, &(lo, hi))) = free.iter().enumerate().find(|(_, r)| r.0 > r.1) {
        return Err(KernelError::invalid(
            "free",
            format!("lo <= hi (sequence {b})"),
            format!("({lo}, {hi})"),
        ));
    }
    if let Some([lb, _]) = la {
        if lb != batch {
            return Err(KernelError::invalid("la", format!("batch {batch}"), lb));
        }
    }
    if !(0.0..=1.0).contains(&alpha) {
        return Err(KernelError::invalid("alpha", "a weight in [0, 1]", alpha));
    }
    Ok(())
}

/// Checks a head list for [`KernelOps::head_subset_scores`].
///
/// # Errors
/// [`KernelError::InvalidInput`] naming `heads`.
pub fn check_heads(heads: &[usize], q_heads: usize) -> Result<()> {
    if heads.is_empty() {
        return Err(KernelError::invalid("heads", "at least one head", 0));
    }
    for (i, &h) in heads.iter().enumerate() {
        if h >= q_heads {
            return Err(KernelError::invalid(
                "heads",
                format!("heads < {q_heads}"),
                h,
            ));
        }
        if heads[..i].contains(&h) {
            return Err(KernelError::invalid("heads", "distinct heads", h));
        }
    }
    Ok(())
}

/// Checks the keep rule and the scores' shape for [`KernelOps::top_k_positions`]; returns
/// `(counts, k)`.
///
/// # Errors
/// [`KernelError::Shape`] / [`KernelError::InvalidInput`].
pub fn check_top_k(
    scores: [usize; 3],
    ctx_lens: &[usize],
    keep: Keep,
) -> Result<(Vec<usize>, usize)> {
    let [b, h, c] = scores;
    let cmax = ctx_lens.iter().copied().max().unwrap_or(0);
    if b != ctx_lens.len() || c < cmax {
        return Err(KernelError::Shape {
            name: "scores",
            expected: vec![ctx_lens.len(), h, cmax],
            found: scores.to_vec(),
        });
    }
    if keep.budget == 0 {
        return Err(KernelError::invalid("budget", "at least 1", 0));
    }
    if keep.budget < keep.n_sink + keep.window {
        return Err(KernelError::invalid(
            "budget",
            format!("at least n_sink + window = {}", keep.n_sink + keep.window),
            keep.budget,
        ));
    }
    let counts: Vec<usize> = ctx_lens.iter().map(|&l| l.min(keep.budget)).collect();
    let k = counts.iter().copied().max().unwrap_or(0);
    Ok((counts, k))
}

/// Checks `page_size` and the contexts for the Quest ops; returns the number of pages.
///
/// # Errors
/// [`KernelError::InvalidInput`].
pub fn check_pages(
    ctx_lens: &[usize],
    batch: usize,
    capacity: usize,
    page_size: usize,
) -> Result<usize> {
    if page_size == 0 {
        return Err(KernelError::invalid("page_size", "at least 1", 0));
    }
    if ctx_lens.len() != batch {
        return Err(KernelError::invalid(
            "ctx_lens",
            format!("{batch} lengths"),
            ctx_lens.len(),
        ));
    }
    let c = ctx_lens.iter().copied().max().unwrap_or(0);
    if c > capacity {
        return Err(KernelError::invalid(
            "ctx_lens",
            format!("at most the capacity {capacity}"),
            c,
        ));
    }
    Ok(c.div_ceil(page_size).max(1))
}

/// The CPU backend: host kernels for the attention of decoding and verification, RoPE and
/// cache writes ([`cpu_attn`]), the f32 skinny GEMM of [`cpu_skinny`] and the block kernels of
/// [`cpu_quant`] for decode and verify rows, and the plain path ([`plain`]) for the rest.
impl KernelOps for burn_flex::Flex {
    const SKINNY_GEMM: bool = true;
    const ATTENTION_KERNELS: bool = true;
    const ELEMENTWISE_KERNELS: bool = true;

    fn verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attn_flex::verify_attention(q, k, v, ctx_lens, None, scale)
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
        attn_flex::verify_attention(q, k, v, ctx_lens, Some((indices, counts)), scale)
    }

    fn rope(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 4>,
        sin: Tensor<Self, 4>,
    ) -> Result<Tensor<Self, 4>> {
        attn_flex::rope(x, cos, sin)
    }

    fn kv_write(
        dst: Tensor<Self, 4>,
        src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<Tensor<Self, 4>> {
        attn_flex::kv_write(dst, src, starts)
    }

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
}
