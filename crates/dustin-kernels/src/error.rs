//! Errors of the kernel ops: bad input is reported, never a panic.

use std::fmt::Display;

/// What went wrong in a kernel op.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A tensor had another shape than the op needs.
    #[error("{name}: expected shape {expected:?}, found {found:?}")]
    Shape {
        /// Which argument.
        name: &'static str,
        /// The shape the op expected (as far as it is known).
        expected: Vec<usize>,
        /// The shape it got.
        found: Vec<usize>,
    },
    /// An argument's value is out of range.
    #[error("{name}: expected {expected}, found {found}")]
    InvalidInput {
        /// Which argument.
        name: &'static str,
        /// What is allowed.
        expected: String,
        /// What was given.
        found: String,
    },
    /// The backend's kernels do not take this input (dtype, head width ...).
    #[error("unsupported by this backend's kernels: {0}")]
    Unsupported(String),
    /// The device driver refused a call (out of page-locked host memory, a failed copy ...).
    #[error("device driver: {0}")]
    Driver(String),
}

impl KernelError {
    /// An [`KernelError::InvalidInput`].
    pub fn invalid(name: &'static str, expected: impl Display, found: impl Display) -> Self {
        Self::InvalidInput {
            name,
            expected: expected.to_string(),
            found: found.to_string(),
        }
    }
}

/// Result of the kernel ops.
pub type Result<T> = std::result::Result<T, KernelError>;
