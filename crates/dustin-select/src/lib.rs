#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod attn;
mod config;
mod cost;
mod error;
pub mod estimators;
mod pyramid;
pub mod registry;
mod selector;
mod topk;

pub use config::{KeepRule, SelectConfig};
pub use cost::EstimationCost;
pub use error::SelectError;
pub use pyramid::{pyramid_budgets, Pyramid, PyramidConfig};
pub use registry::{build, build_with, names};
pub use selector::{BudgetedPolicy, Selector, ACCEPT_DROP_SIGMAS, STACK_BYTES};
pub use topk::{extend_selection, extend_selection_grouped, select_top_k, SELECTION_MULTIPLE};
