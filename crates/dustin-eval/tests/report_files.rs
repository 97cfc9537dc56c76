//! Report outputs written to disk: SVG plot, Markdown and JSON tables, the resumable store.

mod common;

use dustin_eval::report::{plot_lines, Cell, ResultStore, Table};

#[test]
fn svg_plot_is_written() {
    let dir = common::temp_dir("plot");
    let path = dir.join("accept.svg");
    let series = vec![
        ("dense", vec![(1.0, 0.9), (2.0, 0.8), (4.0, 0.7)]),
        (
            "sparse k=64",
            vec![(1.0, 0.6), (2.0, f64::NAN), (4.0, 0.65)],
        ),
        ("empty", vec![]),
    ];
    plot_lines(
        &path,
        "Acceptance vs draft length",
        "draft tokens",
        "acceptance",
        &series,
    )
    .unwrap();
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    for text in [
        "Acceptance vs draft length",
        "draft tokens",
        "acceptance",
        "dense",
        "sparse k=64",
    ] {
        assert!(svg.contains(text), "{text} missing");
    }
    assert!(svg.contains("<polyline"));

    // A single point and no series at all still give a valid file.
    plot_lines(
        dir.join("one.svg"),
        "t",
        "x",
        "y",
        &[("p", vec![(3.0, 3.0)])],
    )
    .unwrap();
    plot_lines::<&str>(dir.join("none.svg"), "t", "x", "y", &[]).unwrap();
    assert!(std::fs::read_to_string(dir.join("none.svg"))
        .unwrap()
        .contains("</svg>"));
}

#[test]
fn table_files() {
    let dir = common::temp_dir("table");
    let mut t = Table::new(["task", "score", "n"]).with_precision(1);
    t.push_row(["trec".into(), 37.5.into(), Cell::from(8usize)])
        .unwrap();
    t.write_markdown(dir.join("t.md")).unwrap();
    t.write_json(dir.join("t.json")).unwrap();
    let md = std::fs::read_to_string(dir.join("t.md")).unwrap();
    assert_eq!(
        md,
        "| task | score |   n |\n| ---- | ----: | --: |\n| trec |  37.5 | 8.0 |\n"
    );
    let back = Table::from_json(&std::fs::read_to_string(dir.join("t.json")).unwrap()).unwrap();
    assert_eq!(back, t);
}

#[test]
fn store_resumes_after_a_torn_write() {
    let dir = common::temp_dir("store");
    let path = dir.join("sub/run.jsonl");
    {
        let mut s = ResultStore::open(&path).unwrap();
        for k in ["s0", "s1"] {
            s.append(k, &serde_json::json!({"score": 1.0})).unwrap();
        }
    }
    // Simulate a crash in the middle of writing the third record.
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"{\"key\":\"s2\",\"value\":{\"sc").unwrap();
    drop(f);

    let mut s = ResultStore::open(&path).unwrap();
    assert_eq!(s.len(), 2);
    assert_eq!(s.warnings().len(), 1);
    let todo: Vec<&str> = ["s0", "s1", "s2", "s3"]
        .into_iter()
        .filter(|k| !s.is_done(k))
        .collect();
    assert_eq!(todo, ["s2", "s3"]);
    for k in todo {
        s.append(k, &serde_json::json!({"score": 0.0})).unwrap();
    }
    let (recs, warns) = ResultStore::read::<serde_json::Value>(&path).unwrap();
    assert!(warns.is_empty());
    assert_eq!(recs.len(), 4);
}
