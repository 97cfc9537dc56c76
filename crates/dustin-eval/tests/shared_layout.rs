//! The MiniLongBench layout on small hand-written files: every accepted `gold` form.

mod common;

use dustin_eval::longbench::load_shared_file;
use dustin_eval::EvalError;

#[test]
fn gold_forms() {
    let dir = common::temp_dir("shared-forms");
    let p = dir.join("narrativeqa.json");
    std::fs::write(
        &p,
        r#"{
          "10": {"origin_prompt": "P10", "prediction": "x", "gold": "['a', \"b's\"]", "time": 1.0},
          "2":  {"origin_prompt": "P2", "gold": ["c"]},
          "3":  {"origin_prompt": "P3", "gold": {"answers": "['d']", "all_classes": ["d", "e"]}}
        }"#,
    )
    .unwrap();
    let v = load_shared_file(&p).unwrap();
    let ids: Vec<&str> = v.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["2", "3", "10"]);
    assert!(v.iter().all(|s| s.task == "narrativeqa"));
    assert_eq!(v[2].answers, ["a", "b's"]);
    assert_eq!(v[2].other_prediction.as_deref(), Some("x"));
    assert_eq!(v[0].answers, ["c"]);
    assert_eq!(v[0].other_prediction, None);
    assert_eq!(v[1].answers, ["d"]);
    assert_eq!(v[1].all_classes, ["d", "e"]);
    assert_eq!(v[1].prompt().unwrap(), "P3");
}

#[test]
fn bad_gold_names_the_sample() {
    let dir = common::temp_dir("shared-bad");
    let p = dir.join("qasper.json");
    std::fs::write(&p, r#"{"0": {"origin_prompt": "P", "gold": "['a', 'b"}}"#).unwrap();
    let e = load_shared_file(&p).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(&e, EvalError::BadField { id: Some(id), field, .. } if id == "0" && field == "gold"),
        "{msg}"
    );
    assert!(
        msg.contains("qasper.json") && msg.contains("unterminated"),
        "{msg}"
    );

    std::fs::write(&p, r#"{"0": {"gold": ["a"]}}"#).unwrap();
    assert!(matches!(
        load_shared_file(&p).unwrap_err(),
        EvalError::MissingField { ref field, .. } if field == "origin_prompt"
    ));
}
