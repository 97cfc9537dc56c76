//! `quest`: query-aware page selection from per-page key bounds (Quest, Tang et al. 2024,
//! "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference").
//!
//! Reads, at every verification: queries `[batch, heads, n, head_dim]` and the context keys
//! `[batch, kv_heads, ctx, head_dim]`. The context is cut into pages of `page_size` tokens;
//! per page and KV head the elementwise `min` and `max` of its keys (positions `< ctx_b`
//! only) bound `q . k` from above: page score `sum_d max(q_d * min_d, q_d * max_d)` per query
//! head, computed as `relu(q) . max + min(q, 0) . min` (two matmuls, same value). The page
//! score is aggregated (max) over the group's heads and the new queries
//! ([`page_scores`], `[batch, kv_heads, pages]`), and every token gets its page's score:
//! writes `[batch, kv_heads, ctx]`.
//!
//! Dynamic (recomputed every verification). The only state is a per-layer buffer of page
//! bounds as wide as the KV cache's capacity, holding the bounds of *full* pages (every
//! position below the context of the call that computed them): those positions are committed
//! and never change, so the buffer survives rollback (which only drops positions past the
//! context); it is dropped at reset and retain. Each call writes the pages that became full
//! and the partial ones past them in place: in a ragged batch the pages past the shortest
//! context are bounded per sequence at each call
//! ([`dustin_kernels::SelectionOps::quest_page_bounds`]). Quest maintains the bounds as keys
//! are written; the buffer gives the same cost profile without a hook into the KV cache.

use burn_tensor::{backend::Backend, Int, Tensor};
use dustin_core::{CoreError, ImportanceEstimator, Result, ScoreCtx, Scores};
use serde::{Deserialize, Serialize};

use super::prompt::{max_ctx, score_width};
use crate::{attn::fit_last, topk::lens_tensor};

/// Knobs of [`Quest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuestConfig {
    /// Tokens per page. Default 16: Quest's page size.
    pub page_size: usize,
}

impl Default for QuestConfig {
    fn default() -> Self {
        Self { page_size: 16 }
    }
}

/// Per-page key bounds of one layer, `[batch, kv_heads, room, head_dim]` each: pages `0 ..
/// full` hold the bounds of full, committed pages; the pages past them are scratch for the
/// call's partial pages. Written in place, so a call copies only the pages it computes.
#[derive(Debug, Clone)]
struct Bounds<B: Backend> {
    full: usize,
    kmin: Tensor<B, 4>,
    kmax: Tensor<B, 4>,
}

impl<B: Backend> Bounds<B> {
    fn room(&self) -> usize {
        self.kmin.dims()[2]
    }
}

/// Quest's page upper bounds, recomputed at every verification.
#[derive(Debug, Clone)]
pub struct Quest<B: Backend> {
    cfg: QuestConfig,
    bounds: Vec<Option<Bounds<B>>>,
}

impl<B: Backend> Quest<B> {
    /// An estimator with `cfg`.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming `page_size` when it is 0.
    pub fn new(cfg: QuestConfig) -> Result<Self> {
        if cfg.page_size == 0 {
            return Err(CoreError::invalid("page_size", "at least 1", 0));
        }
        Ok(Self {
            cfg,
            bounds: Vec::new(),
        })
    }

    /// The bounds buffers of `layer` for keys `k` `[batch, kv_heads, keys, head_dim]` with
    /// room for `pages` pages: the cached one where its batch, KV heads and head width match
    /// and it has the room (its full pages kept only if at most `full`), else a new one of
    /// `max(ceil(keys / page_size), pages) * 9 / 8` pages, the cached full pages copied over.
    /// The eighth more is our choice: the keys grow with the context, and a buffer that
    /// grows by an eighth is copied once per eighth of the context (0.8% of the KV cache's
    /// bytes more at Quest's page of 16 tokens).
    fn buffer(&mut self, layer: usize, k: &Tensor<B, 4>, pages: usize, full: usize) -> Bounds<B> {
        let p = self.cfg.page_size;
        let [b, kvh, cap, d] = k.dims();
        if self.bounds.len() <= layer {
            self.bounds.resize(layer + 1, None);
        }
        // pages past the shortest context were never full for it: recomputed
        let cached = self.bounds[layer]
            .take()
            .filter(|x| {
                let [xb, xh, _, xd] = x.kmin.dims();
                (xb, xh, xd) == (b, kvh, d)
            })
            .map(|x| Bounds {
                full: x.full.min(full),
                ..x
            });
        match cached {
            Some(x) if x.room() >= pages => x,
            old => {
                let room = cap.div_ceil(p).max(pages);
                let room = room + room / 8;
                // in the keys' dtype (bf16 on CUDA, where the backend's default may differ)
                let opts = (&k.device(), k.dtype());
                let (mut kmin, mut kmax) = (
                    Tensor::zeros([b, kvh, room, d], opts),
                    Tensor::zeros([b, kvh, room, d], opts),
                );
                let kept = old.as_ref().map_or(0, |x| x.full);
                if let Some(x) = old.filter(|_| kept > 0) {
                    let r = [0..b, 0..kvh, 0..kept, 0..d];
                    kmin = kmin.slice_assign(r.clone(), x.kmin.slice(r.clone()));
                    kmax = kmax.slice_assign(r.clone(), x.kmax.slice(r));
                }
                Bounds {
                    full: kept,
                    kmin,
                    kmax,
                }
            }
        }
    }

    /// Page bounds of `k` `[batch, kv_heads, >= max ctx, head_dim]` for contexts `ctx_lens`
    /// (max `c`): `(kmin, kmax)` `[batch, kv_heads, span, head_dim]`, views of the layer's
    /// buffers (`span >= ceil(c / page_size)`; the pages past `ceil(c / page_size)` are the
    /// buffer's scratch, zero until written, and past every context, where the top-k masks
    /// their scores). The pages below the shortest context are full and committed:
    /// computed once and kept; the rest are computed at every call: the partial last page
    /// when every context is `c`, else through
    /// [`dustin_kernels::SelectionOps::quest_page_bounds`] over the tail, whose pages at or past
    /// a sequence's context are 0 (their scores are then 0 as well, and the top-k never reads
    /// past a context). On a backend with fused kernels (CUDA) every bound comes from that
    /// kernel, never from Burn's reductions (autotuned there for each new shape).
    ///
    /// # Errors
    /// The kernel's errors, as [`CoreError`].
    fn bounds(
        &mut self,
        layer: usize,
        k: &Tensor<B, 4>,
        ctx_lens: &[usize],
        c: usize,
        span: usize,
    ) -> Result<(Tensor<B, 4>, Tensor<B, 4>)>
    where
        B: dustin_kernels::KernelOps,
    {
        let p = self.cfg.page_size;
        let [b, kvh, _, d] = k.dims();
        let shortest = ctx_lens.iter().copied().min().unwrap_or(0);
        let full = shortest / p;
        let pages = c.div_ceil(p);
        let span = span.max(pages);
        let mut buf = self.buffer(layer, k, span, full);
        // the full pages not kept yet
        if full > buf.full {
            let from = buf.full;
            let new = k.clone().slice([0..b, 0..kvh, from * p..full * p, 0..d]);
            let (nmin, nmax) = if B::FUSED {
                // the backend's kernel: Burn's reductions are autotuned per shape on CUDA, and
                // the count of new pages changes from call to call
                B::quest_page_bounds(new, &vec![(full - from) * p; b], p)
                    .map_err(crate::topk::kernel_error)?
            } else {
                let new = new.reshape([b, kvh, full - from, p, d]);
                (
                    new.clone().min_dim(3).reshape([b, kvh, full - from, d]),
                    new.max_dim(3).reshape([b, kvh, full - from, d]),
                )
            };
            let r = [0..b, 0..kvh, from..full, 0..d];
            buf.kmin = buf.kmin.slice_assign(r.clone(), nmin);
            buf.kmax = buf.kmax.slice_assign(r, nmax);
            buf.full = full;
        }
        // the partial pages, into the scratch past the full ones
        if full < pages {
            let (tmin, tmax) = if shortest == c && !B::FUSED {
                let last = k.clone().slice([0..b, 0..kvh, full * p..c, 0..d]);
                (last.clone().min_dim(2), last.max_dim(2))
            } else {
                let rel: Vec<usize> = ctx_lens.iter().map(|&l| l - full * p).collect();
                let tail = k.clone().slice([0..b, 0..kvh, full * p..c, 0..d]);
                B::quest_page_bounds(tail, &rel, p).map_err(crate::topk::kernel_error)?
            };
            let r = [0..b, 0..kvh, full..pages, 0..d];
            buf.kmin = buf.kmin.slice_assign(r.clone(), tmin);
            buf.kmax = buf.kmax.slice_assign(r, tmax);
        }
        let out = (
            buf.kmin.clone().narrow(2, 0, span),
            buf.kmax.clone().narrow(2, 0, span),
        );
        self.bounds[layer] = Some(buf);
        Ok(out)
    }
}

/// Quest's page scores `[batch, kv_heads, ceil(ctx / page_size)]` (`ctx` = the largest
/// context): per query head `sum_d max(q_d * min_d, q_d * max_d)` over the page's keys
/// at positions `< ctx_lens[b]`, maximised over the GQA group's heads and the `n` queries.
/// Pages that start at or past `ctx_lens[b]` score 0 (they hold no context of `b`).
///
/// `q` is `[batch, heads, n, head_dim]`, `k` `[batch, kv_heads, >= ctx, head_dim]`.
pub fn page_scores<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    ctx_lens: &[usize],
    page_size: usize,
) -> Tensor<B, 3> {
    let [b, _, _, d] = q.dims();
    let [_, kvh, _, _] = k.dims();
    let c = ctx_lens.iter().copied().max().unwrap_or(0);
    if c == 0 {
        return Tensor::zeros([b, kvh, 1], &q.device());
    }
    let pages = c.div_ceil(page_size);
    let cp = pages * page_size;
    let device = q.device();
    let keys = fit_last(k.clone().narrow(2, 0, c).swap_dims(2, 3), cp).swap_dims(2, 3);
    let lens = lens_tensor::<B>(ctx_lens, &device);
    let pos = Tensor::<B, 1, Int>::arange(0..cp as i64, &device)
        .reshape([1, 1, cp, 1])
        .expand([b, kvh, cp, d]);
    let absent = pos.greater_equal(lens.clone().reshape([b, 1, 1, 1]).expand([b, kvh, cp, d]));
    let kmin = keys
        .clone()
        .mask_fill(absent.clone(), f32::INFINITY)
        .reshape([b, kvh, pages, page_size, d])
        .min_dim(3)
        .reshape([b, kvh, pages, d]);
    let kmax = keys
        .mask_fill(absent, f32::NEG_INFINITY)
        .reshape([b, kvh, pages, page_size, d])
        .max_dim(3)
        .reshape([b, kvh, pages, d]);
    let start = Tensor::<B, 1, Int>::arange_step(0..cp as i64, page_size, &device)
        .reshape([1, 1, pages, 1])
        .expand([b, kvh, pages, d]);
    let empty = start.greater_equal(lens.reshape([b, 1, 1, 1]).expand([b, kvh, pages, d]));
    let kmin = kmin.mask_fill(empty.clone(), 0.0);
    let kmax = kmax.mask_fill(empty, 0.0);
    bound_scores(q, kmin, kmax)
}

/// `sum_d max(q_d * min_d, q_d * max_d)` per query head and page, maximised over the group's
/// heads and the queries: `q` `[batch, heads, n, d]`, bounds `[batch, kv_heads, pages, d]`
/// -> `[batch, kv_heads, pages]`.
fn bound_scores<B: Backend>(
    q: &Tensor<B, 4>,
    kmin: Tensor<B, 4>,
    kmax: Tensor<B, 4>,
) -> Tensor<B, 3> {
    let [b, nh, n, d] = q.dims();
    let [_, kvh, pages, _] = kmin.dims();
    let g = nh / kvh.max(1);
    let qg = q.clone().reshape([b, kvh, g * n, d]);
    let s = qg.clone().clamp_min(0.0).matmul(kmax.swap_dims(2, 3))
        + qg.clamp_max(0.0).matmul(kmin.swap_dims(2, 3));
    s.max_dim(2).reshape([b, kvh, pages])
}

impl<B: dustin_kernels::KernelOps> ImportanceEstimator<B> for Quest<B> {
    fn name(&self) -> String {
        "quest".into()
    }

    fn reset(&mut self, _batch: usize, _num_layers: usize) {
        self.bounds.clear();
    }

    fn retain(&mut self, _keep: &[usize]) {
        self.bounds.clear();
    }

    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        let a = ctx.attn;
        let c = max_ctx(a)?;
        let p = self.cfg.page_size;
        let width = score_width(a)?;
        let pages = if c > 0 {
            // every page the scores' width covers, so that the pages' tokens fill that width
            // (exactly where the page size divides it, as the default's 16 divides the KV
            // views' multiples of 64) and no zeros are concatenated: on CUDA that padding's
            // kernels were compiled inside timed iterations, once for each new pad width
            let (kmin, kmax) = self.bounds(a.layer, a.k, a.ctx_lens, c, width.div_ceil(p))?;
            // the backend's page-scoring kernel where it has one: on CUDA Burn's matmul here
            // would be re-autotuned whenever the page count changes (its tuning key holds the
            // shapes' power-of-two alignment); on the CPU the host kernel reads each page's
            // bounds once for all the group's rows
            let fused = if B::FUSED || B::SELECTION_KERNELS {
                match B::quest_page_scores(a.q.clone(), kmin.clone(), kmax.clone(), a.ctx_lens, p) {
                    Ok(s) => Some(s),
                    Err(dustin_kernels::KernelError::Unsupported(_)) => None,
                    Err(e) => return Err(crate::topk::kernel_error(e)),
                }
            } else {
                None
            };
            match fused {
                Some(s) => s,
                None => bound_scores(a.q, kmin, kmax),
            }
        } else {
            page_scores(a.q, a.k, a.ctx_lens, p)
        };
        let [b, kvh, np] = pages.dims();
        // every token its page's score, over the keys' (padded) width rather than max(ctx),
        // which changes at every step (`score_width`); the top-k ignores columns past each
        // context
        let tokens = pages
            .reshape([b, kvh, np, 1])
            .expand([b, kvh, np, p])
            .reshape([b, kvh, np * p]);
        Ok(Scores::Tokens(fit_last(tokens, width)))
    }
}

/// One page summary (min and max key: 1 token-equivalent) per page and KV head. Quest keeps
/// the summaries up to date as keys are written; this implementation recomputes them from the
/// keys at each call, which is an implementation shortcut, not the method's cost.
impl<B: Backend> crate::EstimationCost for Quest<B> {
    fn score_reads(&self, _layer: usize, ctx: usize, kv_heads: usize, _heads: usize) -> f64 {
        (kv_heads * ctx.div_ceil(self.cfg.page_size)) as f64
    }
}
