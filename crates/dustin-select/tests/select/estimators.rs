//! Per-estimator checks: the oracle against an independent f64 host computation, Quest's page
//! scores against hand-computed values, Dustin's and history-only's rollback, the reads each
//! estimator declares, and Dustin's re-ranked reuse (the planted heavy hitter under a padded
//! view is in `padded_view.rs`).

use burn_tensor::{Tensor, TensorData};
use dustin_core::{
    AttentionHook, ImportanceEstimator, LayerAttnCtx, LayerSelection, Phase, SelectionPolicy,
};
use dustin_select::estimators::quest::page_scores;
use dustin_select::estimators::{Dustin, DustinConfig, HistoryOnly, Oracle};
use dustin_select::registry::build_budgeted;
use dustin_select::{build, EstimationCost, KeepRule, SelectConfig, Selector};

use crate::common::{check_selection, dev, host_f32, rows, Synth, B};

// ---------------------------------------------------------------- oracle vs f64 reference

/// f64 attention mass per (seq, kv head, context position), summed over the group's heads and
/// the queries, computed on the host from the same numbers.
fn reference_mass(
    q: &[f32],
    k: &[f32],
    dims: (usize, usize, usize, usize, usize, usize),
    lens: &[usize],
) -> Vec<Vec<Vec<f64>>> {
    let (b, kvh, g, n, d, keys) = dims;
    let nh = kvh * g;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![vec![vec![0.0; keys]; kvh]; b];
    for bi in 0..b {
        for h in 0..nh {
            let kv = h / g;
            for i in 0..n {
                let visible = lens[bi] + i + 1;
                let qv = &q[((bi * nh + h) * n + i) * d..][..d];
                let logits: Vec<f64> = (0..visible)
                    .map(|j| {
                        let kvv = &k[((bi * kvh + kv) * keys + j) * d..][..d];
                        qv.iter()
                            .zip(kvv)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|x| (x - m).exp()).sum();
                for (j, x) in logits.iter().enumerate() {
                    out[bi][kv][j] += (x - m).exp() / z;
                }
            }
        }
    }
    out
}

#[test]
fn oracle_matches_f64_reference_top_k() {
    let (b, kvh, n, d) = (2, 2, 4, 8);
    let keep = KeepRule {
        budget: 16,
        n_sink: 2,
        window: 4,
    };
    let cfg = SelectConfig {
        budget: keep.budget,
        n_sink: keep.n_sink,
        window: keep.window,
        ..SelectConfig::default()
    };
    let mut checked = 0;
    for g in [5, 6, 7, 8] {
        let lens = [30usize, 45];
        let keys = 45 + n;
        let mut s = Synth::new(100 + g as u64, 1, kvh, g, d, b, 64);
        let qv = s.host_q(b, n);
        let kv = s.host_k(0, &[0, 1], keys);
        let q = Tensor::<B, 4>::from_data(TensorData::new(qv.clone(), [b, kvh * g, n, d]), &dev());
        let k = Tensor::<B, 4>::from_data(TensorData::new(kv.clone(), [b, kvh, keys, d]), &dev());
        let mut p = Selector::new(Oracle, cfg.clone()).unwrap();
        p.reset(b, 1);
        let ctx = LayerAttnCtx {
            layer: 0,
            phase: Phase::Decode,
            q: &q,
            k: &k,
            ctx_lens: &lens,
            n_new: n,
            scale: 1.0 / (d as f32).sqrt(),
        };
        let sel = p.on_layer(&ctx).unwrap().unwrap();
        let got = check_selection(&sel, &lens, keep, "oracle");
        let mass = reference_mass(&qv, &kv, (b, kvh, g, n, d, keys), &lens);
        for bi in 0..b {
            for h in 0..kvh {
                let ctx_len = lens[bi];
                let m = &mass[bi][h];
                let forced: Vec<usize> = (0..ctx_len)
                    .filter(|&p| p < keep.n_sink || p + keep.window >= ctx_len)
                    .collect();
                let mut rest: Vec<usize> = (0..ctx_len).filter(|p| !forced.contains(p)).collect();
                rest.sort_by(|&x, &y| m[y].total_cmp(&m[x]));
                let take = keep.budget - forced.len();
                // a near-tie at the boundary may legitimately flip between f32 and f64
                let gap = m[rest[take - 1]] - m[rest[take]];
                if gap < 1e-5 {
                    continue;
                }
                let mut want: Vec<usize> = forced
                    .iter()
                    .copied()
                    .chain(rest[..take].iter().copied())
                    .collect();
                want.sort_unstable();
                assert_eq!(got[bi][h], want, "g={g} seq {bi} kv head {h}");
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 14,
        "too many near-ties skipped ({checked} of 16 rows checked)"
    );
}

// ---------------------------------------------------------------- quest

#[test]
fn quest_page_scores_by_hand() {
    // one KV head, head_dim 2, page_size 2; keys k0=(1,-2) k1=(3,0) | k2=(-1,1) k3=(0,4)
    // page 0: min (1,-2) max (3,0); page 1: min (-1,1) max (0,4)
    let k = Tensor::<B, 4>::from_data(
        TensorData::new(
            vec![1.0f32, -2.0, 3.0, 0.0, -1.0, 1.0, 0.0, 4.0, 9.0, 9.0],
            [1, 1, 5, 2],
        ),
        &dev(),
    );
    // q = (1,-1): page 0: max(1,3) + max(2,0) = 5; page 1: max(-1,0) + max(-1,-4) = -1
    let q = Tensor::<B, 4>::from_data(TensorData::new(vec![1.0f32, -1.0], [1, 1, 1, 2]), &dev());
    assert_eq!(host_f32(page_scores(&q, &k, &[4], 2)), vec![5.0, -1.0]);
    // partial last page (ctx 3: page 1 holds k2 only, the 5th key is a new token, ignored):
    // page 1: max(-1,-1) + max(-1,-1) = -2
    assert_eq!(host_f32(page_scores(&q, &k, &[3], 2)), vec![5.0, -2.0]);
    // a group of two heads and two queries: max over both.
    // head 0 q=(1,-1) -> [5,-1]; head 0 query 2 q=(0,1) -> [0, 4]; head 1 q=(-1,0) -> [-1, 1]
    let q = Tensor::<B, 4>::from_data(
        TensorData::new(
            vec![1.0f32, -1.0, 0.0, 1.0, -1.0, 0.0, -1.0, 0.0],
            [1, 2, 2, 2],
        ),
        &dev(),
    );
    assert_eq!(host_f32(page_scores(&q, &k, &[4], 2)), vec![5.0, 4.0]);
}

// ---------------------------------------------------------------- rollback

struct Run<E> {
    p: Selector<B, E>,
    s: Synth,
}

const LENS: [usize; 2] = [37, 58];
const GAMMA1: usize = 4; // gamma + 1 verified positions

fn cfg() -> SelectConfig {
    SelectConfig {
        budget: 24,
        n_sink: 2,
        window: 6,
        ..SelectConfig::default()
    }
}

fn prepared<E: ImportanceEstimator<B> + EstimationCost + Clone + 'static>(est: E) -> Run<E> {
    prepared_with(est, cfg())
}

fn prepared_with<E: ImportanceEstimator<B> + EstimationCost + Clone + 'static>(
    est: E,
    cfg: SelectConfig,
) -> Run<E> {
    let mut p = Selector::new(est, cfg).unwrap();
    let mut s = Synth::new(42, 2, 2, 6, 8, 2, 128);
    p.reset(2, 2);
    s.prefill(&mut p, &LENS, 16);
    Run { p, s }
}

/// One verification on `q` (first `n` queries of it) with contexts `lens`, then commit.
fn verify_commit<E: ImportanceEstimator<B> + EstimationCost + Clone + 'static>(
    r: &mut Run<E>,
    qs: &[Tensor<B, 4>],
    lens: &[usize],
    n: usize,
    la: &Tensor<B, 2>,
    accepted: &[usize],
) -> Vec<LayerSelection<B>> {
    let keys = lens.iter().max().unwrap() + n;
    r.p.observe_lookahead(la);
    let mut out = Vec::new();
    for (layer, q) in qs.iter().enumerate() {
        let [b, h, _, d] = q.dims();
        let q = q.clone().slice([0..b, 0..h, 0..n, 0..d]);
        let k = r.s.k(layer, &[0, 1], keys);
        let ctx = LayerAttnCtx {
            layer,
            phase: Phase::Decode,
            q: &q,
            k: &k,
            ctx_lens: lens,
            n_new: n,
            scale: r.s.scale(),
        };
        out.push(r.p.on_layer(&ctx).unwrap().unwrap());
    }
    r.p.commit(accepted).unwrap();
    out
}

fn seq_history(h: Tensor<B, 3>, seq: usize, len: usize) -> Vec<f32> {
    let [_, kvh, l] = h.dims();
    let v = host_f32(h);
    let mut out = Vec::new();
    for j in 0..kvh {
        let row = &v[(seq * kvh + j) * l..(seq * kvh + j + 1) * l];
        out.extend((0..len).map(|p| row.get(p).copied().unwrap_or(0.0)));
        assert!(
            row.iter().skip(len).all(|&x| x == 0.0),
            "history past the committed context must be 0"
        );
    }
    out
}

/// Verification with partial acceptance, then the next selection, against a reference run
/// that only ever saw the accepted rows. With `refresh = 2` a fully accepted warm-up
/// verification comes first, so the checked verification *reuses* the warm-up's selection
/// (the estimator sees it through `observe_verify`) and the next one recomputes.
fn rollback_case<E: ImportanceEstimator<B> + EstimationCost + Clone + 'static>(
    make: impl Fn() -> E,
    history: impl Fn(&E, usize) -> Tensor<B, 3>,
    refresh: usize,
    history_on_reuse: bool,
) {
    let cfg = SelectConfig { refresh, ..cfg() };
    let accepted = [1usize, 2];
    let mut full = prepared_with(make(), cfg.clone());
    let warm_qs: Vec<Tensor<B, 4>> = (0..2).map(|_| full.s.q(2, GAMMA1)).collect();
    let qs: Vec<Tensor<B, 4>> = (0..2).map(|_| full.s.q(2, GAMMA1)).collect();
    let next_qs: Vec<Tensor<B, 4>> = (0..2).map(|_| full.s.q(2, GAMMA1)).collect();
    let la0 = full.s.lookahead(2, 58);
    let la = full.s.lookahead(2, 63);
    let la2 = full.s.lookahead(2, 75);
    let warm = refresh > 1;
    let all = [GAMMA1 - 1; 2];
    let lens: Vec<usize> = if warm {
        LENS.iter().map(|l| l + GAMMA1).collect()
    } else {
        LENS.to_vec()
    };
    let mut before = Vec::new();
    if warm {
        verify_commit(&mut full, &warm_qs, &LENS, GAMMA1, &la0, &all);
        before = (0..2).map(|l| history(full.p.estimator(), l)).collect();
    }
    // gamma + 1 queries, sequence b keeps accepted[b] + 1 of them
    let sels = verify_commit(&mut full, &qs, &lens, GAMMA1, &la, &accepted);
    let hist_full: Vec<Tensor<B, 3>> = (0..2).map(|l| history(full.p.estimator(), l)).collect();
    if warm && history_on_reuse {
        for layer in 0..2 {
            // the reused selection is the warm-up's, extended by the warm-up's tokens
            for seq in 0..2 {
                let got = &rows(&sels[layer])[seq][0];
                assert!(
                    (LENS[seq]..lens[seq]).all(|p| got.contains(&p)),
                    "layer {layer} seq {seq}: not an extended reuse"
                );
            }
            let (b, a) = (
                host_f32(before[layer].clone()),
                host_f32(hist_full[layer].clone()),
            );
            assert!(
                b.len() != a.len() || b.iter().zip(&a).any(|(x, y)| x != y),
                "layer {layer}: a reused verification must still update the history"
            );
        }
    }
    let lens_full: Vec<usize> = lens.iter().zip(&accepted).map(|(l, a)| l + a + 1).collect();
    let next_full = verify_commit(&mut full, &next_qs, &lens_full, GAMMA1, &la2, &[0, 0]);
    for (seq, &a) in accepted.iter().enumerate() {
        // reference: only the first a + 1 queries, all of them committed
        let mut part = prepared_with(make(), cfg.clone());
        if warm {
            verify_commit(&mut part, &warm_qs, &LENS, GAMMA1, &la0, &all);
        }
        verify_commit(&mut part, &qs, &lens, a + 1, &la, &[a, a]);
        let lens_part: Vec<usize> = lens.iter().map(|l| l + a + 1).collect();
        assert_eq!(lens_part[seq], lens_full[seq]);
        for (layer, hf) in hist_full.iter().enumerate() {
            let len = lens_part[seq];
            let got = seq_history(hf.clone(), seq, len);
            let want = seq_history(history(part.p.estimator(), layer), seq, len);
            for (x, y) in got.iter().zip(&want) {
                assert!(
                    (x - y).abs() <= 1e-7 + 1e-4 * y.abs(),
                    "refresh {refresh} layer {layer} seq {seq}: {x} vs {y}"
                );
            }
        }
        // and the next verification selects the same for that sequence
        let next_part = verify_commit(&mut part, &next_qs, &lens_part, GAMMA1, &la2, &[0, 0]);
        for layer in 0..2 {
            assert_eq!(
                rows(&next_full[layer])[seq],
                rows(&next_part[layer])[seq],
                "refresh {refresh} layer {layer} seq {seq}: the next selection must not see \
                 rejected rows"
            );
        }
    }
}

/// The default config (lazy history, re-ranked reuse) and the one whose history follows
/// every verification.
fn rollback_configs() -> [(DustinConfig, bool); 2] {
    [
        (DustinConfig::default(), false),
        (
            DustinConfig {
                history_on_reuse: true,
                ..DustinConfig::default()
            },
            true,
        ),
    ]
}

#[test]
fn dustin_rolls_back_rejected_rows() {
    for refresh in [1, 2] {
        for (c, on_reuse) in rollback_configs() {
            rollback_case(
                || Dustin::<B>::new(c.clone(), &cfg()).unwrap(),
                |e, l| e.history(l).expect("history"),
                refresh,
                on_reuse,
            );
        }
    }
}

#[test]
fn history_only_rolls_back_rejected_rows() {
    for refresh in [1, 2] {
        for (c, on_reuse) in rollback_configs() {
            rollback_case(
                || HistoryOnly::<B>::with_config(c.clone()).unwrap(),
                |e, l| e.inner().history(l).expect("history"),
                refresh,
                on_reuse,
            );
        }
    }
}

#[test]
fn dustin_calibrates_heads_and_seeds_history() {
    let mut r = prepared(Dustin::<B>::new(DustinConfig::default(), &cfg()).unwrap());
    let la = r.s.lookahead(2, 58);
    let qs: Vec<Tensor<B, 4>> = (0..2).map(|_| r.s.q(2, GAMMA1)).collect();
    verify_commit(&mut r, &qs, &LENS, GAMMA1, &la, &[3, 3]);
    for layer in 0..2 {
        let heads = r.p.estimator().estimator_heads(layer).unwrap();
        assert_eq!(heads.len(), 2);
        assert!(heads.windows(2).all(|w| w[0] < w[1]) && heads.iter().all(|&h| h < 12));
        let h = host_f32(r.p.estimator().history(layer).unwrap());
        assert!(h.iter().all(|x| x.is_finite() && *x >= 0.0));
        assert!(h.iter().any(|&x| x > 0.0), "history seeded");
    }
    // fixed heads are taken as given
    let fixed = DustinConfig {
        heads: Some(vec![7, 1]),
        ..DustinConfig::default()
    };
    let mut r = prepared(Dustin::<B>::new(fixed, &cfg()).unwrap());
    verify_commit(&mut r, &qs, &LENS, GAMMA1, &la, &[0, 0]);
    assert_eq!(r.p.estimator().estimator_heads(0).unwrap(), &[1, 7]);
}

#[test]
fn dustin_without_lookahead_is_an_error_history_only_is_not() {
    let cfg = cfg();
    let mut s = Synth::new(5, 1, 2, 5, 8, 2, 128);
    for (spec, ok) in [
        ("dustin", false),
        ("history-only", true),
        ("draft-only", false),
    ] {
        let mut p = build::<B>(spec, &cfg).unwrap();
        p.reset(2, 1);
        s.prefill(p.as_mut(), &LENS, 16);
        p.begin_verify(0);
        let q = s.q(2, 3);
        let k = s.k(0, &[0, 1], 61);
        let ctx = LayerAttnCtx {
            layer: 0,
            phase: Phase::Decode,
            q: &q,
            k: &k,
            ctx_lens: &LENS,
            n_new: 3,
            scale: s.scale(),
        };
        assert_eq!(p.on_layer(&ctx).is_ok(), ok, "{spec}");
        assert_eq!(p.wants_lookahead(), !ok, "{spec}");
    }
}

// ---------------------------------------------------------------- estimation reads

#[test]
fn estimation_reads_count_what_each_estimator_reads() {
    let cfg = cfg();
    let (layers, kvh, g) = (2usize, 2usize, 3usize);
    for spec in [
        "streaming",
        "h2o",
        "snapkv",
        "oracle",
        "quest",
        "dustin",
        "history-only",
    ] {
        let mut s = Synth::new(9, layers, kvh, g, 8, 2, 128);
        let mut p = build_budgeted::<B>(spec, &cfg, None).unwrap();
        p.reset(2, layers);
        s.prefill(p.as_mut(), &LENS, 16);
        assert_eq!(
            p.estimation_reads(),
            vec![0.0, 0.0],
            "{spec}: nothing before verifying"
        );
        if p.wants_lookahead() {
            let la = s.lookahead(2, 58);
            p.observe_lookahead(&la);
        }
        p.begin_verify(0);
        s.verify(p.as_mut(), &[0, 1], &LENS, GAMMA1);
        let got = p.estimation_reads();
        for (seq, &ctx) in LENS.iter().enumerate() {
            let per_layer = match spec {
                "oracle" => 0.5 * (kvh * ctx) as f64,
                "quest" => (kvh * ctx.div_ceil(16)) as f64,
                _ => 0.0,
            };
            match spec {
                "dustin" | "history-only" => {
                    // the keys of the KV heads holding the 2 estimator heads: 1 or 2 of them
                    let (lo, hi) = (0.5 * ctx as f64, 0.5 * (2 * ctx) as f64);
                    assert!(
                        (layers as f64 * lo..=layers as f64 * hi).contains(&got[seq]),
                        "{spec} seq {seq}: {}",
                        got[seq]
                    );
                }
                _ => assert_eq!(got[seq], layers as f64 * per_layer, "{spec} seq {seq}"),
            }
        }
        p.commit(&[0, 0]).unwrap();
        p.retain(&[1]);
        assert_eq!(
            p.estimation_reads(),
            vec![got[1]],
            "{spec}: retain keeps the survivor's"
        );
    }
}

// ---------------------------------------------------------------- lazy history, fresh lookahead

/// With `refresh = 4` and `history_on_reuse = false`, a verification that reuses a selection
/// reads nothing of the KV cache; with `lookahead_on_reuse` it re-ranks with the new
/// lookahead (a position the lookahead puts all its mass on, outside the old selection, gets
/// in), without it the old selection is extended as it is (that position stays out).
#[test]
fn lazy_dustin_reranks_a_reused_selection_with_the_new_lookahead_without_reads() {
    let cfg = SelectConfig {
        refresh: 4,
        refresh_on_accept_drop: None,
        ..cfg()
    };
    for rerank in [true, false] {
        let mut s = Synth::new(5, 2, 2, 3, 8, 2, 128);
        let knobs = serde_json::json!({"history_on_reuse": false, "lookahead_on_reuse": rerank});
        let mut p = build_budgeted::<B>("dustin", &cfg, Some(knobs)).unwrap();
        p.reset(2, 2);
        s.prefill(p.as_mut(), &LENS, 16);
        let la = s.lookahead(2, LENS[1]);
        p.observe_lookahead(&la);
        p.begin_verify(0);
        let first = s.verify(p.as_mut(), &[0, 1], &LENS, GAMMA1);
        p.commit(&[0, 0]).unwrap();
        let reads = p.estimation_reads();
        assert!(
            reads.iter().all(|&r| r > 0.0),
            "the first verification scores: {reads:?}"
        );
        // a free position (past the 2 sinks, before the 6-token window) the first selection
        // left out at layer 0, sequence 0, on both KV heads
        let lens2 = [LENS[0] + 1, LENS[1] + 1];
        let old = rows(first[0].as_ref().unwrap());
        let pos = (2..lens2[0] - 6)
            .find(|p| !old[0][0].contains(p) && !old[0][1].contains(p))
            .expect("a free position outside the old selection");
        let mut v = vec![0.0f32; 2 * lens2[1]];
        v[pos] = 1.0;
        v[lens2[1] + pos] = 1.0;
        let la2 = Tensor::<B, 2>::from_data(TensorData::new(v, [2, lens2[1]]), &dev());
        p.observe_lookahead(&la2);
        p.begin_verify(1);
        let second = s.verify(p.as_mut(), &[0, 1], &lens2, GAMMA1);
        assert_eq!(
            p.estimation_reads(),
            reads,
            "a reusing verification reads nothing"
        );
        let new = rows(second[0].as_ref().unwrap());
        for (kv, row) in new[0].iter().enumerate() {
            assert_eq!(
                row.contains(&pos),
                rerank,
                "lookahead_on_reuse {rerank}: kv head {kv} {row:?}"
            );
        }
        if !rerank {
            continue; // an extended selection grows by the committed positions
        }
        check_selection(
            second[0].as_ref().unwrap(),
            &lens2,
            cfg.keep_with_budget(24),
            "re-ranked",
        );
    }
}

// ---------------------------------------------------------------- re-ranked reuse in one call

/// A `dustin` selector that re-ranks reusing layers in one call per verification
/// (`Selector`'s default) makes the same selections as one that re-ranks each layer in its
/// turn (`with_batched_reuse(false)`), over refresh and reuse verifications with ragged
/// contexts and unequal acceptance, and takes the one-call path on every reusing
/// verification (refresh 2: every second one). Both are checked against the keep rule.
#[test]
fn batched_reuse_selects_as_layer_by_layer() {
    let cfg = SelectConfig {
        refresh: 2,
        refresh_on_accept_drop: None,
        ..cfg()
    };
    let layers = 4;
    let mut s = Synth::new(11, layers, 2, 3, 8, 2, 160);
    let keep = cfg.keep();
    let mut one_call = Selector::new(
        Dustin::<B>::with_config(DustinConfig::default()).unwrap(),
        cfg,
    )
    .unwrap();
    one_call.reset(2, layers);
    s.prefill(&mut one_call, &LENS, 16);
    let mut per_layer = one_call.clone().with_batched_reuse(false);
    // stacks of at most 2 layers' f32 scores [2 * batch 2, kv_heads 2, keys <= 82] (the keys:
    // the longest context, 58 to 70 here, and the 4 verified positions): the 4 reusing layers
    // of a verification go as 2 + 2
    let mut grouped = one_call.clone().with_stack_bytes(2 * 2 * 2 * 82 * 4);
    let mut lens = LENS.to_vec();
    for it in 0..6 {
        let la = s.lookahead(2, lens[1]);
        let mut s2 = s.clone();
        let mut got = Vec::new();
        let mut s3 = s.clone();
        for (p, synth) in [
            (&mut one_call, &mut s),
            (&mut per_layer, &mut s2),
            (&mut grouped, &mut s3),
        ] {
            p.observe_lookahead(&la);
            p.begin_verify(it);
            got.push(synth.verify(p, &[0, 1], &lens, GAMMA1));
        }
        s = s2; // both drew the same queries
        assert_eq!(got[0].len(), layers);
        for layer in 0..layers {
            let a = got[0][layer].as_ref().expect("sparse");
            for (other, name) in [(&got[1], "layer by layer"), (&got[2], "in groups")] {
                let b = other[layer].as_ref().expect("sparse");
                assert_eq!(a.counts, b.counts, "it {it} layer {layer} {name}");
                assert_eq!(rows(a), rows(b), "it {it} layer {layer} {name}");
            }
            check_selection(a, &lens, keep, "one call");
        }
        let accepted = [it % 3, (it + 1) % 4];
        one_call.commit(&accepted).unwrap();
        per_layer.commit(&accepted).unwrap();
        grouped.commit(&accepted).unwrap();
        lens = lens.iter().zip(accepted).map(|(l, a)| l + a + 1).collect();
    }
    assert_eq!(one_call.batched_reuses(), 3, "iterations 1, 3, 5 reuse");
    assert_eq!(per_layer.batched_reuses(), 0);
    assert_eq!(grouped.batched_reuses(), 3);
    assert_eq!(
        one_call.batched_groups(),
        3,
        "one stack a reusing verification"
    );
    assert_eq!(
        grouped.batched_groups(),
        6,
        "two stacks a reusing verification"
    );
}
