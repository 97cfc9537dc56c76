//! Parity with HF transformers: logits of tiny random Qwen2 / Llama models, computed by
//! `scripts/make_parity_fixtures.py` with transformers in float64 (eager attention), against
//! ours in f32 on the CPU. Max abs error must be <= 1e-4 for the prefill (every position),
//! every decode step, chunked prefill, and a batch of two prompts of different lengths.

mod common;

use burn_flex::FlexDevice;
use burn_tensor::{Int, Tensor, TensorData};
use common::{fixture, max_err, Reference, B};
use dustin_core::{DenseHook, KvStore, Phase};
use dustin_qwen::generate::{prefill, prefill_from};
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2, QwenConfig, SafetensorsDir};

const TOL: f32 = 1e-4;

fn load(name: &str) -> (Qwen2<B>, Reference) {
    (common::load(name), common::reference(name))
}

/// As [`load`], with each layer's RoPE and cache write as one op or three.
fn load_rope_kv(name: &str, one_op: bool) -> (Qwen2<B>, Reference) {
    let (m, r) = load(name);
    (m.with_rope_kv_write(one_op), r)
}

fn rows(t: Tensor<B, 3>) -> Vec<Vec<f32>> {
    let [b, n, v] = t.dims();
    let d: Vec<f32> = t.into_data().convert::<f32>().into_vec().expect("f32");
    (0..b * n).map(|i| d[i * v..(i + 1) * v].to_vec()).collect()
}

fn decode(model: &Qwen2<B>, cache: &mut dustin_kv::DenseKvCache<B>, toks: &[u32]) -> Vec<Vec<f32>> {
    let batch: Vec<Vec<u32>> = toks.iter().map(|&t| vec![t]).collect();
    let out = model
        .forward(
            &batch,
            cache,
            &mut DenseHook,
            ForwardOpts {
                phase: Phase::Decode,
                logits: LogitsMode::Last,
                layers: None,
            },
        )
        .expect("decode");
    rows(out.logits.expect("logits"))
}

fn check_single(name: &str, chunk: usize) {
    check_single_with(name, chunk, false);
}

fn check_single_with(name: &str, chunk: usize, rope_kv: bool) {
    let (model, r) = load_rope_kv(name, rope_kv);
    for (ci, case) in r.cases.iter().enumerate() {
        let (mut cache, _, all) = prefill(
            &model,
            std::slice::from_ref(&case.prompt),
            64,
            None,
            &mut DenseHook,
            chunk,
            true,
        )
        .expect("prefill");
        let got = rows(all[0].clone());
        assert_eq!(got.len(), case.prefill_logits.len());
        let mut worst = 0.0f32;
        for (g, e) in got.iter().zip(&case.prefill_logits) {
            worst = worst.max(max_err(g, e));
        }
        println!("{name} case {ci} chunk {chunk}: prefill max abs err {worst:.2e}");
        assert!(worst <= TOL, "{name} case {ci}: prefill error {worst}");
        for (step, (&t, e)) in case
            .decode_tokens
            .iter()
            .zip(&case.decode_logits)
            .enumerate()
        {
            let g = decode(&model, &mut cache, &[t]);
            let err = max_err(&g[0], e);
            println!("{name} case {ci}: decode step {step} max abs err {err:.2e}");
            assert!(err <= TOL, "{name} case {ci} step {step}: error {err}");
        }
    }
}

fn check_batch(name: &str) {
    check_batch_with(name, false);
}

fn check_batch_with(name: &str, rope_kv: bool) {
    let (model, r) = load_rope_kv(name, rope_kv);
    let prompts: Vec<Vec<u32>> = r.cases.iter().map(|c| c.prompt.clone()).collect();
    assert!(
        prompts.len() >= 2 && prompts[0].len() != prompts[1].len(),
        "two prompts of different lengths"
    );
    let (mut cache, last, _) =
        prefill(&model, &prompts, 64, None, &mut DenseHook, 512, false).expect("prefill");
    let [b, v] = last.dims();
    let last = rows(last.reshape([b, 1, v]));
    for (ci, case) in r.cases.iter().enumerate() {
        let err = max_err(&last[ci], case.prefill_logits.last().expect("logits"));
        assert!(
            err <= TOL,
            "{name} batch case {ci}: last prefill error {err}"
        );
    }
    for step in 0..3 {
        let toks: Vec<u32> = r.cases.iter().map(|c| c.decode_tokens[step]).collect();
        let g = decode(&model, &mut cache, &toks);
        for (ci, case) in r.cases.iter().enumerate() {
            let err = max_err(&g[ci], &case.decode_logits[step]);
            println!("{name} batch: seq {ci} decode step {step} max abs err {err:.2e}");
            assert!(err <= TOL, "{name} batch seq {ci} step {step}: error {err}");
        }
    }
}

#[test]
fn qwen2_tied_matches_transformers() {
    check_single("qwen2-tied", 512);
    check_single("qwen2-tied", 4);
    check_batch("qwen2-tied");
}

#[test]
fn qwen2_gqa7_matches_transformers() {
    check_single("qwen2-gqa7", 512);
    check_single("qwen2-gqa7", 3);
    check_batch("qwen2-gqa7");
}

/// RoPE of the queries and keys and the cache write as one op (`Qwen2::with_rope_kv_write`,
/// `KernelOps::rope_kv_write`): prefill in chunks, decode steps, a ragged batch.
#[test]
fn rope_with_cache_write_as_one_op_matches_transformers() {
    check_single_with("qwen2-gqa7", 3, true);
    check_batch_with("qwen2-gqa7", true);
}

/// One prefix cache shared by a batch (clones of one cache, as the benchmark's random
/// prefix gives every sequence): both sequences' rests run from it, the last logits and a
/// decode step match the HF reference at those positions, and the shared cache is left as
/// it was (its clones are not written through).
#[test]
fn a_prefix_shared_by_the_batch_matches_transformers() {
    let (model, r) = load("qwen2-gqa7");
    let case = &r.cases[0];
    let p = &case.prompt;
    let n = p.len();
    assert!(n >= 6, "a prompt of at least 6 tokens");
    let k = n - 4;
    let (prefix, _, _) = prefill(
        &model,
        &[p[..k].to_vec()],
        64,
        None,
        &mut DenseHook,
        512,
        false,
    )
    .expect("prefix");
    let kept = prefix.clone();
    let prompts = vec![p.clone(), p[..k + 2].to_vec()];
    let (mut cache, last, _) = prefill_from(
        &model,
        &prompts,
        Some(vec![prefix.clone(), prefix]),
        64,
        None,
        &mut DenseHook,
        2,
        false,
    )
    .expect("prefill from the shared prefix");
    let [b, v] = last.dims();
    let last = rows(last.reshape([b, 1, v]));
    let want = [&case.prefill_logits[n - 1], &case.prefill_logits[k + 1]];
    for (seq, (g, e)) in last.iter().zip(want).enumerate() {
        let err = max_err(g, e);
        assert!(err <= TOL, "seq {seq}: last prefill error {err}");
    }
    let g = decode(&model, &mut cache, &[case.decode_tokens[0], p[k + 2]]);
    let want = [&case.decode_logits[0], &case.prefill_logits[k + 2]];
    for (seq, (g, e)) in g.iter().zip(want).enumerate() {
        let err = max_err(g, e);
        assert!(err <= TOL, "seq {seq}: decode error {err}");
    }
    assert_eq!(kept.lens(), &[k]);
    // a prefix of other layers than the run is refused, alone as in a batch
    let shallow = prefill(
        &model,
        &[p[..k].to_vec()],
        64,
        Some(1),
        &mut DenseHook,
        512,
        false,
    )
    .expect("one-layer prefix")
    .0;
    for prompts in [vec![p.clone()], vec![p.clone(), p.clone()]] {
        let out = prefill_from(
            &model,
            &prompts,
            Some(vec![shallow.clone(); prompts.len()]),
            64,
            None,
            &mut DenseHook,
            2,
            false,
        );
        let Err(e) = out else {
            panic!("a one-layer prefix for a full-depth run was accepted");
        };
        assert!(e.to_string().contains("layers"), "{e}");
    }
    let again = decode(&model, &mut kept.clone(), &[p[k]]);
    let err = max_err(&again[0], &case.prefill_logits[k]);
    assert!(err <= TOL, "the shared prefix afterwards: error {err}");
}

#[test]
fn llama_matches_transformers() {
    check_single("llama", 512);
    check_single("llama", 2);
    check_batch("llama");
}

/// The batch's decode steps fed as token ids on the device (`Qwen2::forward_ids`, how a
/// greedy draft feeds its own choices) match the HF reference as the host tokens do.
#[test]
fn decode_from_device_ids_matches_transformers() {
    let (model, r) = load("qwen2-gqa7");
    let prompts: Vec<Vec<u32>> = r.cases.iter().map(|c| c.prompt.clone()).collect();
    let (mut cache, _, _) =
        prefill(&model, &prompts, 64, None, &mut DenseHook, 512, false).expect("prefill");
    let dev = FlexDevice;
    for step in 0..3 {
        let toks: Vec<i64> = r
            .cases
            .iter()
            .map(|c| c.decode_tokens[step] as i64)
            .collect();
        let b = toks.len();
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(toks, [b, 1]), &dev);
        let out = model
            .forward_ids(
                ids,
                &mut cache,
                &mut DenseHook,
                ForwardOpts {
                    phase: Phase::Decode,
                    logits: LogitsMode::Last,
                    layers: None,
                },
            )
            .expect("decode from device ids");
        let g = rows(out.logits.expect("logits"));
        for (ci, case) in r.cases.iter().enumerate() {
            let err = max_err(&g[ci], &case.decode_logits[step]);
            assert!(err <= TOL, "seq {ci} step {step}: error {err}");
        }
    }
}

/// Ids outside the vocabulary given to `Qwen2::forward_ids` (a refused greedy row is marked
/// -2) run as the nearest id inside it, never as an out-of-bounds row of the embedding.
#[test]
fn device_ids_outside_the_vocabulary_are_clamped() {
    let (model, r) = load("qwen2-tied");
    let vocab = model.config.vocab_size as u32;
    let prompt = r.cases[0].prompt.clone();
    let prompts = vec![prompt.clone(), prompt];
    let opts = ForwardOpts {
        phase: Phase::Decode,
        logits: LogitsMode::Last,
        layers: None,
    };
    let run = |ids: Option<Vec<i64>>| {
        let (mut cache, _, _) =
            prefill(&model, &prompts, 64, None, &mut DenseHook, 512, false).expect("prefill");
        let out = match ids {
            Some(v) => model.forward_ids(
                Tensor::<B, 2, Int>::from_data(TensorData::new(v, [2, 1]), &FlexDevice),
                &mut cache,
                &mut DenseHook,
                opts,
            ),
            None => model.forward(
                &[vec![0], vec![vocab - 1]],
                &mut cache,
                &mut DenseHook,
                opts,
            ),
        };
        rows(out.expect("decode").logits.expect("logits"))
    };
    let clamped = run(Some(vec![-2, vocab as i64 + 7]));
    let host = run(None);
    assert_eq!(clamped, host);
    // and the two rows differ: the clamp went to each end of the vocabulary
    assert_ne!(clamped[0], clamped[1]);
}

/// `Qwen2::forward_ids` refuses a batch other than the cache's, no new tokens and no
/// sequences (a cache emptied by `retain`) with a prompt error, never a panic.
#[test]
fn device_ids_of_a_wrong_shape_are_errors() {
    use dustin_core::KvStore;
    let (model, r) = load("qwen2-tied");
    let prompts = vec![r.cases[0].prompt.clone(), r.cases[1].prompt.clone()];
    let (mut cache, _, _) =
        prefill(&model, &prompts, 64, None, &mut DenseHook, 512, false).expect("prefill");
    let opts = ForwardOpts {
        phase: Phase::Decode,
        logits: LogitsMode::Last,
        layers: None,
    };
    let ids = |b: usize, n: usize| {
        Tensor::<B, 2, Int>::from_data(TensorData::new(vec![1i64; b * n], [b, n]), &FlexDevice)
    };
    let msg = |e: dustin_qwen::QwenError| e.to_string();
    let lens = cache.lens().to_vec();
    for (b, n, want) in [(3, 1, "batch of 3"), (2, 0, "no new tokens")] {
        let e = model
            .forward_ids(ids(b, n), &mut cache, &mut DenseHook, opts)
            .err()
            .unwrap_or_else(|| panic!("[{b}, {n}] ids: expected an error"));
        assert!(msg(e).contains(want), "[{b}, {n}] ids");
        assert_eq!(cache.lens(), lens.as_slice(), "the cache is unchanged");
    }
    cache.retain(&[]).expect("retain none");
    match model.forward_ids(ids(0, 1), &mut cache, &mut DenseHook, opts) {
        Err(e) => assert!(msg(e).contains("no sequences")),
        Ok(_) => panic!("an empty batch is an error"),
    }
}

#[test]
fn wrong_tensor_shape_is_named() {
    let dir = fixture("qwen2-tied");
    let mut cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    cfg.intermediate_size += 1;
    let src = SafetensorsDir::open(&dir).expect("safetensors");
    let err = Qwen2::<B>::load(&cfg, &src, 64, &FlexDevice)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mlp.gate_proj.weight")
            && err.contains("[65, 64]")
            && err.contains("[64, 64]"),
        "{err}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let dir = fixture("qwen2-tied");
    let mut cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    cfg.num_hidden_layers = 3;
    let src = SafetensorsDir::open(&dir).expect("safetensors");
    let err = Qwen2::<B>::load(&cfg, &src, 64, &FlexDevice)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.layers.2.input_layernorm.weight") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn truncated_safetensors_is_a_clear_error() {
    let src = fixture("qwen2-tied");
    let dir = std::env::temp_dir().join(format!("dustin-trunc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let bytes = std::fs::read(src.join("model.safetensors")).expect("read");
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() / 2]).expect("write");
    let err = SafetensorsDir::open(&dir).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        err.contains("malformed safetensors") && err.contains("model.safetensors"),
        "{err}"
    );
}

#[test]
fn prompt_errors_are_named() {
    let (model, _) = load("llama");
    let limit = model.config.max_position_embeddings;
    let long = vec![1u32; limit + 1];
    let err = dustin_qwen::generate::check_prompts(&model, &[vec![1, 2], long], 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prompt 1") && err.contains("max_position_embeddings"),
        "{err}"
    );
    let err = dustin_qwen::generate::check_prompts(&model, &[vec![]], 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("prompt 0") && err.contains("empty"), "{err}");
    let err = dustin_qwen::generate::check_prompts(&model, &[vec![96]], 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("outside the vocabulary"), "{err}");
}
