//! The draft's lookahead signal scored after drafting (`LookaheadScoring::Deferred`, one
//! `Qwen2::key_mass` call per layer) equals the signal scored in every draft step's own pass
//! (`LookaheadScoring::PerStep`, the attention probabilities of the plain path or the scoring
//! op of the kernel path), on tiny random models (the HF parity fixtures of `dustin-qwen`),
//! CPU: equal and unequal pending counts (the first step's rows are kept or scored in their
//! pass), gamma 1 to 5, a ragged batch.

use std::path::Path;
use std::sync::Arc;

use burn_flex::{Flex, FlexDevice};
use dustin_core::{DraftCtx, Drafter};
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir};
use dustin_spec::{LookaheadConfig, LookaheadScoring, ModelDrafter};

type B = Flex;

fn model(name: &str, kernels: bool) -> Arc<Qwen2<B>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dustin-qwen/tests/fixtures/parity")
        .join(name);
    let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    let src = SafetensorsDir::open(&dir).expect("weights");
    Arc::new(
        Qwen2::load(&cfg, &src, 256, &FlexDevice)
            .expect("model")
            .with_kernels(Some(kernels)),
    )
}

fn drafter(
    m: &Arc<Qwen2<B>>,
    scoring: LookaheadScoring,
    layers: Option<Vec<usize>>,
) -> ModelDrafter<B> {
    ModelDrafter::new(m.clone(), None, 48).with_lookahead(LookaheadConfig { layers, scoring })
}

fn ctx(gamma: usize) -> DraftCtx {
    DraftCtx {
        gamma,
        temperature: 0.0,
        top_p: 1.0,
        top_k: 0,
        seed: 7,
        want_lookahead: true,
        vocab: 96,
    }
}

/// One proposal of each drafter: equal tokens, equal lookahead (a distribution over the
/// positions each sequence's draft could see). Returns the drafted tokens.
fn propose_both(
    a: &mut ModelDrafter<B>,
    b: &mut ModelDrafter<B>,
    gamma: usize,
    what: &str,
) -> Vec<Vec<u32>> {
    let pa = a.propose(&ctx(gamma)).expect("per-step proposal");
    let pb = b.propose(&ctx(gamma)).expect("deferred proposal");
    assert_eq!(pa.tokens, pb.tokens, "{what}: tokens");
    let la = pa.lookahead.expect("per-step lookahead");
    let lb = pb.lookahead.expect("deferred lookahead");
    assert_eq!(la.dims(), lb.dims(), "{what}: lookahead shape");
    let [rows, width] = la.dims();
    let va: Vec<f32> = la.into_data().to_vec().unwrap();
    let vb: Vec<f32> = lb.into_data().to_vec().unwrap();
    let err = va
        .iter()
        .zip(&vb)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(err < 1e-5, "{what}: max abs difference {err}");
    for r in 0..rows {
        let row = &vb[r * width..(r + 1) * width];
        let total: f32 = row.iter().sum();
        assert!(
            (total - 1.0).abs() < 1e-4,
            "{what}: row {r} sums to {total}"
        );
        // spread over more than one position (not a degenerate one-hot)
        let top = row.iter().copied().fold(0.0f32, f32::max);
        assert!(top < 0.99, "{what}: row {r} has all its mass on one key");
    }
    pa.tokens
}

#[test]
fn deferred_lookahead_equals_per_step_lookahead() {
    let prompts: Vec<Vec<u32>> = vec![
        vec![5, 17, 33, 2, 90, 61, 7, 44, 12, 3, 71],
        vec![9, 1, 64, 30, 22],
        vec![
            40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56,
        ],
    ];
    let first = [11u32, 12, 13];
    for name in ["qwen2-gqa7", "llama"] {
        for kernels in [false, true] {
            let m = model(name, kernels);
            for gamma in [1usize, 3, 5] {
                // all layers, and a subset (layer 0 only)
                for layers in [None, Some(vec![0])] {
                    let what = format!("{name} kernels {kernels} gamma {gamma} layers {layers:?}");
                    let mut a = drafter(&m, LookaheadScoring::PerStep, layers.clone());
                    let mut b = drafter(&m, LookaheadScoring::Deferred, layers);
                    a.prefill(&prompts, &first).unwrap();
                    b.prefill(&prompts, &first).unwrap();
                    // one pending token each
                    let t = propose_both(&mut a, &mut b, gamma, &format!("{what}, first"));
                    // sequence 0 accepts everything (two pending tokens), the others not:
                    // the next first step feeds unequal counts
                    let accepted = [gamma, 0, 1.min(gamma)];
                    let next: Vec<u32> = t.iter().map(|d| (d[0] + 1) % 96).collect();
                    a.commit(&accepted, &next).unwrap();
                    b.commit(&accepted, &next).unwrap();
                    propose_both(&mut a, &mut b, gamma, &format!("{what}, unequal pending"));
                    // everyone accepts everything: two pending tokens each, equal counts
                    let all = [gamma; 3];
                    let next = [1u32, 2, 3];
                    a.commit(&all, &next).unwrap();
                    b.commit(&all, &next).unwrap();
                    propose_both(&mut a, &mut b, gamma, &format!("{what}, two pending each"));
                }
            }
        }
    }
}
