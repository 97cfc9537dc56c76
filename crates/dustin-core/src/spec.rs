use burn_tensor::{backend::Backend, Tensor};

use crate::{CoreError, Result, SamplingConfig, SeqSampling, TokenId};

/// What the engine gives a drafter for one proposal.
#[derive(Debug, Clone)]
pub struct DraftCtx {
    /// Number of tokens to draft per sequence (`gamma`).
    pub gamma: usize,
    /// How each sequence of the batch draws its draft tokens, in the batch's row order: its
    /// sampling rule (greedy: argmax) and the seed and stream of this proposal's draws (the
    /// engine derives a seed per sequence and proposal). Empty: every sequence drafts
    /// greedily.
    pub draws: Vec<SeqSampling>,
    /// Whether the drafter should report its lookahead attention signal.
    pub want_lookahead: bool,
    /// Size of the real vocabulary to sample over (the target's).
    pub vocab: usize,
}

impl DraftCtx {
    /// Greedy drafting of every sequence, without the lookahead.
    pub fn greedy(gamma: usize, vocab: usize) -> Self {
        Self {
            gamma,
            draws: Vec::new(),
            want_lookahead: false,
            vocab,
        }
    }

    /// One rule for all `batch` sequences, without the lookahead: sequence `s` draws from
    /// stream `s` of `seed`.
    pub fn uniform(
        gamma: usize,
        sampling: SamplingConfig,
        seed: u64,
        batch: usize,
        vocab: usize,
    ) -> Self {
        Self {
            gamma,
            draws: (0..batch as u64)
                .map(|stream| SeqSampling {
                    sampling,
                    seed,
                    stream,
                })
                .collect(),
            want_lookahead: false,
            vocab,
        }
    }

    /// How the sequence in row `slot` draws (greedy when [`Self::draws`] is empty).
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming `draws` when they are not empty and have no entry
    /// for `slot`.
    pub fn draw(&self, slot: usize) -> Result<SeqSampling> {
        if self.draws.is_empty() {
            return Ok(SeqSampling::greedy());
        }
        self.draws.get(slot).copied().ok_or_else(|| {
            CoreError::invalid(
                "draws",
                format!("none or one per sequence (row {slot} has none)"),
                self.draws.len(),
            )
        })
    }

    /// Whether every sequence drafts greedily.
    pub fn is_greedy(&self) -> bool {
        self.draws.iter().all(SeqSampling::is_greedy)
    }
}

/// A draft proposal for the active batch.
#[derive(Debug, Clone)]
pub struct Proposal<B: Backend> {
    /// Drafted tokens, `[batch][gamma]`.
    pub tokens: Vec<Vec<TokenId>>,
    /// The distributions the draft tokens were sampled from (after temperature, top-p,
    /// top-k), on the host, `[batch][gamma][vocab]`; a sequence that drafts greedily has an
    /// empty entry, and `None` means every sequence drafted greedily.
    pub q: Option<Vec<Vec<Vec<f32>>>>,
    /// Draft lookahead attention `[batch, ctx]` (see
    /// [`crate::ImportanceEstimator::observe_lookahead`]), when asked for.
    pub lookahead: Option<Tensor<B, 2>>,
}

/// The target's verification of a proposal.
#[derive(Debug, Clone)]
pub struct Verification<B: Backend> {
    /// Target logits over the real vocabulary at the `gamma + 1` verified positions,
    /// `[batch, gamma + 1, vocab]`.
    pub logits: Tensor<B, 3>,
    /// Context positions read per sequence by the target's attention, summed over layers and
    /// KV heads, divided by what dense attention would read (1.0 for dense verification).
    pub kv_read_fraction: Vec<f64>,
    /// The selection policy's own reads of the KV cache during this verification (see
    /// [`crate::SelectionPolicy::estimation_reads`]: for example the exact attention of
    /// estimator heads over the whole context), per sequence, over the same denominator as
    /// `kv_read_fraction`; 0.0 for a policy that reads nothing. A report's total KV read is
    /// the sum of the two.
    pub estimation_read_fraction: Vec<f64>,
}

/// What the engine gives the verifier for one verification.
#[derive(Debug)]
pub struct VerifyCtx<'a, B: Backend> {
    /// The draft's proposal.
    pub proposal: &'a Proposal<B>,
    /// Speculative iteration number since prefill.
    pub iteration: usize,
}

/// `accepted` with the count of every held row (`hold[b]`, see
/// [`Verifier::commit_holding`]) set to 0; rows past the end of `hold` are not held.
pub fn zero_held(accepted: &[usize], hold: &[bool]) -> Vec<usize> {
    accepted
        .iter()
        .enumerate()
        .map(|(b, &a)| {
            if hold.get(b).copied().unwrap_or(false) {
                0
            } else {
                a
            }
        })
        .collect()
}

/// Proposes `gamma` tokens per sequence; holds its own KV cache.
///
/// Cache invariant: the drafter's cache holds every committed token except the *pending*
/// ones (the last token the target emitted, and a fully accepted last draft token), which are
/// fed at the start of the next proposal.
pub trait Drafter<B: Backend> {
    /// Prefills the prompts (`[batch][len]`) and sets `first` (the target's first generated
    /// token per sequence) pending.
    ///
    /// # Errors
    /// Bad prompts (empty, too long) and model errors.
    fn prefill(&mut self, prompts: &[Vec<TokenId>], first: &[TokenId]) -> Result<()>;
    /// Drafts `ctx.gamma` tokens per active sequence.
    ///
    /// # Errors
    /// Model errors.
    fn propose(&mut self, ctx: &DraftCtx) -> Result<Proposal<B>>;
    /// Sequence `b` accepted `accepted[b]` draft tokens, then the target emitted `next[b]`;
    /// roll back the rest.
    ///
    /// # Errors
    /// Out-of-range counts.
    fn commit(&mut self, accepted: &[usize], next: &[TokenId]) -> Result<()>;
    /// Keeps only the sequences listed in `keep` (ascending).
    ///
    /// # Errors
    /// Out-of-range indices.
    fn retain(&mut self, keep: &[usize]) -> Result<()>;
    /// Whether [`Drafter::commit_holding`] is implemented (finished sequences can stay in the
    /// batch as rows that are drafted for and rolled back, instead of leaving it by
    /// [`Drafter::retain`]).
    fn can_hold(&self) -> bool {
        false
    }
    /// As [`Drafter::commit`] for the rows with `hold[b] == false`; the rows with
    /// `hold[b] == true` go back to where they stood before the last proposal (cache length
    /// and pending tokens), whatever `accepted[b]` and `next[b]` say. The batch keeps its
    /// shape, and a held row never grows.
    ///
    /// # Errors
    /// As [`Drafter::commit`]; [`crate::CoreError::Model`] where [`Drafter::can_hold`] is
    /// false (the default), with nothing changed.
    fn commit_holding(
        &mut self,
        _accepted: &[usize],
        _next: &[TokenId],
        _hold: &[bool],
    ) -> Result<()> {
        Err(crate::CoreError::Model(
            "this drafter cannot hold finished rows".into(),
        ))
    }
}

/// Verifies proposals with the target model; holds the target's KV cache.
pub trait Verifier<B: Backend> {
    /// Prefills the prompts (`[batch][len]`) and returns the logits of each prompt's last
    /// position, `[batch, vocab]`.
    ///
    /// # Errors
    /// Bad prompts (empty, too long) and model errors.
    fn prefill(&mut self, prompts: &[Vec<TokenId>]) -> Result<Tensor<B, 2>>;
    /// Sets the first generated token of each sequence pending (after prefill).
    ///
    /// # Errors
    /// Wrong batch size.
    fn set_pending(&mut self, next: &[TokenId]) -> Result<()>;
    /// Runs the target over the pending token and the proposal (`gamma + 1` positions).
    ///
    /// # Errors
    /// Model and selection errors.
    fn verify(&mut self, ctx: &VerifyCtx<'_, B>) -> Result<Verification<B>>;
    /// Sequence `b` accepted `accepted[b]` draft tokens, then the target emitted `next[b]`.
    ///
    /// # Errors
    /// Out-of-range counts.
    fn commit(&mut self, accepted: &[usize], next: &[TokenId]) -> Result<()>;
    /// Keeps only the sequences listed in `keep` (ascending).
    ///
    /// # Errors
    /// Out-of-range indices.
    fn retain(&mut self, keep: &[usize]) -> Result<()>;
    /// Whether [`Verifier::commit_holding`] is implemented.
    fn can_hold(&self) -> bool {
        false
    }
    /// As [`Verifier::commit`] for the rows with `hold[b] == false`; the rows with
    /// `hold[b] == true` go back to where they stood before the last verification (cache
    /// length and pending token), whatever `accepted[b]` and `next[b]` say: a finished
    /// sequence kept in the batch so that the batch keeps its shape (no copy of the caches,
    /// no new kernel shapes) until enough rows have finished to make [`Verifier::retain`]
    /// worth it.
    ///
    /// # Errors
    /// As [`Verifier::commit`]; [`crate::CoreError::Model`] where [`Verifier::can_hold`] is
    /// false (the default), with nothing changed.
    fn commit_holding(
        &mut self,
        _accepted: &[usize],
        _next: &[TokenId],
        _hold: &[bool],
    ) -> Result<()> {
        Err(crate::CoreError::Model(
            "this verifier cannot hold finished rows".into(),
        ))
    }
    /// Size of the real vocabulary (rows of the LM head that are real tokens).
    fn vocab_size(&self) -> usize;
    /// Whether the verifier's selection policy uses the draft's lookahead signal.
    fn wants_lookahead(&self) -> bool {
        false
    }
}
