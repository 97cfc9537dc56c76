//! The shared top-k step: scores `[batch, kv_heads, ctx]` to a [`LayerSelection`], and the
//! extension of a reused selection with the positions that entered the context since.
//!
//! Both run on the scores' device; only per-sequence lengths (a few integers per sequence)
//! come from the host. The top-k runs the backend's fused kernel
//! ([`KernelOps::top_k_positions`](dustin_kernels::SelectionOps::top_k_positions)) where it has one ([`KernelOps::FUSED`](dustin_kernels::KernelBackend::FUSED): CUDA), else
//! Burn ops (mask / sort; Burn's sort reads the tensor back to the host on every backend of
//! 0.21, which is why the GPU needs the kernel).

use burn_tensor::{backend::Backend, Bool, Int, Tensor, TensorData};
use dustin_core::{CoreError, LayerSelection, Result};
use dustin_kernels::{KernelError, KernelOps};

use crate::KeepRule;

/// Turns scores into a selection, per (sequence, KV head): keeps the sinks `[0, n_sink)` and
/// the window `[ctx_b - window, ctx_b)` always, fills up to `budget` with the highest scores
/// among the other positions `< ctx_b`, and never a position `>= ctx_b`.
///
/// `scores` is `[batch, kv_heads, c]` with `c >= max(ctx_lens)` (columns past the largest
/// context are ignored). NaN scores rank lowest, `+inf` like the largest finite value.
///
/// Returns `indices` `[batch, kv_heads, k]`, `k = max_b counts[b]`, ascending per row, with
/// `counts[b] = min(budget, ctx_b)`; the padding slots `counts[b] .. k` hold positions
/// `< max(ctx_lens)` (safe to gather with, ignored by readers). Ties between equal scores are
/// broken by the backend's sort (the fused kernel: to the lower position).
///
/// # Errors
/// [`CoreError::Shape`] when `scores` has another batch size than `ctx_lens` or fewer columns
/// than the largest context; [`CoreError::InvalidInput`] naming `budget` when
/// `budget < n_sink + window` (the sinks and window would not fit; equality is allowed here,
/// as in a [`Pyramid`](crate::Pyramid) layer with no free budget left, although
/// [`SelectConfig::validate`](crate::SelectConfig::validate) asks for more).
pub fn select_top_k<B: KernelOps>(
    scores: Tensor<B, 3>,
    ctx_lens: &[usize],
    keep: KeepRule,
) -> Result<LayerSelection<B>> {
    let [b, h, c_in] = scores.dims();
    let c = ctx_lens.iter().copied().max().unwrap_or(0);
    if b != ctx_lens.len() || c_in < c {
        return Err(CoreError::Shape {
            name: "scores".into(),
            expected: vec![ctx_lens.len(), h, c],
            found: vec![b, h, c_in],
        });
    }
    if keep.budget < keep.always_kept() {
        return Err(CoreError::invalid(
            "budget",
            format!("at least n_sink + window = {}", keep.always_kept_exact()),
            keep.budget,
        ));
    }
    let device = scores.device();
    let counts: Vec<usize> = ctx_lens.iter().map(|&l| l.min(keep.budget)).collect();
    let k = counts.iter().copied().max().unwrap_or(0);
    if k == 0 {
        let indices = Tensor::from_data(TensorData::new(Vec::<i64>::new(), [b, h, 0]), &device);
        return Ok(LayerSelection { indices, counts });
    }
    if B::SELECTION_KERNELS {
        match B::top_k_positions(scores.clone(), ctx_lens, keep) {
            Ok(p) => {
                return Ok(LayerSelection {
                    indices: p.indices,
                    counts: p.counts,
                })
            }
            Err(KernelError::Unsupported(_)) => {}
            Err(e) => return Err(kernel_error(e)),
        }
    }
    if k == c {
        // every row keeps its whole context (k <= budget, so ctx_b <= budget for all b)
        let indices = Tensor::<B, 1, Int>::arange(0..c as i64, &device)
            .reshape([1, 1, c])
            .expand([b, h, c]);
        return Ok(LayerSelection { indices, counts });
    }
    let s = scores.slice([0..b, 0..h, 0..c]);
    let s = s
        .clone()
        .mask_fill(s.is_nan(), f32::MIN)
        .clamp(f32::MIN, f32::MAX);
    let pos = Tensor::<B, 1, Int>::arange(0..c as i64, &device)
        .reshape([1, 1, c])
        .expand([b, h, c]);
    let lens = lens_tensor::<B>(ctx_lens, &device)
        .reshape([b, 1, 1])
        .expand([b, h, c]);
    let absent = pos.clone().greater_equal(lens.clone());
    let recent = pos
        .clone()
        .greater_equal(lens.sub_scalar(keep.window as i64));
    let forced = pos.lower_elem(keep.n_sink as i64).bool_or(recent);
    // forced > any real score > absent; at most min(ctx_b, n_sink + window) <= counts[b]
    // forced positions per row, and every row has at least counts[b] non-absent positions
    let s = s
        .mask_fill(forced, f32::INFINITY)
        .mask_fill(absent, f32::NEG_INFINITY);
    // a full sort: `argtopk` is not implemented by every backend (burn-flex 0.21)
    let top = s.argsort_descending(2).narrow(2, 0, k);
    // positions >= ctx_b (only taken to pad rows with counts[b] < k) sort last
    let indices = top.sort(2);
    Ok(LayerSelection { indices, counts })
}

/// Slots of an extended selection ([`extend_selection`]) come in multiples of this many: the
/// index tensor's width then changes once every 64 new positions, not at every step. Each new
/// width gave the extension's gather and mask and the sparse attention's index reads new
/// shapes, which on CUDA can mean new kernels to compile while decoding (the same cause as
/// `dustin_qwen::KV_VIEW_MULTIPLE`, docs/decisions.md). Our choice: 64, as there.
pub const SELECTION_MULTIPLE: usize = 64;

/// A cached selection made when the contexts were `old_lens`, extended for contexts now of
/// `new_lens`: each row keeps its `counts[b]` entries and appends `old_lens[b] .. new_lens[b]`
/// (so nothing that entered the context since is lost); counts grow by those.
///
/// The result has `max_b counts[b]` slots rounded up to [`SELECTION_MULTIPLE`]; padding slots
/// hold position 0 (readers take `counts[b]` slots).
///
/// # Errors
/// [`CoreError::InvalidInput`] naming `ctx_lens` when the batch sizes differ or a context
/// shrank (a cached selection cannot be reused then).
pub fn extend_selection<B: Backend>(
    sel: &LayerSelection<B>,
    old_lens: &[usize],
    new_lens: &[usize],
) -> Result<LayerSelection<B>> {
    extend_selection_grouped(sel, 1, old_lens, new_lens)
}

/// [`extend_selection`] of a stack of `groups` selections of one batch, `sel.indices`
/// `[groups * batch, kv_heads, k]` group-major (as several layers' selections made in one
/// top-k call), for contexts `old_lens` -> `new_lens` of that batch (`batch` lengths each).
/// The index tables come from the host once for the batch, not once per group, when every
/// group keeps the same counts (as [`select_top_k`] makes them); otherwise row by row.
///
/// # Errors
/// As [`extend_selection`]; [`CoreError::InvalidInput`] naming `groups` when the rows are
/// not `groups` times the batch.
pub fn extend_selection_grouped<B: Backend>(
    sel: &LayerSelection<B>,
    groups: usize,
    old_lens: &[usize],
    new_lens: &[usize],
) -> Result<LayerSelection<B>> {
    let [rows, h, k_old] = sel.indices.dims();
    let b = new_lens.len();
    if groups == 1 && (rows != b || sel.counts.len() != rows) {
        return Err(CoreError::invalid(
            "ctx_lens",
            format!("{rows} sequences"),
            b,
        ));
    }
    if groups == 0 || rows != groups * b || sel.counts.len() != rows {
        return Err(CoreError::invalid(
            "groups",
            format!("{rows} selection rows = groups x {b} sequences"),
            groups,
        ));
    }
    if old_lens.len() != b {
        return Err(CoreError::invalid(
            "ctx_lens",
            format!("{b} sequences"),
            old_lens.len(),
        ));
    }
    if let Some(i) = (0..b).find(|&i| new_lens[i] < old_lens[i]) {
        return Err(CoreError::invalid(
            "ctx_lens",
            format!(
                "a context of at least {} tokens (sequence {i})",
                old_lens[i]
            ),
            new_lens[i],
        ));
    }
    if old_lens == new_lens {
        return Ok(sel.clone());
    }
    let same = (0..rows).all(|r| sel.counts[r] == sel.counts[r % b]);
    if !same {
        // row by row: every group's rows with the batch's lengths
        let rep = |l: &[usize]| -> Vec<usize> { (0..groups).flat_map(|_| l.to_vec()).collect() };
        return extend_selection_grouped(sel, 1, &rep(old_lens), &rep(new_lens));
    }
    let counts: Vec<usize> = (0..b)
        .map(|i| sel.counts[i] + new_lens[i] - old_lens[i])
        .collect();
    let k = counts
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .next_multiple_of(SELECTION_MULTIPLE);
    let mut src = Vec::with_capacity(b * k);
    let mut val = Vec::with_capacity(b * k);
    let mut fresh = Vec::with_capacity(b * k);
    for i in 0..b {
        for j in 0..k {
            let from_old = j < sel.counts[i];
            src.push(if from_old { j as i64 } else { 0 });
            fresh.push(!from_old);
            val.push(if from_old || j >= counts[i] {
                0
            } else {
                (old_lens[i] + j - sel.counts[i]) as i64
            });
        }
    }
    let device = sel.indices.device();
    let old = if k_old == 0 {
        Tensor::<B, 4, Int>::zeros([groups, b, h, 1], &device)
    } else {
        sel.indices.clone().reshape([groups, b, h, k_old])
    };
    let shape = [groups, b, h, k];
    let src =
        Tensor::<B, 4, Int>::from_data(TensorData::new(src, [1, b, 1, k]), &device).expand(shape);
    let val =
        Tensor::<B, 4, Int>::from_data(TensorData::new(val, [1, b, 1, k]), &device).expand(shape);
    let fresh = Tensor::<B, 4, Bool>::from_data(TensorData::new(fresh, [1, b, 1, k]), &device)
        .expand(shape);
    let indices = old
        .gather(3, src)
        .mask_where(fresh, val)
        .reshape([groups * b, h, k]);
    Ok(LayerSelection {
        indices,
        counts: (0..groups).flat_map(|_| counts.iter().copied()).collect(),
    })
}

/// Context lengths as an `Int` tensor `[batch]`.
pub(crate) fn lens_tensor<B: Backend>(lens: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    let v: Vec<i64> = lens.iter().map(|&l| l as i64).collect();
    Tensor::from_data(TensorData::new(v, [lens.len()]), device)
}

/// A kernel's error as the selectors' error type.
pub(crate) fn kernel_error(e: KernelError) -> CoreError {
    CoreError::Other(Box::new(e))
}
