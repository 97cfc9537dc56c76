//! The engine parts the harness shares between evaluations: the fan-out hook that shows one
//! prefill to many selection policies, the loaded pair whose drafter and verifier continue
//! from a shared prefill (and the greedy speculative run from it), one teacher-forced
//! verification window, and host copies of tensors.

use std::sync::Arc;

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{
    AttentionHook, DenseHook, LayerAttnCtx, LayerSelection, Phase, Proposal, SamplingConfig,
    SelectionPolicy, TokenId, Verifier, VerifyCtx,
};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::generate::prefill;
use dustin_qwen::{ModelFiles, Qwen2, Tokenizer};
use dustin_select::BudgetedPolicy;
use dustin_spec::{
    LookaheadConfig, LookaheadLayers, ModelDrafter, ModelVerifier, SpecConfig, SpecOutput,
    SpeculativeDecoder,
};

use super::{HarnessError, ModelHost};

/// Shows one prefill chunk to every selector instance (each returns no selection in prefill).
pub(crate) struct FanOut<'a, B: Backend> {
    /// The policies, each shown every chunk.
    pub(crate) policies: Vec<&'a mut Box<dyn BudgetedPolicy<B>>>,
}

impl<B: KernelOps> AttentionHook<B> for FanOut<'_, B> {
    fn on_layer(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
    ) -> dustin_core::Result<Option<LayerSelection<B>>> {
        for p in &mut self.policies {
            if p.on_layer(ctx)?.is_some() {
                return Err(dustin_core::CoreError::Model(format!(
                    "selector {} selected during prefill",
                    p.policy_name()
                )));
            }
        }
        Ok(None)
    }
    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        self.policies.iter().any(|p| p.wants_probs(layer, phase))
    }
    fn on_probs(
        &mut self,
        layer: usize,
        phase: Phase,
        probs: &Tensor<B, 4>,
    ) -> dustin_core::Result<()> {
        for p in &mut self.policies {
            if p.wants_probs(layer, phase) {
                p.on_probs(layer, phase, probs)?;
            }
        }
        Ok(())
    }
}

/// A tensor's values on the host, as f32.
pub(crate) fn host_f32<B: KernelOps, const D: usize>(
    t: Tensor<B, D>,
) -> Result<Vec<f32>, HarnessError> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| HarnessError::Usage(format!("tensor to host: {e:?}")))
}

/// An integer tensor's values on the host, as i64.
pub(crate) fn host_i64<B: KernelOps, const D: usize>(
    t: Tensor<B, D, burn_tensor::Int>,
) -> Result<Vec<i64>, HarnessError> {
    t.into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| HarnessError::Usage(format!("tensor to host: {e:?}")))
}

/// A target and the draft that proposes for it, loaded for the fidelity and LongBench runs:
/// where the engine's [`ModelDrafter`] and [`ModelVerifier`] of every run come from.
pub(crate) struct EvalPair<B: Backend> {
    /// The target model.
    pub(crate) target: Arc<Qwen2<B>>,
    /// The draft model (the target itself for an early-exit self-draft).
    pub(crate) draft: Arc<Qwen2<B>>,
    /// The early-exit self-draft's layers (`None`: all of the draft's).
    pub(crate) draft_layers: Option<usize>,
    /// The draft layers whose attention makes the lookahead (`None`: all;
    /// `--lookahead-layers`).
    pub(crate) lookahead_layers: Option<Vec<usize>>,
    /// Whether the draft is the target itself (its cache: the first layers of the target's).
    pub(crate) self_draft: bool,
    /// Token ids the verifier scores: the tokenizer's and the target's smaller vocabulary.
    pub(crate) vocab: usize,
}

/// The dense caches of both models after a prompt, and the target's logits at its last
/// position: where every run over that prompt starts.
pub(crate) struct Prefilled<B: Backend> {
    /// The target's cache of the prompt.
    pub(crate) cache: DenseKvCache<B>,
    /// The draft's cache of the prompt.
    pub(crate) draft_cache: DenseKvCache<B>,
    /// The target's logits at the last prompt position `[1, vocab]`.
    pub(crate) last: Tensor<B, 2>,
}

impl<B: KernelOps> EvalPair<B> {
    /// Loads the target of `files` for `positions` positions on `dev`, the draft of `--draft`
    /// (`draft`) for it, and resolves `lookahead` against the draft's layers. `tok` is the
    /// target's tokenizer; with `same_vocab` a separate draft must share its vocabulary.
    ///
    /// # Errors
    /// Model errors, the host's draft errors, and [`HarnessError::Usage`] naming
    /// `--lookahead-layers` for layers the draft does not have.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load<H: ModelHost>(
        host: &H,
        files: &ModelFiles,
        draft: &str,
        lookahead: &LookaheadLayers,
        positions: usize,
        dev: &B::Device,
        tok: &Tokenizer,
        same_vocab: bool,
    ) -> Result<Self, HarnessError> {
        let target = Arc::new(files.build_as::<B>(positions, dev, host.weight_format::<B>())?);
        let (draft, draft_layers, self_draft) =
            host.eval_draft(draft, &target, positions, dev, same_vocab.then_some(tok))?;
        let lookahead_layers = lookahead
            .resolve(draft_layers.unwrap_or(draft.layers.len()))
            .map_err(|e| HarnessError::Usage(format!("--lookahead-layers: {e}")))?;
        let vocab = tok.vocab_size().min(target.config.vocab_size);
        Ok(Self {
            target,
            draft,
            draft_layers,
            lookahead_layers,
            self_draft,
            vocab,
        })
    }

    /// The draft's dense cache of `ids` beside the target's `cache` of the same tokens: the
    /// first layers of `cache` for a self-draft, else a prefill of the draft (chunks of
    /// `chunk` tokens, room for `capacity` positions).
    ///
    /// # Errors
    /// Model errors of the draft's prefill.
    pub(crate) fn draft_cache(
        &self,
        cache: &DenseKvCache<B>,
        ids: &[TokenId],
        capacity: usize,
        chunk: usize,
    ) -> Result<DenseKvCache<B>, HarnessError> {
        if self.self_draft {
            return Ok(cache.first_layers(self.draft_layers.unwrap_or(usize::MAX)));
        }
        let (draft_cache, _, _) = prefill(
            &self.draft,
            &[ids.to_vec()],
            capacity,
            None,
            &mut DenseHook,
            chunk,
            false,
        )?;
        Ok(draft_cache)
    }

    /// The engine's drafter continuing from the draft's prefill `draft_cache`, its lookahead
    /// from the pair's lookahead layers.
    pub(crate) fn drafter(&self, draft_cache: DenseKvCache<B>) -> ModelDrafter<B> {
        ModelDrafter::new(self.draft.clone(), self.draft_layers, 0)
            .with_lookahead(LookaheadConfig {
                layers: self.lookahead_layers.clone(),
                ..LookaheadConfig::default()
            })
            .with_prefilled(draft_cache)
    }

    /// The engine's verifier continuing from the target's prefill (`cache` holds the prompt,
    /// `last` the logits at its last position) through `policy`, which has already observed
    /// the prompt.
    pub(crate) fn verifier<P: SelectionPolicy<B>>(
        &self,
        policy: P,
        cache: DenseKvCache<B>,
        last: Tensor<B, 2>,
    ) -> ModelVerifier<B, P> {
        ModelVerifier::new(self.target.clone(), policy, 0, self.vocab).with_prefilled(cache, last)
    }

    /// Greedy speculative decoding of up to `max_new` tokens after the prompt `ids`, drafter
    /// and verifier starting from `from` (cloned), the target verifying through `policy`
    /// (which has observed the prompt); stops at the tokens of `eos`.
    ///
    /// # Errors
    /// Engine and model errors.
    pub(crate) fn speculate<P: SelectionPolicy<B>>(
        &self,
        from: &Prefilled<B>,
        ids: &[TokenId],
        policy: P,
        gamma: usize,
        max_new: usize,
        eos: Vec<TokenId>,
    ) -> Result<SpecOutput, HarnessError> {
        let drafter = self.drafter(from.draft_cache.clone());
        let verifier = self.verifier(policy, from.cache.clone(), from.last.clone());
        let cfg = SpecConfig {
            gamma,
            max_new_tokens: max_new,
            sampling: SamplingConfig::greedy(),
            seed: 0,
            eos,
            stop_strings: Vec::new(),
        };
        Ok(SpeculativeDecoder::new(drafter, verifier).generate(
            &[ids.to_vec()],
            &cfg,
            None,
            &mut |_, _| {},
        )?)
    }
}

/// One teacher-forced window through `verifier`: the pending token and `drafted` verified
/// (with the draft's `lookahead`), all committed, `next` pending after. Returns the logits
/// `[1, gamma + 1, vocab]` and the selected and dense context reads.
pub(crate) fn forced_window<B: KernelOps, P: SelectionPolicy<B>>(
    verifier: &mut ModelVerifier<B, P>,
    drafted: &[TokenId],
    lookahead: Option<&Tensor<B, 2>>,
    iteration: usize,
    next: TokenId,
) -> dustin_core::Result<(Tensor<B, 3>, u64, u64)> {
    let proposal = Proposal {
        tokens: vec![drafted.to_vec()],
        q: None,
        lookahead: lookahead.cloned(),
    };
    let v = verifier.verify(&VerifyCtx {
        proposal: &proposal,
        iteration,
    })?;
    let (reads, dense) = verifier.last_reads();
    let (reads, dense) = (reads[0], dense[0]);
    verifier.commit(&[drafted.len()], &[next])?;
    Ok((v.logits, reads, dense))
}

/// Summed negative log-likelihood of `truth` (one per position) under `logp` `[1, n, vocab]`.
pub(crate) fn nll_of<B: KernelOps>(
    logp: &Tensor<B, 3>,
    truth: &[TokenId],
) -> Result<f64, HarnessError> {
    let n = truth.len();
    let idx: Vec<i64> = truth.iter().map(|&t| i64::from(t)).collect();
    let idx = Tensor::<B, 3, burn_tensor::Int>::from_data(
        burn_tensor::TensorData::new(idx, [1, n, 1]),
        &logp.device(),
    );
    let picked = host_f32(logp.clone().gather(2, idx))?;
    Ok(-picked.iter().map(|&x| f64::from(x)).sum::<f64>())
}
