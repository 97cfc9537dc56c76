//! `dustin`: draft lookahead + decayed target history on a head subset (Dustin,
//! arXiv 2606.24957, ICML 2026; DESIGN.md "Dustin as this project implements it").
//!
//! Per layer and KV head the score over context positions is
//! `alpha * norm(lookahead) + (1 - alpha) * norm(history)`, `norm` scaling a row to sum 1 over
//! the positions the top-k step actually chooses among (`[n_sink, ctx_b - window)`; sinks and
//! window are kept anyway and would otherwise set the scale of both signals).
//!
//! Reads and writes:
//! - prefill, last chunk of sequence `s` (queries `[1, heads, n, head_dim]`, keys
//!   `[1, kv_heads, P, head_dim]`): the last `obs_window` queries' causal attention, all heads
//!   `[1, kv_heads, group, w, P]`. It **seeds the history** of `(s, layer)` (`[kv_heads, P]`,
//!   mean over the group's heads, folded query by query with decay `beta`) and keeps the
//!   per-head mass `[heads, P]` (summed over the `w` queries) to **calibrate the estimator
//!   heads** at the layer's first verification, when the budget is known (the selector passes
//!   it, with the sinks and window, in [`ScoreCtx`]; a [`Pyramid`](crate::Pyramid) layer
//!   calibrates at its own budget): per query head, the recall of its top-k (over the free
//!   range, `k` = the free budget) against the all-head top-k, summed over the batch's
//!   sequences; the best `heads_per_layer` heads are chosen (or `heads` fixes them).
//! - verification (queries `[batch, heads, n, head_dim]`, keys
//!   `[batch, kv_heads, keys, head_dim]`): exact causal attention of the estimator heads only
//!   (`q_h k^T` for `h` in the subset: `[batch, e, n, keys]`), mapped to KV heads (mean of the
//!   KV head's own estimator heads, or of all the layer's estimator heads when it has none):
//!   the per-query contribution `[batch, kv_heads, n, keys]`. The score uses the history
//!   *provisionally* advanced by all `n` rows; the contribution is kept **pending**. A
//!   verification that reuses an earlier selection computes the same contribution
//!   ([`ImportanceEstimator::observe_verify`]), so the history follows every verified token,
//!   not only those of refresh iterations.
//! - commit (`accepted[b]`): only rows `0 ..= accepted[b]` of the pending contribution are
//!   folded into the history, one decay step per accepted query:
//!   `H <- beta^(a+1) H + sum_{i<=a} (1 - beta) beta^(a-i) C_i` (rollback of rejected drafts).
//!   History `[batch, kv_heads, len]` per layer; zero at positions a sequence has not
//!   committed.
//! - lookahead `[batch, ctx']` (from the draft, per verification; dropped at commit): the
//!   `alpha` part, broadcast to every layer and KV head.
//!
//! `history-only` ([`super::history_only`]) is this estimator with `alpha = 0`.

use burn_tensor::{backend::Backend, DType, Tensor, TensorData};
use dustin_core::{CoreError, ImportanceEstimator, LayerAttnCtx, Result, ScoreCtx, Scores};
use serde::{Deserialize, Serialize};

use super::draft_only::lookahead_for;
use super::prompt::{max_ctx, prefill_keys, prefill_seq, score_width, PromptRows};
use crate::attn::{fit_last, free_mask, grouped_probs, head_probs, normalise_on};
use crate::topk::kernel_error;
use crate::{EstimationCost, KeepRule, SelectConfig};
use dustin_kernels::{KernelError, KernelOps};

mod calib;
mod signals;
#[cfg(test)]
mod tests;

use signals::fold;

/// The recommended refresh of a `dustin` selection: 2, a new selection every second
/// verification, with the default [`DustinConfig`] (`history_on_reuse = false`,
/// `lookahead_on_reuse = true`): the estimator heads are read only when the selection is
/// recomputed, and the verification in between re-ranks it with the draft's new lookahead and
/// the last history, reading nothing.
///
/// Measured on SmolLM2-135M at 4096 tokens, 3 PG-19 books (docs/fidelity.md, "Tuning"):
/// refresh 1 has KL(dense || sparse) 0.022 (budget 1/8) and 0.070 (1/16) for 0.25 of a dense
/// read in estimation; refresh 2 as here 0.024 and 0.082 for half of that (0.13); refresh 4,
/// 0.061 and 0.123 (0.06); refresh 4 without the lookahead re-ranking, 0.141 and 0.237.
/// DESIGN.md's multi-step verification window is this reuse.
pub const RECOMMENDED_REFRESH: usize = 2;

/// The recommended [`SelectConfig`] for `dustin` at `budget`: a new selection every
/// [`RECOMMENDED_REFRESH`] verifications, or earlier when acceptance halves (0.5: our choice;
/// moot at a refresh of 1); other fields at their defaults.
pub fn recommended_select_config(budget: usize) -> SelectConfig {
    SelectConfig {
        budget,
        refresh: RECOMMENDED_REFRESH,
        refresh_on_accept_drop: Some(0.5),
        ..SelectConfig::default()
    }
}

/// Knobs of [`Dustin`] (and [`HistoryOnly`](super::history_only::HistoryOnly), which ignores
/// `alpha`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DustinConfig {
    /// Weight of the normalised draft lookahead (the rest goes to the history). Default 0.5:
    /// our choice (equal weights), to be tuned in docs/fidelity.md.
    pub alpha: f64,
    /// Decay of the history per accepted query token. Default 0.8: our choice (a memory of
    /// about 5 tokens, one or two iterations at gamma = 4), to be tuned in docs/fidelity.md.
    pub beta: f64,
    /// Estimator heads per layer (query heads whose exact attention is computed).
    /// Default 2: our choice (the cost is reading the keys of at most 2 KV heads).
    pub heads_per_layer: usize,
    /// Fixed estimator heads (query-head indices, the same for every layer) instead of
    /// calibration. Default `None`: calibrate at prefill (DESIGN.md step 4).
    pub heads: Option<Vec<usize>>,
    /// Prompt-end queries that seed the history and calibrate the heads. Default 32: SnapKV's
    /// observation window (Li et al. 2024).
    pub obs_window: usize,
    /// `k` of the calibration's top-k recall. Default `None`: the selector's free budget
    /// (`budget - n_sink - window`), i.e. what the top-k step will choose.
    pub calib_top_k: Option<usize>,
    /// Whether a verification that reuses a selection (`refresh > 1`) still feeds the
    /// history (the estimator heads' attention, read every verification). Default `false`:
    /// the estimator heads are read only when the selection is recomputed (half the reads at
    /// `refresh = 2`), with a history that skips the reusing verifications; `true` makes the
    /// history follow every verified token at the full read cost (measured in
    /// docs/fidelity.md: the reuse then saves only the top-k step).
    pub history_on_reuse: bool,
    /// With `history_on_reuse = false`: whether a verification that reuses a selection still
    /// re-ranks it with the draft's new lookahead mixed with the last history (no KV reads:
    /// the lookahead comes from drafting, the history is held), instead of reusing the old
    /// selection as it is. Default `true`: our addition (docs/fidelity.md, "Lazy history");
    /// the lookahead of the tokens being verified is the freshest signal there is.
    pub lookahead_on_reuse: bool,
}

impl Default for DustinConfig {
    fn default() -> Self {
        Self {
            alpha: 0.5,
            beta: 0.8,
            heads_per_layer: 2,
            heads: None,
            obs_window: 32,
            calib_top_k: None,
            history_on_reuse: false,
            lookahead_on_reuse: true,
        }
    }
}

impl DustinConfig {
    /// Checks `alpha` in `[0, 1]`, `beta` in `[0, 1)`, `heads_per_layer >= 1`,
    /// `obs_window >= 1`, non-empty fixed heads and `calib_top_k >= 1`.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming the field.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.alpha) {
            return Err(CoreError::invalid(
                "alpha",
                "a weight in [0, 1]",
                self.alpha,
            ));
        }
        if !(0.0..1.0).contains(&self.beta) {
            return Err(CoreError::invalid("beta", "a decay in [0, 1)", self.beta));
        }
        if self.heads_per_layer == 0 {
            return Err(CoreError::invalid("heads_per_layer", "at least 1", 0));
        }
        if self.obs_window == 0 {
            return Err(CoreError::invalid("obs_window", "at least 1", 0));
        }
        if self.heads.as_ref().is_some_and(Vec::is_empty) {
            return Err(CoreError::invalid("heads", "at least one query head", "[]"));
        }
        if self.calib_top_k == Some(0) {
            return Err(CoreError::invalid("calib_top_k", "at least 1", 0));
        }
        Ok(())
    }
}

/// The Dustin estimator (see the module doc).
#[derive(Debug, Clone)]
pub struct Dustin<B: Backend> {
    cfg: DustinConfig,
    alpha: f64,
    name: &'static str,
    heads: Vec<Option<Vec<usize>>>,
    /// per (sequence, layer): the observation window's attention mass per query head
    /// `[heads, P]`, until the layer's heads are calibrated
    calib: PromptRows<B>,
    seeds: PromptRows<B>,
    hist: Vec<Option<Tensor<B, 3>>>,
    pending: Vec<Option<Pending<B>>>,
    lookahead: Option<Tensor<B, 2>>,
    /// What [`Dustin::mix`] computes alike for every layer of one verification; dropped with
    /// the lookahead.
    shared: Option<MixShared<B>>,
    /// Per layer, the `own` and `all` weights `[kv_heads]` of [`KernelOps::fold_rows`](dustin_kernels::SelectionOps::fold_rows) for
    /// the fused kernel's rows (fixed once the layer's heads are).
    head_weights: Vec<Option<(Vec<f32>, Vec<f32>)>>,
}

/// One verification's estimator-head attention of a layer, kept until commit: `rows`
/// `[batch, kv_heads, n, keys]` and the [`KernelOps::fold_rows`](dustin_kernels::SelectionOps::fold_rows) weights that map them to
/// the per-KV-head contribution (`own` 1 and `all` 0 when `rows` is the contribution).
#[derive(Debug, Clone)]
struct Pending<B: Backend> {
    rows: Tensor<B, 4>,
    own: Vec<f32>,
    all: Vec<f32>,
}

/// The layer-independent inputs of [`Dustin::mix`] for one verification: the free-range mask
/// `[batch, 1, c]` and the lookahead normalised on it `[batch, 1, c]` (`None` without a
/// lookahead), built for these context lengths, `c` and keep rule. Every layer of a
/// verification asks for the same ones, so they are built once per verification, not once
/// per layer (two small uploads and about ten element-wise launches per layer).
#[derive(Debug, Clone)]
struct MixShared<B: Backend> {
    ctx_lens: Vec<usize>,
    c: usize,
    keep: KeepRule,
    mask: Tensor<B, 3>,
    la_n: Option<Tensor<B, 3>>,
}

fn host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| CoreError::Other(Box::new(e)))
}

impl<B: Backend> Dustin<B> {
    /// An estimator with `cfg`. The sinks, window and budget (the free range the signals are
    /// normalised over, and the calibration's `k`) come with each [`ScoreCtx`].
    ///
    /// # Errors
    /// [`DustinConfig::validate`]'s.
    pub fn with_config(cfg: DustinConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            alpha: cfg.alpha,
            cfg,
            name: "dustin",
            heads: Vec::new(),
            calib: PromptRows::default(),
            seeds: PromptRows::default(),
            hist: Vec::new(),
            pending: Vec::new(),
            lookahead: None,
            shared: None,
            head_weights: Vec::new(),
        })
    }

    /// [`Dustin::with_config`], also checking the selector's config `select` (kept for
    /// callers that have one; the estimator reads sinks, window and budget from each
    /// [`ScoreCtx`]).
    ///
    /// # Errors
    /// [`DustinConfig::validate`]'s and [`SelectConfig::validate`]'s.
    pub fn new(cfg: DustinConfig, select: &SelectConfig) -> Result<Self> {
        select.validate()?;
        Self::with_config(cfg)
    }

    /// The same estimator without the lookahead (`alpha = 0`), named `history-only`.
    pub(crate) fn without_lookahead(mut self) -> Self {
        self.alpha = 0.0;
        self.name = "history-only";
        self
    }

    /// The config.
    pub fn config(&self) -> &DustinConfig {
        &self.cfg
    }

    /// The history of `layer`, `[batch, kv_heads, len]` (zero past each sequence's committed
    /// context), once a verification has materialised it.
    pub fn history(&self, layer: usize) -> Option<Tensor<B, 3>> {
        self.hist.get(layer).cloned().flatten()
    }

    /// The estimator heads (query-head indices, ascending) of `layer`, once chosen (at the
    /// first verification).
    pub fn estimator_heads(&self, layer: usize) -> Option<&[usize]> {
        self.heads.get(layer).and_then(|h| h.as_deref())
    }

    fn grow(&mut self, layer: usize) {
        if self.heads.len() <= layer {
            self.heads.resize(layer + 1, None);
            self.hist.resize(layer + 1, None);
            self.pending.resize(layer + 1, None);
            self.head_weights.resize(layer + 1, None);
        }
    }

    /// The history of `layer` fitted to `len` positions (seeded from prefill at first use).
    fn history_at(
        &mut self,
        layer: usize,
        batch: usize,
        kvh: usize,
        len: usize,
        device: &B::Device,
    ) -> Result<Tensor<B, 3>> {
        self.grow(layer);
        let h = match self.hist[layer].take() {
            Some(h) => h,
            None if self.seeds.has_layer(layer) => {
                let h = self.seeds.batched(layer, batch, kvh, len, device);
                self.seeds.take_layer(layer);
                h
            }
            None => Tensor::zeros([batch, kvh, len], device),
        };
        let [hb, hk, _] = h.dims();
        if hb != batch || hk != kvh {
            return Err(CoreError::Shape {
                name: format!("history of layer {layer}"),
                expected: vec![batch, kvh, len],
                found: h.dims().to_vec(),
            });
        }
        let h = fit_last(h, len);
        self.hist[layer] = Some(h.clone());
        Ok(h)
    }

    /// `(1 - beta) beta^(last - i)` for `i <= last`, 0 after.
    fn fold_weights(&self, last: usize, n: usize) -> Vec<f32> {
        let beta = self.cfg.beta;
        (0..n)
            .map(|i| {
                if i <= last {
                    ((1.0 - beta) * beta.powi((last - i) as i32)) as f32
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// The keep rule of the top-k step this score feeds.
fn keep_rule<B: Backend>(ctx: &ScoreCtx<'_, B>) -> KeepRule {
    KeepRule {
        budget: ctx.budget,
        n_sink: ctx.n_sink,
        window: ctx.window,
    }
}

/// Reads of the estimator heads: their attention over the whole context needs the keys (not
/// the values) of every KV head holding one of them, `0.5` token-equivalent per position.
impl<B: Backend> EstimationCost for Dustin<B> {
    fn score_reads(&self, layer: usize, ctx: usize, kv_heads: usize, heads: usize) -> f64 {
        let g = heads / kv_heads.max(1);
        let kv: std::collections::BTreeSet<usize> = self
            .estimator_heads(layer)
            .unwrap_or(&[])
            .iter()
            .map(|&h| h / g.max(1))
            .collect();
        0.5 * (kv.len() * ctx) as f64
    }

    fn observe_reads(&self, layer: usize, ctx: usize, kv_heads: usize, heads: usize) -> f64 {
        if self.cfg.history_on_reuse {
            self.score_reads(layer, ctx, kv_heads, heads)
        } else {
            0.0
        }
    }
}

impl<B: KernelOps> ImportanceEstimator<B> for Dustin<B> {
    fn name(&self) -> String {
        self.name.into()
    }

    fn reset(&mut self, batch: usize, num_layers: usize) {
        self.heads = vec![None; num_layers];
        self.calib.reset(batch, num_layers);
        self.seeds.reset(batch, num_layers);
        self.hist = vec![None; num_layers];
        self.pending = vec![None; num_layers];
        self.lookahead = None;
        self.shared = None;
        self.head_weights = vec![None; num_layers];
    }

    fn observe_prefill(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<()> {
        let Some((seq, true)) = prefill_seq(ctx)? else {
            return Ok(());
        };
        self.grow(ctx.layer);
        let [_, nh, n, d] = ctx.q.dims();
        // the prompt's keys, not the padded view's
        let keys = prefill_keys(ctx);
        let [_, kvh, l, _] = keys.dims();
        let g = nh / kvh.max(1);
        let w = self.cfg.obs_window.min(n);
        let device = ctx.k.device();
        let q = ctx.q.clone().slice([0..1, 0..nh, n - w..n, 0..d]);
        let probs = grouped_probs(q, keys.clone(), &[ctx.ctx_lens[0] + n - w], ctx.scale); // [1, kvh, g, w, l]
        let wts = Tensor::<B, 5>::from_data(
            TensorData::new(self.fold_weights(w - 1, w), [1, 1, 1, w, 1]),
            &device,
        );
        let seed = (probs.clone() * wts)
            .sum_dims(&[2, 3])
            .div_scalar(g as f32)
            .reshape([kvh, l]);
        self.seeds.set(seq, ctx.layer, seed);
        if self.cfg.heads.is_none() {
            self.calib
                .set(seq, ctx.layer, probs.sum_dim(3).reshape([nh, l]));
        }
        Ok(())
    }

    fn observe_lookahead(&mut self, lookahead: &Tensor<B, 2>) {
        self.lookahead = Some(lookahead.clone());
        self.shared = None;
    }

    fn wants_lookahead(&self) -> bool {
        self.alpha > 0.0
    }

    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>> {
        let a = ctx.attn;
        let width = score_width(a)?;
        let c = self.contribution(ctx)?;
        let [b, kvh, n, l] = c.rows.dims();
        let device = c.rows.device();
        let hist = self.history_at(a.layer, b, kvh, l, &device)?;
        // the history provisionally advanced by all n rows
        let w = self.fold_weights(n - 1, n).repeat(b);
        let factor = vec![self.cfg.beta.powi(n as i32) as f32; b];
        let provisional = fold::<B>(hist, &factor, c, &w)?;
        self.mix(ctx, provisional, width, 1).map(Scores::Tokens)
    }

    fn rescore_on_reuse(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Option<Scores<B>>> {
        if !self.reranks_on_reuse() {
            return Ok(None);
        }
        let a = ctx.attn;
        let width = score_width(a)?;
        let [b, kvh, l, _] = a.k.dims();
        let hist = self.history_at(a.layer, b, kvh, l, &a.k.device())?;
        self.mix(ctx, hist, width, 1)
            .map(|s| Some(Scores::Tokens(s)))
    }

    /// The layers' histories stacked (`[layers * batch, kv_heads, keys]`) and mixed with the
    /// lookahead in one pass: what [`Self::rescore_on_reuse`] gives each layer, at a fixed
    /// number of launches instead of one set per layer.
    fn rescore_layers_on_reuse(
        &mut self,
        layers: &[usize],
        ctx: &ScoreCtx<'_, B>,
    ) -> Result<Option<Tensor<B, 3>>> {
        if !self.reranks_on_reuse() || layers.is_empty() {
            return Ok(None);
        }
        let a = ctx.attn;
        let width = score_width(a)?;
        let [b, kvh, l, _] = a.k.dims();
        let device = a.k.device();
        let hists = layers
            .iter()
            .map(|&layer| self.history_at(layer, b, kvh, l, &device))
            .collect::<Result<Vec<_>>>()?;
        // one dtype for the stack: a layer not folded yet holds zeros in the default dtype
        // beside f32 folds (CUDA); then all go to f32
        let dtype = hists[0].dtype();
        let hists: Vec<Tensor<B, 3>> = if hists.iter().all(|h| h.dtype() == dtype) {
            hists
        } else {
            hists.into_iter().map(|h| h.cast(DType::F32)).collect()
        };
        let stacked = Tensor::cat(hists, 0);
        self.mix(ctx, stacked, width, layers.len()).map(Some)
    }

    fn observe_verify(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<()> {
        max_ctx(ctx.attn)?;
        if !self.cfg.history_on_reuse {
            return Ok(());
        }
        self.contribution(ctx).map(|_| ())
    }

    fn commit(&mut self, accepted: &[usize]) -> Result<()> {
        self.lookahead = None;
        self.shared = None;
        // check every pending layer before changing any
        for p in self.pending.iter().flatten() {
            let [b, _, n, _] = p.rows.dims();
            if accepted.len() != b {
                return Err(CoreError::invalid(
                    "accepted",
                    format!("{b} counts"),
                    accepted.len(),
                ));
            }
            if let Some(&bad) = accepted.iter().find(|&&x| x >= n) {
                return Err(CoreError::invalid(
                    "accepted",
                    format!("counts < {n} (verified positions)"),
                    bad,
                ));
            }
        }
        for layer in 0..self.pending.len() {
            let Some(c) = self.pending[layer].take() else {
                continue;
            };
            let [b, kvh, n, l] = c.rows.dims();
            let device = c.rows.device();
            let mut w = Vec::with_capacity(b * n);
            for &acc in accepted {
                w.extend(self.fold_weights(acc, n));
            }
            let factor: Vec<f32> = accepted
                .iter()
                .map(|&acc| self.cfg.beta.powi(acc as i32 + 1) as f32)
                .collect();
            let hist = self.history_at(layer, b, kvh, l, &device)?;
            self.hist[layer] = Some(fold::<B>(hist, &factor, c, &w)?);
        }
        Ok(())
    }

    fn retain(&mut self, keep: &[usize]) {
        self.seeds.retain(keep);
        self.pending.iter_mut().for_each(|p| *p = None);
        self.lookahead = None;
        self.shared = None;
        for h in self.hist.iter_mut() {
            if let Some(t) = h.take() {
                let idx: Vec<i64> = keep.iter().map(|&k| k as i64).collect();
                let idx = burn_tensor::Tensor::<B, 1, burn_tensor::Int>::from_data(
                    TensorData::new(idx, [keep.len()]),
                    &t.device(),
                );
                *h = (!keep.is_empty()).then(|| t.select(0, idx));
            }
        }
    }
}
