//! A resumable results store: a JSONL file that a run appends one finished record to at a
//! time, so that a restarted run can skip what is already done.
//!
//! Each line is `{"key": "<key>", "value": <any JSON>}`. Every [`ResultStore::append`] writes one
//! whole line, flushes it and asks the OS to sync it, so a crash loses at most the record being
//! written. On [`ResultStore::open`]:
//!
//! * an unterminated last line that is not valid JSON (an interrupted write) is skipped with a
//!   warning and cut off the file, so the next append starts on a clean line;
//! * an unterminated last line that *is* valid is kept, and a newline is added before the next
//!   record;
//! * other unreadable lines (which an interrupted write cannot produce) are skipped with a
//!   warning and left in place; their keys count as not done.
//!
//! Warnings are printed to standard error and kept in [`ResultStore::warnings`]. A key appended
//! twice keeps its last value. One writer per file is assumed.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::{Deserialize, Serialize};

use crate::EvalError;

#[derive(Serialize)]
struct LineOut<'a, T: ?Sized> {
    key: &'a str,
    value: &'a T,
}

#[derive(Deserialize)]
struct LineIn<T> {
    key: String,
    value: T,
}

/// The outcome of scanning a store file.
struct Scan<T> {
    records: Vec<(String, T)>,
    warnings: Vec<String>,
    /// Byte length of the file without a corrupt unterminated tail.
    keep_len: usize,
    /// The kept content does not end with a newline.
    needs_newline: bool,
}

fn scan<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> Scan<T> {
    let mut records = Vec::new();
    let mut warnings = Vec::new();
    let mut keep_len = bytes.len();
    let mut needs_newline = false;
    let mut offset = 0;
    let mut lineno = 0;
    while offset < bytes.len() {
        lineno += 1;
        let (line, terminated) = match bytes[offset..].iter().position(|&b| b == b'\n') {
            Some(n) => (&bytes[offset..offset + n], true),
            None => (&bytes[offset..], false),
        };
        let start = offset;
        offset += line.len() + usize::from(terminated);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<LineIn<T>>(line) {
            Ok(rec) => {
                records.push((rec.key, rec.value));
                if !terminated {
                    needs_newline = true;
                }
            }
            Err(e) if !terminated => {
                warnings.push(format!(
                    "{}:{lineno}: skipping an incomplete last line ({} bytes; interrupted write?): {e}",
                    path.display(),
                    line.len()
                ));
                keep_len = start;
            }
            Err(e) => warnings.push(format!(
                "{}:{lineno}: skipping an unreadable line: {e}",
                path.display()
            )),
        }
    }
    Scan {
        records,
        warnings,
        keep_len,
        needs_newline,
    }
}

/// Keeps the last value of each key, in order of first appearance.
fn dedup_last<T>(records: Vec<(String, T)>) -> Vec<(String, T)> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<(String, T)> = Vec::new();
    for (k, v) in records {
        match index.get(&k) {
            Some(&i) => out[i].1 = v,
            None => {
                index.insert(k.clone(), out.len());
                out.push((k, v));
            }
        }
    }
    out
}

/// An append-only JSONL store of finished records (see the module docs).
///
/// ```no_run
/// use dustin_eval::report::ResultStore;
/// let mut store = ResultStore::open("out/qasper.jsonl").unwrap();
/// for id in ["0", "1", "2"] {
///     if store.is_done(id) {
///         continue;
///     }
///     let score = 0.5; // ... run the sample ...
///     store.append(id, &score).unwrap();
/// }
/// ```
#[derive(Debug)]
pub struct ResultStore {
    path: PathBuf,
    file: File,
    done: BTreeSet<String>,
    warnings: Vec<String>,
    needs_newline: bool,
}

impl ResultStore {
    /// Opens (creating it, and its parent directories, if needed) a store file and reads which
    /// keys are done.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, EvalError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent).map_err(|e| EvalError::io(parent, e))?;
        }
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(EvalError::io(&path, e)),
        };
        let scan = scan::<IgnoredAny>(&path, &bytes);
        for w in &scan.warnings {
            eprintln!("warning: {w}");
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| EvalError::io(&path, e))?;
        if scan.keep_len < bytes.len() {
            file.set_len(scan.keep_len as u64)
                .map_err(|e| EvalError::io(&path, e))?;
        }
        Ok(ResultStore {
            done: scan.records.into_iter().map(|(k, _)| k).collect(),
            warnings: scan.warnings,
            needs_newline: scan.needs_newline,
            path,
            file,
        })
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a record with this key is in the store.
    pub fn is_done(&self, key: &str) -> bool {
        self.done.contains(key)
    }

    /// All keys in the store.
    pub fn done_keys(&self) -> &BTreeSet<String> {
        &self.done
    }

    /// Number of distinct keys in the store.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    /// Whether the store holds no record.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }

    /// The warnings of [`ResultStore::open`] (skipped lines).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Appends one record as a single line, flushed and synced before returning.
    pub fn append<T: Serialize + ?Sized>(&mut self, key: &str, value: &T) -> Result<(), EvalError> {
        let mut line =
            serde_json::to_string(&LineOut { key, value }).map_err(|e| EvalError::Json {
                path: self.path.clone(),
                line: None,
                source: e,
            })?;
        line.push('\n');
        if self.needs_newline {
            line.insert(0, '\n');
        }
        let io = |e| EvalError::io(&self.path, e);
        self.file.write_all(line.as_bytes()).map_err(io)?;
        self.file.flush().map_err(io)?;
        self.file.sync_data().map_err(io)?;
        self.needs_newline = false;
        self.done.insert(key.to_string());
        Ok(())
    }

    /// Reads every record of a store file (last value per key, in order of first appearance),
    /// with the same tolerance as [`ResultStore::open`]; returns the records and the warnings.
    /// The file is not modified. A missing file has no records.
    #[allow(clippy::type_complexity)]
    pub fn read<T: DeserializeOwned>(
        path: impl AsRef<Path>,
    ) -> Result<(Vec<(String, T)>, Vec<String>), EvalError> {
        let path = path.as_ref();
        let bytes = match fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(EvalError::io(path, e)),
        };
        let scan = scan::<T>(path, &bytes);
        Ok((dedup_last(scan.records), scan.warnings))
    }

    /// [`ResultStore::read`] on this store's file.
    #[allow(clippy::type_complexity)]
    pub fn records<T: DeserializeOwned>(
        &self,
    ) -> Result<(Vec<(String, T)>, Vec<String>), EvalError> {
        Self::read(&self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("dustin-eval-store-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir.join("results.jsonl")
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Rec {
        score: f64,
        tokens: usize,
    }

    #[test]
    fn resume_reports_done_keys() {
        let p = tmp("resume");
        {
            let mut s = ResultStore::open(&p).unwrap();
            assert!(s.is_empty());
            s.append(
                "a",
                &Rec {
                    score: 0.5,
                    tokens: 3,
                },
            )
            .unwrap();
            s.append(
                "b",
                &Rec {
                    score: 1.0,
                    tokens: 4,
                },
            )
            .unwrap();
        }
        let mut s = ResultStore::open(&p).unwrap();
        assert!(s.is_done("a") && s.is_done("b") && !s.is_done("c"));
        assert!(s.warnings().is_empty());
        s.append(
            "c",
            &Rec {
                score: 0.0,
                tokens: 1,
            },
        )
        .unwrap();
        s.append(
            "a",
            &Rec {
                score: 0.25,
                tokens: 3,
            },
        )
        .unwrap();
        assert_eq!(s.len(), 3);
        let (recs, warns) = s.records::<Rec>().unwrap();
        assert!(warns.is_empty());
        let keys: Vec<&str> = recs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(
            recs[0].1,
            Rec {
                score: 0.25,
                tokens: 3
            }
        );
    }

    #[test]
    fn interrupted_last_line_is_skipped_and_cut() {
        let p = tmp("torn");
        fs::write(
            &p,
            "{\"key\":\"a\",\"value\":1}\n{\"key\":\"b\",\"value\":2}\n{\"key\":\"c\",\"val",
        )
        .unwrap();
        let mut s = ResultStore::open(&p).unwrap();
        assert_eq!(s.done_keys().iter().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(s.warnings().len(), 1);
        assert!(s.warnings()[0].contains(":3:"), "{}", s.warnings()[0]);
        s.append("c", &3).unwrap();
        let text = fs::read_to_string(&p).unwrap();
        assert_eq!(
            text,
            "{\"key\":\"a\",\"value\":1}\n{\"key\":\"b\",\"value\":2}\n{\"key\":\"c\",\"value\":3}\n"
        );
        let s = ResultStore::open(&p).unwrap();
        assert!(s.warnings().is_empty());
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn valid_unterminated_last_line_is_kept() {
        let p = tmp("unterminated");
        fs::write(&p, "{\"key\":\"a\",\"value\":1}").unwrap();
        let mut s = ResultStore::open(&p).unwrap();
        assert!(s.is_done("a") && s.warnings().is_empty());
        s.append("b", &2).unwrap();
        let (recs, _) = ResultStore::read::<i32>(&p).unwrap();
        assert_eq!(recs, [("a".to_string(), 1), ("b".to_string(), 2)]);
    }

    #[test]
    fn garbage_and_bad_lines_never_panic() {
        let p = tmp("garbage");
        fs::write(
            &p,
            b"\xff\xfe\n\n{\"nokey\":1}\n[1,2]\n{\"key\":\"x\",\"value\":null}\n\xff",
        )
        .unwrap();
        let s = ResultStore::open(&p).unwrap();
        assert_eq!(s.done_keys().iter().collect::<Vec<_>>(), ["x"]);
        // Three unreadable complete lines and one torn tail.
        assert_eq!(s.warnings().len(), 4);
        assert!(fs::read(&p).unwrap().ends_with(b"null}\n"));
    }

    #[test]
    fn missing_file_reads_empty() {
        let p = tmp("missing").with_file_name("nope.jsonl");
        let (recs, warns) = ResultStore::read::<i32>(&p).unwrap();
        assert!(recs.is_empty() && warns.is_empty());
    }
}
