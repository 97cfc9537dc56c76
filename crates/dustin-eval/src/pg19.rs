//! PG-19 books: Project Gutenberg plain texts with the Gutenberg header and footer removed.
//!
//! PG-19 (Rae et al., 2019, "Compressive Transformers for Long-Range Sequence Modelling") is a
//! set of Project Gutenberg books published before 1919. The copies in the shared data folder are
//! the Gutenberg texts as kept in the GITenberg repositories: they still carry the licence header
//! and footer and use CRLF line ends. [`strip_gutenberg`] keeps only the book:
//!
//! * the text strictly between the start marker line (`*** START OF THIS PROJECT GUTENBERG
//!   EBOOK ...`, `*** START OF THE PROJECT GUTENBERG EBOOK ...`, `***START OF ...`; any number of
//!   `*`, any case, the line must mention Gutenberg) and the first footer line after it: either
//!   the end marker (`*** END OF THIS PROJECT GUTENBERG EBOOK ...`, `***END OF THE ...`) or the
//!   sentence that older texts put just before it (`End of the Project Gutenberg EBook of ...`,
//!   `End of Project Gutenberg's ...`, `End of this Project Gutenberg Etext ...`);
//! * very old texts without a `START OF` line end their header with
//!   `*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*...`; that line is taken as the start marker
//!   only when no `START OF` line exists;
//! * CRLF becomes LF, leading and trailing blank lines are dropped, and the text has no final
//!   newline. Transcriber credits inside the markers (`Produced by ...`) are kept: they are part of
//!   the Gutenberg text between the markers.
//!
//! A text without markers is kept whole (after the same normalisation); [`Markers`] says which
//! markers were found, so callers can warn or refuse.

use std::fs;
use std::path::{Path, PathBuf};

use crate::EvalError;

/// Which Gutenberg boundary lines were found in a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Markers {
    /// A start marker line (end of the licence header) was found.
    pub start: bool,
    /// An end marker or footer line was found after the start.
    pub end: bool,
}

impl Markers {
    /// Both the header and the footer were found and removed.
    pub fn complete(&self) -> bool {
        self.start && self.end
    }
}

/// The result of [`strip_gutenberg`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stripped {
    /// The book text, LF line ends, no leading/trailing blank lines, no final newline.
    pub text: String,
    /// Which markers were found; with none, `text` is the whole input.
    pub markers: Markers,
}

/// One loaded book.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Book {
    /// The file stem, which in PG-19 is the Gutenberg book number (e.g. `"2544"`).
    pub id: String,
    /// Where it was read from.
    pub path: PathBuf,
    /// The book text (see [`strip_gutenberg`]).
    pub text: String,
    /// Which Gutenberg markers were found.
    pub markers: Markers,
    /// The file was not valid UTF-8 and was decoded as ISO-8859-1 (Latin-1) instead.
    pub latin1: bool,
}

fn is_start_marker(line: &str) -> bool {
    let t = line.trim();
    if !t.starts_with('*') {
        return false;
    }
    let rest = t.trim_start_matches('*').trim_start().to_ascii_uppercase();
    rest.starts_with("START OF") && rest.contains("GUTENBERG")
}

fn is_small_print_end(line: &str) -> bool {
    line.trim()
        .to_ascii_uppercase()
        .starts_with("*END*THE SMALL PRINT")
}

fn is_end_marker(line: &str) -> bool {
    let t = line.trim();
    if t.starts_with('*') {
        let rest = t.trim_start_matches('*').trim_start().to_ascii_uppercase();
        return rest.starts_with("END OF") && rest.contains("GUTENBERG");
    }
    let lower = t.to_ascii_lowercase();
    [
        "end of the project gutenberg",
        "end of project gutenberg",
        "end of this project gutenberg",
    ]
    .iter()
    .any(|p| lower.starts_with(p))
}

/// Removes the Project Gutenberg header and footer of a raw text (see the module docs).
pub fn strip_gutenberg(raw: &str) -> Stripped {
    let raw = raw.strip_prefix('\u{feff}').unwrap_or(raw);
    let normalised = raw.replace("\r\n", "\n");
    let lines: Vec<&str> = normalised.split('\n').collect();

    let start = lines
        .iter()
        .position(|l| is_start_marker(l))
        .or_else(|| lines.iter().position(|l| is_small_print_end(l)));
    let body_from = start.map_or(0, |s| s + 1);
    let end = lines[body_from..]
        .iter()
        .position(|l| is_end_marker(l))
        .map(|e| e + body_from);
    let body_to = end.unwrap_or(lines.len());

    let body = &lines[body_from..body_to];
    let blank = |l: &&str| l.trim().is_empty();
    let first = body.iter().position(|l| !blank(l));
    let text = match first {
        None => String::new(),
        Some(first) => {
            let last = body.iter().rposition(|l| !blank(l)).unwrap_or(first);
            body[first..=last].join("\n")
        }
    };
    Stripped {
        text,
        markers: Markers {
            start: start.is_some(),
            end: end.is_some(),
        },
    }
}

/// Loads one book file and strips its Gutenberg header and footer.
///
/// Invalid UTF-8 is decoded as ISO-8859-1 (many Gutenberg texts are Latin-1) and flagged in
/// [`Book::latin1`].
pub fn load_book(path: impl AsRef<Path>) -> Result<Book, EvalError> {
    let path = path.as_ref();
    let bytes = fs::read(path).map_err(|e| EvalError::io(path, e))?;
    let (raw, latin1) = match String::from_utf8(bytes) {
        Ok(s) => (s, false),
        Err(e) => (e.into_bytes().iter().map(|&b| b as char).collect(), true),
    };
    let Stripped { text, markers } = strip_gutenberg(&raw);
    let id = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(Book {
        id,
        path: path.to_path_buf(),
        text,
        markers,
        latin1,
    })
}

/// Loads every `*.txt` file of a directory (not recursively), sorted by file name.
pub fn load_dir(dir: impl AsRef<Path>) -> Result<Vec<Book>, EvalError> {
    let dir = dir.as_ref();
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| EvalError::io(dir, e))? {
        let entry = entry.map_err(|e| EvalError::io(dir, e))?;
        let path = entry.path();
        if path.extension().is_some_and(|x| x == "txt") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    paths.iter().map(load_book).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_this_project_markers_and_footer_sentence() {
        let raw = "The Project Gutenberg EBook of X\r\n\r\nTitle: X\r\n\
                   *** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n\r\n\r\n\
                   First line.\r\n\r\nSecond paragraph, the end of it.\r\n\r\n\r\n\
                   End of the Project Gutenberg EBook of X, by Y\r\n\r\n\
                   *** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nlicence\r\n";
        let s = strip_gutenberg(raw);
        assert_eq!(s.text, "First line.\n\nSecond paragraph, the end of it.");
        assert!(s.markers.complete());
    }

    #[test]
    fn strips_tight_the_project_markers() {
        let raw = "header\n***START OF THE PROJECT GUTENBERG EBOOK THE S. W. F. CLUB***\n\n  \
                   Indented start\nend of the story\n\n***END OF THE PROJECT GUTENBERG EBOOK THE S. W. F. CLUB***\n";
        let s = strip_gutenberg(raw);
        assert_eq!(s.text, "  Indented start\nend of the story");
        assert!(s.markers.complete());
    }

    #[test]
    fn footer_sentence_variants() {
        for footer in [
            "End of Project Gutenberg's Impressions, by George Eliot",
            "End of this Project Gutenberg Etext of Z",
            "END OF THE PROJECT GUTENBERG EBOOK Z",
            "*** END OF THE PROJECT GUTENBERG EBOOK Z ***",
        ] {
            let raw = format!(
                "h\n*** START OF THE PROJECT GUTENBERG EBOOK Z ***\nbody\n{footer}\nlicence"
            );
            let s = strip_gutenberg(&raw);
            assert_eq!(s.text, "body", "footer {footer:?}");
            assert!(s.markers.complete());
        }
    }

    #[test]
    fn book_lines_mentioning_end_or_start_are_kept() {
        let raw = "*** START OF THIS PROJECT GUTENBERG EBOOK Z ***\n\
                   *** END OF PART ONE ***\nthe end of our happiness\nEnd of chapter\n\
                   *** END OF THIS PROJECT GUTENBERG EBOOK Z ***";
        let s = strip_gutenberg(raw);
        assert_eq!(
            s.text,
            "*** END OF PART ONE ***\nthe end of our happiness\nEnd of chapter"
        );
    }

    #[test]
    fn no_markers_keeps_everything_and_says_so() {
        let s = strip_gutenberg("\r\n\r\nJust a text.\r\nTwo lines.\r\n\r\n");
        assert_eq!(s.text, "Just a text.\nTwo lines.");
        assert_eq!(
            s.markers,
            Markers {
                start: false,
                end: false
            }
        );
        assert!(!s.markers.complete());
    }

    #[test]
    fn start_without_end_keeps_rest() {
        let s = strip_gutenberg("h\n*** START OF THE PROJECT GUTENBERG EBOOK Z ***\nbody\n");
        assert_eq!(s.text, "body");
        assert!(s.markers.start && !s.markers.end);
    }

    #[test]
    fn small_print_header_is_a_fallback_start() {
        let raw =
            "legal\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\nBook\n";
        let s = strip_gutenberg(raw);
        assert_eq!(s.text, "Book");
        assert!(s.markers.start && !s.markers.end);
    }

    #[test]
    fn empty_input() {
        let s = strip_gutenberg("");
        assert_eq!(s.text, "");
        assert!(!s.markers.start);
    }
}
