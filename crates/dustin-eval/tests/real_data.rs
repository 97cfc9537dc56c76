//! The loaders on the real shared files (skipped with a note where the folder is absent).

mod common;

use dustin_eval::longbench::{self, PromptSource};
use dustin_eval::metrics::{self, Metric};
use dustin_eval::pg19;

#[test]
fn pg19_books_load_and_are_stripped() {
    let Some(dir) = common::shared_data("pg19") else {
        return;
    };
    let books = pg19::load_dir(&dir).unwrap();
    let ids: Vec<&str> = books.iter().map(|b| b.id.as_str()).collect();
    // Sorted by file name: "10762.txt" < "15562.txt" < "2544.txt".
    assert_eq!(ids, ["10762", "15562", "2544"]);
    for b in &books {
        assert!(b.markers.complete(), "{}: markers {:?}", b.id, b.markers);
        assert!(!b.latin1);
        assert!(!b.text.contains('\r'), "{}: CR left", b.id);
        assert!(
            !b.text.contains("Project Gutenberg"),
            "{}: licence text left",
            b.id
        );
        assert!(!b.text.contains("*** START") && !b.text.contains("***END"));
        assert!(!b.text.starts_with('\n') && !b.text.ends_with('\n'));
    }

    // 2544.txt: line 19 is "*** START OF THIS PROJECT GUTENBERG EBOOK FROM SAND HILL TO PINE ***",
    // lines 20-23 are blank, line 24 "Produced by Donald Lainson", then the title at line 30.
    // Line 6689 "End of the Project Gutenberg EBook of From Sand Hill to Pine, by Bret Harte"
    // starts the footer; the last book line before it (line 6683) is "Caltons.".
    let b = &books[2];
    assert!(b
        .text
        .starts_with("Produced by Donald Lainson\n\n\n\n\n\nFROM SAND HILL TO PINE\n"));
    assert!(b.text.ends_with("without meeting the\nCaltons."));
    // Lines 24..=6683 of the file.
    assert_eq!(b.text.lines().count(), 6683 - 24 + 1);

    // 10762.txt: START at line 20, body from line 25 "Produced by Afra Ullah and the Online
    // Distributed" to line 5522 "THE END.", footer "End of Project Gutenberg's ..." at 5531.
    let b = &books[0];
    assert!(b
        .text
        .starts_with("Produced by Afra Ullah and the Online Distributed\n"));
    assert!(b.text.ends_with("\n\n\nTHE END."));
    assert_eq!(b.text.lines().count(), 5522 - 25 + 1);
    assert!(b.text.contains("IMPRESSIONS OF THEOPHRASTUS SUCH"));

    // 15562.txt: "***START OF THE PROJECT GUTENBERG EBOOK THE S. W. F. CLUB***" (line 25), body
    // from line 28 "E-text prepared by Al Haines" to line 5408, end marker
    // "***END OF THE PROJECT GUTENBERG EBOOK THE S. W. F. CLUB***" at line 5412.
    let b = &books[1];
    assert!(b
        .text
        .starts_with("E-text prepared by Al Haines\n\n\n\nTHE S. W. F. CLUB\n"));
    assert!(b
        .text
        .ends_with("treble,--\"'There's a Good Time Coming.'\""));
    assert_eq!(b.text.lines().count(), 5408 - 28 + 1);
}

#[test]
fn every_shared_longbench_file_loads() {
    let Some(dir) = common::shared_data("longbench") else {
        return;
    };
    let all = longbench::load_shared_dir(&dir).unwrap();
    let counts: Vec<(&str, usize)> = all.iter().map(|(t, s)| (t.as_str(), s.len())).collect();
    assert_eq!(
        counts,
        [
            ("gov_report", 12),
            ("multifieldqa_en", 7),
            ("narrativeqa", 6),
            ("passage_retrieval_en", 15),
            ("qasper", 9),
            ("samsum", 15),
            ("trec", 8),
        ]
    );
    for task in longbench::SHARED_TASKS {
        assert!(all.contains_key(task), "{task} missing");
    }
    for (task, samples) in &all {
        let metric = Metric::for_task(task).unwrap();
        for (i, s) in samples.iter().enumerate() {
            assert_eq!(s.id, i.to_string(), "ids in numeric order");
            assert_eq!(&s.task, task);
            assert!(!s.answers.is_empty(), "{task}/{}: no gold", s.id);
            assert!(s.answers.iter().all(|a| !a.trim().is_empty()));
            assert!(matches!(s.prompt, PromptSource::Rendered(_)));
            let prompt = s.prompt().unwrap();
            assert!(prompt.len() > 5_000, "{task}/{}: short prompt", s.id);
            assert!(s.other_prediction.is_some());
            assert_eq!(s.max_new_tokens(), longbench::max_new_tokens(task));
            // Scoring the gold answer against itself works for every task; its value is the
            // metric's maximum (1 for F1/retrieval/classification, 1 - tiny for Rouge-L).
            let self_score =
                metrics::scorer(task, &s.answers[0], &s.answers, &s.all_classes).unwrap();
            let expected_max = if metric == Metric::Rouge { 0.9999 } else { 1.0 };
            assert!(self_score >= expected_max, "{task}/{}: {self_score}", s.id);
        }
    }

    let gov = &all["gov_report"][0];
    assert!(gov
        .prompt()
        .unwrap()
        .starts_with("You are given a report by a government agency. Write a one-page summary"));
    assert!(gov.prompt().unwrap().ends_with("\n\nSummary:"));
    assert_eq!(gov.max_new_tokens(), Some(512));

    // qasper sample 0 has two gold answers.
    assert_eq!(all["qasper"][0].answers, ["5 percent points.", "0.05 F1"]);

    // passage_retrieval_en: golds are "Paragraph N", N in 1..=30, and the prompt lists 30.
    for s in &all["passage_retrieval_en"] {
        assert_eq!(s.answers.len(), 1);
        let n: u32 = s.answers[0]
            .strip_prefix("Paragraph ")
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=30).contains(&n));
        let p = s.prompt().unwrap();
        assert!(p.contains("\n\nParagraph 30: ") && !p.contains("\n\nParagraph 31: "));
    }
    assert_eq!(all["passage_retrieval_en"][0].answers, ["Paragraph 19"]);

    // trec: gold is {all_classes (50 TREC types), answers}; the answer is one of the classes.
    for s in &all["trec"] {
        assert_eq!(s.all_classes.len(), 50);
        assert!(s.all_classes.contains(&s.answers[0]));
        assert!(s.prompt().unwrap().ends_with("\nType:"));
    }
    assert_eq!(all["trec"][0].answers, ["Individual"]);
    // Other tasks have no classes.
    assert!(all["samsum"].iter().all(|s| s.all_classes.is_empty()));
    assert_eq!(all["samsum"][0].answers, ["Emilia is still angry."]);
}
