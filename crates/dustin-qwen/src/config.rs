//! Hyperparameters read from a Hugging Face `config.json` (Qwen2 / Qwen2.5 and Llama).
//!
//! Keys and defaults follow `transformers`' `Qwen2Config` and `LlamaConfig`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{QwenError, Result};

/// Architecture family: decides the q/k/v bias default and GGUF tensor layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Qwen2 / Qwen2.5: q/k/v projections have a bias.
    Qwen2,
    /// Llama (SmolLM2, ...): no bias unless `attention_bias` says so.
    Llama,
}

/// `eos_token_id` is a number or a list in HF configs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(i) => vec![*i],
            TokenIds::Many(v) => v.clone(),
        }
    }
}

/// Model hyperparameters (HF `config.json` keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QwenConfig {
    /// `model_type`: `"qwen2"` or `"llama"` (and Llama-compatible types such as `"mistral"`
    /// without sliding window).
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// Rows of the embedding table (may exceed the tokenizer's real vocabulary).
    pub vocab_size: usize,
    /// Model width `d_model`.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of KV heads (GQA); defaults to the query heads (MHA).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base frequency `theta` (Su et al. 2021); HF default 10000.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Longest sequence the model was trained for, in tokens.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// Whether the LM head shares the embedding table.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have a bias (Llama key `attention_bias`; implied `true` for
    /// Qwen2, whose HF code always has it).
    #[serde(default)]
    pub attention_bias: Option<bool>,
    /// Activation of the MLP; only `"silu"` is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Beginning-of-sequence id.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence id(s).
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    /// RoPE scaling (YaRN, Llama 3, ...): not supported when set.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers >= 5 writes `{"rope_theta": .., "rope_type": "default"}` here instead of
    /// a top-level `rope_theta`; its `rope_theta` wins when present.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
}

/// Largest size of any dimension in a config (`vocab_size`, `hidden_size`, layers, heads,
/// `max_position_embeddings`, ...): 2^24, far above any published model.
pub const MAX_DIM: usize = 1 << 24;

fn default_model_type() -> String {
    "qwen2".into()
}
fn default_eps() -> f64 {
    1e-6
}
fn default_theta() -> f64 {
    10_000.0
}
fn default_max_pos() -> usize {
    32_768
}
fn default_act() -> String {
    "silu".into()
}

impl QwenConfig {
    /// Reads and validates `config.json`.
    ///
    /// # Errors
    /// [`QwenError::Io`], [`QwenError::Config`] for bad JSON or missing keys, and the errors of
    /// [`QwenConfig::validate`].
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| QwenError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_json(&text, &path.display().to_string())
    }

    /// Parses and validates a `config.json` text; `origin` names it in errors.
    ///
    /// # Errors
    /// See [`QwenConfig::from_file`].
    pub fn from_json(text: &str, origin: &str) -> Result<Self> {
        let mut cfg: QwenConfig = serde_json::from_str(text).map_err(|e| QwenError::Config {
            path: origin.to_string(),
            msg: e.to_string(),
        })?;
        if let Some(rp) = cfg.rope_parameters.as_ref().and_then(|v| v.as_object()) {
            if let Some(t) = rp.get("rope_theta").and_then(|t| t.as_f64()) {
                cfg.rope_theta = t;
            }
            if let Some(kind) = rp.get("rope_type").and_then(|t| t.as_str()) {
                if kind != "default" {
                    return Err(QwenError::ConfigValue {
                        key: "rope_parameters.rope_type",
                        value: kind.to_string(),
                        expected: "\"default\" (RoPE scaling is not supported yet)".into(),
                    });
                }
            }
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// The architecture family.
    pub fn family(&self) -> Family {
        if self.model_type == "qwen2" {
            Family::Qwen2
        } else {
            Family::Llama
        }
    }

    /// Number of KV heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.num_attention_heads / self.kv_heads().max(1)
    }

    /// Whether q/k/v have a bias.
    pub fn qkv_bias(&self) -> bool {
        self.attention_bias
            .unwrap_or(self.family() == Family::Qwen2)
    }

    /// End-of-sequence ids (empty when the config has none).
    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_token_id
            .as_ref()
            .map(TokenIds::to_vec)
            .unwrap_or_default()
    }

    /// Weights of one decoder layer's seven matrices: q and o `hidden x heads * head_dim`,
    /// k and v `hidden x kv_heads * head_dim`, gate, up and down `hidden x intermediate`
    /// (biases and norms not included).
    pub fn layer_matrix_weights(&self) -> f64 {
        let (h, i) = (self.hidden_size as f64, self.intermediate_size as f64);
        let (nh, kv, d) = (
            self.num_attention_heads as f64,
            self.kv_heads() as f64,
            self.head_dim() as f64,
        );
        2.0 * h * nh * d + 2.0 * h * kv * d + 3.0 * h * i
    }

    /// Bytes of KV cache per token for one sequence (all layers, K and V) at `dtype_bytes`
    /// bytes per element.
    pub fn kv_bytes_per_token(&self, dtype_bytes: usize) -> usize {
        2usize
            .saturating_mul(self.num_hidden_layers)
            .saturating_mul(self.kv_heads())
            .saturating_mul(self.head_dim())
            .saturating_mul(dtype_bytes)
    }

    /// Checks that the hyperparameters describe a model we can build.
    ///
    /// # Errors
    /// [`QwenError::ConfigValue`] naming the first bad key.
    pub fn validate(&self) -> Result<()> {
        fn bad(key: &'static str, value: impl ToString, expected: &str) -> QwenError {
            QwenError::ConfigValue {
                key,
                value: value.to_string(),
                expected: expected.to_string(),
            }
        }
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (k, v) in positive {
            if v == 0 {
                return Err(bad(k, v, "a positive integer"));
            }
            // far above any published model; keeps every size derived from the config
            // (weights, RoPE tables, KV bytes) free of overflow
            if v > MAX_DIM {
                return Err(bad(k, v, &format!("at most {MAX_DIM}")));
            }
        }
        if let Some(kv) = self.num_key_value_heads {
            if kv > MAX_DIM {
                return Err(bad(
                    "num_key_value_heads",
                    kv,
                    &format!("at most {MAX_DIM}"),
                ));
            }
        }
        if let Some(hd) = self.head_dim {
            if hd > MAX_DIM {
                return Err(bad("head_dim", hd, &format!("at most {MAX_DIM}")));
            }
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.num_attention_heads.is_multiple_of(kv) {
            return Err(bad(
                "num_key_value_heads",
                kv,
                &format!(
                    "a positive divisor of num_attention_heads = {}",
                    self.num_attention_heads
                ),
            ));
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(bad(
                "num_attention_heads",
                self.num_attention_heads,
                &format!("a divisor of hidden_size = {}", self.hidden_size),
            ));
        }
        let hd = self.head_dim();
        if hd == 0 || !hd.is_multiple_of(2) {
            return Err(bad(
                "head_dim",
                hd,
                "a positive even number (RoPE rotates halves)",
            ));
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps.is_finite()) {
            return Err(bad(
                "rms_norm_eps",
                self.rms_norm_eps,
                "a positive finite number",
            ));
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return Err(bad(
                "rope_theta",
                self.rope_theta,
                "a positive finite number",
            ));
        }
        if self.hidden_act != "silu" {
            return Err(bad("hidden_act", &self.hidden_act, "\"silu\" (SwiGLU)"));
        }
        if let Some(rs) = &self.rope_scaling {
            if !rs.is_null() {
                return Err(bad(
                    "rope_scaling",
                    rs,
                    "null (RoPE scaling is not supported yet)",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen25_configs_parse_with_expected_groups() {
        // Published configs in ../shared/data/qwen2.5; groups from the model cards.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/qwen2.5");
        if !dir.exists() {
            return;
        }
        let expect = [
            ("0.5B", 7usize),
            ("1.5B", 6),
            ("3B", 8),
            ("7B", 7),
            ("14B", 5),
            ("32B", 5),
            ("72B", 8),
        ];
        for (size, group) in expect {
            let cfg =
                QwenConfig::from_file(&dir.join(format!("Qwen2.5-{size}-Instruct.config.json")))
                    .expect("config parses");
            assert_eq!(cfg.group(), group, "{size}");
            assert!(cfg.qkv_bias());
            assert_eq!(
                cfg.head_dim(),
                128.min(cfg.hidden_size / cfg.num_attention_heads)
            );
        }
    }

    #[test]
    fn bad_kv_heads_is_named() {
        let text = r#"{"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,
            "num_attention_heads":4,"num_key_value_heads":3}"#;
        let err = QwenConfig::from_json(text, "t").unwrap_err().to_string();
        assert!(err.contains("num_key_value_heads"), "{err}");
    }

    #[test]
    fn missing_key_is_named() {
        let err = QwenConfig::from_json(r#"{"vocab_size":10}"#, "cfg.json")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("hidden_size") && err.contains("cfg.json"),
            "{err}"
        );
    }
}
