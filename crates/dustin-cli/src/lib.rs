//! dustin-cli: the library of the `dustin` command (the demo, generation, perplexity,
//! evaluations, the HTTP server and model fetching; `dustin --help` lists them) and the pieces the lab
//! instruments of `dustin-bench` share with it: the backend choice ([`backend`],
//! [`with_backend!`]), model names and the model cache ([`models`], [`fetch`]), the
//! generation options ([`generate`]: selection policies, `--config` files, draft budgets, the
//! KV memory check), byte counts at a config's shapes ([`footprint`]), the host profile
//! ([`host_profile`]), the command-line errors ([`CliError`]) and the exit status they end in
//! ([`exit_code`]).
//!
//! Backends: the CPU (`burn-flex`, f32) always; CUDA (`burn-cuda`, bf16 or f32) when built
//! with `--features cuda`.

#![warn(missing_docs)]

use std::process::ExitCode;

pub mod backend;
pub mod chat;
pub mod demo;
pub mod eval;
pub mod fetch;
pub mod footprint;
pub mod generate;
pub mod host_profile;
pub mod models;
pub mod pair;
pub mod ppl;
pub mod serve;
mod stdout;

/// The exit status of a command's result: success; 130 after a cancellation (Ctrl-C), its
/// message on stderr; else failure, with `error: ` and the message on stderr followed by
/// each cause whose text the message does not already carry.
pub fn exit_code(res: Result<(), CliError>) -> ExitCode {
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ CliError::Cancelled { .. }) => {
            eprintln!("{e}");
            ExitCode::from(130)
        }
        Err(e) => {
            let msg = e.to_string();
            eprintln!("error: {msg}");
            // causes whose text the message already carries (an I/O error after its path)
            // are not repeated
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                let cause = s.to_string();
                if !msg.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                }
                src = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// Checks `--gamma`: 1 ..= [`dustin_spec::MAX_GAMMA`] draft tokens per iteration.
///
/// # Errors
/// [`CliError::Usage`] naming the value and the range.
pub fn check_gamma(gamma: usize) -> Result<(), CliError> {
    Ok(dustin_eval::harness::check_gamma(gamma)?)
}

/// Creates the output folder `--out` (and its parents) and checks that a file can be
/// written in it, so that a bad folder is named before any work is done.
///
/// # Errors
/// [`CliError::Usage`] when `out` is a file; [`CliError::Io`] naming `--out` when the
/// folder cannot be created or written.
pub fn create_out_dir(out: &std::path::Path) -> Result<(), CliError> {
    Ok(dustin_eval::harness::create_out_dir(out)?)
}

/// Whether `a` and `b` name one existing file: the same canonical path, or (on Unix) the
/// same device and inode, which also catches a hard link.
pub fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    if let (Ok(x), Ok(y)) = (a.canonicalize(), b.canonicalize()) {
        if x == y {
            return true;
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return (x.dev(), x.ino()) == (y.dev(), y.ino());
        }
    }
    false
}

/// Errors of the command line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A bad argument.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Model loading or running failed.
    #[error(transparent)]
    Model(#[from] dustin_qwen::QwenError),
    /// The engine failed.
    #[error(transparent)]
    Spec(#[from] dustin_spec::SpecError),
    /// A core error.
    #[error(transparent)]
    Core(#[from] dustin_core::CoreError),
    /// Fetching a model failed (boxed: it carries the instructions for placing the file by
    /// hand).
    #[error(transparent)]
    Fetch(Box<fetch::FetchError>),
    /// Generation was cancelled (Ctrl-C); finished and partial texts were printed and
    /// written to `--output` where given.
    #[error(
        "cancelled: {cancelled} of {total} sequences were unfinished (what every sequence had \
         generated was printed, and written to --output where given)"
    )]
    Cancelled {
        /// Sequences cut short.
        cancelled: usize,
        /// Sequences in the batch.
        total: usize,
    },
}

impl From<dustin_eval::harness::HarnessError> for CliError {
    /// The harness's errors as the command's own: the same variant where there is one, the
    /// command's error back where the harness passed one through (model loading by name).
    fn from(e: dustin_eval::harness::HarnessError) -> Self {
        use dustin_eval::harness::HarnessError as H;
        match e {
            H::Usage(m) => CliError::Usage(m),
            H::Io { path, source } => CliError::Io { path, source },
            H::Model(e) => CliError::Model(e),
            H::Spec(e) => CliError::Spec(e),
            H::Core(e) => CliError::Core(e),
            H::Host(e) => match e.downcast::<CliError>() {
                Ok(e) => *e,
                Err(e) => CliError::Usage(e.to_string()),
            },
        }
    }
}

impl From<CliError> for dustin_eval::harness::HarnessError {
    /// A command-line error passed through the harness (see the reverse conversion).
    fn from(e: CliError) -> Self {
        dustin_eval::harness::HarnessError::Host(Box::new(e))
    }
}
