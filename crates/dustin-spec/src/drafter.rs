use std::sync::Arc;

use burn_tensor::{backend::Backend, Int, Tensor};
use dustin_core::{DraftCtx, Drafter, KvStore, LayerSelection, Phase, Proposal, TokenId};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::generate::{prefill_from, rows_to_host, AUTO_PREFILL_CHUNK};
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2};
use dustin_select::extend_selection_grouped;
use rand::Rng;

mod forced;
mod greedy;
mod join;
mod lookahead;
mod selection;

use greedy::{add_padded, greedy_on_device, last_rows, normalised_sum, pad_width};
use lookahead::LookaheadHook;
pub use lookahead::{LookaheadConfig, LookaheadLayers, LookaheadScoring};
pub use selection::DraftSelection;
use selection::{draft_selection, group_rows};

use crate::join::RowPrefill;

/// A drafter backed by a [`Qwen2`] model: a separate small model sharing the target's
/// tokenizer, or a self-draft made from the target's own first `layers` layers and LM head
/// (early exit, no extra weights; the model is shared through an `Arc`).
#[derive(Debug)]
pub struct ModelDrafter<B: Backend> {
    model: Arc<Qwen2<B>>,
    layers: Option<usize>,
    cache: Option<DenseKvCache<B>>,
    /// committed tokens not yet in the draft cache, per sequence (1 or 2)
    pending: Vec<Vec<TokenId>>,
    /// cache length before the last proposal, per sequence
    base: Vec<usize>,
    /// tokens fed in the first step of the last proposal, per sequence
    fed: Vec<usize>,
    last: Vec<Vec<TokenId>>,
    extra_capacity: usize,
    lookahead: LookaheadConfig,
    /// the draft's own selection rule ([`ModelDrafter::with_draft_selection`])
    draft_keep: Option<DraftSelection>,
    /// the last proposal's attention mass per position for the next selection: `[layers *
    /// batch, kv_heads, width]` (per layer, layer-major) or `[batch, 1, width]` (shared);
    /// kept with a draft selection rule only
    scores: Option<Tensor<B, 3>>,
    /// the selections the last proposal's first step attended to (a sparse draft): one, or
    /// one per layer
    last_selection: Vec<LayerSelection<B>>,
    prefill_chunk: usize,
    prefix: Option<Vec<DenseKvCache<B>>>,
    /// a cache holding whole prompts, for the next prefill
    prefilled: Option<DenseKvCache<B>>,
    target_kv: Option<crate::TargetKv<B>>,
    /// sequences being prefilled to join the batch ([`crate::JoinDrafter`])
    joining: Vec<RowPrefill<B, dustin_core::DenseHook>>,
}

impl<B: Backend> ModelDrafter<B> {
    /// A drafter running `model` (all layers, or the first `layers` for a self-draft), with
    /// room for `extra_capacity` tokens past the longest prompt (generation + `gamma`). Its
    /// lookahead comes from the later half of the layers it runs ([`LookaheadLayers::Half`]);
    /// [`ModelDrafter::with_lookahead`] sets others (`LookaheadConfig::default()`: all).
    pub fn new(model: Arc<Qwen2<B>>, layers: Option<usize>, extra_capacity: usize) -> Self {
        let depth = layers
            .unwrap_or(model.config.num_hidden_layers)
            .min(model.config.num_hidden_layers);
        let lookahead = LookaheadConfig {
            layers: LookaheadLayers::Half.resolve(depth).unwrap_or(None),
            scoring: LookaheadScoring::default(),
        };
        Self {
            model,
            layers,
            cache: None,
            pending: Vec::new(),
            base: Vec::new(),
            fed: Vec::new(),
            last: Vec::new(),
            extra_capacity,
            lookahead,
            draft_keep: None,
            scores: None,
            last_selection: Vec::new(),
            prefill_chunk: AUTO_PREFILL_CHUNK,
            prefix: None,
            prefilled: None,
            target_kv: None,
            joining: Vec::new(),
        }
    }

    /// Drafts on the target's own KV cache (SubSpec's alignment): at every proposal the draft
    /// starts from the cache the verifier published through `kv` (the target's exact K/V of
    /// every committed token) and appends only its draft tokens; it keeps no cache of its own
    /// between iterations and runs no prefill. The draft model must have the target's KV
    /// shape (layers, KV heads, head width): a substitute of the target
    /// (`dustin_qwen::substitute_model`). Give the same handle to the verifier
    /// (`ModelVerifier::with_target_kv`).
    pub fn with_target_kv(mut self, kv: crate::TargetKv<B>) -> Self {
        self.target_kv = Some(kv);
        self
    }

    /// The target's published cache, checked against this draft's KV shape.
    fn adopt_target_kv(&self) -> dustin_core::Result<Option<DenseKvCache<B>>> {
        let Some(kv) = &self.target_kv else {
            return Ok(None);
        };
        let cache = kv.get().ok_or_else(|| {
            dustin_core::CoreError::Model(
                "the draft reads the target's KV cache, but the verifier published none: \
                 build the verifier with ModelVerifier::with_target_kv and the same handle"
                    .into(),
            )
        })?;
        let c = &self.model.config;
        let want = (c.num_hidden_layers, c.kv_heads(), c.head_dim());
        let sh = cache.shape();
        let got = (sh.layers, sh.kv_heads, sh.head_dim);
        if self.layers.is_some() || want != got {
            return Err(dustin_core::CoreError::invalid(
                "target KV cache",
                format!(
                    "a draft with the target's KV shape (layers, KV heads, head width) {want:?} and all its layers"
                ),
                format!("{got:?}"),
            ));
        }
        Ok(Some(cache))
    }

    /// Stages prefix caches for the next [`Drafter::prefill`] (see
    /// `ModelVerifier::with_prefix`). For a self-draft, the target's own prefix caches may be
    /// given: only their first `layers` layers are kept, since an early-exit draft's KV
    /// entries equal the target's for those layers.
    pub fn with_prefix(mut self, prefixes: Vec<DenseKvCache<B>>) -> Self {
        let n = self.layers.unwrap_or(usize::MAX);
        self.prefix = Some(prefixes.into_iter().map(|c| c.first_layers(n)).collect());
        self
    }

    /// Stages a finished draft prefill for the next [`Drafter::prefill`]: `cache` holds every
    /// prompt whole (one sequence per prompt, the lengths of the prompts), as this draft would
    /// have computed it (for a self-draft, a target cache cut to the first `layers` layers).
    /// Prefill then runs nothing but a check of the prompts' lengths; the cache's capacity
    /// is used as given.
    pub fn with_prefilled(mut self, cache: DenseKvCache<B>) -> Self {
        self.prefilled = Some(cache);
        self
    }

    /// Prefills prompts in chunks of `chunk` tokens (`dustin_qwen::generate::prefill`'s
    /// rule; the default, 0, is the backend's choice). A selection policy observes the
    /// prompt chunk by chunk, so the chunk can change what it selects later.
    pub fn with_prefill_chunk(mut self, chunk: usize) -> Self {
        self.prefill_chunk = chunk;
        self
    }

    /// Sets which layers feed the lookahead signal.
    pub fn with_lookahead(mut self, cfg: LookaheadConfig) -> Self {
        self.lookahead = cfg;
        self
    }

    /// Makes the draft attend to a selection of its context instead of all of it (DESIGN.md
    /// step 1: "offer a draft that reads a selection too (sinks + window + its own top-k)").
    /// At every proposal after the first, each draft layer and KV head attends to the sinks
    /// `[0, n_sink)`, the window `[ctx - window, ctx)` and the top `budget - n_sink - window`
    /// positions of the previous proposal's attention mass (its queries against all its
    /// keys, summed over the rows: the lookahead signal before the sum over layers and KV
    /// heads), plus every token that entered the context since (the pending and draft
    /// tokens). With [`DraftSelection::per_layer`] each layer and KV head ranks by its own
    /// mass (a layer outside [`LookaheadConfig::layers`] by the sum over those inside),
    /// else all share the sum. One top-k call makes every layer's selection, and one
    /// extension per step keeps them current. The first proposal, and one where no
    /// sequence's context exceeds `budget`, attends densely.
    ///
    /// The draft then reads `budget` positions of K and V per layer and step instead of the
    /// whole context, and the keys once per layer and proposal for the mass (scored after
    /// drafting, as [`LookaheadScoring::Deferred`], whatever the scoring setting, in dense
    /// proposals too; with unequal pending counts the first step's rows count only each
    /// sequence's first pending token). `None` restores dense drafting.
    ///
    /// # Errors
    /// [`dustin_core::CoreError::InvalidInput`] naming `budget` when it does not exceed
    /// `n_sink + window` (nothing would be left to choose).
    pub fn with_draft_selection(
        mut self,
        sel: Option<DraftSelection>,
    ) -> dustin_core::Result<Self> {
        if let Some(DraftSelection { keep: k, .. }) = sel {
            if k.budget <= k.always_kept() {
                return Err(dustin_core::CoreError::invalid(
                    "budget",
                    format!(
                        "more than n_sink + window = {} + {} = {}",
                        k.n_sink,
                        k.window,
                        k.always_kept_exact()
                    ),
                    k.budget,
                ));
            }
        }
        self.draft_keep = sel;
        self.scores = None;
        Ok(self)
    }

    /// The selections the last proposal's first step attended to, `indices`
    /// `[batch, kv_heads, k]` each (see [`LayerSelection`]): one per draft layer
    /// ([`DraftSelection::per_layer`]) or one for all; empty when it drafted densely.
    pub fn last_selection(&self) -> &[LayerSelection<B>] {
        &self.last_selection
    }

    /// The draft model.
    pub fn model(&self) -> &Qwen2<B> {
        &self.model
    }

    fn cache(&mut self) -> dustin_core::Result<&mut DenseKvCache<B>> {
        self.cache
            .as_mut()
            .ok_or_else(|| dustin_core::CoreError::Model("drafter used before prefill".into()))
    }
}

impl<B: KernelOps> Drafter<B> for ModelDrafter<B> {
    fn prefill(&mut self, prompts: &[Vec<TokenId>], first: &[TokenId]) -> dustin_core::Result<()> {
        if first.len() != prompts.len() {
            return Err(dustin_core::CoreError::invalid(
                "first",
                format!("{} tokens", prompts.len()),
                first.len(),
            ));
        }
        self.scores = None;
        self.last_selection.clear();
        if let Some(cache) = self.prefilled.take() {
            let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
            if cache.lens() != lens.as_slice() {
                return Err(dustin_core::CoreError::invalid(
                    "prompts",
                    format!("the prefilled cache's lengths {:?}", cache.lens()),
                    format!("{lens:?}"),
                ));
            }
            self.cache = Some(cache);
            self.pending = first.iter().map(|&t| vec![t]).collect();
            self.base = vec![0; prompts.len()];
            self.fed = vec![0; prompts.len()];
            self.last = vec![Vec::new(); prompts.len()];
            return Ok(());
        }
        if let Some(cache) = self.adopt_target_kv()? {
            if cache.batch() != prompts.len() {
                return Err(dustin_core::CoreError::invalid(
                    "target KV cache",
                    format!("{} sequences", prompts.len()),
                    cache.batch(),
                ));
            }
            self.cache = Some(cache);
            self.pending = first.iter().map(|&t| vec![t]).collect();
            self.base = vec![0; prompts.len()];
            self.fed = vec![0; prompts.len()];
            self.last = vec![Vec::new(); prompts.len()];
            return Ok(());
        }
        let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + self.extra_capacity;
        let (cache, _, _) = prefill_from(
            &self.model,
            prompts,
            self.prefix.take(),
            capacity,
            self.layers,
            &mut dustin_core::DenseHook,
            self.prefill_chunk,
            false,
        )?;
        self.cache = Some(cache);
        self.pending = first.iter().map(|&t| vec![t]).collect();
        self.base = vec![0; prompts.len()];
        self.fed = vec![0; prompts.len()];
        self.last = vec![Vec::new(); prompts.len()];
        Ok(())
    }

    fn propose(&mut self, ctx: &DraftCtx) -> dustin_core::Result<Proposal<B>> {
        let model = self.model.clone();
        let layers = self.layers;
        let batch = self.pending.len();
        if !ctx.draws.is_empty() && ctx.draws.len() != batch {
            return Err(dustin_core::CoreError::invalid(
                "draws",
                format!("none or one per sequence ({batch})"),
                ctx.draws.len(),
            ));
        }
        // each sequence's rule and random stream; the sampled ones' rows go to the host
        let draws: Vec<_> = (0..batch)
            .map(|s| ctx.draw(s))
            .collect::<dustin_core::Result<_>>()?;
        let sampled: Vec<usize> = (0..batch).filter(|&s| !draws[s].is_greedy()).collect();
        let mut rngs: Vec<_> = draws.iter().map(crate::run::draw_rng).collect();
        let deferred = self.lookahead.scoring == LookaheadScoring::Deferred;
        let mut hook = LookaheadHook::<B> {
            // a draft selection rule needs the mass for the next proposal's top-k
            on: ctx.want_lookahead || self.draft_keep.is_some(),
            layers: self.lookahead.layers.clone(),
            keep: false,
            keep_first_row: false,
            parts: Vec::new(),
            queries: Default::default(),
            first_rows: Default::default(),
            selections: Vec::new(),
        };
        if let Some(target) = self.adopt_target_kv()? {
            // the target's cache holds every committed token but the pending one
            self.cache = Some(target);
        }
        let pending = self.pending.clone();
        let keep_rule = self.draft_keep;
        let scores = self.scores.take();
        let cache = self.cache()?;
        let base: Vec<usize> = cache.lens().to_vec();
        // the draft's own selection at the proposal's start (a sparse draft with the last
        // proposal's mass, and a context longer than the budget somewhere)
        let sel0 = match (keep_rule, scores) {
            (Some(rule), Some(sc)) if base.iter().any(|&l| l > rule.keep.budget) => Some(
                draft_selection(sc, &base, rule.keep, cache.shape().kv_heads)?,
            ),
            _ => None,
        };
        // a draft selection rule keeps its rows for `key_mass` in every proposal, dense ones
        // included (their per-layer masses make the next selection), whatever the scoring
        // setting; with unequal pending counts the first step keeps row 0 only
        let own = keep_rule.is_some();
        let groups = sel0.as_ref().map_or(0, |s| s.counts.len() / batch.max(1));
        // step 0 feeds the pending tokens; a sequence with fewer is padded by repeating its
        // last pending token, whose cache entry is dropped right after
        let n0 = pending.iter().map(Vec::len).max().unwrap_or(1);
        let feed: Vec<Vec<TokenId>> = pending
            .iter()
            .map(|p| {
                let mut v = p.clone();
                while v.len() < n0 {
                    v.push(*p.last().unwrap_or(&0));
                }
                v
            })
            .collect();
        let mut tokens: Vec<Vec<TokenId>> = vec![Vec::with_capacity(ctx.gamma); batch];
        let mut qs: Vec<Vec<Vec<f32>>> = vec![Vec::new(); batch];
        let mut input = feed;
        // deferred scoring keeps the first step's rows too when every sequence feeds the
        // same count (no padded rows); the kept rows then start at `base`, else after the
        // pending tokens
        let uniform = pending.iter().all(|p| p.len() == n0);
        let kept_from: Vec<usize> = if uniform {
            base.clone()
        } else {
            base.iter()
                .zip(&pending)
                .map(|(b, p)| b + p.len())
                .collect()
        };
        let mut first_step_selections: Vec<LayerSelection<B>> = Vec::new();
        // a greedy batch's ids per step, `[batch]` each, and the last step's as the next
        // step's input, on the device
        let mut step_ids: Vec<Tensor<B, 1, Int>> = Vec::new();
        let mut device_input: Option<Tensor<B, 2, Int>> = None;
        // `gamma` steps; the last step's token is not fed (the target verifies it first)
        for step in 0..ctx.gamma {
            // a draft with a selection rule scores nothing in its passes (a sparse pass's
            // attention sees only the selection): its rows are kept, the first step's only
            // row 0 when the pending counts differ
            hook.keep = (deferred || own) && (step > 0 || uniform);
            hook.keep_first_row = own && step == 0 && !uniform;
            if let Some(sel) = &sel0 {
                // the selections plus every position that entered the context since, in one
                // extension of the stacked rows (index tables uploaded once for the batch),
                // then split per layer
                let ext = extend_selection_grouped(sel, groups, &base, cache.lens())?;
                hook.selections = (0..groups).map(|g| group_rows(&ext, g, batch)).collect();
                if step == 0 {
                    first_step_selections = hook.selections.clone();
                }
            }
            let opts = ForwardOpts {
                phase: Phase::Decode,
                logits: LogitsMode::All,
                layers,
            };
            // a greedy batch feeds the last step's ids from the device: no read back, so
            // the host queues the next step while the device still runs this one
            let out = match device_input.take() {
                Some(ids) => model.forward_ids(ids, cache, &mut hook, opts)?,
                None => model.forward(&input, cache, &mut hook, opts)?,
            };
            let logits = out.logits.ok_or_else(|| {
                dustin_core::CoreError::Model("draft forward returned no logits".into())
            })?;
            let [b, n, _] = logits.dims();
            // each sequence's row: its last pending token at step 0, the one new token after
            let last: Vec<usize> = (0..b)
                .map(|s| {
                    if step == 0 {
                        pending[s].len() - 1
                    } else {
                        n - 1
                    }
                })
                .collect();
            let rows = last_rows(logits, &last);
            if step == 0 && n0 > 1 {
                for (s, p) in pending.iter().enumerate() {
                    cache.truncate(s, base[s] + p.len())?;
                }
            }
            if sampled.is_empty() {
                // picked on the device and kept there; every step's ids come back at once
                // after the last step, `batch` ids a step instead of `vocab` floats
                let ids = dustin_core::greedy::greedy_ids(rows, ctx.vocab)?;
                device_input = Some(ids.clone().reshape([b, 1]));
                step_ids.push(ids);
            } else {
                // the greedy sequences' ids from the device, the sampled ones' rows on the host
                let mut next = if sampled.len() < b {
                    greedy_on_device(rows.clone(), ctx.vocab)?
                } else {
                    vec![0; b]
                };
                let host = rows_to_host(crate::select_rows(rows, &sampled), ctx.vocab)?;
                for (&s, row) in sampled.iter().zip(&host) {
                    let q = draws[s].sampling.probs(row, s)?;
                    next[s] = dustin_core::sample_with(&q, rngs[s].random::<f32>()) as u32;
                    qs[s].push(q);
                }
                for (s, &t) in next.iter().enumerate() {
                    tokens[s].push(t);
                }
                input = next.iter().map(|&t| vec![t]).collect();
            }
        }
        if !step_ids.is_empty() {
            // the greedy batch's ids of every step in one read back, `[steps, batch]`
            let ids = dustin_core::greedy::read_ids(Tensor::stack::<2>(step_ids, 0))?;
            let ids =
                dustin_core::greedy::ids_to_tokens(&ids, ctx.vocab, "draft logits", |i| i % batch)?;
            for (i, &t) in ids.iter().enumerate() {
                tokens[i % batch].push(t);
            }
        }
        // deferred scoring: one call per layer over every kept row (and one more for kept
        // first rows, which start at `base`)
        let mut kept = std::mem::take(&mut hook.queries);
        let mut firsts = std::mem::take(&mut hook.first_rows);
        let layers_kept: std::collections::BTreeSet<usize> =
            kept.keys().chain(firsts.keys()).copied().collect();
        let mut acc: Option<Tensor<B, 3>> = None;
        // the first rows' calls can be narrower (their view ends earlier): pad to the wider
        let mut add = |m: Tensor<B, 3>| acc = Some(add_padded(acc.take(), m));
        // per-layer masses `[batch, kv_heads, width]`, for a per-layer draft selection
        let per_layer = keep_rule.is_some_and(|r| r.per_layer);
        let mut by_layer: std::collections::BTreeMap<usize, Tensor<B, 3>> = Default::default();
        for layer in layers_kept {
            let mut m: Option<Tensor<B, 3>> = None;
            for part in [
                kept.remove(&layer)
                    .map(|qs| model.key_mass(cache, layer, Tensor::cat(qs, 2), &kept_from))
                    .transpose()?,
                firsts
                    .remove(&layer)
                    .map(|q| model.key_mass(cache, layer, q, &base))
                    .transpose()?,
            ]
            .into_iter()
            .flatten()
            {
                m = Some(add_padded(m, part));
            }
            if let Some(m) = m {
                if per_layer {
                    by_layer.insert(layer, m.clone());
                }
                add(m);
            }
        }
        // the next selection's scores: every layer's own mass (the sum for a layer without
        // one), stacked layer-major
        let stacked = match (&acc, per_layer) {
            (Some(sum), true) => {
                let layers = cache.num_layers();
                let w = by_layer
                    .values()
                    .map(|m| m.dims()[2])
                    .chain([sum.dims()[2]])
                    .max()
                    .unwrap_or(0);
                let rows: Vec<Tensor<B, 3>> = (0..layers)
                    .map(|l| pad_width(by_layer.remove(&l).unwrap_or_else(|| sum.clone()), w))
                    .collect();
                Some(Tensor::cat(rows, 0))
            }
            _ => None,
        };
        if let Some(acc) = acc {
            let [b, _, l] = acc.dims();
            // sum over KV heads: [batch, keys_len]
            hook.parts.push(acc.sum_dim(1).reshape([b, l]));
        }
        let mass = normalised_sum(hook.parts);
        self.scores = match keep_rule {
            Some(r) if r.per_layer => stacked,
            Some(_) => mass.clone().map(|m| {
                let [b, w] = m.dims();
                m.reshape([b, 1, w])
            }),
            None => None,
        };
        self.last_selection = first_step_selections;
        let lookahead = if ctx.want_lookahead { mass } else { None };
        self.base = base;
        self.fed = pending.iter().map(Vec::len).collect();
        self.last = tokens.clone();
        Ok(Proposal {
            tokens,
            q: if sampled.is_empty() { None } else { Some(qs) },
            lookahead,
        })
    }

    fn commit(&mut self, accepted: &[usize], next: &[TokenId]) -> dustin_core::Result<()> {
        let batch = self.pending.len();
        if accepted.len() != batch || next.len() != batch {
            return Err(dustin_core::CoreError::invalid(
                "accepted",
                format!("{batch} counts"),
                accepted.len(),
            ));
        }
        let base = self.base.clone();
        let fed = self.fed.clone();
        let last = self.last.clone();
        let self_target_kv = self.target_kv.is_some();
        let cache = self.cache()?;
        let mut pending = Vec::with_capacity(batch);
        for s in 0..batch {
            let gamma = last[s].len();
            let a = accepted[s];
            if a > gamma {
                return Err(dustin_core::CoreError::invalid(
                    "accepted",
                    format!("<= gamma = {gamma}"),
                    a,
                ));
            }
            if self_target_kv {
                // the next proposal starts from the target's cache, whose only missing
                // committed token is the bonus token
                pending.push(vec![next[s]]);
            } else if a == gamma && gamma > 0 {
                cache.truncate(s, base[s] + fed[s] + gamma - 1)?;
                pending.push(vec![last[s][gamma - 1], next[s]]);
            } else {
                cache.truncate(s, base[s] + fed[s] + a)?;
                pending.push(vec![next[s]]);
            }
        }
        self.pending = pending;
        Ok(())
    }

    fn can_hold(&self) -> bool {
        true
    }

    fn commit_holding(
        &mut self,
        accepted: &[usize],
        next: &[TokenId],
        hold: &[bool],
    ) -> dustin_core::Result<()> {
        let batch = self.pending.len();
        if hold.len() != batch {
            return Err(dustin_core::CoreError::invalid(
                "hold",
                format!("{batch} flags"),
                hold.len(),
            ));
        }
        // a held row: nothing accepted, then back to before the proposal's first write, its
        // pending tokens fed again at the next proposal
        let before = self.pending.clone();
        self.commit(&dustin_core::zero_held(accepted, hold), next)?;
        for s in (0..batch).filter(|&s| hold[s]) {
            self.pending[s] = before[s].clone();
            let at = self.base[s];
            self.cache()?.truncate(s, at)?;
        }
        Ok(())
    }

    fn retain(&mut self, keep: &[usize]) -> dustin_core::Result<()> {
        let res = if self.target_kv.is_some() {
            // the next proposal adopts the target's retained cache: holding on to this copy
            // would make the verifier's compaction copy every layer (copy on write)
            self.cache()?;
            self.cache = None;
            Ok(())
        } else {
            self.cache()?.retain(keep)
        };
        if res.is_err() && self.cache()?.batch() != keep.len() {
            // refused before anything changed
            return res;
        }
        // kept (a cache that failed after changing stays whole: the rows follow it);
        // the kept sequences' rows of the last mass (their positions are unchanged)
        if let Some(sc) = self.scores.take().filter(|_| !keep.is_empty()) {
            // rows are group-major: each group keeps its rows of the kept sequences
            let batch = self.pending.len().max(1);
            let groups = sc.dims()[0] / batch;
            let idx: Vec<i64> = (0..groups)
                .flat_map(|g| keep.iter().map(move |&k| (g * batch + k) as i64))
                .collect();
            let n = idx.len();
            let idx = Tensor::<B, 1, burn_tensor::Int>::from_data(
                burn_tensor::TensorData::new(idx, [n]),
                &sc.device(),
            );
            self.scores = Some(sc.select(0, idx));
        }
        self.last_selection.clear();
        let pick = |v: &Vec<_>| keep.iter().map(|&k| v[k]).collect::<Vec<_>>();
        self.pending = keep.iter().map(|&k| self.pending[k].clone()).collect();
        self.last = keep.iter().map(|&k| self.last[k].clone()).collect();
        self.base = pick(&self.base);
        self.fed = pick(&self.fed);
        res
    }
}
