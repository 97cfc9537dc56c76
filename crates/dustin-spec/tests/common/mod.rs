//! Helpers shared by the engine's test files: the tiny random models (the HF parity
//! fixtures of `dustin-qwen`, vocab 96), a batch of prompts and the autoregressive reference.

use std::path::Path;
use std::sync::Arc;

use burn_flex::{Flex, FlexDevice};
use dustin_qwen::generate::{generate, FinishReason, GenerateConfig};
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir};

pub type B = Flex;

pub fn model(name: &str) -> Arc<Qwen2<B>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dustin-qwen/tests/fixtures/parity")
        .join(name);
    let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    let src = SafetensorsDir::open(&dir).expect("weights");
    Arc::new(Qwen2::load(&cfg, &src, 256, &FlexDevice).expect("model"))
}

pub fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 17, 33, 2, 90, 61, 7, 44, 12, 3, 71],
        vec![9, 1, 64, 30, 22],
        vec![
            40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58,
        ],
    ]
}

pub fn ar(target: &Qwen2<B>, max_new: usize, eos: &[u32]) -> (Vec<Vec<u32>>, Vec<FinishReason>) {
    let cfg = GenerateConfig {
        max_new_tokens: max_new,
        ..GenerateConfig::default()
    };
    let tok = None;
    let o = generate(target, &prompts(), &cfg, tok, &mut |_, _| {}).expect("ar");
    // apply EOS by hand to the AR output (generate without a tokenizer knows no EOS)
    let mut toks = o.tokens;
    let mut fin = o.finish;
    for (t, f) in toks.iter_mut().zip(fin.iter_mut()) {
        if let Some(p) = t.iter().position(|x| eos.contains(x)) {
            t.truncate(p + 1);
            *f = FinishReason::Eos;
        }
    }
    (toks, fin)
}
