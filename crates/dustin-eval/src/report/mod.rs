//! Reporting: result tables (Markdown and JSON), SVG line plots, and a resumable JSONL store of
//! finished records.

mod plot;
mod store;
mod table;

pub use plot::plot_lines;
pub use store::ResultStore;
pub use table::{Cell, Table};
