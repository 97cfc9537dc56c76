use std::marker::PhantomData;
use std::time::Instant;

use burn_tensor::backend::Backend;
use dustin_core::{DraftCtx, Drafter, Proposal, SamplingConfig, TokenId, Verifier, VerifyCtx};
use dustin_qwen::generate::{pick_tokens, rows_to_host, seq_rng, FinishReason, StopRule};
use dustin_qwen::Tokenizer;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::accept;
use crate::error::{Result, SpecError};

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
    /// Sampling rule, applied identically to target (`p`) and draft (`q`).
    pub sampling: SamplingConfig,
    /// Seed of all draws.
    pub seed: u64,
    /// End-of-sequence ids.
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
        if cfg.gamma == 0 || cfg.gamma > MAX_GAMMA {
            return Err(SpecError::Config {
                name: "gamma",
                expected: format!("1 ..= {MAX_GAMMA}"),
                found: cfg.gamma.to_string(),
            });
        }
        run(
            Some(&mut self.drafter),
            &mut self.verifier,
            prompts,
            cfg,
            tokenizer,
            on_tokens,
            self.cancel.as_ref(),
            self.forced_acceptance
                .as_ref()
                .map(|a| (a, self.forced_ragged)),
            self.barrier.as_mut(),
        )
    }
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

/// A forced acceptance schedule (**benchmarks only**).
#[derive(Debug, Clone)]
enum Schedule {
    /// A mean of drafts accepted per iteration ([`SpeculativeDecoder::set_forced_acceptance`]).
    Mean(f64),
    /// A recorded trace of drafts accepted per iteration
    /// ([`SpeculativeDecoder::set_forced_trace`]).
    Trace(Vec<usize>),
}

impl Schedule {
    /// Drafts sequence `seq` of `n` accepts at `iteration` (before the cap at the proposal's
    /// length); `ragged` shifts the schedule per sequence.
    fn accepted(&self, iteration: usize, seq: usize, n: usize, ragged: bool) -> usize {
        match self {
            Schedule::Mean(a) => {
                // the sequence's phase in the schedule (0 unless ragged)
                let phase = if ragged { seq as f64 / n as f64 } else { 0.0 };
                let k = ((iteration + 1) as f64 * a + phase).floor()
                    - (iteration as f64 * a + phase).floor();
                k as usize
            }
            Schedule::Trace(t) => {
                let shift = if ragged { seq * t.len() / n.max(1) } else { 0 };
                t[(iteration + shift) % t.len()]
            }
        }
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
    forced: Option<(&Schedule, bool)>,
    mut barrier: Option<&mut PhaseBarrier>,
) -> Result<SpecOutput> {
    // the end of a phase: the device's queued work done first when a barrier is set
    let mut settle = || -> Result<()> {
        if let Some(b) = barrier.as_deref_mut() {
            (b.0)()?;
        }
        Ok(())
    };
    cfg.sampling.validate()?;
    let n = prompts.len();
    let vocab = verifier.vocab_size();
    let rule = StopRule {
        eos: cfg.eos.clone(),
        stop_strings: cfg.stop_strings.clone(),
        max_new_tokens: cfg.max_new_tokens,
    };
    // stream 0..n: acceptance draws per sequence; the draft derives its own per iteration
    let mut rngs: Vec<ChaCha8Rng> = (0..n).map(|i| seq_rng(cfg.seed, i)).collect();
    let t0 = Instant::now();
    let last = verifier.prefill(prompts)?;
    let rows = rows_to_host(last, vocab)?;
    let all: Vec<usize> = (0..n).collect();
    let first = pick_tokens(&rows, &cfg.sampling, &mut rngs, &all)?;
    if let Some(d) = drafter.as_deref_mut() {
        d.prefill(prompts, &first)?;
    }
    verifier.set_pending(&first)?;
    let prefill_secs = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut out: Vec<Vec<TokenId>> = vec![Vec::new(); n];
    let mut finish: Vec<Option<FinishReason>> = vec![None; n];
    let mut active: Vec<usize> = Vec::new();
    for (s, &t) in first.iter().enumerate() {
        if cfg.max_new_tokens == 0 {
            finish[s] = Some(FinishReason::Length);
            continue;
        }
        on_tokens(s, &[t]);
        match rule.push(&mut out[s], t, tokenizer)? {
            Some(r) => finish[s] = Some(r),
            None => active.push(s),
        }
    }
    let keep: Vec<usize> = (0..n).filter(|s| finish[*s].is_none()).collect();
    if keep.len() != n && !keep.is_empty() {
        verifier.retain(&keep)?;
        if let Some(d) = drafter.as_deref_mut() {
            d.retain(&keep)?;
        }
    }
    let mut iters = Vec::new();
    let mut iteration = 0usize;
    while !active.is_empty() {
        if cancel.is_some_and(dustin_core::CancelToken::is_cancelled) {
            for &s in &active {
                finish[s] = Some(FinishReason::Cancelled);
            }
            break;
        }
        let b = active.len();
        // 1. draft
        let td = Instant::now();
        let proposal = match drafter.as_deref_mut() {
            Some(d) => d.propose(&DraftCtx {
                gamma: cfg.gamma,
                temperature: cfg.sampling.temperature,
                top_p: cfg.sampling.top_p,
                top_k: cfg.sampling.top_k,
                seed: cfg.seed ^ (0x9E37_79B9_7F4A_7C15u64.wrapping_mul(iteration as u64 + 1)),
                want_lookahead: verifier.wants_lookahead(),
                vocab,
            })?,
            None => Proposal {
                tokens: vec![Vec::new(); b],
                q: None,
                lookahead: None,
            },
        };
        settle()?;
        let draft_secs = td.elapsed().as_secs_f64();
        // 2. verify
        let tv = Instant::now();
        let ver = verifier.verify(&VerifyCtx {
            proposal: &proposal,
            iteration,
        })?;
        let [_, m, v] = ver.logits.dims();
        // 3. accept
        settle()?;
        let ta = Instant::now();
        let verify_secs = (ta - tv).as_secs_f64();
        let mut accepted = Vec::with_capacity(b);
        let mut next = Vec::with_capacity(b);
        if cfg.sampling.is_greedy() {
            // the device argmax would pick an arbitrary token from NaN / +inf logits: refuse
            // them, as the host sampling path does
            let bad = crate::refused_logits(ver.logits.clone())
                .any_dim(2)
                .any_dim(1)
                .reshape([b])
                .into_data()
                .convert::<bool>()
                .into_vec::<bool>()
                .map_err(|e| dustin_core::CoreError::Model(format!("{e:?}")))?;
            if let Some(slot) = bad.iter().position(|&x| x) {
                return Err(dustin_core::CoreError::NonFinite {
                    what: "target logits of a verification".into(),
                    seq: active[slot],
                }
                .into());
            }
            let am = ver.logits.clone().argmax(2).reshape([b * m]).into_data();
            let am: Vec<i64> = am
                .convert::<i64>()
                .into_vec::<i64>()
                .map_err(|e| dustin_core::CoreError::Model(format!("{e:?}")))?;
            for slot in 0..b {
                let row: Vec<u32> = am[slot * m..(slot + 1) * m]
                    .iter()
                    .map(|&x| x as u32)
                    .collect();
                let acc = accept::greedy(&proposal.tokens[slot], &row);
                match forced {
                    Some((schedule, ragged)) => {
                        let k = schedule
                            .accepted(iteration, active[slot], n, ragged)
                            .min(proposal.tokens[slot].len());
                        accepted.push(k);
                        next.push(row[k]);
                    }
                    None => {
                        accepted.push(acc.accepted);
                        next.push(acc.next);
                    }
                }
            }
        } else if forced.is_some() {
            return Err(SpecError::Config {
                name: "sampling",
                expected: "greedy decoding with a forced acceptance schedule".into(),
                found: format!("temperature {}", cfg.sampling.temperature),
            });
        } else {
            let rows = rows_to_host(ver.logits.clone().reshape([b * m, v]), vocab)?;
            for (slot, &s) in active.iter().enumerate() {
                let p: Vec<Vec<f32>> = (0..m)
                    .map(|i| cfg.sampling.probs(&rows[slot * m + i], s))
                    .collect::<dustin_core::Result<_>>()?;
                let q: &[Vec<f32>] = proposal.q.as_ref().map_or(&[], |q| &q[slot]);
                let rng = &mut rngs[s];
                let acc = accept::stochastic(&proposal.tokens[slot], &p, q, s, &mut || {
                    rng.random::<f32>()
                })?;
                accepted.push(acc.accepted);
                next.push(acc.next);
            }
        }
        // emit, honouring EOS / stop strings / max_new_tokens inside the block
        let mut keep = Vec::with_capacity(b);
        for (slot, &s) in active.iter().enumerate() {
            let emitted: Vec<TokenId> = proposal.tokens[slot][..accepted[slot]]
                .iter()
                .copied()
                .chain(std::iter::once(next[slot]))
                .collect();
            let mut pushed = Vec::new();
            for &t in &emitted {
                pushed.push(t);
                if let Some(r) = rule.push(&mut out[s], t, tokenizer)? {
                    finish[s] = Some(r);
                    break;
                }
            }
            on_tokens(s, &pushed);
            if finish[s].is_none() {
                keep.push(slot);
            }
        }
        settle()?;
        let accept_secs = ta.elapsed().as_secs_f64();
        // 4. commit / roll back both caches, drop finished sequences
        let tc = Instant::now();
        if !keep.is_empty() {
            verifier.commit(&accepted, &next)?;
            if let Some(d) = drafter.as_deref_mut() {
                d.commit(&accepted, &next)?;
            }
            if keep.len() != b {
                verifier.retain(&keep)?;
                if let Some(d) = drafter.as_deref_mut() {
                    d.retain(&keep)?;
                }
            }
        }
        settle()?;
        let commit_secs = tc.elapsed().as_secs_f64();
        iters.push(IterationStats {
            accepted: accepted.clone(),
            draft_secs,
            verify_secs,
            accept_secs,
            commit_secs,
            kv_read_fraction: ver.kv_read_fraction.clone(),
            estimation_read_fraction: ver.estimation_read_fraction.clone(),
        });
        active = keep.iter().map(|&k| active[k]).collect();
        iteration += 1;
    }
    let decode_secs = t1.elapsed().as_secs_f64();
    let generated: usize = out.iter().map(Vec::len).sum();
    let first_emitted = if cfg.max_new_tokens == 0 { 0 } else { n };
    let seq_iters: usize = iters.iter().map(|i| i.accepted.len()).sum();
    let tau: f64 = iters
        .iter()
        .flat_map(|i| i.accepted.iter())
        .map(|&a| (a + 1) as f64)
        .sum::<f64>()
        / seq_iters.max(1) as f64;
    let kvf: f64 = iters
        .iter()
        .flat_map(|i| i.kv_read_fraction.iter())
        .sum::<f64>()
        / seq_iters.max(1) as f64;
    let estf: f64 = iters
        .iter()
        .flat_map(|i| i.estimation_read_fraction.iter())
        .sum::<f64>()
        / seq_iters.max(1) as f64;
    let summary = SpecSummary {
        iterations: iters.len(),
        mean_acceptance_length: tau,
        generated_tokens: generated,
        prefill_secs,
        decode_secs,
        // the first token of each sequence comes from the prefill logits, not from decoding
        tokens_per_sec: generated.saturating_sub(first_emitted) as f64 / decode_secs.max(1e-9),
        draft_secs: iters.iter().map(|i| i.draft_secs).sum(),
        verify_secs: iters.iter().map(|i| i.verify_secs).sum(),
        accept_secs: iters.iter().map(|i| i.accept_secs).sum(),
        commit_secs: iters.iter().map(|i| i.commit_secs).sum(),
        mean_kv_read_fraction: kvf,
        mean_estimation_read_fraction: estf,
    };
    Ok(SpecOutput {
        tokens: out,
        finish: finish
            .into_iter()
            .map(|f| f.unwrap_or(FinishReason::Length))
            .collect(),
        iterations: iters,
        summary,
    })
}
