//! Reporting: result tables (Markdown and JSON), SVG line plots, and a resumable JSONL store of
//! finished records, and the confidence intervals of the tables.

pub mod interval;
mod plot;
mod store;
mod table;

pub use interval::{
    bootstrap_mean, bootstrap_ratio, bootstrap_ratio_of_means, wilson, Interval, IntervalError,
};
pub use plot::plot_lines;
pub use store::ResultStore;
pub use table::{Cell, Table};
