#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod error;
pub mod harness;
pub mod longbench;
pub mod metrics;
pub mod pg19;
mod pyunicode;
pub mod report;

pub use error::EvalError;
