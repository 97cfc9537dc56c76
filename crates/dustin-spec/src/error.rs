use thiserror::Error;

/// Errors of the speculative engine.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SpecError {
    /// A configuration value is out of range.
    #[error("invalid `{name}`: expected {expected}, found {found}")]
    Config {
        /// The option.
        name: &'static str,
        /// The valid range.
        expected: String,
        /// The value given.
        found: String,
    },
    /// The draft and target vocabularies differ.
    #[error("draft and target vocabularies differ: token {token:?} is {draft:?} in the draft and {target:?} in the target; speculative decoding needs the same tokenizer")]
    VocabMismatch {
        /// The first token string that differs.
        token: String,
        /// Its id in the draft.
        draft: Option<u32>,
        /// Its id in the target.
        target: Option<u32>,
    },
    /// An error of a model, cache or selector.
    #[error(transparent)]
    Core(#[from] dustin_core::CoreError),
    /// An error of the model crate.
    #[error(transparent)]
    Model(#[from] dustin_qwen::QwenError),
}

/// `Result` with [`SpecError`].
pub type Result<T, E = SpecError> = std::result::Result<T, E>;
