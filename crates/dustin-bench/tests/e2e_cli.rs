//! `dustin-bench e2e` on the CPU with a tiny fixture model: every mode runs the real engine
//! under the forced acceptance schedule, the rows report the schedule's tau exactly, dense
//! verification reads the whole KV and sparse modes the budget's share; bad input is named.

mod common;

use std::process::Command;

use common::fixture;

/// Rows of `e2e` on the llama fixture (target and draft) with `args` after the models.
fn bench_rows(tag: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let dir = std::env::temp_dir().join(format!("dustin-e2e-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("rows.jsonl");
    let f = fixture();
    let out = Command::new(env!("CARGO_BIN_EXE_dustin-bench"))
        .args(["e2e", "--target", &f, "--draft", &f])
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    rows
}

/// [`bench_rows`] of the small shape most tests share: context 180 (a real tail of 40),
/// batch 2, budget 90, 1 warm-up and `iters` timed iterations of `modes`, then `extra`.
fn small_rows(tag: &str, modes: &str, iters: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "--ctx", "180", "--batch", "2", "--modes", modes, "--warmup", "1", "--iters", iters,
        "--tail", "40", "--budget", "90",
    ];
    args.extend_from_slice(extra);
    bench_rows(tag, &args)
}

#[test]
fn every_mode_runs_under_the_schedule() {
    let rows = small_rows(
        "modes",
        "ar,dense,dustin,streaming,quest,snapkv",
        "4",
        &["--accept", "default=2.5,dustin=2.0", "--grouped-gemm", "on"],
    );
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    for r in &rows {
        // the CPU has none of the CUDA kernels: the rows say the plain ops ran
        assert_eq!(r["elementwise"].as_str(), Some("plain"), "{r}");
        assert_eq!(r["skinny_gemm"].as_str(), Some("off"), "{r}");
        assert_eq!(r["grouped_gemm"].as_str(), Some("off"), "{r}");
    }
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
}

/// `--lookahead-scoring deferred,per-step`: a mode whose selector reads the draft's
/// lookahead (`dustin`) runs once per setting, `+step` marking the per-step run; a mode that
/// reads none (`dense`) runs once and says so (`null`).
#[test]
fn lookahead_scoring_list_runs_lookahead_modes_side_by_side() {
    let rows = small_rows(
        "scoring",
        "dense,dustin",
        "2",
        &["--lookahead-scoring", "deferred,per-step"],
    );
    let got: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|r| (r["mode"].as_str().unwrap(), r["lookahead_scoring"].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("dense", None),
            ("dustin", Some("deferred")),
            ("dustin+step", Some("per-step")),
        ]
    );
    for r in &rows[1..] {
        // 90 of 180-odd context tokens either way
        let kv = r["kv_read"].as_f64().unwrap();
        assert!(kv > 0.4 && kv < 0.6, "{r}");
    }
}

/// `--lookahead-layers "all;last:1;0"`: `dustin` (whose selector reads the lookahead) runs
/// once per setting, labelled and recorded as written; `dense` runs once and says `null`. On
/// the 2-layer fixture `last:1` (layer 1) and `0` (layer 0) are different signals, so at a
/// budget of half the context the selections, and with them the sparse reads, may differ;
/// the share read stays the budget's either way.
#[test]
fn lookahead_layers_list_runs_lookahead_modes_per_setting() {
    let rows = small_rows(
        "lalayers",
        "dense,dustin",
        "2",
        &["--lookahead-layers", "all;last:1;0;half"],
    );
    let got: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|r| (r["mode"].as_str().unwrap(), r["lookahead_layers"].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("dense", None),
            ("dustin+laall", Some("all")),
            ("dustin+lalast1", Some("last:1")),
            ("dustin+la0", Some("0")),
            ("dustin+lahalf", Some("half")),
        ]
    );
    for r in &rows[1..] {
        let kv = r["kv_read"].as_f64().unwrap();
        assert!(kv > 0.4 && kv < 0.6, "{r}");
    }
}

/// `--rounds 2` runs the rows of each mode twice in turn (A B A B), labelled `#1` / `#2`
/// and numbered in `round`; a mode without list settings runs twice too.
#[test]
fn rounds_interleave_the_rows_of_each_mode() {
    let rows = small_rows(
        "rounds",
        "dense,dustin",
        "2",
        &["--lookahead-layers", "all;last:1", "--rounds", "2"],
    );
    let got: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["mode"].as_str().unwrap(), r["round"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("dense#1", 1),
            ("dense#2", 2),
            ("dustin+laall#1", 1),
            ("dustin+lalast1#1", 1),
            ("dustin+laall#2", 2),
            ("dustin+lalast1#2", 2),
        ]
    );
    // the same schedule in every round
    for r in &rows {
        assert_eq!(r["tau_measured"].as_f64(), Some(2.0), "{r}");
    }
}

/// `--accept-drop-sigmas 0,3` runs `dustin` once per value. The forced schedule at tau 1.36
/// accepts nothing in two iterations of three, the same in both sequences: the rule without
/// the noise test (0) counts each such zero as a drop and recomputes, so it reads more in
/// estimation; with 3 (per-sequence sd 0.47, 3 x 0.47 / sqrt 2 = 1.0 above a running mean of
/// 0.33) it never does. `dense` runs once and says `null`. (With the phases synced, which
/// the rows record.)
#[test]
fn accept_drop_sigmas_list_runs_dustin_per_value() {
    let rows = small_rows(
        "dropsig",
        "dense,dustin",
        "8",
        &[
            "--accept",
            "default=1.36",
            "--accept-drop-sigmas",
            "0,3",
            "--sync-phases",
            "on",
        ],
    );
    assert!(rows.iter().all(|r| r["sync_phases"] == "on"), "{rows:?}");
    let got: Vec<(&str, Option<f64>)> = rows
        .iter()
        .map(|r| {
            (
                r["mode"].as_str().unwrap(),
                r["accept_drop_sigmas"].as_f64(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("dense", None),
            ("dustin+ads0", Some(0.0)),
            ("dustin+ads3", Some(3.0))
        ]
    );
    let est = |i: usize| rows[i]["estimation_read"].as_f64().unwrap();
    assert!(
        est(1) > est(2) && est(2) > 0.0,
        "{} vs {}",
        rows[1],
        rows[2]
    );
}

/// `--batched-reuse on,off` runs the `dustin` mode once per setting (`+perlayer` for the
/// layer-by-layer run) with the same selections, so the same KV share read; `streaming`
/// (no one-call path) runs once and says `null`. The CUDA-only lists run every mode once on
/// the CPU and the rows say the plain settings.
#[test]
fn batched_reuse_list_runs_dustin_both_ways_and_cuda_lists_once_on_the_cpu() {
    let rows = small_rows(
        "batched",
        "dense,dustin,streaming",
        "4",
        &[
            "--batched-reuse",
            "on,off",
            "--estimator-kernels",
            "off,on",
            "--topk-kernel",
            "block,warp",
            "--dense-waves",
            "2,8",
        ],
    );
    let got: Vec<(&str, Option<&str>)> = rows
        .iter()
        .map(|r| (r["mode"].as_str().unwrap(), r["batched_reuse"].as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("dense", None),
            ("dustin", Some("on")),
            ("dustin+perlayer", Some("off")),
            ("streaming", None),
        ]
    );
    for r in &rows {
        // one time per timed iteration, and the row's mean is theirs
        let each: Vec<f64> = r["iter_ms_each"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(each.len(), 4, "{r}");
        assert!(each.iter().all(|&t| t > 0.0), "{r}");
        let mean = each.iter().sum::<f64>() / 4.0;
        let iter_ms = r["iter_ms"].as_f64().unwrap();
        assert!((mean - iter_ms).abs() <= 1e-9 * iter_ms, "{mean} vs {r}");
        assert_eq!(r["estimator_kernels"].as_str(), Some("off"), "{r}");
        assert_eq!(r["topk_kernel"].as_str(), Some("block"), "{r}");
        // the CPU has no flash kernel: one row, at the default's 2 waves
        assert_eq!(r["dense_waves"].as_u64(), Some(2), "{r}");
    }
    let kv = |i: usize| rows[i]["kv_read"].as_f64().unwrap();
    let est = |i: usize| rows[i]["estimation_read"].as_f64().unwrap();
    assert!(kv(1) > 0.4 && kv(1) < 0.6, "{}", rows[1]);
    // the rows see the same seeded KV, so the same estimator heads and selections
    assert_eq!(kv(1), kv(2), "the same selections read the same share");
    assert!(est(1) > 0.0, "{}", rows[1]);
    assert_eq!(est(1), est(2), "the same estimator heads");
}

/// `--draft-budget 0,80`: every speculative mode runs with a dense draft and with a draft
/// that attends to 80 tokens (`+db80`), `ar` once; the sparse draft's floor is lower (it
/// reads 80 of the 180-odd draft positions per step, plus its keys once).
#[test]
fn draft_budget_list_runs_dense_and_sparse_drafts_side_by_side() {
    let rows = small_rows(
        "draftbudget",
        "ar,dense,dustin",
        "3",
        &["--draft-budget", "0,80"],
    );
    let got: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["mode"].as_str().unwrap(),
                r["draft_budget"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("ar", 0),
            ("dense", 0),
            ("dense+db80", 80),
            ("dustin", 0),
            ("dustin+db80", 80),
        ]
    );
    for pair in [(1, 2), (3, 4)] {
        let (d, s) = (&rows[pair.0], &rows[pair.1]);
        let (fd, fs) = (
            d["floor_bytes"].as_f64().unwrap(),
            s["floor_bytes"].as_f64().unwrap(),
        );
        assert!(
            fs < fd,
            "{}: sparse draft floor {fs} vs dense {fd}",
            d["mode"]
        );
        // the target's verification is the same either way
        assert_eq!(d["kv_read"], s["kv_read"], "{}", d["mode"]);
    }
}

/// `--ragged-accept on`: sequence 1 of 2 runs the schedule half a period later (0.5
/// accepted: sequence 0 accepts 0, 1, 0, 1, sequence 1 accepts 1, 0, 1, 0), so the two
/// sequences' lengths differ at every other step, through the dense and the sparse
/// verification. Each still averages 0.5 over the four timed iterations: tau 1.5.
#[test]
fn ragged_schedule_keeps_the_mean_and_runs_every_selector() {
    let rows = bench_rows(
        "ragged",
        &[
            "--ctx",
            "150",
            "--batch",
            "2",
            "--modes",
            "ar,dense,dustin,snapkv",
            "--accept",
            "default=1.5",
            "--warmup",
            "1",
            "--iters",
            "4",
            "--tail",
            "30",
            "--budget",
            "70",
            "--ragged-accept",
            "on",
            "--kv-write-kernel",
            "on",
        ],
    );
    let modes: Vec<&str> = rows.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["ar", "dense", "dustin", "snapkv"]);
    for r in &rows {
        let mode = r["mode"].as_str().unwrap();
        let want = if mode == "ar" { "off" } else { "on" };
        assert_eq!(r["ragged_accept"].as_str(), Some(want), "{r}");
        let tau = r["tau_measured"].as_f64().unwrap();
        assert_eq!(tau, if mode == "ar" { 1.0 } else { 1.5 }, "{mode}");
    }
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
        // dense too, before the `ar` rows run
        (vec!["--budget", "16", "--modes", "ar,dense"], "--budget 16"),
        // a draft budget with no room beside the sinks and window, before any row runs
        (
            vec!["--draft-budget", "0,68", "--modes", "ar,dense"],
            "--draft-budget 68: expected more than the sinks and window (4 + 64 = 68)",
        ),
        // sizes that wrapped or aborted the process while allocating
        (
            vec!["--warmup", "18446744073709551615", "--modes", "ar"],
            "at most 10000 iterations",
        ),
        (
            vec!["--ctx", "18446744073709551615", "--modes", "ar"],
            "at most 16777216 positions",
        ),
        (
            vec!["--batch", "100000000000", "--ctx", "180", "--modes", "ar"],
            "--batch 100000000000 x --ctx 180: at most 16777216 context tokens in all",
        ),
        (vec!["--rounds", "0", "--modes", "ar"], "--rounds 0: expected 1 ..= 10"),
        (
            vec!["--dense-waves", "2,0", "--modes", "ar"],
            "--dense-waves 0: expected 1 to 16 waves",
        ),
        (
            vec!["--dense-waves", "2,2", "--modes", "ar"],
            "--dense-waves",
        ),
        // a ring-kernel shape the kernel has no build for (checked on every backend)
        (
            vec!["--ring-config", "96x32x4", "--modes", "ar"],
            "'--ring-config <RING_CONFIG>': ring config: expected COLSxKCxBUFS with COLS 64 or 128, KC 32 or 64, BUFS 3 or 4 (e.g. 64x32x4), found \"96x32x4\"",
        ),
        (vec!["--ring-config", "64x32", "--modes", "ar"], "found \"64x32\""),
        (vec!["--rounds", "11", "--modes", "ar"], "--rounds 11: expected 1 ..= 10"),
        // lookahead layers the 2-layer fixture draft does not have, or no layers at all
        (
            vec!["--lookahead-layers", "all;last:3", "--modes", "ar,dustin"],
            "--lookahead-layers: invalid `lookahead layers`: expected layers of a draft of 2 layers (0 to 1), found the last 3",
        ),
        (
            vec!["--lookahead-layers", "0,2", "--modes", "ar,dustin"],
            "found layer 2",
        ),
        (
            vec!["--lookahead-layers", "stride:0", "--modes", "ar"],
            "found `stride:0`",
        ),
        // a value twice would print the same row twice
        (
            vec!["--lookahead-layers", "last:1;last:1", "--modes", "ar"],
            "--lookahead-layers: last:1 is listed twice",
        ),
        (
            vec!["--modes", "dense,dustin,dustin"],
            "--modes: dustin is listed twice",
        ),
        (
            vec!["--batched-reuse", "on,on", "--modes", "dustin"],
            "--batched-reuse: on is listed twice",
        ),
        // a misspelt mode would take the default silently
        (
            vec!["--accept", "default=2,dustn=3", "--modes", "dustin"],
            "--accept dustn=3: expected default or a mode",
        ),
        (
            vec!["--accept", "default=2,ar=3", "--modes", "ar,dense"],
            "--accept ar=3: ar has no acceptance length",
        ),
        (
            vec![
                "--accept",
                "default=2,dustin=3,dustin=1.5",
                "--modes",
                "dustin",
            ],
            "--accept dustin=1.5: dustin is given twice",
        ),
        (
            vec!["--accept-drop-sigmas", "3,-1", "--modes", "dustin"],
            "--accept-drop-sigmas -1: expected numbers in 0 ..= 100",
        ),
        (
            vec!["--accept-drop-sigmas", "NaN", "--modes", "dustin"],
            "--accept-drop-sigmas NaN: expected numbers in 0 ..= 100",
        ),
        // out of range before "listed twice", and a label-breaking size refused
        (
            vec!["--accept-drop-sigmas", "1e308,1e308", "--modes", "dustin"],
            "expected numbers in 0 ..= 100",
        ),
        // before any weights are built or rows run
        (
            vec!["--host-profile", "/dev/null/x", "--modes", "ar"],
            "--host-profile /dev/null/x: expected a folder",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_dustin-bench"))
            .args(["e2e", "--target", &f, "--draft", &f])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// Rows of `e2e` on the llama fixture at `--tp tp`.
fn rows_at_tp(tp: &str) -> Vec<serde_json::Value> {
    bench_rows(
        &format!("tp{tp}"),
        &[
            "--ctx",
            "180",
            "--modes",
            "ar,dense,streaming",
            "--accept",
            "default=2.0",
            "--warmup",
            "0",
            "--iters",
            "2",
            "--tail",
            "20",
            "--budget",
            "90",
            "--tp",
            tp,
        ],
    )
}

#[test]
fn tensor_parallel_ranks_run_every_mode_and_halve_the_floor() {
    let one = rows_at_tp("1");
    let two = rows_at_tp("2");
    assert_eq!(one.len(), 3);
    assert_eq!(two.len(), 3, "rank 0 alone reports");
    for (a, b) in one.iter().zip(&two) {
        let mode = a["mode"].as_str().unwrap();
        assert_eq!(b["mode"], a["mode"]);
        assert_eq!(b["tp"].as_u64(), Some(2), "{mode}");
        // the selection splits with the KV heads: the same share of the cache is read
        assert_eq!(b["kv_read"], a["kv_read"], "{mode}");
        assert_eq!(b["tau_measured"], a["tau_measured"], "{mode}");
        // each rank reads half the target (weights and KV) and the whole draft
        let (fa, fb) = (
            a["floor_bytes"].as_f64().unwrap(),
            b["floor_bytes"].as_f64().unwrap(),
        );
        assert!(fb < fa && fb >= fa / 2.0, "{mode}: {fb} vs {fa}");
        assert_eq!(fb == fa / 2.0, mode == "ar", "{mode}: only ar has no draft");
    }
}

/// Calls per iteration of `model`'s `phase` in a `--profile` line (0 when it never ran).
fn phase_calls(profile: &serde_json::Value, model: &str, phase: &str) -> f64 {
    profile["phases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x[0] == model && x[1] == phase)
        .map_or(0.0, |x| x[3].as_f64().unwrap())
}

/// `--profile` adds one line per mode with the decode-phase times of the target (and the
/// draft, for speculative modes) over the iterations after the warm-up; the rows stay.
#[test]
fn profile_lines_cover_every_layer_phase_after_the_warmup() {
    let lines = small_rows("profile", "ar,dustin", "3", &["--profile"]);
    let (profiles, rows): (Vec<_>, Vec<_>) = lines.iter().partition(|l| l.get("profile").is_some());
    assert_eq!(rows.len(), 2);
    assert_eq!(profiles.len(), 2);
    let layers = 2.0; // the llama fixture
    for p in &profiles {
        let mode = p["profile"].as_str().unwrap();
        // exactly the timed window
        assert_eq!(p["iterations"].as_u64(), Some(3), "{p}");
        let calls = |model: &str, phase: &str| phase_calls(p, model, phase);
        let phases = p["phases"].as_array().unwrap();
        // one target pass per iteration (a verification or an autoregressive step)
        for phase in ["qkv", "select", "attention", "mlp"] {
            assert_eq!(calls("target", phase), layers, "{mode} {phase}: {p}");
        }
        assert_eq!(calls("target", "lm_head"), 1.0, "{mode}: {p}");
        // the draft runs gamma (4) steps per iteration, and only in speculative modes
        let draft_qkv = calls("draft", "qkv");
        if mode == "ar" {
            assert_eq!(draft_qkv, 0.0, "{p}");
        } else {
            assert!(draft_qkv >= 4.0 * layers, "{p}");
        }
        assert!(phases.iter().all(|x| x[2].as_f64().unwrap() >= 0.0));
    }
}

/// Under tensor parallelism only rank 0 records: the replicated draft's phases count its
/// gamma steps once, not once per rank.
#[test]
fn profile_under_tensor_parallelism_counts_one_rank() {
    let lines = bench_rows(
        "profile-tp",
        &[
            "--ctx",
            "180",
            "--batch",
            "2",
            "--modes",
            "dustin",
            "--warmup",
            "1",
            "--iters",
            "2",
            "--tail",
            "40",
            "--budget",
            "90",
            "--tp",
            "2",
            "--profile",
        ],
    );
    let p = lines.iter().find(|l| l.get("profile").is_some()).unwrap();
    let calls = |model: &str, phase: &str| phase_calls(p, model, phase);
    assert_eq!(calls("draft", "embed"), 4.0, "{p}");
    assert_eq!(calls("target", "embed"), 1.0, "{p}");
    // two all-reduces per layer (after o and after the MLP), two layers
    assert_eq!(calls("target", "all_reduce"), 4.0, "{p}");
}

/// A `--json` path that cannot be written, or that is an input (the target's config), is
/// named before anything is measured, so no measured row is printed and then lost.
#[test]
fn an_unwritable_json_path_is_named_before_the_run() {
    let f = fixture();
    let dir = std::env::temp_dir();
    // `e2e` of one `ar` row with `target` and `json`: exit code, stdout, stderr
    let e2e = |target: &std::path::Path, json: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_dustin-bench"))
            .args(["e2e", "--target"])
            .arg(target)
            .args(["--draft", &f])
            .args([
                "--ctx", "180", "--batch", "1", "--modes", "ar", "--tail", "40",
            ])
            .arg("--json")
            .arg(json)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stdout, err) = e2e(std::path::Path::new(&f), &dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&dir.display().to_string()), "{err}");
    assert!(!stdout.contains("| ar |"), "a row was measured first");
    // `--json` naming the target's config: refused, the config left readable
    let cfg = dir.join(format!(
        "dustin-e2e-json-is-config-{}.json",
        std::process::id()
    ));
    std::fs::copy(&f, &cfg).unwrap();
    let before = std::fs::read_to_string(&cfg).unwrap();
    let (code, _, err) = e2e(&cfg, &cfg);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is the input file"), "{err}");
    assert_eq!(std::fs::read_to_string(&cfg).unwrap(), before);
    std::fs::remove_file(&cfg).ok();
}

/// The row records the GEMM settings as the flags spell them: `--skinny-kernel no-ring` as
/// `no-ring`, and a ring shape in its one spelling, whatever spaces it was given with (the
/// CPU runs neither kernel; the row still says what was asked for).
#[test]
fn rows_name_the_skinny_kernel_and_ring_shape() {
    let rows = bench_rows(
        "ring",
        &[
            "--ctx",
            "180",
            "--tail",
            "40",
            "--modes",
            "ar",
            "--warmup",
            "1",
            "--iters",
            "1",
            "--skinny-kernel",
            "no-ring",
            "--ring-config",
            " 64 x32x4",
        ],
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["skinny_kernel"], "no-ring", "{:?}", rows[0]);
    assert_eq!(rows[0]["ring_config"], "64x32x4", "{:?}", rows[0]);
}

/// `--target-layers 1` of the 2-layer fixture: each row keeps its measured phases and adds
/// them at full depth (the draft once, the target's phases twice), the floor with twice the
/// target's weights and KV; the printed summary gives each mode's scaled tokens/s over the
/// `ar` row's. Without `--target-layers` the scaled fields equal the measured ones.
#[test]
fn rows_scale_to_the_full_depth_and_compare_with_ar() {
    let dir = std::env::temp_dir().join(format!("dustin-e2e-scaled-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = fixture();
    let run = |layers: Option<&str>| {
        let json = dir.join(format!("rows-{}.jsonl", layers.unwrap_or("all")));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dustin-bench"));
        cmd.args(["e2e", "--target", &f, "--draft", &f])
            .args(["--ctx", "180", "--batch", "2", "--modes", "ar,dense,dustin"])
            .args([
                "--warmup", "1", "--iters", "2", "--tail", "40", "--budget", "90",
            ])
            .arg("--json")
            .arg(&json);
        if let Some(n) = layers {
            cmd.args(["--target-layers", n]);
        }
        let out = cmd.output().unwrap();
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
        (rows, String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let f64_of = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
    let (rows, stdout) = run(Some("1"));
    assert_eq!(rows.len(), 3);
    for r in &rows {
        assert_eq!(r["target_layers"], 1, "{r}");
        assert_eq!(r["full_layers"], 2, "{r}");
        let target = f64_of(r, "verify_ms") + f64_of(r, "accept_ms") + f64_of(r, "commit_ms");
        let want = f64_of(r, "draft_ms") + 2.0 * target;
        let got = f64_of(r, "scaled_iter_ms");
        assert!((got - want).abs() <= 1e-9 * want, "{r}");
        let tps = 2.0 * f64_of(r, "tau") / (want / 1e3);
        assert!(
            (f64_of(r, "scaled_tokens_per_sec") - tps).abs() <= 1e-9 * tps,
            "{r}"
        );
        // more target bytes at full depth, but less than twice the floor (the draft is whole)
        let (floor, scaled) = (f64_of(r, "floor_ms"), f64_of(r, "scaled_floor_ms"));
        assert!(scaled > floor && scaled <= 2.0 * floor, "{r}");
        let ratio = f64_of(r, "scaled_over_floor");
        assert!((ratio - got / scaled).abs() <= 1e-9 * ratio, "{r}");
    }
    assert!(
        stdout.contains("scaled to 2 target layers (1 measured)"),
        "{stdout}"
    );
    // the summary's `x ar` column: 1.00x for ar, the tokens/s ratio for the others
    let ar_tps = f64_of(&rows[0], "scaled_tokens_per_sec");
    for r in &rows {
        let mode = r["mode"].as_str().unwrap();
        let line = stdout
            .lines()
            .rev()
            .find(|l| l.starts_with(&format!("| {mode} | 180 | 2 |")))
            .unwrap_or_else(|| panic!("no summary row for {mode}: {stdout}"));
        let x = format!("{:.2}x", f64_of(r, "scaled_tokens_per_sec") / ar_tps);
        assert!(line.contains(&format!("| {x} |")), "{mode}: {line}");
    }
    // at full depth the scaled fields are the measured ones
    let (rows, _) = run(None);
    for r in &rows {
        assert_eq!(r["full_layers"], r["target_layers"], "{r}");
        assert!(
            (f64_of(r, "scaled_iter_ms") - f64_of(r, "iter_ms")).abs() <= 1e-9,
            "{r}"
        );
        assert!(
            (f64_of(r, "scaled_floor_ms") - f64_of(r, "floor_ms")).abs() <= 1e-9,
            "{r}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
