//! Chat templates rendered as transformers' `apply_chat_template` renders them.
//!
//! `fixtures/chat/templates.json` is written by `scripts/chat_template_reference.py`: the
//! chat templates of the real GGUF files (Qwen2.5-Coder 1.5B and 0.5B, SmolLM2-135M), a
//! Llama 3 template and one that exercises the Jinja features templates lean on, each
//! rendered for several conversations by transformers (or jinja2 set up as transformers
//! sets it up). The tests render the same templates and conversations and compare exact
//! strings; no model file is needed, except for the ignored test that reads the templates
//! back from the GGUF files.

use std::path::{Path, PathBuf};

use dustin_qwen::chat::Message;
use dustin_qwen::{ChatTemplate, ModelFiles, QwenError, Tokenizer};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    reference: String,
    templates: Vec<TemplateCase>,
}

#[derive(Deserialize)]
struct TemplateCase {
    name: String,
    origin: String,
    gguf_file: Option<String>,
    template: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    conversation: String,
    messages: Vec<Message>,
    add_generation_prompt: bool,
    expected: Option<String>,
    error: Option<String>,
}

fn fixture() -> Fixture {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/templates.json");
    let text = std::fs::read_to_string(&p).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn template(t: &TemplateCase) -> ChatTemplate {
    ChatTemplate::new(t.template.clone(), t.origin.clone())
        .with_special_tokens(t.bos_token.clone(), t.eos_token.clone())
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let f = fixture();
    let names: Vec<&str> = f.templates.iter().map(|t| t.name.as_str()).collect();
    for want in [
        "qwen2.5-coder-1.5b-instruct",
        "smollm2-135m-instruct",
        "llama3",
        "features",
    ] {
        assert!(names.contains(&want), "fixture lacks {want}: {names:?}");
    }
    let mut checked = 0;
    for t in &f.templates {
        let tmpl = template(t);
        tmpl.check().unwrap();
        for c in &t.cases {
            let what = format!(
                "{} / {} (add_generation_prompt {}; reference {})",
                t.name, c.conversation, c.add_generation_prompt, f.reference
            );
            let got = tmpl.render(&c.messages, c.add_generation_prompt);
            match (&c.expected, &c.error) {
                (Some(want), _) => assert_eq!(got.unwrap(), *want, "{what}"),
                (None, Some(err)) => {
                    let e = got.unwrap_err();
                    assert!(matches!(e, QwenError::ChatTemplate { .. }), "{what}: {e:?}");
                    let msg = e.to_string();
                    assert!(msg.contains(err.as_str()), "{what}: {msg}");
                    assert!(msg.contains(&t.origin), "{what}: {msg}");
                }
                (None, None) => panic!("{what}: neither expected text nor error"),
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "{checked} cases");
}

#[test]
fn qwen_inserts_its_default_system_prompt() {
    let f = fixture();
    let t = f
        .templates
        .iter()
        .find(|t| t.name == "qwen2.5-coder-1.5b-instruct")
        .unwrap();
    let text = template(t).render(&[Message::user("Hi")], true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful \
         assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn syntax_errors_name_the_template_and_the_line() {
    let t = ChatTemplate::new(
        "{% for m in messages %}\n{{ m.content }}\n{% if x %}",
        "tokenizer_config.json of test-model",
    );
    let e = t.check().unwrap_err();
    assert!(matches!(e, QwenError::ChatTemplate { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.starts_with(
            "chat template of tokenizer_config.json of test-model: does not compile: syntax error"
        ),
        "{msg}"
    );
    assert!(msg.contains("chat_template:3"), "{msg}");
    // rendering reports the same error
    let r = t
        .render(&[Message::user("x")], true)
        .unwrap_err()
        .to_string();
    assert_eq!(r, msg);
}

#[test]
fn render_errors_name_the_problem() {
    let t = ChatTemplate::new("{{ messages[0].content.nope.deeper }}", "GGUF file m.gguf");
    let msg = t
        .render(&[Message::user("x")], true)
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("chat template of GGUF file m.gguf: failed to render: "),
        "{msg}"
    );
    let t = ChatTemplate::new(
        "{% if messages | length > 1 %}{{ raise_exception('one message only') }}{% endif %}ok",
        "test",
    );
    assert_eq!(t.render(&[Message::user("x")], false).unwrap(), "ok");
    let msg = t
        .render(&[Message::user("x"), Message::user("y")], false)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("raise_exception: one message only"), "{msg}");
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dustin-chat-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn hf_directories_read_tokenizer_config_and_chat_template_jinja() {
    let d = scratch("hf");
    // none of the files: no template
    assert_eq!(ChatTemplate::from_hf_dir(&d).unwrap(), None);
    std::fs::write(
        d.join("tokenizer_config.json"),
        r#"{"bos_token": null, "eos_token": {"content": "<|im_end|>", "special": true},
            "chat_template": [{"name": "tool_use", "template": "T"},
                              {"name": "default", "template": "{{ eos_token }}{{ bos_token }}D"}]}"#,
    )
    .unwrap();
    std::fs::write(d.join("special_tokens_map.json"), r#"{"bos_token": "<s>"}"#).unwrap();
    let t = ChatTemplate::from_hf_dir(&d).unwrap().unwrap();
    assert_eq!(t.source(), "{{ eos_token }}{{ bos_token }}D");
    assert!(
        t.origin().ends_with("tokenizer_config.json"),
        "{}",
        t.origin()
    );
    // null in tokenizer_config.json: taken from special_tokens_map.json
    assert_eq!(t.render(&[], false).unwrap(), "<|im_end|><s>D");
    // chat_template.jinja wins
    std::fs::write(d.join("chat_template.jinja"), "J{{ eos_token }}\n").unwrap();
    let t = ChatTemplate::from_hf_dir(&d).unwrap().unwrap();
    assert_eq!(t.render(&[], false).unwrap(), "J<|im_end|>");
    assert!(t.origin().ends_with("chat_template.jinja"));
    // a broken tokenizer_config.json is named
    std::fs::write(d.join("tokenizer_config.json"), "{").unwrap();
    let e = ChatTemplate::from_hf_dir(&d).unwrap_err().to_string();
    assert!(e.contains("tokenizer_config.json"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A byte-level BPE tokenizer over `vocab` (no merges needed: every test string is a
/// vocabulary entry or an added token) with `special` as special added tokens.
fn tokenizer(vocab: &[&str], special: &[&str], eos: Vec<u32>) -> Tokenizer {
    let mut v = serde_json::Map::new();
    for (i, t) in vocab.iter().enumerate() {
        v.insert(t.to_string(), i.into());
    }
    let added: Vec<serde_json::Value> = special
        .iter()
        .map(|t| {
            serde_json::json!({"id": vocab.iter().position(|v| v == t).unwrap(), "content": t,
                "single_word": false, "lstrip": false, "rstrip": false, "normalized": false,
                "special": true})
        })
        .collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": true, "use_regex": true},
        "post_processor": null, "decoder": {"type": "ByteLevel", "add_prefix_space": false,
            "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "vocab": v, "merges": []}
    });
    let inner = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes()).unwrap();
    Tokenizer::new(inner, eos)
}

#[test]
fn stop_tokens_are_the_end_of_turn_markers_that_are_single_tokens() {
    let f = fixture();
    let by_name = |n: &str| template(f.templates.iter().find(|t| t.name == n).unwrap());
    let vocab = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|eot_id|>",
        "<|begin_of_text|>",
        "a",
    ];
    let all = tokenizer(&vocab, &vocab[..5], vec![2]);
    // ChatML: <|im_end|> (also the EOS here) and <|endoftext|>
    assert_eq!(
        by_name("qwen2.5-coder-1.5b-instruct").stop_token_ids(&all),
        [2, 0]
    );
    // Llama 3: the template's eos_token <|eot_id|>; ChatML markers not used there
    let llama = tokenizer(&vocab, &vocab[..5], vec![4]);
    assert_eq!(by_name("llama3").stop_token_ids(&llama), [4, 3]);
    // a marker the tokenizer splits into pieces is no stop token
    let plain = tokenizer(&vocab, &["<|endoftext|>"], vec![0]);
    assert_eq!(by_name("smollm2-135m-instruct").stop_token_ids(&plain), [0]);
}

fn models_dir() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/dustin/models")
}

#[test]
#[ignore = "needs the GGUF files in ~/.cache/dustin/models"]
fn gguf_files_hold_the_fixture_templates() {
    let f = fixture();
    let mut seen = 0;
    for t in &f.templates {
        let Some(file) = &t.gguf_file else { continue };
        let path = models_dir().join(file);
        let m = ModelFiles::open(&path).unwrap();
        let ct = m.chat_template.as_ref().unwrap();
        assert_eq!(ct.source(), t.template, "{file}");
        assert_eq!(ct.bos_token(), t.bos_token.as_deref(), "{file}");
        assert_eq!(ct.eos_token(), t.eos_token.as_deref(), "{file}");
        // the rendered control tokens are single special tokens of the model's tokenizer
        let text = ct.render(&t.cases[0].messages, true).unwrap();
        let ids = m.tokenizer.encode(&text).unwrap();
        let im_start = m.tokenizer.token_to_id("<|im_start|>").unwrap();
        assert_eq!(ids[0], im_start, "{file}");
        assert_eq!(m.tokenizer.decode(&ids).unwrap(), text, "{file}");
        let stops = ct.stop_token_ids(&m.tokenizer);
        let im_end = m.tokenizer.token_to_id("<|im_end|>").unwrap();
        assert!(stops.contains(&im_end), "{file}: {stops:?}");
        seen += 1;
    }
    assert!(seen >= 1, "no GGUF template in the fixture");
}
