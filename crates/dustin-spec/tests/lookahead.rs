//! The draft's lookahead signal scored after drafting (`LookaheadScoring::Deferred`, one
//! `Qwen2::key_mass` call per layer) equals the signal scored in every draft step's own pass
//! (`LookaheadScoring::PerStep`, the attention probabilities of the plain path or the scoring
//! op of the kernel path), on tiny random models (the HF parity fixtures of `dustin-qwen`),
//! CPU: equal and unequal pending counts (the first step's rows are kept or scored in their
//! pass), gamma 1 to 5, a ragged batch.
//!
//! A draft that attends to a selection of its context (`ModelDrafter::with_draft_selection`):
//! its selection is the sinks, the window and the top of the previous proposal's mass
//! (checked against a host top-k of that lookahead, shared and per layer), and greedy
//! speculative decoding with it still emits the target's own greedy tokens.

use std::path::Path;
use std::sync::Arc;

use burn_flex::{Flex, FlexDevice};
use dustin_core::{DenseHook, DraftCtx, Drafter};
use dustin_qwen::generate::{generate, GenerateConfig};
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir};
use dustin_select::KeepRule;
use dustin_spec::{
    DraftSelection, LookaheadConfig, LookaheadScoring, ModelDrafter, ModelVerifier, SpecConfig,
    SpeculativeDecoder,
};

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
        want_lookahead: true,
        ..DraftCtx::greedy(gamma, 96)
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

const KEEP: KeepRule = KeepRule {
    budget: 20,
    n_sink: 2,
    window: 6,
};

/// Prompts longer than [`KEEP`]'s budget (the draft then selects), of different lengths.
fn long_prompts() -> Vec<Vec<u32>> {
    vec![
        (0..47).map(|i| ((i * 13 + 5) % 96) as u32).collect(),
        (0..33).map(|i| ((i * 7 + 40) % 96) as u32).collect(),
    ]
}

/// The host's sparse selection for a context of `ctx` tokens from the last lookahead row
/// `la`: sinks, window, and the best `budget - n_sink - window` of the rest (no ties among
/// random floats), ascending.
fn host_selection(la: &[f32], ctx: usize, k: KeepRule) -> Vec<usize> {
    let (lo, hi) = (k.n_sink, ctx - k.window);
    let mut free: Vec<usize> = (lo..hi).collect();
    free.sort_by(|&a, &b| {
        let (x, y) = (
            la.get(a).copied().unwrap_or(0.0),
            la.get(b).copied().unwrap_or(0.0),
        );
        y.partial_cmp(&x).unwrap()
    });
    let mut keep: Vec<usize> = (0..lo).chain(hi..ctx).collect();
    keep.extend(free.into_iter().take(k.budget - k.n_sink - k.window));
    keep.sort_unstable();
    keep
}

/// Two proposals of a sparse draft (the first dense) beside the same draft dense
/// throughout, sequence 0 accepting one draft token in between: the first proposal's
/// lookahead `[batch * width]` and width, the sparse draft after its second proposal, and
/// whether the second proposals' lookaheads differ (the layers attended to something else).
fn two_proposals(
    m: &Arc<Qwen2<B>>,
    sel: DraftSelection,
    layers: Option<Vec<usize>>,
) -> (Vec<f32>, usize, ModelDrafter<B>, f32) {
    let mut d = drafter(m, LookaheadScoring::Deferred, layers.clone())
        .with_draft_selection(Some(sel))
        .unwrap();
    let mut dense = drafter(m, LookaheadScoring::Deferred, layers);
    let prompts = long_prompts();
    d.prefill(&prompts, &[1, 2]).unwrap();
    dense.prefill(&prompts, &[1, 2]).unwrap();
    let gamma = 3;
    let p1 = d.propose(&ctx(gamma)).unwrap();
    let p1_dense = dense.propose(&ctx(gamma)).unwrap();
    assert_eq!(
        p1.tokens, p1_dense.tokens,
        "the first proposals are both dense"
    );
    assert!(d.last_selection().is_empty(), "first proposal is dense");
    let la = p1.lookahead.unwrap();
    let width = la.dims()[1];
    let la: Vec<f32> = la.into_data().to_vec().unwrap();
    d.commit(&[1, 0], &[7, 8]).unwrap();
    dense.commit(&[1, 0], &[7, 8]).unwrap();
    let p2 = d.propose(&ctx(gamma)).unwrap();
    let p2_dense = dense.propose(&ctx(gamma)).unwrap();
    let a: Vec<f32> = p2.lookahead.unwrap().into_data().to_vec().unwrap();
    let b: Vec<f32> = p2_dense.lookahead.unwrap().into_data().to_vec().unwrap();
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    (la, width, d, diff)
}

/// Contexts at the second proposal: prompt + first pending token + accepted draft tokens.
const CTXS: [usize; 2] = [47 + 1 + 1, 33 + 1];

/// The kept positions of `sel` `[batch, kv_heads, k]`, per (sequence, KV head).
fn rows_of(sel: &dustin_core::LayerSelection<B>) -> Vec<Vec<Vec<usize>>> {
    let [b, h, k] = sel.indices.dims();
    let idx: Vec<i64> = sel
        .indices
        .clone()
        .into_data()
        .convert::<i64>()
        .to_vec()
        .unwrap();
    (0..b)
        .map(|s| {
            (0..h)
                .map(|j| {
                    idx[(s * h + j) * k..][..sel.counts[s]]
                        .iter()
                        .map(|&i| i as usize)
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Shared ranking, and per-layer ranking where only layer 1 feeds the mass (qwen2-gqa7 has
/// one KV head, so layer 1's mass is the lookahead up to its normalisation): every layer's
/// selection is the host's top-k of the first proposal's lookahead with sinks and window.
#[test]
fn sparse_draft_selects_sinks_window_and_the_top_of_its_last_lookahead() {
    for kernels in [false, true] {
        let m = model("qwen2-gqa7", kernels);
        let kvh = m.config.kv_heads();
        let cases = [
            (false, None, 1usize),
            (true, Some(vec![1usize]), m.config.num_hidden_layers),
        ];
        for (per_layer, layers, groups) in cases {
            let what = format!("kernels {kernels}, per layer {per_layer}");
            let sel = DraftSelection {
                keep: KEEP,
                per_layer,
            };
            let (la, width, d, diff) = two_proposals(&m, sel, layers);
            assert!(
                diff > 1e-4,
                "{what}: the sparse draft attended densely ({diff})"
            );
            assert_eq!(d.last_selection().len(), groups, "{what}");
            for sel in d.last_selection() {
                assert_eq!(sel.counts, vec![KEEP.budget, KEEP.budget], "{what}");
                assert_eq!(sel.indices.dims()[..2], [2, kvh], "{what}");
                for (s, heads) in rows_of(sel).iter().enumerate() {
                    let want = host_selection(&la[s * width..(s + 1) * width], CTXS[s], KEEP);
                    for got in heads {
                        assert_eq!(got, &want, "{what}, sequence {s}");
                    }
                }
            }
        }
    }
}

/// Per-layer ranking with every layer feeding the mass (llama: 2 layers, 2 KV heads): each
/// row keeps the sinks and the window, ascending positions below its context, and the two
/// layers choose differently.
#[test]
fn per_layer_sparse_draft_ranks_each_layer_by_its_own_mass() {
    let m = model("llama", false);
    let (_, _, d, diff) = two_proposals(&m, DraftSelection::new(KEEP), None);
    assert!(diff > 1e-4, "the sparse draft attended densely ({diff})");
    let sels = d.last_selection();
    assert_eq!(sels.len(), 2);
    let rows: Vec<_> = sels.iter().map(rows_of).collect();
    for layer in &rows {
        for (s, heads) in layer.iter().enumerate() {
            for row in heads {
                assert_eq!(row.len(), KEEP.budget);
                assert!(row.windows(2).all(|w| w[0] < w[1]), "{row:?}");
                assert!(row.iter().all(|&p| p < CTXS[s]), "{row:?}");
                for p in (0..KEEP.n_sink).chain(CTXS[s] - KEEP.window..CTXS[s]) {
                    assert!(row.contains(&p), "sequence {s}: {p} missing from {row:?}");
                }
            }
        }
    }
    assert_ne!(rows[0], rows[1], "both layers chose the same positions");
}

#[test]
fn greedy_speculative_with_a_sparse_draft_equals_autoregressive() {
    let target = model("qwen2-tied", false);
    let other = model("qwen2-gqa7", false);
    let prompts = long_prompts();
    let max_new = 14;
    let cfg = GenerateConfig {
        max_new_tokens: max_new,
        ..GenerateConfig::default()
    };
    let reference = generate(&target, &prompts, &cfg, None, &mut |_, _| {})
        .unwrap()
        .tokens;
    // an EOS id sequence 1 emits mid-way: it leaves the batch (the draft keeps sequence 0's
    // row of its last lookahead)
    // (applied by hand to the autoregressive output: without a tokenizer it knows no EOS)
    let eos = (3..max_new - 2)
        .map(|p| reference[1][p])
        .find(|t| !reference[0].contains(t))
        .expect("a token of sequence 1 that sequence 0 never emits");
    let reference_eos: Vec<Vec<u32>> = reference
        .iter()
        .map(|t| match t.iter().position(|&x| x == eos) {
            Some(p) => t[..=p].to_vec(),
            None => t.clone(),
        })
        .collect();
    assert!(reference_eos[1].len() < max_new && reference_eos[0].len() == max_new);
    for (gamma, eos) in [(2usize, vec![]), (4, vec![]), (3, vec![eos])] {
        let want = if eos.is_empty() {
            &reference
        } else {
            &reference_eos
        };
        for (label, draft) in [("self", target.clone()), ("other", other.clone())] {
            let extra = max_new + 2 * (gamma + 2);
            let drafter = ModelDrafter::new(draft, None, extra)
                .with_draft_selection(Some(DraftSelection::new(KEEP)))
                .unwrap();
            let verifier = ModelVerifier::new(target.clone(), DenseHook, extra, 96);
            let mut dec = SpeculativeDecoder::new(drafter, verifier);
            let scfg = SpecConfig {
                gamma,
                max_new_tokens: max_new,
                eos: eos.clone(),
                ..SpecConfig::default()
            };
            let out = dec.generate(&prompts, &scfg, None, &mut |_, _| {}).unwrap();
            assert_eq!(
                &out.tokens, want,
                "gamma {gamma}, draft {label}, eos {eos:?}"
            );
        }
    }
}

#[test]
fn a_draft_budget_without_room_to_choose_is_named() {
    let m = model("llama", false);
    let bad = KeepRule {
        budget: 8,
        n_sink: 2,
        window: 6,
    };
    let e = ModelDrafter::new(m, None, 8)
        .with_draft_selection(Some(DraftSelection::new(bad)))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("budget") && e.contains("n_sink + window = 2 + 6 = 8"),
        "{e}"
    );
}

/// A sparse draft whose first step feeds unequal pending counts scores the first rows and
/// the later rows in two calls whose key views end on different sides of a 64-position
/// boundary (63 + 1 against 65 + 2 keys): the masses of different widths are summed.
#[test]
fn sparse_draft_sums_masses_of_different_widths() {
    let m = model("llama", false);
    let mut d = drafter(&m, LookaheadScoring::Deferred, None)
        .with_draft_selection(Some(DraftSelection::new(KEEP)))
        .unwrap();
    let prompts: Vec<Vec<u32>> = vec![
        (0..60).map(|i| ((i * 5 + 1) % 96) as u32).collect(),
        (0..33).map(|i| ((i * 3 + 2) % 96) as u32).collect(),
    ];
    d.prefill(&prompts, &[4, 5]).unwrap();
    let gamma = 3;
    d.propose(&ctx(gamma)).unwrap();
    // sequence 0 accepts all three: its context is 63 with 2 pending tokens
    d.commit(&[gamma, 0], &[6, 7]).unwrap();
    let p = d.propose(&ctx(gamma)).unwrap();
    assert_eq!(d.last_selection().len(), 2);
    let la = p.lookahead.unwrap();
    let [_, w] = la.dims();
    assert!(w >= 67, "width {w}");
    let v: Vec<f32> = la.into_data().to_vec().unwrap();
    for row in v.chunks(w) {
        let total: f32 = row.iter().sum();
        assert!((total - 1.0).abs() < 1e-4, "{total}");
    }
}

/// A selection rule makes the draft keep its rows whatever the scoring setting: with
/// per-step scoring the second proposal selects (the first, dense one made the per-layer
/// masses); with gamma 1, a dense proposal (contexts within the budget) after unequal
/// pending counts has only its first step's row 0 to score, and the next proposal, past
/// the budget, still selects.
#[test]
fn a_selection_rule_selects_under_per_step_scoring_and_gamma_1() {
    let m = model("llama", false);
    for scoring in [LookaheadScoring::PerStep, LookaheadScoring::Deferred] {
        let mut d = drafter(&m, scoring, None)
            .with_draft_selection(Some(DraftSelection::new(KEEP)))
            .unwrap();
        d.prefill(&long_prompts(), &[1, 2]).unwrap();
        d.propose(&ctx(3)).unwrap();
        d.commit(&[1, 0], &[7, 8]).unwrap();
        d.propose(&ctx(3)).unwrap();
        assert_eq!(
            d.last_selection().len(),
            2,
            "{scoring:?}: the second proposal selects"
        );
        // gamma 1, contexts 19 and 18 (within the budget of 20): dense proposals
        let mut d = drafter(&m, scoring, None)
            .with_draft_selection(Some(DraftSelection::new(KEEP)))
            .unwrap();
        let short: Vec<Vec<u32>> = vec![(0..19).map(|i| i * 3 % 96).collect(), (0..18).collect()];
        d.prefill(&short, &[1, 2]).unwrap();
        d.propose(&ctx(1)).unwrap();
        // sequence 0 accepts (two pending tokens), sequence 1 not (one): contexts 20, 19
        d.commit(&[1, 0], &[7, 8]).unwrap();
        d.propose(&ctx(1)).unwrap();
        assert!(
            d.last_selection().is_empty(),
            "{scoring:?}: within the budget, dense"
        );
        // contexts 22 and 20: past the budget for sequence 0
        d.commit(&[1, 0], &[9, 10]).unwrap();
        d.propose(&ctx(1)).unwrap();
        assert_eq!(
            d.last_selection().len(),
            2,
            "{scoring:?}: gamma 1 after unequal pending counts selects"
        );
    }
}
