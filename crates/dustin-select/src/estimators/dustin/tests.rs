//! The estimator against the kernel ops, its history folds and calibration.

use super::*;
use burn_flex::{Flex, FlexDevice};
use dustin_core::Phase;
use rand::{Rng, SeedableRng};

/// The estimator's own mix (the CPU path: mask, two normalisations, the weighted sum)
/// equals [`SelectionOps::mix_scores`](dustin_kernels::SelectionOps::mix_scores)' plain path, the op CUDA runs as one kernel: free
/// ranges from the keep rule, a lookahead shorter than the width (zero-padded), a ragged
/// batch, with and without the lookahead.
#[test]
fn mix_equals_the_fused_mix_op() {
    let (b, kvh, l) = (2usize, 3usize, 40usize);
    let ctx_lens = [37usize, 21];
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut rand =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(0.0f32..1.0)).collect() };
    let hist =
        Tensor::<Flex, 3>::from_data(TensorData::new(rand(b * kvh * l), [b, kvh, l]), &FlexDevice);
    let la = Tensor::<Flex, 2>::from_data(TensorData::new(rand(b * 30), [b, 30]), &FlexDevice);
    let q = Tensor::<Flex, 4>::zeros([b, kvh, 1, 4], &FlexDevice);
    let k = Tensor::<Flex, 4>::zeros([b, kvh, l, 4], &FlexDevice);
    let attn = LayerAttnCtx {
        layer: 0,
        phase: Phase::Decode,
        q: &q,
        k: &k,
        ctx_lens: &ctx_lens,
        n_new: 1,
        scale: 0.5,
    };
    let ctx = ScoreCtx {
        attn: &attn,
        budget: 12,
        n_sink: 2,
        window: 3,
        iteration: 0,
    };
    let keep = keep_rule(&ctx);
    let free: Vec<(usize, usize)> = ctx_lens.iter().map(|&c| keep.free_range(c)).collect();
    for alpha in [0.0, 0.3] {
        let mut est = Dustin::<Flex>::with_config(DustinConfig {
            alpha,
            ..DustinConfig::default()
        })
        .unwrap();
        est.reset(b, 1);
        if alpha > 0.0 {
            est.observe_lookahead(&la);
        }
        let got = est.mix(&ctx, hist.clone(), l, 1).unwrap();
        let want = dustin_kernels::plain::mix_scores(
            hist.clone(),
            (alpha > 0.0).then(|| la.clone()),
            &free,
            alpha as f32,
            l,
        )
        .unwrap();
        let (got, want): (Vec<f32>, Vec<f32>) = (
            got.into_data().to_vec().unwrap(),
            want.into_data().to_vec().unwrap(),
        );
        assert_eq!(got.len(), b * kvh * l);
        let err = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-6, "alpha {alpha}: max abs diff {err}");
        // each row sums to 1 over its free range, 0 outside it
        for (r, row) in got.chunks(l).enumerate() {
            let (lo, hi) = free[r / kvh];
            let s: f32 = row[lo..hi].iter().sum();
            assert!((s - 1.0).abs() < 1e-5, "row {r} sums to {s}");
            assert!(row[..lo].iter().chain(&row[hi..]).all(|&x| x == 0.0));
        }
    }
}

/// The contribution from the fused head-subset kernel (what CUDA runs; here its plain
/// path) equals the estimator's own per-head computation, including a KV head with no
/// chosen head (which takes the mean of all chosen heads) and a ragged batch.
#[test]
fn fused_contribution_equals_the_plain_one() {
    let (b, kvh, g, n, d) = (2usize, 3usize, 2usize, 3usize, 8usize);
    let ctx_lens = [13usize, 7];
    let l = 13 + n;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut rand =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.5f32..1.5)).collect() };
    let q = Tensor::<Flex, 4>::from_data(
        TensorData::new(rand(b * kvh * g * n * d), [b, kvh * g, n, d]),
        &FlexDevice,
    );
    let k = Tensor::<Flex, 4>::from_data(
        TensorData::new(rand(b * kvh * l * d), [b, kvh, l, d]),
        &FlexDevice,
    );
    // heads 0 and 1 (both of KV head 0) and 5 (KV head 2); KV head 1 has none
    let cfg = DustinConfig {
        heads: Some(vec![0, 1, 5]),
        heads_per_layer: 3,
        ..DustinConfig::default()
    };
    let mut est = Dustin::<Flex>::with_config(cfg).unwrap();
    est.reset(b, 1);
    let attn = LayerAttnCtx {
        layer: 0,
        phase: Phase::Decode,
        q: &q,
        k: &k,
        ctx_lens: &ctx_lens,
        n_new: n,
        scale: 0.35,
    };
    let ctx = ScoreCtx {
        attn: &attn,
        budget: 8,
        n_sink: 1,
        window: 2,
        iteration: 0,
    };
    // the per-KV-head contribution [b, kvh, n, l] a pending entry stands for
    let mapped = |p: Pending<Flex>| -> Vec<f32> {
        let rows: Vec<f32> = p.rows.into_data().to_vec().unwrap();
        let at = |bb: usize, h: usize, i: usize, j: usize| rows[((bb * kvh + h) * n + i) * l + j];
        let mut out = Vec::with_capacity(rows.len());
        for bb in 0..b {
            for h in 0..kvh {
                for i in 0..n {
                    for j in 0..l {
                        let tot: f32 = (0..kvh).map(|h2| at(bb, h2, i, j)).sum();
                        out.push(p.own[h] * at(bb, h, i, j) + p.all[h] * tot);
                    }
                }
            }
        }
        out
    };
    let plain = mapped(est.contribution(&ctx).unwrap());
    let heads = est.layer_heads(0, kvh * g, keep_rule(&ctx)).unwrap();
    assert_eq!(heads, vec![0, 1, 5]);
    let fused = mapped(est.fused_contribution(&ctx, &heads).unwrap().unwrap());
    assert_eq!(plain.len(), b * kvh * n * l);
    let err = plain
        .iter()
        .zip(&fused)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err < 1e-6, "max abs diff {err}");
    // every row of every KV head is a probability distribution (mean of softmax rows)
    for row in plain.chunks(l) {
        let s: f32 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-5, "row sum {s}");
    }
}

/// What the estimator builds once and reuses (the mask and normalised lookahead shared by
/// the layers of a verification, the per-layer head weights, the fold weights) gives the
/// scores an estimator with those caches emptied before every call gives: two layers, two
/// verifications with a new lookahead and longer contexts in between, a third with a new
/// lookahead at the same lengths, a ragged batch.
#[test]
fn reused_inputs_give_the_scores_of_fresh_ones() {
    let (b, kvh, g, n, d) = (2usize, 2usize, 2usize, 3usize, 8usize);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut rand =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.5f32..1.5)).collect() };
    let cfg = DustinConfig {
        heads: Some(vec![0, 3]),
        heads_per_layer: 2,
        ..DustinConfig::default()
    };
    let mut est = Dustin::<Flex>::with_config(cfg).unwrap();
    est.reset(b, 2);
    let mut compared = 0;
    for (it, ctx_lens) in [[20usize, 14], [23, 16], [23, 16]].iter().enumerate() {
        let l = ctx_lens[0] + n;
        let la = Tensor::<Flex, 2>::from_data(
            TensorData::new(rand(b * l).iter().map(|x| x.abs()).collect(), [b, l]),
            &FlexDevice,
        );
        est.observe_lookahead(&la);
        for layer in 0..2 {
            let q = Tensor::<Flex, 4>::from_data(
                TensorData::new(rand(b * kvh * g * n * d), [b, kvh * g, n, d]),
                &FlexDevice,
            );
            let k = Tensor::<Flex, 4>::from_data(
                TensorData::new(rand(b * kvh * l * d), [b, kvh, l, d]),
                &FlexDevice,
            );
            let attn = LayerAttnCtx {
                layer,
                phase: Phase::Decode,
                q: &q,
                k: &k,
                ctx_lens,
                n_new: n,
                scale: 0.35,
            };
            let ctx = ScoreCtx {
                attn: &attn,
                budget: 10,
                n_sink: 1,
                window: 2,
                iteration: it,
            };
            let mut fresh = est.clone();
            fresh.shared = None;
            fresh.head_weights = vec![None; 2];
            let tokens = |s: Scores<Flex>| -> Vec<f32> {
                match s {
                    Scores::Tokens(t) => t.into_data().to_vec().unwrap(),
                    Scores::Dense => panic!("dustin scored dense"),
                }
            };
            let want = tokens(fresh.score(&ctx).unwrap());
            let got = tokens(est.score(&ctx).unwrap());
            assert_eq!(got, want, "iteration {it}, layer {layer}");
            assert!(got.iter().any(|&x| x > 0.0), "scores all zero");
            if it > 0 || layer > 0 {
                // a cache was there to be reused (or rebuilt on a new lookahead)
                compared += 1;
            }
        }
        est.commit(&[1, 2]).unwrap();
    }
    assert_eq!(compared, 5);
}

/// [`calib::head_recall_sum`] equals a float64 computation from sorted rows: per row, the
/// free range of a keep rule and `k` from the free budget or from `calib_top_k`; rows of two
/// lengths (two groups of one batch each, as a ragged batch of prompts makes them), summed.
/// Values are integers with no ties, within a row or in the heads' sum, so that f32 sums are
/// exact and both orders agree.
#[test]
fn head_recall_matches_a_sorted_reference() {
    let nh = 6usize;
    let lens = [300usize, 300, 250];
    let keep = KeepRule {
        budget: 40,
        n_sink: 4,
        window: 8,
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    // r * 1024 + j: distinct within a head; the heads' sums (sum r) * 1024 + 6 j are distinct
    // for j < 512, and below 2^24 (exact in f32)
    let rows: Vec<Vec<Vec<f64>>> = lens
        .iter()
        .map(|&l| {
            (0..nh)
                .map(|_| {
                    (0..l)
                        .map(|j| f64::from(rng.random_range(0u32..256) * 1024 + j as u32))
                        .collect()
                })
                .collect()
        })
        .collect();
    let tensors = || -> Vec<Tensor<Flex, 2>> {
        rows.iter()
            .map(|vals| {
                let l = vals[0].len();
                let flat: Vec<f32> = vals.iter().flatten().map(|&v| v as f32).collect();
                Tensor::from_data(TensorData::new(flat, [nh, l]), &FlexDevice)
            })
            .collect()
    };
    for (top_k, k) in [(None, 40 - 4 - 8), (Some(5), 5)] {
        let mut per_row = Vec::new();
        for vals in &rows {
            let l = vals[0].len();
            let (lo, hi) = (keep.n_sink, l - keep.window);
            let top = |row: &[f64]| -> Vec<usize> {
                let mut pos: Vec<usize> = (lo..hi).collect();
                pos.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
                pos.truncate(k);
                pos
            };
            let sum: Vec<f64> = (0..l).map(|j| vals.iter().map(|r| r[j]).sum()).collect();
            let all = top(&sum);
            let recall: Vec<f64> = vals
                .iter()
                .map(|r| top(r).iter().filter(|p| all.contains(p)).count() as f64 / k as f64)
                .collect();
            per_row.push(recall);
        }
        let want: Vec<f64> = (0..nh)
            .map(|h| per_row.iter().map(|r| r[h]).sum())
            .collect();
        assert!(
            want.iter().any(|&w| w.fract() != 0.0),
            "the reference should tell heads apart: {want:?}"
        );
        let got = host_f32(
            calib::head_recall_sum(tensors(), keep, top_k)
                .unwrap()
                .unwrap(),
        )
        .unwrap();
        for (h, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() < 1e-5,
                "k {k}, head {h}: {g} vs {w}"
            );
        }
        // the last row alone: its own recall
        let one = calib::head_recall_sum(tensors().split_off(2), keep, top_k)
            .unwrap()
            .unwrap();
        for (h, (&g, &w)) in host_f32(one).unwrap().iter().zip(&per_row[2]).enumerate() {
            assert!(
                (f64::from(g) - w).abs() < 1e-6,
                "k {k}, row 2, head {h}: {g} vs {w}"
            );
        }
    }
    // k past the free range: clamped to it, where every head's top-k is the whole range, so
    // each row with a free range adds 1 per head; a row of no free range (12 = sinks + window)
    // among them adds nothing
    let mut rows = tensors();
    rows.push(Tensor::<Flex, 2>::ones([nh, 12], &FlexDevice));
    let got = host_f32(
        calib::head_recall_sum(rows, keep, Some(10_000))
            .unwrap()
            .unwrap(),
    )
    .unwrap();
    assert!(got.iter().all(|&g| g == lens.len() as f32), "{got:?}");
    // a free range of nothing: no recall
    let short = Tensor::<Flex, 2>::zeros([nh, 12], &FlexDevice);
    assert!(calib::head_recall_sum(vec![short], keep, None)
        .unwrap()
        .is_none());
    // rows of other head counts
    let odd = vec![
        Tensor::<Flex, 2>::zeros([nh, 30], &FlexDevice),
        Tensor::<Flex, 2>::zeros([nh - 1, 30], &FlexDevice),
    ];
    assert!(calib::head_recall_sum(odd, keep, None).is_err());
}
