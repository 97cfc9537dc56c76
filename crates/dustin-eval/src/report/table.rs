//! A plain results table: named columns, rows of number or text cells, rendered as Markdown or
//! serialised as JSON.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::EvalError;

/// One table cell.
///
/// In JSON a cell is a bare number, a bare string, or `null` ([`Cell::Empty`]). Non-finite
/// numbers have no JSON form: serde_json writes them as `null`, so they read back as
/// [`Cell::Empty`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Cell {
    /// A number, printed with the table's precision.
    Num(f64),
    /// Text, printed as is (Markdown-escaped).
    Text(String),
    /// Nothing.
    Empty,
}

impl From<f64> for Cell {
    fn from(v: f64) -> Self {
        Cell::Num(v)
    }
}

impl From<f32> for Cell {
    fn from(v: f32) -> Self {
        Cell::Num(v as f64)
    }
}

impl From<usize> for Cell {
    fn from(v: usize) -> Self {
        Cell::Num(v as f64)
    }
}

impl From<i64> for Cell {
    fn from(v: i64) -> Self {
        Cell::Num(v as f64)
    }
}

impl From<&str> for Cell {
    fn from(v: &str) -> Self {
        Cell::Text(v.to_string())
    }
}

impl From<String> for Cell {
    fn from(v: String) -> Self {
        Cell::Text(v)
    }
}

impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(v: Option<T>) -> Self {
        v.map_or(Cell::Empty, Into::into)
    }
}

fn default_precision() -> usize {
    2
}

/// A table of named columns.
///
/// ```
/// use dustin_eval::report::Table;
/// let mut t = Table::new(["task", "score"]);
/// t.push_row(["qasper".into(), 41.5.into()]).unwrap();
/// assert!(t.to_markdown().contains("| qasper | 41.50 |"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table {
    /// An optional title, rendered as a Markdown heading line above the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Column names.
    pub columns: Vec<String>,
    /// Rows; each has exactly one cell per column.
    pub rows: Vec<Vec<Cell>>,
    /// Digits after the decimal point for numbers in Markdown (default 2).
    #[serde(default = "default_precision")]
    pub precision: usize,
}

impl Table {
    /// An empty table with these columns.
    pub fn new<I, S>(columns: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            title: None,
            columns: columns.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
            precision: default_precision(),
        }
    }

    /// Sets the title.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// Sets the number of digits after the decimal point in Markdown.
    pub fn with_precision(mut self, digits: usize) -> Self {
        self.precision = digits;
        self
    }

    /// Appends a row; it must have one cell per column.
    pub fn push_row<I>(&mut self, cells: I) -> Result<(), EvalError>
    where
        I: IntoIterator<Item = Cell>,
    {
        let row: Vec<Cell> = cells.into_iter().collect();
        if row.len() != self.columns.len() {
            return Err(EvalError::RowLength {
                expected: self.columns.len(),
                got: row.len(),
            });
        }
        self.rows.push(row);
        Ok(())
    }

    /// The cells of a column, by name.
    pub fn column(&self, name: &str) -> Option<impl Iterator<Item = &Cell>> {
        let i = self.columns.iter().position(|c| c == name)?;
        Some(self.rows.iter().filter_map(move |r| r.get(i)))
    }

    fn render_cell(&self, cell: &Cell) -> String {
        match cell {
            Cell::Num(v) if v.is_finite() => format!("{v:.prec$}", prec = self.precision),
            Cell::Num(v) => format!("{v}"),
            Cell::Text(s) => escape_md(s),
            Cell::Empty => String::new(),
        }
    }

    /// GitHub-flavoured Markdown; columns holding only numbers (or empty cells) are
    /// right-aligned, and cells are padded so the source lines up.
    pub fn to_markdown(&self) -> String {
        let ncol = self.columns.len();
        let header: Vec<String> = self.columns.iter().map(|c| escape_md(c)).collect();
        let body: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(|c| self.render_cell(c)).collect())
            .collect();
        let numeric: Vec<bool> = (0..ncol)
            .map(|i| {
                self.rows.iter().any(|r| matches!(r[i], Cell::Num(_)))
                    && self
                        .rows
                        .iter()
                        .all(|r| matches!(r[i], Cell::Num(_) | Cell::Empty))
            })
            .collect();
        let width: Vec<usize> = (0..ncol)
            .map(|i| {
                body.iter()
                    .map(|r| r[i].chars().count())
                    .chain([header[i].chars().count(), 3])
                    .max()
                    .unwrap_or(3)
            })
            .collect();
        let pad = |s: &str, i: usize| {
            let fill = width[i].saturating_sub(s.chars().count());
            if numeric[i] {
                format!("{}{s}", " ".repeat(fill))
            } else {
                format!("{s}{}", " ".repeat(fill))
            }
        };
        let mut out = String::new();
        if let Some(t) = &self.title {
            let _ = writeln!(out, "**{}**\n", escape_md(t));
        }
        let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
        out.push_str(&line((0..ncol).map(|i| pad(&header[i], i)).collect()));
        out.push_str(&line(
            (0..ncol)
                .map(|i| {
                    if numeric[i] {
                        format!("{}:", "-".repeat(width[i] - 1))
                    } else {
                        "-".repeat(width[i])
                    }
                })
                .collect(),
        ));
        for r in &body {
            out.push_str(&line((0..ncol).map(|i| pad(&r[i], i)).collect()));
        }
        out
    }

    /// Pretty-printed JSON.
    pub fn to_json(&self) -> Result<String, EvalError> {
        serde_json::to_string_pretty(self).map_err(|e| EvalError::Json {
            path: "<table>".into(),
            line: None,
            source: e,
        })
    }

    /// Parses a table written by [`Table::to_json`].
    pub fn from_json(s: &str) -> Result<Self, EvalError> {
        serde_json::from_str(s).map_err(|e| EvalError::Json {
            path: "<table>".into(),
            line: None,
            source: e,
        })
    }

    /// Writes [`Table::to_markdown`] to a file.
    pub fn write_markdown(&self, path: impl AsRef<Path>) -> Result<(), EvalError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_markdown()).map_err(|e| EvalError::io(path, e))
    }

    /// Writes [`Table::to_json`] to a file.
    pub fn write_json(&self, path: impl AsRef<Path>) -> Result<(), EvalError> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json()? + "\n").map_err(|e| EvalError::io(path, e))
    }
}

/// Escapes what would break a Markdown table cell: `|`, backslash and line breaks.
fn escape_md(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '|' => out.push_str("\\|"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("<br>"),
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(["task", "dense", "sparse"]).with_title("LongBench");
        t.push_row(["qasper".into(), 41.234.into(), Cell::Empty])
            .unwrap();
        t.push_row(["a|b".into(), 7.0.into(), 6.5.into()]).unwrap();
        t
    }

    #[test]
    fn markdown_layout() {
        let md = sample().to_markdown();
        let expected = "**LongBench**\n\n\
                        | task   | dense | sparse |\n\
                        | ------ | ----: | -----: |\n\
                        | qasper | 41.23 |        |\n\
                        | a\\|b   |  7.00 |   6.50 |\n";
        assert_eq!(md, expected);
    }

    #[test]
    fn json_round_trip_and_shape() {
        let t = sample();
        let js = t.to_json().unwrap();
        let v: serde_json::Value = serde_json::from_str(&js).unwrap();
        assert_eq!(v["rows"][0], serde_json::json!(["qasper", 41.234, null]));
        assert_eq!(Table::from_json(&js).unwrap(), t);
    }

    #[test]
    fn row_length_is_checked() {
        let mut t = Table::new(["a", "b"]);
        assert!(matches!(
            t.push_row([Cell::from(1.0)]),
            Err(EvalError::RowLength {
                expected: 2,
                got: 1
            })
        ));
        assert_eq!(t.column("b").unwrap().count(), 0);
        assert!(t.column("zz").is_none());
    }

    #[test]
    fn non_finite_numbers() {
        let mut t = Table::new(["x"]);
        t.push_row([f64::NAN.into()]).unwrap();
        assert!(t.to_markdown().contains("| NaN |"));
        let back = Table::from_json(&t.to_json().unwrap()).unwrap();
        assert_eq!(back.rows[0][0], Cell::Empty);
    }
}
