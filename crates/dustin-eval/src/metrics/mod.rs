//! LongBench's metrics, as THUDM/LongBench `LongBench/metrics.py` and `LongBench/eval.py` define
//! them (commit 2e00731f8d0bff23dc4325161044d0ed8af94c1e), reproduced to the bit where the
//! Python is deterministic:
//!
//! * tokenisation follows Python: `str.split()` splits on `str.isspace()` characters, `re`'s
//!   `\w` / `\d` are Unicode (`str.isalnum()` + `_` / category Nd), `string.punctuation` is ASCII
//!   punctuation (tables generated from Python 3.11, Unicode 14, in `pyunicode.rs`);
//! * floating-point expressions are evaluated in Python's order;
//! * Rouge-L follows the `rouge` 1.0.1 package ([`rouge`]), the code-similarity ratio follows
//!   `fuzzywuzzy` 0.18.0 ([`fuzz`]).
//!
//! The Chinese metrics (which need the `jieba` segmenter) are not implemented.

pub mod fuzz;
pub mod rouge;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

pub use fuzz::{fuzz_ratio, FuzzBackend};
pub use rouge::{rouge_l_summary, RougeScore};

use crate::pyunicode::{is_digit, is_word, split_ws};
use crate::EvalError;

/// `normalize_answer` of LongBench (from the SQuAD evaluation script): lower-case, remove ASCII
/// punctuation, replace the whole words `a`, `an`, `the` by a space, collapse whitespace.
pub fn normalize_answer(s: &str) -> String {
    let lower = s.to_lowercase();
    let no_punc: String = lower
        .chars()
        .filter(|c| !c.is_ascii_punctuation())
        .collect();
    // re.sub(r"\b(a|an|the)\b", " ", text): a match is always a whole run of \w characters.
    let mut no_articles = String::with_capacity(no_punc.len());
    let mut rest = no_punc.as_str();
    while !rest.is_empty() {
        let word_len: usize = rest
            .chars()
            .take_while(|&c| is_word(c))
            .map(char::len_utf8)
            .sum();
        if word_len > 0 {
            let word = &rest[..word_len];
            if matches!(word, "a" | "an" | "the") {
                no_articles.push(' ');
            } else {
                no_articles.push_str(word);
            }
            rest = &rest[word_len..];
        } else {
            let other_len: usize = rest
                .chars()
                .take_while(|&c| !is_word(c))
                .map(char::len_utf8)
                .sum();
            no_articles.push_str(&rest[..other_len]);
            rest = &rest[other_len..];
        }
    }
    split_ws(&no_articles).collect::<Vec<_>>().join(" ")
}

/// LongBench `f1_score` on two token lists: bag-of-tokens (Counter intersection) F1; 0 when
/// nothing is shared (so also when either list is empty).
pub fn f1_tokens<S: AsRef<str>>(prediction: &[S], ground_truth: &[S]) -> f64 {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for t in ground_truth {
        *counts.entry(t.as_ref()).or_default() += 1;
    }
    let mut num_same = 0usize;
    for t in prediction {
        if let Some(c) = counts.get_mut(t.as_ref()) {
            if *c > 0 {
                *c -= 1;
                num_same += 1;
            }
        }
    }
    if num_same == 0 {
        return 0.0;
    }
    let precision = 1.0 * num_same as f64 / prediction.len() as f64;
    let recall = 1.0 * num_same as f64 / ground_truth.len() as f64;
    (2.0 * precision * recall) / (precision + recall)
}

/// LongBench `qa_f1_score`: [`f1_tokens`] on the whitespace tokens of [`normalize_answer`].
pub fn qa_f1_score(prediction: &str, ground_truth: &str) -> f64 {
    let p = normalize_answer(prediction);
    let g = normalize_answer(ground_truth);
    let pt: Vec<&str> = split_ws(&p).collect();
    let gt: Vec<&str> = split_ws(&g).collect();
    f1_tokens(&pt, &gt)
}

/// LongBench `rouge_score`: the Rouge-L F of the `rouge` 1.0.1 package, 0.0 where the package
/// raises (empty or dots-only text). See [`rouge`] for the exact algorithm.
pub fn rouge_score(prediction: &str, ground_truth: &str) -> f64 {
    rouge_l_summary(prediction, ground_truth).map_or(0.0, |s| s.f)
}

/// Maximal runs of Unicode decimal digits: Python `re.findall(r"\d+", text)`.
fn digit_runs(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (is_digit(c), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push(&text[s..i]);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push(&text[s..]);
    }
    out
}

/// Share of the numbers in `prediction` (as strings) equal to `target`; 0 with no number.
fn share_equal(prediction: &str, target: &str) -> f64 {
    let numbers = digit_runs(prediction);
    if numbers.is_empty() {
        return 0.0;
    }
    let right = numbers.iter().filter(|n| **n == target).count();
    right as f64 / numbers.len() as f64
}

/// LongBench `count_score` (passage_count): share of the numbers in the prediction that equal
/// the gold string.
pub fn count_score(prediction: &str, ground_truth: &str) -> f64 {
    share_equal(prediction, ground_truth)
}

/// LongBench `retrieval_score` (passage_retrieval_en): the gold's paragraph number is the first
/// `Paragraph (\d+)` match; the score is the share of the numbers in the prediction equal to it
/// (compared as strings). A gold without such a match is an error (Python raises `IndexError`).
pub fn retrieval_score(prediction: &str, ground_truth: &str) -> Result<f64, EvalError> {
    let id = ground_truth
        .match_indices("Paragraph ")
        .find_map(|(i, m)| {
            let rest = &ground_truth[i + m.len()..];
            digit_runs(rest)
                .first()
                .filter(|d| rest.starts_with(**d))
                .copied()
        })
        .ok_or_else(|| EvalError::NoParagraphNumber(ground_truth.to_string()))?;
    Ok(share_equal(prediction, id))
}

/// LongBench `classification_score` (trec), replicated exactly, including its list mutation
/// during iteration:
///
/// ```python
/// em_match_list = [c for c in all_classes if c in prediction]   # substring test
/// for match_term in em_match_list:                              # removing while iterating
///     if match_term in ground_truth and match_term != ground_truth:
///         em_match_list.remove(match_term)                      # skips the next item
/// score = 1.0 / len(em_match_list) if ground_truth in em_match_list else 0.0
/// ```
pub fn classification_score<S: AsRef<str>>(
    prediction: &str,
    ground_truth: &str,
    all_classes: &[S],
) -> f64 {
    let mut matches: Vec<&str> = all_classes
        .iter()
        .map(AsRef::as_ref)
        .filter(|c| prediction.contains(*c))
        .collect();
    // Python's list iterator walks an index; `remove` deletes the first equal element, shifting
    // later ones left, so the element after a removed one is never visited.
    let mut idx = 0;
    while idx < matches.len() {
        let term = matches[idx];
        if ground_truth.contains(term) && term != ground_truth {
            if let Some(p) = matches.iter().position(|m| *m == term) {
                matches.remove(p);
            }
        }
        idx += 1;
    }
    if matches.contains(&ground_truth) {
        1.0 / matches.len() as f64
    } else {
        0.0
    }
}

/// LongBench `code_sim_score` (lcc, repobench-p): `fuzz.ratio` / 100 between the gold line and
/// the first line of the prediction (after leading newlines) that contains none of `` ` ``, `#`,
/// `//` (the empty string if there is none). Uses [`FuzzBackend::Difflib`]; see
/// [`code_sim_score_with`].
pub fn code_sim_score(prediction: &str, ground_truth: &str) -> f64 {
    code_sim_score_with(prediction, ground_truth, FuzzBackend::Difflib)
}

/// [`code_sim_score`] with a chosen `SequenceMatcher` backend.
pub fn code_sim_score_with(prediction: &str, ground_truth: &str, backend: FuzzBackend) -> f64 {
    let line = prediction
        .trim_start_matches('\n')
        .split('\n')
        .find(|l| !l.contains('`') && !l.contains('#') && !l.contains("//"))
        .unwrap_or("");
    fuzz_ratio(line, ground_truth, backend) as f64 / 100.0
}

/// A LongBench metric (`dataset2metric` of `eval.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Metric {
    /// [`qa_f1_score`].
    QaF1,
    /// [`rouge_score`].
    Rouge,
    /// [`retrieval_score`].
    Retrieval,
    /// [`count_score`].
    Count,
    /// [`classification_score`].
    Classification,
    /// [`code_sim_score`].
    CodeSim,
}

impl Metric {
    /// The metric LongBench uses for a task (English tasks only).
    pub fn for_task(task: &str) -> Option<Metric> {
        Some(match task {
            "narrativeqa" | "qasper" | "multifieldqa_en" | "hotpotqa" | "2wikimqa" | "musique"
            | "triviaqa" => Metric::QaF1,
            "gov_report" | "qmsum" | "multi_news" | "samsum" => Metric::Rouge,
            "passage_retrieval_en" => Metric::Retrieval,
            "passage_count" => Metric::Count,
            "trec" => Metric::Classification,
            "lcc" | "repobench-p" => Metric::CodeSim,
            _ => return None,
        })
    }

    /// Scores one prediction against one gold answer.
    pub fn score<S: AsRef<str>>(
        self,
        prediction: &str,
        ground_truth: &str,
        all_classes: &[S],
    ) -> Result<f64, EvalError> {
        Ok(match self {
            Metric::QaF1 => qa_f1_score(prediction, ground_truth),
            Metric::Rouge => rouge_score(prediction, ground_truth),
            Metric::Retrieval => retrieval_score(prediction, ground_truth)?,
            Metric::Count => count_score(prediction, ground_truth),
            Metric::Classification => classification_score(prediction, ground_truth, all_classes),
            Metric::CodeSim => code_sim_score(prediction, ground_truth),
        })
    }
}

/// Whether LongBench keeps only the first line of predictions for a task before scoring
/// (trec, triviaqa, samsum, lsht in `eval.py`).
pub fn first_line_only(task: &str) -> bool {
    matches!(task, "trec" | "triviaqa" | "samsum" | "lsht")
}

/// The prediction as LongBench scores it: for [`first_line_only`] tasks,
/// `prediction.lstrip('\n').split('\n')[0]`; otherwise unchanged.
pub fn prepare_prediction<'a>(task: &str, prediction: &'a str) -> &'a str {
    if first_line_only(task) {
        let p = prediction.trim_start_matches('\n');
        p.split('\n').next().unwrap_or("")
    } else {
        prediction
    }
}

/// LongBench's per-sample score: the task's metric on the prepared prediction
/// ([`prepare_prediction`]), maximised over the gold answers (0 with none).
pub fn scorer<S: AsRef<str>, C: AsRef<str>>(
    task: &str,
    prediction: &str,
    answers: &[S],
    all_classes: &[C],
) -> Result<f64, EvalError> {
    let metric = Metric::for_task(task).ok_or_else(|| EvalError::UnknownTask(task.into()))?;
    let prediction = prepare_prediction(task, prediction);
    let mut score = 0.0f64;
    for gold in answers {
        score = score.max(metric.score(prediction, gold.as_ref(), all_classes)?);
    }
    Ok(score)
}

/// A task's score: mean of the sample scores x 100 (`None` for no samples). LongBench then
/// rounds it with `round(x, 2)`; see [`round_py`].
pub fn task_score(sample_scores: &[f64]) -> Option<f64> {
    if sample_scores.is_empty() {
        return None;
    }
    let total: f64 = sample_scores.iter().sum();
    Some(100.0 * total / sample_scores.len() as f64)
}

/// Python's `round(x, ndigits)` for `ndigits >= 0`: the decimal nearest to the exact binary
/// value, ties to even.
pub fn round_py(x: f64, ndigits: usize) -> f64 {
    if !x.is_finite() {
        return x;
    }
    format!("{x:.ndigits$}").parse().unwrap_or(x)
}

#[cfg(test)]
mod tests;
