use burn_tensor::{backend::Backend, Int, Tensor};

use crate::Result;

/// Which pass an attention layer is running in, so that a hook can tell prefill from
/// drafting from verification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Dense prompt prefill of one sequence (`seq` is its index in the batch), chunk by chunk;
    /// `last_chunk` is true for the chunk that holds the end of the prompt.
    Prefill {
        /// Index of the sequence in the batch being built.
        seq: usize,
        /// Whether this chunk ends the prompt.
        last_chunk: bool,
    },
    /// A decode or verification step over all active sequences.
    Decode,
}

/// What one attention layer shows an [`AttentionHook`] before it attends.
///
/// All tensors live on the model's device. Positions are absolute cache positions.
#[derive(Debug)]
pub struct LayerAttnCtx<'a, B: Backend> {
    /// Layer index, `0 .. num_layers`.
    pub layer: usize,
    /// Pass kind.
    pub phase: Phase,
    /// Queries after RoPE, `[batch, heads, n_new, head_dim]`.
    pub q: &'a Tensor<B, 4>,
    /// Keys after RoPE of positions `0 .. keys_len`, `[batch, kv_heads, keys_len, head_dim]`,
    /// the new tokens' keys already written at `ctx_lens[b] .. ctx_lens[b] + n_new`.
    pub k: &'a Tensor<B, 4>,
    /// Context length of each sequence before the new tokens, in tokens.
    pub ctx_lens: &'a [usize],
    /// Number of new (query) tokens per sequence in this pass.
    pub n_new: usize,
    /// Softmax scale, `1 / sqrt(head_dim)` (Vaswani et al. 2017).
    pub scale: f32,
}

impl<B: Backend> LayerAttnCtx<'_, B> {
    /// Number of query heads per KV head (the GQA group size).
    pub fn group(&self) -> usize {
        let heads = self.q.dims()[1];
        let kv = self.k.dims()[1];
        heads / kv.max(1)
    }
}

/// The positions one layer attends to in sparse verification, per sequence and KV head.
///
/// `indices` is `[batch, kv_heads, k]` (`k` >= the largest kept count in the batch; an
/// extended selection rounds it up, `dustin_select::SELECTION_MULTIPLE`): context
/// positions `< ctx_lens[b]`, ascending; slots at or past `counts[b]` are padding and must be
/// ignored by the reader. All query heads of a GQA group use their KV head's row. The new
/// tokens of the pass are always attended (causally) in addition to these.
#[derive(Debug, Clone)]
pub struct LayerSelection<B: Backend> {
    /// Selected context positions, `[batch, kv_heads, k]`, ascending per row.
    pub indices: Tensor<B, 3, Int>,
    /// Number of valid entries per sequence (the same for every KV head of a sequence).
    pub counts: Vec<usize>,
}

/// Called by every attention layer of a model forward pass.
///
/// A hook decides whether the layer attends densely (`Ok(None)`) or to a selection, and may
/// read the layer's queries, keys and attention probabilities (the signal taps the
/// estimators need, without a second forward pass).
pub trait AttentionHook<B: Backend> {
    /// Called before the layer attends. Returning `Some(selection)` makes the layer attend
    /// only to the selected context positions plus the new tokens.
    ///
    /// # Errors
    /// Whatever the implementation reports; the forward pass stops and returns it.
    fn on_layer(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<Option<LayerSelection<B>>>;

    /// Whether [`AttentionHook::on_probs`] should be called for `layer` (computing the
    /// probabilities is free on the dense path, but they must be kept).
    fn wants_probs(&self, _layer: usize, _phase: Phase) -> bool {
        false
    }

    /// The attention probabilities of a dense layer, `[batch, heads, n_new, keys_len]`
    /// (zero at masked positions), when [`AttentionHook::wants_probs`] said so.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn on_probs(&mut self, _layer: usize, _phase: Phase, _probs: &Tensor<B, 4>) -> Result<()> {
        Ok(())
    }

    /// Whether the hook needs only the attention mass per key (the probabilities summed over
    /// the heads of each KV head and the query rows) rather than the probabilities: a model
    /// with fused kernels then computes the mass with one scoring kernel and keeps its fused
    /// attention, and calls [`AttentionHook::on_key_mass`] instead of
    /// [`AttentionHook::on_probs`]. A hook that says `true` here must accept either call.
    fn wants_key_mass(&self, _layer: usize, _phase: Phase) -> bool {
        false
    }

    /// The attention mass per key of a dense layer, f32 `[batch, kv_heads, keys_len]`: entry
    /// `(b, h, j)` is the probability of key `j` summed over the query heads of KV head `h`
    /// and the `n_new` rows (what [`AttentionHook::on_probs`] would give summed that way).
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn on_key_mass(&mut self, _layer: usize, _phase: Phase, _mass: &Tensor<B, 3>) -> Result<()> {
        Ok(())
    }
}

/// The hook that always attends densely and records nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct DenseHook;

impl<B: Backend> AttentionHook<B> for DenseHook {
    fn on_layer(&mut self, _ctx: &LayerAttnCtx<'_, B>) -> Result<Option<LayerSelection<B>>> {
        Ok(None)
    }
}

/// A per-position importance score, or a decision not to select.
#[derive(Debug, Clone)]
pub enum Scores<B: Backend> {
    /// Attend to the whole context (no selection) at this layer.
    Dense,
    /// Scores `[batch, kv_heads, width]` over context positions `0 .. width`, `width` at least
    /// the largest context length of the batch (the built-in estimators use the keys' padded
    /// width, which changes less often); higher means keep. Positions past a sequence's own
    /// context length are ignored by the top-k step.
    Tokens(Tensor<B, 3>),
}

/// What an [`ImportanceEstimator`] may read when it scores one layer.
#[derive(Debug)]
pub struct ScoreCtx<'a, B: Backend> {
    /// The layer's attention context (queries, keys, lengths).
    pub attn: &'a LayerAttnCtx<'a, B>,
    /// The token budget the top-k step will keep for this layer.
    pub budget: usize,
    /// Leading positions the top-k step always keeps (attention sinks), filled by the
    /// selector from its config, so an estimator needs no config of its own for them.
    pub n_sink: usize,
    /// Most recent context positions the top-k step always keeps, filled by the selector.
    pub window: usize,
    /// Speculative iteration number since prefill (0 for the first verification).
    pub iteration: usize,
}

/// Produces importance scores over the KV cache; a shared top-k step (in `dustin-select`)
/// turns them into a [`LayerSelection`] with sinks, window and budget.
///
/// The life cycle for one batch: [`reset`](Self::reset), then the model's prefill hook
/// calls (phase [`Phase::Prefill`]), then per iteration: [`observe_lookahead`](Self::observe_lookahead)
/// (draft signal), [`score`](Self::score) per target layer (or
/// [`observe_verify`](Self::observe_verify) where the selector reuses a selection),
/// [`commit`](Self::commit).
pub trait ImportanceEstimator<B: Backend> {
    /// Registry name (for example `"dustin"`, `"quest"`).
    fn name(&self) -> String;

    /// Starts a new batch of `batch` sequences, dropping all state.
    fn reset(&mut self, batch: usize, num_layers: usize);

    /// Sees one prefill chunk of one sequence (dense). Default: nothing.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn observe_prefill(&mut self, _ctx: &LayerAttnCtx<'_, B>) -> Result<()> {
        Ok(())
    }

    /// The draft's lookahead signal for the coming verification: `[batch, ctx]` attention mass
    /// per context position, summed over the configured draft layers, heads and draft steps,
    /// normalised to sum 1 per sequence. Default: ignored.
    fn observe_lookahead(&mut self, _lookahead: &Tensor<B, 2>) {}

    /// Whether this estimator uses the draft's lookahead (so the drafter computes it).
    /// Default: no.
    fn wants_lookahead(&self) -> bool {
        false
    }

    /// Scores one layer for the coming sparse verification.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn score(&mut self, ctx: &ScoreCtx<'_, B>) -> Result<Scores<B>>;

    /// Sees a verification that *reuses* an earlier selection at this layer (the selector
    /// does not call [`score`](Self::score) then): an estimator that learns from verification
    /// queries (for example `dustin`'s history on its estimator heads) keeps its state current
    /// here, pending until [`commit`](Self::commit) like what it learns in `score`. Default:
    /// nothing.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn observe_verify(&mut self, _ctx: &ScoreCtx<'_, B>) -> Result<()> {
        Ok(())
    }

    /// On a verification that *reuses* a selection (after
    /// [`observe_verify`](Self::observe_verify)): fresh scores made only from what the
    /// estimator already holds, without reading the KV cache (for example `dustin`'s new
    /// draft lookahead mixed with its last history), or `None` to reuse the earlier selection
    /// extended by the new positions. Scores returned here go through the same top-k step as
    /// [`score`](Self::score)'s. Default: `None`.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn rescore_on_reuse(&mut self, _ctx: &ScoreCtx<'_, B>) -> Result<Option<Scores<B>>> {
        Ok(None)
    }

    /// [`rescore_on_reuse`](Self::rescore_on_reuse) for several layers at once, called by a
    /// selector when the first layer of a verification reuses its selection, before the
    /// forward pass reaches the others: scores `[layers.len() * batch, kv_heads, width]`,
    /// layer-major (rows `i * batch .. (i + 1) * batch` are layer `layers[i]`'s), the same
    /// values `rescore_on_reuse` would give each of those layers in its turn, so that one
    /// top-k call serves them all. `ctx` is the first layer's: only what every layer of the
    /// model shares is read from it (shapes, context lengths, keep rule), never its queries
    /// or keys. Scores here must therefore not depend on
    /// [`observe_verify`](Self::observe_verify) of the same verification. `None` (the
    /// default): each layer calls `rescore_on_reuse` itself.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn rescore_layers_on_reuse(
        &mut self,
        _layers: &[usize],
        _ctx: &ScoreCtx<'_, B>,
    ) -> Result<Option<Tensor<B, 3>>> {
        Ok(None)
    }

    /// Whether the estimator wants the layer's dense probabilities (see
    /// [`AttentionHook::wants_probs`]). Default: no.
    fn wants_probs(&self, _layer: usize, _phase: Phase) -> bool {
        false
    }

    /// Dense attention probabilities `[batch, heads, n_new, keys_len]`. Default: ignored.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn observe_probs(&mut self, _layer: usize, _phase: Phase, _probs: &Tensor<B, 4>) -> Result<()> {
        Ok(())
    }

    /// After acceptance: sequence `b` kept `accepted[b] + 1` of the verified positions (the
    /// pending token and the accepted drafts). State built from rejected positions must be
    /// dropped here (rollback). Default: nothing.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn commit(&mut self, _accepted: &[usize]) -> Result<()> {
        Ok(())
    }

    /// Keeps only the sequences listed in `keep` (ascending). Default: nothing.
    fn retain(&mut self, _keep: &[usize]) {}
}

/// The signal an estimator may take from prefill, re-exported for estimator authors:
/// the last chunk of the prompt is seen through [`ImportanceEstimator::observe_prefill`].
pub type PrefillSignal<'a, B> = LayerAttnCtx<'a, B>;

/// A selection policy: the [`AttentionHook`] a verifier runs its target with, plus the life
/// cycle the engine drives. `dustin-select`'s `Selector<E>` implements it for every
/// [`ImportanceEstimator`]; [`DenseHook`] implements it as dense verification.
pub trait SelectionPolicy<B: Backend>: AttentionHook<B> {
    /// Name for reports.
    fn policy_name(&self) -> String;
    /// Starts a new batch (before prefill).
    fn reset(&mut self, batch: usize, num_layers: usize);
    /// Whether the drafter should compute its lookahead signal.
    fn wants_lookahead(&self) -> bool {
        false
    }
    /// The draft's lookahead for the coming verification, `[batch, ctx]`.
    fn observe_lookahead(&mut self, _lookahead: &Tensor<B, 2>) {}
    /// Called before each verification with its iteration number.
    fn begin_verify(&mut self, _iteration: usize) {}
    /// Sequence `b` kept `accepted[b] + 1` verified positions (rollback of the rest).
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn commit(&mut self, _accepted: &[usize]) -> Result<()> {
        Ok(())
    }
    /// As [`commit`](Self::commit) for the rows with `hold[b] == false`; the rows with
    /// `hold[b] == true` are finished sequences kept in the batch, whose caches go back to
    /// where they stood before the verification ([`crate::Verifier::commit_holding`]). Their
    /// output is ignored, so a policy may keep their per-row state as it likes; one that
    /// keeps statistics of acceptance should leave them out. The default calls
    /// [`commit`](Self::commit) with 0 accepted drafts for a held row.
    ///
    /// # Errors
    /// Whatever the implementation reports.
    fn commit_holding(&mut self, accepted: &[usize], hold: &[bool]) -> Result<()> {
        self.commit(&crate::zero_held(accepted, hold))
    }
    /// Keeps only the sequences listed in `keep` (ascending).
    fn retain(&mut self, _keep: &[usize]) {}
    /// The policy's own reads of the KV cache since the last [`reset`](Self::reset), per
    /// sequence of the current batch, cumulative, in token-equivalents: one = the key and the
    /// value vector of one context position of one KV head, what dense attention reads per
    /// position and KV head (a key alone is half). These are the *estimation reads* (for
    /// example the exact attention of estimator heads over the whole context) that a report
    /// adds to the positions the selection makes the verifier read. Default: empty (no reads).
    fn estimation_reads(&self) -> Vec<f64> {
        Vec::new()
    }
}

impl<B: Backend> SelectionPolicy<B> for DenseHook {
    fn policy_name(&self) -> String {
        "dense".into()
    }
    fn reset(&mut self, _batch: usize, _num_layers: usize) {}
}

impl<B: Backend, H: AttentionHook<B> + ?Sized> AttentionHook<B> for Box<H> {
    fn on_layer(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<Option<LayerSelection<B>>> {
        (**self).on_layer(ctx)
    }
    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        (**self).wants_probs(layer, phase)
    }
    fn on_probs(&mut self, layer: usize, phase: Phase, probs: &Tensor<B, 4>) -> Result<()> {
        (**self).on_probs(layer, phase, probs)
    }
    fn wants_key_mass(&self, layer: usize, phase: Phase) -> bool {
        (**self).wants_key_mass(layer, phase)
    }
    fn on_key_mass(&mut self, layer: usize, phase: Phase, mass: &Tensor<B, 3>) -> Result<()> {
        (**self).on_key_mass(layer, phase, mass)
    }
}

impl<B: Backend, P: SelectionPolicy<B> + ?Sized> SelectionPolicy<B> for Box<P> {
    fn policy_name(&self) -> String {
        (**self).policy_name()
    }
    fn reset(&mut self, batch: usize, num_layers: usize) {
        (**self).reset(batch, num_layers)
    }
    fn wants_lookahead(&self) -> bool {
        (**self).wants_lookahead()
    }
    fn observe_lookahead(&mut self, lookahead: &Tensor<B, 2>) {
        (**self).observe_lookahead(lookahead)
    }
    fn begin_verify(&mut self, iteration: usize) {
        (**self).begin_verify(iteration)
    }
    fn estimation_reads(&self) -> Vec<f64> {
        (**self).estimation_reads()
    }
    fn commit(&mut self, accepted: &[usize]) -> Result<()> {
        (**self).commit(accepted)
    }
    fn commit_holding(&mut self, accepted: &[usize], hold: &[bool]) -> Result<()> {
        (**self).commit_holding(accepted, hold)
    }
    fn retain(&mut self, keep: &[usize]) {
        (**self).retain(keep)
    }
}
