//! Static and dynamic estimators under a padded KV view: a planted heavy hitter is kept,
//! SnapKV's window is the prompt's end, Quest and the oracle never select the padding.

use burn_tensor::{Tensor, TensorData};
use dustin_core::{AttentionHook, LayerAttnCtx, Phase, SelectionPolicy};
use dustin_select::{build, SelectConfig};

use crate::common::{dev, rows, B};

/// Plants a key that every query attends to at `pos` and checks `spec` keeps it.
fn keeps_planted_heavy_hitter(spec: &str) {
    // budget above SnapKV's kept observation window (16 queries of the last chunk here)
    let cfg = SelectConfig {
        budget: 24,
        n_sink: 1,
        window: 2,
        ..SelectConfig::default()
    };
    let mut p = build::<B>(spec, &cfg).unwrap();
    let (kvh, g, d, len, pos) = (1usize, 2usize, 4usize, 48usize, 20usize);
    // queries all along +x; keys small except position `pos` = 8 x
    let mut keys = vec![0.01f32; kvh * (len + 4) * d];
    keys[pos * d] = 8.0;
    let k = |l: usize, b: usize| {
        let mut v = Vec::new();
        for _ in 0..b {
            v.extend_from_slice(&keys[..l * d]);
        }
        Tensor::<B, 4>::from_data(TensorData::new(v, [b, kvh, l, d]), &dev())
    };
    let q = |b: usize, n: usize| {
        let mut v = vec![0.0f32; b * kvh * g * n * d];
        v.iter_mut().step_by(d).for_each(|x| *x = 1.0);
        Tensor::<B, 4>::from_data(TensorData::new(v, [b, kvh * g, n, d]), &dev())
    };
    p.reset(1, 1);
    for (start, end) in [(0usize, 32usize), (32, len)] {
        let (qq, kk) = (q(1, end - start), k(end, 1));
        let ctx = LayerAttnCtx {
            layer: 0,
            phase: Phase::Prefill {
                seq: 0,
                last_chunk: end == len,
            },
            q: &qq,
            k: &kk,
            ctx_lens: &[start],
            n_new: end - start,
            scale: 0.5,
        };
        assert!(p.on_layer(&ctx).unwrap().is_none());
    }
    p.begin_verify(0);
    let (qq, kk) = (q(1, 3), k(len + 3, 1));
    let ctx = LayerAttnCtx {
        layer: 0,
        phase: Phase::Decode,
        q: &qq,
        k: &kk,
        ctx_lens: &[len],
        n_new: 3,
        scale: 0.5,
    };
    let sel = p.on_layer(&ctx).unwrap().unwrap();
    assert!(
        rows(&sel)[0][0].contains(&pos),
        "{spec} lost the heavy hitter: {:?}",
        rows(&sel)[0][0]
    );
}

/// Keys of one sequence with one KV head (head_dim 4) in the model's padded view of 64
/// positions: small keys, heavy ones (8.0) at `heavy`, and the padding past the `len`-token
/// context filled with huge keys (50.0: stale slots, never to be read).
fn padded_view_keys(heavy: std::ops::Range<usize>, len: usize) -> Tensor<B, 4> {
    let (d, view) = (4usize, 64usize);
    let mut keys = vec![0.01f32; view * d];
    for pos in heavy {
        keys[pos * d] = 8.0;
    }
    for pos in len..view {
        keys[pos * d] = 50.0;
    }
    Tensor::<B, 4>::from_data(TensorData::new(keys, [1, 1, view, d]), &dev())
}

/// `n` queries of `heads` heads (one KV head, head_dim 4), each the unit vector e_0.
fn unit_queries(heads: usize, n: usize) -> Tensor<B, 4> {
    let d = 4usize;
    let mut v = vec![0.0f32; heads * n * d];
    v.iter_mut().step_by(d).for_each(|x| *x = 1.0);
    Tensor::<B, 4>::from_data(TensorData::new(v, [1, heads, n, d]), &dev())
}

/// The positions a policy selects for one new token at context `len` (layer 0, sequence 0,
/// KV head 0).
fn decode_selection(
    p: &mut dyn dustin_core::SelectionPolicy<B>,
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    len: usize,
) -> Vec<usize> {
    let dec = LayerAttnCtx {
        layer: 0,
        phase: Phase::Decode,
        q,
        k,
        ctx_lens: &[len],
        n_new: 1,
        scale: 0.5,
    };
    let sel = p.on_layer(&dec).unwrap().unwrap();
    rows(&sel)[0][0].clone()
}

/// The model pads its KV view past the prompt (`dustin_qwen::KV_VIEW_MULTIPLE`): SnapKV's
/// observation window must still be the prompt's last positions, not the view's. A 40-token
/// prompt in a 64-position view, heavy keys at 3..12 that outvote everything else, window 8:
/// the kept window is 32..40; read from the view's end it would be 56..64, past the context,
/// and the heavy keys would take its place (a defect a review found).
#[test]
fn snapkv_window_is_the_prompt_end_under_a_padded_view() {
    let cfg = SelectConfig {
        budget: 11,
        n_sink: 1,
        window: 2,
        ..SelectConfig::default()
    };
    let mut p =
        dustin_select::build_with::<B>("snapkv", &cfg, Some(serde_json::json!({"obs_window": 8})))
            .unwrap();
    let (g, len) = (2usize, 40usize);
    let kk = padded_view_keys(3..12, len);
    p.reset(1, 1);
    let qq = unit_queries(g, len);
    let pre = LayerAttnCtx {
        layer: 0,
        phase: Phase::Prefill {
            seq: 0,
            last_chunk: true,
        },
        q: &qq,
        k: &kk,
        ctx_lens: &[0],
        n_new: len,
        scale: 0.5,
    };
    assert!(p.on_layer(&pre).unwrap().is_none());
    p.begin_verify(0);
    let got = &decode_selection(p.as_mut(), &unit_queries(g, 1), &kk, len);
    for pos in len - 8..len {
        assert!(
            got.contains(&pos),
            "window position {pos} not kept: {got:?}"
        );
    }
}

/// Quest and the oracle score over the model's padded view (`score_width`), not `max(ctx)`:
/// the columns past the context must never be selected, whatever the stale slots there hold.
/// A 40-token context in a 64-position view, heavy keys filling Quest's second page (16..32)
/// and a budget of exactly that page beside the sink and the window, huge keys in the
/// padding. (The top-k has always dropped columns past each context; this pins that it still
/// does at the wider width.)
#[test]
fn quest_and_oracle_never_select_the_padding_of_the_view() {
    let cfg = SelectConfig {
        budget: 19,
        n_sink: 1,
        window: 2,
        ..SelectConfig::default()
    };
    let len = 40usize;
    let kk = padded_view_keys(16..32, len);
    let qq = unit_queries(2, 1);
    for spec in ["quest", "oracle"] {
        let mut p = dustin_select::build_with::<B>(spec, &cfg, None).unwrap();
        p.reset(1, 1);
        p.begin_verify(0);
        let got = &decode_selection(p.as_mut(), &qq, &kk, len);
        assert!(
            got.iter().all(|&x| x < len),
            "{spec} selected past the context of {len}: {got:?}"
        );
        for pos in 16..32 {
            assert!(got.contains(&pos), "{spec} lost heavy key {pos}: {got:?}");
        }
    }
}

#[test]
fn static_and_dynamic_estimators_keep_a_heavy_hitter() {
    for spec in ["h2o", "snapkv", "oracle", "quest", "history-only"] {
        keeps_planted_heavy_hitter(spec);
    }
}
