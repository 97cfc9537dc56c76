//! Property tests: ranges and invariants of the metrics, literal round trips, and the results
//! store surviving a write cut at any byte.

mod common;

use dustin_eval::longbench::parse_py_str_list;
use dustin_eval::metrics::{self, fuzz, FuzzBackend};
use dustin_eval::pg19::strip_gutenberg;
use dustin_eval::report::ResultStore;
use proptest::prelude::*;

/// Python's `repr()` of a str (the quote choice and escapes of `unicode_repr` in CPython's
/// `Objects/unicodeobject.c`, for the characters the strategy below produces).
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::new();
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

fn words() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "the", "a", "cat", "Cat", "sat", ".", ",", " ", "\n", "3", "é",
        ]),
        0..20,
    )
    .prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn f1_is_bounded_and_symmetric(p in words(), g in words()) {
        let a = metrics::qa_f1_score(&p, &g);
        let b = metrics::qa_f1_score(&g, &p);
        prop_assert!((0.0..=1.0).contains(&a));
        prop_assert!((a - b).abs() < 1e-12);
    }

    #[test]
    fn rouge_is_bounded(p in words(), g in words()) {
        let r = metrics::rouge_score(&p, &g);
        prop_assert!((0.0..1.0).contains(&r));
    }

    #[test]
    fn classification_is_bounded(p in words(), g in prop::sample::select(vec!["cat", "Cat", "a", "sat"])) {
        let classes = ["cat", "Cat", "a", "sat", "cat sat"];
        let s = metrics::classification_score(&p, g, &classes);
        prop_assert!((0.0..=1.0).contains(&s));
    }

    #[test]
    fn levenshtein_ratio_bounds_difflib(a in "[ab()x ]{0,40}", b in "[ab()x ]{0,40}") {
        // difflib's blocks are a common subsequence, so never longer than the LCS.
        prop_assert!(fuzz::levenshtein_ratio(&a, &b) + 1e-12 >= fuzz::difflib_ratio(&a, &b));
        let r = metrics::fuzz_ratio(&a, &b, FuzzBackend::Difflib);
        prop_assert!(r <= 100);
        prop_assert_eq!(metrics::fuzz_ratio(&a, &a, FuzzBackend::Difflib), 100);
    }

    #[test]
    fn py_list_literal_round_trip(items in prop::collection::vec("[a'\"\\\\\n\t\r\u{0}\u{7f}é😀 ]{0,8}", 0..5)) {
        let lit = format!("[{}]", items.iter().map(|s| py_repr(s)).collect::<Vec<_>>().join(", "));
        prop_assert_eq!(parse_py_str_list(&lit).unwrap(), items);
    }

    #[test]
    fn strip_without_markers_keeps_the_text(lines in prop::collection::vec("[a-z ]{0,10}", 0..8)) {
        let raw = lines.join("\r\n");
        let s = strip_gutenberg(&raw);
        prop_assert!(!s.markers.start && !s.markers.end);
        let normalised = raw.replace("\r\n", "\n");
        prop_assert_eq!(s.text.trim(), normalised.trim());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn store_survives_a_cut_at_any_byte(n in 1usize..6, cut_frac in 0.0f64..1.0) {
        let dir = common::temp_dir("prop-store");
        let path = dir.join("r.jsonl");
        {
            let mut s = ResultStore::open(&path).unwrap();
            for i in 0..n {
                s.append(&format!("k{i}"), &serde_json::json!({"i": i, "text": "x\ny"})).unwrap();
            }
        }
        let bytes = std::fs::read(&path).unwrap();
        let cut = ((bytes.len() as f64) * cut_frac) as usize;
        std::fs::write(&path, &bytes[..cut]).unwrap();
        // Records wholly before the cut (their JSON is complete) must be done; nothing panics.
        let complete = bytes[..cut].split(|&b| b == b'\n').filter(|l| {
            serde_json::from_slice::<serde_json::Value>(l).is_ok()
        }).count();
        let mut s = ResultStore::open(&path).unwrap();
        prop_assert_eq!(s.len(), complete);
        s.append("new", &1).unwrap();
        let (recs, warns) = ResultStore::read::<serde_json::Value>(&path).unwrap();
        prop_assert!(warns.is_empty());
        prop_assert_eq!(recs.len(), complete + 1);
    }
}
