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
//! Dynamic (recomputed every verification). The only state is a cache of the bounds of
//! *full* pages (every position below the context of the call that computed them): those
//! positions are committed and never change, so the cache survives rollback (which only drops
//! positions past the context); it is dropped at reset and retain. In a ragged batch the cache
//! holds the pages below the shortest context, and the pages past it are bounded per sequence
//! at each call ([`dustin_kernels::SelectionOps::quest_page_bounds`]). Quest maintains the bounds
//! as keys are written; the cache gives the same cost profile without a hook into the KV
//! cache.

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

/// Cached per-page key bounds of one layer: `[batch, kv_heads, pages, head_dim]`.
#[derive(Debug, Clone)]
struct Bounds<B: Backend> {
    pages: usize,
    kmin: Tensor<B, 4>,
    kmax: Tensor<B, 4>,
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

    /// Bounds of the pages of `k` `[batch, kv_heads, >= full * page_size, head_dim]` whose
    /// every position is below every sequence's context (`full` pages, all committed): `(kmin,
    /// kmax)` `[batch, kv_heads, full, head_dim]` from the cache of `layer`, extended with the
    /// pages not cached yet and stored; `None` for `full` 0.
    fn full_page_bounds(
        &mut self,
        layer: usize,
        k: &Tensor<B, 4>,
        full: usize,
    ) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        let p = self.cfg.page_size;
        let [b, kvh, _, d] = k.dims();
        if self.bounds.len() <= layer {
            self.bounds.resize(layer + 1, None);
        }
        let cached = self.bounds[layer]
            .take()
            .filter(|x| x.pages <= full && x.kmin.dims()[0] == b && x.kmin.dims()[1] == kvh);
        let from = cached.as_ref().map_or(0, |x| x.pages);
        let (mut kmin, mut kmax) = match cached {
            Some(x) => (Some(x.kmin), Some(x.kmax)),
            None => (None, None),
        };
        if full > from {
            let new = k
                .clone()
                .slice([0..b, 0..kvh, from * p..full * p, 0..d])
                .reshape([b, kvh, full - from, p, d]);
            let nmin = new.clone().min_dim(3).reshape([b, kvh, full - from, d]);
            let nmax = new.max_dim(3).reshape([b, kvh, full - from, d]);
            kmin = Some(match kmin {
                Some(m) => Tensor::cat(vec![m, nmin], 2),
                None => nmin,
            });
            kmax = Some(match kmax {
                Some(m) => Tensor::cat(vec![m, nmax], 2),
                None => nmax,
            });
        }
        let (kmin, kmax) = (kmin?, kmax?);
        self.bounds[layer] = Some(Bounds {
            pages: full,
            kmin: kmin.clone(),
            kmax: kmax.clone(),
        });
        Some((kmin, kmax))
    }

    /// Page bounds of `k` `[batch, kv_heads, >= max ctx, head_dim]` for contexts `ctx_lens`
    /// (max `c`): `(kmin, kmax)` `[batch, kv_heads, ceil(c / page_size), head_dim]`. The pages
    /// below the shortest context come from the cache ([`Self::full_page_bounds`]); the rest
    /// are computed: the partial last page when every context is `c`, else through
    /// [`dustin_kernels::SelectionOps::quest_page_bounds`] over the tail, whose pages at or past
    /// a sequence's context are 0 (their scores are then 0 as well, and the top-k never reads
    /// past a context).
    ///
    /// # Errors
    /// The kernel's errors, as [`CoreError`].
    fn bounds(
        &mut self,
        layer: usize,
        k: &Tensor<B, 4>,
        ctx_lens: &[usize],
        c: usize,
    ) -> Result<(Tensor<B, 4>, Tensor<B, 4>)>
    where
        B: dustin_kernels::KernelOps,
    {
        let p = self.cfg.page_size;
        let [b, kvh, _, d] = k.dims();
        let shortest = ctx_lens.iter().copied().min().unwrap_or(0);
        let full = shortest / p;
        let head = self.full_page_bounds(layer, k, full);
        let tail = if full * p >= c {
            None
        } else if shortest == c {
            let last = k.clone().slice([0..b, 0..kvh, full * p..c, 0..d]);
            Some((last.clone().min_dim(2), last.max_dim(2)))
        } else {
            let rel: Vec<usize> = ctx_lens.iter().map(|&l| l - full * p).collect();
            let tail = k.clone().slice([0..b, 0..kvh, full * p..c, 0..d]);
            Some(B::quest_page_bounds(tail, &rel, p).map_err(crate::topk::kernel_error)?)
        };
        Ok(match (head, tail) {
            (Some((hmin, hmax)), Some((tmin, tmax))) => (
                Tensor::cat(vec![hmin, tmin], 2),
                Tensor::cat(vec![hmax, tmax], 2),
            ),
            (Some(h), None) => h,
            (None, Some(t)) => t,
            (None, None) => {
                let dev = k.device();
                (
                    Tensor::zeros([b, kvh, 1, d], &dev),
                    Tensor::zeros([b, kvh, 1, d], &dev),
                )
            }
        })
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
        let pages = if c > 0 {
            let (kmin, kmax) = self.bounds(a.layer, a.k, a.ctx_lens, c)?;
            // the fused page-scoring kernel where the backend has one: Burn's matmul here
            // would be re-autotuned whenever the page count changes (its tuning key holds the
            // shapes' power-of-two alignment)
            let fused = if B::FUSED {
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
        Ok(Scores::Tokens(fit_last(tokens, score_width(a)?)))
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
