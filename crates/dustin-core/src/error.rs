use thiserror::Error;

/// The error type shared by the traits of `dustin-core`.
///
/// Implementations in other crates convert their own errors into [`CoreError::Model`] or
/// [`CoreError::Other`] so that the engine can report them without knowing their crate.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CoreError {
    /// An argument had a value outside what the callee accepts.
    #[error("invalid `{name}`: expected {expected}, found {found}")]
    InvalidInput {
        /// Name of the argument or field.
        name: String,
        /// What was expected, in words.
        expected: String,
        /// What was found.
        found: String,
    },
    /// A tensor had the wrong shape.
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    Shape {
        /// Name of the tensor.
        name: String,
        /// The expected shape.
        expected: Vec<usize>,
        /// The shape found.
        found: Vec<usize>,
    },
    /// A KV cache operation went past the preallocated capacity.
    #[error("KV cache of sequence {seq} would hold {needed} tokens, capacity is {capacity}")]
    CacheFull {
        /// Index of the sequence in the batch.
        seq: usize,
        /// Tokens the operation needs.
        needed: usize,
        /// Preallocated capacity in tokens.
        capacity: usize,
    },
    /// Logits or probabilities contained NaN or infinite values.
    #[error("non-finite values in {what} (sequence {seq}): refusing to sample from them")]
    NonFinite {
        /// What contained them (for example "target logits").
        what: String,
        /// Index of the sequence in the batch.
        seq: usize,
    },
    /// An allocation would need more memory than the device has available.
    #[error(
        "{what} needs {}, but only {} are available ({origin}): use a smaller batch, shorter \
         prompts or fewer new tokens",
        crate::memory::describe_bytes(*needed),
        crate::memory::describe_bytes(u128::from(*available))
    )]
    OutOfMemory {
        /// What was to be allocated, with its shape.
        what: String,
        /// Bytes needed.
        needed: u128,
        /// Bytes available.
        available: u64,
        /// Where the available figure comes from.
        origin: String,
    },
    /// An error from a model implementation.
    #[error("model error: {0}")]
    Model(String),
    /// A [`CancelToken`](crate::CancelToken) was set while `during` ran (a prefill, which
    /// checks it between layers); what it was writing is incomplete.
    #[error("cancelled during the {during}")]
    Cancelled {
        /// What was running, for example "prefill".
        during: &'static str,
    },
    /// Any other error, boxed.
    #[error(transparent)]
    Other(#[from] Box<dyn std::error::Error + Send + Sync>),
}

/// `Result` with [`CoreError`].
pub type Result<T, E = CoreError> = std::result::Result<T, E>;

impl CoreError {
    /// Shorthand for [`CoreError::InvalidInput`].
    pub fn invalid(
        name: impl Into<String>,
        expected: impl Into<String>,
        found: impl std::fmt::Display,
    ) -> Self {
        CoreError::InvalidInput {
            name: name.into(),
            expected: expected.into(),
            found: found.to_string(),
        }
    }
}
