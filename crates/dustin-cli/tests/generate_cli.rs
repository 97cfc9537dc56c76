//! `dustin generate` as a user runs it: Ctrl-C during a batch writes every sequence's text
//! with its finish reason and exits with 130; bad inputs exit 1 with a clear message.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn dustin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dustin"))
}

#[cfg(unix)]
#[test]
fn ctrl_c_writes_the_texts_and_exits_130() {
    stop_with_signal("INT");
}

/// SIGTERM (a job scheduler's stop, `kill`) stops as Ctrl-C does: texts written, exit 130.
#[cfg(unix)]
#[test]
fn sigterm_stops_as_ctrl_c_does() {
    stop_with_signal("TERM");
}

/// Starts a long generation of three prompts, sends `SIG<sig>` once tokens stream, and
/// checks the cancelled run: exit code 130, every sequence's partial text in `--output`.
#[cfg(unix)]
fn stop_with_signal(sig: &str) {
    let dir = common::scratch(&format!("sig{sig}"));
    let model = common::tiny_model(&dir, 1 << 20);
    let out = dir.join("out.json");
    let mut child = dustin()
        .args(["generate", "--model"])
        .arg(&model)
        .args([
            "--prompt",
            "t5 t17 t33 t2 t90",
            "--prompt",
            "t9 t1",
            "--prompt",
            "t40",
        ])
        .args(["--max-new-tokens", "500000", "--output"])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dustin");
    // wait until tokens stream (generation has started), then send the signal
    let mut stdout = child.stdout.take().expect("stdout");
    let mut buf = [0u8; 64];
    let mut seen = 0;
    while seen < 32 {
        let n = stdout.read(&mut buf).expect("read stdout");
        assert!(n > 0, "dustin exited before streaming");
        seen += n;
    }
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(st.success());
    // keep draining stdout so that the child never blocks on a full pipe
    let drain = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = stdout.read_to_end(&mut rest);
    });
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("dustin did not stop within 60 s of SIG{sig}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = drain.join();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert_eq!(status.code(), Some(130), "stderr: {err}");
    assert!(
        err.contains("interrupted") && err.contains("cancelled: 3 of 3"),
        "{err}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("output written"))
            .expect("json");
    let seqs = v["sequences"].as_array().expect("sequences");
    assert_eq!(seqs.len(), 3);
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(s["index"], i);
        assert_eq!(s["finish"], "cancelled");
        let n = s["tokens"].as_array().expect("tokens").len();
        assert!(n > 0 && n < 500_000, "sequence {i}: {n} tokens");
        // word-level tokens decode to `t<id>` words
        let words = s["text"].as_str().expect("text").split_whitespace().count();
        assert_eq!(words, n, "sequence {i}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn finished_batch_writes_reasons_and_exits_0() {
    let dir = common::scratch("finish");
    let model = common::tiny_model(&dir, 256);
    let out = dir.join("out.json");
    let o = dustin()
        .args(["generate", "--model"])
        .arg(&model)
        .args([
            "--prompt",
            "t5 t17 t33",
            "--prompt",
            "t9 t1",
            "--max-new-tokens",
            "7",
        ])
        .arg("--output")
        .arg(&out)
        .output()
        .expect("run dustin");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("finish: 0: length, 1: length"), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("output")).expect("json");
    for s in v["sequences"].as_array().expect("sequences") {
        assert_eq!(s["finish"], "length");
        assert_eq!(s["tokens"].as_array().expect("tokens").len(), 7);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `dustin generate --model model base... extra...`, which must exit 0: (stdout, stderr).
fn generate_ok(model: &std::path::Path, base: &[&str], extra: &[&str]) -> (String, String) {
    let o = dustin()
        .args(["generate", "--model"])
        .arg(model)
        .args(base)
        .args(extra)
        .output()
        .expect("run dustin");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{extra:?}: {err}");
    (String::from_utf8_lossy(&o.stdout).into_owned(), err)
}

/// The "KV fraction read" figure of a speculative run's summary on stderr.
fn kv_fraction(err: &str) -> f64 {
    err.split("KV fraction read ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|f| f.parse::<f64>().ok())
        .expect("KV fraction")
}

/// `--draft substitute` (SubSpec): greedy speculative output equals autoregressive output
/// with every selector that keeps the whole context, and runs with sparse selectors.
#[test]
fn substitute_draft_matches_autoregressive() {
    let dir = common::scratch("substitute");
    let model = common::tiny_model(&dir, 256);
    let run = |extra: &[&str]| {
        let base = [
            "--prompt",
            "t5 t17 t33 t2 t90 t61 t7 t44",
            "--max-new-tokens",
            "12",
        ];
        generate_ok(&model, &base, extra)
    };
    let (reference, _) = run(&[]);
    for draft in ["substitute", "substitute:bits=2:group=16:layers=0-1"] {
        for sel in ["dense", "dustin", "quest", "streaming"] {
            let (out, err) = run(&["--draft", draft, "--selector", sel, "--budget", "128"]);
            assert_eq!(out, reference, "{draft} {sel}");
            assert!(err.contains("substitute draft: "), "{err}");
            assert!(err.contains("mean acceptance length"), "{err}");
        }
        // a budget below the context (120 prompt tokens, budget 72 > sinks 4 + window 64):
        // sparse verification runs to the end
        let long: Vec<String> = (0..120).map(|i| format!("t{}", (i * 7) % 96)).collect();
        let long = long.join(" ");
        for sel in ["dustin", "quest"] {
            let (_, err) = run(&[
                "--prompt",
                &long,
                "--draft",
                draft,
                "--selector",
                sel,
                "--budget",
                "72",
            ]);
            assert!(err.contains("finish: 0: length, 1: length"), "{err}");
            let frac = kv_fraction(&err);
            assert!(frac < 0.9, "{draft} {sel}: sparse, read {frac}");
        }
        // a draft that attends to 72 of the 120-odd tokens: the same output as dense
        // drafting (the target verifies every token)
        let (dense_draft, _) = run(&["--prompt", &long, "--draft", draft, "--selector", "dustin"]);
        let (sparse_draft, err) = run(&[
            "--prompt",
            &long,
            "--draft",
            draft,
            "--selector",
            "dustin",
            "--draft-budget",
            "72",
        ]);
        assert_eq!(sparse_draft, dense_draft, "{draft}: --draft-budget 72");
        assert!(err.contains("mean acceptance length"), "{err}");
    }
    // a sparse draft on the target's KV cache and as an early-exit self-draft: the same
    // output as autoregressive decoding
    let long: Vec<String> = (0..120).map(|i| format!("t{}", (i * 5) % 96)).collect();
    let long = long.join(" ");
    let (ar_long, _) = run(&["--prompt", &long]);
    for draft in ["substitute:kv=target", "self:layers=1"] {
        let (out, err) = run(&["--prompt", &long, "--draft", draft, "--draft-budget", "80"]);
        assert_eq!(out, ar_long, "{draft} --draft-budget 80");
        assert!(err.contains("mean acceptance length"), "{err}");
    }
    // `dustin` selecting from the lookahead of the substitute's last layer only (budget 72 of
    // the 120-odd tokens): it runs to the end, sparse (sparse verification may change the
    // greedy tokens, so they are not compared)
    let (_, err) = run(&[
        "--prompt",
        &long,
        "--draft",
        "substitute",
        "--selector",
        "dustin",
        "--budget",
        "72",
        "--lookahead-layers",
        "last:1",
    ]);
    assert!(err.contains("finish: 0: length, 1: length"), "{err}");
    assert!(kv_fraction(&err) < 0.9, "sparse: {err}");
    let (_, err) = run(&["--draft", "substitute:layers=1"]);
    assert!(
        err.contains("substitute draft: 1 of 2 layers (1) at 4 bits, group 64"),
        "{err}"
    );
    // offloaded target layers (host memory, staged per forward pass): the same output,
    // autoregressive and speculative; the default substitute takes exactly the offloaded
    // layers
    let (out, _) = run(&["--offload", "0-1"]);
    assert_eq!(out, reference, "offloaded autoregressive");
    // page-locked offload on the CPU: nothing to lock, said so, the same output
    let (out, err) = run(&["--offload", "0-1", "--offload-memory", "pinned"]);
    assert_eq!(
        out, reference,
        "offloaded autoregressive, --offload-memory pinned"
    );
    assert!(err.contains("no page-locked memory"), "{err}");
    let (out, err) = run(&["--offload", "0-1", "--offload-memory", "pageable"]);
    assert_eq!(
        out, reference,
        "offloaded autoregressive, --offload-memory pageable"
    );
    assert!(!err.contains("page-locked"), "{err}");
    // nothing offloaded: the setting has no effect, and says so
    let (out, err) = run(&["--offload-memory", "pinned"]);
    assert_eq!(out, reference, "--offload-memory without offloading");
    assert!(err.contains("no effect"), "{err}");
    // the draft on the target's KV cache (SubSpec alignment)
    for sel in ["dense", "dustin"] {
        let (out, err) = run(&["--draft", "substitute:kv=target", "--selector", sel]);
        assert_eq!(out, reference, "kv=target {sel}");
        assert!(err.contains("mean acceptance length"), "{err}");
    }
    let (out, err) = run(&[
        "--offload",
        "1",
        "--draft",
        "substitute",
        "--selector",
        "dustin",
    ]);
    assert_eq!(out, reference, "offloaded SubSpec");
    assert!(
        err.contains("substitute draft: 1 of 2 layers (1) at 4 bits"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `dustin generate` with `args` on the tiny model and returns (exit code, stderr).
fn fails(args: &[&str], prompt_bytes: Option<&[u8]>) -> (Option<i32>, String) {
    let dir = common::scratch(&format!("bad-{}", args.join("-").replace(['/', ' '], "_")));
    let model = common::tiny_model(&dir, 256);
    let mut cmd = dustin();
    cmd.args(["generate", "--model"]).arg(&model).args(args);
    if let Some(b) = prompt_bytes {
        let p = dir.join("prompt.txt");
        std::fs::write(&p, b).expect("prompt");
        cmd.arg("--prompt-file").arg(p);
    }
    let o = cmd.output().expect("run dustin");
    let _ = std::fs::remove_dir_all(&dir);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Arguments, prompt file bytes, expected message.
type Case<'a> = (&'a [&'a str], Option<&'a [u8]>, &'a str);

#[test]
fn bad_inputs_exit_1_with_a_message() {
    let cases: &[Case] = &[
        (&["--prompt", "  "], None, "prompt 0 (--prompt) is empty"),
        // texts are numbered before files; an empty file is named
        (&["--prompt", "hi"], Some(b" \n"), "prompt 1 (prompt file "),
        (
            &["--prompt", "t1 t2", "--draft-budget", "100"],
            None,
            "--draft-budget 100 needs speculative decoding",
        ),
        (
            &["--prompt", "t1 t2", "--draft", "self:layers=1", "--draft-budget", "68"],
            None,
            "--draft-budget 68: expected more than the sinks and window (4 + 64 = 68)",
        ),
        (
            &["--prompt", "t1 t2", "--lookahead-layers", "last:1"],
            None,
            "--lookahead-layers last:1 needs speculative decoding",
        ),
        // a self-draft of 1 layer has only layer 0
        (
            &["--prompt", "t1 t2", "--draft", "self:layers=1", "--lookahead-layers", "1"],
            None,
            "--lookahead-layers 1: invalid `lookahead layers`: expected layers of a draft of 1 layers (0 to 0), found layer 1",
        ),
        (
            &["--prompt", "t1 t2", "--draft", "self:layers=1", "--lookahead-layers", "stride:0"],
            None,
            "--lookahead-layers stride:0: invalid `lookahead layers`",
        ),
        (
            &[],
            Some(b"t1 t2 \xff\xfe t3"),
            "is not UTF-8 text (invalid byte at offset 6)",
        ),
        // a folder where a file is expected: the flag is named
        (
            &["--prompt", "t1 t2", "--config", "/"],
            None,
            "--config /: ",
        ),
        (&["--prompt-file", "/"], None, "--prompt-file /: "),
        (
            &["--prompt", "t1 t2", "--max-new-tokens", "300"],
            None,
            "max_position_embeddings = 256",
        ),
        (
            &["--prompt", "t1", "--draft", "self:layers=1", "--gamma", "0"],
            None,
            "--gamma 0: expected 1 ..= 15",
        ),
        (
            &[
                "--prompt",
                "t1",
                "--draft",
                "self:layers=1",
                "--gamma",
                "16",
            ],
            None,
            "--gamma 16: expected 1 ..= 15",
        ),
        (
            &[
                "--prompt",
                "t1",
                "--draft",
                "self:layers=1",
                "--selector",
                "nope",
            ],
            None,
            "unknown selector `nope`",
        ),
        (
            &[
                "--prompt",
                "t1",
                "--draft",
                "self:layers=1",
                "--selector",
                "snapkv",
                "--budget",
                "0",
            ],
            None,
            "invalid `budget`",
        ),
        (
            &["--prompt", "t1", "--draft", "substitute:layers=0-2"],
            None,
            "invalid config value `substitute.layers` = 2: layer indices 0 ..= 1 (the target has 2 layers)",
        ),
        (
            &["--prompt", "t1", "--draft", "substitute:bits=9"],
            None,
            "--draft substitute:bits=9: bits = `9` is not in 2 ..= 8",
        ),
        (
            &["--prompt", "t1", "--draft", "substitute:group=0"],
            None,
            "group = `0` is not a positive integer",
        ),
        (
            &["--prompt", "t1", "--max-memory", "1K"],
            None,
            "are available (the --max-memory limit)",
        ),
        (
            &["--prompt", "t1", "--offload", "1,5"],
            None,
            "--offload 1,5: layer 5 is past the target's 2 layers (0 ..= 1)",
        ),
        (
            &["--prompt", "t1", "--offload", "1-x"],
            None,
            "--offload 1-x: layer `x` is not a layer index",
        ),
        (
            &["--prompt", "t1", "--draft", "substitute:kv=mine"],
            None,
            "kv = `mine` is not own or target",
        ),
        (
            &[
                "--prompt",
                "t1",
                "--gpu-memory",
                "1G",
                "--draft",
                "substitute:layers=1",
            ],
            None,
            "under a GPU budget the substitute takes exactly the offloaded layers",
        ),
        (
            &["--prompt", "t1", "--gpu-memory", "1K"],
            None,
            "--gpu-memory: invalid config value `gpu_memory` = 1024 bytes: at least",
        ),
        (
            &["--prompt", "t1", "--stop", ""],
            None,
            "--stop \"\": expected a non-empty stop string",
        ),
        // gamma is checked without a draft too (docs/errors.md)
        (&["--prompt", "t1", "--gamma", "0"], None, "--gamma 0: expected 1 ..= 15"),
        // a bad --output is named before the model runs, not after the tokens are made
        (
            &["--prompt", "t1", "--output", "/nonexistent-dustin-dir/o.json"],
            None,
            "--output /nonexistent-dustin-dir/o.json: its folder /nonexistent-dustin-dir does not exist",
        ),
        (
            &["--prompt", "t1", "--output", "/tmp"],
            None,
            "--output /tmp: is a folder",
        ),
    ];
    for (args, bytes, want) in cases {
        let (code, err) = fails(args, *bytes);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: want `{want}` in: {err}");
    }
}

#[test]
fn draft_with_another_vocabulary_is_refused() {
    let dir = common::scratch("vocab");
    let model = common::tiny_model(&dir, 256);
    let draft_dir = dir.join("d");
    std::fs::create_dir_all(&draft_dir).expect("dir");
    let draft = common::tiny_model(&draft_dir, 256);
    // the draft's tokenizer has one token more
    std::fs::write(draft.join("tokenizer.json"), common::tokenizer_json(97)).expect("write");
    let o = dustin()
        .args(["generate", "--model"])
        .arg(&model)
        .arg("--draft")
        .arg(&draft)
        .args(["--prompt", "t1 t2"])
        .output()
        .expect("run dustin");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "draft and target vocabularies differ: token \"t96\" is Some(96) in the draft and None in the target"
        ),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--config` files whose `[select]` is not a table, sets `budget` (which `--budget` always
/// overrode, silently), holds a non-finite float (which read as "not set") or a mistyped
/// value: each named, exit 1, before the model loads.
#[test]
fn bad_config_files_are_named() {
    let dir = common::scratch("bad-config");
    let cases: &[(&str, &str, &str)] = &[
        (
            "notable.toml",
            "select = 3\n",
            "select: expected a table of settings",
        ),
        (
            "budget.toml",
            "[select]\nbudget = 100\n",
            "[select] budget: give the budget with --budget",
        ),
        (
            "inf.toml",
            "[select]\nrefresh_on_accept_drop = inf\n",
            "select.refresh_on_accept_drop: expected a finite number",
        ),
        (
            "nan.toml",
            "[estimator]\nalpha = nan\n",
            "estimator.alpha: expected a finite number",
        ),
        (
            "type.toml",
            "[select]\nbatched_reuse = \"yes\"\n",
            "`batched_reuse`: invalid type: string \"yes\", expected a boolean",
        ),
        (
            "etype.toml",
            "[estimator]\nbeta = \"x\"\n",
            "`beta`: invalid type: string \"x\"",
        ),
    ];
    for (name, text, want) in cases {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        let ps = p.display().to_string();
        let (code, err) = fails(
            &[
                "--prompt",
                "t1",
                "--draft",
                "self:layers=1",
                "--selector",
                "dustin",
                "--config",
                &ps,
            ],
            None,
        );
        assert_eq!(code, Some(1), "{name}: {err}");
        assert!(err.contains(want), "{name}: want `{want}` in: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sparse `dustin` verification through the real engine and model: re-ranking reusing
/// layers in one call (the default) and layer by layer (`[select] batched_reuse = false`)
/// give the same tokens, with two prompts of different lengths under a budget below both
/// contexts, a self-draft whose acceptance varies, and refresh 2 (the recommended config:
/// every second verification reuses).
#[test]
fn one_call_reuse_generates_what_layer_by_layer_does() {
    let dir = common::scratch("batched-reuse");
    let model = common::tiny_model(&dir, 256);
    let off = dir.join("off.toml");
    std::fs::write(&off, "[select]\nbatched_reuse = false\n").unwrap();
    let long = |n: usize, k: usize| -> String {
        (0..n)
            .map(|i| format!("t{}", (i * k + 3) % 96))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (a, b) = (long(120, 7), long(95, 11));
    let run = |extra: &[&str]| {
        let base = [
            "--prompt",
            &a,
            "--prompt",
            &b,
            "--max-new-tokens",
            "24",
            "--draft",
            "self:layers=1",
            "--selector",
            "dustin",
            "--budget",
            "76",
        ];
        generate_ok(&model, &base, extra)
    };
    let (one_call, err) = run(&[]);
    let (per_layer, err_off) = run(&["--config", off.to_str().unwrap()]);
    assert_eq!(one_call, per_layer);
    for e in [&err, &err_off] {
        let frac = kv_fraction(e);
        assert!(frac < 0.9, "sparse, read {frac}: {e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--max-new-tokens 18446744073709551615` is refused before the model runs, as any count past
/// the model's positions (it used to wrap, pass the check and fail at the last position with
/// the tokens lost); `--output` naming the prompt file (by its path or a hard link), a chat
/// file, the `--config` file, the draft's model file or a file of the target's model folder
/// is refused before the run, the input left as it was.
#[test]
fn huge_max_new_tokens_and_output_over_the_prompt_are_refused() {
    let dir = common::scratch("huge");
    let model = common::tiny_model(&dir, 64);
    // `dustin generate --model <tiny> ARGS`: exit code and standard error
    let run = |args: &[&std::ffi::OsStr]| {
        let o = dustin()
            .args(["generate", "--model"])
            .arg(&model)
            .args(args)
            .output()
            .expect("run dustin");
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let huge = usize::MAX.to_string();
    let out = dir.join("o.json");
    let (code, err) = run(&[
        os("--prompt"),
        os("t1 t2 t3"),
        os("--max-new-tokens"),
        huge.as_ref(),
        os("--output"),
        out.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "3 prompt tokens + {} to generate exceed max_position_embeddings = 64",
            usize::MAX
        )),
        "{err}"
    );
    assert!(!err.contains("RoPE table"), "{err}");
    // a fraction as --budget: a usage error (clap's exit 2) that says what to give
    let (code, err) = run(&[os("--prompt"), os("t1"), os("--budget"), os("1/8")]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("expected a count of tokens per layer and KV head, e.g. 1024 (fractions of the context are `dustin eval`'s)"),
        "{err}"
    );
    // --output is the prompt file
    let prompt = dir.join("p.txt");
    std::fs::write(&prompt, "t1 t2").expect("prompt");
    let (code, err) = run(&[
        os("--prompt-file"),
        prompt.as_os_str(),
        os("--output"),
        prompt.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is the input file"), "{err}");
    assert_eq!(std::fs::read_to_string(&prompt).expect("prompt"), "t1 t2");
    // a hard link to the prompt file is the same file under another path
    let link = dir.join("link.txt");
    std::fs::hard_link(&prompt, &link).expect("hard link");
    let (code, err) = run(&[
        os("--prompt-file"),
        prompt.as_os_str(),
        os("--output"),
        link.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is the input file"), "{err}");
    assert_eq!(std::fs::read_to_string(&prompt).expect("prompt"), "t1 t2");
    // a chat file is an input as well
    let conv = dir.join("conv.json");
    let chat = r#"[{"role": "user", "content": "hi"}]"#;
    std::fs::write(&conv, chat).expect("chat file");
    let (code, err) = run(&[
        os("--chat"),
        os("--chat-file"),
        conv.as_os_str(),
        os("--output"),
        conv.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is the input file"), "{err}");
    assert_eq!(std::fs::read_to_string(&conv).expect("chat file"), chat);
    // the --config file, a draft model file and a file of the target's folder are inputs too
    for (flag, name, text) in [
        ("--config", "c.toml", "[select]\nn_sink = 4\n"),
        ("--draft", "d.gguf", "GGUF?"),
    ] {
        let input = dir.join(name);
        std::fs::write(&input, text).expect("input file");
        let (code, err) = run(&[
            os("--prompt"),
            os("t1"),
            os(flag),
            input.as_os_str(),
            os("--output"),
            input.as_os_str(),
        ]);
        assert_eq!(code, Some(1), "{flag}: {err}");
        assert!(err.contains("is the input file"), "{flag}: {err}");
        assert_eq!(std::fs::read_to_string(&input).expect("input"), text);
    }
    let weights = model.join("config.json");
    let before = std::fs::read(&weights).expect("model config");
    let (code, err) = run(&[
        os("--prompt"),
        os("t1"),
        os("--output"),
        weights.as_os_str(),
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("is a file of the model folder"), "{err}");
    assert_eq!(std::fs::read(&weights).expect("model config"), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Standard output closed by its reader (`dustin generate ... | head -c 1`, or a pipeline
/// stopped by the same Ctrl-C) does not stop the run: `--output` is still written with every
/// token, and the run ends as it would have.
#[test]
fn a_closed_standard_output_keeps_the_output_file() {
    let dir = common::scratch("closed-stdout");
    let model = common::tiny_model(&dir, 64);
    let out = dir.join("o.json");
    for draft in [None, Some("self:layers=1")] {
        let _ = std::fs::remove_file(&out);
        let mut cmd = dustin();
        cmd.args(["generate", "--model"])
            .arg(&model)
            .args([
                "--prompt",
                "t1 t2 t3",
                "--prompt",
                "t4 t5",
                "--max-new-tokens",
                "8",
            ])
            .arg("--output")
            .arg(&out);
        if let Some(d) = draft {
            cmd.args(["--draft", d]);
        }
        // the reader goes away before anything is printed
        let o = common::closed_stdout(&mut cmd);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "draft {draft:?}: {err}");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).expect("--output written"))
                .expect("JSON");
        let seqs = json["sequences"].as_array().expect("sequences");
        assert_eq!(seqs.len(), 2, "{json}");
        for s in seqs {
            assert_eq!(s["tokens"].as_array().map(Vec::len), Some(8), "{json}");
            assert_eq!(s["finish"], "length", "{json}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
