use dustin_core::CoreError;
use thiserror::Error;

/// Errors of `dustin-select` beyond [`CoreError`]: registry look-ups and estimator configs.
///
/// Everything a policy reports while running (through the `dustin-core` traits) is a
/// [`CoreError`]; this type only adds what can go wrong while *building* one.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SelectError {
    /// A selector name the registry does not know.
    #[error(
        "unknown selector `{name}`; known: {known} (and `pyramid(<name>)` around any of them)"
    )]
    UnknownName {
        /// The name asked for.
        name: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// An estimator config (JSON or TOML value) that does not parse as that estimator's config.
    #[error("invalid config for selector `{name}`: {source}")]
    Config {
        /// The selector whose config was rejected.
        name: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A validation error from `dustin-core`'s vocabulary (for example
    /// [`CoreError::InvalidInput`] naming `budget`).
    #[error(transparent)]
    Core(#[from] CoreError),
}

impl From<SelectError> for CoreError {
    fn from(e: SelectError) -> Self {
        match e {
            SelectError::Core(c) => c,
            other => CoreError::Other(Box::new(other)),
        }
    }
}
