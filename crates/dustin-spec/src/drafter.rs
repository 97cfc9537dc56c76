use std::sync::Arc;

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{
    AttentionHook, DraftCtx, Drafter, KvStore, LayerAttnCtx, LayerSelection, Phase, Proposal,
    SamplingConfig, TokenId,
};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::generate::{prefill_from, rows_to_host, seq_rng, AUTO_PREFILL_CHUNK};
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2};
use dustin_select::{extend_selection_grouped, select_top_k, KeepRule};
use rand::Rng;

use crate::{Result, SpecError};

mod forced;

/// Row `last[s]` of each sequence `s` of `logits` `[batch, n, vocab]`, as `[batch, vocab]`:
/// one slice when every sequence takes the same row (every draft step after the first, and
/// the first when the pending lengths agree), else one gather. A slice and a reshape per
/// sequence plus a `cat` cost `2 * batch + 1` kernel launches, and on CUDA a launch costs
/// more host time than this work (docs/perf.md, 2026-11-30).
fn last_rows<B: Backend>(logits: Tensor<B, 3>, last: &[usize]) -> Tensor<B, 2> {
    let [b, n, v] = logits.dims();
    match last.first() {
        Some(&r) if last.iter().all(|&x| x == r) => {
            logits.slice([0..b, r..r + 1, 0..v]).reshape([b, v])
        }
        _ => {
            let idx: Vec<i64> = last
                .iter()
                .enumerate()
                .map(|(s, &r)| (s * n + r) as i64)
                .collect();
            let dev = logits.device();
            let idx = Tensor::<B, 1, burn_tensor::Int>::from_data(
                burn_tensor::TensorData::new(idx, [b]),
                &dev,
            );
            logits.reshape([b * n, v]).select(0, idx)
        }
    }
}

/// The greedy token of each row of `logits` (`[batch, vocab_padded]`, logits of the first
/// `vocab` ids considered), picked on the device: the draft loop then reads back `batch` ids
/// instead of `batch x vocab` floats at every step (151,936 floats per sequence for Qwen2.5).
/// As on the host ([`dustin_core::argmax`]): ties go to the lowest id (Flex and cubek's
/// argmax both keep the lower index on equality), and a row with no finite maximum (all
/// -inf) gives id 0 (cubek-reduce 0.2's argmax starts from `f32::MIN` at index `u32::MAX`, so
/// it returns `u32::MAX` there; any id outside the vocabulary is mapped back to 0).
///
/// # Errors
/// [`dustin_core::CoreError::NonFinite`] when a row holds NaN or +inf (an argmax would pick
/// an arbitrary token from them; the host path refuses them too), naming the sequence;
/// [`dustin_core::CoreError::InvalidInput`] for `vocab == 0`.
fn greedy_on_device<B: Backend>(
    logits: Tensor<B, 2>,
    vocab: usize,
) -> dustin_core::Result<Vec<TokenId>> {
    /// Marks a row with NaN or +inf in the one read back (argmax ids are >= 0, and cubek's
    /// "no maximum" `u32::MAX` reads as -1 in i32).
    const BAD: i64 = -2;
    let [b, v] = logits.dims();
    if vocab == 0 || v == 0 {
        return Err(dustin_core::CoreError::invalid(
            "vocab",
            "at least 1 id with logits",
            format!("vocab {vocab}, logits width {v}"),
        ));
    }
    let logits = logits.slice([0..b, 0..vocab.min(v)]);
    let bad = crate::refused_logits(logits.clone()).any_dim(1);
    // one read back per step: the ids, with the refused rows marked
    let ids = logits
        .argmax(1)
        .mask_fill(bad, BAD)
        .reshape([b])
        .into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| dustin_core::CoreError::Model(format!("{e:?}")))?;
    let n = vocab.min(v) as i64;
    ids.into_iter()
        .enumerate()
        .map(|(seq, id)| match id {
            BAD => Err(dustin_core::CoreError::NonFinite {
                what: "draft logits".into(),
                seq,
            }),
            id if (0..n).contains(&id) => Ok(id as TokenId),
            // no finite maximum: the host argmax's choice
            _ => Ok(0),
        })
        .collect()
}

/// `t` `[batch, kv_heads, w]` widened to `width >= w` with zeros.
fn pad_width<B: Backend>(t: Tensor<B, 3>, width: usize) -> Tensor<B, 3> {
    let [b, h, w] = t.dims();
    if w >= width {
        return t;
    }
    let dev = t.device();
    Tensor::cat(vec![t, Tensor::zeros([b, h, width - w], &dev)], 2)
}

/// How a sparse draft ([`ModelDrafter::with_draft_selection`]) chooses the positions it
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

/// `acc + m` (`[batch, kv_heads, w]` each), the narrower widened with zeros; `m` when there
/// is no `acc` yet.
fn add_padded<B: Backend>(acc: Option<Tensor<B, 3>>, m: Tensor<B, 3>) -> Tensor<B, 3> {
    match acc {
        Some(a) => {
            let w = a.dims()[2].max(m.dims()[2]);
            pad_width(a, w) + pad_width(m, w)
        }
        None => m,
    }
}

/// A sparse draft's selections at a proposal's start, for contexts `base`: sinks, window and
/// the top of `scores` by [`select_top_k`], in one call. `scores` is `[groups * batch, h,
/// width]` (group-major: a group is a draft layer, or one group for all), the last
/// proposal's mass (zero past its width); `h` is 1 (one ranking for every KV head) or
/// `kv_heads`. Returns `[groups * batch, kv_heads, k]` with counts per row.
fn draft_selection<B: KernelOps>(
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
fn repeat_lens(lens: &[usize], groups: usize) -> Vec<usize> {
    (0..groups).flat_map(|_| lens.iter().copied()).collect()
}

/// Group `g`'s rows of a stacked selection `[groups * batch, kv_heads, k]`.
fn group_rows<B: Backend>(sel: &LayerSelection<B>, g: usize, batch: usize) -> LayerSelection<B> {
    let [_, h, k] = sel.indices.dims();
    LayerSelection {
        indices: sel
            .indices
            .clone()
            .slice([g * batch..(g + 1) * batch, 0..h, 0..k]),
        counts: sel.counts[g * batch..(g + 1) * batch].to_vec(),
    }
}

/// Which draft layers feed the lookahead signal (DESIGN.md step 1: "configured draft
/// layers/heads"), and when their attention mass is computed. Its `Default` is every layer
/// (`layers: None`); [`ModelDrafter::new`] starts from [`LookaheadLayers::Half`] of its
/// draft's layers instead (the measured default, see there).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LookaheadConfig {
    /// Draft layers whose attention is summed; `None` = all of the draft's layers (the
    /// paper's average of the draft's attention).
    pub layers: Option<Vec<usize>>,
    /// When the mass is computed; the same signal either way.
    #[serde(default)]
    pub scoring: LookaheadScoring,
}

/// Which draft layers feed the lookahead signal, as written before the draft's layer count is
/// known (`--lookahead-layers`; [`LookaheadLayers::resolve`] turns it into
/// [`LookaheadConfig::layers`]). DESIGN.md step 1 sums the draft's attention "over configured
/// draft layers/heads"; which layers is our choice to make and to measure (docs/fidelity.md).
///
/// Written as `all`, `stride:S` (every `S`-th layer counted back from the last, the last
/// included: `stride:2` of 24 layers is 1, 3, .., 23), `last:N` (the last `N` layers),
/// `half` (the later half: the last `ceil(L / 2)` of `L` layers, whatever the depth) or a
/// list of layer indices (`0,5,9`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LookaheadLayers {
    /// Every layer of the draft (the paper's average of the draft's attention).
    All,
    /// Every `S`-th layer counted back from the last.
    Stride(usize),
    /// The last `N` layers.
    Last(usize),
    /// The later half of the layers: the last `ceil(L / 2)` of `L`; the default. `last:10`
    /// of 20 selected as well as every layer at 4096 and 8192 tokens (docs/fidelity.md), and
    /// `half` of Qwen2.5-0.5B's 24 layers made `dustin` 1.15x (7B) and 1.22x (72B shapes)
    /// faster than `all` on the H200 (docs/perf.md, "GPU: end to end at Qwen2.5-7B and 72B
    /// shapes").
    #[default]
    Half,
    /// These layers.
    List(Vec<usize>),
}

impl std::str::FromStr for LookaheadLayers {
    type Err = SpecError;

    /// Parses the forms of [`LookaheadLayers`].
    ///
    /// # Errors
    /// [`SpecError::Config`] naming `lookahead layers` for anything else, a stride or count
    /// of 0, or a list with a repeated layer.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || {
            SpecError::Config {
            name: "lookahead layers",
            expected:
                "`all`, `half`, `stride:S`, `last:N` (S, N >= 1) or a list of layer indices like `0,5,9`"
                    .into(),
            found: format!("`{s}`"),
        }
        };
        let t = s.trim();
        let pos = |v: &str| v.trim().parse::<usize>().ok().filter(|&n| n >= 1);
        if t == "all" {
            return Ok(Self::All);
        }
        if t == "half" {
            return Ok(Self::Half);
        }
        if let Some(v) = t.strip_prefix("stride:") {
            return pos(v).map(Self::Stride).ok_or_else(bad);
        }
        if let Some(v) = t.strip_prefix("last:") {
            return pos(v).map(Self::Last).ok_or_else(bad);
        }
        let list: Vec<usize> = t
            .split(',')
            .map(|v| v.trim().parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| bad())?;
        let mut seen = std::collections::BTreeSet::new();
        if list.iter().any(|&l| !seen.insert(l)) {
            return Err(bad());
        }
        Ok(Self::List(list))
    }
}

impl std::fmt::Display for LookaheadLayers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::All => write!(f, "all"),
            Self::Stride(s) => write!(f, "stride:{s}"),
            Self::Last(n) => write!(f, "last:{n}"),
            Self::Half => write!(f, "half"),
            Self::List(l) => {
                let v: Vec<String> = l.iter().map(usize::to_string).collect();
                write!(f, "{}", v.join(","))
            }
        }
    }
}

impl LookaheadLayers {
    /// The layers of a draft of `num_layers` layers, ascending: `None` for
    /// [`LookaheadLayers::All`] (every layer, without a list).
    ///
    /// # Errors
    /// [`SpecError::Config`] naming `lookahead layers` when a listed layer is not below
    /// `num_layers` or `last:N` asks for more layers than the draft has.
    pub fn resolve(&self, num_layers: usize) -> Result<Option<Vec<usize>>> {
        let out_of = |found: String| SpecError::Config {
            name: "lookahead layers",
            expected: format!(
                "layers of a draft of {num_layers} layers (0 to {})",
                num_layers.saturating_sub(1)
            ),
            found,
        };
        Ok(match self {
            Self::All => None,
            Self::Stride(s) => Some(
                (0..num_layers)
                    .filter(|l| (num_layers - 1 - l).is_multiple_of(*s))
                    .collect(),
            ),
            Self::Last(n) => {
                if *n > num_layers {
                    return Err(out_of(format!("the last {n}")));
                }
                Some((num_layers - n..num_layers).collect())
            }
            Self::Half => Some((num_layers / 2..num_layers).collect()),
            Self::List(l) => {
                if let Some(&bad) = l.iter().find(|&&x| x >= num_layers) {
                    return Err(out_of(format!("layer {bad}")));
                }
                let mut v = l.clone();
                v.sort_unstable();
                Some(v)
            }
        })
    }
}

/// When a [`ModelDrafter`] computes the attention mass of its draft steps' queries.
///
/// The signal is the same either way (each query's softmax over the keys visible at its
/// position, summed): the keys a step's query sees are in the draft cache from that step on
/// and are not changed by later steps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LookaheadScoring {
    /// Each layer keeps its queries; after the last draft step one scoring call per layer
    /// ([`Qwen2::key_mass`]) covers every step's rows, so the draft's keys are read once per
    /// layer for the lookahead instead of once per step, with one set of launches. The
    /// first step's rows join them when every sequence fed the same number of tokens; else
    /// they are scored in the first step's pass.
    #[default]
    Deferred,
    /// Every draft step's pass scores its own rows at every layer (the attention
    /// probabilities on the plain path, the scoring kernel with fused kernels).
    PerStep,
}

/// Records the draft's attention mass per position during drafting, and hands the draft's
/// own selection (if any) to every layer.
#[derive(Debug)]
struct LookaheadHook<B: Backend> {
    on: bool,
    layers: Option<Vec<usize>>,
    /// whether this pass's queries are kept for [`Qwen2::key_mass`] after drafting instead
    /// of being scored in the pass
    keep: bool,
    /// whether only this pass's first query row is kept (a sparse draft's first step with
    /// unequal pending counts: row 0 is every sequence's first pending token)
    keep_first_row: bool,
    /// per forward step or deferred scoring: `[batch, keys_len]`
    parts: Vec<Tensor<B, 2>>,
    /// kept queries per layer, one `[batch, heads, n, head_dim]` per kept pass
    queries: std::collections::BTreeMap<usize, Vec<Tensor<B, 4>>>,
    /// kept first rows per layer, `[batch, heads, 1, head_dim]`
    first_rows: std::collections::BTreeMap<usize, Tensor<B, 4>>,
    /// what the layers of this pass attend to (a sparse draft): one selection for every
    /// layer, or one per layer; empty = dense
    selections: Vec<LayerSelection<B>>,
}

impl<B: Backend> LookaheadHook<B> {
    /// Whether `layer`'s attention feeds the signal in a pass of `phase`.
    fn records(&self, layer: usize, phase: Phase) -> bool {
        self.on && phase == Phase::Decode && self.layers.as_ref().is_none_or(|l| l.contains(&layer))
    }
}

impl<B: Backend> AttentionHook<B> for LookaheadHook<B> {
    fn on_layer(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
    ) -> dustin_core::Result<Option<LayerSelection<B>>> {
        if self.records(ctx.layer, ctx.phase) {
            if self.keep {
                self.queries
                    .entry(ctx.layer)
                    .or_default()
                    .push(ctx.q.clone());
            } else if self.keep_first_row {
                let [b, h, _, d] = ctx.q.dims();
                self.first_rows
                    .insert(ctx.layer, ctx.q.clone().slice([0..b, 0..h, 0..1, 0..d]));
            }
        }
        Ok(match (ctx.phase, self.selections.len()) {
            (Phase::Prefill { .. }, _) | (_, 0) => None,
            (Phase::Decode, 1) => Some(self.selections[0].clone()),
            (Phase::Decode, _) => self.selections.get(ctx.layer).cloned(),
        })
    }
    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        !self.keep && !self.keep_first_row && self.records(layer, phase)
    }
    fn on_probs(
        &mut self,
        _layer: usize,
        _phase: Phase,
        probs: &Tensor<B, 4>,
    ) -> dustin_core::Result<()> {
        let [b, h, n, l] = probs.dims();
        // sum over heads and query rows: [batch, keys_len]
        self.parts
            .push(probs.clone().sum_dim(1).sum_dim(2).reshape([b, l]));
        let _ = (h, n);
        Ok(())
    }
    fn wants_key_mass(&self, layer: usize, phase: Phase) -> bool {
        self.wants_probs(layer, phase)
    }
    fn on_key_mass(
        &mut self,
        _layer: usize,
        _phase: Phase,
        mass: &Tensor<B, 3>,
    ) -> dustin_core::Result<()> {
        let [b, _, l] = mass.dims();
        // sum over KV heads (each already summed over its query heads and the rows)
        self.parts.push(mass.clone().sum_dim(1).reshape([b, l]));
        Ok(())
    }
}

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
            if k.budget <= k.n_sink + k.window {
                return Err(dustin_core::CoreError::invalid(
                    "budget",
                    format!(
                        "more than n_sink + window = {} + {} = {}",
                        k.n_sink,
                        k.window,
                        k.n_sink + k.window
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
        let sampling = SamplingConfig {
            temperature: ctx.temperature,
            top_p: ctx.top_p,
            top_k: ctx.top_k,
        };
        let mut rngs: Vec<_> = (0..batch).map(|s| seq_rng(ctx.seed, s)).collect();
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
            let out = model.forward(
                &input,
                cache,
                &mut hook,
                ForwardOpts {
                    phase: Phase::Decode,
                    logits: LogitsMode::All,
                    layers,
                },
            )?;
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
            let next = if sampling.is_greedy() {
                // picked on the device: one id per sequence comes back, not `vocab` floats
                greedy_on_device(rows, ctx.vocab)?
            } else {
                let rows = rows_to_host(rows, ctx.vocab)?;
                let mut out = Vec::with_capacity(b);
                for (s, row) in rows.iter().enumerate() {
                    let q = sampling.probs(row, s)?;
                    let t = dustin_core::sample_with(&q, rngs[s].random::<f32>()) as u32;
                    qs[s].push(q);
                    out.push(t);
                }
                out
            };
            for (s, &t) in next.iter().enumerate() {
                tokens[s].push(t);
            }
            input = next.iter().map(|&t| vec![t]).collect();
            // the last draft token is not fed: it is verified by the target first
            if step + 1 == ctx.gamma {
                break;
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
        let mass = if !hook.parts.is_empty() {
            let lmax = hook.parts.iter().map(|p| p.dims()[1]).max().unwrap_or(0);
            let dev = model.device().clone();
            let mut acc = Tensor::<B, 2>::zeros([batch, lmax], &dev);
            for p in hook.parts {
                let [b, l] = p.dims();
                let p = if l < lmax {
                    Tensor::cat(vec![p, Tensor::zeros([b, lmax - l], &dev)], 1)
                } else {
                    p
                };
                acc = acc + p;
            }
            let sum = acc.clone().sum_dim(1).clamp_min(1e-30);
            Some(acc / sum)
        } else {
            None
        };
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
            q: if sampling.is_greedy() { None } else { Some(qs) },
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

    fn retain(&mut self, keep: &[usize]) -> dustin_core::Result<()> {
        self.cache()?.retain(keep)?;
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
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;
    use burn_tensor::TensorData;

    fn logits(rows: &[Vec<f32>]) -> Tensor<Flex, 2> {
        let v = rows[0].len();
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        Tensor::from_data(TensorData::new(flat, [rows.len(), v]), &Default::default())
    }

    #[test]
    fn lookahead_layers_parse_and_resolve() {
        let p = |s: &str| s.parse::<LookaheadLayers>().unwrap();
        assert_eq!(p("all").resolve(24).unwrap(), None);
        // every second layer counted back from the last: the odd layers of 24
        assert_eq!(
            p("stride:2").resolve(24).unwrap(),
            Some(vec![1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23])
        );
        assert_eq!(p("stride:3").resolve(10).unwrap(), Some(vec![0, 3, 6, 9]));
        assert_eq!(p("stride:1").resolve(3).unwrap(), Some(vec![0, 1, 2]));
        assert_eq!(p("last:4").resolve(24).unwrap(), Some(vec![20, 21, 22, 23]));
        assert_eq!(p("half").resolve(24).unwrap(), Some((12..24).collect()));
        // odd depths round the half up; one layer is itself
        assert_eq!(p("half").resolve(5).unwrap(), Some(vec![2, 3, 4]));
        assert_eq!(p("half").resolve(1).unwrap(), Some(vec![0]));
        assert_eq!(p(" 9, 0,5 ").resolve(10).unwrap(), Some(vec![0, 5, 9]));
        // the written form reads back as the same value
        for s in ["all", "half", "stride:2", "last:12", "0,5,9"] {
            assert_eq!(p(s).to_string(), s);
        }
    }

    #[test]
    fn bad_lookahead_layers_are_named_errors() {
        for s in [
            "", "stride:0", "last:0", "stride:", "every:2", "0,0", "1,-2", "last:x",
        ] {
            let e = s.parse::<LookaheadLayers>().unwrap_err().to_string();
            assert!(
                e.contains("lookahead layers") && e.contains(&format!("`{s}`")),
                "{s}: {e}"
            );
        }
        let e = "last:25".parse::<LookaheadLayers>().unwrap().resolve(24);
        assert!(e.unwrap_err().to_string().contains("the last 25"));
        let e = "3,24".parse::<LookaheadLayers>().unwrap().resolve(24);
        assert!(e.unwrap_err().to_string().contains("layer 24"));
    }

    /// The first index of the largest value, by a plain loop over the row.
    fn first_max(row: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[best] {
                best = i;
            }
        }
        best as u32
    }

    #[test]
    fn last_rows_takes_each_sequences_row_by_slice_or_gather() {
        // logits[s][i][j] = 100 s + 10 i + j
        let (b, n, v) = (3usize, 2usize, 4usize);
        let flat: Vec<f32> = (0..b * n * v)
            .map(|x| (100 * (x / (n * v)) + 10 * ((x / v) % n) + x % v) as f32)
            .collect();
        let t = Tensor::<Flex, 3>::from_data(TensorData::new(flat, [b, n, v]), &Default::default());
        let host = |x: Tensor<Flex, 2>| x.into_data().to_vec::<f32>().unwrap();
        let want = |rows: &[usize]| -> Vec<f32> {
            rows.iter()
                .enumerate()
                .flat_map(|(s, &r)| (0..v).map(move |j| (100 * s + 10 * r + j) as f32))
                .collect()
        };
        for rows in [[1usize, 1, 1], [0, 0, 0], [0, 1, 0], [1, 0, 1]] {
            assert_eq!(host(last_rows(t.clone(), &rows)), want(&rows), "{rows:?}");
        }
    }

    #[test]
    fn greedy_on_device_takes_the_first_max_within_the_vocabulary() {
        // a tie at the maximum (ids 1 and 3), a maximum past the vocabulary (id 4), -inf
        let rows = vec![
            vec![0.5, 3.0, -1.0, 3.0, 9.0],
            vec![f32::NEG_INFINITY, -2.0, -2.5, -7.0, 1.0],
        ];
        let ids = greedy_on_device(logits(&rows), 4).unwrap();
        assert_eq!(ids, vec![1, 1]);
        // no finite maximum: id 0, as the host argmax
        let rows = vec![vec![f32::NEG_INFINITY; 3], vec![1.0, 0.0, 2.0]];
        assert_eq!(greedy_on_device(logits(&rows), 3).unwrap(), vec![0, 2]);
        assert!(matches!(
            greedy_on_device(logits(&rows), 0),
            Err(dustin_core::CoreError::InvalidInput { .. })
        ));
    }

    #[test]
    fn greedy_on_device_matches_a_host_argmax_on_random_rows() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let rows: Vec<Vec<f32>> = (0..6)
            .map(|_| (0..997).map(|_| rng.random_range(-8.0f32..8.0)).collect())
            .collect();
        let want: Vec<u32> = rows.iter().map(|r| first_max(&r[..900])).collect();
        assert_eq!(greedy_on_device(logits(&rows), 900).unwrap(), want);
    }

    #[test]
    fn greedy_on_device_refuses_nan_and_inf_naming_the_sequence() {
        for bad in [f32::NAN, f32::INFINITY] {
            let rows = vec![vec![0.0, 1.0, 2.0], vec![0.0, bad, 2.0]];
            match greedy_on_device(logits(&rows), 3) {
                Err(dustin_core::CoreError::NonFinite { seq, .. }) => assert_eq!(seq, 1),
                other => panic!("{bad}: expected NonFinite for sequence 1, got {other:?}"),
            }
        }
        // a NaN past the vocabulary is not read
        let rows = vec![vec![0.0, 1.0, f32::NAN]];
        assert_eq!(greedy_on_device(logits(&rows), 2).unwrap(), vec![1]);
    }
}
