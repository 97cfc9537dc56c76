//! `dustin_qwen::generate::generate` with greedy sampling (each token picked on the device)
//! against HF transformers' greedy tokens of the parity fixtures (float64, eager attention;
//! `scripts/make_parity_fixtures.py`): both prompts of a fixture in one batch of different
//! lengths, so the ragged batch and the per-row ids are checked together.

mod common;

use dustin_qwen::generate::{generate, GenerateConfig};

/// HF's greedy continuation of a case: its fed decode tokens (the first is the prefill's
/// argmax, each next one the argmax after the previous), then the argmax after the last.
fn hf_greedy(case: &common::Case) -> Vec<u32> {
    let last = case.decode_logits.last().expect("decode logits");
    let mut best = 0;
    for (i, &x) in last.iter().enumerate() {
        if x > last[best] {
            best = i;
        }
    }
    let mut toks = case.decode_tokens.clone();
    toks.push(best as u32);
    toks
}

#[test]
fn greedy_generate_gives_hf_transformers_tokens_for_a_ragged_batch() {
    for name in ["qwen2-tied", "qwen2-gqa7"] {
        let model = common::load(name);
        let r = common::reference(name);
        let prompts: Vec<Vec<u32>> = r.cases.iter().map(|c| c.prompt.clone()).collect();
        assert_ne!(prompts[0].len(), prompts[1].len(), "{name}: a ragged batch");
        let want: Vec<Vec<u32>> = r.cases.iter().map(hf_greedy).collect();
        let cfg = GenerateConfig {
            max_new_tokens: want[0].len(),
            stop_at_eos: false,
            ..GenerateConfig::default()
        };
        let out = generate(&model, &prompts, &cfg, None, &mut |_, _| {}).expect("generate");
        assert_eq!(out.tokens, want, "{name}");
    }
}
