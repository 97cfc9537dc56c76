//! Runs driven one iteration at a time (`SpeculativeDecoder::start` / `step`): the same output
//! as `generate`, per-sequence limits, and a sequence cancelled mid-run leaving the others'
//! output unchanged.

use std::path::Path;
use std::sync::Arc;

use burn_flex::{Flex, FlexDevice};
use dustin_core::DenseHook;
use dustin_qwen::generate::FinishReason;
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir};
use dustin_spec::{
    AutoregressiveDecoder, ModelDrafter, ModelVerifier, SeqLimits, SpecConfig, SpeculativeDecoder,
};

type B = Flex;

fn model(name: &str) -> Arc<Qwen2<B>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dustin-qwen/tests/fixtures/parity")
        .join(name);
    let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    let src = SafetensorsDir::open(&dir).expect("weights");
    Arc::new(Qwen2::load(&cfg, &src, 256, &FlexDevice).expect("model"))
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 17, 33, 2, 90, 61, 7, 44, 12, 3, 71],
        vec![9, 1, 64, 30, 22],
        vec![40, 41, 42, 43, 44, 45, 46, 47, 48],
    ]
}

fn decoder(max_new: usize) -> SpeculativeDecoder<B, ModelDrafter<B>, ModelVerifier<B, DenseHook>> {
    let extra = max_new + 12;
    SpeculativeDecoder::new(
        ModelDrafter::new(model("qwen2-gqa7"), None, extra),
        ModelVerifier::new(model("qwen2-tied"), DenseHook, extra, 96),
    )
}

fn cfg(max_new: usize) -> SpecConfig {
    SpecConfig {
        gamma: 3,
        max_new_tokens: max_new,
        ..SpecConfig::default()
    }
}

#[test]
fn steps_give_generates_output_and_a_cancel_leaves_the_others_alone() {
    let want = decoder(20)
        .generate(&prompts(), &cfg(20), None, &mut |_, _| {})
        .expect("generate");
    let mut dec = decoder(20);
    let mut streamed = vec![Vec::new(); 3];
    let mut on = |s: usize, t: &[u32]| streamed[s].extend_from_slice(t);
    let mut run = dec
        .start(&prompts(), &cfg(20), &[], None, &mut on)
        .expect("start");
    let mut steps = 0;
    while !run.is_done() {
        dec.step(&mut run, None, &mut on).expect("step");
        steps += 1;
        if steps == 2 {
            assert!(run.cancel(1));
            assert!(!run.cancel(1), "a second cancel finds it finished");
        }
    }
    let got = run.finish();
    assert_eq!(got.tokens[0], want.tokens[0]);
    assert_eq!(got.tokens[2], want.tokens[2]);
    assert_eq!(got.finish[1], FinishReason::Cancelled);
    assert!(got.tokens[1].len() < 20 && got.tokens[1][..] == want.tokens[1][..got.tokens[1].len()]);
    assert_eq!(streamed, got.tokens);
}

#[test]
fn per_sequence_limits_cut_each_sequence_at_its_own_length() {
    let want = decoder(20)
        .generate(&prompts(), &cfg(20), None, &mut |_, _| {})
        .expect("generate");
    let limits: Vec<SeqLimits> = [4, 20, 9]
        .iter()
        .map(|&n| SeqLimits {
            max_new_tokens: n,
            stop_strings: Vec::new(),
            ..SeqLimits::default()
        })
        .collect();
    let mut dec = decoder(20);
    let mut run = dec
        .start(&prompts(), &cfg(20), &limits, None, &mut |_, _| {})
        .expect("start");
    while !run.is_done() {
        dec.step(&mut run, None, &mut |_, _| {}).expect("step");
    }
    let got = run.finish();
    for (s, l) in limits.iter().enumerate() {
        assert_eq!(
            got.tokens[s],
            want.tokens[s][..l.max_new_tokens],
            "sequence {s}"
        );
    }
    let bad = dec.start(&prompts(), &cfg(20), &limits[..2], None, &mut |_, _| {});
    assert!(bad.unwrap_err().to_string().contains("limits"));
    // the autoregressive decoder driven the same way gives the target's greedy output
    let mut ar =
        AutoregressiveDecoder::new(ModelVerifier::new(model("qwen2-tied"), DenseHook, 32, 96));
    let mut run = ar
        .start(&prompts(), &cfg(20), &[], None, &mut |_, _| {})
        .expect("start");
    while !run.is_done() {
        ar.step(&mut run, None, &mut |_, _| {}).expect("step");
    }
    assert_eq!(run.finish().tokens, want.tokens);
}
