//! `dustin eval longbench` and `dustin eval pg19` end to end on the tiny 2-layer model of
//! `common` (word-level tokens `t0`..`t95`, no EOS): middle truncation, scores, dense equal to
//! autoregressive greedy decoding, budgets covering the context equal to dense, resume, and
//! bad inputs.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn dustin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dustin"))
}

fn run(cmd: &mut Command) -> (Output, String, String) {
    let o = cmd.output().expect("run dustin");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, out, err)
}

/// A deterministic word sequence `t<k>` of `n` tokens (ids 1..95).
fn words(n: usize, seed: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("t{}", 1 + (i * 37 + seed * 11 + (i * i) % 7) % 95))
        .collect()
}

/// A MiniLongBench-style file of `task` with samples `(id, prompt words, gold)`.
fn write_task(dir: &Path, task: &str, samples: &[(&str, Vec<String>, Value)]) {
    let mut obj = serde_json::Map::new();
    for (id, prompt, gold) in samples {
        obj.insert(
            id.to_string(),
            serde_json::json!({
                "origin_prompt": prompt.join(" "),
                "prediction": "",
                "gold": gold,
                "time": 0.0,
            }),
        );
    }
    std::fs::write(
        dir.join(format!("{task}.json")),
        Value::Object(obj).to_string(),
    )
    .expect("write task");
}

fn rows(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("results.jsonl"))
        .expect("results.jsonl")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json line")["value"].clone())
        .collect()
}

fn find<'a>(rows: &'a [Value], task: &str, id: &str, sel: &str, budget: Value) -> &'a Value {
    rows.iter()
        .find(|r| {
            r["task"] == task && r["id"] == id && r["selector"] == sel && r["budget"] == budget
        })
        .unwrap_or_else(|| panic!("no row {task} {id} {sel} {budget}"))
}

struct Setup {
    dir: PathBuf,
    model: PathBuf,
    data: PathBuf,
    long: Vec<String>,
}

fn setup(name: &str) -> Setup {
    let dir = common::scratch(name);
    let model = common::tiny_model(&dir, 4096);
    let data = dir.join("data");
    std::fs::create_dir_all(&data).expect("data dir");
    let long = words(300, 1);
    write_task(
        &data,
        "trec",
        &[
            (
                "0",
                long.clone(),
                serde_json::json!({"answers": ["t7"], "all_classes": ["t7", "t8", "t9"]}),
            ),
            (
                "1",
                words(40, 2),
                serde_json::json!({"answers": ["t8"], "all_classes": ["t7", "t8", "t9"]}),
            ),
        ],
    );
    write_task(
        &data,
        "qasper",
        &[("0", words(200, 3), serde_json::json!(["t5 t6 t7", "t60"]))],
    );
    Setup {
        dir,
        model,
        data,
        long,
    }
}

/// `dustin eval longbench` on the setup's data, with `over` replacing default flags.
fn longbench_with(s: &Setup, out: &Path, over: &[(&str, &str)]) -> Command {
    let data = s.data.display().to_string();
    let mut flags: Vec<(&str, &str)> = vec![
        ("--draft", "self:layers=1"),
        ("--data", &data),
        ("--tasks", "trec,qasper"),
        ("--selectors", "dense,streaming,dustin"),
        ("--budget", "96,1/1"),
        ("--ctx", "256"),
    ];
    for (k, v) in over {
        match flags.iter_mut().find(|f| f.0 == *k) {
            Some(f) => f.1 = v,
            None => flags.push((k, v)),
        }
    }
    let mut c = dustin();
    c.args(["eval", "longbench", "--model"]).arg(&s.model);
    for (k, v) in flags {
        c.args([k, v]);
    }
    c.arg("--out").arg(out);
    c
}

fn longbench(s: &Setup, out: &Path) -> Command {
    longbench_with(s, out, &[])
}

#[test]
fn longbench_scores_truncates_matches_autoregressive_and_resumes() {
    let s = setup("longbench");
    let out = s.dir.join("out");
    let (o, stdout, err) = run(&mut longbench(&s, &out));
    assert!(o.status.success(), "stderr: {err}");
    assert!(err.contains("= 15 runs, 15 to compute"), "{err}");
    for f in [
        "longbench.md",
        "longbench.json",
        "longbench.svg",
        "per_sample.md",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    assert!(stdout.contains("| trec "), "{stdout}");
    let rs = rows(&out);
    // 3 samples x (dense + 2 selectors x 2 budgets)
    assert_eq!(rs.len(), 15);
    for r in &rs {
        let task = r["task"].as_str().unwrap();
        let max_new = if task == "trec" { 64 } else { 128 };
        // no EOS in the tiny model: every run generates its task's limit
        assert_eq!(r["new_tokens"], max_new, "{r}");
        assert_eq!(r["finish"], "length");
        // the score is LongBench's metric on the stored prediction
        let (answers, classes): (Vec<&str>, Vec<&str>) = if task == "trec" {
            let gold = if r["id"] == "0" { "t7" } else { "t8" };
            (vec![gold], vec!["t7", "t8", "t9"])
        } else {
            (vec!["t5 t6 t7", "t60"], vec![])
        };
        let want = dustin_eval::metrics::scorer(
            task,
            r["prediction"].as_str().unwrap(),
            &answers,
            &classes,
        )
        .unwrap();
        assert_eq!(r["score"].as_f64().unwrap(), want, "{r}");
        assert_eq!(r["chat"], false);
    }
    // truncation: 300 prompt tokens, limit 256 - 64 - 4 = 188 -> 94 + 94; qasper 124
    let dense = find(&rs, "trec", "0", "dense", Value::Null);
    assert_eq!(dense["prompt_tokens"], 300);
    assert_eq!(dense["input_tokens"], 188);
    assert_eq!(
        find(&rs, "trec", "1", "dense", Value::Null)["input_tokens"],
        40
    );
    assert_eq!(
        find(&rs, "qasper", "0", "dense", Value::Null)["input_tokens"],
        124
    );

    // dense speculative == plain autoregressive greedy decoding of the truncated prompt
    let truncated: Vec<String> = s.long[..94]
        .iter()
        .chain(&s.long[300 - 94..])
        .cloned()
        .collect();
    let ar = s.dir.join("ar.json");
    let (o, _, err) = run(dustin()
        .args(["generate", "--model"])
        .arg(&s.model)
        .args([
            "--prompt",
            &truncated.join(" "),
            "--max-new-tokens",
            "64",
            "--output",
        ])
        .arg(&ar));
    assert!(o.status.success(), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&ar).unwrap()).unwrap();
    assert_eq!(v["sequences"][0]["text"], dense["prediction"]);
    assert_eq!(dense["prediction"].as_str().unwrap().split(' ').count(), 64);

    // a budget covering the whole context is dense verification bit for bit; 96 tokens read
    // about 0.4 of a ~190-250 token context
    for (task, id) in [("trec", "0"), ("trec", "1"), ("qasper", "0")] {
        let d = find(&rs, task, id, "dense", Value::Null);
        assert_eq!(d["kv_selected"], 1.0);
        for sel in ["streaming", "dustin"] {
            let full = find(&rs, task, id, sel, 256.into());
            assert_eq!(full["prediction"], d["prediction"], "{task} {id} {sel}");
            assert_eq!(full["accept_len"], d["accept_len"], "{task} {id} {sel}");
            assert_eq!(full["kv_selected"], 1.0);
        }
    }
    let sparse = find(&rs, "trec", "0", "streaming", 96.into());
    let kv = sparse["kv_selected"].as_f64().unwrap();
    assert!(kv > 0.35 && kv < 0.55, "{kv}");

    // rerun: everything is found in the store, nothing recomputed, same report
    let md = std::fs::read_to_string(out.join("longbench.md")).unwrap();
    let (o, _, err) = run(&mut longbench(&s, &out));
    assert!(o.status.success(), "{err}");
    assert!(err.contains("= 15 runs, 0 to compute"), "{err}");
    assert_eq!(rows(&out).len(), 15);
    assert_eq!(
        std::fs::read_to_string(out.join("longbench.md")).unwrap(),
        md
    );
    // the table: dense relative to itself, full budgets the same answers as dense
    let t: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("longbench.json")).unwrap())
            .unwrap();
    let cols: Vec<&str> = t["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let col = |n: &str| cols.iter().position(|c| *c == n).unwrap();
    let mut full_rows = 0;
    for row in t["rows"].as_array().unwrap() {
        if row[col("budget")] == "full" || row[col("budget")] == "1/1 (256)" {
            full_rows += 1;
            assert_eq!(row[col("vs dense (points)")], 0.0, "{row}");
            if row[col("task")] != "mean over tasks" {
                assert_eq!(row[col("same answer as dense")], 1.0, "{row}");
            }
        }
    }
    // (trec, qasper, mean) x (dense, streaming 1/1, dustin 1/1)
    assert_eq!(full_rows, 9);
}

/// `--draft substitute` in `eval longbench` (a separate draft model, prefilled on its own):
/// whatever the 2-bit draft proposes, dense verification gives the self-draft's predictions,
/// with the target's greedy tokens.
#[test]
fn longbench_with_a_substitute_draft_matches_the_self_draft() {
    let s = setup("longbench-substitute");
    let go = |draft: &str, name: &str| {
        let out = s.dir.join(name);
        let over = [
            ("--draft", draft),
            ("--selectors", "dense,streaming"),
            ("--budget", "1/1"),
        ];
        let (o, _, err) = run(&mut longbench_with(&s, &out, &over));
        assert!(o.status.success(), "{draft}: {err}");
        rows(&out)
    };
    let a = go("self:layers=1", "self");
    let b = go("substitute:bits=2:layers=0-1", "substitute");
    assert_eq!(a.len(), 6, "3 samples x (dense, streaming at 1/1)");
    assert_eq!(b.len(), a.len());
    for r in &a {
        let (task, id, sel) = (
            r["task"].as_str().unwrap(),
            r["id"].as_str().unwrap(),
            r["selector"].as_str().unwrap(),
        );
        let m = find(&b, task, id, sel, r["budget"].clone());
        assert_eq!(m["prediction"], r["prediction"], "{task} {id} {sel}");
        assert_eq!(m["new_tokens"], r["new_tokens"], "{task} {id} {sel}");
    }
}

/// `eval longbench --lookahead-layers`: for the 1-layer self-draft, `last:1` and the list
/// `0` name the one layer `all` does, so `dustin`'s predictions at a budget below the
/// context are the same token for token (stored under their own keys: each run computes).
#[test]
fn longbench_lookahead_layers_naming_all_layers_match_all() {
    let s = setup("longbench-lookahead");
    let go = |la: &str, name: &str| {
        let out = s.dir.join(name);
        let over = [
            ("--selectors", "dustin"),
            ("--budget", "96"),
            ("--lookahead-layers", la),
        ];
        let (o, _, err) = run(&mut longbench_with(&s, &out, &over));
        assert!(o.status.success(), "{la}: {err}");
        rows(&out)
    };
    let a = go("all", "all");
    assert_eq!(a.len(), 3, "3 samples x dustin at 96");
    for (la, name) in [("last:1", "last1"), ("0", "list0")] {
        let b = go(la, name);
        assert_eq!(b.len(), a.len(), "{la}");
        for r in &a {
            let (task, id) = (r["task"].as_str().unwrap(), r["id"].as_str().unwrap());
            let m = find(&b, task, id, "dustin", r["budget"].clone());
            assert_eq!(m["prediction"], r["prediction"], "{la}: {task} {id}");
            assert_eq!(m["new_tokens"], r["new_tokens"], "{la}: {task} {id}");
        }
    }
}

#[test]
fn pg19_reports_perplexity_against_dense() {
    let dir = common::scratch("pg19");
    let model = common::tiny_model(&dir, 4096);
    let book = dir.join("book.txt");
    std::fs::write(&book, words(900, 5).join(" ")).unwrap();
    let out = dir.join("out");
    // `eval pg19` of the tiny model drafting for itself on the book, `args` then `--out out`
    let pg19 = |args: &[&str], out: &Path| {
        run(dustin()
            .args(["eval", "pg19", "--model"])
            .arg(&model)
            .args(["--draft", "self:layers=1", "--data"])
            .arg(&book)
            .args(args)
            .arg("--out")
            .arg(out))
    };
    let (o, stdout, err) = pg19(
        &[
            "--ctx",
            "600",
            "--budget",
            "96,1/1",
            "--selectors",
            "dense,streaming",
            "--windows",
            "2",
        ],
        &out,
    );
    assert!(o.status.success(), "{err}");
    assert!(stdout.contains("PG-19 perplexity"), "{stdout}");
    for f in ["pg19.md", "pg19.json", "pg19_ctx600.svg", "results.jsonl"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let t: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("pg19.json")).unwrap()).unwrap();
    let cols: Vec<&str> = t["columns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let col = |n: &str| cols.iter().position(|c| *c == n).unwrap();
    let rows = t["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let dense_ppl = rows[0][col("dense ppl")].as_f64().unwrap();
    assert!(dense_ppl > 1.0 && dense_ppl.is_finite());
    for r in rows {
        assert_eq!(r[col("tokens scored")], "10", "{r}");
        assert_eq!(r[col("dense ppl")].as_f64().unwrap(), dense_ppl);
        let ratio = r[col("ppl / dense")].as_f64().unwrap();
        let kv = r[col("KV read")].as_f64().unwrap();
        if r[col("selector")] == "dense" || r[col("budget")] == "1/1 (600)" {
            assert_eq!(ratio, 1.0, "{r}");
            assert_eq!(kv, 1.0, "{r}");
        } else {
            // 96 of ~590 context tokens
            assert!(kv > 0.14 && kv < 0.19, "{r}");
            assert!(ratio.is_finite() && ratio > 0.0 && ratio != 1.0, "{r}");
        }
    }
    // a book shorter than every --ctx: nothing to compute is an error, not an empty table
    let short_out = dir.join("short-out");
    let (o, _, err) = pg19(
        &["--ctx", "2000", "--budget", "96", "--windows", "2"],
        &short_out,
    );
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no book is long enough for any --ctx (the longest has 900 tokens; --ctx 2000 needs 2016)"),
        "{err}"
    );
    assert!(!short_out.join("pg19.md").exists());
}

#[test]
fn bad_eval_inputs_are_named() {
    let s = setup("eval-bad");
    let out = s.dir.join("out");
    // a task file without a line: refused before the reports are rewritten
    std::fs::write(s.data.join("hotpotqa.jsonl"), "").expect("empty task");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--tasks", "nope"],
            "--tasks nope: unknown LongBench task",
        ),
        (vec!["--selectors", "nope"], "selector nope"),
        (
            vec!["--data", "/nonexistent/lb"],
            "--data /nonexistent/lb: no such file or directory",
        ),
        (vec!["--budget", "0"], "--budget 0: a budget of 0 tokens"),
        (
            vec!["--ctx", "100000"],
            "--ctx 100000: larger than the model's context (4096 positions)",
        ),
        (vec!["--ctx", "100"], "--ctx 100: too short for task qasper"),
        // a context below the sinks and window: the budget it leaves is named with --ctx
        (
            vec!["--ctx", "16", "--selectors", "dense"],
            "--ctx 16, budget full (16 tokens): selector dense: invalid `budget`",
        ),
        (
            vec!["--tasks", "gov_report"],
            "no gov_report.json or gov_report.jsonl",
        ),
        (
            vec!["--tasks", "trec,hotpotqa"],
            "holds no sample of this task",
        ),
        // a setting that names no layers, and layers the 1-layer self-draft does not have
        (
            vec!["--lookahead-layers", "stride:0"],
            "--lookahead-layers: invalid `lookahead layers`",
        ),
        (
            vec!["--lookahead-layers", "last:3"],
            "expected layers of a draft of 1 layers (0 to 0), found the last 3",
        ),
    ];
    for (extra, want) in cases {
        let over: Vec<(&str, &str)> = extra.chunks(2).map(|c| (c[0], c[1])).collect();
        let (o, _, err) = run(&mut longbench_with(&s, &out, &over));
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(
        !out.join("longbench.md").exists(),
        "a refused run wrote a report"
    );
    let (o, _, err) = run(dustin()
        .args(["eval", "pg19", "--model"])
        .arg(&s.model)
        .args([
            "--data",
            "/nonexistent/pg19",
            "--ctx",
            "600",
            "--budget",
            "64",
        ]));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err.contains("--data /nonexistent/pg19: no such file"),
        "{err}"
    );
}

/// `dustin eval acceptance` with the tiny model drafting for itself, 4 new tokens per cell.
fn acceptance(s: &Setup, out: &Path, args: &[&str]) -> Command {
    let mut c = dustin();
    c.args(["eval", "acceptance", "--model"])
        .arg(&s.model)
        .arg("--draft")
        .arg(&s.model)
        .args(["--new-tokens", "4"])
        .args(args)
        .arg("--out")
        .arg(out);
    c
}

#[test]
fn acceptance_runs_dense_on_short_prompts_and_names_bad_inputs_before_loading() {
    let s = setup("acceptance");
    let text = s.dir.join("text.txt");
    std::fs::write(&text, words(200, 5).join(" ")).unwrap();
    let text = text.to_str().unwrap();
    // a prompt shorter than the selectors' sinks and window (4 + 64): dense verification
    // still runs, and with the model drafting for itself equals autoregressive decoding
    let out = s.dir.join("out");
    let (o, _, err) = run(&mut acceptance(&s, &out, &["--data", text, "--ctx", "32"]));
    assert!(o.status.success(), "{err}");
    let rs = rows(&out);
    assert_eq!(rs.len(), 2, "{rs:?}");
    let by_mode = |m: &str| rs.iter().find(|r| r["mode"] == m).expect(m).clone();
    let (ar, dense) = (by_mode("autoregressive"), by_mode("dense"));
    assert_eq!(ar["output"].as_array().unwrap().len(), 4);
    assert_eq!(ar["output"], dense["output"]);
    assert_eq!(dense["mean_acceptance_length"], 5.0);
    assert!(out.join("acceptance.md").is_file());

    // a stored cell of another shape is named; the finished cells stay in the tables
    let mut jsonl = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    jsonl += "{\"key\":\"stray\",\"value\":{\"foo\":1}}\n";
    std::fs::write(out.join("results.jsonl"), jsonl).unwrap();
    let twice = format!("{text},{text}");
    let (o, _, err) = run(&mut acceptance(
        &s,
        &out,
        &["--data", &twice, "--ctx", "32"],
    ));
    assert!(o.status.success(), "{err}");
    assert!(err.contains("1 sources"), "{err}");
    assert!(
        err.contains(
            "1 stored cells are not acceptance cells and are left out of the tables: stray"
        ),
        "{err}"
    );
    assert!(err.contains("(2 cells)"), "{err}");
    assert_eq!(rows(&out).len(), 3);
    // a cell's key stored with a value that is no cell: computed again, not left out
    let jsonl = std::fs::read_to_string(out.join("results.jsonl")).unwrap();
    let first: Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
    let key = first["key"].as_str().unwrap().to_string();
    let broken = format!(
        "{jsonl}{}\n",
        serde_json::json!({"key": key, "value": {"mode": 1}})
    );
    std::fs::write(out.join("results.jsonl"), broken).unwrap();
    let (o, _, err) = run(&mut acceptance(&s, &out, &["--data", text, "--ctx", "32"]));
    assert!(o.status.success(), "{err}");
    // run again (its progress line names it), and not among the lines left out
    assert!(
        err.contains(&format!("  {key}: acceptance length")),
        "{err}"
    );
    assert!(err.contains("left out of the tables: stray\n"), "{err}");
    assert!(err.contains("(2 cells)"), "{err}");
    let last = rows(&out).pop().unwrap();
    assert_eq!(last["output"], first["value"]["output"], "{last}");

    let short = s.dir.join("short.txt");
    std::fs::write(&short, "t1 t2 t3").unwrap();
    let binary = s.dir.join("binary.dat");
    std::fs::write(&binary, [0xffu8, 0xfe, 0x00, 0x80]).unwrap();
    let empty = s.dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let a_file = s.dir.join("a-file");
    std::fs::write(&a_file, "x").unwrap();
    let (short, binary, empty, a_file) = (
        short.to_str().unwrap(),
        binary.to_str().unwrap(),
        empty.to_str().unwrap(),
        a_file.to_str().unwrap(),
    );
    let other = s.dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("text.txt"), words(200, 6).join(" ")).unwrap();
    let same_name = format!("{text},{}", other.display());
    let same_name_msg = format!(
        "--data: {text} and {} have the same file name",
        other.join("text.txt").display()
    );
    let bad_out = s.dir.join("bad-out");
    let short_msg = format!("--data {short}: 3 tokens, fewer than --ctx 32");
    let text_and_short = format!("{text},{short}");
    let binary_msg = format!("--data {binary}: not UTF-8 text");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--data", text, "--ctx", "0"],
            "--ctx 0: expected a prompt length of at least 1",
        ),
        (
            vec!["--data", text, "--ctx", "32", "--selectors", "dense,nope"],
            "--selectors \"nope\": unknown selector `nope`; known: dense, streaming",
        ),
        (
            vec!["--data", text, "--ctx", "32", "--selectors", ""],
            "--selectors \"\": unknown selector",
        ),
        (
            vec!["--data", text, "--ctx", "32", "--selectors", "streaming"],
            "--selectors streaming --budget 1/16 at --ctx 32",
        ),
        (
            vec!["--data", text, "--ctx", "32", "--lookahead-layers", "bogus"],
            "--lookahead-layers bogus: invalid `lookahead layers`",
        ),
        (
            vec!["--data", text, "--ctx", "32", "--draft-budget", "5"],
            "--draft-budget 5: expected more than the sinks and window",
        ),
        (vec!["--data", &text_and_short, "--ctx", "32"], &short_msg),
        (vec!["--data", binary, "--ctx", "32"], &binary_msg),
        (vec!["--data", empty, "--ctx", "32"], "--data: no files"),
        (vec!["--data", &same_name, "--ctx", "32"], &same_name_msg),
        (
            vec!["--data", text, "--ctx", "32", "--time-limit=-1"],
            "--time-limit -1: expected a finite number of seconds >= 0",
        ),
        (
            vec!["--data", text, "--ctx", "4090"],
            "--ctx 4090: with --new-tokens 4 and --gamma 4 it needs 4106 positions, more than \
             the models take (4096)",
        ),
        (
            vec!["--data", text, "--ctx", "32", "--gamma", "99"],
            "--gamma 99: expected 1 ..= 15",
        ),
        (
            vec!["--data", text, "--ctx", "32", "--temperature=-1"],
            "--temperature -1: expected a finite number >= 0",
        ),
        (
            vec!["--data", text, "--ctx", "32", "--budget", "2/1"],
            "--budget 2/1: expected K, a/b or a fraction",
        ),
    ];
    for (args, want) in cases {
        let (o, _, err) = run(&mut acceptance(&s, &bad_out, &args));
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        // refused before the models load
        assert!(!err.contains("eval acceptance:"), "{args:?}: {err}");
    }
    let (o, _, err) = run(&mut acceptance(
        &s,
        Path::new(a_file),
        &["--data", text, "--ctx", "32"],
    ));
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("--out {a_file}: a file, expected a folder")),
        "{err}"
    );
    // --out is a --data folder: its reports would become sources of the next run
    let other_data = other.to_str().unwrap();
    let (o, _, err) = run(&mut acceptance(
        &s,
        &other,
        &["--data", other_data, "--ctx", "32"],
    ));
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "--out {other_data}: is the --data folder {other_data}; expected another folder"
        )),
        "{err}"
    );
    let names: Vec<_> = std::fs::read_dir(&other).unwrap().flatten().collect();
    assert_eq!(names.len(), 1, "only text.txt: {names:?}");
    let _ = std::fs::remove_dir_all(&s.dir);
}
