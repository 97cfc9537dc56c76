//! One speculative run as a state machine: [`SpecRun`] holds everything between iterations
//! (tokens so far, finish reasons, random streams, statistics) while the drafter and the
//! verifier keep their caches. [`crate::SpeculativeDecoder::generate`] is `start`, `step`
//! until done, `finish`; a server drives the same steps itself
//! ([`crate::SpeculativeDecoder::start`], [`crate::SpeculativeDecoder::step`]) to interleave
//! several runs and to cancel single sequences between iterations.

use std::time::Instant;

use burn_tensor::backend::Backend;
use dustin_core::{DraftCtx, Drafter, Proposal, SeqSampling, TokenId, Verifier, VerifyCtx};
use dustin_qwen::generate::{rows_to_host, FinishReason, StopRule};
use dustin_qwen::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::accept;
use crate::decoder::{IterationStats, PhaseBarrier, SpecConfig, SpecOutput, SpecSummary};
use crate::error::{Result, SpecError};
use crate::join::{JoinDrafter, JoinVerifier};

/// Finished sequences stay in the batch as held rows (drafted for, verified and rolled back,
/// their output ignored) while more than this fraction of its rows still generate; at or
/// below it the batch shrinks to the live rows ([`Verifier::retain`]). Our choice: each
/// shrink copies both caches and brings a batch size whose kernels may not have run yet
/// (on CUDA, compilation and autotuning at first use), while a held row costs its share of a
/// pass that the host's launches, not the rows, bound at these batch sizes (`docs/perf.md`,
/// "GPU: launches and the host"); one half keeps the waste under 2x and the shrinks to
/// log2 of the batch size.
pub const HOLD_UNTIL: f64 = 0.5;

/// The entries of `v` (one per row) of the rows that were generating (`live`): an
/// iteration's statistics leave held rows out.
fn of_live<T: Copy>(v: &[T], live: &[bool]) -> Vec<T> {
    v.iter()
        .zip(live)
        .filter(|(_, &l)| l)
        .map(|(&x, _)| x)
        .collect()
}

/// Per-sequence settings of a run ([`crate::SpeculativeDecoder::start`],
/// [`crate::SpeculativeDecoder::join`]): they replace [`SpecConfig::max_new_tokens`] and
/// [`SpecConfig::stop_strings`] for one sequence, and [`SpecConfig::eos`],
/// [`SpecConfig::sampling`] and [`SpecConfig::seed`] where given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeqLimits {
    /// Tokens to generate for this sequence at most.
    pub max_new_tokens: usize,
    /// Stop strings of this sequence (need a tokenizer).
    pub stop_strings: Vec<String>,
    /// End-of-sequence ids of this sequence; `None`: the run's ([`SpecConfig::eos`]).
    pub eos: Option<Vec<TokenId>>,
    /// This sequence's sampling rule and random stream; `None`: the run's rule
    /// ([`SpecConfig::sampling`]) drawing from stream `seq` of [`SpecConfig::seed`], where
    /// `seq` is the sequence's index in the run. The sequence's draws depend on nothing
    /// else: a sequence with [`SeqSampling::new`]`(rule, seed)` draws what it draws alone in
    /// a run with `rule` and `seed`, whatever shares its batch.
    pub sampling: Option<SeqSampling>,
}

/// The random generator of `d`'s draws (stream `d.stream` of `d.seed`).
pub(crate) fn draw_rng(d: &SeqSampling) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(d.seed);
    r.set_stream(d.stream);
    r
}

/// The seed of a sequence's draft draws at its `step`-th proposal (counted from its first),
/// from its own seed: the draws of a proposal depend on the sequence alone, not on the
/// batch's iteration or the sequence's row.
fn draft_seed(seed: u64, step: usize) -> u64 {
    seed ^ 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(step as u64 + 1)
}

/// The token `d`'s rule picks from `row` (logits): the argmax when greedy, else a draw of
/// `rng` from the rule's distribution.
fn pick(row: &[f32], d: &SeqSampling, rng: &mut ChaCha8Rng, seq: usize) -> Result<TokenId> {
    let p = d.sampling.probs(row, seq)?;
    let t = if d.is_greedy() {
        dustin_core::argmax(&p)
    } else {
        dustin_core::sample_with(&p, rng.random::<f32>())
    };
    Ok(t as TokenId)
}

/// `limits`' sampling, checked, or the run's rule on stream `seq` of the run's seed.
fn seq_sampling(cfg: &SpecConfig, limits: Option<&SeqLimits>, seq: usize) -> Result<SeqSampling> {
    match limits.and_then(|l| l.sampling) {
        Some(d) => {
            d.sampling.validate()?;
            Ok(d)
        }
        None => Ok(SeqSampling {
            sampling: cfg.sampling,
            seed: cfg.seed,
            stream: seq as u64,
        }),
    }
}

/// The state of one speculative run between iterations (see the module docs). Made by
/// [`crate::SpeculativeDecoder::start`], advanced by [`crate::SpeculativeDecoder::step`],
/// closed by [`SpecRun::finish`]. Sequences are numbered by their prompt's index.
#[derive(Debug)]
pub struct SpecRun {
    cfg: SpecConfig,
    rules: Vec<StopRule>,
    /// each sequence's sampling rule and random stream
    draws: Vec<SeqSampling>,
    /// each sequence's acceptance draws (and its first token's)
    rngs: Vec<ChaCha8Rng>,
    /// proposals each sequence has been through (its draft seeds follow it)
    steps: Vec<usize>,
    out: Vec<Vec<TokenId>>,
    finish: Vec<Option<FinishReason>>,
    /// sequences in the caches' row order (finished ones are held there until half the
    /// batch is done, [`HOLD_UNTIL`], or a sequence joins)
    rows: Vec<usize>,
    iters: Vec<IterationStats>,
    iteration: usize,
    prefill_secs: f64,
    decode_start: Instant,
    forced: Option<(Schedule, bool)>,
    /// sequences being prefilled to join, in order: (sequence, prompt length, done)
    joining: Vec<(usize, usize, usize)>,
    /// whether finished sequences may be held in the batch ([`HOLD_UNTIL`]): a batch started
    /// whole, not one that sequences join (there a finished row's memory is for the next)
    hold_finished: bool,
}

/// Where the prefill chunk of a prompt of `len` tokens that starts at `start` ends, with
/// chunks of `chunk` tokens: the last chunk takes the remainder when it is at most half a
/// chunk longer (as `dustin_qwen::generate::prefill` splits a prompt).
pub(crate) fn chunk_end(start: usize, len: usize, chunk: usize) -> usize {
    let chunk = chunk.max(1);
    if len - start <= chunk + chunk / 2 {
        len
    } else {
        start + chunk
    }
}

impl SpecRun {
    /// Prefills target and draft, picks and emits each sequence's first token.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start_inner<B: Backend, D: Drafter<B>, V: Verifier<B>>(
        drafter: Option<&mut D>,
        verifier: &mut V,
        prompts: &[Vec<TokenId>],
        cfg: &SpecConfig,
        limits: &[SeqLimits],
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
        forced: Option<(Schedule, bool)>,
    ) -> Result<Self> {
        cfg.sampling.validate()?;
        let n = prompts.len();
        if !limits.is_empty() && limits.len() != n {
            return Err(SpecError::Config {
                name: "limits",
                expected: format!("none or one per prompt ({n})"),
                found: limits.len().to_string(),
            });
        }
        let rules: Vec<StopRule> = (0..n)
            .map(|s| match limits.get(s) {
                Some(l) => StopRule {
                    eos: l.eos.clone().unwrap_or_else(|| cfg.eos.clone()),
                    stop_strings: l.stop_strings.clone(),
                    max_new_tokens: l.max_new_tokens,
                },
                None => StopRule {
                    eos: cfg.eos.clone(),
                    stop_strings: cfg.stop_strings.clone(),
                    max_new_tokens: cfg.max_new_tokens,
                },
            })
            .collect();
        let draws: Vec<SeqSampling> = (0..n)
            .map(|s| seq_sampling(cfg, limits.get(s), s))
            .collect::<Result<_>>()?;
        let vocab = verifier.vocab_size();
        // one stream per sequence for its acceptance draws; the draft derives its own per
        // proposal
        let mut rngs: Vec<ChaCha8Rng> = draws.iter().map(draw_rng).collect();
        let t0 = Instant::now();
        let last = verifier.prefill(prompts)?;
        let rows = rows_to_host(last, vocab)?;
        let all: Vec<usize> = (0..n).collect();
        let first: Vec<TokenId> = rows
            .iter()
            .enumerate()
            .map(|(s, row)| pick(row, &draws[s], &mut rngs[s], s))
            .collect::<Result<_>>()?;
        let mut drafter = drafter;
        if let Some(d) = drafter.as_deref_mut() {
            d.prefill(prompts, &first)?;
        }
        verifier.set_pending(&first)?;
        let prefill_secs = t0.elapsed().as_secs_f64();

        let mut out: Vec<Vec<TokenId>> = vec![Vec::new(); n];
        let mut finish: Vec<Option<FinishReason>> = vec![None; n];
        for (s, &t) in first.iter().enumerate() {
            if rules[s].max_new_tokens == 0 {
                finish[s] = Some(FinishReason::Length);
                continue;
            }
            on_tokens(s, &[t]);
            if let Some(r) = rules[s].push(&mut out[s], t, tokenizer)? {
                finish[s] = Some(r);
            }
        }
        let mut run = Self {
            cfg: cfg.clone(),
            rules,
            draws,
            rngs,
            steps: vec![0; n],
            out,
            finish,
            rows: all,
            iters: Vec::new(),
            iteration: 0,
            prefill_secs,
            decode_start: Instant::now(),
            forced,
            joining: Vec::new(),
            hold_finished: true,
        };
        run.drop_finished(drafter, verifier, false)?;
        Ok(run)
    }

    /// Whether both models can hold rows ([`Verifier::can_hold`], [`Drafter::can_hold`]).
    fn can_hold<B: Backend, D: Drafter<B>, V: Verifier<B>>(
        drafter: Option<&D>,
        verifier: &V,
    ) -> bool {
        verifier.can_hold() && drafter.is_none_or(|d| d.can_hold())
    }

    /// Whether finished sequences may stay in the batch as held rows while `live` of its
    /// `rows` rows still generate: the run was started as a whole batch (not opened for
    /// sequences to join), both models can hold rows, no sequence is joining (its prefill
    /// would want their memory), some row is live, and more than half are ([`HOLD_UNTIL`]).
    fn holds<B: Backend, D: Drafter<B>, V: Verifier<B>>(
        &self,
        drafter: Option<&D>,
        verifier: &V,
        live: usize,
        rows: usize,
    ) -> bool {
        self.hold_finished
            && Self::can_hold(drafter, verifier)
            && self.joining.is_empty()
            && live > 0
            && live as f64 > HOLD_UNTIL * rows as f64
    }

    /// Drops the rows of finished sequences from both caches; with `may_hold`, only once
    /// [`Self::holds`] says the batch should shrink.
    fn drop_finished<B: Backend, D: Drafter<B>, V: Verifier<B>>(
        &mut self,
        drafter: Option<&mut D>,
        verifier: &mut V,
        may_hold: bool,
    ) -> Result<()> {
        let keep: Vec<usize> = (0..self.rows.len())
            .filter(|&slot| self.finish[self.rows[slot]].is_none())
            .collect();
        if keep.len() == self.rows.len()
            || (may_hold && self.holds(drafter.as_deref(), verifier, keep.len(), self.rows.len()))
        {
            return Ok(());
        }
        if !keep.is_empty() {
            // the drafter first: a draft that reads the target's cache lets go of it
            if let Some(d) = drafter {
                d.retain(&keep)?;
            }
            verifier.retain(&keep)?;
        }
        self.rows = keep.iter().map(|&k| self.rows[k]).collect();
        Ok(())
    }

    /// Whether every sequence has finished (or was cancelled).
    pub fn is_done(&self) -> bool {
        self.finish.iter().all(Option::is_some)
    }

    /// The sequences still generating, by prompt index.
    pub fn active(&self) -> Vec<usize> {
        (0..self.finish.len())
            .filter(|&s| self.finish[s].is_none())
            .collect()
    }

    /// Why sequence `seq` stopped, `None` while it is generating (or `seq` is out of range).
    pub fn finish_reason(&self, seq: usize) -> Option<FinishReason> {
        self.finish.get(seq).copied().flatten()
    }

    /// The tokens sequence `seq` emitted so far (empty for an index out of range).
    pub fn tokens(&self, seq: usize) -> &[TokenId] {
        self.out.get(seq).map_or(&[], Vec::as_slice)
    }

    /// Ends sequence `seq` with [`FinishReason::Cancelled`] if it is still generating; its
    /// cache rows are dropped at the next step, or held there as a finished sequence's are
    /// ([`HOLD_UNTIL`]). Returns whether it was generating.
    pub fn cancel(&mut self, seq: usize) -> bool {
        match self.finish.get_mut(seq) {
            Some(f @ None) => {
                *f = Some(FinishReason::Cancelled);
                true
            }
            _ => false,
        }
    }

    /// Cancels every sequence still generating.
    pub fn cancel_all(&mut self) {
        for f in self.finish.iter_mut().filter(|f| f.is_none()) {
            *f = Some(FinishReason::Cancelled);
        }
    }

    /// The sequences still being prefilled to join the batch, by index.
    pub fn joining(&self) -> Vec<usize> {
        self.joining.iter().map(|&(s, _, _)| s).collect()
    }

    /// Prompt tokens of the joining sequences still to prefill.
    pub fn prefill_backlog(&self) -> usize {
        self.joining.iter().map(|&(_, len, done)| len - done).sum()
    }

    /// Iterations run so far.
    pub fn iterations(&self) -> &[IterationStats] {
        &self.iters
    }

    /// An empty run: sequences join it one by one ([`crate::SpeculativeDecoder::join`]).
    ///
    /// # Errors
    /// [`SpecError::Config`] for a sampling rule out of range.
    pub(crate) fn empty(cfg: &SpecConfig) -> Result<Self> {
        cfg.sampling.validate()?;
        Ok(Self {
            cfg: cfg.clone(),
            rules: Vec::new(),
            draws: Vec::new(),
            rngs: Vec::new(),
            steps: Vec::new(),
            out: Vec::new(),
            finish: Vec::new(),
            rows: Vec::new(),
            iters: Vec::new(),
            iteration: 0,
            prefill_secs: 0.0,
            decode_start: Instant::now(),
            forced: None,
            joining: Vec::new(),
            hold_finished: false,
        })
    }

    /// Adds a sequence that joins once its prompt is prefilled ([`Self::prefill_inner`]);
    /// returns its index.
    pub(crate) fn join_inner<B: Backend, D: JoinDrafter<B>, V: JoinVerifier<B>>(
        &mut self,
        drafter: Option<&mut D>,
        verifier: &mut V,
        prompt: &[TokenId],
        limits: &SeqLimits,
        room: usize,
    ) -> Result<usize> {
        let seq = self.finish.len();
        let draw = seq_sampling(&self.cfg, Some(limits), seq)?;
        // held rows leave first: the joining row's memory check sees their room
        let mut drafter = drafter;
        self.drop_finished(drafter.as_deref_mut(), verifier, false)?;
        verifier.begin_row(seq, prompt, room)?;
        if let Some(d) = drafter {
            if let Err(e) = d.begin_row(seq, prompt, room) {
                verifier.drop_row(seq);
                return Err(e.into());
            }
        }
        self.rules.push(StopRule {
            eos: limits.eos.clone().unwrap_or_else(|| self.cfg.eos.clone()),
            stop_strings: limits.stop_strings.clone(),
            max_new_tokens: limits.max_new_tokens,
        });
        self.rngs.push(draw_rng(&draw));
        self.draws.push(draw);
        self.steps.push(0);
        self.out.push(Vec::new());
        self.finish.push(None);
        self.joining.push((seq, prompt.len(), 0));
        Ok(seq)
    }

    /// Runs prefill chunks of `chunk` tokens of the joining sequences, oldest first, while
    /// the prompt tokens run stay within `budget` (one chunk at least when any sequence is
    /// joining); a sequence whose prompt is done picks and emits its first token and joins
    /// the batch. Returns the prompt tokens run.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prefill_inner<B: Backend, D: JoinDrafter<B>, V: JoinVerifier<B>>(
        &mut self,
        mut drafter: Option<&mut D>,
        verifier: &mut V,
        chunk: usize,
        budget: usize,
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
    ) -> Result<usize> {
        // joining sequences cancelled since the last call are forgotten
        let finish = &self.finish;
        self.joining.retain(|&(s, _, _)| {
            let gone = finish[s].is_some();
            if gone {
                verifier.drop_row(s);
                if let Some(d) = drafter.as_deref_mut() {
                    d.drop_row(s);
                }
            }
            !gone
        });
        let t0 = Instant::now();
        let mut ran = 0usize;
        while let Some(&(seq, len, done)) = self.joining.first() {
            let end = chunk_end(done, len, chunk);
            // the round stops before a chunk that would pass the budget (one chunk at least)
            if ran > 0 && ran + (end - done) > budget {
                break;
            }
            let last = verifier.prefill_row(seq, end)?;
            if let Some(d) = drafter.as_deref_mut() {
                d.prefill_row(seq, end)?;
            }
            ran += end - done;
            self.joining[0].2 = end;
            let Some(last) = last else { continue };
            self.joining.remove(0);
            let rows = rows_to_host(last, verifier.vocab_size())?;
            let row = rows.first().map_or(&[][..], Vec::as_slice);
            let t = pick(row, &self.draws[seq], &mut self.rngs[seq], seq)?;
            if self.rules[seq].max_new_tokens == 0 {
                self.finish[seq] = Some(FinishReason::Length);
            } else {
                on_tokens(seq, &[t]);
                if let Some(r) = self.rules[seq].push(&mut self.out[seq], t, tokenizer)? {
                    self.finish[seq] = Some(r);
                }
            }
            if self.finish[seq].is_some() {
                verifier.drop_row(seq);
                if let Some(d) = drafter.as_deref_mut() {
                    d.drop_row(seq);
                }
                continue;
            }
            // the rows of a batch whose sequences all finished are stale
            let active_rows = self.rows.iter().any(|&s| self.finish[s].is_none());
            if !active_rows {
                verifier.clear_batch();
                if let Some(d) = drafter.as_deref_mut() {
                    d.clear_batch();
                }
                self.rows.clear();
            } else {
                self.drop_finished(drafter.as_deref_mut(), verifier, false)?;
            }
            verifier.join_row(seq, t)?;
            if let Some(d) = drafter.as_deref_mut() {
                d.join_row(seq, t)?;
            }
            self.rows.push(seq);
        }
        self.prefill_secs += t0.elapsed().as_secs_f64();
        Ok(ran)
    }

    /// One speculative iteration over the sequences still generating (nothing when none is).
    pub(crate) fn step_inner<B: Backend, D: Drafter<B>, V: Verifier<B>>(
        &mut self,
        mut drafter: Option<&mut D>,
        verifier: &mut V,
        tokenizer: Option<&Tokenizer>,
        on_tokens: &mut dyn FnMut(usize, &[TokenId]),
        mut barrier: Option<&mut PhaseBarrier>,
    ) -> Result<()> {
        // the end of a phase: the device's queued work done first when a barrier is set
        let mut settle = || -> Result<()> {
            if let Some(b) = barrier.as_deref_mut() {
                (b.0)()?;
            }
            Ok(())
        };
        // sequences cancelled since the last step leave the caches first, unless the batch
        // holds them
        self.drop_finished(drafter.as_deref_mut(), verifier, true)?;
        if self.rows.is_empty() {
            return Ok(());
        }
        let cfg = &self.cfg;
        let vocab = verifier.vocab_size();
        let active = self.rows.clone();
        // rows of sequences that finished before this iteration: held, their output ignored
        let live: Vec<bool> = active.iter().map(|&s| self.finish[s].is_none()).collect();
        let iteration = self.iteration;
        let b = active.len();
        // 1. draft
        let td = Instant::now();
        let proposal = match drafter.as_deref_mut() {
            Some(d) => d.propose(&DraftCtx {
                gamma: cfg.gamma,
                // each sequence's rule, its draws seeded by its own seed and proposal count
                draws: active
                    .iter()
                    .map(|&s| SeqSampling {
                        seed: draft_seed(self.draws[s].seed, self.steps[s]),
                        ..self.draws[s]
                    })
                    .collect(),
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
        // 3. accept
        settle()?;
        let ta = Instant::now();
        let verify_secs = (ta - tv).as_secs_f64();
        let (accepted, next) = self.accept(&proposal, &ver.logits, &active, &live, vocab)?;
        // emit, honouring EOS / stop strings / max_new_tokens inside the block
        let mut keep = Vec::with_capacity(b);
        for (slot, &s) in active.iter().enumerate() {
            if !live[slot] {
                continue;
            }
            let emitted: Vec<TokenId> = proposal.tokens[slot][..accepted[slot]]
                .iter()
                .copied()
                .chain(std::iter::once(next[slot]))
                .collect();
            let mut pushed = Vec::new();
            for &t in &emitted {
                pushed.push(t);
                if let Some(r) = self.rules[s].push(&mut self.out[s], t, tokenizer)? {
                    self.finish[s] = Some(r);
                    break;
                }
            }
            on_tokens(s, &pushed);
            if self.finish[s].is_none() {
                keep.push(slot);
            }
        }
        settle()?;
        let accept_secs = ta.elapsed().as_secs_f64();
        // 4. commit / roll back both caches, drop finished sequences
        let tc = Instant::now();
        let hold = keep.len() != b && self.holds(drafter.as_deref(), verifier, keep.len(), b);
        if hold {
            // the rows that finished in this iteration are rolled back too (their caches
            // then never pass where their last verification wrote)
            let held: Vec<bool> = (0..b).map(|slot| !keep.contains(&slot)).collect();
            verifier.commit_holding(&accepted, &next, &held)?;
            if let Some(d) = drafter.as_deref_mut() {
                d.commit_holding(&accepted, &next, &held)?;
            }
        } else if !keep.is_empty() {
            if live.iter().all(|&l| l) || !Self::can_hold(drafter.as_deref(), verifier) {
                verifier.commit(&accepted, &next)?;
                if let Some(d) = drafter.as_deref_mut() {
                    d.commit(&accepted, &next)?;
                }
            } else {
                // rows held before this iteration commit nothing (their counts are stale)
                let held: Vec<bool> = live.iter().map(|&l| !l).collect();
                verifier.commit_holding(&accepted, &next, &held)?;
                if let Some(d) = drafter.as_deref_mut() {
                    d.commit_holding(&accepted, &next, &held)?;
                }
            }
            if keep.len() != b {
                // the drafter first: a draft that reads the target's cache lets go of it
                if let Some(d) = drafter {
                    d.retain(&keep)?;
                }
                verifier.retain(&keep)?;
            }
        }
        settle()?;
        let commit_secs = tc.elapsed().as_secs_f64();
        self.iters.push(IterationStats {
            accepted: of_live(&accepted, &live),
            draft_secs,
            verify_secs,
            accept_secs,
            commit_secs,
            kv_read_fraction: of_live(&ver.kv_read_fraction, &live),
            estimation_read_fraction: of_live(&ver.estimation_read_fraction, &live),
        });
        if !hold {
            self.rows = keep.iter().map(|&k| active[k]).collect();
        }
        for &s in &active {
            self.steps[s] += 1;
        }
        self.iteration += 1;
        Ok(())
    }

    /// Acceptance of `proposal` against the target's `logits` (`[batch, gamma + 1, vocab]`)
    /// for the sequences in `active` (row order), each by its own rule: a greedy sequence
    /// accepts while its draft matches the target's argmax (or as the forced schedule
    /// says), a sampled one by speculative sampling with its own random stream; a held row
    /// (`live[slot]` false) as a greedy one, its logits unchecked. Returns the drafts
    /// accepted and the next token per row.
    fn accept<B: Backend>(
        &mut self,
        proposal: &Proposal<B>,
        logits: &burn_tensor::Tensor<B, 3>,
        active: &[usize],
        live: &[bool],
        vocab: usize,
    ) -> Result<(Vec<usize>, Vec<TokenId>)> {
        let [b, m, v] = logits.dims();
        let n = self.finish.len();
        // a held row (a finished sequence kept in the batch) takes the greedy path, whatever
        // its rule, and its logits are never refused: its result is ignored
        let greedy: Vec<bool> = active
            .iter()
            .zip(live)
            .map(|(&s, &l)| !l || self.draws[s].is_greedy())
            .collect();
        let sampled: Vec<usize> = (0..b).filter(|&slot| !greedy[slot]).collect();
        if let (Some(_), Some(&slot)) = (&self.forced, sampled.first()) {
            return Err(SpecError::Config {
                name: "sampling",
                expected: "greedy decoding with a forced acceptance schedule".into(),
                found: format!(
                    "temperature {}",
                    self.draws[active[slot]].sampling.temperature
                ),
            });
        }
        let model_err = |e| dustin_core::CoreError::Model(format!("{e:?}"));
        // the greedy rows' target argmax, picked on the device
        let argmax: Vec<i64> = if sampled.len() < b {
            // the device argmax would pick an arbitrary token from NaN / +inf logits: refuse
            // them, as the host sampling path does
            let bad = dustin_core::greedy::refused_logits(logits.clone())
                .any_dim(2)
                .any_dim(1)
                .reshape([b])
                .into_data()
                .convert::<bool>()
                .into_vec::<bool>()
                .map_err(model_err)?;
            if let Some(slot) = (0..b).find(|&slot| live[slot] && greedy[slot] && bad[slot]) {
                return Err(dustin_core::CoreError::NonFinite {
                    what: "target logits of a verification".into(),
                    seq: active[slot],
                }
                .into());
            }
            logits
                .clone()
                .argmax(2)
                .reshape([b * m])
                .into_data()
                .convert::<i64>()
                .into_vec::<i64>()
                .map_err(model_err)?
        } else {
            Vec::new()
        };
        // the sampled rows' logits on the host, `m` rows each in `sampled` order
        let host = if sampled.is_empty() {
            Vec::new()
        } else {
            let rows = crate::select_rows(logits.clone(), &sampled);
            rows_to_host(rows.reshape([sampled.len() * m, v]), vocab)?
        };
        let mut accepted = Vec::with_capacity(b);
        let mut next = Vec::with_capacity(b);
        let mut h = 0;
        for (slot, &s) in active.iter().enumerate() {
            let draft = &proposal.tokens[slot];
            if greedy[slot] {
                let row: Vec<u32> = argmax[slot * m..(slot + 1) * m]
                    .iter()
                    .map(|&x| x as u32)
                    .collect();
                match &self.forced {
                    Some((schedule, ragged)) => {
                        let k = schedule
                            .accepted(self.iteration, s, n, *ragged)
                            .min(draft.len());
                        accepted.push(k);
                        next.push(row[k]);
                    }
                    None => {
                        let acc = accept::greedy(draft, &row);
                        accepted.push(acc.accepted);
                        next.push(acc.next);
                    }
                }
                continue;
            }
            let rule = self.draws[s].sampling;
            let p: Vec<Vec<f32>> = host[h * m..(h + 1) * m]
                .iter()
                .map(|row| rule.probs(row, s))
                .collect::<dustin_core::Result<_>>()?;
            h += 1;
            let q: &[Vec<f32>] = proposal
                .q
                .as_ref()
                .and_then(|q| q.get(slot))
                .map_or(&[], Vec::as_slice);
            let rng = &mut self.rngs[s];
            let acc = accept::stochastic(draft, &p, q, s, &mut || rng.random::<f32>())?;
            accepted.push(acc.accepted);
            next.push(acc.next);
        }
        Ok((accepted, next))
    }

    /// Closes the run: every sequence's tokens and finish reason (one still generating ends
    /// as [`FinishReason::Length`]), the iterations and their summary.
    pub fn finish(self) -> SpecOutput {
        let n = self.finish.len();
        let iters = self.iters;
        let out = self.out;
        let decode_secs = self.decode_start.elapsed().as_secs_f64();
        let generated: usize = out.iter().map(Vec::len).sum();
        let first_emitted = self.rules.iter().filter(|r| r.max_new_tokens > 0).count();
        debug_assert!(first_emitted <= n);
        let seq_iters: usize = iters.iter().map(|i| i.accepted.len()).sum();
        // float sums start at -0.0 (std's `Sum`): `+ 0.0` makes an empty one 0, not -0
        let total =
            |f: &dyn Fn(&IterationStats) -> f64| -> f64 { iters.iter().map(f).sum::<f64>() + 0.0 };
        let mean =
            |f: &dyn Fn(&IterationStats) -> f64| -> f64 { total(f) / seq_iters.max(1) as f64 };
        let tau = mean(&|i| i.accepted.iter().map(|&a| (a + 1) as f64).sum());
        let kvf = mean(&|i| i.kv_read_fraction.iter().sum());
        let estf = mean(&|i| i.estimation_read_fraction.iter().sum());
        let summary = SpecSummary {
            iterations: iters.len(),
            mean_acceptance_length: tau,
            generated_tokens: generated,
            prefill_secs: self.prefill_secs,
            decode_secs,
            // the first token of each sequence comes from the prefill logits, not from decoding
            tokens_per_sec: generated.saturating_sub(first_emitted) as f64 / decode_secs.max(1e-9),
            draft_secs: total(&|i| i.draft_secs),
            verify_secs: total(&|i| i.verify_secs),
            accept_secs: total(&|i| i.accept_secs),
            commit_secs: total(&|i| i.commit_secs),
            mean_kv_read_fraction: kvf,
            mean_estimation_read_fraction: estf,
        };
        SpecOutput {
            tokens: out,
            finish: self
                .finish
                .into_iter()
                .map(|f| f.unwrap_or(FinishReason::Length))
                .collect(),
            iterations: iters,
            summary,
        }
    }
}

/// A forced acceptance schedule (**benchmarks only**).
#[derive(Debug, Clone)]
pub(crate) enum Schedule {
    /// A mean of drafts accepted per iteration ([`SpeculativeDecoder::set_forced_acceptance`]).
    Mean(f64),
    /// A recorded trace of drafts accepted per iteration
    /// ([`SpeculativeDecoder::set_forced_trace`]).
    Trace(Vec<usize>),
}

impl Schedule {
    /// Drafts sequence `seq` of `n` accepts at `iteration` (before the cap at the proposal's
    /// length); `ragged` shifts the schedule per sequence.
    pub(crate) fn accepted(&self, iteration: usize, seq: usize, n: usize, ragged: bool) -> usize {
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
