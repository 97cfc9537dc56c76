//! Continuous batching: sequences that join a running batch between iterations.
//!
//! A joining sequence is prefilled on its own (a batch-1 cache, a fresh selection policy),
//! chunk by chunk, so that a caller can interleave its chunks with the iterations of the
//! sequences already decoding ([`crate::SpeculativeDecoder::prefill`]); when its prompt is
//! done it is appended to the batch: its caches stacked after the batch's rows (both grown
//! to the larger capacity first), its policy state appended to the batch's
//! ([`JoinPolicy`]), its first token pending.

use std::sync::Arc;

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};
use dustin_core::{
    AttentionHook, DenseHook, Drafter, KvStore, LayerAttnCtx, LayerSelection, Phase,
    SelectionPolicy, TokenId, Verifier,
};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2};

/// A [`Verifier`] whose batch takes new sequences between iterations (see the module
/// docs). Joining sequences are named by an id of the caller's (unique among those joining).
pub trait JoinVerifier<B: Backend>: Verifier<B> {
    /// Starts joining sequence `seq`: checks `prompt` and allocates its cache, with room for
    /// `room` tokens past the prompt.
    ///
    /// # Errors
    /// An empty prompt, ids outside the vocabulary, a length past the model's positions, a
    /// cache that does not fit in memory.
    fn begin_row(&mut self, seq: usize, prompt: &[TokenId], room: usize)
        -> dustin_core::Result<()>;
    /// Prefills joining sequence `seq` up to prompt position `end` (past what is done);
    /// returns the logits of the prompt's last position, `[1, vocab]` (padded vocabulary
    /// allowed), once `end` is the prompt's length.
    ///
    /// # Errors
    /// An unknown `seq`, an `end` outside the prompt; model errors.
    fn prefill_row(&mut self, seq: usize, end: usize) -> dustin_core::Result<Option<Tensor<B, 2>>>;
    /// Appends the prefilled sequence `seq` to the batch (last row), `first` pending.
    ///
    /// # Errors
    /// An unknown or unfinished `seq`.
    fn join_row(&mut self, seq: usize, first: TokenId) -> dustin_core::Result<()>;
    /// Forgets joining sequence `seq` (it was cancelled or finished at its first token).
    fn drop_row(&mut self, seq: usize);
    /// Drops every sequence of the batch (caches and policy state), when all have finished.
    fn clear_batch(&mut self);
}

/// A [`Drafter`] whose batch takes new sequences between iterations (the counterpart of
/// [`JoinVerifier`], same ids).
pub trait JoinDrafter<B: Backend>: Drafter<B> {
    /// Starts joining sequence `seq` (see [`JoinVerifier::begin_row`]).
    ///
    /// # Errors
    /// As [`JoinVerifier::begin_row`]; a drafter that cannot take joining sequences.
    fn begin_row(&mut self, seq: usize, prompt: &[TokenId], room: usize)
        -> dustin_core::Result<()>;
    /// Prefills joining sequence `seq` up to prompt position `end`.
    ///
    /// # Errors
    /// An unknown `seq`, an `end` outside the prompt; model errors.
    fn prefill_row(&mut self, seq: usize, end: usize) -> dustin_core::Result<()>;
    /// Appends the prefilled sequence `seq` to the batch (last row), `first` pending.
    ///
    /// # Errors
    /// An unknown or unfinished `seq`.
    fn join_row(&mut self, seq: usize, first: TokenId) -> dustin_core::Result<()>;
    /// Forgets joining sequence `seq`.
    fn drop_row(&mut self, seq: usize);
    /// Drops every sequence of the batch.
    fn clear_batch(&mut self);
}

/// A [`SelectionPolicy`] whose per-sequence state can grow by the sequences of another
/// instance: what a [`crate::ModelVerifier`] needs to take joining sequences.
pub trait JoinPolicy<B: Backend>: SelectionPolicy<B> + Sized {
    /// A policy with the same settings and no sequences, to prefill joining ones with.
    fn fresh(&self) -> Self;
    /// Appends `other`'s sequences after this policy's own.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn append(&mut self, other: Self) -> dustin_core::Result<()>;
}

impl<B: Backend> JoinPolicy<B> for DenseHook {
    fn fresh(&self) -> Self {
        DenseHook
    }
    fn append(&mut self, _other: Self) -> dustin_core::Result<()> {
        Ok(())
    }
}

/// One joining sequence's prefill: its prompt, how much of it is done, its own cache and
/// hook.
#[derive(Debug)]
pub(crate) struct RowPrefill<B: Backend, H> {
    pub(crate) seq: usize,
    pub(crate) prompt: Vec<TokenId>,
    pub(crate) done: usize,
    pub(crate) cache: DenseKvCache<B>,
    pub(crate) hook: H,
}

impl<B: KernelOps, H: AttentionHook<B>> RowPrefill<B, H> {
    /// Checks `prompt` against `model` and allocates a batch-1 cache of `capacity`.
    pub(crate) fn new(
        model: &Qwen2<B>,
        seq: usize,
        prompt: &[TokenId],
        capacity: usize,
        layers: Option<usize>,
        hook: H,
    ) -> dustin_core::Result<Self> {
        dustin_qwen::generate::check_prompts(model, &[prompt.to_vec()], 0)?;
        if capacity > model.config.max_position_embeddings {
            return Err(dustin_core::CoreError::invalid(
                "room",
                format!(
                    "prompt + room within max_position_embeddings = {}",
                    model.config.max_position_embeddings
                ),
                capacity,
            ));
        }
        DenseKvCache::<B>::check_memory(model.kv_shape(1, capacity, layers), 1, model.device())?;
        Ok(Self {
            seq,
            prompt: prompt.to_vec(),
            done: 0,
            cache: model.new_cache(1, capacity, layers),
            hook,
        })
    }

    /// Runs the prompt from where it stands up to `end`; the last position's logits,
    /// `[1, vocab]`, when that ends the prompt.
    pub(crate) fn run(
        &mut self,
        model: &Qwen2<B>,
        end: usize,
        layers: Option<usize>,
    ) -> dustin_core::Result<Option<Tensor<B, 2>>> {
        if end <= self.done || end > self.prompt.len() {
            return Err(dustin_core::CoreError::invalid(
                "end",
                format!("{} < end <= {}", self.done, self.prompt.len()),
                end,
            ));
        }
        let last_chunk = end == self.prompt.len();
        let out = model.forward(
            &[self.prompt[self.done..end].to_vec()],
            &mut self.cache,
            &mut self.hook,
            ForwardOpts {
                phase: Phase::Prefill { seq: 0, last_chunk },
                logits: if last_chunk {
                    LogitsMode::Last
                } else {
                    LogitsMode::None
                },
                layers,
            },
        )?;
        self.done = end;
        if !last_chunk {
            return Ok(None);
        }
        let l = out.logits.ok_or_else(|| {
            dustin_core::CoreError::Model("prefill returned no logits for the last chunk".into())
        })?;
        let [_, m, v] = l.dims();
        Ok(Some(l.slice([0..1, m - 1..m, 0..v]).reshape([1, v])))
    }

    /// Whether the whole prompt is in the cache.
    pub(crate) fn finished(&self) -> bool {
        self.done == self.prompt.len()
    }
}

/// The position of `rows` whose sequence is `seq`, or an error naming it.
pub(crate) fn find_row<B: Backend, H>(
    rows: &[RowPrefill<B, H>],
    seq: usize,
) -> dustin_core::Result<usize> {
    rows.iter()
        .position(|r| r.seq == seq)
        .ok_or_else(|| dustin_core::CoreError::invalid("seq", "a joining sequence", seq))
}

/// `cache` with room for `capacity` tokens per sequence (unchanged when it has as much).
pub(crate) fn grow<B: Backend>(
    cache: DenseKvCache<B>,
    capacity: usize,
) -> dustin_core::Result<DenseKvCache<B>> {
    let s = cache.shape();
    if s.capacity >= capacity {
        return Ok(cache);
    }
    let dev = cache.view(0, 0).k.device();
    let pad = [s.batch, s.kv_heads, capacity - s.capacity, s.head_dim];
    let mut k = Vec::with_capacity(s.layers);
    let mut v = Vec::with_capacity(s.layers);
    for l in 0..s.layers {
        let view = cache.view(l, s.capacity);
        k.push(Tensor::cat(vec![view.k, Tensor::zeros(pad, &dev)], 2));
        v.push(Tensor::cat(vec![view.v, Tensor::zeros(pad, &dev)], 2));
    }
    let lens = cache.lens().to_vec();
    drop(cache);
    DenseKvCache::from_layers(k, v, &lens)
}

/// `batch` with `row` appended as its last sequence (both grown to the larger capacity);
/// `row` alone when there is no batch.
pub(crate) fn stack_row<B: Backend>(
    batch: Option<DenseKvCache<B>>,
    row: DenseKvCache<B>,
) -> dustin_core::Result<DenseKvCache<B>> {
    let Some(batch) = batch else {
        return Ok(row);
    };
    let cap = batch.capacity().max(row.capacity());
    let (batch, row) = (grow(batch, cap)?, grow(row, cap)?);
    DenseKvCache::stack(vec![batch, row])
}

/// A [`SelectionPolicy`] that runs one instance of `P` per sequence, so that sequences can
/// join and leave a batch with their own state ([`JoinPolicy`]) whatever `P` keeps per
/// sequence: every layer's context is split by sequence, each instance selects for its own,
/// and the selections are put back together (a sequence whose instance attends densely
/// gets all its context positions when another sequence's selects). Each instance counts its
/// own iterations from its first verification, so a sequence sees what it would alone. The
/// cost is one call of `P` per sequence and layer instead of one per layer.
pub struct PerRow<P> {
    make: Arc<dyn Fn() -> P + Send + Sync>,
    proto: P,
    rows: Vec<(P, usize)>,
    layers: usize,
    /// KV heads of the layer last seen (for the mass from probabilities)
    kv_heads: usize,
}

impl<P> std::fmt::Debug for PerRow<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PerRow")
            .field("rows", &self.rows.len())
            .field("layers", &self.layers)
            .finish_non_exhaustive()
    }
}

impl<P> PerRow<P> {
    /// A policy with no sequences whose instances `make` builds (each reset to one sequence
    /// before use).
    pub fn new(make: impl Fn() -> P + Send + Sync + 'static) -> Self {
        let make: Arc<dyn Fn() -> P + Send + Sync> = Arc::new(make);
        Self {
            proto: make(),
            make,
            rows: Vec::new(),
            layers: 0,
            kv_heads: 1,
        }
    }

    /// Sequences held.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no sequence is held.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

fn row_ctx<'a, B: Backend>(
    ctx: &LayerAttnCtx<'a, B>,
    phase: Phase,
    q: &'a Tensor<B, 4>,
    k: &'a Tensor<B, 4>,
    lens: &'a [usize],
) -> LayerAttnCtx<'a, B> {
    LayerAttnCtx {
        layer: ctx.layer,
        phase,
        q,
        k,
        ctx_lens: lens,
        n_new: ctx.n_new,
        scale: ctx.scale,
    }
}

impl<P> PerRow<P> {
    fn prefill_row(&mut self, seq: usize) -> dustin_core::Result<&mut P> {
        let n = self.rows.len();
        self.rows.get_mut(seq).map(|r| &mut r.0).ok_or_else(|| {
            dustin_core::CoreError::invalid("seq", format!("a sequence below {n}"), seq)
        })
    }
}

impl<B: Backend, P: SelectionPolicy<B>> AttentionHook<B> for PerRow<P> {
    fn on_layer(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
    ) -> dustin_core::Result<Option<LayerSelection<B>>> {
        self.kv_heads = ctx.k.dims()[1].max(1);
        if let Phase::Prefill { seq, last_chunk } = ctx.phase {
            let phase = Phase::Prefill { seq: 0, last_chunk };
            let p = self.prefill_row(seq)?;
            return p.on_layer(&row_ctx(ctx, phase, ctx.q, ctx.k, ctx.ctx_lens));
        }
        let b = ctx.ctx_lens.len();
        if b != self.rows.len() {
            return Err(dustin_core::CoreError::invalid(
                "batch",
                format!("{} sequences, as the policy holds", self.rows.len()),
                b,
            ));
        }
        if b == 1 {
            return self.rows[0].0.on_layer(ctx);
        }
        let mut sels = Vec::with_capacity(b);
        for (r, (p, _)) in self.rows.iter_mut().enumerate() {
            let q = ctx.q.clone().narrow(0, r, 1);
            let k = ctx.k.clone().narrow(0, r, 1);
            sels.push(p.on_layer(&row_ctx(
                ctx,
                Phase::Decode,
                &q,
                &k,
                &ctx.ctx_lens[r..r + 1],
            ))?);
        }
        if sels.iter().all(Option::is_none) {
            return Ok(None);
        }
        let kvh = ctx.k.dims()[1];
        let width = |r: usize, s: &Option<LayerSelection<B>>| match s {
            Some(s) => s.indices.dims()[2],
            None => ctx.ctx_lens[r],
        };
        let kmax = sels
            .iter()
            .enumerate()
            .map(|(r, s)| width(r, s))
            .max()
            .unwrap_or(0)
            .next_multiple_of(dustin_select::SELECTION_MULTIPLE);
        let dev = ctx.k.device();
        let mut parts = Vec::with_capacity(b);
        let mut counts = Vec::with_capacity(b);
        for (r, s) in sels.into_iter().enumerate() {
            let (idx, count) = match s {
                Some(s) => (s.indices, s.counts.first().copied().unwrap_or(0)),
                None => {
                    let n = ctx.ctx_lens[r];
                    let all: Vec<i64> = (0..kvh).flat_map(|_| 0..n as i64).collect();
                    let t = Tensor::<B, 3, Int>::from_data(TensorData::new(all, [1, kvh, n]), &dev);
                    (t, n)
                }
            };
            let w = idx.dims()[2];
            let idx = if w < kmax {
                Tensor::cat(vec![idx, Tensor::zeros([1, kvh, kmax - w], &dev)], 2)
            } else {
                idx
            };
            parts.push(idx);
            counts.push(count);
        }
        Ok(Some(LayerSelection {
            indices: Tensor::cat(parts, 0),
            counts,
        }))
    }

    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        match phase {
            Phase::Prefill { seq, last_chunk } => self
                .rows
                .get(seq)
                .is_some_and(|(p, _)| p.wants_probs(layer, Phase::Prefill { seq: 0, last_chunk })),
            Phase::Decode => self
                .rows
                .iter()
                .any(|(p, _)| p.wants_probs(layer, phase) || p.wants_key_mass(layer, phase)),
        }
    }

    fn on_probs(
        &mut self,
        layer: usize,
        phase: Phase,
        probs: &Tensor<B, 4>,
    ) -> dustin_core::Result<()> {
        if let Phase::Prefill { seq, last_chunk } = phase {
            let p = self.prefill_row(seq)?;
            return p.on_probs(layer, Phase::Prefill { seq: 0, last_chunk }, probs);
        }
        let [_, nh, n, l] = probs.dims();
        let kvh = self.kv_heads;
        for (r, (p, _)) in self.rows.iter_mut().enumerate() {
            let wants_probs = p.wants_probs(layer, phase);
            if !wants_probs && !p.wants_key_mass(layer, phase) {
                continue;
            }
            let mine = probs.clone().narrow(0, r, 1);
            if wants_probs {
                p.on_probs(layer, phase, &mine)?;
            } else {
                // the mass per key: summed over the query heads of each KV head and the rows
                let g = nh / kvh;
                let mass = mine
                    .reshape([1, kvh, g * n, l])
                    .sum_dim(2)
                    .reshape([1, kvh, l]);
                p.on_key_mass(layer, phase, &mass)?;
            }
        }
        Ok(())
    }

    fn wants_key_mass(&self, layer: usize, phase: Phase) -> bool {
        match phase {
            Phase::Prefill { seq, last_chunk } => self.rows.get(seq).is_some_and(|(p, _)| {
                p.wants_key_mass(layer, Phase::Prefill { seq: 0, last_chunk })
            }),
            // the mass for all when every sequence that wants a signal takes the mass
            Phase::Decode => {
                self.rows
                    .iter()
                    .any(|(p, _)| p.wants_key_mass(layer, phase))
                    && self.rows.iter().all(|(p, _)| {
                        !p.wants_probs(layer, phase) || p.wants_key_mass(layer, phase)
                    })
            }
        }
    }

    fn on_key_mass(
        &mut self,
        layer: usize,
        phase: Phase,
        mass: &Tensor<B, 3>,
    ) -> dustin_core::Result<()> {
        if let Phase::Prefill { seq, last_chunk } = phase {
            let p = self.prefill_row(seq)?;
            return p.on_key_mass(layer, Phase::Prefill { seq: 0, last_chunk }, mass);
        }
        for (r, (p, _)) in self.rows.iter_mut().enumerate() {
            if p.wants_key_mass(layer, phase) {
                p.on_key_mass(layer, phase, &mass.clone().narrow(0, r, 1))?;
            }
        }
        Ok(())
    }
}

impl<B: Backend, P: SelectionPolicy<B>> SelectionPolicy<B> for PerRow<P> {
    fn policy_name(&self) -> String {
        self.proto.policy_name()
    }

    fn reset(&mut self, batch: usize, num_layers: usize) {
        self.layers = num_layers;
        self.rows = (0..batch)
            .map(|_| {
                let mut p = (self.make)();
                p.reset(1, num_layers);
                (p, 0)
            })
            .collect();
    }

    fn wants_lookahead(&self) -> bool {
        self.proto.wants_lookahead()
    }

    fn observe_lookahead(&mut self, lookahead: &Tensor<B, 2>) {
        if self.rows.len() == 1 {
            self.rows[0].0.observe_lookahead(lookahead);
            return;
        }
        for (r, (p, _)) in self.rows.iter_mut().enumerate() {
            p.observe_lookahead(&lookahead.clone().narrow(0, r, 1));
        }
    }

    fn begin_verify(&mut self, _iteration: usize) {
        for (p, it) in &mut self.rows {
            p.begin_verify(*it);
            *it += 1;
        }
    }

    fn commit(&mut self, accepted: &[usize]) -> dustin_core::Result<()> {
        if accepted.len() != self.rows.len() {
            return Err(dustin_core::CoreError::invalid(
                "accepted",
                format!("{} counts", self.rows.len()),
                accepted.len(),
            ));
        }
        for ((p, _), &a) in self.rows.iter_mut().zip(accepted) {
            p.commit(&[a])?;
        }
        Ok(())
    }

    fn commit_holding(&mut self, accepted: &[usize], hold: &[bool]) -> dustin_core::Result<()> {
        if accepted.len() != self.rows.len() || hold.len() != self.rows.len() {
            return Err(dustin_core::CoreError::invalid(
                "accepted",
                format!("{} counts and flags", self.rows.len()),
                accepted.len().min(hold.len()),
            ));
        }
        // a held row's own policy sees nothing: its row was rolled back
        for (((p, _), &a), _) in self
            .rows
            .iter_mut()
            .zip(accepted)
            .zip(hold)
            .filter(|(_, &h)| !h)
        {
            p.commit(&[a])?;
        }
        Ok(())
    }

    fn retain(&mut self, keep: &[usize]) {
        let mut rows: Vec<Option<(P, usize)>> = self.rows.drain(..).map(Some).collect();
        self.rows = keep
            .iter()
            .filter_map(|&k| rows.get_mut(k).and_then(Option::take))
            .collect();
    }

    fn estimation_reads(&self) -> Vec<f64> {
        let reads: Vec<f64> = self
            .rows
            .iter()
            .map(|(p, _)| p.estimation_reads().first().copied().unwrap_or(0.0))
            .collect();
        if reads.iter().all(|&r| r == 0.0) {
            Vec::new()
        } else {
            reads
        }
    }
}

impl<B: Backend, P: SelectionPolicy<B>> JoinPolicy<B> for PerRow<P> {
    fn fresh(&self) -> Self {
        Self {
            make: self.make.clone(),
            proto: (self.make)(),
            rows: Vec::new(),
            layers: self.layers,
            kv_heads: self.kv_heads,
        }
    }

    fn append(&mut self, other: Self) -> dustin_core::Result<()> {
        if self.layers == 0 {
            self.layers = other.layers;
        }
        self.rows.extend(other.rows);
        Ok(())
    }
}
