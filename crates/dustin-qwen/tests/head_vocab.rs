//! `Qwen2::with_head_vocab` (an LM head over part of the vocabulary, for a draft): the kept
//! ids' logits are HF transformers' (float64, `scripts/make_parity_fixtures.py`) within
//! 1e-4 at every prompt position, every other id's logit is `-inf`; with the head in GGUF
//! blocks the kept ids' logits are the full head's bit for bit (each output of the block
//! product is its own dot product); and bad ids are refused with the input named.

mod common;

use std::sync::Arc;

use burn_tensor::Tensor;
use common::{load, max_err, random_blocks, reference, B};
use dustin_core::DenseHook;
use dustin_kernels::cpu_quant::{QuantMatrix, QuantType};
use dustin_qwen::generate::prefill;
use dustin_qwen::{HeadVocab, Qwen2, QwenError, Weight};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Every prompt position's logits of `model` on fixture case `case`, one row each.
fn prompt_logits(model: &Qwen2<B>, prompt: &[u32]) -> Vec<Vec<f32>> {
    let (_, _, all) = prefill(
        model,
        std::slice::from_ref(&prompt.to_vec()),
        64,
        None,
        &mut DenseHook,
        64,
        true,
    )
    .expect("prefill");
    let t: Tensor<B, 3> = all[0].clone();
    let [b, n, v] = t.dims();
    let d: Vec<f32> = t.into_data().convert::<f32>().into_vec().expect("f32");
    (0..b * n).map(|i| d[i * v..(i + 1) * v].to_vec()).collect()
}

/// Checks that `row` is `-inf` exactly off `keep`.
fn masked_off(row: &[f32], keep: &HeadVocab) {
    for (id, &x) in row.iter().enumerate() {
        let kept = keep.ids().binary_search(&(id as u32)).is_ok();
        assert_eq!(
            x == f32::NEG_INFINITY,
            !kept,
            "id {id}: logit {x}, kept {kept}"
        );
    }
}

#[test]
fn kept_ids_match_transformers_and_the_rest_are_minus_infinity() {
    let model = load("qwen2-tied");
    let vocab = model.config.vocab_size;
    // a prefix, one id in the middle and the last id: three runs with gaps between
    let keep = HeadVocab::frequency_ranked(16, &[40, (vocab - 1) as u32], vocab).expect("ids");
    assert_eq!(keep.ids().len(), 18);
    let model = model.with_head_vocab(Some(&keep)).expect("head");
    assert_eq!(model.head_vocab_len(), Some(18));
    let r = reference("qwen2-tied");
    let mut worst = 0.0f32;
    for case in &r.cases {
        let got = prompt_logits(&model, &case.prompt);
        assert_eq!(got.len(), case.prefill_logits.len());
        for (g, e) in got.iter().zip(&case.prefill_logits) {
            masked_off(g, &keep);
            let gk: Vec<f32> = keep.ids().iter().map(|&i| g[i as usize]).collect();
            let ek: Vec<f32> = keep.ids().iter().map(|&i| e[i as usize]).collect();
            worst = worst.max(max_err(&gk, &ek));
        }
    }
    println!("kept logits: max abs error {worst:.2e} against transformers");
    assert!(worst <= 1e-4, "kept logits off by {worst}");
}

#[test]
fn a_block_head_keeps_the_full_heads_logits_bit_for_bit() {
    let mut model = load("qwen2-tied");
    let (vocab, hidden) = (model.config.vocab_size, model.config.hidden_size);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let data = random_blocks(QuantType::Q8_0, vocab, hidden, &mut rng);
    let q = QuantMatrix::new(QuantType::Q8_0, vocab, hidden, data).expect("blocks");
    model.lm_head = Weight::Blocks(Arc::new(q));
    let keep = HeadVocab::frequency_ranked(5, &[(vocab / 2) as u32], vocab).expect("ids");
    let sub = model.clone().with_head_vocab(Some(&keep)).expect("head");
    let prompt = &reference("qwen2-tied").cases[0].prompt;
    let full = prompt_logits(&model, prompt);
    let part = prompt_logits(&sub, prompt);
    for (f, p) in full.iter().zip(&part) {
        masked_off(p, &keep);
        for &id in keep.ids() {
            assert_eq!(
                f[id as usize].to_bits(),
                p[id as usize].to_bits(),
                "id {id}"
            );
        }
        // a full row has no -inf: the mask above is the subset's doing
        assert!(f.iter().all(|x| x.is_finite()));
    }
    // back to every id
    let back = sub.with_head_vocab(None).expect("full");
    assert_eq!(back.head_vocab_len(), None);
    assert_eq!(prompt_logits(&back, prompt), full);
}

#[test]
fn ids_outside_the_vocabulary_are_refused() {
    let model = load("qwen2-tied");
    let vocab = model.config.vocab_size;
    for (rows, extra) in [(0, vec![]), (vocab + 1, vec![]), (4, vec![vocab as u32])] {
        match HeadVocab::frequency_ranked(rows, &extra, vocab) {
            Err(QwenError::ConfigValue { key, .. }) => {
                assert!(key == "rows" || key == "extra", "{key}")
            }
            other => panic!("rows {rows} extra {extra:?}: {other:?}"),
        }
    }
    // a vocabulary larger than the model's head
    let keep = HeadVocab::frequency_ranked(4, &[vocab as u32], vocab + 1).expect("ids");
    let e = model.with_head_vocab(Some(&keep)).unwrap_err();
    assert!(e.to_string().contains("head_vocab"), "{e}");
}
