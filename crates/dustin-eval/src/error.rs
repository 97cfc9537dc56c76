//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading evaluation data, scoring, or writing reports.
///
/// Every variant that concerns a file names it; line numbers are 1-based.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvalError {
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A file (or one line of a JSONL file) is not valid JSON.
    #[error("{}{}: invalid JSON: {source}", path.display(), fmt_line(*line))]
    Json {
        /// The file.
        path: PathBuf,
        /// The 1-based line, for JSONL files.
        line: Option<usize>,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },

    /// A record lacks a field the loader needs.
    #[error("{}{}{}: missing field `{field}`", path.display(), fmt_line(*line), fmt_id(id.as_deref()))]
    MissingField {
        /// The file.
        path: PathBuf,
        /// The 1-based line, for JSONL files.
        line: Option<usize>,
        /// The sample id, where known.
        id: Option<String>,
        /// The field name.
        field: String,
    },

    /// A record has a field of the wrong shape, or a value that cannot be used.
    #[error("{}{}{}: field `{field}`: {message}", path.display(), fmt_line(*line), fmt_id(id.as_deref()))]
    BadField {
        /// The file.
        path: PathBuf,
        /// The 1-based line, for JSONL files.
        line: Option<usize>,
        /// The sample id, where known.
        id: Option<String>,
        /// The field name.
        field: String,
        /// What is wrong with it.
        message: String,
    },

    /// A Python literal (such as the `gold` list of a MiniLongBench file) could not be parsed.
    #[error("invalid Python literal at character {offset}: {message}")]
    PyLiteral {
        /// 0-based character offset of the problem in the literal.
        offset: usize,
        /// What was expected.
        message: String,
    },

    /// A LongBench task this crate has no metric, template or generation limit for.
    #[error("unknown LongBench task `{0}`")]
    UnknownTask(String),

    /// A prompt template is malformed (unbalanced braces or an unknown placeholder).
    #[error("prompt template of task `{task}`: {message}")]
    Template {
        /// The task.
        task: String,
        /// What is wrong.
        message: String,
    },

    /// A gold answer of `passage_retrieval_en` has no `Paragraph N` in it
    /// (LongBench's `retrieval_score` raises `IndexError` here).
    #[error("retrieval gold answer has no `Paragraph <number>`: {0:?}")]
    NoParagraphNumber(String),

    /// A table row does not have one cell per column.
    #[error("table row has {got} cells, the table has {expected} columns")]
    RowLength {
        /// Number of columns of the table.
        expected: usize,
        /// Number of cells in the row.
        got: usize,
    },

    /// Drawing a plot failed.
    #[error("plot {}: {message}", path.display())]
    Plot {
        /// The output file.
        path: PathBuf,
        /// The plotting library's message.
        message: String,
    },
}

fn fmt_line(line: Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

fn fmt_id(id: Option<&str>) -> String {
    id.map(|i| format!(" (sample {i:?})")).unwrap_or_default()
}

impl EvalError {
    /// Wraps an I/O error with the path it concerns.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        EvalError::Io {
            path: path.into(),
            source,
        }
    }
}
