//! dustin-cli
