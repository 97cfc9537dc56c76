//! `dustin bench-e2e` on the CPU with a tiny fixture model: every mode runs the real engine
//! under the forced acceptance schedule, the rows report the schedule's tau exactly, dense
//! verification reads the whole KV and sparse modes the budget's share; bad input is named.

use std::process::Command;

fn fixture() -> String {
    format!(
        "{}/../dustin-qwen/tests/fixtures/parity/llama/config.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

#[test]
fn every_mode_runs_under_the_schedule() {
    let dir = std::env::temp_dir().join(format!("dustin-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("rows.jsonl");
    let f = fixture();
    let out = Command::new(env!("CARGO_BIN_EXE_dustin"))
        .args([
            "bench-e2e",
            "--target",
            &f,
            "--draft",
            &f,
            "--ctx",
            "180",
            "--batch",
            "2",
        ])
        .args(["--modes", "ar,dense,dustin,streaming,quest,snapkv"])
        .args([
            "--accept",
            "default=2.5,dustin=2.0",
            "--warmup",
            "1",
            "--iters",
            "4",
        ])
        .args(["--tail", "40", "--budget", "90", "--json"])
        .arg(&json)
        .output()
        .unwrap();
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
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(
        modes,
        ["ar", "dense", "dustin", "streaming", "quest", "snapkv"]
    );
    for r in &rows {
        let mode = r["mode"].as_str().unwrap();
        let tau = r["tau_measured"].as_f64().unwrap();
        // schedule 1.5 accepted: iterations 1..=4 accept 2, 1, 2, 1 -> tau 2.5; 1.0 -> 2.0
        let want = match mode {
            "ar" => 1.0,
            "dustin" => 2.0,
            _ => 2.5,
        };
        assert_eq!(tau, want, "{mode}");
        assert_eq!(r["tau"].as_f64().unwrap(), want, "{mode}");
        let kv = r["kv_read"].as_f64().unwrap();
        if mode == "ar" || mode == "dense" {
            assert_eq!(kv, 1.0, "{mode}");
        } else {
            // 90 of 180-odd context tokens
            assert!(kv > 0.4 && kv < 0.6, "{mode}: {kv}");
        }
        let est = r["estimation_read"].as_f64().unwrap();
        assert_eq!(
            est > 0.0,
            mode == "dustin" || mode == "quest",
            "{mode}: {est}"
        );
        assert!(r["iter_ms"].as_f64().unwrap() > 0.0);
        assert!(r["floor_bytes"].as_f64().unwrap() > 0.0);
        let tps = r["tokens_per_sec"].as_f64().unwrap();
        let expect = 2.0 * tau / (r["iter_ms"].as_f64().unwrap() / 1e3);
        assert!((tps - expect).abs() < 1e-6 * expect, "{mode}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_schedule_and_modes_are_named() {
    let f = fixture();
    for (args, want) in [
        (vec!["--accept", "dustin=9"], "--accept"),
        (vec!["--modes", "nonsense"], "--modes"),
        (vec!["--ctx", "30", "--tail", "40"], "--tail"),
        (
            vec!["--budget", "10", "--modes", "ar,streaming"],
            "--budget 10",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_dustin"))
            .args(["bench-e2e", "--target", &f, "--draft", &f])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
