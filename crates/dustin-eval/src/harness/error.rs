//! The error of the harness.

/// Everything that can stop an evaluation run.
///
/// Messages name the option at fault as the `dustin eval` commands spell it (`--ctx`,
/// `--budget`, ...): the option structs are those commands' flags (the `clap` feature).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A bad option, or data that does not fit the options (named in the message).
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path (or the option that named it, followed by the path).
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Loading or running a model failed.
    #[error(transparent)]
    Model(#[from] dustin_qwen::QwenError),
    /// The engine failed.
    #[error(transparent)]
    Spec(#[from] dustin_spec::SpecError),
    /// A core error (a selection policy, the memory check).
    #[error(transparent)]
    Core(#[from] dustin_core::CoreError),
    /// An error of the [`ModelHost`](super::ModelHost) (resolving a model name, fetching
    /// it, building a draft), passed through as the host made it.
    #[error(transparent)]
    Host(Box<dyn std::error::Error + Send + Sync>),
}
