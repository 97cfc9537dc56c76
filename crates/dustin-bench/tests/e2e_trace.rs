//! `dustin-bench e2e --accept-trace`: a recorded acceptance trace replays as recorded, each
//! mode takes its own selector's cells at the row's budget fraction, and a file without a
//! matching cell is refused with what it holds.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::fixture;

/// Two cells as `dustin eval acceptance` stores them: dense at context 180 (drafts accepted
/// 3, 0, 2, 4, then 9, beyond gamma 4) and `dustin` at budget 90 of 180 (1, 1).
const CELLS: &str = r#"{"key":"a|dense","value":{"source":"a","ctx":180,"mode":"dense","selector":"dense","budget_tokens":0,"accepted":[3,0,2,4,9]}}
{"key":"a|dustin@90","value":{"source":"a","ctx":180,"mode":"dustin@90","selector":"dustin","budget_tokens":90,"accepted":[1,1]}}
{"key":"a|ar","value":{"source":"a","ctx":180,"mode":"autoregressive","selector":"","budget_tokens":0,"accepted":[]}}
"#;

/// `e2e` on the fixture at context 180, batch 1, budget 90, one warm-up and 3 timed
/// iterations of `modes` under the trace file `trace`; rows written to `json`.
fn run(trace: &Path, json: &Path, modes: &str) -> Output {
    let f = fixture();
    Command::new(env!("CARGO_BIN_EXE_dustin-bench"))
        .args(["e2e", "--target", &f, "--draft", &f])
        .args([
            "--ctx", "180", "--batch", "1", "--modes", modes, "--warmup", "1", "--iters", "3",
            "--tail", "40", "--budget", "90",
        ])
        .arg("--accept-trace")
        .arg(trace)
        .arg("--json")
        .arg(json)
        .output()
        .unwrap()
}

#[test]
fn a_recorded_trace_replays_per_mode() {
    let dir = std::env::temp_dir().join(format!("dustin-e2e-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("results.jsonl");
    std::fs::write(&trace, CELLS).unwrap();
    let json = dir.join("rows.jsonl");
    let out = run(&trace, &json, "ar,dense,dustin");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let row = |m: &str| rows.iter().find(|r| r["mode"] == m).expect(m);
    // dense: the trace capped at gamma is 3, 0, 2, 4, 4 (mean 2.6, tau 3.6); the timed
    // iterations 1..=3 accept 0, 2, 4: tau 3 in the window
    assert_eq!(row("dense")["tau"].as_f64(), Some(3.6));
    assert_eq!(row("dense")["tau_measured"].as_f64(), Some(3.0));
    // dustin's own cell: 1, 1
    assert_eq!(row("dustin")["tau"].as_f64(), Some(2.0));
    assert_eq!(row("dustin")["tau_measured"].as_f64(), Some(2.0));
    assert_eq!(row("ar")["tau_measured"].as_f64(), Some(1.0));
    // tokens/s follow the window's tau: 3 tokens an iteration for dense
    let d = row("dense");
    let want = 3.0 / (d["iter_ms"].as_f64().unwrap() / 1e3);
    let got = d["tokens_per_sec"].as_f64().unwrap();
    assert!((got - want).abs() <= 1e-9 * want, "{got} vs {want}");

    // no cell for quest: refused before the `ar` row is measured, naming the mode and what
    // the file holds
    let out = run(&trace, &json, "ar,quest");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no cell for mode quest") && err.contains("dustin@0.5000"),
        "{err}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("| ar |"),
        "the ar row ran first"
    );
    // a file that is not cell records: refused, naming the line
    std::fs::write(&trace, "not json\n").unwrap();
    let out = run(&trace, &json, "dense");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1") && err.contains("not JSON"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
