//! The estimators: one file each, each only scores (the shared top-k step in
//! [`crate::select_top_k`] turns scores into a selection).
//!
//! | name | module | kind |
//! |---|---|---|
//! | `dense` | [`dense`] | no selection |
//! | `streaming` | [`streaming`] | static: sinks + recent (StreamingLLM) |
//! | `h2o` | [`h2o`] | static: accumulated prefill attention (H2O) |
//! | `snapkv` | [`snapkv`] | static: pooled observation-window votes (SnapKV) |
//! | `quest` | [`quest`] | dynamic: page key bounds (Quest) |
//! | `oracle` | [`oracle`] | dynamic: exact attention, all heads (ceiling) |
//! | `draft-only` | [`draft_only`] | draft lookahead alone (ablation) |
//! | `history-only` | [`history_only`] | target history alone (ablation) |
//! | `dustin` | [`dustin`] | lookahead + history on a head subset (the method) |

pub mod dense;
pub mod draft_only;
pub mod dustin;
pub mod h2o;
pub mod history_only;
pub mod oracle;
mod prompt;
pub mod quest;
pub mod snapkv;
pub mod streaming;

pub use dense::Dense;
pub use draft_only::DraftOnly;
pub use dustin::{Dustin, DustinConfig};
pub use h2o::H2o;
pub use history_only::HistoryOnly;
pub use oracle::Oracle;
pub use quest::{Quest, QuestConfig};
pub use snapkv::{SnapKv, SnapKvConfig};
pub use streaming::Streaming;
