//! Forced acceptance schedules (mean, ragged, recorded trace) and the phase barrier of the
//! speculative engine, on tiny random models (the HF parity fixtures of `dustin-qwen`), CPU.

use std::sync::Arc;

use dustin_core::DenseHook;
use dustin_qwen::Qwen2;
use dustin_spec::{
    autoregressive_with_barrier, ModelDrafter, ModelVerifier, PhaseBarrier, SpecConfig,
    SpeculativeDecoder,
};

mod common;

use common::{ar, model, prompts, B};

/// A decoder with the target's first layer as the draft and dense verification, as the
/// forced-schedule tests use it.
fn one_layer_draft_decoder(
    target: &Arc<Qwen2<B>>,
    extra: usize,
) -> SpeculativeDecoder<B, ModelDrafter<B>, ModelVerifier<B, DenseHook>> {
    SpeculativeDecoder::new(
        ModelDrafter::new(target.clone(), Some(1), extra),
        ModelVerifier::new(target.clone(), DenseHook, extra, 96),
    )
}

/// The benchmark schedule: with a mean of 1.5 accepted drafts, iterations accept 1, 2, 1, 2,
/// ... (floor((i + 1) 1.5) - floor(i 1.5)), every sequence emits accepted + 1 tokens per
/// iteration, the rollback keeps both caches consistent (the emitted tokens after the
/// accepted drafts are the target's greedy choice given the drafts, so a dense greedy run
/// continued from them agrees), and bad schedules are refused.
#[test]
fn forced_acceptance_follows_the_schedule() {
    let target = model("llama");
    let (gamma, max_new) = (4usize, 20usize);
    let extra = max_new + 2 * (gamma + 2);
    let mut dec = one_layer_draft_decoder(&target, extra);
    dec.set_forced_acceptance(Some(1.5)).expect("schedule");
    let cfg = SpecConfig {
        gamma,
        max_new_tokens: max_new,
        ..SpecConfig::default()
    };
    let o = dec
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .expect("spec");
    let per_iter: Vec<usize> = o.iterations.iter().map(|i| i.accepted[0]).collect();
    // 20 tokens: 1 from prefill, then 2, 3, 2, 3, 2, 3, 2 (= 17) and the last iteration cut
    // at the limit
    assert_eq!(&per_iter[..6], &[1, 2, 1, 2, 1, 2], "{per_iter:?}");
    for it in &o.iterations {
        assert!(it.accepted.iter().all(|&a| a == it.accepted[0]));
    }
    assert!(o.tokens.iter().all(|t| t.len() == max_new));
    // schedule 0: one token per iteration (the target's own greedy token): equals AR output
    let mut dec0 = one_layer_draft_decoder(&target, extra);
    dec0.set_forced_acceptance(Some(0.0)).expect("schedule");
    let o0 = dec0
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .expect("spec");
    let (ar_toks, _) = ar(&target, max_new, &[]);
    assert_eq!(o0.tokens, ar_toks);
    assert!(o0
        .iterations
        .iter()
        .all(|i| i.accepted.iter().all(|&a| a == 0)));
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let err = dec0
            .set_forced_acceptance(Some(bad))
            .unwrap_err()
            .to_string();
        assert!(err.contains("mean_accepted"), "{err}");
    }
}

/// The ragged schedule: the same mean per sequence, shifted by `s / n`, so with a mean of
/// 0.5 accepted drafts and three sequences (phases 0, 1/3, 2/3) sequences 0 and 1 accept
/// 0, 1, 0, 1, ... and sequence 2 accepts 1, 0, 1, 0, ... (`floor((i + 1) 0.5 + 2/3) -
/// floor(i 0.5 + 2/3)`): their cached lengths differ from the first iteration on, and every
/// sequence still emits its tokens to the limit through the ragged rollbacks.
#[test]
fn forced_ragged_acceptance_shifts_each_sequence() {
    let target = model("llama");
    let (gamma, max_new) = (4usize, 12usize);
    let extra = max_new + 2 * (gamma + 2);
    let mut dec = one_layer_draft_decoder(&target, extra);
    dec.set_forced_acceptance(Some(0.5)).expect("schedule");
    dec.set_forced_ragged(true);
    let cfg = SpecConfig {
        gamma,
        max_new_tokens: max_new,
        ..SpecConfig::default()
    };
    let o = dec
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .expect("spec");
    let seq =
        |s: usize| -> Vec<usize> { o.iterations.iter().take(4).map(|i| i.accepted[s]).collect() };
    assert_eq!(seq(0), [0, 1, 0, 1]);
    assert_eq!(seq(1), [0, 1, 0, 1]);
    assert_eq!(seq(2), [1, 0, 1, 0]);
    assert!(
        o.tokens.iter().all(|t| t.len() == max_new),
        "{:?}",
        o.tokens
    );
    // unshifted: every sequence the same
    dec.set_forced_ragged(false);
    let o = dec
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .expect("spec");
    for it in &o.iterations {
        assert!(it.accepted.iter().all(|&a| a == it.accepted[0]));
    }
}

/// A recorded trace replays as given: trace [3, 0, 4, 9] with gamma 4 accepts 3, 0, 4, 4
/// (9 capped at gamma), then wraps; ragged, sequence 1 of 3 starts one entry in
/// (`1 * 4 / 3 = 1`) and sequence 2 two entries in; an empty trace is refused.
#[test]
fn forced_trace_replays_each_sequence_from_its_offset() {
    let target = model("llama");
    let (gamma, max_new) = (4usize, 24usize);
    let extra = max_new + 2 * (gamma + 2);
    let mut dec = one_layer_draft_decoder(&target, extra);
    dec.set_forced_trace(Some(vec![3, 0, 4, 9])).expect("trace");
    let cfg = SpecConfig {
        gamma,
        max_new_tokens: max_new,
        ..SpecConfig::default()
    };
    let o = dec
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .expect("spec");
    let seq = |o: &dustin_spec::SpecOutput, s: usize| -> Vec<usize> {
        o.iterations.iter().take(5).map(|i| i.accepted[s]).collect()
    };
    assert_eq!(seq(&o, 0), [3, 0, 4, 4, 3]);
    assert_eq!(seq(&o, 2), [3, 0, 4, 4, 3]);
    assert!(o.tokens.iter().all(|t| t.len() == max_new));
    dec.set_forced_ragged(true);
    let o = dec
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .expect("spec");
    assert_eq!(seq(&o, 0), [3, 0, 4, 4, 3]);
    assert_eq!(seq(&o, 1), [0, 4, 4, 3, 0]);
    assert_eq!(seq(&o, 2), [4, 4, 3, 0, 4]);
    let err = dec
        .set_forced_trace(Some(Vec::new()))
        .unwrap_err()
        .to_string();
    assert!(err.contains("trace"), "{err}");
}

/// A phase barrier runs at the end of each of an iteration's four phases (draft, verify,
/// accept, commit) and of an autoregressive step's three (the draft phase is empty there but
/// still timed, so four as well), changes no token, and its error stops the run.
#[test]
fn phase_barrier_runs_four_times_an_iteration_and_its_error_stops_the_run() {
    use std::cell::Cell;
    use std::rc::Rc;
    let target = model("llama");
    let (gamma, max_new) = (4usize, 12usize);
    let extra = max_new + 2 * (gamma + 2);
    let cfg = SpecConfig {
        gamma,
        max_new_tokens: max_new,
        ..SpecConfig::default()
    };
    let plain = one_layer_draft_decoder(&target, extra)
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .expect("spec");
    let calls = Rc::new(Cell::new(0usize));
    let mut dec = one_layer_draft_decoder(&target, extra);
    let c = calls.clone();
    dec.set_phase_barrier(Some(PhaseBarrier(Box::new(move || {
        c.set(c.get() + 1);
        Ok(())
    }))));
    let o = dec
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .expect("spec");
    assert_eq!(o.tokens, plain.tokens);
    assert!(!o.iterations.is_empty());
    assert_eq!(calls.get(), 4 * o.iterations.len());
    // autoregressive: one barrier per phase of each step
    let ar_calls = Rc::new(Cell::new(0usize));
    let c = ar_calls.clone();
    let mut b = PhaseBarrier(Box::new(move || {
        c.set(c.get() + 1);
        Ok(())
    }));
    let mut v = ModelVerifier::new(target.clone(), DenseHook, extra, 96);
    let a =
        autoregressive_with_barrier(&mut v, &prompts(), &cfg, None, &mut |_, _| {}, Some(&mut b))
            .expect("ar");
    let (ar_toks, _) = ar(&target, max_new, &[]);
    assert_eq!(a.tokens, ar_toks);
    assert_eq!(ar_calls.get(), 4 * a.iterations.len());
    // a failing barrier: the run returns its error
    let mut bad = one_layer_draft_decoder(&target, extra);
    bad.set_phase_barrier(Some(PhaseBarrier(Box::new(|| {
        Err(dustin_core::CoreError::Model("device sync: lost".into()))
    }))));
    let err = bad
        .generate(&prompts(), &cfg, None, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("device sync: lost"), "{err}");
}
