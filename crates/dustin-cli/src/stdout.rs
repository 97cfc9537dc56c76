//! Writes to standard output that never panic: `println!` panics when the reader has gone
//! (`dustin demo | head`), which would end a command whose results are also written to files,
//! or whose later work (the `--output` file of `generate`) does not need the reader.

use std::io::Write;

/// Writes `text` and a newline to standard output, ignoring a failed write: a closed pipe
/// (`dustin generate ... | head`, or a reader stopped by the same Ctrl-C) must not stop the
/// run before `--output` is written.
pub(crate) fn line(text: &str) {
    let _ = writeln!(std::io::stdout(), "{text}");
}

/// Writes `text` to standard output and flushes it (streamed tokens), ignoring a failed write.
pub(crate) fn text(text: &str) {
    let mut out = std::io::stdout();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}
