//! `dustin-bench tp-check` and `dustin-bench bench` on the CPU with the tiny fixture
//! model: the split model matches the whole one and bad splits are named; sizes that cannot
//! run are named before any weights are built.

mod common;

use std::process::Command;

use common::fixture;

#[test]
fn tp_check_matches_the_whole_model_and_names_bad_splits() {
    let f = fixture();
    let out = Command::new(env!("CARGO_BIN_EXE_dustin-bench"))
        .args([
            "tp-check",
            "--target",
            &f,
            "--target-layers",
            "2",
            "--tp",
            "2",
        ])
        .args(["--ctx", "12", "--steps", "3"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
    assert_eq!(report["ranks_identical"], true);
    assert!(report["rel_diff"].as_f64().unwrap() <= 1e-4, "{report}");
    assert!(report["max_abs_logit"].as_f64().unwrap() > 0.0);
    // 7 query heads over 1 KV head do not split over 2 ranks
    let gqa7 = f.replace("/llama/", "/qwen2-gqa7/");
    let out = Command::new(env!("CARGO_BIN_EXE_dustin-bench"))
        .args([
            "tp-check",
            "--target",
            &gqa7,
            "--target-layers",
            "2",
            "--tp",
            "2",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("num_attention_heads") && err.contains("2 ranks"),
        "{err}"
    );
    // ... and is refused before the whole model is drawn and traced
    assert!(!err.contains("traced"), "{err}");
    // sizes that cannot run are named up front (an overflowing sum, too many steps)
    for (args, want) in [
        (
            ["--ctx", "18446744073709551615", "--steps", "8"],
            "at most 16777216 tokens in all",
        ),
        (
            ["--ctx", "16", "--steps", "20000"],
            "--steps 20000: at most 10000",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_dustin-bench"))
            .args(["tp-check", "--target", &f])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// `dustin-bench bench` refuses sizes that panicked (`--batch 0` indexed an empty prompt list) or
/// wrapped, naming the flag, before any weights are built.
#[test]
fn bench_sizes_are_named() {
    let f = fixture();
    for (args, want) in [
        (
            vec!["--batch", "0"],
            "--batch 0: expected at least 1 sequence",
        ),
        (
            vec!["--prompt-len", "0"],
            "--prompt-len 0: expected at least 1",
        ),
        (vec!["--decode", "0"], "--decode 0: nothing would be timed"),
        (
            vec!["--prefill-warps", "4,6"],
            "--prefill-warps 6: expected 4 or 8",
        ),
        (
            vec!["--prompt-len", "18446744073709551615"],
            "at most 16777216 positions",
        ),
        (
            vec!["--warmup", "18446744073709551615", "--prompt-len", "20"],
            "at most 16777216 positions",
        ),
        (
            vec!["--batch", "100000000000", "--prompt-len", "20"],
            "--batch 100000000000 x --prompt-len 20: at most 16777216 prompt tokens in all",
        ),
    ] {
        // small defaults for the flags a case does not set
        let mut all: Vec<&str> = vec!["bench", "--config", &f];
        for (flag, v) in [("--decode", "2"), ("--warmup", "1")] {
            if !args.contains(&flag) {
                all.extend([flag, v]);
            }
        }
        let out = Command::new(env!("CARGO_BIN_EXE_dustin-bench"))
            .args(&all)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
