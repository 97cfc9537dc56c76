//! LongBench samples (Bai et al., 2023, "LongBench: A Bilingual, Multitask Benchmark for Long
//! Context Understanding"; code and data layout: THUDM/LongBench on GitHub).
//!
//! Two layouts are read into the same [`Sample`]:
//!
//! * the MiniLongBench files of the shared data folder ([`load_shared_file`]): one JSON object
//!   per task, `{id: {origin_prompt, prediction, gold, time}}`, task name = file stem.
//!   `origin_prompt` is the fully rendered prompt. `gold` is accepted as a JSON list of strings
//!   (what the shared files actually hold), as a Python list literal inside a JSON string
//!   (e.g. `"['a', \"b's\"]"`, parsed by [`parse_py_str_list`]), or as an object
//!   `{"answers": ..., "all_classes": ...}` whose members take either form (the shared trec file).
//!   `prediction` is another system's output, kept as [`Sample::other_prediction`]; it is not
//!   ground truth.
//! * the original LongBench JSONL files ([`load_jsonl_file`]): one JSON object per line with
//!   `input`, `context`, `answers`, `length`, `all_classes`, `dataset`, `_id`. The prompt is
//!   rendered with LongBench's per-task template ([`prompt_template`]) when asked for.

mod pylit;
mod templates;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use pylit::{parse_py_str, parse_py_str_list};

use crate::EvalError;

/// The seven LongBench tasks of the shared data folder.
pub const SHARED_TASKS: [&str; 7] = [
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "gov_report",
    "passage_retrieval_en",
    "trec",
    "samsum",
];

/// Every task with a prompt template and generation limit here (LongBench's English tasks).
pub fn tasks() -> impl Iterator<Item = &'static str> {
    templates::TASKS.iter().map(|t| t.0)
}

/// LongBench's prompt template of a task (`dataset2prompt.json`), with `{context}` and `{input}`
/// placeholders.
pub fn prompt_template(task: &str) -> Option<&'static str> {
    templates::TASKS.iter().find(|t| t.0 == task).map(|t| t.1)
}

/// LongBench's generation limit of a task in new tokens (`dataset2maxlen.json`), e.g. 128 for
/// narrativeqa, 512 for gov_report.
pub fn max_new_tokens(task: &str) -> Option<usize> {
    templates::TASKS.iter().find(|t| t.0 == task).map(|t| t.2)
}

/// Renders a task's prompt from its context and input, as LongBench's `pred.py` does with
/// `prompt_format.format(**json_obj)`.
pub fn render_prompt(task: &str, context: &str, input: &str) -> Result<String, EvalError> {
    let template = prompt_template(task).ok_or_else(|| EvalError::UnknownTask(task.into()))?;
    format_template(task, template, context, input)
}

/// Python `str.format` restricted to the fields `{context}` and `{input}` (and the `{{`/`}}`
/// escapes). Substitution is single-pass: braces inside the context are not interpreted.
fn format_template(
    task: &str,
    template: &str,
    context: &str,
    input: &str,
) -> Result<String, EvalError> {
    let bad = |m: String| EvalError::Template {
        task: task.into(),
        message: m,
    };
    let mut out = String::with_capacity(template.len() + context.len() + input.len());
    let mut rest = template;
    while let Some(i) = rest.find(['{', '}']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(t) = tail.strip_prefix("{{") {
            out.push('{');
            rest = t;
        } else if let Some(t) = tail.strip_prefix("}}") {
            out.push('}');
            rest = t;
        } else if tail.starts_with('}') {
            return Err(bad("single `}` in template".into()));
        } else {
            let close = tail
                .find('}')
                .ok_or_else(|| bad("unclosed `{` in template".into()))?;
            match &tail[1..close] {
                "context" => out.push_str(context),
                "input" => out.push_str(input),
                other => return Err(bad(format!("unknown placeholder `{{{other}}}`"))),
            }
            rest = &tail[close + 1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Where a sample's prompt comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptSource {
    /// An already rendered prompt (MiniLongBench `origin_prompt`).
    Rendered(String),
    /// LongBench JSONL `context` and `input`, to be put into the task's template.
    Parts {
        /// The long document(s).
        context: String,
        /// The question or instruction.
        input: String,
    },
}

/// One LongBench sample, whichever layout it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// The sample id (MiniLongBench object key, LongBench `_id`).
    pub id: String,
    /// The task (MiniLongBench file stem, LongBench `dataset`).
    pub task: String,
    /// The prompt, rendered or in parts; see [`Sample::prompt`].
    pub prompt: PromptSource,
    /// The gold answers; a sample's score is the best over them.
    pub answers: Vec<String>,
    /// The class names of classification tasks (trec); empty elsewhere.
    pub all_classes: Vec<String>,
    /// LongBench's `length` field (words of the context), where given.
    pub length: Option<u64>,
    /// MiniLongBench `prediction`: another system's answer, useful to exercise the scorer; not
    /// ground truth.
    pub other_prediction: Option<String>,
}

impl Sample {
    /// The full prompt text: the rendered prompt, or the task template filled with context and
    /// input ([`render_prompt`]).
    pub fn prompt(&self) -> Result<Cow<'_, str>, EvalError> {
        match &self.prompt {
            PromptSource::Rendered(p) => Ok(Cow::Borrowed(p)),
            PromptSource::Parts { context, input } => {
                render_prompt(&self.task, context, input).map(Cow::Owned)
            }
        }
    }

    /// The task's generation limit ([`max_new_tokens`]).
    pub fn max_new_tokens(&self) -> Option<usize> {
        max_new_tokens(&self.task)
    }
}

fn read_to_string(path: &Path) -> Result<String, EvalError> {
    fs::read_to_string(path).map_err(|e| EvalError::io(path, e))
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Context for error messages about one record.
struct At<'a> {
    path: &'a Path,
    line: Option<usize>,
    id: Option<&'a str>,
}

impl At<'_> {
    fn missing(&self, field: &str) -> EvalError {
        EvalError::MissingField {
            path: self.path.to_path_buf(),
            line: self.line,
            id: self.id.map(String::from),
            field: field.into(),
        }
    }

    fn bad(&self, field: &str, message: impl Into<String>) -> EvalError {
        EvalError::BadField {
            path: self.path.to_path_buf(),
            line: self.line,
            id: self.id.map(String::from),
            field: field.into(),
            message: message.into(),
        }
    }

    fn string(
        &self,
        obj: &serde_json::Map<String, Value>,
        field: &str,
    ) -> Result<String, EvalError> {
        match obj.get(field) {
            None => Err(self.missing(field)),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(self.bad(field, format!("expected a string, found {}", kind(v)))),
        }
    }

    /// A list of strings: a JSON array of strings or a string holding a Python list literal.
    /// `null` is an empty list.
    fn str_list(&self, field: &str, v: &Value) -> Result<Vec<String>, EvalError> {
        match v {
            Value::Null => Ok(Vec::new()),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, x)| match x {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(self.bad(
                        field,
                        format!("item {i} should be a string, found {}", kind(other)),
                    )),
                })
                .collect(),
            Value::String(s) => parse_py_str_list(s)
                .map_err(|e| self.bad(field, format!("not a Python list of strings: {e}"))),
            other => Err(self.bad(
                field,
                format!("expected a list of strings, found {}", kind(other)),
            )),
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Orders ids numerically where both are numbers, else as strings.
fn id_order(a: &str, b: &str) -> std::cmp::Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y).then_with(|| a.cmp(b)),
        (Ok(_), Err(_)) => std::cmp::Ordering::Less,
        (Err(_), Ok(_)) => std::cmp::Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

/// Loads a MiniLongBench file (`{id: {origin_prompt, prediction, gold, time}}`); the task is the
/// file stem. Samples come ordered by id (numerically where ids are numbers).
pub fn load_shared_file(path: impl AsRef<Path>) -> Result<Vec<Sample>, EvalError> {
    let path = path.as_ref();
    let text = read_to_string(path)?;
    parse_shared(&text, path, &file_stem(path))
}

/// Parses the text of a MiniLongBench file (see [`load_shared_file`]); `path` names it in
/// errors and `task` is the samples' task. The entry point of the LongBench fuzz target.
///
/// # Errors
/// [`EvalError::Json`] for invalid JSON, [`EvalError::MissingField`] and
/// [`EvalError::BadField`] naming the sample and the field.
pub fn parse_shared(text: &str, path: &Path, task: &str) -> Result<Vec<Sample>, EvalError> {
    let task = task.to_string();
    let root: Value = serde_json::from_str(text).map_err(|e| EvalError::Json {
        path: path.to_path_buf(),
        line: None,
        source: e,
    })?;
    let Value::Object(map) = root else {
        return Err(At {
            path,
            line: None,
            id: None,
        }
        .bad(
            "(top level)",
            format!("expected an object of samples, found {}", kind(&root)),
        ));
    };
    let mut samples = Vec::with_capacity(map.len());
    for (id, rec) in &map {
        let at = At {
            path,
            line: None,
            id: Some(id),
        };
        let Value::Object(obj) = rec else {
            return Err(at.bad(
                "(sample)",
                format!("expected an object, found {}", kind(rec)),
            ));
        };
        let prompt = at.string(obj, "origin_prompt")?;
        let gold = obj.get("gold").ok_or_else(|| at.missing("gold"))?;
        let (answers, all_classes) = match gold {
            Value::Object(g) => {
                let answers = g.get("answers").ok_or_else(|| at.missing("gold.answers"))?;
                let answers = at.str_list("gold.answers", answers)?;
                let classes = match g.get("all_classes") {
                    Some(c) => at.str_list("gold.all_classes", c)?,
                    None => Vec::new(),
                };
                (answers, classes)
            }
            other => (at.str_list("gold", other)?, Vec::new()),
        };
        let other_prediction = match obj.get("prediction") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(at.bad(
                    "prediction",
                    format!("expected a string, found {}", kind(v)),
                ))
            }
        };
        samples.push(Sample {
            id: id.clone(),
            task: task.clone(),
            prompt: PromptSource::Rendered(prompt),
            answers,
            all_classes,
            length: None,
            other_prediction,
        });
    }
    samples.sort_by(|a, b| id_order(&a.id, &b.id));
    Ok(samples)
}

/// Loads every `*.json` MiniLongBench file of a directory, keyed by task (file stem).
pub fn load_shared_dir(dir: impl AsRef<Path>) -> Result<BTreeMap<String, Vec<Sample>>, EvalError> {
    let dir = dir.as_ref();
    let mut out = BTreeMap::new();
    for path in files_with_ext(dir, "json")? {
        out.insert(file_stem(&path), load_shared_file(&path)?);
    }
    Ok(out)
}

fn files_with_ext(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, EvalError> {
    let mut paths = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| EvalError::io(dir, e))? {
        let path = entry.map_err(|e| EvalError::io(dir, e))?.path();
        if path.extension().is_some_and(|x| x == ext) && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

/// Loads an original LongBench JSONL file (one sample per line; blank lines are skipped).
///
/// Required fields: `_id`, `dataset`, `input`, `context` (strings) and `answers` (list of
/// strings). `length` (integer) and `all_classes` (list of strings or `null`) may be absent.
/// Errors name the file, the 1-based line and the field.
pub fn load_jsonl_file(path: impl AsRef<Path>) -> Result<Vec<Sample>, EvalError> {
    let path = path.as_ref();
    let text = read_to_string(path)?;
    parse_jsonl(&text, path)
}

/// Parses the text of an original LongBench JSONL file (see [`load_jsonl_file`]); `path`
/// names it in errors. The entry point of the LongBench fuzz target.
///
/// # Errors
/// [`EvalError::Json`] naming the line, [`EvalError::MissingField`] and
/// [`EvalError::BadField`] naming the line, the sample id and the field.
pub fn parse_jsonl(text: &str, path: &Path) -> Result<Vec<Sample>, EvalError> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lineno = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| EvalError::Json {
            path: path.to_path_buf(),
            line: Some(lineno),
            source: e,
        })?;
        let mut at = At {
            path,
            line: Some(lineno),
            id: None,
        };
        let Value::Object(obj) = v else {
            return Err(at.bad(
                "(record)",
                format!("expected an object, found {}", kind(&v)),
            ));
        };
        let id = at.string(&obj, "_id")?;
        at.id = Some(&id);
        let task = at.string(&obj, "dataset")?;
        let input = at.string(&obj, "input")?;
        let context = at.string(&obj, "context")?;
        let answers = match obj.get("answers") {
            None => return Err(at.missing("answers")),
            Some(Value::Null) => {
                return Err(at.bad("answers", "expected a list of strings, found null"))
            }
            Some(a) => at.str_list("answers", a)?,
        };
        let all_classes = match obj.get("all_classes") {
            None => Vec::new(),
            Some(c) => at.str_list("all_classes", c)?,
        };
        let length = match obj.get("length") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
            Some(v) => {
                return Err(at.bad(
                    "length",
                    format!("expected a non-negative integer, found {v}"),
                ))
            }
        };
        samples.push(Sample {
            id,
            task,
            prompt: PromptSource::Parts { context, input },
            answers,
            all_classes,
            length,
            other_prediction: None,
        });
    }
    Ok(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_limits_match_dataset2maxlen() {
        let expect = [
            ("narrativeqa", 128),
            ("qasper", 128),
            ("multifieldqa_en", 64),
            ("gov_report", 512),
            ("passage_retrieval_en", 32),
            ("trec", 64),
            ("samsum", 128),
        ];
        for (t, n) in expect {
            assert_eq!(max_new_tokens(t), Some(n), "{t}");
            assert!(prompt_template(t).is_some(), "{t}");
        }
        for t in SHARED_TASKS {
            assert!(max_new_tokens(t).is_some());
        }
        assert_eq!(max_new_tokens("nope"), None);
    }

    #[test]
    fn every_template_has_context_and_renders() {
        for t in tasks() {
            let tpl = prompt_template(t).unwrap();
            assert!(tpl.contains("{context}"), "{t}");
            let p = render_prompt(t, "CTX", "INP").unwrap();
            assert!(p.contains("CTX") && !p.contains("{context}"), "{t}");
            assert!(!p.contains("{input}"), "{t}");
        }
    }

    #[test]
    fn rendering_is_single_pass_and_exact() {
        // The context mentions `{input}`: it must not be substituted again.
        let p = render_prompt("gov_report", "a {input} b", "unused").unwrap();
        assert_eq!(
            p,
            "You are given a report by a government agency. Write a one-page summary of the report.\n\n\
             Report:\na {input} b\n\nNow, write a one-page summary of the report.\n\nSummary:"
        );
        let p = render_prompt("trec", "Question: q1\nType: Date", "Question: q2\nType:").unwrap();
        assert_eq!(
            p,
            "Please determine the type of the question below. Here are some examples of questions.\n\n\
             Question: q1\nType: Date\nQuestion: q2\nType:"
        );
    }

    #[test]
    fn template_errors() {
        assert!(format_template("t", "{{x}} {context}", "c", "i").unwrap() == "{x} c");
        for bad in ["{", "}", "{foo}", "{context"] {
            assert!(matches!(
                format_template("t", bad, "c", "i"),
                Err(EvalError::Template { .. })
            ));
        }
        assert!(matches!(
            render_prompt("nope", "c", "i"),
            Err(EvalError::UnknownTask(_))
        ));
    }

    #[test]
    fn id_ordering() {
        let mut v = vec!["10", "2", "b", "1", "a"];
        v.sort_by(|a, b| id_order(a, b));
        assert_eq!(v, ["1", "2", "10", "a", "b"]);
    }
}
