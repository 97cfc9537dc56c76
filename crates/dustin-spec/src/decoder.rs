use std::marker::PhantomData;

use burn_tensor::backend::Backend;
use dustin_core::{DraftCtx, Drafter, Proposal, SamplingConfig, TokenId, Verifier};
use dustin_qwen::generate::FinishReason;
use dustin_qwen::Tokenizer;
use serde::Serialize;

use crate::error::{Result, SpecError};
use crate::join::{JoinDrafter, JoinVerifier};
use crate::run::{Schedule, SeqLimits, SpecRun};

/// Largest `gamma` accepted: verification runs `gamma + 1 <= 16` query tokens per sequence,
/// the range the fused verify-attention kernels are built for.
pub const MAX_GAMMA: usize = 15;

/// Options of speculative generation.
#[derive(Debug, Clone, Serialize)]
pub struct SpecConfig {
    /// Draft tokens per iteration (`1 ..= MAX_GAMMA`).
    pub gamma: usize,
    /// Tokens to generate per sequence at most (honoured exactly, also mid-block).
    pub max_new_tokens: usize,
    /// Sampling rule of every sequence without its own ([`SeqLimits::sampling`]), applied
    /// identically to target (`p`) and draft (`q`).
    pub sampling: SamplingConfig,
    /// Seed of the draws of every sequence without its own rule: sequence `s` (its index in
    /// the run) draws from stream `s`.
    pub seed: u64,
    /// End-of-sequence ids of every sequence without its own ([`SeqLimits::eos`]).
    pub eos: Vec<TokenId>,
    /// Stop strings (need a tokenizer).
    pub stop_strings: Vec<String>,
}

impl Default for SpecConfig {
    fn default() -> Self {
        Self {
            gamma: 4,
            max_new_tokens: 64,
            sampling: SamplingConfig::greedy(),
            seed: 0,
            eos: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

/// Statistics of one speculative iteration.
#[derive(Debug, Clone, Serialize)]
pub struct IterationStats {
    /// Draft tokens accepted per active sequence.
    pub accepted: Vec<usize>,
    /// Seconds drafting.
    pub draft_secs: f64,
    /// Seconds verifying (target forward, selection included).
    pub verify_secs: f64,
    /// Seconds in acceptance.
    pub accept_secs: f64,
    /// Seconds committing / rolling back.
    pub commit_secs: f64,
    /// KV fraction read by the target per active sequence.
    pub kv_read_fraction: Vec<f64>,
    /// The selection policy's own KV reads per active sequence, same unit
    /// ([`dustin_core::Verification::estimation_read_fraction`]).
    pub estimation_read_fraction: Vec<f64>,
}

/// Summary of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SpecSummary {
    /// Verification iterations.
    pub iterations: usize,
    /// Mean tokens emitted per sequence per verification: accepted drafts + 1 (the
    /// correction or bonus token), the usual "mean acceptance length" tau.
    pub mean_acceptance_length: f64,
    /// Generated tokens, all sequences.
    pub generated_tokens: usize,
    /// Prefill seconds (target and draft).
    pub prefill_secs: f64,
    /// Decode seconds (all iterations).
    pub decode_secs: f64,
    /// Decode tokens per second (all sequences; the first token of each sequence, which comes
    /// from the prefill logits, is not counted).
    pub tokens_per_sec: f64,
    /// Seconds per stage, summed.
    pub draft_secs: f64,
    /// Seconds verifying, summed.
    pub verify_secs: f64,
    /// Seconds accepting, summed.
    pub accept_secs: f64,
    /// Seconds committing, summed.
    pub commit_secs: f64,
    /// Mean KV fraction read per verification by the target's attention (the selection).
    pub mean_kv_read_fraction: f64,
    /// Mean KV fraction read per verification by the selection policy itself (estimation).
    pub mean_estimation_read_fraction: f64,
}

/// Output of a run.
#[derive(Debug, Clone)]
pub struct SpecOutput {
    /// Generated tokens per sequence.
    pub tokens: Vec<Vec<TokenId>>,
    /// Why each sequence stopped.
    pub finish: Vec<FinishReason>,
    /// Per-iteration statistics.
    pub iterations: Vec<IterationStats>,
    /// Summary.
    pub summary: SpecSummary,
}

/// **Benchmarks only.** A call that waits until the device has finished the work queued so
/// far (for example `B::sync(&device)`), run at the end of each phase of an iteration
/// ([`SpeculativeDecoder::set_phase_barrier`], [`autoregressive_with_barrier`]) so that
/// each phase's time ([`IterationStats`]) holds its own device work. Without it the phases
/// are timed on the host only: a phase's queued kernels may finish in the next phase's time,
/// and only their sum is exact.
pub struct PhaseBarrier(pub Box<dyn FnMut() -> dustin_core::Result<()>>);

impl std::fmt::Debug for PhaseBarrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PhaseBarrier")
    }
}

/// The speculative decoder, composed from a drafter `D` and a verifier `V` through generics.
#[derive(Debug)]
pub struct SpeculativeDecoder<B: Backend, D: Drafter<B>, V: Verifier<B>> {
    /// The drafter.
    pub drafter: D,
    /// The verifier.
    pub verifier: V,
    cancel: Option<dustin_core::CancelToken>,
    forced_acceptance: Option<Schedule>,
    /// Whether the forced schedule is shifted per sequence ([`Self::set_forced_ragged`]).
    forced_ragged: bool,
    /// Run at the end of each phase ([`Self::set_phase_barrier`]).
    barrier: Option<PhaseBarrier>,
    _b: PhantomData<B>,
}

impl<B: Backend, D: Drafter<B>, V: Verifier<B>> SpeculativeDecoder<B, D, V> {
    /// Composes a decoder.
    pub fn new(drafter: D, verifier: V) -> Self {
        Self {
            drafter,
            verifier,
            cancel: None,
            forced_acceptance: None,
            forced_ragged: false,
            barrier: None,
            _b: PhantomData,
        }
    }

    /// Checks `token` once per iteration of [`SpeculativeDecoder::generate`]: when it is
    /// cancelled, generation stops and every unfinished sequence ends with
    /// [`FinishReason::Cancelled`], keeping the tokens emitted so far.
    pub fn set_cancel(&mut self, token: dustin_core::CancelToken) {
        self.cancel = Some(token);
    }

    /// **Benchmarks only.** Replaces the acceptance rule by a fixed schedule: every sequence
    /// accepts `floor((i + 1) a) - floor(i a)` draft tokens at iteration `i` (at most
    /// `gamma`), so the mean accepted per iteration is `a` and the mean acceptance length is
    /// `a + 1`; the token after them is the target's greedy choice there. Everything else
    /// (drafting, selection, verification, rollback of both caches) runs as usual. This is how
    /// random-weight models, whose drafts the target never accepts, are timed under a stated
    /// acceptance (`dustin-bench e2e`). The output text is then not the target's. `None` restores the
    /// real rule.
    ///
    /// # Errors
    /// [`SpecError::Config`] naming `mean_accepted` unless it is finite and `>= 0`.
    pub fn set_forced_acceptance(&mut self, mean_accepted: Option<f64>) -> Result<()> {
        if let Some(a) = mean_accepted {
            if !a.is_finite() || a < 0.0 {
                return Err(SpecError::Config {
                    name: "mean_accepted",
                    expected: "a finite number >= 0".into(),
                    found: a.to_string(),
                });
            }
        }
        self.forced_acceptance = mean_accepted.map(Schedule::Mean);
        Ok(())
    }

    /// **Benchmarks only.** Like [`Self::set_forced_acceptance`], but replays a recorded
    /// acceptance trace: at iteration `i` a sequence accepts `trace[i % len]` draft tokens (at
    /// most `gamma`), where `trace` holds the drafts accepted at each verification of a real
    /// run (`dustin eval acceptance` keeps it per cell). With [`Self::set_forced_ragged`],
    /// sequence `s` of `n` starts `s * len / n` entries into the trace, so the sequences of a
    /// batch accept at different iterations with the trace's mean each. `None` restores the
    /// real rule.
    ///
    /// # Errors
    /// [`SpecError::Config`] naming `trace` when it is empty.
    pub fn set_forced_trace(&mut self, trace: Option<Vec<usize>>) -> Result<()> {
        if let Some(t) = &trace {
            if t.is_empty() {
                return Err(SpecError::Config {
                    name: "trace",
                    expected: "at least one verification's accepted count".into(),
                    found: "an empty trace".into(),
                });
            }
        }
        self.forced_acceptance = trace.map(Schedule::Trace);
        Ok(())
    }

    /// **Benchmarks only.** With a forced schedule ([`Self::set_forced_acceptance`]), shifts
    /// it per sequence (`true`): sequence `s` of `n` accepts `floor((i + 1) a + s / n) -
    /// floor(i a + s / n)` drafts at iteration `i`, so every sequence keeps the mean `a` but
    /// they accept at different iterations and their cached lengths differ, as in real
    /// batched decoding (where the same schedule for every sequence keeps them equal and
    /// hides the cost of ragged cache writes). `false` (the default) is the unshifted
    /// schedule.
    pub fn set_forced_ragged(&mut self, ragged: bool) {
        self.forced_ragged = ragged;
    }

    /// **Benchmarks only.** Runs `barrier` at the end of each phase of every iteration
    /// (draft, verify, accept, commit), so that each phase's time holds its own device work
    /// (see [`PhaseBarrier`]); `None` (the default) times the phases on the host only. The
    /// waits add their own small cost to every phase.
    pub fn set_phase_barrier(&mut self, barrier: Option<PhaseBarrier>) {
        self.barrier = barrier;
    }

    /// Speculative generation for a batch of prompts of any lengths.
    ///
    /// `on_tokens(seq, tokens)` is called with each sequence's newly emitted tokens.
    ///
    /// # Errors
    /// [`SpecError::Config`] for `gamma` outside `1 ..= MAX_GAMMA`; prompt and model errors.
    pub fn generate(
        &mut self,
        prompts: &[Vec<TokenId>],
        cfg: &SpecConfig,
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> Result<SpecOutput> {
        check_gamma(cfg.gamma)?;
        run(
            Some(&mut self.drafter),
            &mut self.verifier,
            prompts,
            cfg,
            tokenizer,
            on_tokens,
            self.cancel.as_ref(),
            self.forced_acceptance
                .clone()
                .map(|a| (a, self.forced_ragged)),
            self.barrier.as_mut(),
        )
    }
    /// Starts a run that the caller advances one iteration at a time ([`Self::step`]):
    /// prefills target and draft with `prompts` and emits each sequence's first token
    /// through `on_tokens(seq, tokens)`. `limits` is empty (every sequence takes
    /// `cfg.max_new_tokens`, `cfg.stop_strings`, `cfg.eos` and the run's sampling rule) or
    /// one [`SeqLimits`] per prompt. The
    /// cancel token and benchmark settings of [`Self::generate`] do not apply; cancel single
    /// sequences with [`SpecRun::cancel`]. `start`, then `step` until [`SpecRun::is_done`],
    /// then [`SpecRun::finish`] gives exactly [`Self::generate`]'s output.
    ///
    /// # Errors
    /// [`SpecError::Config`] for `gamma` outside `1 ..= MAX_GAMMA` or `limits` of another
    /// length than `prompts`; a sampling rule out of range; prompt and model errors.
    pub fn start(
        &mut self,
        prompts: &[Vec<TokenId>],
        cfg: &SpecConfig,
        limits: &[SeqLimits],
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> Result<SpecRun> {
        check_gamma(cfg.gamma)?;
        SpecRun::start_inner(
            Some(&mut self.drafter),
            &mut self.verifier,
            prompts,
            cfg,
            limits,
            tokenizer,
            on_tokens,
            None,
        )
    }

    /// One speculative iteration of `run` (made by [`Self::start`] on this decoder): drops
    /// the cache rows of sequences cancelled since the last step, then drafts, verifies,
    /// accepts and commits for the others, emitting their new tokens through `on_tokens`.
    /// Does nothing once the run is done.
    ///
    /// # Errors
    /// Model errors; the run should then be abandoned.
    pub fn step(
        &mut self,
        run: &mut SpecRun,
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> Result<()> {
        run.step_inner(
            Some(&mut self.drafter),
            &mut self.verifier,
            tokenizer,
            on_tokens,
            None,
        )
    }
}

/// Continuous batching (see [`crate::join`]): a run opened empty, sequences joining it
/// between iterations, each prefilled in chunks interleaved with the iterations.
impl<B: Backend, D: JoinDrafter<B>, V: JoinVerifier<B>> SpeculativeDecoder<B, D, V> {
    /// An empty run for sequences to [`Self::join`]; `cfg.max_new_tokens` and
    /// `cfg.stop_strings` are replaced by each sequence's [`SeqLimits`], and so are
    /// `cfg.eos`, `cfg.sampling` and `cfg.seed` where it gives its own. Greedy and sampled
    /// sequences share the batch.
    ///
    /// # Errors
    /// [`SpecError::Config`] for `gamma` outside `1 ..= MAX_GAMMA` or a sampling rule out of
    /// range.
    pub fn open(&self, cfg: &SpecConfig) -> Result<SpecRun> {
        check_gamma(cfg.gamma)?;
        SpecRun::empty(cfg)
    }

    /// Adds a sequence to `run` (opened by [`Self::open`] on this decoder, or started by
    /// [`Self::start`]) with room for `room` tokens past its prompt (its generation and
    /// `2 (gamma + 2)` for drafting); it joins the batch once [`Self::prefill`] has run its
    /// whole prompt. Returns its index in the run.
    ///
    /// # Errors
    /// A bad prompt, a sampling rule out of range, a cache that does not fit, a drafter
    /// that cannot take joining sequences; the run is unchanged then.
    pub fn join(
        &mut self,
        run: &mut SpecRun,
        prompt: &[TokenId],
        limits: &SeqLimits,
        room: usize,
    ) -> Result<usize> {
        run.join_inner(
            Some(&mut self.drafter),
            &mut self.verifier,
            prompt,
            limits,
            room,
        )
    }

    /// Prefills the joining sequences of `run` in chunks of `chunk` tokens, oldest first,
    /// while the tokens run stay within `budget` (one chunk at least when any is joining;
    /// the last chunk of a prompt may be up to half a chunk longer); a sequence
    /// whose prompt is done emits its first token through `on_tokens` and joins the batch,
    /// decoding from the next [`Self::step`]. Returns the prompt tokens run. A joining
    /// sequence's tokens equal those of its run alone ([`Self::generate`] with a prefill
    /// chunk of `chunk`) up to floating-point differences between batch shapes.
    ///
    /// # Errors
    /// Model errors; the run should then be abandoned.
    pub fn prefill(
        &mut self,
        run: &mut SpecRun,
        chunk: usize,
        budget: usize,
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> Result<usize> {
        run.prefill_inner(
            Some(&mut self.drafter),
            &mut self.verifier,
            chunk,
            budget,
            tokenizer,
            on_tokens,
        )
    }
}

fn check_gamma(gamma: usize) -> Result<()> {
    if gamma == 0 || gamma > MAX_GAMMA {
        return Err(SpecError::Config {
            name: "gamma",
            expected: format!("1 ..= {MAX_GAMMA}"),
            found: gamma.to_string(),
        });
    }
    Ok(())
}

/// Autoregressive generation through a verifier alone (one token per step, dense or sparse
/// attention per the verifier's policy): the baseline speculative decoding is measured
/// against. `cfg.gamma` is ignored.
///
/// # Errors
/// Prompt and model errors.
pub fn autoregressive<B: Backend, V: Verifier<B>>(
    verifier: &mut V,
    prompts: &[Vec<TokenId>],
    cfg: &SpecConfig,
    tokenizer: Option<&Tokenizer>,
    on_tokens: &mut dyn FnMut(usize, &[TokenId]),
) -> Result<SpecOutput> {
    autoregressive_with_barrier(verifier, prompts, cfg, tokenizer, on_tokens, None)
}

/// [`autoregressive`] with a [`PhaseBarrier`] run at the end of each phase of every step
/// (**benchmarks only**; see [`SpeculativeDecoder::set_phase_barrier`]).
///
/// # Errors
/// Prompt and model errors, and the barrier's.
pub fn autoregressive_with_barrier<B: Backend, V: Verifier<B>>(
    verifier: &mut V,
    prompts: &[Vec<TokenId>],
    cfg: &SpecConfig,
    tokenizer: Option<&Tokenizer>,
    on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    barrier: Option<&mut PhaseBarrier>,
) -> Result<SpecOutput> {
    run::<B, NoDraft, V>(
        None,
        verifier,
        prompts,
        &SpecConfig {
            gamma: 0,
            ..cfg.clone()
        },
        tokenizer,
        on_tokens,
        None,
        None,
        barrier,
    )
}

/// Autoregressive decoding through a verifier alone, driven one step at a time like
/// [`SpeculativeDecoder::start`] / [`SpeculativeDecoder::step`] (one token per sequence and
/// step; `cfg.gamma` is ignored). `start`, `step` until done, `finish` gives
/// [`autoregressive`]'s output.
#[derive(Debug)]
pub struct AutoregressiveDecoder<B: Backend, V: Verifier<B>> {
    /// The verifier (target model and its selection policy).
    pub verifier: V,
    _b: PhantomData<B>,
}

impl<B: Backend, V: Verifier<B>> AutoregressiveDecoder<B, V> {
    /// Wraps `verifier`.
    pub fn new(verifier: V) -> Self {
        Self {
            verifier,
            _b: PhantomData,
        }
    }

    /// Prefills the target with `prompts` and emits each sequence's first token (see
    /// [`SpeculativeDecoder::start`] for `limits` and `on_tokens`).
    ///
    /// # Errors
    /// [`SpecError::Config`] for `limits` of another length than `prompts`; a sampling rule
    /// out of range; prompt and model errors.
    pub fn start(
        &mut self,
        prompts: &[Vec<TokenId>],
        cfg: &SpecConfig,
        limits: &[SeqLimits],
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> Result<SpecRun> {
        SpecRun::start_inner::<B, NoDraft, V>(
            None,
            &mut self.verifier,
            prompts,
            &SpecConfig {
                gamma: 0,
                ..cfg.clone()
            },
            limits,
            tokenizer,
            on_tokens,
            None,
        )
    }

    /// One decoding step of `run` (made by [`Self::start`] on this decoder).
    ///
    /// # Errors
    /// Model errors; the run should then be abandoned.
    pub fn step(
        &mut self,
        run: &mut SpecRun,
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> Result<()> {
        run.step_inner::<B, NoDraft, V>(None, &mut self.verifier, tokenizer, on_tokens, None)
    }
}

/// Continuous batching for autoregressive decoding (see [`SpeculativeDecoder::open`]).
impl<B: Backend, V: JoinVerifier<B>> AutoregressiveDecoder<B, V> {
    /// An empty run for sequences to [`Self::join`] (`cfg.gamma` is ignored).
    ///
    /// # Errors
    /// [`SpecError::Config`] for a sampling rule out of range.
    pub fn open(&self, cfg: &SpecConfig) -> Result<SpecRun> {
        SpecRun::empty(&SpecConfig {
            gamma: 0,
            ..cfg.clone()
        })
    }

    /// Adds a sequence to `run` (see [`SpeculativeDecoder::join`]).
    ///
    /// # Errors
    /// A bad prompt, a sampling rule out of range or a cache that does not fit; the run is
    /// unchanged then.
    pub fn join(
        &mut self,
        run: &mut SpecRun,
        prompt: &[TokenId],
        limits: &SeqLimits,
        room: usize,
    ) -> Result<usize> {
        run.join_inner::<B, NoDraft, V>(None, &mut self.verifier, prompt, limits, room)
    }

    /// Prefills the joining sequences of `run` (see [`SpeculativeDecoder::prefill`]).
    ///
    /// # Errors
    /// Model errors; the run should then be abandoned.
    pub fn prefill(
        &mut self,
        run: &mut SpecRun,
        chunk: usize,
        budget: usize,
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> Result<usize> {
        run.prefill_inner::<B, NoDraft, V>(
            None,
            &mut self.verifier,
            chunk,
            budget,
            tokenizer,
            on_tokens,
        )
    }
}

impl<B: Backend> JoinDrafter<B> for NoDraft {
    fn begin_row(&mut self, _: usize, _: &[TokenId], _: usize) -> dustin_core::Result<()> {
        match *self {}
    }
    fn prefill_row(&mut self, _: usize, _: usize) -> dustin_core::Result<()> {
        match *self {}
    }
    fn join_row(&mut self, _: usize, _: TokenId) -> dustin_core::Result<()> {
        match *self {}
    }
    fn drop_row(&mut self, _: usize) {
        match *self {}
    }
    fn clear_batch(&mut self) {
        match *self {}
    }
}

/// Placeholder drafter type for [`autoregressive`]; never called.
#[derive(Debug)]
pub enum NoDraft {}

impl<B: Backend> Drafter<B> for NoDraft {
    fn prefill(&mut self, _: &[Vec<TokenId>], _: &[TokenId]) -> dustin_core::Result<()> {
        match *self {}
    }
    fn propose(&mut self, _: &DraftCtx) -> dustin_core::Result<Proposal<B>> {
        match *self {}
    }
    fn commit(&mut self, _: &[usize], _: &[TokenId]) -> dustin_core::Result<()> {
        match *self {}
    }
    fn retain(&mut self, _: &[usize]) -> dustin_core::Result<()> {
        match *self {}
    }
}

#[allow(clippy::too_many_arguments)]
fn run<B: Backend, D: Drafter<B>, V: Verifier<B>>(
    mut drafter: Option<&mut D>,
    verifier: &mut V,
    prompts: &[Vec<TokenId>],
    cfg: &SpecConfig,
    tokenizer: Option<&Tokenizer>,
    on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    cancel: Option<&dustin_core::CancelToken>,
    forced: Option<(Schedule, bool)>,
    mut barrier: Option<&mut PhaseBarrier>,
) -> Result<SpecOutput> {
    let mut run = SpecRun::start_inner(
        drafter.as_deref_mut(),
        verifier,
        prompts,
        cfg,
        &[],
        tokenizer,
        on_tokens,
        forced,
    )?;
    while !run.is_done() {
        if cancel.is_some_and(dustin_core::CancelToken::is_cancelled) {
            run.cancel_all();
            break;
        }
        run.step_inner(
            drafter.as_deref_mut(),
            verifier,
            tokenizer,
            on_tokens,
            barrier.as_deref_mut(),
        )?;
    }
    Ok(run.finish())
}
