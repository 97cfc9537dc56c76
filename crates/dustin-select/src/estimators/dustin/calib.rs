//! How Dustin picks the few heads a layer's importance is scored on (`heads_per_layer` of
//! them): per query head, the recall of its own top-k positions against the top-k of all
//! heads together, measured on the prompt.
//!
//! The recall runs on the rows' device through the shared top-k step
//! ([`select_top_k`]): sorting them with Burn instead reads every row back to the host
//! (Burn 0.21 sorts on the host on every backend), which at 32k positions, batch 16 and 28
//! layers made the first verification of the Qwen2.5-Coder pair take 17.6 s on an H100
//! (`docs/perf.md`, "first iteration").

use burn_tensor::{DType, IndexingUpdateOp, Int, Tensor};
use dustin_core::{CoreError, Result};
use dustin_kernels::KernelOps;

use super::{host_f32, Dustin};
use crate::topk::select_top_k;
use crate::KeepRule;

/// Per query head, the recall of each row of `rows` summed over the rows, `[heads]` in f32;
/// `None` when no row has a free range. A row (`[heads, len]`: one sequence's attention mass
/// per head and prompt position) contributes the fraction of the `k` highest positions of the
/// heads' sum that are also among the head's own `k` highest, both over `keep`'s free range
/// (sinks and window excluded). `k` is `top_k`, else the free budget (`budget - n_sink -
/// window`), clamped to `1..=` the free range's length. Ties between equal values go to the
/// lower position (the top-k step's rule).
///
/// Rows of one length share their free range and `k`: they run as one batch (one top-k call
/// and a few ops for all of them, where a call per row made the first verification of the
/// Qwen2.5-Coder pair at batch 16 run 28 x 16 = 448 top-k calls); rows of other lengths (a
/// ragged batch of prompts) each group of their own.
///
/// # Errors
/// [`CoreError::Shape`] for rows of different head counts; as [`select_top_k`] (a backend
/// kernel's failure).
pub(super) fn head_recall_sum<B: KernelOps>(
    rows: Vec<Tensor<B, 2>>,
    keep: KeepRule,
    top_k: Option<usize>,
) -> Result<Option<Tensor<B, 1>>> {
    let mut groups: Vec<(usize, Vec<Tensor<B, 2>>)> = Vec::new();
    let heads = rows.first().map(|r| r.dims()[0]);
    for row in rows {
        let [rh, l] = row.dims();
        if Some(rh) != heads {
            return Err(CoreError::Shape {
                name: "calibration rows".into(),
                expected: vec![heads.unwrap_or(rh), l],
                found: vec![rh, l],
            });
        }
        match groups.iter_mut().find(|(gl, _)| *gl == l) {
            Some((_, g)) => g.push(row),
            None => groups.push((l, vec![row])),
        }
    }
    let mut acc: Option<Tensor<B, 1>> = None;
    for (_, group) in groups {
        if let Some(r) = recall_of_group(group, keep, top_k)? {
            acc = Some(match acc {
                Some(a) => a + r,
                None => r,
            });
        }
    }
    Ok(acc)
}

/// [`head_recall_sum`] of rows of one shape `[heads, len]` (at least one).
fn recall_of_group<B: KernelOps>(
    rows: Vec<Tensor<B, 2>>,
    keep: KeepRule,
    top_k: Option<usize>,
) -> Result<Option<Tensor<B, 1>>> {
    let Some([nh, l]) = rows.first().map(Tensor::dims) else {
        return Ok(None);
    };
    let (lo, hi) = keep.free_range(l);
    if hi == lo || nh == 0 {
        return Ok(None);
    }
    let (r, n) = (rows.len(), hi - lo);
    let free_budget = keep.budget.saturating_sub(keep.always_kept());
    let k = top_k.unwrap_or(free_budget).clamp(1, n);
    let per_head = Tensor::stack::<3>(rows.into_iter().map(|x| x.narrow(1, lo, n)).collect(), 0);
    // [r, 1, n], then per row line 0 the heads' sum and lines 1.. the heads, [r, nh + 1, n]:
    // one top-k call for all of them
    let all = per_head.clone().sum_dim(1);
    let scores = Tensor::cat(vec![all, per_head], 1);
    let top = select_top_k(
        scores,
        &vec![n; r],
        KeepRule {
            budget: k,
            n_sink: 0,
            window: 0,
        },
    )?
    .indices; // [r, nh + 1, k]
    let device = top.device();
    // positions made global over the rows' `r * n` slots: row i's at `i * n ..`
    let offsets = Tensor::<B, 1, Int>::arange(0..r as i64, &device)
        .mul_scalar(n as i64)
        .reshape([r, 1, 1])
        .expand([r, nh + 1, k]);
    let top = top + offsets;
    let in_all = Tensor::<B, 1>::zeros([r * n], &device)
        .cast(DType::F32)
        .select_assign(
            0,
            top.clone().narrow(1, 0, 1).reshape([r * k]),
            Tensor::<B, 1>::ones([r * k], &device).cast(DType::F32),
            IndexingUpdateOp::Add,
        );
    let hits = in_all
        .select(0, top.narrow(1, 1, nh).reshape([r * nh * k]))
        .reshape([r, nh * k])
        .sum_dim(0)
        .reshape([nh, k])
        .sum_dim(1)
        .reshape([nh]);
    Ok(Some(hits.div_scalar(k as f32)))
}

impl<B: KernelOps> Dustin<B> {
    /// Per query head, the recall of the sequences that left a calibration row for `layer`,
    /// summed ([`head_recall_sum`]) and read back once; `None` when none did or no free range
    /// remains.
    ///
    /// # Errors
    /// [`CoreError::Shape`] for a row of other than `nh` heads; as [`head_recall_sum`].
    fn calibrate(&self, layer: usize, nh: usize, keep: KeepRule) -> Result<Option<Vec<f64>>> {
        let rows: Vec<Tensor<B, 2>> = self.calib.layer_rows(layer).collect();
        if let Some(row) = rows.iter().find(|r| r.dims()[0] != nh) {
            let [rh, l] = row.dims();
            return Err(CoreError::Shape {
                name: format!("calibration rows of layer {layer}"),
                expected: vec![nh, l],
                found: vec![rh, l],
            });
        }
        head_recall_sum(rows, keep, self.cfg.calib_top_k)?
            .map(|a| Ok(host_f32(a)?.into_iter().map(f64::from).collect()))
            .transpose()
    }

    /// The estimator heads of `layer` (query-head indices, ascending): the configured ones,
    /// else the `heads_per_layer` of highest [`head_recall_sum`] summed over the sequences'
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
