//! Helpers shared by the integration tests: the parity fixtures (tiny random Qwen2 / Llama
//! models with HF transformers' float64 logits, `scripts/make_parity_fixtures.py`) and one
//! dense forward pass read back to the host.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};

use burn_flex::{Flex, FlexDevice};
use dustin_core::{DenseHook, Phase};
use dustin_kv::DenseKvCache;
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2, QwenConfig, SafetensorsDir};
use serde::Deserialize;

/// The CPU backend the tests run on.
pub type B = Flex;

/// One prompt of a fixture's `reference.json`.
#[derive(Deserialize)]
pub struct Case {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// HF logits at every prompt position.
    pub prefill_logits: Vec<Vec<f32>>,
    /// Tokens fed after the prompt, one per decode step.
    pub decode_tokens: Vec<u32>,
    /// HF logits after each decode token.
    pub decode_logits: Vec<Vec<f32>>,
}

/// A fixture's `reference.json`.
#[derive(Deserialize)]
pub struct Reference {
    /// Its prompts.
    pub cases: Vec<Case>,
}

/// Folder of parity fixture `name` (`llama`, `qwen2-tied`, `qwen2-gqa7`).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(name)
}

/// Config and weights of fixture `name`.
pub fn fixture_files(name: &str) -> (QwenConfig, SafetensorsDir) {
    let dir = fixture(name);
    let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    let src = SafetensorsDir::open(&dir).expect("safetensors");
    (cfg, src)
}

/// Fixture `name` as a model with 64 RoPE positions.
pub fn load(name: &str) -> Qwen2<B> {
    let (cfg, src) = fixture_files(name);
    Qwen2::<B>::load(&cfg, &src, 64, &FlexDevice).expect("model")
}

/// HF's reference logits of fixture `name`.
pub fn reference(name: &str) -> Reference {
    let text = std::fs::read_to_string(fixture(name).join("reference.json")).expect("reference");
    serde_json::from_str(&text).expect("reference json")
}

/// One dense forward pass of `tokens` (`[batch][n]`) appended to `cache`: the logits of every
/// new position, flat `[batch, n, vocab]` on the host.
pub fn forward_logits(m: &Qwen2<B>, cache: &mut DenseKvCache<B>, tokens: &[Vec<u32>]) -> Vec<f32> {
    let out = m
        .forward(
            tokens,
            cache,
            &mut DenseHook,
            ForwardOpts {
                phase: Phase::Decode,
                logits: LogitsMode::All,
                layers: None,
            },
        )
        .expect("forward");
    out.logits
        .expect("logits")
        .into_data()
        .convert::<f32>()
        .into_vec()
        .expect("f32")
}

/// Largest absolute difference of two equal-length slices.
pub fn max_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `file` in the model cache (`$DUSTIN_CACHE/models`, else `~/.cache/dustin/models`), for the
/// ignored tests that read the real models; panics naming the file and the fetch to run when
/// it is absent.
pub fn cached_model(file: &str) -> PathBuf {
    let root = std::env::var_os("DUSTIN_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dustin")))
        .expect("DUSTIN_CACHE or HOME");
    let p = root.join("models").join(file);
    assert!(
        p.exists(),
        "{} absent: run `dustin fetch-model` for qwen2.5-coder-0.5b-instruct and -1.5b-instruct",
        p.display()
    );
    p
}

/// The ggml block formats of `dustin_kernels::cpu_quant` and their ggml type ids.
pub const QUANT_TYPES: [(dustin_kernels::QuantType, u32); 8] = [
    (dustin_kernels::QuantType::Q4_0, 2),
    (dustin_kernels::QuantType::Q4_1, 3),
    (dustin_kernels::QuantType::Q5_0, 6),
    (dustin_kernels::QuantType::Q5_1, 7),
    (dustin_kernels::QuantType::Q8_0, 8),
    (dustin_kernels::QuantType::Q4K, 12),
    (dustin_kernels::QuantType::Q5K, 13),
    (dustin_kernels::QuantType::Q6K, 14),
];

/// The ggml type of a block format.
pub fn ggml(ty: dustin_kernels::QuantType) -> dustin_qwen::gguf::GgmlType {
    let id = QUANT_TYPES.iter().find(|t| t.0 == ty).expect("listed").1;
    dustin_qwen::gguf::GgmlType::from_id(id).expect("ggml id")
}

/// Random blocks of `ty` for a `[rows, cols]` weight: random bytes for the quants and
/// scales, finite f16 scale fields (`d`, `m`, `dmin`) in `[-0.05, 0.05]`.
pub fn random_blocks(
    ty: dustin_kernels::QuantType,
    rows: usize,
    cols: usize,
    rng: &mut rand_chacha::ChaCha8Rng,
) -> Vec<u8> {
    use dustin_kernels::QuantType;
    use rand::{Rng, RngCore};
    let fields: &[usize] = match ty {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => &[0],
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
        QuantType::Q6K => &[208],
    };
    let mut data = vec![0u8; rows * cols / ty.block_elems() * ty.block_bytes()];
    rng.fill_bytes(&mut data);
    for blk in data.chunks_exact_mut(ty.block_bytes()) {
        for &at in fields {
            let v = half::f16::from_f32(rng.random_range(-0.05f32..0.05));
            blk[at..at + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    data
}
