//! A tiny HF model directory for running the `dustin` binary: the 2-layer Llama parity
//! fixture of `dustin-qwen` (vocab 96), a word-level `tokenizer.json` of tokens `t0`..`t95`,
//! and a config without EOS and with a long position limit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A fresh scratch directory for `test`.
pub fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dustin-cli-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// A word-level tokenizer over `t0 .. t{n-1}` (whitespace-separated).
pub fn tokenizer_json(n: usize) -> String {
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..n).map(|i| (format!("t{i}"), i.into())).collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    })
    .to_string()
}

/// Writes the tiny model directory into `dir/model` and returns its path.
pub fn tiny_model(dir: &Path, max_positions: usize) -> PathBuf {
    let src =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../dustin-qwen/tests/fixtures/parity/llama");
    let m = dir.join("model");
    std::fs::create_dir_all(&m).expect("model dir");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config"))
            .expect("json");
    cfg["eos_token_id"] = serde_json::Value::Null;
    cfg["max_position_embeddings"] = max_positions.into();
    std::fs::write(m.join("config.json"), cfg.to_string()).expect("write config");
    std::fs::copy(src.join("model.safetensors"), m.join("model.safetensors")).expect("weights");
    std::fs::write(m.join("tokenizer.json"), tokenizer_json(96)).expect("tokenizer");
    m
}

/// Runs `cmd` with its standard output closed before anything is printed (the reader of
/// `dustin ... | head -0` gone), stderr captured.
#[allow(dead_code)] // used by the test files that check a closed standard output
pub fn closed_stdout(cmd: &mut Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dustin");
    drop(child.stdout.take());
    child.wait_with_output().expect("wait")
}
