//! The evaluation harness: the engine of `dustin-spec` run over evaluation data, one
//! selection policy per selector and budget, against dense verification.
//!
//! - [`fidelity`]: teacher-forced verification windows of PG-19 books through each
//!   selector, compared with dense verification (top-1 agreement, KL, perplexity, KV read),
//!   and a short speculative run for the acceptance length;
//! - [`pg19`]: the fidelity rows' perplexity against dense perplexity;
//! - [`longbench`]: LongBench tasks answered by greedy speculative decoding, scored with
//!   LongBench's metrics;
//! - [`acceptance`]: acceptance length and speed of a draft/target pair per gamma,
//!   temperature, selector and budget, beside autoregressive decoding ([`pair`] runs the
//!   modes from one shared prefill, as `dustin demo` does).
//!
//! Every run drives [`dustin_spec::ModelDrafter`] and [`dustin_spec::ModelVerifier`], started
//! from a prefill shared by all selectors (`with_prefilled`; the teacher-forced lookaheads
//! come from `force_window`, the raw read counts from `last_reads`). Results go to a
//! resumable [`ResultStore`]; tables and plots are written from
//! every finished row.
//!
//! Loading models by name is the caller's: it implements [`ModelHost`]. Each run is generic
//! over the backend `B` and takes its device.

use std::path::Path;

use indicatif::{ProgressBar, ProgressStyle};

use crate::report::ResultStore;

pub mod acceptance;
mod engine;
mod error;
pub mod fidelity;
mod host;
pub mod longbench;
pub mod pair;
pub mod pg19;
mod selectors;

pub use error::HarnessError;
pub use host::{EvalDraft, ModelFlags, ModelHost, PairSource};
pub use selectors::SelectorFlags;

/// Checks a gamma (`--gamma`): 1 ..= [`dustin_spec::MAX_GAMMA`] draft tokens per iteration.
///
/// # Errors
/// [`HarnessError::Usage`] naming the value and the range.
pub fn check_gamma(gamma: usize) -> Result<(), HarnessError> {
    if gamma == 0 || gamma > dustin_spec::MAX_GAMMA {
        return Err(HarnessError::Usage(format!(
            "--gamma {gamma}: expected 1 ..= {}",
            dustin_spec::MAX_GAMMA
        )));
    }
    Ok(())
}

/// Creates the output folder `out` (`--out`, and its parents) and checks that a file can be
/// written in it, so that a bad folder is named before any work is done.
///
/// # Errors
/// [`HarnessError::Usage`] when `out` is a file; [`HarnessError::Io`] naming `--out` when the
/// folder cannot be created or written.
pub fn create_out_dir(out: &Path) -> Result<(), HarnessError> {
    if out.exists() && !out.is_dir() {
        return Err(HarnessError::Usage(format!(
            "--out {}: a file, expected a folder (created when missing)",
            out.display()
        )));
    }
    let io = |source| HarnessError::Io {
        path: format!("--out {}", out.display()),
        source,
    };
    std::fs::create_dir_all(out).map_err(io)?;
    let probe = out.join(format!(".dustin-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(io)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The results store (`results.jsonl`) of the output folder `out`, which is created and
/// checked first ([`create_out_dir`]).
fn open_store(out: &Path) -> Result<ResultStore, HarnessError> {
    create_out_dir(out)?;
    ResultStore::open(out.join("results.jsonl")).map_err(|e| HarnessError::Usage(e.to_string()))
}

/// A progress bar over `len` items called `unit` (`rows`, `runs`), with the time elapsed and
/// the estimate of the time left.
fn progress(len: usize, unit: &str) -> Result<ProgressBar, HarnessError> {
    let style = ProgressStyle::with_template(&format!(
        "{{elapsed_precise}} [{{bar:30}}] {{pos}}/{{len}} {unit} (eta {{eta}}) {{msg}}"
    ))
    .map_err(|e| HarnessError::Usage(e.to_string()))?
    .progress_chars("=> ");
    let bar = ProgressBar::new(len as u64);
    bar.set_style(style);
    Ok(bar)
}

/// A log line above the progress bar, or on standard error when the bar is hidden (not a
/// terminal).
fn say(bar: &ProgressBar, msg: String) {
    if bar.is_hidden() {
        eprintln!("{msg}");
    } else {
        bar.println(msg);
    }
}

/// Writes `text` and a newline to standard output, ignoring a failed write: the reports are
/// written to files first, so a closed pipe (`dustin eval ... | head`) loses nothing and must
/// not end the command in a panic.
pub(crate) fn print_line(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{text}");
}
