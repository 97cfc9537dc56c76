//! [`QwenConfig`] from GGUF metadata (llama.cpp's `{arch}.*` keys).

use crate::config::QwenConfig;
use crate::error::{QwenError, Result};

use super::GgufFile;

/// Builds and validates the model hyperparameters from a GGUF file's metadata.
///
/// | `QwenConfig` field | GGUF source |
/// |---|---|
/// | `model_type` | `general.architecture` (`"qwen2"` or `"llama"`) |
/// | `num_hidden_layers` | `{arch}.block_count` |
/// | `hidden_size` | `{arch}.embedding_length` |
/// | `intermediate_size` | `{arch}.feed_forward_length` |
/// | `num_attention_heads` | `{arch}.attention.head_count` |
/// | `num_key_value_heads` | `{arch}.attention.head_count_kv` (default: head count) |
/// | `head_dim` | `{arch}.attention.key_length` when present |
/// | `rms_norm_eps` | `{arch}.attention.layer_norm_rms_epsilon` (f32, read through its shortest decimal, so `1e-5`) |
/// | `rope_theta` | `{arch}.rope.freq_base` (default 10000) |
/// | `max_position_embeddings` | `{arch}.context_length` |
/// | `vocab_size` | rows of `token_embd.weight`; without tensors `{arch}.vocab_size`, else the length of `tokenizer.ggml.tokens` |
/// | `tie_word_embeddings` | `output.weight` absent |
/// | `attention_bias` | `blk.0.attn_q.bias` present |
/// | `bos_token_id`, `eos_token_id` | `tokenizer.ggml.bos_token_id`, `tokenizer.ggml.eos_token_id` |
/// | `rope_scaling` | `{arch}.rope.scaling.type` other than `none` (then `validate` rejects it) |
///
/// # Errors
/// [`QwenError::Config`] naming the file for an unsupported architecture, a missing key, a key
/// of the wrong type, or a RoPE dimension count other than the head width (partial rotary);
/// the errors of [`QwenConfig::validate`].
pub fn config_from_gguf(g: &GgufFile) -> Result<QwenConfig> {
    let arch = g.architecture()?.to_string();
    if arch != "qwen2" && arch != "llama" {
        return Err(g.config_err(format!(
            "general.architecture is \"{arch}\"; supported: \"qwen2\", \"llama\""
        )));
    }
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| -> Result<usize> {
        let full = key(k);
        let v = g
            .get_u64(&full)?
            .ok_or_else(|| g.config_err(format!("missing metadata key `{full}`")))?;
        usize::try_from(v).map_err(|_| g.config_err(format!("`{full}` = {v} does not fit usize")))
    };
    let opt = |k: &str| -> Result<Option<usize>> {
        let full = key(k);
        match g.get_u64(&full)? {
            None => Ok(None),
            Some(v) => usize::try_from(v)
                .map(Some)
                .map_err(|_| g.config_err(format!("`{full}` = {v} does not fit usize"))),
        }
    };

    let num_hidden_layers = need("block_count")?;
    let hidden_size = need("embedding_length")?;
    let intermediate_size = need("feed_forward_length")?;
    let num_attention_heads = need("attention.head_count")?;
    let num_key_value_heads = opt("attention.head_count_kv")?.or(Some(num_attention_heads));
    let head_dim = opt("attention.key_length")?;
    if let (Some(k), Some(v)) = (head_dim, opt("attention.value_length")?) {
        if k != v {
            return Err(g.config_err(format!(
                "{arch}.attention.key_length = {k} differs from value_length = {v}; not supported"
            )));
        }
    }
    let max_position_embeddings = need("context_length")?;
    let rms_norm_eps = g
        .get_f64(&key("attention.layer_norm_rms_epsilon"))?
        .ok_or_else(|| {
            g.config_err(format!(
                "missing metadata key `{}`",
                key("attention.layer_norm_rms_epsilon")
            ))
        })?;
    let rope_theta = g.get_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0);

    let vocab_size = match g.tensor_info("token_embd.weight") {
        Some(t) if t.dims.len() == 2 => t.dims[1] as usize,
        _ => match opt("vocab_size")? {
            Some(v) => v,
            None => g
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(<[_]>::len)
                .ok_or_else(|| {
                    g.config_err(format!(
                        "cannot tell the vocabulary size: no token_embd.weight, `{}` or tokenizer.ggml.tokens",
                        key("vocab_size")
                    ))
                })?,
        },
    };

    let rope_scaling = match g.get_str(&key("rope.scaling.type"))? {
        None | Some("none") => None,
        Some(t) => {
            let factor = g.get_f64(&key("rope.scaling.factor"))?;
            Some(serde_json::json!({ "type": t, "factor": factor }))
        }
    };

    let bos = g.get_u64("tokenizer.ggml.bos_token_id")?;
    let eos = g.get_u64("tokenizer.ggml.eos_token_id")?;
    let id = |v: u64, k: &str| {
        u32::try_from(v).map_err(|_| g.config_err(format!("`{k}` = {v} does not fit u32")))
    };
    let bos_token_id = bos
        .map(|v| id(v, "tokenizer.ggml.bos_token_id"))
        .transpose()?;
    let eos_token_id = eos
        .map(|v| id(v, "tokenizer.ggml.eos_token_id"))
        .transpose()?;

    // Through JSON, so fields added to `QwenConfig` later take their serde defaults.
    let json = serde_json::json!({
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": g.tensor_info("output.weight").is_none(),
        "attention_bias": g.tensor_info("blk.0.attn_q.bias").is_some(),
        "hidden_act": "silu",
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "rope_scaling": rope_scaling,
    });
    let cfg: QwenConfig = serde_json::from_value(json)
        .map_err(|e| g.config_err(format!("cannot build the config: {e}")))?;
    if let Some(rot) = opt("rope.dimension_count")? {
        if cfg.num_attention_heads > 0 && rot != cfg.head_dim() {
            return Err(g.config_err(format!(
                "{arch}.rope.dimension_count = {rot} differs from the head width {}: partial \
                 rotary embeddings are not supported",
                cfg.head_dim()
            )));
        }
    }
    cfg.validate()?;
    Ok(cfg)
}

impl GgufFile {
    pub(crate) fn config_err(&self, msg: String) -> QwenError {
        QwenError::Config {
            path: self.path().display().to_string(),
            msg,
        }
    }
}
