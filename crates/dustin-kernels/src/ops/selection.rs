//! [`SelectionOps`]: the selection ops of [`KernelOps`](crate::KernelOps).

use super::KernelBackend;
use crate::plain;
use crate::EstimatorKernels;
use crate::Keep;
use crate::Positions;
use crate::Result;
#[cfg(doc)]
#[allow(unused_imports)]
use crate::*;
use burn_tensor::Tensor;

/// Scoring and selection: head-subset scores, the `dustin` estimator's fold and mix, Quest
/// page bounds and scores, and the top-k of positions.
///
/// Part of [`KernelOps`](crate::KernelOps); every method defaults to the plain path.
pub trait SelectionOps: KernelBackend {
    /// Whether [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores),
    /// [`KernelOps::head_subset_row_scores`](crate::SelectionOps::head_subset_row_scores),
    /// [`KernelOps::quest_page_scores`](crate::SelectionOps::quest_page_scores) and
    /// [`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions) are this
    /// backend's own kernels (CUDA's; the CPU's host kernels of [`crate::cpu_scores`]) rather
    /// than the plain path, so that callers with a Burn-op path of their own (the `dustin`
    /// estimator's contribution, the oracle, Quest's scores, `dustin_select`'s top-k step)
    /// take them.
    /// Default false.
    const SELECTION_KERNELS: bool = false;

    /// Which of the `dustin` estimator's history fold ([`KernelOps::fold_rows`](crate::SelectionOps::fold_rows)) and
    /// normalise-and-mix ([`KernelOps::mix_scores`](crate::SelectionOps::mix_scores)) run as this backend's kernels on
    /// `device`; the others run through the estimator's own Burn-op path. By default neither
    /// (every step on Burn ops); on CUDA [`KernelConfig::estimator_kernels`] of the device's
    /// config, both kernels by default. The same values up to rounding either way.
    fn estimator_kernels(_device: &Self::Device) -> EstimatorKernels {
        EstimatorKernels::NONE
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
    /// As [`KernelOps::verify_attention`](crate::AttentionOps::verify_attention); [`KernelError::InvalidInput`] for an empty,
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

    /// [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores) before the sum over the query rows: f32
    /// `[batch, kv_heads, n_new, capacity]` (`k`'s length), entry `(b, h, i, j)` =
    /// `sum_{q in heads, q / group = h} p_{q,i}(j)` (0 for KV heads without a chosen head and
    /// for `j > ctx_lens[b] + i`). The `dustin` estimator weighs the rows by acceptance.
    ///
    /// # Errors
    /// As [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores).
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
    /// (what [`KernelOps::head_subset_row_scores`](crate::SelectionOps::head_subset_row_scores) returns), `factor` `[batch]`, `w`
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
}
