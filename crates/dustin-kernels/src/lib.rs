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
/// [`KernelOps::prefill_attention`](crate::AttentionOps::prefill_attention)).
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

/// Checks a [`KernelOps::kv_write`](crate::MemoryOps::kv_write): `src` `[batch, kv_heads, n, head_dim]` against `dst`
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
    if let Some((s, &st)) = starts
        .iter()
        .enumerate()
        .find(|(_, &st)| st.checked_add(n).is_none_or(|end| end > cap))
    {
        return Err(KernelError::invalid(
            "starts",
            format!("start + {n} new <= capacity {cap} (sequence {s})"),
            st,
        ));
    }
    Ok(())
}

/// Checks [`KernelOps::kv_write_pair`](crate::MemoryOps::kv_write_pair)'s inputs: `dst` `[k, v]` caches of one shape, `src`
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

/// Checks a packed matrix ([`KernelOps::dequantize_packed`](crate::ElementwiseOps::dequantize_packed)) and returns `32 / bits`, the
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

/// Checks `w_gate` and `w_up` `[k, inter]` against `x` `[m, k]` and each other
/// ([`KernelOps::skinny_swiglu`](crate::LinearOps::skinny_swiglu)).
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

/// Checks `w` `[k, n]` and `bias` `[n]` against `x` `[m, k]` ([`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear)).
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
/// ([`KernelOps::rms_norm`](crate::ElementwiseOps::rms_norm)).
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

/// Checks that `found` has the shape `expected` ([`KernelOps::silu_mul`](crate::ElementwiseOps::silu_mul)).
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
/// head_dim]` and that `head_dim` is even ([`KernelOps::rope`](crate::ElementwiseOps::rope)).
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

/// Checks [`KernelOps::fold_rows`](crate::SelectionOps::fold_rows)'s arguments against `rows` `[batch, kv_heads, n, len]`.
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

/// Checks [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores)'s arguments for `batch` sequences.
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

/// Checks a head list for [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores).
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

/// Checks the keep rule and the scores' shape for [`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions); returns
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
    // saturating: a sum past usize::MAX is refused, not wrapped to a small one
    if keep.budget < keep.always_kept() {
        return Err(KernelError::invalid(
            "budget",
            format!("at least n_sink + window = {}", keep.always_kept_exact()),
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

/// Checks a call of [`KernelOps::quest_page_scores`](crate::SelectionOps::quest_page_scores):
/// `q` `[batch, q_heads, n_new, head_dim]` with `n_new >= 1`, bounds `kmin` and `kmax` of one
/// shape `[batch, kv_heads, pages, head_dim]` with `q_heads` a multiple of `kv_heads`, and
/// `pages` at least the pages of the longest context (`ctx_lens`, one per sequence).
/// Returns `pages`.
///
/// # Errors
/// [`KernelError::Shape`] for bounds of another batch, head width or shape than `q` and
/// each other; [`KernelError::InvalidInput`] naming `q` for its heads or `n_new`, and as
/// [`check_pages`], or naming `kmin` when it has fewer pages than the contexts need.
pub fn check_quest_scores(
    q: [usize; 4],
    kmin: [usize; 4],
    kmax: [usize; 4],
    ctx_lens: &[usize],
    page_size: usize,
) -> Result<usize> {
    let [b, hq, n, d] = q;
    let [kb, kvh, pages, kd] = kmin;
    if kb != b || kd != d || kvh == 0 || kmax != kmin {
        return Err(KernelError::Shape {
            name: "kmin/kmax",
            expected: vec![b, kvh.max(1), pages, d],
            found: kmax.to_vec(),
        });
    }
    if hq % kvh != 0 || n == 0 {
        return Err(KernelError::invalid(
            "q",
            format!("heads a multiple of {kvh}, n_new >= 1"),
            format!("{hq} heads, n_new {n}"),
        ));
    }
    let need = check_pages(ctx_lens, b, usize::MAX, page_size)?;
    if need > pages {
        return Err(KernelError::invalid(
            "kmin",
            format!("at least {need} pages"),
            pages,
        ));
    }
    Ok(pages)
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
