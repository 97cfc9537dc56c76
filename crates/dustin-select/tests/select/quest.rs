//! Quest's cached page bounds: selections through the selector over growing, rolled-back
//! contexts, uniform and ragged, equal the ranking of the uncached [`page_scores`].

use burn_tensor::{Tensor, TensorData};
use dustin_core::{LayerAttnCtx, Phase};
use dustin_select::estimators::quest::page_scores;
use dustin_select::{build, select_top_k, SelectConfig};

use crate::common::{dev, host_f32, rows, Synth, B};

/// The selection the uncached page scores of `q` against `k` rank for contexts `lens`: every
/// token its page's score, the top-k of `cfg`'s keep rule.
fn uncached_selection(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    lens: &[usize],
    kvh: usize,
    cfg: &SelectConfig,
) -> dustin_core::LayerSelection<B> {
    let pages = host_f32(page_scores(q, k, lens, 16));
    let width = lens.iter().copied().max().unwrap_or(0);
    let np = width.div_ceil(16);
    let b = lens.len();
    let tokens: Vec<f32> = (0..b)
        .flat_map(|s| (0..kvh).map(move |h| (s, h)))
        .flat_map(|(s, h)| (0..width).map(move |t| (s, h, t)))
        .map(|(s, h, t)| pages[(s * kvh + h) * np + t / 16])
        .collect();
    select_top_k(
        Tensor::<B, 3>::from_data(TensorData::new(tokens, [b, kvh, width]), &dev()),
        lens,
        cfg.keep(),
    )
    .unwrap()
}

/// Runs quest through the selector from contexts `lens` over six verifications of 5 new
/// tokens, sequence `s` accepting `accepted[it][s]` drafts at verification `it`, and checks
/// every layer's selection against [`uncached_selection`].
fn check_against_uncached(seed: u64, lens: &[usize], accepted: &[&[usize]]) {
    let cfg = SelectConfig {
        budget: 40,
        n_sink: 2,
        window: 6,
        ..SelectConfig::default()
    };
    let (layers, kvh, g, d) = (2usize, 2usize, 3usize, 8usize);
    let b = lens.len();
    let mut s = Synth::new(seed, layers, kvh, g, d, b, 160);
    let mut p = build::<B>("quest", &cfg).unwrap();
    p.reset(b, layers);
    s.prefill(p.as_mut(), lens, 16);
    let mut lens = lens.to_vec();
    let seqs: Vec<usize> = (0..b).collect();
    for (it, acc) in accepted.iter().enumerate() {
        p.begin_verify(it);
        let n = 5;
        for layer in 0..layers {
            let q = s.q(b, n);
            let width = lens.iter().max().unwrap() + n;
            let k = s.k(layer, &seqs, width);
            let ctx = LayerAttnCtx {
                layer,
                phase: Phase::Decode,
                q: &q,
                k: &k,
                ctx_lens: &lens,
                n_new: n,
                scale: s.scale(),
            };
            let sel = p.on_layer(&ctx).unwrap().unwrap();
            let want = uncached_selection(&q, &k, &lens, kvh, &cfg);
            assert_eq!(
                rows(&sel),
                rows(&want),
                "it {it} layer {layer} lens {lens:?}"
            );
        }
        p.commit(acc).unwrap();
        for (l, a) in lens.iter_mut().zip(acc.iter()) {
            *l += a + 1;
        }
    }
}

#[test]
fn quest_cached_bounds_match_the_uncached_page_scores() {
    check_against_uncached(17, &[61], &[&[3], &[0], &[4], &[1], &[2], &[4]]);
}

/// A ragged batch: the pages below the shortest context come from the cache, the rest are
/// bounded per sequence; the contexts cross page boundaries at different verifications.
#[test]
fn quest_ragged_bounds_match_the_uncached_page_scores() {
    check_against_uncached(
        23,
        &[61, 40, 47],
        &[
            &[3, 0, 4],
            &[0, 4, 1],
            &[4, 4, 0],
            &[1, 2, 3],
            &[2, 0, 4],
            &[4, 1, 1],
        ],
    );
}

/// Contexts that grow by 60 tokens, past the room of the first bounds buffer (its keys'
/// pages and an eighth more): the full pages move into a larger buffer and the selections
/// still equal the uncached ones.
#[test]
fn quest_bounds_survive_their_buffer_growing() {
    let acc: [&[usize]; 12] = [&[4, 3]; 12];
    check_against_uncached(29, &[61, 50], &acc);
}

/// Queries and keys in bf16 (the CUDA models' dtype) on a backend whose default float is f32:
/// the bounds buffer takes the keys' dtype, and the page scores over three growing contexts
/// equal those of the same values in f32 (bf16 to f32 is exact, every bound is one of the
/// keys) within the rounding of bf16 products.
#[test]
fn quest_bounds_take_the_keys_dtype() {
    use dustin_core::{ImportanceEstimator, ScoreCtx, Scores};
    use dustin_select::estimators::quest::{Quest, QuestConfig};
    let (kvh, g, d, b) = (2usize, 3usize, 8usize, 2usize);
    let mut s = Synth::new(31, 1, kvh, g, d, b, 160);
    let seqs: Vec<usize> = (0..b).collect();
    let mut est = [
        Quest::<B>::new(QuestConfig::default()).unwrap(),
        Quest::<B>::new(QuestConfig::default()).unwrap(),
    ];
    // equal contexts: the plain path of the ragged tail (`quest_page_bounds`) takes f32 only
    for lens in [[61, 61], [66, 66], [90, 90]] {
        let q = s.q(b, 5);
        let k32 = s.k(0, &seqs, lens[0] + 5).cast(burn_tensor::DType::BF16);
        let k32 = k32.cast(burn_tensor::DType::F32);
        let k16 = k32.clone().cast(burn_tensor::DType::BF16);
        let q = q
            .cast(burn_tensor::DType::BF16)
            .cast(burn_tensor::DType::F32);
        let q16 = q.clone().cast(burn_tensor::DType::BF16);
        let mut got = Vec::new();
        for (e, (q, k)) in est.iter_mut().zip([(&q, &k32), (&q16, &k16)]) {
            let attn = LayerAttnCtx {
                layer: 0,
                phase: Phase::Decode,
                q,
                k,
                ctx_lens: &lens,
                n_new: 5,
                scale: s.scale(),
            };
            let ctx = ScoreCtx {
                attn: &attn,
                budget: 40,
                n_sink: 2,
                window: 6,
                iteration: 0,
            };
            match e.score(&ctx).expect("quest scores") {
                Scores::Tokens(t) => got.push(host_f32(t.cast(burn_tensor::DType::F32))),
                Scores::Dense => panic!("quest scores tokens"),
            }
        }
        assert_eq!(got[0].len(), got[1].len(), "lens {lens:?}");
        for (i, (a, z)) in got[0].iter().zip(&got[1]).enumerate() {
            assert!(
                (a - z).abs() <= 1e-2 * a.abs().max(1.0),
                "lens {lens:?} at {i}: {a} {z}"
            );
        }
    }
}
