//! A server on a loopback port over tiny random-weight models (the HF parity fixtures of
//! `dustin-qwen`, vocab 96) with a word-level tokenizer of tokens `t0`..`t95`, and the
//! library's own output for the same prompts to compare with.

#![allow(dead_code)]

use std::path::Path;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};

use burn_flex::{Flex, FlexDevice};
use dustin_core::{DenseHook, SamplingConfig};
use dustin_qwen::chat::ChatTemplate;
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir, Tokenizer};
use dustin_serve::{Decoder, DecoderFactory, EngineConfig, Limits, Server, ServerConfig};
use dustin_spec::{ModelDrafter, ModelVerifier, SpecConfig, SpeculativeDecoder};
use serde_json::Value;

pub type B = Flex;

/// Draft tokens per iteration in every test.
pub const GAMMA: usize = 3;

/// Prompt tokens prefilled per chunk, by the server and by [`reference`].
pub const PREFILL_CHUNK: usize = 16;

pub fn model(name: &str) -> Arc<Qwen2<B>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dustin-qwen/tests/fixtures/parity")
        .join(name);
    let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    let src = SafetensorsDir::open(&dir).expect("weights");
    Arc::new(Qwen2::load(&cfg, &src, 256, &FlexDevice).expect("model"))
}

/// The word-level tokenizer over `t0 .. t95`, no EOS.
pub fn tokenizer() -> Tokenizer {
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..96).map(|i| (format!("t{i}"), i.into())).collect();
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}
    });
    // a file per call: tests run in parallel threads of one process
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let p = std::env::temp_dir().join(format!("dustin-serve-tok-{}-{n}.json", std::process::id()));
    std::fs::write(&p, json.to_string()).expect("tokenizer file");
    let tok = Tokenizer::from_file(&p, Vec::new()).expect("tokenizer");
    let _ = std::fs::remove_file(&p);
    tok
}

/// A chat template: each message's text between `t1` and `t2`, then `t3`; end of turn
/// token `t{eos}`.
pub fn chat_template(eos: u32) -> ChatTemplate {
    ChatTemplate::new(
        "{% for m in messages %}t1 {{ m.content }} t2 {% endfor %}{% if add_generation_prompt %}t3{% endif %}",
        "test",
    )
    .with_special_tokens(None, Some(format!("t{eos}")))
}

/// Speculative decoders over the two fixture models, dense verification.
pub struct Factory {
    pub target: Arc<Qwen2<B>>,
    pub draft: Arc<Qwen2<B>>,
    /// KV bytes allowed (`check_memory` refuses more).
    pub memory: u64,
    /// When set, `build` reports on the first channel and waits on the second.
    pub gate: Option<(Sender<()>, Mutex<Receiver<()>>)>,
    /// When set, every decoding step takes at least this long (requests overlap in time).
    pub step_delay: Option<std::time::Duration>,
}

/// A decoder whose steps take at least `1` (see [`Factory::step_delay`]).
pub struct Slow(pub Box<dyn Decoder>, pub std::time::Duration);

impl Decoder for Slow {
    fn open(&self, cfg: &SpecConfig) -> dustin_spec::Result<dustin_spec::SpecRun> {
        self.0.open(cfg)
    }
    fn join(
        &mut self,
        run: &mut dustin_spec::SpecRun,
        prompt: &[u32],
        limits: &dustin_spec::SeqLimits,
        room: usize,
    ) -> dustin_spec::Result<usize> {
        self.0.join(run, prompt, limits, room)
    }
    fn prefill(
        &mut self,
        run: &mut dustin_spec::SpecRun,
        chunk: usize,
        budget: usize,
        tok: &Tokenizer,
        on: &mut dyn FnMut(usize, &[u32]),
    ) -> dustin_spec::Result<usize> {
        std::thread::sleep(self.1);
        self.0.prefill(run, chunk, budget, tok, on)
    }
    fn step(
        &mut self,
        run: &mut dustin_spec::SpecRun,
        tok: &Tokenizer,
        on: &mut dyn FnMut(usize, &[u32]),
    ) -> dustin_spec::Result<()> {
        std::thread::sleep(self.1);
        self.0.step(run, tok, on)
    }
}

/// KV bytes per token of target and draft (f32).
pub fn kv_per_token(f: &Factory) -> u64 {
    (f.target.config.kv_bytes_per_token(4) + f.draft.config.kv_bytes_per_token(4)) as u64
}

impl DecoderFactory for Factory {
    fn check_memory(&self, batch: usize, capacity: usize) -> Result<u64, String> {
        let need = kv_per_token(self) * (batch * capacity) as u64;
        if need > self.memory {
            return Err(format!("{need} bytes needed, {} allowed", self.memory));
        }
        Ok(need)
    }

    fn build(&mut self, extra: usize) -> Result<Box<dyn Decoder>, String> {
        if let Some((entered, go)) = &self.gate {
            let _ = entered.send(());
            let _ = go.lock().expect("gate").recv();
        }
        let dec: Box<dyn Decoder> = Box::new(SpeculativeDecoder::new(
            ModelDrafter::new(self.draft.clone(), None, extra),
            ModelVerifier::new(self.target.clone(), DenseHook, extra, 96),
        ));
        Ok(match self.step_delay {
            Some(d) => Box::new(Slow(dec, d)),
            None => dec,
        })
    }
}

pub fn factory() -> Factory {
    Factory {
        target: model("qwen2-tied"),
        draft: model("qwen2-gqa7"),
        memory: u64::MAX,
        gate: None,
        step_delay: None,
    }
}

pub fn config() -> ServerConfig {
    ServerConfig {
        model_id: "tiny".into(),
        limits: Limits {
            max_prompt_tokens: 64,
            max_tokens: 48,
            default_max_tokens: 16,
            max_queue: 64,
            max_stop: 4,
        },
        engine: EngineConfig {
            gamma: GAMMA,
            max_batch: 16,
            prefill_chunk: PREFILL_CHUNK,
        },
    }
}

/// A running server: its base URL and the sender that shuts it down.
pub struct Running {
    pub base: String,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub done: tokio::task::JoinHandle<Result<(), dustin_serve::ServeError>>,
}

pub async fn spawn(cfg: ServerConfig, f: Factory) -> Running {
    spawn_with(cfg, f, chat_template(7)).await
}

/// [`spawn`] with the chat template `tpl`.
pub async fn spawn_with(cfg: ServerConfig, f: Factory, tpl: ChatTemplate) -> Running {
    let server = Server::start(cfg, tokenizer(), Some(tpl), move || {
        Ok(Box::new(f) as Box<dyn DecoderFactory>)
    })
    .expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let done = tokio::spawn(server.serve(listener, async move {
        let _ = rx.await;
    }));
    Running {
        base,
        stop: Some(tx),
        done,
    }
}

/// The library's greedy (or seeded sampled) output for `prompt` alone: its text (end
/// tokens left out, as the server does) and its tokens.
pub fn reference(
    prompt: &str,
    max_tokens: usize,
    eos: &[u32],
    sampling: SamplingConfig,
    seed: u64,
) -> (String, Vec<u32>) {
    let f = factory();
    let tok = tokenizer();
    let ids = tok.encode(prompt).expect("encode");
    let extra = max_tokens + 2 * (GAMMA + 2);
    let mut dec = SpeculativeDecoder::new(
        ModelDrafter::new(f.draft, None, extra).with_prefill_chunk(PREFILL_CHUNK),
        ModelVerifier::new(f.target, DenseHook, extra, 96).with_prefill_chunk(PREFILL_CHUNK),
    );
    let cfg = SpecConfig {
        gamma: GAMMA,
        max_new_tokens: max_tokens,
        sampling,
        seed,
        eos: eos.to_vec(),
        stop_strings: Vec::new(),
    };
    let o = dec
        .generate(&[ids], &cfg, Some(&tok), &mut |_, _| {})
        .expect("generate");
    let t = o.tokens[0].clone();
    let text: Vec<u32> = t.iter().copied().filter(|x| !eos.contains(x)).collect();
    (tok.decode(&text).expect("decode"), t)
}

/// A prompt of `n` words from `seed`.
pub fn prompt(seed: usize, n: usize) -> String {
    (0..n)
        .map(|i| format!("t{}", (seed * 31 + i * 7 + 3) % 96))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The value of a metric line `name` (with its labels) in Prometheus text.
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        .map(str::to_string)
        .collect()
}

pub async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json body"))
}

pub async fn post_stream(base: &str, path: &str, body: Value) -> Vec<String> {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .expect("type")
        .starts_with("text/event-stream"));
    sse_data(&r.text().await.expect("body"))
}

pub async fn metrics(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// Polls `/metrics` until `cond` holds (the engine frees a batch at its next iteration).
pub async fn until_metrics(base: &str, cond: impl Fn(&str) -> bool) -> String {
    for _ in 0..2000 {
        let m = metrics(base).await;
        if cond(&m) {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!(
        "metrics never reached the condition:\n{}",
        metrics(base).await
    );
}

pub fn idle(m: &str) -> bool {
    metric(m, "dustin_active_sequences") == Some(0.0)
        && metric(m, "dustin_batches") == Some(0.0)
        && metric(m, "dustin_kv_bytes") == Some(0.0)
        && metric(m, "dustin_queue_depth") == Some(0.0)
}

/// The text of a streamed completion's chunks, and the last finish reason.
pub fn stream_text(chunks: &[String], chat: bool) -> (String, String) {
    assert_eq!(
        chunks.last().map(String::as_str),
        Some("[DONE]"),
        "{chunks:?}"
    );
    let mut text = String::new();
    let mut finish = String::new();
    for c in &chunks[..chunks.len() - 1] {
        let v: Value = serde_json::from_str(c).expect("chunk json");
        let Some(choice) = v["choices"].get(0) else {
            continue;
        };
        let t = if chat {
            &choice["delta"]["content"]
        } else {
            &choice["text"]
        };
        text.push_str(t.as_str().unwrap_or(""));
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}
