//! Rouge-L as the Python package `rouge` 1.0.1 (pltrdy/rouge on PyPI) computes it for
//! LongBench's `rouge_score`: `Rouge().get_scores([prediction], [ground_truth], avg=True)
//! ["rouge-l"]["f"]`, with the package's defaults (`exclusive=True`, summary-level LCS).
//!
//! The package's algorithm, reproduced here step by step (`rouge/rouge.py` and
//! `rouge/rouge_score.py::rouge_l_summary_level`):
//!
//! 1. Each text is split into "sentences" on `.`; empty pieces are dropped *before* whitespace
//!    is collapsed, so a piece of only spaces becomes the empty sentence `""`. Each sentence is
//!    `" ".join(piece.split())`.
//! 2. Words are `sentence.split(" ")`, so the empty sentence has one word, `""`. Case and
//!    punctuation other than `.` are kept.
//! 3. `m` / `n` = number of *distinct* words in the reference / the prediction (`exclusive=True`
//!    makes the n-gram bags Python sets).
//! 4. For every (reference sentence, prediction sentence) pair one LCS of the two word lists is
//!    reconstructed with the package's tie-breaking (from the end: on equal words take both; else
//!    go up if `table[i-1][j] > table[i][j-1]`, else left); the *set* of its words is added to a
//!    running union set shared across all pairs. `llcs` = size of that union.
//! 5. `r = llcs / m`, `p = llcs / n`, `f = 2 * ((p * r) / (p + r + 1e-8))`, so a perfect match
//!    scores 0.999999995, not 1.
//! 6. If either text has no sentence (it is empty or only dots) the package raises `ValueError`;
//!    LongBench's bare `except` turns that into 0.0. [`rouge_l_summary`] returns `None` there.
//!
//! One difference is deliberate: the package reconstructs the LCS recursively, so a sentence pair
//! longer than Python's recursion limit (about 1000 words of reference sentence plus prediction
//! sentence) raises `RecursionError`, which LongBench also turns into 0.0. Here the LCS is
//! reconstructed iteratively and the true score is returned.

use std::collections::HashSet;

use crate::pyunicode::split_ws;

/// Precision, recall and F of Rouge-L.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RougeScore {
    /// F-measure, `2 p r / (p + r + 1e-8)`.
    pub f: f64,
    /// Precision: union-LCS words over distinct prediction words.
    pub p: f64,
    /// Recall: union-LCS words over distinct reference words.
    pub r: f64,
}

fn sentences(text: &str) -> Vec<String> {
    text.split('.')
        .filter(|piece| !piece.is_empty())
        .map(|piece| split_ws(piece).collect::<Vec<_>>().join(" "))
        .collect()
}

/// The words of one LCS of `x` (reference) and `y` (prediction), reconstructed with the `rouge`
/// package's tie-breaking.
fn recon_lcs<'a>(x: &[&'a str], y: &[&str], out: &mut Vec<&'a str>) {
    let (n, m) = (x.len(), y.len());
    let w = m + 1;
    let mut table = vec![0u32; (n + 1) * w];
    for i in 1..=n {
        for j in 1..=m {
            table[i * w + j] = if x[i - 1] == y[j - 1] {
                table[(i - 1) * w + j - 1] + 1
            } else {
                table[(i - 1) * w + j].max(table[i * w + j - 1])
            };
        }
    }
    let (mut i, mut j) = (n, m);
    while i > 0 && j > 0 {
        if x[i - 1] == y[j - 1] {
            out.push(x[i - 1]);
            i -= 1;
            j -= 1;
        } else if table[(i - 1) * w + j] > table[i * w + j - 1] {
            i -= 1;
        } else {
            j -= 1;
        }
    }
}

/// Summary-level Rouge-L of the `rouge` 1.0.1 package (see the module docs); `None` where the
/// package raises `ValueError` (a text with no sentence).
pub fn rouge_l_summary(prediction: &str, reference: &str) -> Option<RougeScore> {
    let hyp = sentences(prediction);
    let refs = sentences(reference);
    if hyp.is_empty() || refs.is_empty() {
        return None;
    }
    let hyp_words: Vec<Vec<&str>> = hyp.iter().map(|s| s.split(' ').collect()).collect();
    let ref_words: Vec<Vec<&str>> = refs.iter().map(|s| s.split(' ').collect()).collect();
    let m = ref_words.iter().flatten().collect::<HashSet<_>>().len();
    let n = hyp_words.iter().flatten().collect::<HashSet<_>>().len();

    let mut union: HashSet<&str> = HashSet::new();
    let mut lcs = Vec::new();
    for r in &ref_words {
        for h in &hyp_words {
            lcs.clear();
            recon_lcs(r, h, &mut lcs);
            union.extend(lcs.iter().copied());
        }
    }
    let llcs = union.len() as f64;
    let r = llcs / m as f64;
    let p = llcs / n as f64;
    let f = 2.0 * ((p * r) / (p + r + 1e-8));
    Some(RougeScore { f, p, r })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentence_splitting_quirks() {
        assert_eq!(sentences("A b. C  d.."), ["A b", "C d"]);
        // A piece of only spaces is kept as the empty sentence.
        assert_eq!(sentences("x.  .y"), ["x", "", "y"]);
        assert!(sentences("...").is_empty());
        assert!(sentences("").is_empty());
    }

    #[test]
    fn lcs_tie_breaking_follows_the_package() {
        // x = [a, b], y = [b, a]: LCS length 1. At (2,2): b != a, table[1][2] = 1 (a..[b,a]),
        // table[2][1] = 1 ([a,b]..[b]): not greater, so go left to (2,1): x[1]=b == y[0]=b,
        // take "b". The package thus reconstructs ["b"], not ["a"].
        let mut out = Vec::new();
        recon_lcs(&["a", "b"], &["b", "a"], &mut out);
        assert_eq!(out, ["b"]);
    }

    #[test]
    fn empty_texts_are_errors_in_the_package() {
        assert!(rouge_l_summary("", "a b").is_none());
        assert!(rouge_l_summary("a b", "..").is_none());
        // Whitespace is a sentence (the empty one), and two of them match.
        let s = rouge_l_summary("  ", " ").unwrap();
        assert!((s.f - 2.0 / (2.0 + 1e-8)).abs() < 1e-15);
    }
}
