//! The engine parts the harness shares between evaluations: the fan-out hook that shows one
//! prefill to many selection policies, the engine's drafter and verifier continuing from a
//! shared prefill, one teacher-forced verification window, and host copies of tensors.

use std::sync::Arc;

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{
    AttentionHook, LayerAttnCtx, LayerSelection, Phase, Proposal, SelectionPolicy, TokenId,
    Verifier, VerifyCtx,
};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::Qwen2;
use dustin_select::BudgetedPolicy;
use dustin_spec::{LookaheadConfig, ModelDrafter, ModelVerifier};

use super::HarnessError;

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

/// The engine's drafter continuing from a shared draft prefill (`cache` holds the prompt),
/// its lookahead from the draft layers `lookahead` (`None`: all).
pub(crate) fn shared_drafter<B: KernelOps>(
    model: Arc<Qwen2<B>>,
    layers: Option<usize>,
    cache: DenseKvCache<B>,
    lookahead: Option<Vec<usize>>,
) -> ModelDrafter<B> {
    ModelDrafter::new(model, layers, 0)
        .with_lookahead(LookaheadConfig {
            layers: lookahead,
            ..LookaheadConfig::default()
        })
        .with_prefilled(cache)
}

/// The engine's verifier continuing from a shared prefill (`cache` holds the prompt, `last`
/// the logits at its last position) through `policy`, which has already observed the prompt.
pub(crate) fn shared_verifier<B: KernelOps, P: SelectionPolicy<B>>(
    model: Arc<Qwen2<B>>,
    policy: P,
    cache: DenseKvCache<B>,
    last: Tensor<B, 2>,
    vocab: usize,
) -> ModelVerifier<B, P> {
    ModelVerifier::new(model, policy, 0, vocab).with_prefilled(cache, last)
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
