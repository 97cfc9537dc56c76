//! Commands whose reader goes away before they print (`dustin ... | head -0`) end as they
//! would with the reader there: exit 0, no panic, their files written.

mod common;

use std::path::Path;
use std::process::Command;

/// Runs `dustin ARGS` with its standard output closed before anything is printed:
/// `(exit code, stderr)`.
fn closed_stdout(args: &[&str]) -> (Option<i32>, String) {
    let o = common::closed_stdout(Command::new(env!("CARGO_BIN_EXE_dustin")).args(args));
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn demo_ppl_eval_and_fetch_survive_a_closed_standard_output() {
    let dir = common::scratch("closed-stdout-cmds");
    let model = common::tiny_model(&dir, 4096);
    let m = model.to_str().unwrap();
    let words: Vec<String> = (0..900).map(|i| format!("t{}", 1 + i % 95)).collect();
    let text = dir.join("book.txt");
    std::fs::write(&text, words.join(" ")).unwrap();
    let t = text.to_str().unwrap();
    let (demo_out, eval_out, cache) = (dir.join("demo"), dir.join("pg19"), dir.join("cache"));
    let (d, e, c) = (
        demo_out.to_str().unwrap(),
        eval_out.to_str().unwrap(),
        cache.to_str().unwrap(),
    );
    let (demo_json, pg19_json) = (demo_out.join("demo.json"), eval_out.join("pg19.json"));
    let runs: Vec<(Vec<&str>, Option<&Path>)> = vec![
        (
            vec![
                "demo",
                "--model",
                m,
                "--draft",
                m,
                "--max-new-tokens",
                "4",
                "--prompt-file",
                t,
                "--selectors",
                "dense",
                "--budget",
                "64",
                "--out",
                d,
            ],
            Some(&demo_json),
        ),
        (
            vec!["ppl", "--model", m, "--text-file", t, "--tokens", "64"],
            None,
        ),
        (
            vec![
                "eval",
                "pg19",
                "--model",
                m,
                "--draft",
                "self:layers=1",
                "--data",
                t,
                "--ctx",
                "600",
                "--budget",
                "96",
                "--selectors",
                "dense,streaming",
                "--windows",
                "1",
                "--out",
                e,
            ],
            Some(&pg19_json),
        ),
        (vec!["fetch-model", "--list", "--cache", c], None),
    ];
    for (args, file) in runs {
        let (code, err) = closed_stdout(&args);
        assert_eq!(code, Some(0), "{}: {err}", args[0]);
        assert!(!err.contains("panicked"), "{}: {err}", args[0]);
        if let Some(f) = file {
            assert!(f.is_file(), "{}: {} not written", args[0], f.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
