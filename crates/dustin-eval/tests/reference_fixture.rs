//! Cross-check against LongBench's own Python code.
//!
//! `tests/fixtures/longbench_reference.json` was written by `tools/gen_metric_fixture.py`, which
//! imports THUDM/LongBench `LongBench/metrics.py` (commit 2e00731) and runs it with the PyPI
//! packages `rouge==1.0.1`, `fuzzywuzzy==0.18.0` (with and without `python-Levenshtein==0.27.5`)
//! on Python 3.11.7: random pairs for every metric, Python `repr()` of random string lists,
//! `round(x, 2)`, and the eval.py score of every shared MiniLongBench sample's `prediction`.

mod common;

use dustin_eval::longbench::{self, parse_py_str_list};
use dustin_eval::metrics::{self, FuzzBackend};
use serde_json::Value;

fn fixture() -> Value {
    serde_json::from_str(include_str!("fixtures/longbench_reference.json")).unwrap()
}

/// Python floats pass through JSON as shortest round-trip decimals; serde_json's default parser
/// may be one ulp off, so compare at 1e-12.
fn check(what: &str, i: usize, got: f64, want: f64, detail: &dyn std::fmt::Debug) {
    assert!(
        (got - want).abs() <= 1e-12,
        "{what} case {i}: got {got}, Python says {want}: {detail:?}"
    );
}

fn triples(v: &Value) -> impl Iterator<Item = (usize, &str, &str, f64)> {
    v.as_array().unwrap().iter().enumerate().map(|(i, c)| {
        (
            i,
            c[0].as_str().unwrap(),
            c[1].as_str().unwrap(),
            c[2].as_f64().unwrap(),
        )
    })
}

#[test]
fn normalize_answer_matches_python() {
    let f = fixture();
    for (i, c) in f["normalize_answer"].as_array().unwrap().iter().enumerate() {
        let (input, want) = (c[0].as_str().unwrap(), c[1].as_str().unwrap());
        assert_eq!(
            metrics::normalize_answer(input),
            want,
            "case {i}: {input:?}"
        );
    }
}

#[test]
fn qa_f1_matches_python() {
    let f = fixture();
    for (i, p, g, want) in triples(&f["qa_f1"]) {
        check("qa_f1", i, metrics::qa_f1_score(p, g), want, &(p, g));
    }
}

#[test]
fn rouge_matches_the_rouge_package() {
    let f = fixture();
    for (i, p, g, want) in triples(&f["rouge"]) {
        check("rouge", i, metrics::rouge_score(p, g), want, &(p, g));
    }
}

#[test]
fn retrieval_and_count_match_python() {
    let f = fixture();
    for (i, p, g, want) in triples(&f["retrieval"]) {
        check(
            "retrieval",
            i,
            metrics::retrieval_score(p, g).unwrap(),
            want,
            &(p, g),
        );
    }
    for (i, p, g, want) in triples(&f["count"]) {
        check("count", i, metrics::count_score(p, g), want, &(p, g));
    }
}

#[test]
fn classification_matches_python() {
    let f = fixture();
    let classes: Vec<String> =
        serde_json::from_value(f["classification"]["all_classes"].clone()).unwrap();
    for (i, p, g, want) in triples(&f["classification"]["cases"]) {
        check(
            "classification",
            i,
            metrics::classification_score(p, g, &classes),
            want,
            &(p, g),
        );
    }
}

#[test]
fn code_sim_matches_fuzzywuzzy_both_backends() {
    let f = fixture();
    for (key, backend) in [
        ("code_sim_difflib", FuzzBackend::Difflib),
        ("code_sim_levenshtein", FuzzBackend::Levenshtein),
    ] {
        for (i, p, g, want) in triples(&f[key]) {
            let got = metrics::code_sim_score_with(p, g, backend);
            check(key, i, got, want, &(p, g));
        }
    }
}

#[test]
fn python_round_matches() {
    let f = fixture();
    for (i, c) in f["round2"].as_array().unwrap().iter().enumerate() {
        let (x, want) = (c[0].as_f64().unwrap(), c[1].as_f64().unwrap());
        assert_eq!(metrics::round_py(x, 2), want, "case {i}: round({x}, 2)");
    }
}

#[test]
fn python_list_literals_parse_like_python() {
    let f = fixture();
    for (i, c) in f["py_list_literals"].as_array().unwrap().iter().enumerate() {
        let lit = c[0].as_str().unwrap();
        let want: Vec<String> = serde_json::from_value(c[1].clone()).unwrap();
        assert_eq!(parse_py_str_list(lit).unwrap(), want, "case {i}: {lit:?}");
    }
}

#[test]
fn shared_samples_score_like_longbench_eval() {
    let Some(dir) = common::shared_data("longbench") else {
        return;
    };
    let all = longbench::load_shared_dir(&dir).unwrap();
    let f = fixture();
    let expected = f["shared_samples"].as_array().unwrap();
    assert_eq!(expected.len(), all.values().map(Vec::len).sum::<usize>());
    for e in expected {
        let (task, id) = (e["task"].as_str().unwrap(), e["id"].as_str().unwrap());
        if e.get("python_recursion_error").is_some() {
            continue; // Python gives 0 there only because of its recursion limit.
        }
        let s = all[task].iter().find(|s| s.id == id).unwrap();
        let pred = s.other_prediction.as_deref().unwrap();
        let got = metrics::scorer(task, pred, &s.answers, &s.all_classes).unwrap();
        check("shared", 0, got, e["score"].as_f64().unwrap(), &(task, id));
    }
}
