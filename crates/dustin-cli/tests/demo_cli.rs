//! `dustin demo` on the tiny 2-layer model of `common` drafting for itself: bad selectors,
//! budgets, prompt files and output folders are refused before any mode decodes, and dense
//! verification runs on a prompt shorter than the selectors' sinks and window.

mod common;

use std::path::Path;
use std::process::Command;

/// `dustin demo` with the tiny model as target and draft, 4 new tokens per mode.
fn demo(model: &Path, args: &[&str]) -> (Option<i32>, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_dustin"))
        .arg("demo")
        .arg("--model")
        .arg(model)
        .arg("--draft")
        .arg(model)
        .args(["--max-new-tokens", "4"])
        .args(args)
        .output()
        .expect("run dustin");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bad_demo_inputs_are_refused_before_decoding() {
    let dir = common::scratch("demo-bad");
    let model = common::tiny_model(&dir, 4096);
    let prompt = dir.join("prompt.txt");
    let words: Vec<String> = (0..100).map(|i| format!("t{}", 1 + i % 95)).collect();
    std::fs::write(&prompt, words.join(" ")).unwrap();
    let empty = dir.join("empty.txt");
    std::fs::write(&empty, " \n").unwrap();
    let a_file = dir.join("a-file");
    std::fs::write(&a_file, "x").unwrap();
    let missing = dir.join("missing.txt");
    let out = dir.join("out");
    let (prompt, empty, a_file, missing, out) = (
        prompt.to_str().unwrap(),
        empty.to_str().unwrap(),
        a_file.to_str().unwrap(),
        missing.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let empty_msg = format!("--prompt-file {empty}: no text");
    let missing_msg = format!("--prompt-file {missing}: No such file");
    let a_file_msg = format!("--out {a_file}: a file, expected a folder");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--selectors", "streaming,nope"],
            "--selectors \"nope\": unknown selector `nope`",
        ),
        (
            vec!["--selectors", ""],
            "--selectors \"\": unknown selector",
        ),
        (
            vec!["--selectors", "streaming", "--budget", "20"],
            "--selectors streaming --budget 20: selector streaming: invalid `budget`",
        ),
        (vec!["--budget", "0"], "--budget 0: expected 1 ..= 99"),
        (vec!["--budget", "500"], "--budget 500: expected 1 ..= 99"),
        (vec!["--gamma", "0"], "--gamma 0: expected 1 ..= 15"),
        (
            vec!["--draft-budget", "5"],
            "--draft-budget 5: expected more than",
        ),
    ];
    for (args, want) in cases {
        let (code, err) = demo(
            &model,
            &[&["--prompt-file", prompt, "--out", out], &args[..]].concat(),
        );
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        // no mode ran
        assert!(!err.contains("[1/"), "{args:?}: {err}");
    }
    for (args, want) in [
        (vec!["--prompt-file", empty, "--out", out], &empty_msg),
        (vec!["--prompt-file", missing, "--out", out], &missing_msg),
        (vec!["--prompt-file", prompt, "--out", a_file], &a_file_msg),
    ] {
        let (code, err) = demo(&model, &args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(want.as_str()), "{args:?}: {err}");
        assert!(!err.contains("[1/"), "{args:?}: {err}");
    }
    // a prompt of 10 tokens, shorter than the sinks and window: dense verification runs
    let short = dir.join("short.txt");
    std::fs::write(&short, words[..10].join(" ")).unwrap();
    let (code, err) = demo(
        &model,
        &[
            "--prompt-file",
            short.to_str().unwrap(),
            "--selectors",
            "dense",
            "--budget",
            "5",
            "--out",
            out,
        ],
    );
    assert_eq!(code, Some(0), "{err}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(Path::new(out).join("demo.json")).unwrap())
            .unwrap();
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for r in results {
        assert_eq!(r["tokens"], 4, "{r}");
        assert_eq!(r["identical_prefix"], 4, "{r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
