//! One entry point for the files users have: an HF model directory or a GGUF file.

use std::path::Path;

use burn_tensor::backend::Backend;

use crate::blocks::WeightFormat;
use crate::chat::ChatTemplate;
use crate::config::QwenConfig;
use crate::error::{QwenError, Result};
use crate::gguf::{config_from_gguf, tokenizer_from_gguf, GgufFile};
use crate::model::Qwen2;
use crate::safetensors_loader::SafetensorsDir;
use crate::tokenizer::Tokenizer;
use crate::weights::WeightSource;

/// A model's config, weights and tokenizer, before moving weights to a device.
pub struct ModelFiles {
    /// Hyperparameters.
    pub config: QwenConfig,
    /// Weights (HF names and layout).
    pub weights: Box<dyn WeightSource>,
    /// Tokenizer with EOS ids.
    pub tokenizer: Tokenizer,
    /// The chat template (GGUF `tokenizer.chat_template`, or `chat_template.jinja` /
    /// `tokenizer_config.json` of an HF directory); `None` when the model ships none.
    pub chat_template: Option<ChatTemplate>,
}

impl std::fmt::Debug for ModelFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelFiles")
            .field("config", &self.config)
            .field("weights", &self.weights.describe())
            .field(
                "chat_template",
                &self.chat_template.as_ref().map(|t| t.origin()),
            )
            .finish()
    }
}

impl ModelFiles {
    /// Opens an HF model directory (`config.json`, safetensors, `tokenizer.json`, optional
    /// `generation_config.json` whose `eos_token_id` wins, optional chat template in
    /// `chat_template.jinja` or `tokenizer_config.json`) or a `.gguf` file.
    ///
    /// # Errors
    /// [`QwenError::Io`] when the path does not exist or lacks a file, and the loaders' errors
    /// (those of [`ChatTemplate::from_gguf`] and [`ChatTemplate::from_hf_dir`] included).
    pub fn open(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(QwenError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such model: give an HF model directory or a .gguf file",
                ),
            });
        }
        if path.is_file() {
            let g = GgufFile::open(path)?;
            let config = config_from_gguf(&g)?;
            let inner = tokenizer_from_gguf(&g)?;
            let tokenizer = Tokenizer::new(inner, config.eos_ids());
            let chat_template = ChatTemplate::from_gguf(&g)?;
            return Ok(Self {
                config,
                weights: Box::new(g),
                tokenizer,
                chat_template,
            });
        }
        let config = QwenConfig::from_file(&path.join("config.json"))?;
        let mut eos = config.eos_ids();
        let gen = path.join("generation_config.json");
        if gen.exists() {
            let text = std::fs::read_to_string(&gen).map_err(|source| QwenError::Io {
                path: gen.clone(),
                source,
            })?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| QwenError::Config {
                    path: gen.display().to_string(),
                    msg: e.to_string(),
                })?;
            if let Some(ids) = v.get("eos_token_id") {
                if let Ok(ids) = serde_json::from_value::<crate::config::TokenIds>(ids.clone()) {
                    eos = ids.to_vec();
                }
            }
        }
        let tokenizer = Tokenizer::from_file(&path.join("tokenizer.json"), eos)?;
        let weights = SafetensorsDir::open(path)?;
        let chat_template = ChatTemplate::from_hf_dir(path)?;
        Ok(Self {
            config,
            weights: Box::new(weights),
            tokenizer,
            chat_template,
        })
    }

    /// Builds the model on `device` with RoPE tables for `max_positions` positions.
    ///
    /// # Errors
    /// Missing or mis-shaped tensors.
    pub fn build<B: Backend>(&self, max_positions: usize, device: &B::Device) -> Result<Qwen2<B>> {
        self.build_as(max_positions, device, WeightFormat::Dense)
    }

    /// As [`ModelFiles::build`], with the weights in `format` ([`WeightFormat::Blocks`]: a
    /// GGUF file's block weights stay in their blocks; an HF directory has none, so it loads
    /// dense either way).
    ///
    /// # Errors
    /// Missing or mis-shaped tensors.
    pub fn build_as<B: Backend>(
        &self,
        max_positions: usize,
        device: &B::Device,
        format: WeightFormat,
    ) -> Result<Qwen2<B>> {
        self.build_offloaded(max_positions, device, &[], format)
    }

    /// As [`ModelFiles::build_as`], with the listed layers' linear weights kept dense in host
    /// memory ([`Qwen2::load_offloaded`]).
    ///
    /// # Errors
    /// Missing or mis-shaped tensors.
    pub fn build_offloaded<B: Backend>(
        &self,
        max_positions: usize,
        device: &B::Device,
        offloaded: &[usize],
        format: WeightFormat,
    ) -> Result<Qwen2<B>> {
        Qwen2::load_as(
            &self.config,
            self.weights.as_ref(),
            max_positions,
            device,
            offloaded,
            format,
        )
    }
}
