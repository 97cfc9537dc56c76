//! Finished sequences held in the batch ([`dustin_spec::HOLD_UNTIL`]), CPU, the tiny HF
//! fixture models: a batch whose sequences stop at different iterations keeps its shape while
//! more than half of it still generates, a held row's cache does not grow, the batch shrinks
//! (`retain`) only once half or fewer rows are live, and every sequence's tokens are the
//! target's own greedy tokens (the reference: `dustin_qwen::generate` of the target alone).

use std::sync::{Arc, Mutex};

use burn_tensor::Tensor;
use dustin_core::{DenseHook, TokenId, Verification, Verifier, VerifyCtx};
use dustin_spec::{ModelDrafter, ModelVerifier, SeqLimits, SpecConfig, SpeculativeDecoder};

mod common;

use common::{ar, model, prompts, B};

/// What the engine asked of the verifier after each verification.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// a commit of every row
    Commit,
    /// a commit holding the flagged rows, and the cache lengths after it
    Hold(Vec<bool>, Vec<usize>),
    /// the batch shrunk to this many rows
    Retain(usize),
}

/// A [`ModelVerifier`] that records the engine's commits.
struct Watch {
    inner: ModelVerifier<B, DenseHook>,
    events: Arc<Mutex<Vec<Event>>>,
}

impl Watch {
    fn push(&self, e: Event) {
        self.events.lock().expect("events").push(e);
    }
}

impl Verifier<B> for Watch {
    fn prefill(&mut self, prompts: &[Vec<TokenId>]) -> dustin_core::Result<Tensor<B, 2>> {
        self.inner.prefill(prompts)
    }
    fn set_pending(&mut self, next: &[TokenId]) -> dustin_core::Result<()> {
        self.inner.set_pending(next)
    }
    fn verify(&mut self, ctx: &VerifyCtx<'_, B>) -> dustin_core::Result<Verification<B>> {
        self.inner.verify(ctx)
    }
    fn commit(&mut self, accepted: &[usize], next: &[TokenId]) -> dustin_core::Result<()> {
        self.push(Event::Commit);
        self.inner.commit(accepted, next)
    }
    fn retain(&mut self, keep: &[usize]) -> dustin_core::Result<()> {
        self.push(Event::Retain(keep.len()));
        self.inner.retain(keep)
    }
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }
    fn can_hold(&self) -> bool {
        self.inner.can_hold()
    }
    fn commit_holding(
        &mut self,
        accepted: &[usize],
        next: &[TokenId],
        hold: &[bool],
    ) -> dustin_core::Result<()> {
        self.inner.commit_holding(accepted, next, hold)?;
        self.push(Event::Hold(hold.to_vec(), self.inner.lens()));
        Ok(())
    }
}

#[test]
fn finished_sequences_are_held_until_half_the_batch_is_done() {
    let target = model("qwen2-tied");
    let draft = model("qwen2-gqa7");
    let (gamma, long) = (4usize, 24usize);
    let (reference, _) = ar(&target, long, &[]);
    // sequence 0 stops after 2 tokens (its first iteration), sequence 1 after 11, the third
    // runs to 24: live rows go 3 -> 2 (held: more than half) -> 1 (the batch shrinks)
    let limits: Vec<usize> = vec![2, 11, long];
    let extra = long + 2 * (gamma + 2);
    let events = Arc::new(Mutex::new(Vec::new()));
    let verifier = Watch {
        inner: ModelVerifier::new(target, DenseHook, extra, 96),
        events: events.clone(),
    };
    let mut dec = SpeculativeDecoder::new(ModelDrafter::new(draft, None, extra), verifier);
    let cfg = SpecConfig {
        gamma,
        max_new_tokens: long,
        ..SpecConfig::default()
    };
    let per: Vec<SeqLimits> = limits
        .iter()
        .map(|&m| SeqLimits {
            max_new_tokens: m,
            ..SeqLimits::default()
        })
        .collect();
    let mut run = dec
        .start(&prompts(), &cfg, &per, None, &mut |_, _| {})
        .expect("start");
    while !run.is_done() {
        dec.step(&mut run, None, &mut |_, _| {}).expect("step");
    }
    let out = run.finish();
    for (s, (got, want)) in out.tokens.iter().zip(&reference).enumerate() {
        assert_eq!(got[..], want[..limits[s]], "sequence {s}: tokens differ");
    }
    let events = events.lock().expect("events").clone();
    let holds: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e, Event::Hold(..)))
        .collect();
    assert!(
        !holds.is_empty(),
        "sequence 0 finished with 2 of 3 rows live: the batch should hold it ({events:?})"
    );
    // the first shrink leaves at most half the batch
    let first_retain = events.iter().find_map(|e| match e {
        Event::Retain(k) => Some(*k),
        _ => None,
    });
    assert!(
        first_retain.is_none_or(|k| 2 * k <= 3),
        "the batch shrank while more than half of it was live ({events:?})"
    );
    // a row held at two consecutive commits keeps its length; a live one grows
    for pair in holds.windows(2) {
        let (Event::Hold(h0, l0), Event::Hold(h1, l1)) = (pair[0], pair[1]) else {
            unreachable!()
        };
        for r in 0..h0.len() {
            if h0[r] && h1[r] {
                assert_eq!(l0[r], l1[r], "held row {r} grew: {l0:?} -> {l1:?}");
            }
            if !h0[r] && !h1[r] {
                assert!(l1[r] > l0[r], "live row {r} did not grow: {l0:?} -> {l1:?}");
            }
        }
    }
}

/// A commit before any verification is an error, for `commit` as for `commit_holding` (the
/// first indexed the verification's start lengths and panicked), and leaves the prefilled
/// cache as it was.
#[test]
fn commits_out_of_turn_are_errors() {
    let target = model("qwen2-tied");
    let mut v = ModelVerifier::new(target, DenseHook, 8, 96);
    let ps = prompts();
    v.prefill(&ps).unwrap();
    let b = ps.len();
    let (zeros, next, hold) = (vec![0usize; b], vec![1 as TokenId; b], vec![false; b]);
    let msg = |r: dustin_core::Result<()>| r.unwrap_err().to_string();
    assert!(msg(v.commit(&zeros, &next)).contains("before a verification"));
    assert!(msg(v.commit_holding(&zeros, &next, &hold)).contains("before a verification"));
    let lens: Vec<usize> = ps.iter().map(Vec::len).collect();
    assert_eq!(v.lens(), lens);
}
