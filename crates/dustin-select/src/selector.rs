use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{
    AttentionHook, CoreError, ImportanceEstimator, LayerAttnCtx, LayerSelection, Phase, Result,
    ScoreCtx, Scores, SelectionPolicy,
};

use crate::{extend_selection, select_top_k, EstimationCost, SelectConfig};
use dustin_kernels::KernelOps;

/// A [`SelectionPolicy`] whose per-layer budget can be set by a wrapper: what
/// [`Pyramid`](crate::Pyramid) wraps (tower-`Layer` style, checked by the compiler).
pub trait BudgetedPolicy<B: Backend>: SelectionPolicy<B> {
    /// The shared config (budget, sinks, window, refresh).
    fn select_config(&self) -> &SelectConfig;

    /// [`AttentionHook::on_layer`] with `budget` tokens for this layer instead of
    /// `select_config().budget`.
    ///
    /// # Errors
    /// Whatever the estimator or the top-k step reports.
    fn select_with_budget(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
        budget: usize,
    ) -> Result<Option<LayerSelection<B>>>;

    /// A copy of this policy in its current state (for example after prefill, so that two
    /// runs from one prefill need one prefill observation).
    fn boxed_clone(&self) -> Box<dyn BudgetedPolicy<B>>;
}

impl<B: Backend, P: BudgetedPolicy<B> + ?Sized> BudgetedPolicy<B> for Box<P> {
    fn select_config(&self) -> &SelectConfig {
        (**self).select_config()
    }
    fn select_with_budget(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
        budget: usize,
    ) -> Result<Option<LayerSelection<B>>> {
        (**self).select_with_budget(ctx, budget)
    }
    fn boxed_clone(&self) -> Box<dyn BudgetedPolicy<B>> {
        (**self).boxed_clone()
    }
}

impl<B: Backend> Clone for Box<dyn BudgetedPolicy<B>> {
    fn clone(&self) -> Self {
        self.boxed_clone()
    }
}

#[derive(Debug, Clone)]
struct Cached<B: Backend> {
    sel: LayerSelection<B>,
    lens: Vec<usize>,
    made_at: usize,
    budget: usize,
}

/// Any [`ImportanceEstimator`] as a [`SelectionPolicy`]: dense prefill (seen by the
/// estimator), then per verification layer: dense when every context fits the budget, else a
/// reused selection while it is fresh, else the estimator's scores through the shared top-k
/// step ([`select_top_k`]).
///
/// Freshness is counted in commits: a selection made during verification `t` serves
/// verifications `t .. t + refresh`, each time extended with the positions that entered the
/// context since it was made ([`extend_selection`]); [`SelectionPolicy::retain`], a reset, and
/// an acceptance drop (see [`SelectConfig::refresh_on_accept_drop`]) force a recompute.
///
/// Re-ranked reuse in one call: when the first layer of a verification reuses its selection
/// and the estimator re-ranks from what it holds
/// ([`ImportanceEstimator::rescore_layers_on_reuse`]), the selections of every layer that
/// reuses in this verification are made then, by one scoring pass and one top-k call over
/// the layers' stacked scores, and handed out as the forward pass reaches each layer: the
/// same selections as layer by layer, at a fixed number of launches (on CUDA, 28 top-k
/// launches of 32 rows each become one of 896 at Qwen2.5-7B, B=8). Off with
/// [`SelectConfig::batched_reuse`] (or [`Selector::with_batched_reuse`]). The layers go in
/// groups whose stacked f32 scores (about `[layers * batch, kv_heads, keys]`) stay within
/// [`STACK_BYTES`] ([`Selector::with_stack_bytes`]), so that the stack never needs a large
/// transient buffer of its own.
#[derive(Debug, Clone)]
pub struct Selector<B: Backend, E> {
    est: E,
    cfg: SelectConfig,
    iteration: usize,
    clock: usize,
    cache: Vec<Option<Cached<B>>>,
    accept: AcceptStats,
    reads: Vec<f64>,
    ahead: Option<Ahead<B>>,
    stack_bytes: usize,
    batched: usize,
    groups: usize,
}

/// The default of [`SelectConfig::accept_drop_sigmas`]: how many standard errors below the
/// running mean an iteration's batch-mean acceptance must fall to count as a drop
/// ([`SelectConfig::refresh_on_accept_drop`]). 3: our choice (a three-sigma test;
/// docs/decisions.md, "Selection and Dustin's estimator"). Without it, at a mean acceptance
/// length of 1.36 (docs/fidelity.md) every iteration that accepted nothing counted as a drop:
/// under the benchmark's schedule two verifications of three recomputed instead of one of
/// two.
pub const ACCEPT_DROP_SIGMAS: f64 = 3.0;

/// The most bytes of one stacked score tensor of re-ranked reuse ([`Selector`]), 32 MiB: our
/// choice, below the largest slice (41.5 MB) that CubeCL 0.10's pools serve from their
/// 332 MB pages on an 80 GB card (its `MemoryPoolOptions`, printed by its memory log). One
/// stack of all 28 layers of Qwen2.5-1.5B at 32k, B=16 is 118 MB, which opened a 1.33 GB
/// page of its own (`docs/perf.md`, "Memory"); there it now goes in 4 groups of 7 layers.
pub const STACK_BYTES: usize = 32 << 20;

/// Running acceptance statistics of a [`Selector`]: the mean over iterations of each
/// iteration's batch-mean accepted count, and the first two moments of the per-sequence
/// counts (their spread is the noise a drop must exceed).
#[derive(Debug, Clone, Default)]
struct AcceptStats {
    /// Sum of the iterations' batch means.
    sum_means: f64,
    iters: usize,
    /// Per-sequence counts: how many, their sum and their sum of squares.
    n: usize,
    s1: f64,
    s2: f64,
}

impl AcceptStats {
    /// Whether `accepted` (one count per active sequence) is a drop: its mean below `frac`
    /// times the running mean, by more than `sigmas` standard errors of a batch mean of
    /// `accepted.len()` sequences (the per-sequence standard deviation seen so far over the
    /// square root of the batch). Never on the first iteration.
    fn is_drop(&self, accepted: &[usize], frac: f64, sigmas: f64) -> bool {
        if self.iters == 0 || accepted.is_empty() || self.n == 0 {
            return false;
        }
        let mean = batch_mean(accepted);
        let mu = self.sum_means / self.iters as f64;
        let m = self.s1 / self.n as f64;
        let sd = (self.s2 / self.n as f64 - m * m).max(0.0).sqrt();
        let noise = sigmas * sd / (accepted.len() as f64).sqrt();
        mean < frac * mu && mu - mean > noise
    }

    fn record(&mut self, accepted: &[usize]) {
        if accepted.is_empty() {
            return;
        }
        self.sum_means += batch_mean(accepted);
        self.iters += 1;
        for &a in accepted {
            self.n += 1;
            self.s1 += a as f64;
            self.s2 += (a * a) as f64;
        }
    }
}

/// The mean of a non-empty batch's accepted counts.
fn batch_mean(accepted: &[usize]) -> f64 {
    accepted.iter().sum::<usize>() as f64 / accepted.len() as f64
}

/// Selections made ahead for the layers that reuse in one verification (see [`Selector`]):
/// valid while the clock, the context lengths and the budget are those it was made for.
#[derive(Debug, Clone)]
struct Ahead<B: Backend> {
    clock: usize,
    lens: Vec<usize>,
    budget: usize,
    /// Per layer; taken when handed out. All `None` when the estimator made none.
    sel: Vec<Option<LayerSelection<B>>>,
}

impl<B: Backend, E: ImportanceEstimator<B> + EstimationCost> Selector<B, E> {
    /// A selector running `est` under `cfg`.
    ///
    /// # Errors
    /// [`SelectConfig::validate`]'s.
    pub fn new(est: E, cfg: SelectConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(Self {
            est,
            cfg,
            iteration: 0,
            clock: 0,
            cache: Vec::new(),
            accept: AcceptStats::default(),
            reads: Vec::new(),
            ahead: None,
            stack_bytes: STACK_BYTES,
            batched: 0,
            groups: 0,
        })
    }

    /// How many verifications so far had their reusing layers re-ranked in one call (see
    /// [`Selector`]).
    pub fn batched_reuses(&self) -> usize {
        self.batched
    }

    /// How many groups of layers (one scoring pass and one top-k call each) those
    /// verifications re-ranked in all (see [`Selector::with_stack_bytes`]).
    pub fn batched_groups(&self) -> usize {
        self.groups
    }

    /// Whether reusing layers are re-ranked in one call per verification (`true`, the
    /// default; see [`Selector`]) or each in its turn (`false`: the same selections, one set
    /// of launches per layer; for comparisons): [`SelectConfig::batched_reuse`].
    #[must_use]
    pub fn with_batched_reuse(mut self, on: bool) -> Self {
        self.cfg.batched_reuse = on;
        self.ahead = None;
        self
    }

    /// The most bytes of one stacked score tensor of re-ranked reuse (see [`Selector`]):
    /// the reusing layers go in groups of `max(1, bytes / (batch * kv_heads * keys * 4))`
    /// (`keys`: the width of the layer's keys). Default [`STACK_BYTES`]; the selections do
    /// not depend on it.
    #[must_use]
    pub fn with_stack_bytes(mut self, bytes: usize) -> Self {
        self.stack_bytes = bytes;
        self.ahead = None;
        self
    }

    /// The estimator.
    pub fn estimator(&self) -> &E {
        &self.est
    }

    /// The estimator, mutably.
    pub fn estimator_mut(&mut self) -> &mut E {
        &mut self.est
    }

    /// The config.
    pub fn config(&self) -> &SelectConfig {
        &self.cfg
    }

    /// The estimator, consuming the selector.
    pub fn into_inner(self) -> E {
        self.est
    }

    /// Drops every cached selection (the next verification recomputes all layers).
    pub fn invalidate(&mut self) {
        self.cache.iter_mut().for_each(|c| *c = None);
        self.ahead = None;
    }

    /// One verification's accepted counts (of the sequences still generating): the clock
    /// advances, an acceptance drop beyond the noise forces a recompute
    /// (`refresh_on_accept_drop`), and the counts join the running statistics.
    fn observe_acceptance(&mut self, accepted: &[usize]) {
        self.clock += 1;
        if accepted.is_empty() {
            return;
        }
        if let Some(frac) = self.cfg.refresh_on_accept_drop {
            if self
                .accept
                .is_drop(accepted, frac, self.cfg.accept_drop_sigmas)
            {
                self.invalidate();
            }
        }
        self.accept.record(accepted);
    }

    fn count_reads(&mut self, lens: &[usize], f: impl Fn(&E, usize) -> f64) {
        if self.reads.len() != lens.len() {
            self.reads.resize(lens.len(), 0.0);
        }
        for (r, &l) in self.reads.iter_mut().zip(lens) {
            *r += f(&self.est, l);
        }
    }

    fn fresh(&self, layer: usize, lens: &[usize], budget: usize) -> Option<&Cached<B>> {
        let c = self.cache.get(layer)?.as_ref()?;
        let ok = self.clock - c.made_at < self.cfg.refresh
            && c.budget == budget
            && c.lens.len() == lens.len()
            && c.lens.iter().zip(lens).all(|(o, n)| o <= n);
        ok.then_some(c)
    }
}

impl<B: KernelOps, E: ImportanceEstimator<B> + EstimationCost + Clone + 'static> BudgetedPolicy<B>
    for Selector<B, E>
{
    fn select_config(&self) -> &SelectConfig {
        &self.cfg
    }

    fn select_with_budget(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
        budget: usize,
    ) -> Result<Option<LayerSelection<B>>> {
        if let Phase::Prefill { .. } = ctx.phase {
            self.est.observe_prefill(ctx)?;
            return Ok(None);
        }
        // dense when everything fits: budget >= context is bit-for-bit dense verification
        if ctx.ctx_lens.iter().all(|&l| l <= budget) {
            return Ok(None);
        }
        let sctx = ScoreCtx {
            attn: ctx,
            budget,
            n_sink: self.cfg.n_sink,
            window: self.cfg.window,
            iteration: self.iteration,
        };
        let (kvh, nh) = (ctx.k.dims()[1], ctx.q.dims()[1]);
        if let Some((sel, lens)) = self
            .fresh(ctx.layer, ctx.ctx_lens, budget)
            .map(|c| (c.sel.clone(), c.lens.clone()))
        {
            self.est.observe_verify(&sctx)?;
            self.count_reads(ctx.ctx_lens, |e, l| e.observe_reads(ctx.layer, l, kvh, nh));
            if let Some(sel) = self.take_ahead(ctx, &sctx, budget)? {
                return Ok(Some(sel));
            }
            return match self.est.rescore_on_reuse(&sctx)? {
                Some(scores) => self.top_k(scores, ctx, budget),
                // extended only when it is what gets used
                None => Ok(Some(extend_selection(&sel, &lens, ctx.ctx_lens)?)),
            };
        }
        let scores = self.est.score(&sctx)?;
        self.count_reads(ctx.ctx_lens, |e, l| e.score_reads(ctx.layer, l, kvh, nh));
        let sel = self.top_k(scores, ctx, budget)?;
        if self.cache.len() <= ctx.layer {
            self.cache.resize_with(ctx.layer + 1, || None);
        }
        self.cache[ctx.layer] = sel.as_ref().map(|s| Cached {
            sel: s.clone(),
            lens: ctx.ctx_lens.to_vec(),
            made_at: self.clock,
            budget,
        });
        Ok(sel)
    }

    fn boxed_clone(&self) -> Box<dyn BudgetedPolicy<B>> {
        Box::new(self.clone())
    }
}

impl<B: KernelOps, E: ImportanceEstimator<B> + EstimationCost + Clone + 'static> Selector<B, E> {
    /// This layer's selection from the ones made ahead for this verification (see
    /// [`Selector`]), making them at the first reusing layer: `None` where the estimator
    /// makes none (then the layer re-ranks or extends on its own) or batching is off.
    fn take_ahead(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
        sctx: &ScoreCtx<'_, B>,
        budget: usize,
    ) -> Result<Option<LayerSelection<B>>> {
        if !self.cfg.batched_reuse {
            return Ok(None);
        }
        let current = self
            .ahead
            .as_ref()
            .is_some_and(|a| a.clock == self.clock && a.budget == budget && a.lens == ctx.ctx_lens);
        if !current {
            // every layer from this one on that reuses now (the layers before have run)
            let layers: Vec<usize> = (ctx.layer..self.cache.len())
                .filter(|&l| self.fresh(l, ctx.ctx_lens, budget).is_some())
                .collect();
            let mut sel = vec![None; self.cache.len().max(ctx.layer + 1)];
            if layers.len() > 1 {
                // the stacked histories and the mixed scores are each about `[group *
                // batch, kv_heads, keys]` f32 (the mix's width rounds the keys up), the tiled
                // lookahead `[group * batch, keys]`
                let [b, kvh, keys, _] = ctx.k.dims();
                let per_layer = (b * kvh * keys * 4).max(1);
                let group = (self.stack_bytes / per_layer).max(1);
                let mut any = false;
                for part in layers.chunks(group) {
                    let Some(scores) = self.est.rescore_layers_on_reuse(part, sctx)? else {
                        break;
                    };
                    let split = self.top_k_stacked(scores, ctx, budget, part.len())?;
                    for (&l, s) in part.iter().zip(split) {
                        sel[l] = Some(s);
                    }
                    any = true;
                    self.groups += 1;
                }
                self.batched += usize::from(any);
            }
            self.ahead = Some(Ahead {
                clock: self.clock,
                lens: ctx.ctx_lens.to_vec(),
                budget,
                sel,
            });
        }
        Ok(self
            .ahead
            .as_mut()
            .and_then(|a| a.sel.get_mut(ctx.layer))
            .and_then(Option::take))
    }

    /// One top-k call over `reps` layers' stacked scores `[reps * batch, kv_heads, width]`,
    /// split back into one selection per layer.
    fn top_k_stacked(
        &self,
        scores: Tensor<B, 3>,
        ctx: &LayerAttnCtx<'_, B>,
        budget: usize,
        reps: usize,
    ) -> Result<Vec<LayerSelection<B>>> {
        let b = ctx.ctx_lens.len();
        let (got, kvh) = (scores.dims(), ctx.k.dims()[1]);
        if got[0] != reps * b || got[1] != kvh {
            return Err(CoreError::Shape {
                name: format!("stacked scores of `{}`", self.est.name()),
                expected: vec![reps * b, kvh, got[2]],
                found: got.to_vec(),
            });
        }
        let lens = ctx.ctx_lens.repeat(reps);
        let all = select_top_k(scores, &lens, self.cfg.keep_with_budget(budget))?;
        Ok((0..reps)
            .map(|i| LayerSelection {
                indices: all.indices.clone().narrow(0, i * b, b),
                counts: all.counts[i * b..(i + 1) * b].to_vec(),
            })
            .collect())
    }

    /// The top-k step over `scores` (`None`: dense).
    fn top_k(
        &self,
        scores: Scores<B>,
        ctx: &LayerAttnCtx<'_, B>,
        budget: usize,
    ) -> Result<Option<LayerSelection<B>>> {
        Ok(match scores {
            Scores::Dense => None,
            Scores::Tokens(s) => {
                let (got, want) = (s.dims(), ctx.k.dims()[1]);
                if got[1] != want {
                    return Err(CoreError::Shape {
                        name: format!("scores of `{}` at layer {}", self.est.name(), ctx.layer),
                        expected: vec![ctx.ctx_lens.len(), want, got[2]],
                        found: got.to_vec(),
                    });
                }
                Some(select_top_k(
                    s,
                    ctx.ctx_lens,
                    self.cfg.keep_with_budget(budget),
                )?)
            }
        })
    }
}

impl<B: KernelOps, E: ImportanceEstimator<B> + EstimationCost + Clone + 'static> AttentionHook<B>
    for Selector<B, E>
{
    fn on_layer(&mut self, ctx: &LayerAttnCtx<'_, B>) -> Result<Option<LayerSelection<B>>> {
        let budget = self.cfg.budget;
        self.select_with_budget(ctx, budget)
    }

    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        self.est.wants_probs(layer, phase)
    }

    fn on_probs(&mut self, layer: usize, phase: Phase, probs: &Tensor<B, 4>) -> Result<()> {
        self.est.observe_probs(layer, phase, probs)
    }
}

impl<B: KernelOps, E: ImportanceEstimator<B> + EstimationCost + Clone + 'static> SelectionPolicy<B>
    for Selector<B, E>
{
    fn policy_name(&self) -> String {
        self.est.name()
    }

    fn reset(&mut self, batch: usize, num_layers: usize) {
        self.est.reset(batch, num_layers);
        self.cache.clear();
        self.cache.resize_with(num_layers, || None);
        self.iteration = 0;
        self.clock = 0;
        self.ahead = None;
        self.accept = AcceptStats::default();
        self.reads = vec![0.0; batch];
    }

    fn wants_lookahead(&self) -> bool {
        self.est.wants_lookahead()
    }

    fn observe_lookahead(&mut self, lookahead: &Tensor<B, 2>) {
        self.est.observe_lookahead(lookahead);
        self.ahead = None;
    }

    fn begin_verify(&mut self, iteration: usize) {
        self.iteration = iteration;
        self.ahead = None;
    }

    fn commit(&mut self, accepted: &[usize]) -> Result<()> {
        self.est.commit(accepted)?;
        self.observe_acceptance(accepted);
        Ok(())
    }

    fn commit_holding(&mut self, accepted: &[usize], hold: &[bool]) -> Result<()> {
        let held = |b: usize| hold.get(b).copied().unwrap_or(false);
        self.est.commit(&dustin_core::zero_held(accepted, hold))?;
        // the acceptance statistics of the sequences still generating only
        let live: Vec<usize> = (0..accepted.len())
            .filter(|&b| !held(b))
            .map(|b| accepted[b])
            .collect();
        self.observe_acceptance(&live);
        Ok(())
    }

    fn retain(&mut self, keep: &[usize]) {
        self.est.retain(keep);
        self.reads = keep
            .iter()
            .map(|&k| self.reads.get(k).copied().unwrap_or(0.0))
            .collect();
        self.invalidate();
    }

    fn estimation_reads(&self) -> Vec<f64> {
        self.reads.clone()
    }
}
