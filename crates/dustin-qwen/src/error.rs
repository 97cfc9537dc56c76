use std::path::PathBuf;

use thiserror::Error;

/// Errors of `dustin-qwen`: configs, weight files, tokenizers, forward passes.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QwenError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` (or GGUF metadata) is not valid JSON or lacks a key.
    #[error("invalid model config {path}: {msg}")]
    Config {
        /// Where the config came from.
        path: String,
        /// What is wrong.
        msg: String,
    },
    /// A hyperparameter has an impossible value.
    #[error("invalid config value `{key}` = {value}: {expected}")]
    ConfigValue {
        /// The config key.
        key: &'static str,
        /// The value found.
        value: String,
        /// What would be valid.
        expected: String,
    },
    /// A weight the architecture needs is not in the files.
    #[error("tensor `{name}` not found in {source_desc}")]
    MissingTensor {
        /// The tensor's HF name.
        name: String,
        /// The weight source (file or directory).
        source_desc: String,
    },
    /// A weight has the wrong shape.
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor dtype or GGUF quantisation type that is not supported.
    #[error("tensor `{name}` has unsupported type {dtype}; supported: {supported}")]
    UnsupportedDtype {
        /// The tensor's name.
        name: String,
        /// The type found.
        dtype: String,
        /// The types we read.
        supported: &'static str,
    },
    /// A weight file is malformed or truncated.
    #[error("malformed {kind} file {path}: {msg}")]
    Format {
        /// `"safetensors"`, `"GGUF"`, `"safetensors index"`, ...
        kind: &'static str,
        /// The file.
        path: String,
        /// What is wrong.
        msg: String,
    },
    /// The tokenizer could not be built or run.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A prompt is unusable.
    #[error("prompt {index}: {msg}")]
    Prompt {
        /// Index of the prompt in the batch.
        index: usize,
        /// What is wrong.
        msg: String,
    },
    /// A chat template does not compile (a syntax error) or fails to render (an undefined
    /// value used, a type error, or the template's own `raise_exception`); see
    /// [`crate::chat`].
    #[error("chat template of {origin}: {msg}")]
    ChatTemplate {
        /// Where the template came from (the GGUF file or `tokenizer_config.json`).
        origin: String,
        /// What went wrong, with the template line where known.
        msg: String,
    },
    /// A chat conversation was asked of a model that ships no chat template.
    #[error(
        "{model} has no chat template (no `tokenizer.chat_template` in a GGUF file, no \
         `chat_template` in tokenizer_config.json or chat_template.jinja in a model directory)"
    )]
    NoChatTemplate {
        /// The model's path.
        model: String,
    },
    /// Tensor parallelism cannot split or run this model as asked ([`crate::tp`]): a size that
    /// does not divide by the world size, a rank outside its group, a weight that is not a
    /// dense device tensor, or a rank the others waited on in vain.
    #[error("tensor parallelism: {0}")]
    Parallel(String),
    /// An error from the KV cache or a hook.
    #[error(transparent)]
    Core(#[from] dustin_core::CoreError),
    /// A fused attention kernel refused its input (other than an unsupported dtype or head
    /// width, for which the model falls back to its plain path).
    #[error("attention kernel: {0}")]
    Kernel(#[from] dustin_kernels::KernelError),
}

/// `Result` with [`QwenError`].
pub type Result<T, E = QwenError> = std::result::Result<T, E>;

impl From<QwenError> for dustin_core::CoreError {
    fn from(e: QwenError) -> Self {
        match e {
            QwenError::Core(c) => c,
            other => dustin_core::CoreError::Model(other.to_string()),
        }
    }
}
