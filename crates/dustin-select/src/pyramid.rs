//! `pyramid(S)`: per-layer budgets shrinking linearly with depth, same total (PyramidKV,
//! Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
//! Funneling").
//!
//! Reads nothing itself: it changes the budget a wrapped [`BudgetedPolicy`] gets per layer.
//!
//! The rule, as PyramidKV's reference code applies it to the part of the budget that is not
//! the always-kept window: with `free = budget - n_sink - window` tokens per layer on
//! average and `L` layers, the last layer gets `free / beta`, the first `2 * free - free / beta`,
//! the layers between linearly in between (so the first/last ratio is `2 * beta - 1`, 39 at
//! the default `beta = 20`); every layer then adds the sinks and window back. The per-layer
//! budgets are rounded so that their sum is exactly `L * budget`.

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{
    AttentionHook, CoreError, LayerAttnCtx, LayerSelection, Phase, Result, SelectionPolicy,
};
use serde::{Deserialize, Serialize};

use crate::{BudgetedPolicy, SelectConfig};

/// Knobs of [`Pyramid`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PyramidConfig {
    /// The last layer keeps `1 / beta` of the mean free budget. Default 20: PyramidKV's
    /// reference implementation (`beta = 20`); 1 gives uniform budgets.
    pub beta: f64,
}

impl Default for PyramidConfig {
    fn default() -> Self {
        Self { beta: 20.0 }
    }
}

impl PyramidConfig {
    /// Checks `beta >= 1` (finite).
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming `beta`.
    pub fn validate(&self) -> Result<()> {
        if !(self.beta.is_finite() && self.beta >= 1.0) {
            return Err(CoreError::invalid(
                "beta",
                "a finite number >= 1 (1 = uniform budgets)",
                self.beta,
            ));
        }
        Ok(())
    }
}

/// Per-layer budgets for `num_layers` layers averaging `cfg.budget` (see the module doc);
/// non-increasing with depth, each at least `n_sink + window`, summing to
/// `num_layers * cfg.budget`.
pub fn pyramid_budgets(cfg: &SelectConfig, num_layers: usize, beta: f64) -> Vec<usize> {
    let fixed = cfg.keep().always_kept();
    let free = cfg.budget.saturating_sub(fixed);
    if num_layers <= 1 {
        return vec![cfg.budget; num_layers];
    }
    let beta = beta.max(1.0);
    let last = free as f64 / beta;
    let first = 2.0 * free as f64 - last;
    let step = (first - last) / (num_layers - 1) as f64;
    let want: Vec<f64> = (0..num_layers).map(|l| first - step * l as f64).collect();
    // largest-remainder rounding; ties go to the shallower layer, which keeps the order
    let mut out: Vec<usize> = want.iter().map(|w| w.floor() as usize).collect();
    let total = free * num_layers;
    let short = total.saturating_sub(out.iter().sum());
    let mut order: Vec<usize> = (0..num_layers).collect();
    order.sort_by(|&a, &b| {
        let (fa, fb) = (want[a] - want[a].floor(), want[b] - want[b].floor());
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    for &l in order.iter().take(short) {
        out[l] += 1;
    }
    out.into_iter().map(|f| f + fixed).collect()
}

/// `pyramid(S)`: the wrapped policy `P` with PyramidKV's per-layer budgets (see the module
/// doc). `P` is any [`BudgetedPolicy`], usually a [`Selector`](crate::Selector).
#[derive(Debug, Clone)]
pub struct Pyramid<P> {
    inner: P,
    cfg: PyramidConfig,
    /// Per-layer budgets and the mean budget they were computed for.
    budgets: Option<(usize, Vec<usize>)>,
    num_layers: usize,
}

impl<P> Pyramid<P> {
    /// Wraps `inner`.
    ///
    /// # Errors
    /// [`PyramidConfig::validate`]'s.
    pub fn new(inner: P, cfg: PyramidConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            inner,
            cfg,
            budgets: None,
            num_layers: 0,
        })
    }

    /// The wrapped policy.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The wrapped policy, mutably.
    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    /// The config.
    pub fn config(&self) -> &PyramidConfig {
        &self.cfg
    }
}

impl<P> Pyramid<P> {
    fn layer_budget(&mut self, base: &SelectConfig, budget: usize, layer: usize) -> usize {
        if layer >= self.num_layers {
            return budget;
        }
        if !matches!(&self.budgets, Some((b, v)) if *b == budget && v.len() == self.num_layers) {
            let cfg = SelectConfig {
                budget,
                ..base.clone()
            };
            self.budgets = Some((
                budget,
                pyramid_budgets(&cfg, self.num_layers, self.cfg.beta),
            ));
        }
        self.budgets.as_ref().map_or(budget, |(_, v)| v[layer])
    }
}

impl<B: Backend, P: BudgetedPolicy<B> + Clone + 'static> BudgetedPolicy<B> for Pyramid<P> {
    fn select_config(&self) -> &SelectConfig {
        self.inner.select_config()
    }

    fn select_with_budget(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
        budget: usize,
    ) -> Result<Option<LayerSelection<B>>> {
        let base = self.inner.select_config().clone();
        let b = self.layer_budget(&base, budget, ctx.layer);
        self.inner.select_with_budget(ctx, b)
    }

    fn boxed_clone(&self) -> Box<dyn BudgetedPolicy<B>> {
        Box::new(self.clone())
    }
}

impl<B: Backend, P: BudgetedPolicy<B> + Clone + 'static> AttentionHook<B> for Pyramid<P> {
    fn on_layer(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<Option<LayerSelection<B>>> {
        let budget = self.inner.select_config().budget;
        self.select_with_budget(ctx, budget)
    }

    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        self.inner.wants_probs(layer, phase)
    }

    fn on_probs(&mut self, layer: usize, phase: Phase, probs: &Tensor<B, 4>) -> Result<()> {
        self.inner.on_probs(layer, phase, probs)
    }
}

impl<B: Backend, P: BudgetedPolicy<B> + Clone + 'static> SelectionPolicy<B> for Pyramid<P> {
    fn policy_name(&self) -> String {
        format!("pyramid({})", self.inner.policy_name())
    }
    fn reset(&mut self, batch: usize, num_layers: usize) {
        self.num_layers = num_layers;
        self.budgets = None;
        self.inner.reset(batch, num_layers);
    }
    fn wants_lookahead(&self) -> bool {
        self.inner.wants_lookahead()
    }
    fn observe_lookahead(&mut self, lookahead: &Tensor<B, 2>) {
        self.inner.observe_lookahead(lookahead);
    }
    fn begin_verify(&mut self, iteration: usize) {
        self.inner.begin_verify(iteration);
    }
    fn commit(&mut self, accepted: &[usize]) -> Result<()> {
        self.inner.commit(accepted)
    }
    fn commit_holding(&mut self, accepted: &[usize], hold: &[bool]) -> Result<()> {
        self.inner.commit_holding(accepted, hold)
    }
    fn retain(&mut self, keep: &[usize]) {
        self.inner.retain(keep);
    }
    fn estimation_reads(&self) -> Vec<f64> {
        self.inner.estimation_reads()
    }
}
