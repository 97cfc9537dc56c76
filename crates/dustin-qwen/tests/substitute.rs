//! SubSpec substitute models on the 2-layer Llama parity fixture: resident layers, embedding,
//! norm and LM head are the target's tensors unchanged; substituted layers hold the
//! packed quantized weights, whose dequantized values are bit for bit the host
//! quantizer's (within half a step of the target's, not identical) with biases
//! and norms exact; their logits move away from the target's as bits drop; bad inputs are
//! named.

mod common;

use burn_flex::{Flex, FlexDevice};
use burn_tensor::{backend::Backend, Tensor};
use dustin_qwen::model::{Linear, Weight};
use dustin_qwen::substitute::{fake_quantize, quantize, second_half};
use dustin_qwen::{substitute_model, Qwen2, SubstituteConfig};

type B = Flex;

fn model(name: &str) -> Qwen2<B> {
    common::load(name)
}

fn host<const D: usize, BB: Backend>(t: &Tensor<BB, D>) -> Vec<f32> {
    t.clone()
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap()
}

/// A weight's dense values on the host (dequantized for a packed substitute).
fn wt(w: &Weight<B>) -> Vec<f32> {
    host(&w.to_dense(&FlexDevice).unwrap())
}

fn linears<BB: Backend>(l: &dustin_qwen::model::Layer<BB>) -> [(&'static str, &Linear<BB>); 7] {
    [
        ("q", &l.q),
        ("k", &l.k),
        ("v", &l.v),
        ("o", &l.o),
        ("gate", &l.gate),
        ("up", &l.up),
        ("down", &l.down),
    ]
}

#[test]
fn resident_tensors_are_the_targets_and_substitutes_are_within_half_a_step() {
    let target = model("llama");
    assert_eq!(target.layers.len(), 2);
    let cfg = SubstituteConfig { bits: 4, group: 16 };
    let layers = second_half(2);
    assert_eq!(layers, vec![1]);
    let sub = substitute_model(&target, &layers, cfg).unwrap();
    // shared: embedding, final norm, LM head, every tensor of layer 0
    let embed = |m: &dustin_qwen::Qwen2<B>| host(&m.embed.to_dense(&FlexDevice).unwrap());
    assert_eq!(embed(&sub), embed(&target));
    assert_eq!(wt(&sub.lm_head), wt(&target.lm_head));
    assert_eq!(host(&sub.norm.weight), host(&target.norm.weight));
    let (t0, s0) = (&target.layers[0], &sub.layers[0]);
    assert_eq!(host(&s0.input_norm.weight), host(&t0.input_norm.weight));
    assert_eq!(host(&s0.post_norm.weight), host(&t0.post_norm.weight));
    for ((name, a), (_, b)) in linears(t0).into_iter().zip(linears(s0)) {
        assert!(
            matches!(b.weight, Weight::Dense(_)),
            "layer 0 {name} stays dense"
        );
        assert_eq!(wt(&a.weight), wt(&b.weight), "layer 0 {name}");
    }
    // substituted: layer 1's linear weights; its norms exact
    let (t1, s1) = (&target.layers[1], &sub.layers[1]);
    assert_eq!(host(&s1.input_norm.weight), host(&t1.input_norm.weight));
    assert_eq!(host(&s1.post_norm.weight), host(&t1.post_norm.weight));
    for ((name, a), (_, b)) in linears(t1).into_iter().zip(linears(s1)) {
        let [rows, cols] = a.weight.dims();
        assert_eq!(b.weight.dims(), [rows, cols]);
        // the CPU backend keeps the dequantized values (GPU backends the packed codes, whose
        // values are checked bit for bit against the host quantizer below)
        assert!(matches!(b.weight, Weight::Dense(_)), "layer 1 {name}");
        let w = wt(&a.weight);
        let d = wt(&b.weight);
        assert_eq!(
            d,
            fake_quantize(&w, rows, cols, cfg).unwrap(),
            "layer 1 {name}"
        );
        assert_ne!(d, w, "layer 1 {name} must not be identical to the target's");
        let q = quantize(&w, rows, cols, cfg).unwrap();
        let mut changed = 0usize;
        for r in 0..rows {
            for c in 0..cols {
                let s = q.scale[(r / cfg.group) * cols + c];
                let e = (d[r * cols + c] - w[r * cols + c]).abs();
                assert!(
                    e <= s / 2.0 * (1.0 + 1e-4) + 1e-7,
                    "layer 1 {name} [{r}, {c}]: {e} > {s} / 2"
                );
                changed += usize::from(e > 0.0);
            }
        }
        // 4 bits over a group of 16: all but about the group's min and max move
        assert!(
            changed * 2 > rows * cols,
            "layer 1 {name}: only {changed} of {} changed",
            rows * cols
        );
        assert_eq!(
            a.bias.as_ref().map(host),
            b.bias.as_ref().map(host),
            "layer 1 {name} bias"
        );
    }
}

/// Largest logit difference to the target over a short prompt.
fn logit_gap(target: &Qwen2<B>, sub: &Qwen2<B>) -> f32 {
    let prompt = vec![vec![5u32, 17, 33, 2, 90, 61, 7, 44, 12, 3, 71]];
    let run = |m: &Qwen2<B>| common::forward_logits(m, &mut m.new_cache(1, 32, None), &prompt);
    common::max_err(&run(target), &run(sub))
}

#[test]
fn logits_move_away_from_the_target_as_bits_drop() {
    let target = model("qwen2-tied");
    let gap = |bits| {
        let cfg = SubstituteConfig { bits, group: 16 };
        logit_gap(&target, &substitute_model(&target, &[1], cfg).unwrap())
    };
    let (g8, g4, g2) = (gap(8), gap(4), gap(2));
    let exact = logit_gap(
        &target,
        &substitute_model(&target, &[], SubstituteConfig::default()).unwrap(),
    );
    assert_eq!(exact, 0.0, "no substituted layer: the target itself");
    assert!(
        g8 > 0.0 && g8 < g4 && g4 < g2,
        "gaps 8/4/2 bits: {g8} {g4} {g2}"
    );
}

#[test]
fn bad_substitute_inputs_are_named() {
    let target = model("llama");
    let cases = [
        (
            vec![0usize, 2],
            SubstituteConfig::default(),
            "invalid config value `substitute.layers` = 2: layer indices 0 ..= 1 (the target has 2 layers)",
        ),
        (
            vec![1],
            SubstituteConfig { bits: 9, group: 64 },
            "invalid config value `substitute.bits` = 9: 2 ..= 8",
        ),
        (
            vec![1],
            SubstituteConfig { bits: 1, group: 64 },
            "invalid config value `substitute.bits` = 1: 2 ..= 8",
        ),
        (
            vec![1],
            SubstituteConfig { bits: 4, group: 0 },
            "invalid config value `substitute.group` = 0",
        ),
    ];
    for (layers, cfg, want) in cases {
        let e = substitute_model(&target, &layers, cfg)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{layers:?} {cfg:?}: {e}");
    }
}

#[test]
fn packed_words_unpack_to_the_host_dequantization_for_every_width() {
    use dustin_qwen::substitute::PackedWeight;
    // odd shapes: rows not a multiple of the group, groups not a multiple of the codes per
    // word (3 bits: 10 per word; group 7), one column
    let shapes = [
        (150usize, 5usize, 64usize),
        (23, 3, 7),
        (64, 1, 64),
        (9, 4, 16),
    ];
    for bits in 2..=8u32 {
        for &(rows, cols, group) in &shapes {
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * (1.0 + (i % 5) as f32))
                .collect();
            let cfg = SubstituteConfig { bits, group };
            let q = quantize(&w, rows, cols, cfg).unwrap();
            // a group's max takes the top code: the words' highest fields are exercised
            let top = q.codes.iter().copied().max().unwrap() as u32;
            assert_eq!(top + 1, 1 << bits, "{bits} bits");
            let p = PackedWeight::<B>::new(&q, &FlexDevice).unwrap();
            assert_eq!([p.rows, p.cols], [rows, cols]);
            let d = host(&p.dequantize());
            assert_eq!(
                d,
                q.dequantize(),
                "{bits} bits, {rows}x{cols}, group {group}"
            );
        }
    }
}

#[test]
fn long_groups_empty_matrices_and_hand_built_codes_are_handled() {
    use dustin_qwen::substitute::{PackedWeight, QuantizedMatrix};
    // a group longer than the matrix is one group of all its rows
    let w = [0.0f32, 1.0, 2.0, 3.0];
    let long = quantize(
        &w,
        4,
        1,
        SubstituteConfig {
            bits: 2,
            group: 1_000_000,
        },
    )
    .unwrap();
    let whole = quantize(&w, 4, 1, SubstituteConfig { bits: 2, group: 4 }).unwrap();
    assert_eq!(long, whole);
    let p = PackedWeight::<B>::new(&long, &FlexDevice).unwrap();
    assert_eq!(host(&p.dequantize()), vec![0.0, 1.0, 2.0, 3.0]);
    assert!(quantize(&[], 0, 4, SubstituteConfig::default()).is_err());
    let bad = QuantizedMatrix {
        codes: vec![0; 3],
        ..whole.clone()
    };
    let e = PackedWeight::<B>::new(&bad, &FlexDevice)
        .unwrap_err()
        .to_string();
    assert!(e.contains("substitute codes"), "{e}");
    let bad = QuantizedMatrix {
        cfg: SubstituteConfig { bits: 40, group: 4 },
        ..whole
    };
    let e = PackedWeight::<B>::new(&bad, &FlexDevice)
        .unwrap_err()
        .to_string();
    assert!(e.contains("substitute.bits"), "{e}");
}

/// A set cancel token on the target (`Qwen2::with_cancel`) stops the quantization with
/// `CoreError::Cancelled`; one never set changes nothing.
#[test]
fn a_cancelled_target_stops_the_quantization() {
    let token = dustin_core::CancelToken::new();
    let target = model("llama").with_cancel(token.clone());
    let cfg = SubstituteConfig { bits: 4, group: 16 };
    let plain = substitute_model(&target, &[0, 1], cfg).unwrap();
    assert_eq!(
        wt(&plain.layers[1].q.weight),
        wt(&substitute_model(&model("llama"), &[0, 1], cfg)
            .unwrap()
            .layers[1]
            .q
            .weight)
    );
    token.cancel();
    let e = substitute_model(&target, &[0, 1], cfg).unwrap_err();
    assert!(
        matches!(
            e,
            dustin_qwen::QwenError::Core(dustin_core::CoreError::Cancelled { .. })
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "cancelled during the substitute's quantization"
    );
}
