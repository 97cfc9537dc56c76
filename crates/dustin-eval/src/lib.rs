//! dustin-eval: evaluation data and scoring for dustin, free of any tensor library.
//!
//! * [`pg19`]: PG-19 books (Project Gutenberg texts) with the Gutenberg header and footer removed.
//! * [`longbench`]: LongBench samples from the shared MiniLongBench files or the original
//!   LongBench JSONL layout, with LongBench's prompt templates and generation limits.
//! * [`metrics`]: LongBench's metrics (THUDM/LongBench `metrics.py`, `eval.py`), reproduced
//!   with Python's tokenisation and the `rouge` / `fuzzywuzzy` packages' exact behaviour.
//! * [`report`]: result tables, SVG line plots and a resumable JSONL results store.
//!
//! Other crates feed it plain strings and numbers.

#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
pub mod longbench;
pub mod metrics;
pub mod pg19;
mod pyunicode;
pub mod report;

pub use error::EvalError;
