//! `dustin generate --chat` and `dustin eval longbench --chat auto` with a chat template, on
//! the tiny 2-layer model of `common` given ChatML control tokens as special added tokens
//! (`<|im_start|>` = 94, `<|im_end|>` = 95, `<|endoftext|>` = a chosen id) and a template in
//! `tokenizer_config.json`.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// A ChatML-like template over the word-level vocabulary (`t7` opens the assistant turn).
const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }} {{ m.content }}<|im_end|> \
                        {% endfor %}{% if add_generation_prompt %}<|im_start|>t7 {% endif %}";

const IM_START: u64 = 94;
const IM_END: u64 = 95;

fn dustin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dustin"))
}

fn run(cmd: &mut Command) -> (Output, String) {
    let o = cmd.output().expect("run dustin");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    (o, err)
}

/// The tiny model with a word-level tokenizer `t<i>` whose ids 94 and 95 are `<|im_start|>`
/// and `<|im_end|>`, `endoftext` is `<|endoftext|>`'s id (its word `t<id>` left out), all
/// three special added tokens; `template` as `chat_template` of `tokenizer_config.json`.
fn chat_model(dir: &Path, endoftext: u64, template: &str) -> PathBuf {
    let m = common::tiny_model(dir, 4096);
    let special = [
        ("<|im_start|>", IM_START),
        ("<|im_end|>", IM_END),
        ("<|endoftext|>", endoftext),
    ];
    let mut vocab = serde_json::Map::new();
    for i in 0..96u64 {
        let word = special
            .iter()
            .find(|s| s.1 == i)
            .map_or(format!("t{i}"), |s| s.0.to_string());
        vocab.insert(word, i.into());
    }
    let added: Vec<Value> = special
        .iter()
        .map(|(t, id)| {
            serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    std::fs::write(m.join("tokenizer.json"), tok.to_string()).expect("tokenizer");
    let cfg = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(m.join("tokenizer_config.json"), cfg.to_string()).expect("config");
    m
}

/// `(tokens, finish)` of each sequence of an `--output` file.
fn sequences(path: &Path) -> Vec<(Vec<u64>, String)> {
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("output")).expect("output json");
    v["sequences"]
        .as_array()
        .expect("sequences")
        .iter()
        .map(|s| {
            let toks = s["tokens"]
                .as_array()
                .expect("tokens")
                .iter()
                .map(|t| t.as_u64().expect("id"))
                .collect();
            (toks, s["finish"].as_str().expect("finish").to_string())
        })
        .collect()
}

fn generate(model: &Path, args: &[&str], out: &Path) -> Vec<(Vec<u64>, String)> {
    let (o, err) = run(dustin()
        .args(["generate", "--model"])
        .arg(model)
        .args(args)
        .args(["--max-new-tokens", "24", "--output"])
        .arg(out));
    assert!(o.status.success(), "{args:?}: {err}");
    sequences(out)
}

#[test]
fn chat_renders_the_template_and_stops_at_its_end_of_turn_tokens() {
    let dir = common::scratch("chat-generate");
    let model = chat_model(&dir.join("a"), 93, TEMPLATE);
    let out = dir.join("out.json");
    // the rendering, written out by hand, as a plain prompt (the model has no EOS)
    let rendered = "<|im_start|>system t3 t4<|im_end|> <|im_start|>user t5 t6 t2<|im_end|> \
                    <|im_start|>t7 ";
    let plain = generate(&model, &["--prompt", rendered], &out);
    let (want, _) = &plain[0];
    assert_eq!(want.len(), 24);
    // --system goes before the file's messages
    let conv = dir.join("conv.json");
    std::fs::write(&conv, r#"[{"role": "user", "content": "t5 t6 t2"}]"#).unwrap();
    let (o, err) = run(dustin()
        .args(["generate", "--model"])
        .arg(&model)
        .args(["--chat", "--system", "t3 t4", "--user", "t5 t6 t2"])
        .arg("--chat-file")
        .arg(&conv)
        .args(["--max-new-tokens", "24", "--output"])
        .arg(&out));
    assert!(o.status.success(), "{err}");
    assert!(err.contains("chat: template of"), "{err}");
    assert!(err.contains("tokenizer_config.json"), "{err}");
    // stop tokens: <|im_end|> (the template's eos_token and marker) and <|endoftext|>
    assert!(
        err.contains("stop tokens \"<|im_end|>\" (95), \"<|endoftext|>\" (93)"),
        "{err}"
    );
    let chat = sequences(&out);
    assert_eq!(chat.len(), 2);
    for (toks, finish) in &chat {
        let n = toks.len();
        assert_eq!(toks[..], want[..n], "chat tokens are the plain prompt's");
        let stopped = want[..n - 1].iter().any(|t| [93, IM_END].contains(t));
        assert!(!stopped, "ran past a stop token: {toks:?}");
        if finish == "eos" {
            assert!([93, IM_END].contains(&toks[n - 1]), "{toks:?}");
        } else {
            assert_eq!((finish.as_str(), n), ("length", 24));
        }
    }

    // a generated token that is in no prompt becomes <|endoftext|>: the chat stops there, the
    // plain prompt does not
    let prompt_ids = [0, 2, 3, 4, 5, 6, 7, IM_START, IM_END];
    let k = (0..want.len())
        .find(|&k| !prompt_ids.contains(&want[k]) && !want[..k].contains(&want[k]))
        .expect("a fresh generated token");
    let model2 = chat_model(&dir.join("b"), want[k], TEMPLATE);
    let plain2 = generate(&model2, &["--prompt", rendered], &out);
    assert_eq!(plain2[0], (want.clone(), "length".to_string()));
    let full = dir.join("full.json");
    std::fs::write(
        &full,
        r#"{"messages": [{"role": "system", "content": "t3 t4"},
                         {"role": "user", "content": "t5 t6 t2"}]}"#,
    )
    .unwrap();
    let chat2 = generate(
        &model2,
        &["--chat", "--chat-file", full.to_str().unwrap()],
        &out,
    );
    let cut = want[..k].iter().position(|t| *t == IM_END).unwrap_or(k);
    assert_eq!(chat2[0], (want[..=cut].to_vec(), "eos".to_string()));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chat_errors_are_named() {
    let dir = common::scratch("chat-errors");
    let fails = |model: &Path, args: &[&str]| -> (Option<i32>, String) {
        let (o, err) = run(dustin()
            .args(["generate", "--model"])
            .arg(model)
            .args(args)
            .args(["--max-new-tokens", "2"]));
        (o.status.code(), err)
    };
    // no template
    let plain = common::tiny_model(&dir.join("plain"), 64);
    let (code, err) = fails(&plain, &["--chat", "--user", "t5"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--chat: "), "{err}");
    assert!(err.contains("has no chat template"), "{err}");
    // chat options without --chat
    let (code, err) = fails(&plain, &["--system", "t5", "--prompt", "t5"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--chat"), "{err}");
    // the template's own error, and a syntax error
    let raising = chat_model(
        &dir.join("raise"),
        93,
        "{% if messages[0].role != 'user' %}{{ raise_exception('user turns first') }}{% endif %}x",
    );
    let (code, err) = fails(&raising, &["--chat", "--system", "t3", "--user", "t5"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("chat template of"), "{err}");
    assert!(err.contains("raise_exception: user turns first"), "{err}");
    let broken = chat_model(&dir.join("broken"), 93, "{% for m in messages %}");
    let (code, err) = fails(&broken, &["--chat", "--user", "t5"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("does not compile: syntax error"), "{err}");
    // a chat file that is not a conversation
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"[{"role": "user"}]"#).unwrap();
    let (code, err) = fails(&raising, &["--chat", "--chat-file", bad.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("message 0: missing field `content`"), "{err}");
    // roles the templates do not know, empty user turns and files that are not text
    for (text, want) in [
        (
            &br#"[{"role": "user", "content": "t5"}, {"role": "wizard", "content": "t6"}]"#[..],
            "message 1: role \"wizard\", expected one of system, user, assistant, tool",
        ),
        (
            br#"[{"role": "user", "content": " "}]"#,
            "message 0: the user message is empty",
        ),
        (b"\xff\xfe[]", "not UTF-8 text (expected a JSON file)"),
    ] {
        std::fs::write(&bad, text).unwrap();
        let (code, err) = fails(&raising, &["--chat", "--chat-file", bad.to_str().unwrap()]);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(&format!("--chat-file {}: {want}", bad.display())),
            "{err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A MiniLongBench-style task file with one sample.
fn write_task(dir: &Path, task: &str, prompt: &str, gold: Value) {
    let v = serde_json::json!({"0": {"origin_prompt": prompt, "prediction": "", "gold": gold,
        "time": 0.0}});
    std::fs::write(dir.join(format!("{task}.json")), v.to_string()).expect("task");
}

#[test]
fn longbench_wraps_prompts_in_the_chat_template() {
    let dir = common::scratch("chat-longbench");
    let model = chat_model(&dir.join("m"), 93, TEMPLATE);
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let words: Vec<String> = (0..120).map(|i| format!("t{}", 8 + (i * 7) % 80)).collect();
    let prompt = words.join(" ");
    write_task(&data, "qasper", &prompt, serde_json::json!(["t9"]));
    write_task(
        &data,
        "trec",
        &prompt,
        serde_json::json!({"answers": ["t9"], "all_classes": ["t9"]}),
    );
    let lb = |chat: &str, out: &Path| {
        let (o, err) = run(dustin()
            .args(["eval", "longbench", "--model"])
            .arg(&model)
            .args(["--draft", "self:layers=1", "--data"])
            .arg(&data)
            .args([
                "--tasks",
                "trec,qasper",
                "--selectors",
                "dense",
                "--budget",
                "1/1",
            ])
            .args(["--ctx", "512", "--chat", chat, "--out"])
            .arg(out));
        assert!(o.status.success(), "{err}");
        let rows: Vec<Value> = std::fs::read_to_string(out.join("results.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap()["value"].clone())
            .collect();
        (rows, err)
    };
    let (rows, err) = lb("auto", &dir.join("auto"));
    assert!(err.contains("the chat template of"), "{err}");
    let row = |rows: &[Value], task: &str| rows.iter().find(|r| r["task"] == task).unwrap().clone();
    // qasper: [<|im_start|> user] + 120 + [<|im_end|> <|im_start|> t7]; trec (few-shot): plain
    let q = row(&rows, "qasper");
    assert_eq!(
        (q["chat"].clone(), q["input_tokens"].clone()),
        (true.into(), 125.into())
    );
    let t = row(&rows, "trec");
    assert_eq!(
        (t["chat"].clone(), t["input_tokens"].clone()),
        (false.into(), 120.into())
    );
    // dense speculative decoding of the wrapped prompt == `generate --chat` of the prompt
    let out = dir.join("gen.json");
    let (o, err) = run(dustin()
        .args(["generate", "--model"])
        .arg(&model)
        .args([
            "--chat",
            "--user",
            &prompt,
            "--max-new-tokens",
            "128",
            "--output",
        ])
        .arg(&out));
    assert!(o.status.success(), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let seq = &v["sequences"][0];
    let specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"];
    let text: Vec<&str> = seq["text"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .filter(|w| !specials.contains(w))
        .collect();
    assert_eq!(q["prediction"].as_str().unwrap(), text.join(" "));
    assert_eq!(q["finish"], seq["finish"]);
    assert_eq!(q["new_tokens"], seq["tokens"].as_array().unwrap().len());
    // --chat off: both plain
    let (rows, _) = lb("off", &dir.join("off"));
    let q = row(&rows, "qasper");
    assert_eq!(
        (q["chat"].clone(), q["input_tokens"].clone()),
        (false.into(), 120.into())
    );
    let _ = std::fs::remove_dir_all(&dir);
}
