//! The original LongBench JSONL layout: loading, prompt rendering, and error messages.

mod common;

use dustin_eval::longbench::{load_jsonl_file, PromptSource};
use dustin_eval::EvalError;

fn write(name: &str, content: &str) -> std::path::PathBuf {
    let p = common::temp_dir(name).join("trec.jsonl");
    std::fs::write(&p, content).unwrap();
    p
}

#[test]
fn loads_records_and_renders_the_trec_prompt() {
    let p = write(
        "ok",
        concat!(
            r#"{"input": "What is X ?", "context": "Question: Who ?\nType: Individual", "answers": ["Definition of something"], "length": 7, "dataset": "trec", "language": "en", "all_classes": ["Individual", "Definition of something"], "_id": "abc"}"#,
            "\n\n",
            r#"{"input": "q", "context": "c", "answers": ["Paragraph 2"], "length": 3, "dataset": "passage_retrieval_en", "all_classes": null, "_id": "def"}"#,
            "\n"
        ),
    );
    let v = load_jsonl_file(&p).unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[0].id, "abc");
    assert_eq!(v[0].task, "trec");
    assert_eq!(v[0].length, Some(7));
    assert_eq!(v[0].all_classes, ["Individual", "Definition of something"]);
    assert!(matches!(v[0].prompt, PromptSource::Parts { .. }));
    // trec template: "Please determine the type of the question below. Here are some examples of
    // questions.\n\n{context}\n{input}".
    assert_eq!(
        v[0].prompt().unwrap(),
        "Please determine the type of the question below. Here are some examples of questions.\n\n\
         Question: Who ?\nType: Individual\nWhat is X ?"
    );
    assert_eq!(v[0].max_new_tokens(), Some(64));
    assert!(v[1].all_classes.is_empty());
    assert_eq!(v[1].max_new_tokens(), Some(32));
    assert!(v[1].prompt().unwrap().ends_with("\n\nThe answer is: "));
}

#[test]
fn missing_field_names_file_line_and_field() {
    let p = write(
        "missing",
        concat!(
            r#"{"input": "q", "context": "c", "answers": ["a"], "length": 1, "dataset": "qasper", "all_classes": null, "_id": "1"}"#,
            "\n",
            r#"{"input": "q", "answers": ["a"], "length": 1, "dataset": "qasper", "all_classes": null, "_id": "2"}"#,
            "\n"
        ),
    );
    let e = load_jsonl_file(&p).unwrap_err();
    match &e {
        EvalError::MissingField {
            path,
            line,
            id,
            field,
        } => {
            assert_eq!(path, &p);
            assert_eq!(*line, Some(2));
            assert_eq!(id.as_deref(), Some("2"));
            assert_eq!(field, "context");
        }
        other => panic!("unexpected {other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("trec.jsonl:2") && msg.contains("`context`"),
        "{msg}"
    );
}

#[test]
fn bad_json_and_bad_types_are_reported_with_lines() {
    let p = write("badjson", "{\"_id\": \"1\",\n");
    let e = load_jsonl_file(&p).unwrap_err();
    assert!(matches!(e, EvalError::Json { line: Some(1), .. }), "{e}");

    let p = write(
        "badtype",
        r#"{"input": "q", "context": "c", "answers": "oops", "dataset": "qasper", "_id": "9"}"#,
    );
    let e = load_jsonl_file(&p).unwrap_err();
    match &e {
        EvalError::BadField { line, field, .. } => {
            assert_eq!(*line, Some(1));
            assert_eq!(field, "answers");
        }
        other => panic!("unexpected {other}"),
    }

    let p = write(
        "badlen",
        r#"{"input": "q", "context": "c", "answers": ["a"], "length": -3, "dataset": "qasper", "_id": "9"}"#,
    );
    assert!(matches!(
        load_jsonl_file(&p).unwrap_err(),
        EvalError::BadField { ref field, .. } if field == "length"
    ));

    let e = load_jsonl_file(common::temp_dir("nofile").join("nope.jsonl")).unwrap_err();
    assert!(matches!(e, EvalError::Io { .. }));
}
