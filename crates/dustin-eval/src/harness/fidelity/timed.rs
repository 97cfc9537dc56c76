//! A selection policy that times its inner policy's hooks: the selection work of a
//! verification (estimation, re-ranking and the top-k step) in seconds.

use std::time::Instant;

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{AttentionHook, LayerAttnCtx, LayerSelection, Phase, Result, SelectionPolicy};

/// `P` with the wall-clock seconds of its attention hooks summed ([`Timed::secs`]): the
/// selection's scoring, re-ranking and top-k during verification, and the estimator's
/// observations of the attention probabilities. The model's own attention is not inside.
#[derive(Debug)]
pub(crate) struct Timed<P> {
    inner: P,
    secs: f64,
}

impl<P> Timed<P> {
    /// `inner`, with nothing timed yet.
    pub(crate) fn new(inner: P) -> Self {
        Self { inner, secs: 0.0 }
    }

    /// Seconds spent in the inner policy's hooks so far.
    pub(crate) fn secs(&self) -> f64 {
        self.secs
    }

    /// The inner policy.
    pub(crate) fn inner(&self) -> &P {
        &self.inner
    }

    fn time<T>(&mut self, f: impl FnOnce(&mut P) -> T) -> T {
        let t = Instant::now();
        let out = f(&mut self.inner);
        self.secs += t.elapsed().as_secs_f64();
        out
    }
}

impl<B: Backend, P: SelectionPolicy<B>> AttentionHook<B> for Timed<P> {
    fn on_layer(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<Option<LayerSelection<B>>> {
        self.time(|p| p.on_layer(ctx))
    }
    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        self.inner.wants_probs(layer, phase)
    }
    fn on_probs(&mut self, layer: usize, phase: Phase, probs: &Tensor<B, 4>) -> Result<()> {
        self.time(|p| p.on_probs(layer, phase, probs))
    }
    fn wants_key_mass(&self, layer: usize, phase: Phase) -> bool {
        self.inner.wants_key_mass(layer, phase)
    }
    fn on_key_mass(&mut self, layer: usize, phase: Phase, mass: &Tensor<B, 3>) -> Result<()> {
        self.time(|p| p.on_key_mass(layer, phase, mass))
    }
}

impl<B: Backend, P: SelectionPolicy<B>> SelectionPolicy<B> for Timed<P> {
    fn policy_name(&self) -> String {
        self.inner.policy_name()
    }
    fn reset(&mut self, batch: usize, num_layers: usize) {
        self.inner.reset(batch, num_layers)
    }
    fn wants_lookahead(&self) -> bool {
        self.inner.wants_lookahead()
    }
    fn observe_lookahead(&mut self, lookahead: &Tensor<B, 2>) {
        self.time(|p| p.observe_lookahead(lookahead))
    }
    fn begin_verify(&mut self, iteration: usize) {
        self.time(|p| p.begin_verify(iteration))
    }
    fn commit(&mut self, accepted: &[usize]) -> Result<()> {
        self.time(|p| p.commit(accepted))
    }
    fn commit_holding(&mut self, accepted: &[usize], hold: &[bool]) -> Result<()> {
        self.time(|p| p.commit_holding(accepted, hold))
    }
    fn retain(&mut self, keep: &[usize]) {
        self.inner.retain(keep)
    }
    fn estimation_reads(&self) -> Vec<f64> {
        self.inner.estimation_reads()
    }
}
