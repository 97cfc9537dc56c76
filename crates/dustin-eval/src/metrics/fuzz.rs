//! `fuzzywuzzy.fuzz.ratio` (fuzzywuzzy 0.18.0, `fuzzywuzzy/fuzz.py` and `utils.py`), the string
//! similarity behind LongBench's `code_sim_score`.
//!
//! `fuzz.ratio(s1, s2)` is: 100 if `s1 == s2` (two empty strings included); 0 if either is
//! empty; else `int(round(100 * SequenceMatcher(None, s1, s2).ratio()))` with Python's
//! round-half-to-even. Which `SequenceMatcher` it uses depends on the environment:
//!
//! * [`FuzzBackend::Difflib`] (the default here): without the `python-Levenshtein` package,
//!   fuzzywuzzy falls back to Python's `difflib.SequenceMatcher` (with `autojunk=True`): `ratio =
//!   2 M / T`, `M` the total size of the matching blocks that difflib's longest-block-first
//!   recursion finds (not always the optimal LCS; with `len(s2) >= 200`, characters occurring
//!   more than `len(s2) // 100 + 1` times in `s2` cannot start a block), `T = len(s1) +
//!   len(s2)` in code points. LongBench's `requirements.txt` lists `fuzzywuzzy` but not
//!   `python-Levenshtein`, so this is what its pinned setup computes. Ported from CPython 3.11
//!   `Lib/difflib.py` (`__chain_b`, `find_longest_match`, `get_matching_blocks`).
//! * [`FuzzBackend::Levenshtein`]: with `python-Levenshtein` installed, fuzzywuzzy's
//!   `StringMatcher` uses `Levenshtein.ratio` = 1 - InDel distance / T = 2 LCS / T, computed as
//!   `1.0 - dist / T` like rapidfuzz's `Indel.normalized_similarity` (python-Levenshtein 0.27).

use std::collections::HashMap;

/// Which `SequenceMatcher` fuzzywuzzy runs on (see the module docs).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum FuzzBackend {
    /// Python's `difflib.SequenceMatcher` (fuzzywuzzy without python-Levenshtein; LongBench's
    /// pinned requirements).
    #[default]
    Difflib,
    /// `Levenshtein.ratio` (fuzzywuzzy with python-Levenshtein installed).
    Levenshtein,
}

/// `difflib.SequenceMatcher(None, a, b).ratio()` on code points, `autojunk=True`.
pub fn difflib_ratio(a: &str, b: &str) -> f64 {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let total = a.len() + b.len();
    if total == 0 {
        return 1.0;
    }
    let matches = difflib_matches(&a, &b);
    2.0 * matches as f64 / total as f64
}

/// Total size of difflib's matching blocks of `a` and `b`.
fn difflib_matches(a: &[char], b: &[char]) -> usize {
    // __chain_b: positions of every element of b; with autojunk, popular elements are dropped.
    let mut b2j: HashMap<char, Vec<usize>> = HashMap::new();
    for (j, &c) in b.iter().enumerate() {
        b2j.entry(c).or_default().push(j);
    }
    let n = b.len();
    if n >= 200 {
        let ntest = n / 100 + 1;
        b2j.retain(|_, idxs| idxs.len() <= ntest);
    }
    // isjunk is None, so bjunk is empty: the junk-extension loops of find_longest_match never
    // fire, while popular elements are still allowed when extending a match.
    let mut total = 0;
    let mut queue = vec![(0usize, a.len(), 0usize, b.len())];
    while let Some((alo, ahi, blo, bhi)) = queue.pop() {
        let (i, j, k) = find_longest_match(a, b, &b2j, alo, ahi, blo, bhi);
        if k > 0 {
            total += k;
            if alo < i && blo < j {
                queue.push((alo, i, blo, j));
            }
            if i + k < ahi && j + k < bhi {
                queue.push((i + k, ahi, j + k, bhi));
            }
        }
    }
    total
}

#[allow(clippy::too_many_arguments)]
fn find_longest_match(
    a: &[char],
    b: &[char],
    b2j: &HashMap<char, Vec<usize>>,
    alo: usize,
    ahi: usize,
    blo: usize,
    bhi: usize,
) -> (usize, usize, usize) {
    let (mut besti, mut bestj, mut bestsize) = (alo, blo, 0usize);
    let mut j2len: HashMap<usize, usize> = HashMap::new();
    let mut newj2len: HashMap<usize, usize> = HashMap::new();
    for (i, ai) in a.iter().enumerate().take(ahi).skip(alo) {
        newj2len.clear();
        if let Some(js) = b2j.get(ai) {
            for &j in js {
                if j < blo {
                    continue;
                }
                if j >= bhi {
                    break;
                }
                let k = j
                    .checked_sub(1)
                    .and_then(|p| j2len.get(&p))
                    .copied()
                    .unwrap_or(0)
                    + 1;
                newj2len.insert(j, k);
                if k > bestsize {
                    besti = i + 1 - k;
                    bestj = j + 1 - k;
                    bestsize = k;
                }
            }
        }
        std::mem::swap(&mut j2len, &mut newj2len);
    }
    while besti > alo && bestj > blo && a[besti - 1] == b[bestj - 1] {
        besti -= 1;
        bestj -= 1;
        bestsize += 1;
    }
    while besti + bestsize < ahi
        && bestj + bestsize < bhi
        && a[besti + bestsize] == b[bestj + bestsize]
    {
        bestsize += 1;
    }
    (besti, bestj, bestsize)
}

/// `Levenshtein.ratio(a, b)` (python-Levenshtein 0.27): `1 - (len a + len b - 2 LCS) / (len a
/// + len b)` on code points; 1.0 for two empty strings.
pub fn levenshtein_ratio(a: &str, b: &str) -> f64 {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let total = a.len() + b.len();
    if total == 0 {
        return 1.0;
    }
    // LCS length, one row at a time.
    let mut prev = vec![0usize; b.len() + 1];
    let mut cur = vec![0usize; b.len() + 1];
    for &ca in &a {
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = if ca == cb {
                prev[j] + 1
            } else {
                prev[j + 1].max(cur[j])
            };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    let lcs = prev[b.len()];
    let dist = total - 2 * lcs;
    1.0 - dist as f64 / total as f64
}

/// `fuzzywuzzy.fuzz.ratio(a, b)`: an integer from 0 to 100 (see the module docs).
pub fn fuzz_ratio(a: &str, b: &str, backend: FuzzBackend) -> u32 {
    if a == b {
        return 100;
    }
    if a.is_empty() || b.is_empty() {
        return 0;
    }
    let r = match backend {
        FuzzBackend::Difflib => difflib_ratio(a, b),
        FuzzBackend::Levenshtein => levenshtein_ratio(a, b),
    };
    // Python 3 round(): half to even.
    (100.0 * r).round_ties_even() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difflib_is_not_always_the_lcs() {
        // a = "abcXdefYabc"... simpler classic: a = "ab", b = "ba".
        // difflib: longest block is "a" (first found, a[0..1] = b[1..2]); left part a[0..0] is
        // empty, right part a[1..2]="b" vs b[2..2] empty: M = 1, ratio = 2/4 = 0.5.
        // Levenshtein: LCS = 1, same 0.5.
        assert_eq!(difflib_ratio("ab", "ba"), 0.5);
        assert_eq!(levenshtein_ratio("ab", "ba"), 0.5);
        // a = "abxcd", b = "abcd" (difflib's docstring): blocks "ab" and "cd", M = 4,
        // ratio = 8/9 = 0.888..., fuzz ratio round(88.9) = 89.
        assert_eq!(fuzz_ratio("abxcd", "abcd", FuzzBackend::Difflib), 89);
        // a = "xabcy", b = "abzcy"? difflib: longest block "ab" (len 2) at a[1..3], b[0..2];
        // left: a[0..1]="x" vs b[0..0] empty; right: a[3..5]="cy" vs b[2..5]="zcy": block "cy".
        // M = 4, T = 10, ratio 0.8 -> 80. LCS is also "abcy" = 4.
        assert_eq!(fuzz_ratio("xabcy", "abzcy", FuzzBackend::Difflib), 80);
        assert_eq!(fuzz_ratio("xabcy", "abzcy", FuzzBackend::Levenshtein), 80);
    }

    #[test]
    fn difflib_greedy_block_loses_to_lcs() {
        // a = "aXbYc" + "bc"... hand case: a = "abcd", b = "cdab".
        // difflib: longest block: "ab" (a[0..2]=b[2..4]) found first (ties keep the earliest i).
        // Left: a[0..0] empty. Right: a[2..4]="cd" vs b[4..4] empty. M = 2, ratio = 4/8 = 0.5.
        // LCS is 2 as well ("ab" or "cd"), so both give 50.
        assert_eq!(fuzz_ratio("abcd", "cdab", FuzzBackend::Difflib), 50);
        // a = "abXcd", b = "cdYab": difflib block "ab" at a[0..2], b[3..5]; left empty,
        // right a[2..5]="Xcd" vs b[5..5] empty. M = 2, ratio 4/10 -> 40.
        assert_eq!(fuzz_ratio("abXcd", "cdYab", FuzzBackend::Difflib), 40);
    }

    #[test]
    fn equal_and_empty() {
        assert_eq!(fuzz_ratio("", "", FuzzBackend::Difflib), 100);
        assert_eq!(fuzz_ratio("x", "", FuzzBackend::Levenshtein), 0);
        assert_eq!(fuzz_ratio("", "x", FuzzBackend::Difflib), 0);
        assert_eq!(fuzz_ratio("same", "same", FuzzBackend::Levenshtein), 100);
    }

    #[test]
    fn round_half_even() {
        // "ab" vs "ac": M = 1, T = 4, 100 * 0.5 = 50 exactly. Need a .5 case: T = 8, M = 1 ->
        // 2/8 = 0.25 -> 25. T = 16, M = 1 -> 12.5 -> rounds to 12 (even).
        // a = "a" + 7 x "b", b = "a" + 7 x "c": only "a" matches: M = 1, T = 16.
        let a = format!("a{}", "b".repeat(7));
        let b = format!("a{}", "c".repeat(7));
        assert_eq!(fuzz_ratio(&a, &b, FuzzBackend::Difflib), 12);
        assert_eq!(fuzz_ratio(&a, &b, FuzzBackend::Levenshtein), 12);
    }
}
