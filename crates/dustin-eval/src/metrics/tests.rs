//! Hand-worked values for the LongBench metrics. Each expected value is derived in the comment
//! from the definitions in `LongBench/metrics.py`, not from this code's output.

use super::*;

const EPS: f64 = 1e-12;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < EPS
}

#[test]
fn normalize_answer_cases() {
    // lower -> "the cat sat on the mat." ; punctuation -> "the cat sat on the mat" ;
    // articles -> " cat sat on   mat" ; whitespace -> "cat sat on mat".
    assert_eq!(
        normalize_answer("The cat sat on the mat."),
        "cat sat on mat"
    );
    // "a-ok" loses its hyphen before article removal, so "aok" is one word; "Theater's" is not
    // an article; "An" is.
    assert_eq!(normalize_answer("An Theater's a-ok"), "theaters aok");
    // Articles glued by punctuation become separate words once the punctuation is gone? No:
    // "the,a" -> "thea" (punctuation is deleted, not replaced by a space).
    assert_eq!(normalize_answer("the,a"), "thea");
    // Tabs/newlines collapse; non-ASCII punctuation (the em dash) is kept.
    assert_eq!(normalize_answer(" a\tb\n—c "), "b —c");
    // Non-ASCII letters are word characters: "thé" is not an article, "é" keeps "the" glued.
    assert_eq!(normalize_answer("thé the"), "thé");
    assert_eq!(normalize_answer(""), "");
}

#[test]
fn qa_f1_partial_overlap() {
    // pred "The cat sat on the mat." -> [cat, sat, on, mat]
    // gold "A cat sat on a hat"      -> [cat, sat, on, hat]
    // common = 3, precision = 3/4, recall = 3/4, F1 = 0.75.
    assert!(close(
        qa_f1_score("The cat sat on the mat.", "A cat sat on a hat"),
        0.75
    ));
}

#[test]
fn qa_f1_articles_and_punctuation_only_differences() {
    // "An apple, the pie!" -> "apple pie" ; gold "apple pie" -> F1 = 1.
    assert!(close(qa_f1_score("An apple, the pie!", "apple pie"), 1.0));
}

#[test]
fn qa_f1_counts_repeated_tokens_once_per_match() {
    // pred [yes, yes, yes], gold [yes, no]: Counter intersection {yes: 1} -> common = 1.
    // precision = 1/3, recall = 1/2, F1 = 2 * (1/6) / (5/6) = 2/5.
    assert!(close(qa_f1_score("yes yes yes", "yes no"), 0.4));
}

#[test]
fn qa_f1_empty_sides() {
    // No tokens on one side -> nothing in common -> 0 (LongBench returns 0 before dividing).
    assert_eq!(qa_f1_score("", "Baron Frederick"), 0.0);
    assert_eq!(qa_f1_score("Baron Frederick", ""), 0.0);
    // "the" normalises to nothing on both sides: still 0, not 1.
    assert_eq!(qa_f1_score("the", "the"), 0.0);
    assert_eq!(qa_f1_score("", ""), 0.0);
}

#[test]
fn rouge_l_single_sentence() {
    // ref  [the, cat, is, on, the, mat] -> distinct m = |{the, cat, is, on, mat}| = 5
    // pred [the, cat, sat, on, the, mat] -> distinct n = |{the, cat, sat, on, mat}| = 5
    // LCS = "the cat on the mat"; as a set {the, cat, on, mat}: llcs = 4.
    // r = p = 4/5; f = 2 * (0.64 / (1.6 + 1e-8)) = 0.799999995...
    let s = rouge_l_summary("the cat sat on the mat", "the cat is on the mat").unwrap();
    assert!(close(s.r, 0.8) && close(s.p, 0.8));
    assert!(close(s.f, 2.0 * (0.64 / (1.6 + 1e-8))));
    assert!(close(
        rouge_score("the cat sat on the mat", "the cat is on the mat"),
        s.f
    ));
}

#[test]
fn rouge_l_multi_sentence_union() {
    // pred sentences ["cat sat", "dog ran"], ref ["the cat ran"]; m = 3, n = 4.
    // LCS(ref, "cat sat") = {cat}; LCS(ref, "dog ran") = {ran}; union = {cat, ran}: llcs = 2.
    // r = 2/3, p = 1/2, f = 2 * ((1/3) / (7/6 + 1e-8)) ~= 4/7.
    let s = rouge_l_summary("cat sat. dog ran", "the cat ran").unwrap();
    assert!(close(s.r, 2.0 / 3.0) && close(s.p, 0.5));
    assert!(close(
        s.f,
        2.0 * ((0.5 * (2.0 / 3.0)) / (0.5 + 2.0 / 3.0 + 1e-8))
    ));
    assert!((s.f - 4.0 / 7.0).abs() < 1e-8);
}

#[test]
fn rouge_l_is_case_sensitive_and_empty_is_zero() {
    // "The" != "the": ref {the, end}, pred {The, end}; LCS {end}: p = r = 1/2, f ~= 0.5.
    assert!((rouge_score("The end", "the end") - 0.5).abs() < 1e-8);
    // The package raises on an empty hypothesis; LongBench returns 0.
    assert_eq!(rouge_score("", "the end"), 0.0);
    assert_eq!(rouge_score("...", "the end"), 0.0);
    assert_eq!(rouge_score("the end", ""), 0.0);
}

#[test]
fn retrieval_paragraph_number() {
    // gold id = "3"; numbers in prediction ["3"] -> 1/1.
    assert_eq!(retrieval_score("Paragraph 3", "Paragraph 3").unwrap(), 1.0);
    // numbers ["3", "13"] -> one equals "3" -> 1/2.
    assert_eq!(
        retrieval_score("Paragraph 3 or Paragraph 13", "Paragraph 3").unwrap(),
        0.5
    );
    // "30" is not "3"; "03" is not "3" (string comparison).
    assert_eq!(retrieval_score("paragraph 30", "Paragraph 3").unwrap(), 0.0);
    assert_eq!(retrieval_score("03", "Paragraph 3").unwrap(), 0.0);
    // No number at all -> 0.
    assert_eq!(
        retrieval_score("I do not know", "Paragraph 3").unwrap(),
        0.0
    );
    // gold id "12"; numbers ["12", "12", "7"] -> 2/3.
    assert!(close(
        retrieval_score("12, 12 and 7", "Paragraph 12").unwrap(),
        2.0 / 3.0
    ));
    // The gold's first "Paragraph <digits>" wins, even after a bare "Paragraph ".
    assert_eq!(
        retrieval_score("5", "Paragraph x, Paragraph 5").unwrap(),
        1.0
    );
    // Python raises IndexError here; we return an error.
    assert!(matches!(
        retrieval_score("3", "paragraph 3"),
        Err(EvalError::NoParagraphNumber(_))
    ));
}

#[test]
fn count_score_share() {
    // numbers ["5", "10"]; one equals "5" -> 1/2.
    assert_eq!(
        count_score("There are 5 unique paragraphs out of 10", "5"),
        0.5
    );
    assert_eq!(count_score("none", "5"), 0.0);
}

#[test]
fn classification_with_substring_classes() {
    let classes = ["Animal", "Plant", "Plant part"];
    // em = [Plant, Plant part]; "Plant" is in gold "Plant part" and differs -> removed;
    // em = [Plant part] -> gold in em -> 1/1.
    assert_eq!(
        classification_score("Plant part", "Plant part", &classes),
        1.0
    );
    // gold "Plant": em = [Plant, Plant part]; "Plant" == gold is kept, "Plant part" is not in
    // "Plant" -> kept; em has 2 -> 1/2.
    assert_eq!(classification_score("Plant part", "Plant", &classes), 0.5);
    // Gold not in the prediction -> 0.
    assert_eq!(classification_score("Animal", "Plant", &classes), 0.0);
}

#[test]
fn classification_reproduces_the_remove_while_iterating_skip() {
    // em = [Other, entity, Other entity] (all_classes order). Index 0: "Other" is in the gold and
    // differs -> removed, list becomes [entity, Other entity]; index 1 is now "Other entity"
    // (== gold, kept): "entity" was skipped. Final em has 2 items -> 1/2 (a "fixed" version
    // would give 1).
    let classes = ["Other", "entity", "Other entity"];
    assert_eq!(
        classification_score("Other entity", "Other entity", &classes),
        0.5
    );
}

#[test]
fn code_sim_first_code_line() {
    // Lines after lstrip('\n'): "```python" (has `), "# comment" (has #), "x = foo(1)".
    // vs gold "x = foo(2)": longest block "x = foo(" (8), then ")" (1): M = 9, T = 20,
    // ratio = 0.9 -> fuzz 90 -> 0.9. The LCS is also 9, so both backends agree.
    let pred = "\n```python\n# comment\nx = foo(1)\n";
    assert_eq!(code_sim_score(pred, "x = foo(2)"), 0.9);
    assert_eq!(
        code_sim_score_with(pred, "x = foo(2)", FuzzBackend::Levenshtein),
        0.9
    );
    // A line with "//" is skipped even when it is code (integer division).
    assert_eq!(code_sim_score("a = b // 2\nc = d", "c = d"), 1.0);
    // Only comment lines -> the empty string -> ratio 0.
    assert_eq!(code_sim_score("# a\n// b", "c = d"), 0.0);
}

#[test]
fn scorer_cuts_first_line_and_takes_best_answer() {
    // samsum: "\n\nEmilia is angry.\nDialogue: ..." -> "Emilia is angry." ; sentences
    // ["Emilia is angry"] vs ["Emilia is still angry"]: m = 4, n = 3, llcs = 3,
    // r = 3/4, p = 1, f = 2 * (0.75 / (1.75 + 1e-8)) ~= 6/7.
    let s = scorer(
        "samsum",
        "\n\nEmilia is angry.\nDialogue: William: sorry",
        &["Emilia is still angry."],
        &[] as &[&str],
    )
    .unwrap();
    assert!(close(s, 2.0 * (0.75 / (1.75 + 1e-8))));

    // trec: only "Individual" is scored; on the full text "Date" would also match (1/2).
    let classes = ["Date", "Individual", "Reason"];
    let pred = "Individual\nType: Date";
    assert_eq!(
        scorer("trec", pred, &["Individual"], &classes).unwrap(),
        1.0
    );
    assert_eq!(
        Metric::Classification
            .score(pred, "Individual", &classes)
            .unwrap(),
        0.5
    );

    // qasper, two golds: "0.05" -> "005"; gold 1 "5 percent points." -> [5, percent, points]: 0;
    // gold 2 "0.05 F1" -> [005, f1]: common 1, p = 1, r = 1/2, F1 = 2/3. Max = 2/3.
    let s = scorer(
        "qasper",
        "0.05",
        &["5 percent points.", "0.05 F1"],
        &[] as &[&str],
    )
    .unwrap();
    assert!(close(s, 2.0 / 3.0));

    // No gold answers -> 0 (the max starts at 0).
    assert_eq!(
        scorer("qasper", "x", &[] as &[&str], &[] as &[&str]).unwrap(),
        0.0
    );
    assert!(matches!(
        scorer("dureader", "x", &["y"], &[] as &[&str]),
        Err(EvalError::UnknownTask(_))
    ));
}

#[test]
fn prepare_prediction_only_for_first_line_tasks() {
    assert_eq!(prepare_prediction("trec", "\n\nA\nB"), "A");
    assert_eq!(prepare_prediction("samsum", ""), "");
    assert_eq!(prepare_prediction("narrativeqa", "\n\nA\nB"), "\n\nA\nB");
}

#[test]
fn metric_table_matches_dataset2metric() {
    use Metric::*;
    for (t, m) in [
        ("narrativeqa", QaF1),
        ("qasper", QaF1),
        ("multifieldqa_en", QaF1),
        ("gov_report", Rouge),
        ("samsum", Rouge),
        ("passage_retrieval_en", Retrieval),
        ("trec", Classification),
        ("lcc", CodeSim),
        ("repobench-p", CodeSim),
        ("passage_count", Count),
    ] {
        assert_eq!(Metric::for_task(t), Some(m), "{t}");
    }
    for t in crate::longbench::tasks() {
        assert!(
            Metric::for_task(t).is_some(),
            "{t} has a template but no metric"
        );
    }
}

#[test]
fn task_score_and_python_rounding() {
    // (1 + 0.5 + 0) / 3 * 100 = 50.
    assert!(close(task_score(&[1.0, 0.5, 0.0]).unwrap(), 50.0));
    assert_eq!(task_score(&[]), None);
    // Python: round(0.125, 2) = 0.12, round(0.375, 2) = 0.38 (exact binary ties, to even);
    // round(2.675, 2) = 2.67 and round(12.345, 2) = 12.35 (binary value below / above the tie).
    assert_eq!(round_py(0.125, 2), 0.12);
    assert_eq!(round_py(0.375, 2), 0.38);
    assert_eq!(round_py(2.675, 2), 2.67);
    assert_eq!(round_py(12.345, 2), 12.35);
    assert_eq!(round_py(2.5, 0), 2.0);
}
