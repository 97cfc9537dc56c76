//! How Dustin picks the few heads a layer's importance is scored on (`heads_per_layer` of
//! them): per query head, the recall of its own top-k positions against the top-k of all
//! heads together, measured on the prompt.
//!
//! The recall runs on the rows' device through the shared top-k step
//! ([`select_top_k`]): sorting them with Burn instead reads every row back to the host
//! (Burn 0.21 sorts on the host on every backend), which at 32k positions, batch 16 and 28
//! layers made the first verification of the Qwen2.5-Coder pair take 17.6 s on an H100
//! (`docs/perf.md`, "first iteration").

use burn_tensor::{DType, IndexingUpdateOp, Tensor};
use dustin_core::{CoreError, Result};
use dustin_kernels::KernelOps;

use super::{host_f32, Dustin};
use crate::topk::select_top_k;
use crate::KeepRule;

/// Per query head of `row` (`[heads, len]`: one sequence's attention mass per head and
/// prompt position), the fraction of the `k` highest positions of the heads' sum that are
/// also among the head's own `k` highest, both over `keep`'s free range (sinks and window
/// excluded), `[heads]` in f32; `None` when the free range is empty. `k` is `top_k`, else
/// the free budget (`budget - n_sink - window`), clamped to `1..=` the free range's length.
/// Ties between equal values go to the lower position (the top-k step's rule).
///
/// # Errors
/// As [`select_top_k`] (a backend kernel's failure).
pub(super) fn head_recall<B: KernelOps>(
    row: Tensor<B, 2>,
    keep: KeepRule,
    top_k: Option<usize>,
) -> Result<Option<Tensor<B, 1>>> {
    let [nh, l] = row.dims();
    let (lo, hi) = keep.free_range(l);
    if hi == lo || nh == 0 {
        return Ok(None);
    }
    let n = hi - lo;
    let free_budget = keep.budget.saturating_sub(keep.n_sink + keep.window);
    let k = top_k.unwrap_or(free_budget).clamp(1, n);
    let per_head = row.narrow(1, lo, n);
    let all = per_head.clone().sum_dim(0); // [1, n]
                                           // row 0 the heads' sum, rows 1.. the heads: one top-k call for all of them
    let scores = Tensor::cat(vec![all, per_head], 0).reshape([1, nh + 1, n]);
    let top = select_top_k(
        scores,
        &[n],
        KeepRule {
            budget: k,
            n_sink: 0,
            window: 0,
        },
    )?
    .indices
    .reshape([nh + 1, k]);
    let device = top.device();
    let in_all = Tensor::<B, 1>::zeros([n], &device)
        .cast(DType::F32)
        .select_assign(
            0,
            top.clone().narrow(0, 0, 1).reshape([k]),
            Tensor::<B, 1>::ones([k], &device).cast(DType::F32),
            IndexingUpdateOp::Add,
        );
    let hits = in_all
        .select(0, top.narrow(0, 1, nh).reshape([nh * k]))
        .reshape([nh, k])
        .sum_dim(1)
        .reshape([nh]);
    Ok(Some(hits.div_scalar(k as f32)))
}

impl<B: KernelOps> Dustin<B> {
    /// Per query head, [`head_recall`] summed over the sequences that left a calibration row
    /// for `layer`, read back once; `None` when none did or no free range remains.
    ///
    /// # Errors
    /// [`CoreError::Shape`] for a row of other than `nh` heads; as [`head_recall`].
    fn calibrate(&self, layer: usize, nh: usize, keep: KeepRule) -> Result<Option<Vec<f64>>> {
        let mut acc: Option<Tensor<B, 1>> = None;
        for row in self.calib.layer_rows(layer) {
            let [rh, l] = row.dims();
            if rh != nh {
                return Err(CoreError::Shape {
                    name: format!("calibration rows of layer {layer}"),
                    expected: vec![nh, l],
                    found: vec![rh, l],
                });
            }
            if let Some(r) = head_recall(row, keep, self.cfg.calib_top_k)? {
                acc = Some(match acc {
                    Some(a) => a + r,
                    None => r,
                });
            }
        }
        acc.map(|a| Ok(host_f32(a)?.into_iter().map(f64::from).collect()))
            .transpose()
    }

    /// The estimator heads of `layer` (query-head indices, ascending): the configured ones,
    /// else the `heads_per_layer` of highest [`head_recall`] summed over the sequences'
    /// calibration rows (ties to the lower head), else (no calibration data: prompts shorter
    /// than sinks + window) heads spread evenly over the groups. Chosen once, at the layer's
    /// first verification.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming `heads` for a configured head `>= nh`;
    /// [`CoreError::Shape`] for a calibration row of other than `nh` heads.
    pub(super) fn layer_heads(
        &mut self,
        layer: usize,
        nh: usize,
        keep: KeepRule,
    ) -> Result<Vec<usize>> {
        self.grow(layer);
        if let Some(h) = &self.heads[layer] {
            return Ok(h.clone());
        }
        let hpl = self.cfg.heads_per_layer.min(nh);
        let chosen = if let Some(fixed) = &self.cfg.heads {
            if let Some(&bad) = fixed.iter().find(|&&h| h >= nh) {
                return Err(CoreError::invalid(
                    "heads",
                    format!("query heads < {nh}"),
                    bad,
                ));
            }
            let mut f = fixed.clone();
            f.sort_unstable();
            f.dedup();
            f
        } else if let Some(r) = self.calibrate(layer, nh, keep)? {
            let mut order: Vec<usize> = (0..nh).collect();
            order.sort_by(|&a, &b| r[b].total_cmp(&r[a]).then(a.cmp(&b)));
            let mut best: Vec<usize> = order.into_iter().take(hpl).collect();
            best.sort_unstable();
            best
        } else {
            // no calibration data (prompt shorter than sinks + window): spread over the groups
            (0..hpl).map(|i| i * nh / hpl).collect()
        };
        self.calib.take_layer(layer);
        self.heads[layer] = Some(chosen.clone());
        Ok(chosen)
    }
}
