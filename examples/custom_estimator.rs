//! A new KV-selection method in one file, compared with dense verification on the same
//! speculative run.
//!
//! The method: **key norm** (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based
//! Strategy for KV Cache Compression", arXiv 2406.11430): keys with a *low* L2 norm tend to
//! receive high attention, so the score of position `p` is `-||k_p||`. An estimator only
//! scores; the shared top-k step of [`Selector`] adds the sinks, the recent window and the
//! budget, and the verifier attends to the selection. Its cost is declared through
//! [`EstimationCost`] (it reads every key: half a token-equivalent per position and KV head)
//! so reports count it.
//!
//! Run: `cargo run --release -p dustin-cli --example custom_estimator` (a tiny random Llama
//! from the test fixtures: the numbers show the plumbing, not quality). Pass a model
//! directory or `.gguf` file and a prompt file to run it on a real model:
//! `cargo run --release -p dustin-cli --example custom_estimator -- MODEL PROMPT.txt`.

use std::path::Path;
use std::sync::Arc;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::backend::Backend;
use dustin_core::{DenseHook, ImportanceEstimator, ScoreCtx, Scores};
use dustin_qwen::{ModelFiles, Qwen2, QwenConfig, SafetensorsDir};
use dustin_select::{EstimationCost, SelectConfig, Selector};
use dustin_spec::{ModelDrafter, ModelVerifier, SpecConfig, SpecOutput, SpeculativeDecoder};

type B = Flex;

/// Key-norm scoring: `-||k||` per context position and KV head, `[batch, kv_heads, ctx]`.
#[derive(Debug, Clone, Default)]
struct KeyNorm;

impl<Bk: Backend> ImportanceEstimator<Bk> for KeyNorm {
    fn name(&self) -> String {
        "key-norm".into()
    }

    fn reset(&mut self, _batch: usize, _num_layers: usize) {}

    fn score(&mut self, ctx: &ScoreCtx<'_, Bk>) -> dustin_core::Result<Scores<Bk>> {
        let a = ctx.attn;
        // keys [batch, kv_heads, ctx + n_new, head_dim]; score the context part only
        let c = a.ctx_lens.iter().copied().max().unwrap_or(0);
        let [b, kvh, _, d] = a.k.dims();
        let k = a.k.clone().slice([0..b, 0..kvh, 0..c, 0..d]);
        let norm = k.powf_scalar(2.0).sum_dim(3).sqrt().reshape([b, kvh, c]);
        Ok(Scores::Tokens(norm.neg()))
    }
}

impl EstimationCost for KeyNorm {
    fn score_reads(&self, _layer: usize, ctx: usize, kv_heads: usize, _heads: usize) -> f64 {
        0.5 * (kv_heads * ctx) as f64
    }
}

fn run<P: dustin_core::SelectionPolicy<B>>(
    model: &Arc<Qwen2<B>>,
    policy: P,
    prompt: &[u32],
    vocab: usize,
) -> Result<SpecOutput, Box<dyn std::error::Error>> {
    let cfg = SpecConfig {
        gamma: 4,
        max_new_tokens: 32,
        ..SpecConfig::default()
    };
    let extra = cfg.max_new_tokens + 2 * (cfg.gamma + 2);
    let layers = (model.config.num_hidden_layers / 2).max(1);
    let drafter = ModelDrafter::new(model.clone(), Some(layers), extra);
    let verifier = ModelVerifier::new(model.clone(), policy, extra, vocab);
    let mut dec = SpeculativeDecoder::new(drafter, verifier);
    Ok(dec.generate(&[prompt.to_vec()], &cfg, None, &mut |_, _| {})?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dev = FlexDevice;
    let (model, prompt, vocab) = match args.as_slice() {
        [model, prompt] => {
            let files = ModelFiles::open(Path::new(model))?;
            let ids = files.tokenizer.encode(&std::fs::read_to_string(prompt)?)?;
            let m = files.build::<B>(ids.len() + 64, &dev)?;
            let vocab = files.tokenizer.vocab_size().min(m.config.vocab_size);
            (Arc::new(m), ids, vocab)
        }
        [] => {
            let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../dustin-qwen/tests/fixtures/parity/llama");
            let cfg = QwenConfig::from_file(&dir.join("config.json"))?;
            let m = Qwen2::<B>::load(&cfg, &SafetensorsDir::open(&dir)?, 256, &dev)?;
            // a deterministic pseudo-random prompt of 120 token ids
            let ids: Vec<u32> = (0..120u32).map(|i| (i * 37 + 11) % 96).collect();
            (Arc::new(m), ids, 96)
        }
        _ => return Err("usage: custom_estimator [MODEL PROMPT_FILE]".into()),
    };
    // a quarter of the prompt as budget, 4 sinks and a window of 16
    let select = SelectConfig {
        budget: prompt.len() / 4,
        n_sink: 4,
        window: 16,
        ..SelectConfig::default()
    };
    let dense = run(&model, DenseHook, &prompt, vocab)?;
    let sparse = run(&model, Selector::new(KeyNorm, select)?, &prompt, vocab)?;
    let same = dense.tokens[0]
        .iter()
        .zip(&sparse.tokens[0])
        .take_while(|(a, b)| a == b)
        .count();
    let s = &sparse.summary;
    println!(
        "key-norm at budget {} of {} tokens: KV read {:.3} (+ {:.3} estimation), acceptance length {:.2} (dense {:.2}), first {} of {} tokens equal to dense verification",
        prompt.len() / 4,
        prompt.len(),
        s.mean_kv_read_fraction,
        s.mean_estimation_read_fraction,
        s.mean_acceptance_length,
        dense.summary.mean_acceptance_length,
        same,
        dense.tokens[0].len()
    );
    Ok(())
}
