//! `dustin ppl` on the tiny 2-layer model: bad counts are named before the model loads.

mod common;

use std::process::Command;

#[test]
fn bad_token_and_chunk_counts_are_named() {
    let dir = common::scratch("ppl-bad");
    let model = common::tiny_model(&dir, 256);
    let text = dir.join("t.txt");
    std::fs::write(&text, "t1 t2 t3 t4 t5 t6").expect("text");
    // `dustin ppl --model <tiny> --text-file t.txt ARGS`
    let ppl = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dustin"))
            .args(["ppl", "--model"])
            .arg(&model)
            .arg("--text-file")
            .arg(&text)
            .args(args)
            .output()
            .expect("run dustin")
    };
    for (flag, value, want) in [
        ("--tokens", "0", "--tokens 0: expected at least 2"),
        ("--tokens", "1", "--tokens 1: expected at least 2"),
        ("--chunk", "0", "--chunk 0: expected at least 1 token"),
    ] {
        let o = ppl(&[flag, value]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{flag} {value}: {err}");
        assert!(err.contains(want), "{flag} {value}: {err}");
    }
    // and a good run scores the 6 tokens
    let o = ppl(&[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("over 5 predictions"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
