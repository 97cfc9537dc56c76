//! `cargo test -p dustin-select`: one test binary (one link) for all the crate's tests.

mod common;
mod estimators;
mod matrix;
mod padded_view;
mod quest;
mod registry;
mod topk;
