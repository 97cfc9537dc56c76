//! Per-(sequence, layer) score rows built during prefill and read batched at verification:
//! the storage of the static estimators (`h2o`, `snapkv`) and of `dustin`'s history seeds.

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{CoreError, LayerAttnCtx, Phase, Result};

use crate::attn::fit_last;

/// Rows `[kv_heads, len]` per sequence and layer, and per layer the last batch of them
/// [`PromptRows::batched`] made: the rows do not change between verifications, and the width
/// asked for changes once per `dustin_qwen::KV_VIEW_MULTIPLE` positions, so most calls take
/// it as it is (making it is a pad of each sequence's row and a concatenation: at batch 16
/// on the GPU, about 33 launches a layer at every verification, counted from the code; the
/// selection took 1 ms a layer).
#[derive(Debug, Clone)]
pub(crate) struct PromptRows<B: Backend> {
    rows: Vec<Vec<Option<Tensor<B, 2>>>>,
    made: Vec<Option<Tensor<B, 3>>>,
}

impl<B: Backend> Default for PromptRows<B> {
    fn default() -> Self {
        Self {
            rows: Vec::new(),
            made: Vec::new(),
        }
    }
}

impl<B: Backend> PromptRows<B> {
    pub(crate) fn reset(&mut self, batch: usize, num_layers: usize) {
        self.rows = (0..batch).map(|_| vec![None; num_layers]).collect();
        self.made.clear();
    }

    fn slot(&mut self, seq: usize, layer: usize) -> &mut Option<Tensor<B, 2>> {
        if let Some(m) = self.made.get_mut(layer) {
            *m = None;
        }
        if self.rows.len() <= seq {
            self.rows.resize_with(seq + 1, Vec::new);
        }
        let r = &mut self.rows[seq];
        if r.len() <= layer {
            r.resize(layer + 1, None);
        }
        &mut r[layer]
    }

    /// Replaces the row of `(seq, layer)`.
    pub(crate) fn set(&mut self, seq: usize, layer: usize, row: Tensor<B, 2>) {
        *self.slot(seq, layer) = Some(row);
    }

    /// Adds `row` to the row of `(seq, layer)`, zero-padding the shorter one.
    pub(crate) fn add(&mut self, seq: usize, layer: usize, row: Tensor<B, 2>) {
        let slot = self.slot(seq, layer);
        *slot = Some(match slot.take() {
            None => row,
            Some(old) => {
                let len = old.dims()[1].max(row.dims()[1]);
                fit_last(old, len) + fit_last(row, len)
            }
        });
    }

    /// Whether any row was recorded for `layer`.
    pub(crate) fn has_layer(&self, layer: usize) -> bool {
        self.rows
            .iter()
            .any(|r| r.get(layer).is_some_and(Option::is_some))
    }

    /// The rows of `layer` for `batch` sequences as `[batch, kv_heads, c]` (zero-padded or
    /// truncated to `c`; sequences without a row get zeros). The last one made for `layer` is
    /// kept and returned again while its shape is asked for and no row of `layer` changed.
    pub(crate) fn batched(
        &mut self,
        layer: usize,
        batch: usize,
        kv_heads: usize,
        c: usize,
        device: &B::Device,
    ) -> Tensor<B, 3> {
        if let Some(t) = self.made.get(layer).and_then(Option::as_ref) {
            if t.dims() == [batch, kv_heads, c] {
                return t.clone();
            }
        }
        let rows: Vec<Tensor<B, 3>> = (0..batch)
            .map(|s| {
                match self
                    .rows
                    .get(s)
                    .and_then(|r| r.get(layer))
                    .and_then(Option::as_ref)
                {
                    Some(t) => fit_last(t.clone(), c).unsqueeze_dim(0),
                    None => Tensor::zeros([1, kv_heads, c], device),
                }
            })
            .collect();
        let t = Tensor::cat(rows, 0);
        if self.made.len() <= layer {
            self.made.resize(layer + 1, None);
        }
        self.made[layer] = Some(t.clone());
        t
    }

    /// The recorded rows of `layer`, one per sequence that has one.
    pub(crate) fn layer_rows(&self, layer: usize) -> impl Iterator<Item = Tensor<B, 2>> + '_ {
        self.rows
            .iter()
            .filter_map(move |r| r.get(layer).and_then(Option::clone))
    }

    /// Drops `layer`'s rows (after they were moved into a batched state).
    pub(crate) fn take_layer(&mut self, layer: usize) {
        if let Some(m) = self.made.get_mut(layer) {
            *m = None;
        }
        for r in &mut self.rows {
            if let Some(x) = r.get_mut(layer) {
                *x = None;
            }
        }
    }

    /// Keeps the sequences `keep` (ascending indices).
    pub(crate) fn retain(&mut self, keep: &[usize]) {
        self.made.clear();
        let old = std::mem::take(&mut self.rows);
        self.rows = keep
            .iter()
            .map(|&k| old.get(k).cloned().unwrap_or_default())
            .collect();
    }
}

/// The sequence index of a prefill call, checking that it is a batch-1 pass as
/// [`Phase::Prefill`] promises.
pub(crate) fn prefill_seq<B: Backend>(ctx: &LayerAttnCtx<'_, B>) -> Result<Option<(usize, bool)>> {
    match ctx.phase {
        Phase::Prefill { seq, last_chunk } => {
            let b = ctx.q.dims()[0];
            if b != 1 || ctx.ctx_lens.len() != 1 {
                return Err(CoreError::invalid(
                    "prefill batch",
                    "1 sequence per prefill call",
                    b,
                ));
            }
            Ok(Some((seq, last_chunk)))
        }
        Phase::Decode => Ok(None),
    }
}

/// The keys of the one sequence of a prefill call, `[1, kv_heads, ctx + n, head_dim]`: the
/// model's view is padded past them (`dustin_qwen::KV_VIEW_MULTIPLE`), and a prompt
/// observation that read the view's width would take padding positions for prompt ones
/// (SnapKV's window at the wrong end, calibration over the wrong free range).
pub(crate) fn prefill_keys<B: Backend>(ctx: &LayerAttnCtx<'_, B>) -> Tensor<B, 4> {
    let keys = ctx.ctx_lens[0] + ctx.q.dims()[2];
    let l = ctx.k.dims()[2];
    ctx.k.clone().narrow(2, 0, keys.min(l))
}

/// The width scores are built at: the keys' (the model's view, padded past the contexts by
/// `dustin_qwen::KV_VIEW_MULTIPLE`), at least `max(ctx)`. Not `max(ctx)` itself: that changes
/// at every step, and each new shape can mean new kernels to compile on CUDA
/// (docs/decisions.md); the top-k step ignores the columns past each context.
///
/// # Errors
/// As [`max_ctx`].
pub(crate) fn score_width<B: Backend>(ctx: &LayerAttnCtx<'_, B>) -> Result<usize> {
    Ok(max_ctx(ctx)?.max(ctx.k.dims()[2]))
}

/// Checks that `lens` matches the batch of the layer.
pub(crate) fn max_ctx<B: Backend>(ctx: &LayerAttnCtx<'_, B>) -> Result<usize> {
    let b = ctx.q.dims()[0];
    if ctx.ctx_lens.len() != b || ctx.k.dims()[0] != b {
        return Err(CoreError::Shape {
            name: "keys".into(),
            expected: vec![ctx.ctx_lens.len()],
            found: vec![ctx.k.dims()[0]],
        });
    }
    Ok(ctx.ctx_lens.iter().copied().max().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::PromptRows;
    use burn_flex::{Flex, FlexDevice};
    use burn_tensor::{Tensor, TensorData};

    fn row(v: &[f32]) -> Tensor<Flex, 2> {
        Tensor::from_data(TensorData::new(v.to_vec(), [1, v.len()]), &FlexDevice)
    }

    fn values(t: Tensor<Flex, 3>) -> Vec<f32> {
        t.into_data().to_vec::<f32>().unwrap()
    }

    /// The kept batch is the one made from the rows as they are now: a changed row, another
    /// width, a sequence gone or a reset each make it anew.
    #[test]
    fn the_kept_batch_follows_the_rows() {
        let dev = FlexDevice;
        let mut p = PromptRows::<Flex>::default();
        p.reset(2, 2);
        p.set(0, 1, row(&[1.0, 2.0, 3.0]));
        p.set(1, 1, row(&[4.0, 5.0]));
        let first = values(p.batched(1, 2, 1, 4, &dev));
        assert_eq!(first, vec![1.0, 2.0, 3.0, 0.0, 4.0, 5.0, 0.0, 0.0]);
        // asked again: the same values (the kept tensor)
        assert_eq!(values(p.batched(1, 2, 1, 4, &dev)), first);
        // another width: padded or cut from the rows
        assert_eq!(
            values(p.batched(1, 2, 1, 2, &dev)),
            vec![1.0, 2.0, 4.0, 5.0]
        );
        assert_eq!(
            values(p.batched(1, 2, 1, 5, &dev)),
            vec![1.0, 2.0, 3.0, 0.0, 0.0, 4.0, 5.0, 0.0, 0.0, 0.0]
        );
        // a row replaced or added to
        p.set(1, 1, row(&[7.0]));
        assert_eq!(
            values(p.batched(1, 2, 1, 5, &dev)),
            vec![1.0, 2.0, 3.0, 0.0, 0.0, 7.0, 0.0, 0.0, 0.0, 0.0]
        );
        p.add(0, 1, row(&[1.0, 1.0, 1.0, 1.0]));
        assert_eq!(
            values(p.batched(1, 2, 1, 5, &dev)),
            vec![2.0, 3.0, 4.0, 1.0, 0.0, 7.0, 0.0, 0.0, 0.0, 0.0]
        );
        // the first sequence leaves: the second is now row 0
        p.retain(&[1]);
        assert_eq!(
            values(p.batched(1, 1, 1, 5, &dev)),
            vec![7.0, 0.0, 0.0, 0.0, 0.0]
        );
        // another layer's row does not touch layer 1's batch; taking layer 1 empties it
        p.set(0, 0, row(&[9.0]));
        assert_eq!(
            values(p.batched(1, 1, 1, 5, &dev)),
            vec![7.0, 0.0, 0.0, 0.0, 0.0]
        );
        p.take_layer(1);
        assert_eq!(values(p.batched(1, 1, 1, 5, &dev)), vec![0.0; 5]);
        p.set(0, 1, row(&[6.0]));
        p.reset(1, 2);
        assert_eq!(values(p.batched(1, 1, 1, 2, &dev)), vec![0.0; 2]);
    }
}
