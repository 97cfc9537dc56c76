//! Bytes a model reads at a config's shapes: its weights per forward pass and its KV cache
//! per token (`generate --gpu-memory` plans with the first; the bandwidth floors of
//! `dustin-bench e2e` use both).

use dustin_qwen::QwenConfig;

/// Bytes of the weights one forward pass reads: every layer's matrices and the LM head
/// (the embedding is only gathered from), at `bytes` per parameter.
pub fn weight_bytes_per_forward(c: &QwenConfig, bytes: f64) -> f64 {
    let h = c.hidden_size as f64;
    let layer = c.layer_matrix_weights() + 2.0 * h;
    (c.num_hidden_layers as f64 * layer + c.vocab_size as f64 * h) * bytes
}

/// KV bytes of one token over all layers of `c` (keys and values).
pub fn kv_bytes_per_token(c: &QwenConfig, bytes: f64) -> f64 {
    (c.num_hidden_layers * 2 * c.kv_heads() * c.head_dim()) as f64 * bytes
}
