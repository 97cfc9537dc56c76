//! Continuous batching: sequences joining a running batch between iterations, their prompts
//! prefilled in chunks interleaved with the others' iterations, give each its output alone;
//! a sequence cancelled before or after joining leaves the caches.

#[allow(dead_code)]
mod common;

use common::{model, B};
use dustin_core::{DenseHook, SelectionPolicy};
use dustin_qwen::generate::FinishReason;
use dustin_select::SelectConfig;
use dustin_spec::{
    AutoregressiveDecoder, ModelDrafter, ModelVerifier, PerRow, SeqLimits, SpecConfig, SpecRun,
    SpeculativeDecoder,
};

const MAX_NEW: usize = 20;
const ROOM: usize = MAX_NEW + 12;

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed * 31 + i * 7 + 3) % 96)
        .collect()
}

fn cfg() -> SpecConfig {
    SpecConfig {
        gamma: 3,
        max_new_tokens: MAX_NEW,
        ..SpecConfig::default()
    }
}

fn limits(n: usize) -> SeqLimits {
    SeqLimits {
        max_new_tokens: n,
        stop_strings: Vec::new(),
        ..SeqLimits::default()
    }
}

type Policy = PerRow<Box<dyn SelectionPolicy<B>>>;

/// The `dustin` selection with a budget below the prompts' lengths, one instance per sequence.
fn sparse() -> Policy {
    PerRow::new(|| {
        let c = SelectConfig {
            budget: 16,
            n_sink: 2,
            window: 4,
            ..SelectConfig::default()
        };
        dustin_select::registry::build::<B>("dustin", &c).expect("policy")
    })
}

fn decoder<P: dustin_spec::JoinPolicy<B>>(
    policy: P,
) -> SpeculativeDecoder<B, ModelDrafter<B>, ModelVerifier<B, P>> {
    SpeculativeDecoder::new(
        ModelDrafter::new(model("qwen2-gqa7"), None, ROOM),
        ModelVerifier::new(model("qwen2-tied"), policy, ROOM, 96),
    )
}

/// Each prompt's greedy output run alone, its prompt prefilled in chunks of `chunk`.
fn alone<P: dustin_spec::JoinPolicy<B>>(
    make: impl Fn() -> P,
    prompts: &[Vec<u32>],
    chunk: usize,
) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| {
            SpeculativeDecoder::new(
                ModelDrafter::new(model("qwen2-gqa7"), None, ROOM).with_prefill_chunk(chunk),
                ModelVerifier::new(model("qwen2-tied"), make(), ROOM, 96).with_prefill_chunk(chunk),
            )
            .generate(std::slice::from_ref(p), &cfg(), None, &mut |_, _| {})
            .expect("generate")
            .tokens
            .remove(0)
        })
        .collect()
}

/// Runs `prompts` through one batch: the first two join at once, each later one after
/// `2 * i` iterations; every prefill call runs at most `chunk` prompt tokens between two
/// iterations. Returns the run's output and the streamed tokens.
fn joined<P: dustin_spec::JoinPolicy<B>>(
    dec: &mut SpeculativeDecoder<B, ModelDrafter<B>, ModelVerifier<B, P>>,
    prompts: &[Vec<u32>],
    chunk: usize,
) -> (SpecRun, Vec<Vec<u32>>) {
    let mut run = dec.open(&cfg()).expect("open");
    let mut streamed = vec![Vec::new(); prompts.len()];
    let mut next = 0;
    let mut iteration = 0;
    loop {
        while next < prompts.len() && (next < 2 || iteration >= 2 * next) {
            let s = dec
                .join(&mut run, &prompts[next], &limits(MAX_NEW), ROOM)
                .expect("join");
            assert_eq!(s, next);
            next += 1;
        }
        let mut on = |s: usize, t: &[u32]| streamed[s].extend_from_slice(t);
        dec.prefill(&mut run, chunk, chunk, None, &mut on)
            .expect("prefill");
        dec.step(&mut run, None, &mut on).expect("step");
        iteration += 1;
        if run.is_done() && next == prompts.len() {
            return (run, streamed);
        }
        assert!(iteration < 200, "the run does not end");
    }
}

#[test]
fn sequences_joining_mid_run_with_chunked_prefill_get_their_output_alone() {
    let prompts: Vec<Vec<u32>> = (0..4).map(|i| prompt(i, 9 + 7 * i as usize)).collect();
    let want = alone(|| DenseHook, &prompts, 4);
    let mut dec = decoder(DenseHook);
    let (run, streamed) = joined(&mut dec, &prompts, 4);
    let got = run.finish();
    assert_eq!(got.tokens, want);
    assert_eq!(streamed, want);
    assert!(got.finish.iter().all(|f| *f == FinishReason::Length));
}

#[test]
fn sparse_verification_per_sequence_joins_with_each_output_alone() {
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(i + 5, 30 + 5 * i as usize)).collect();
    let want = alone(sparse, &prompts, 16);
    let mut dec = decoder(sparse());
    let (run, _) = joined(&mut dec, &prompts, 16);
    let got = run.finish();
    assert_eq!(got.tokens, want);
    assert!(
        got.iterations
            .iter()
            .any(|it| it.kv_read_fraction.iter().any(|&f| f < 1.0)),
        "the selection read less than the whole context"
    );
}

#[test]
fn a_cancelled_sequence_leaves_the_caches_before_or_after_joining() {
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(i, 12)).collect();
    let want = alone(|| DenseHook, &prompts, 0);
    let mut dec = decoder(DenseHook);
    let mut run = dec.open(&cfg()).expect("open");
    for p in &prompts {
        dec.join(&mut run, p, &limits(MAX_NEW), ROOM).expect("join");
    }
    // the first joins; the last is cancelled while it waits for its prefill
    dec.prefill(&mut run, 64, 12, None, &mut |_, _| {})
        .expect("prefill");
    assert_eq!(run.joining(), vec![1, 2]);
    assert!(run.cancel(2));
    dec.prefill(&mut run, 64, 12, None, &mut |_, _| {})
        .expect("prefill");
    assert!(run.joining().is_empty());
    assert_eq!(dec.verifier.lens().len(), 2);
    dec.step(&mut run, None, &mut |_, _| {}).expect("step");
    // the first leaves at the next step
    assert!(run.cancel(0));
    dec.step(&mut run, None, &mut |_, _| {}).expect("step");
    assert_eq!(dec.verifier.lens().len(), 1, "the cancelled row is freed");
    while !run.is_done() {
        dec.step(&mut run, None, &mut |_, _| {}).expect("step");
    }
    let got = run.finish();
    assert_eq!(got.tokens[1], want[1]);
    assert_eq!(got.finish[0], FinishReason::Cancelled);
    assert_eq!(got.finish[2], FinishReason::Cancelled);
    assert!(got.tokens[2].is_empty());
}

#[test]
fn a_batch_whose_sequences_all_finished_takes_new_ones() {
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(i + 2, 10)).collect();
    let want = alone(|| DenseHook, &prompts, 0);
    let mut dec = decoder(DenseHook);
    let mut run = dec.open(&cfg()).expect("open");
    // a sequence that ends at its first token never joins the batch
    dec.join(&mut run, &prompts[0], &limits(1), ROOM)
        .expect("join");
    dec.prefill(&mut run, 64, 64, None, &mut |_, _| {})
        .expect("prefill");
    assert!(run.is_done());
    assert_eq!(run.tokens(0), &want[0][..1]);
    dec.join(&mut run, &prompts[1], &limits(MAX_NEW), ROOM)
        .expect("join");
    dec.prefill(&mut run, 64, 64, None, &mut |_, _| {})
        .expect("prefill");
    while !run.is_done() {
        dec.step(&mut run, None, &mut |_, _| {}).expect("step");
    }
    // every sequence has finished: the next one starts the batch again
    dec.join(&mut run, &prompts[2], &limits(MAX_NEW), ROOM)
        .expect("join");
    dec.prefill(&mut run, 64, 64, None, &mut |_, _| {})
        .expect("prefill");
    assert_eq!(dec.verifier.lens().len(), 1);
    while !run.is_done() {
        dec.step(&mut run, None, &mut |_, _| {}).expect("step");
    }
    let got = run.finish();
    assert_eq!(got.tokens[1], want[1]);
    assert_eq!(got.tokens[2], want[2]);
    // a bad prompt is refused and leaves the run as it was
    let mut run = dec.open(&cfg()).expect("open");
    assert!(dec.join(&mut run, &[], &limits(4), ROOM).is_err());
    assert!(dec.join(&mut run, &[500], &limits(4), ROOM).is_err());
    assert!(run.is_done() && run.active().is_empty());
}

#[test]
fn autoregressive_sequences_join_too() {
    let prompts: Vec<Vec<u32>> = (0..2).map(|i| prompt(i + 9, 8 + 5 * i as usize)).collect();
    let target = model("qwen2-tied");
    let mut want = Vec::new();
    for p in &prompts {
        let mut ar =
            AutoregressiveDecoder::new(ModelVerifier::new(target.clone(), DenseHook, ROOM, 96));
        want.push(
            dustin_spec::autoregressive(
                &mut ar.verifier,
                std::slice::from_ref(p),
                &cfg(),
                None,
                &mut |_, _| {},
            )
            .expect("ar")
            .tokens
            .remove(0),
        );
    }
    let mut ar = AutoregressiveDecoder::new(ModelVerifier::new(target, DenseHook, ROOM, 96));
    let mut run = ar.open(&cfg()).expect("open");
    ar.join(&mut run, &prompts[0], &limits(MAX_NEW), ROOM)
        .expect("join");
    for i in 0..40 {
        if i == 3 {
            ar.join(&mut run, &prompts[1], &limits(MAX_NEW), ROOM)
                .expect("join");
        }
        ar.prefill(&mut run, 5, 5, None, &mut |_, _| {})
            .expect("prefill");
        ar.step(&mut run, None, &mut |_, _| {}).expect("step");
    }
    assert!(run.is_done());
    assert_eq!(run.finish().tokens, want);
}
