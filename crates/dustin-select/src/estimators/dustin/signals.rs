//! The signals of the score: the estimator heads' contribution of a verification (kept
//! pending until commit), its fold into the history, and the mix with the lookahead.

use burn_tensor::{backend::Backend, Tensor, TensorData};
use dustin_core::{Result, ScoreCtx};
use dustin_kernels::KernelOps;

use super::*;

impl<B: KernelOps> Dustin<B> {
    /// The estimator heads' exact attention of this verification, `[batch, kv_heads, n,
    /// keys]` with its fold weights (see [`Pending`]), also kept pending for
    /// [`ImportanceEstimator::commit`].
    pub(super) fn contribution(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Pending<B>> {
        let a = ctx.attn;
        let [b, nh, n, _] = a.q.dims();
        let [_, kvh, l, _] = a.k.dims();
        let g = nh / kvh.max(1);
        let device = a.k.device();
        let heads = self.layer_heads(a.layer, nh, keep_rule(ctx))?;
        let e = heads.len();
        if B::SELECTION_KERNELS {
            if let Some(c) = self.fused_contribution(ctx, &heads)? {
                self.pending[a.layer] = Some(c.clone());
                return Ok(c);
            }
        }
        // exact attention of the estimator heads only: [b, e, n, l]
        let probs = head_probs(a.q.clone(), a.k.clone(), &heads, g, a.ctx_lens, a.scale);
        let mut mix = vec![0.0f32; kvh * e];
        for j in 0..kvh {
            let own: Vec<usize> = (0..e).filter(|&i| heads[i] / g == j).collect();
            let from = if own.is_empty() {
                (0..e).collect()
            } else {
                own
            };
            for &i in &from {
                mix[j * e + i] = 1.0 / from.len() as f32;
            }
        }
        let mix = Tensor::<B, 3>::from_data(TensorData::new(mix, [1, kvh, e]), &device)
            .expand([b, kvh, e]);
        let contrib = mix
            .matmul(probs.reshape([b, e, n * l]))
            .reshape([b, kvh, n, l]);
        let c = Pending {
            rows: contrib,
            own: vec![1.0; kvh],
            all: vec![0.0; kvh],
        };
        self.pending[a.layer] = Some(c.clone());
        Ok(c)
    }

    /// [`Dustin::contribution`] from the backend's fused head-subset kernel
    /// ([`SelectionOps::head_subset_row_scores`](dustin_kernels::SelectionOps::head_subset_row_scores), which sums the chosen heads of each KV head):
    /// a KV head holding `c > 0` chosen heads takes its sum over `c`, one holding none the
    /// mean of all chosen heads, as in the plain path; [`SelectionOps::fold_rows`](dustin_kernels::SelectionOps::fold_rows) applies those
    /// weights. `None` where the kernel does not take the input.
    pub(super) fn fused_contribution(
        &mut self,
        ctx: &ScoreCtx<'_, B>,
        heads: &[usize],
    ) -> Result<Option<Pending<B>>> {
        let a = ctx.attn;
        let [_, nh, _, _] = a.q.dims();
        let kvh = a.k.dims()[1];
        let g = nh / kvh.max(1);
        let rows =
            match B::head_subset_row_scores(a.q.clone(), a.k.clone(), a.ctx_lens, heads, a.scale) {
                Ok(r) => r,
                Err(KernelError::Unsupported(_)) => return Ok(None),
                Err(e) => return Err(kernel_error(e)),
            };
        let layer = a.layer;
        self.grow(layer);
        let (own, all) = match self.head_weights[layer]
            .as_ref()
            .filter(|w| w.0.len() == kvh)
        {
            Some(w) => w.clone(),
            None => {
                let e = heads.len() as f32;
                let mut count = vec![0usize; kvh];
                for &h in heads {
                    count[h / g] += 1;
                }
                let own: Vec<f32> = count
                    .iter()
                    .map(|&c| if c > 0 { 1.0 / c as f32 } else { 0.0 })
                    .collect();
                let all: Vec<f32> = count
                    .iter()
                    .map(|&c| if c > 0 { 0.0 } else { 1.0 / e })
                    .collect();
                self.head_weights[layer] = Some((own.clone(), all.clone()));
                (own, all)
            }
        };
        Ok(Some(Pending { rows, own, all }))
    }
}

impl<B: Backend> Dustin<B> {
    /// Whether a verification that reuses a selection re-ranks it from the lookahead and
    /// the held history ([`DustinConfig::lookahead_on_reuse`] without
    /// [`DustinConfig::history_on_reuse`], a lookahead weight, and a lookahead to mix).
    pub(super) fn reranks_on_reuse(&self) -> bool {
        !self.cfg.history_on_reuse
            && self.cfg.lookahead_on_reuse
            && self.alpha != 0.0
            && self.lookahead.is_some()
    }
}

/// `factor[b] * hist + the pending rows folded with weights w` ([`SelectionOps::fold_rows`](dustin_kernels::SelectionOps::fold_rows)):
/// the backend's kernel where [`SelectionOps::estimator_kernels`](dustin_kernels::SelectionOps::estimator_kernels) says so, else Burn ops
/// ([`dustin_kernels::plain::fold_rows`]).
pub(super) fn fold<B: KernelOps>(
    hist: Tensor<B, 3>,
    factor: &[f32],
    c: Pending<B>,
    w: &[f32],
) -> Result<Tensor<B, 3>> {
    if B::estimator_kernels(&hist.device()).fold {
        B::fold_rows(Some(hist), factor, c.rows, w, &c.own, &c.all)
    } else {
        dustin_kernels::plain::fold_rows(Some(hist), factor, c.rows, w, &c.own, &c.all)
    }
    .map_err(kernel_error)
}

impl<B: KernelOps> Dustin<B> {
    /// `alpha * lookahead + (1 - alpha) * history`, each normalised over the free range
    /// (which lies below every context), over the first `c` positions; `history` is `[reps *
    /// batch, kv_heads, >= c]`: `reps` layers' histories stacked layer-major, each mixed with
    /// the same lookahead (1 for one layer). `c` may exceed the longest context: those
    /// columns score 0.
    pub(super) fn mix(
        &mut self,
        ctx: &ScoreCtx<'_, B>,
        history: Tensor<B, 3>,
        c: usize,
        reps: usize,
    ) -> Result<Tensor<B, 3>> {
        let a = ctx.attn;
        let [rows, kvh, _] = history.dims();
        let b = a.ctx_lens.len();
        if rows != reps * b {
            return Err(CoreError::Shape {
                name: "stacked history".into(),
                expected: vec![reps * b, kvh, c],
                found: history.dims().to_vec(),
            });
        }
        let keep = keep_rule(ctx);
        if B::estimator_kernels(&history.device()).mix {
            // one kernel: the mask, both sums and the mix
            let la = if self.alpha == 0.0 {
                None
            } else {
                let w = self.lookahead.as_ref().map_or(0, |t| t.dims()[1]);
                let la = lookahead_for(self.lookahead.as_ref(), b, w)?;
                Some(if reps > 1 { la.repeat_dim(0, reps) } else { la })
            };
            let free: Vec<(usize, usize)> =
                a.ctx_lens.iter().map(|&l| keep.free_range(l)).collect();
            return B::mix_scores(history, la, &free.repeat(reps), self.alpha as f32, c)
                .map_err(kernel_error);
        }
        let shared = match self.shared.take() {
            Some(s)
                if s.c == c
                    && s.keep == keep
                    && s.ctx_lens == a.ctx_lens
                    && s.mask.device() == history.device() =>
            {
                s
            }
            _ => {
                let device = history.device();
                let mask = free_mask::<B>(a.ctx_lens, c, keep, &device);
                let la_n = if self.alpha == 0.0 {
                    None
                } else {
                    let la = lookahead_for(self.lookahead.as_ref(), b, c)?.reshape([b, 1, c]);
                    Some(normalise_on(la, &mask))
                };
                MixShared {
                    ctx_lens: a.ctx_lens.to_vec(),
                    c,
                    keep,
                    mask,
                    la_n,
                }
            }
        };
        // the batch's mask and lookahead tiled once per stacked layer
        let tile = |t: &Tensor<B, 3>| {
            if reps > 1 {
                t.clone().repeat_dim(0, reps)
            } else {
                t.clone()
            }
        };
        let hist_n = normalise_on(history.narrow(2, 0, c), &tile(&shared.mask));
        let scores = match &shared.la_n {
            None => hist_n,
            Some(la_n) => {
                let alpha = self.alpha as f32;
                tile(la_n).expand([rows, kvh, c]).mul_scalar(alpha) + hist_n.mul_scalar(1.0 - alpha)
            }
        };
        self.shared = Some(shared);
        Ok(scores)
    }
}
