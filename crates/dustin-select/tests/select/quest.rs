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
