//! The positions a sparse draft attends to: sinks, window and the top of its last
//! lookahead, per layer or shared.

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::LayerSelection;
use dustin_kernels::KernelOps;
use dustin_select::{select_top_k, KeepRule};

use super::greedy::pad_width;

/// How a sparse draft ([`ModelDrafter::with_draft_selection`](crate::ModelDrafter::with_draft_selection)) chooses the positions it
/// attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftSelection {
    /// Budget, sinks and window per layer and KV head ([`KeepRule`]).
    pub keep: KeepRule,
    /// Whether each draft layer and KV head ranks positions by its own attention mass
    /// (`true`, [`DraftSelection::new`]'s choice) or every layer and KV head shares the mass
    /// summed over them (`false`). Measured on SmolLM2-135M (docs/perf.md, 2026-12-01): at a
    /// budget of 256 of 1,949 tokens the shared ranking cost 20% of the acceptance length,
    /// the per-layer one 7%.
    pub per_layer: bool,
}

impl DraftSelection {
    /// Per-layer selection under `keep`.
    pub fn new(keep: KeepRule) -> Self {
        Self {
            keep,
            per_layer: true,
        }
    }
}

/// A sparse draft's selections at a proposal's start, for contexts `base`: sinks, window and
/// the top of `scores` by [`select_top_k`], in one call. `scores` is `[groups * batch, h,
/// width]` (group-major: a group is a draft layer, or one group for all), the last
/// proposal's mass (zero past its width); `h` is 1 (one ranking for every KV head) or
/// `kv_heads`. Returns `[groups * batch, kv_heads, k]` with counts per row.
pub(super) fn draft_selection<B: KernelOps>(
    scores: Tensor<B, 3>,
    base: &[usize],
    keep: KeepRule,
    kv_heads: usize,
) -> dustin_core::Result<LayerSelection<B>> {
    let [rows, h, w] = scores.dims();
    let groups = rows / base.len().max(1);
    let need = base.iter().copied().max().unwrap_or(0);
    let scores = pad_width(scores, need.max(w));
    let sel = select_top_k(scores, &repeat_lens(base, groups), keep)?;
    Ok(if h == kv_heads {
        sel
    } else {
        LayerSelection {
            indices: sel.indices.repeat_dim(1, kv_heads),
            counts: sel.counts,
        }
    })
}

/// `lens` repeated `groups` times (group-major), for the rows of a stacked selection.
pub(super) fn repeat_lens(lens: &[usize], groups: usize) -> Vec<usize> {
    (0..groups).flat_map(|_| lens.iter().copied()).collect()
}

/// Group `g`'s rows of a stacked selection `[groups * batch, kv_heads, k]`.
pub(super) fn group_rows<B: Backend>(
    sel: &LayerSelection<B>,
    g: usize,
    batch: usize,
) -> LayerSelection<B> {
    let [_, h, k] = sel.indices.dims();
    LayerSelection {
        indices: sel
            .indices
            .clone()
            .slice([g * batch..(g + 1) * batch, 0..h, 0..k]),
        counts: sel.counts[g * batch..(g + 1) * batch].to_vec(),
    }
}
