//! The shared top-k step against a host reference, the extension of reused selections, and
//! the selector's refresh rules.

use burn_tensor::{Tensor, TensorData};
use dustin_core::SelectionPolicy;
use dustin_select::estimators::Streaming;
use dustin_select::{
    extend_selection, extend_selection_grouped, select_top_k, KeepRule, SelectConfig, Selector,
};
use proptest::prelude::*;

use crate::common::{check_selection, dev, rows, Synth, B};

/// Host reference: forced positions plus the best `budget - forced` others (distinct scores).
fn reference(scores: &[f32], ctx: usize, keep: KeepRule) -> Vec<usize> {
    let forced: Vec<usize> = (0..ctx)
        .filter(|&p| p < keep.n_sink || p + keep.window >= ctx)
        .collect();
    let mut rest: Vec<usize> = (0..ctx).filter(|p| !forced.contains(p)).collect();
    rest.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    let take = keep.budget.min(ctx) - forced.len();
    let mut out: Vec<usize> = forced
        .into_iter()
        .chain(rest.into_iter().take(take))
        .collect();
    out.sort_unstable();
    out
}

fn case() -> impl Strategy<Value = (Vec<usize>, usize, KeepRule, u64)> {
    (
        1usize..4,
        1usize..4,
        0usize..5,
        0usize..9,
        0usize..40,
        any::<u64>(),
    )
        .prop_flat_map(|(b, h, n_sink, window, extra, seed)| {
            let budget = n_sink + window + extra;
            (
                proptest::collection::vec(0usize..90, b),
                Just(h),
                Just(KeepRule {
                    budget,
                    n_sink,
                    window,
                }),
                Just(seed),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn top_k_matches_host_reference((lens, h, keep, seed) in case()) {
        prop_assume!(lens.iter().any(|&l| l > 0));
        let b = lens.len();
        let c = *lens.iter().max().unwrap() + 3; // extra columns must be ignored
        // distinct scores: a seeded permutation of 0..c per row
        let mut v = Vec::with_capacity(b * h * c);
        let mut x = seed | 1;
        for _ in 0..b * h {
            let mut row: Vec<f32> = (0..c).map(|i| i as f32).collect();
            for i in (1..c).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                row.swap(i, (x % (i as u64 + 1)) as usize);
            }
            v.extend(row);
        }
        let scores = Tensor::<B, 3>::from_data(TensorData::new(v.clone(), [b, h, c]), &dev());
        let sel = select_top_k(scores.clone(), &lens, keep).unwrap();
        let got = check_selection(&sel, &lens, keep, "proptest");
        // the top-k of the kernel ops (what `select_top_k` runs on a fused backend: CUDA);
        // their documented contract refuses budget 0 (no selector config reaches it: budgets
        // are validated above n_sink + window)
        let fused = <B as dustin_kernels::SelectionOps>::top_k_positions(scores, &lens, keep);
        if keep.budget == 0 {
            prop_assert!(fused.is_err(), "budget 0 must be refused by the kernel ops");
            return Ok(());
        }
        let fused = fused.unwrap();
        let fused = dustin_core::LayerSelection { indices: fused.indices, counts: fused.counts };
        let got_fused = check_selection(&fused, &lens, keep, "proptest (kernel ops)");
        for i in 0..b {
            for j in 0..h {
                let row = &v[(i * h + j) * c..(i * h + j + 1) * c];
                prop_assert_eq!(&got[i][j], &reference(row, lens[i], keep));
                prop_assert_eq!(&got_fused[i][j], &reference(row, lens[i], keep));
            }
        }
    }
}

#[test]
fn top_k_handles_nan_and_infinities() {
    let keep = KeepRule {
        budget: 4,
        n_sink: 1,
        window: 1,
    };
    let v = vec![
        0.0,
        f32::NAN,
        f32::INFINITY,
        3.0,
        f32::NEG_INFINITY,
        2.0,
        1.0,
        5.0,
    ];
    let scores = Tensor::<B, 3>::from_data(TensorData::new(v, [1, 1, 8]), &dev());
    let sel = select_top_k(scores, &[8], keep).unwrap();
    // sink 0, window 7, then +inf (2) and 3.0 (3)
    assert_eq!(rows(&sel)[0][0], vec![0, 2, 3, 7]);
}

#[test]
fn top_k_rejects_bad_shapes_and_budgets() {
    let scores = Tensor::<B, 3>::zeros([2, 1, 5], &dev());
    let keep = KeepRule {
        budget: 3,
        n_sink: 1,
        window: 1,
    };
    assert!(
        select_top_k(scores.clone(), &[5], keep).is_err(),
        "batch mismatch"
    );
    assert!(
        select_top_k(scores.clone(), &[5, 6], keep).is_err(),
        "too few columns"
    );
    let bad = KeepRule {
        budget: 1,
        n_sink: 1,
        window: 1,
    };
    let err = select_top_k(scores, &[5, 5], bad).unwrap_err().to_string();
    assert!(err.contains("budget"), "{err}");
}

#[test]
fn extension_appends_new_positions() {
    let keep = KeepRule {
        budget: 5,
        n_sink: 1,
        window: 2,
    };
    let v: Vec<f32> = (0..2 * 20).map(|i| ((i * 7) % 13) as f32).collect();
    let scores = Tensor::<B, 3>::from_data(TensorData::new(v, [2, 1, 20]), &dev());
    let old_lens = [20, 4];
    let sel = select_top_k(scores, &old_lens, keep).unwrap();
    let before = rows(&sel);
    let new_lens = [23, 9];
    let ext = extend_selection(&sel, &old_lens, &new_lens).unwrap();
    assert_eq!(ext.counts, vec![5 + 3, 4 + 5]);
    // slots in multiples of SELECTION_MULTIPLE, the padding at position 0
    assert_eq!(ext.indices.dims()[2], dustin_select::SELECTION_MULTIPLE);
    let after = rows(&ext);
    for i in 0..2 {
        let mut want = before[i][0].clone();
        want.extend(old_lens[i]..new_lens[i]);
        assert_eq!(after[i][0], want);
    }
    assert!(
        extend_selection(&sel, &old_lens, &[19, 9]).is_err(),
        "a context cannot shrink"
    );
}

/// A stack of 3 groups' selections of a batch of 2 (2 KV heads), extended in one call, row
/// for row what the rows extend to one by one; groups with unequal counts (the row-by-row
/// path) keep each row's positions and append the new ones (built by hand); a row count
/// that is not groups x batch is named.
#[test]
fn grouped_extension_equals_row_by_row_extension() {
    let keep = KeepRule {
        budget: 6,
        n_sink: 1,
        window: 2,
    };
    let (groups, batch, h, w) = (3usize, 2usize, 2usize, 30usize);
    let v: Vec<f32> = (0..groups * batch * h * w)
        .map(|i| ((i * 37 + 11) % 101) as f32)
        .collect();
    let scores = Tensor::<B, 3>::from_data(TensorData::new(v, [groups * batch, h, w]), &dev());
    let old_lens = [30usize, 12];
    let rep = |l: &[usize]| -> Vec<usize> { (0..groups).flat_map(|_| l.to_vec()).collect() };
    let sel = select_top_k(scores.clone(), &rep(&old_lens), keep).unwrap();
    let new_lens = [33usize, 14];
    let got = extend_selection_grouped(&sel, groups, &old_lens, &new_lens).unwrap();
    let want = extend_selection(&sel, &rep(&old_lens), &rep(&new_lens)).unwrap();
    assert_eq!(got.counts, want.counts);
    assert_eq!(got.counts, rep(&[6 + 3, 6 + 2]));
    assert_eq!(rows(&got), rows(&want));
    // unequal counts between groups (group 1 made at a budget of 4)
    let small = KeepRule { budget: 4, ..keep };
    let mut counts = sel.counts.clone();
    let s1 = select_top_k(scores, &rep(&old_lens), small).unwrap();
    counts[batch..2 * batch].copy_from_slice(&s1.counts[batch..2 * batch]);
    let mixed = dustin_core::LayerSelection {
        indices: sel.indices.clone(),
        counts,
    };
    let got = extend_selection_grouped(&mixed, groups, &old_lens, &new_lens).unwrap();
    // by hand: each row's kept positions, then the positions that entered since
    let before = rows(&mixed);
    let want: Vec<Vec<Vec<usize>>> = before
        .iter()
        .enumerate()
        .map(|(r, heads)| {
            let b = r % batch;
            heads
                .iter()
                .map(|row| {
                    row.iter()
                        .copied()
                        .chain(old_lens[b]..new_lens[b])
                        .collect()
                })
                .collect()
        })
        .collect();
    let want_counts: Vec<usize> = (0..groups * batch)
        .map(|r| mixed.counts[r] + new_lens[r % batch] - old_lens[r % batch])
        .collect();
    assert_eq!(got.counts, want_counts);
    assert_eq!(got.counts[batch], 4 + 3, "group 1 kept 4 of sequence 0");
    assert_eq!(rows(&got), want);
    let err = extend_selection_grouped(&sel, 2, &old_lens, &new_lens)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`groups`") && err.contains("6 selection rows"),
        "{err}"
    );
}

fn streaming_selector(cfg: SelectConfig) -> Selector<B, Streaming> {
    Selector::new(Streaming, cfg).unwrap()
}

#[test]
fn refresh_reuses_then_recomputes() {
    let cfg = SelectConfig {
        budget: 12,
        n_sink: 2,
        window: 3,
        refresh: 3,
        refresh_on_accept_drop: None,
        ..SelectConfig::default()
    };
    let mut p = streaming_selector(cfg.clone());
    let mut s = Synth::new(7, 2, 2, 5, 8, 2, 128);
    let mut lens = vec![40usize, 50];
    p.reset(2, 2);
    s.prefill(&mut p, &lens, 16);
    let first = s.verify(&mut p, &[0, 1], &lens, 4);
    let base: Vec<_> = first.iter().map(|x| rows(x.as_ref().unwrap())).collect();
    let base_lens = lens.clone();
    for it in 1..4 {
        p.commit(&[1, 2]).unwrap();
        lens[0] += 2;
        lens[1] += 3;
        p.begin_verify(it);
        let sels = s.verify(&mut p, &[0, 1], &lens, 4);
        for (layer, sel) in sels.iter().enumerate() {
            let sel = sel.as_ref().unwrap();
            if it < 3 {
                // reused: the old rows plus everything since
                let grown: Vec<usize> = (0..2).map(|b| 12 + lens[b] - base_lens[b]).collect();
                assert_eq!(sel.counts, grown, "it {it}");
                let r = rows(sel);
                for b in 0..2 {
                    let mut want = base[layer][b][0].clone();
                    want.extend(base_lens[b]..lens[b]);
                    assert_eq!(r[b][0], want);
                }
            } else {
                check_selection(sel, &lens, cfg.keep(), "recomputed");
            }
        }
    }
}

/// The acceptance-drop tests' selector config: budget 12 (sinks 2, window 3), reuse for 100
/// verifications unless acceptance drops below half its running mean.
fn drop_config() -> SelectConfig {
    SelectConfig {
        budget: 12,
        n_sink: 2,
        window: 3,
        refresh: 100,
        refresh_on_accept_drop: Some(0.5),
        ..SelectConfig::default()
    }
}

#[test]
fn acceptance_drop_forces_a_recompute() {
    let cfg = drop_config();
    let mut p = streaming_selector(cfg.clone());
    let mut s = Synth::new(8, 1, 2, 6, 8, 2, 128);
    let mut lens = vec![40usize, 50];
    p.reset(2, 1);
    s.prefill(&mut p, &lens, 16);
    for (it, acc) in [[3usize, 3], [3, 3], [0, 0]].iter().enumerate() {
        p.begin_verify(it);
        let sel = s.verify(&mut p, &[0, 1], &lens, 4).remove(0).unwrap();
        if it == 0 {
            assert_eq!(sel.counts, vec![12, 12]);
        } else {
            assert!(sel.counts[0] > 12, "reused while acceptance holds");
        }
        p.commit(acc).unwrap();
        for (l, a) in lens.iter_mut().zip(acc) {
            *l += a + 1;
        }
    }
    p.begin_verify(3);
    let sel = s.verify(&mut p, &[0, 1], &lens, 4).remove(0).unwrap();
    check_selection(&sel, &lens, cfg.keep(), "after the drop");
}

/// Runs `accepted` (one row per verification) through a `streaming` selector with refresh
/// 100 and `refresh_on_accept_drop` 0.5, and says after each commit whether the next
/// verification recomputed (its selection holds only the budget) or reused (extended past it).
fn recomputed_after(accepted: &[[usize; 2]]) -> Vec<bool> {
    let cfg = drop_config();
    let mut p = streaming_selector(cfg);
    let mut s = Synth::new(8, 1, 2, 6, 8, 2, 128);
    let mut lens = vec![40usize, 50];
    p.reset(2, 1);
    s.prefill(&mut p, &lens, 16);
    p.begin_verify(0);
    let first = s.verify(&mut p, &[0, 1], &lens, 4).remove(0).unwrap();
    assert_eq!(first.counts, vec![12, 12]);
    let mut out = Vec::new();
    for (it, acc) in accepted.iter().enumerate() {
        p.commit(acc).unwrap();
        for (l, a) in lens.iter_mut().zip(acc) {
            *l += a + 1;
        }
        p.begin_verify(it + 1);
        let sel = s.verify(&mut p, &[0, 1], &lens, 4).remove(0).unwrap();
        out.push(sel.counts == vec![12, 12]);
    }
    out
}

#[test]
fn a_zero_at_low_acceptance_is_not_a_drop() {
    // running mean 0.5 accepted drafts, per-sequence sd 0.5: a batch of two that accepts
    // nothing is 0.5 below the mean, under 3 standard errors (3 * 0.5 / sqrt 2 = 1.06), so
    // the selection is reused; the rule without the noise test (0 < 0.5 * 0.5) recomputed
    assert_eq!(
        recomputed_after(&[[1, 0], [0, 1], [0, 0], [1, 0]]),
        [false, false, false, false]
    );
}

#[test]
fn a_drop_beyond_the_noise_still_recomputes() {
    // running mean 3, per-sequence sd 0.577 (counts 3, 3, 4, 2, 3, 3): a batch that accepts
    // nothing is 3 below the mean, over 3 standard errors (3 * 0.577 / sqrt 2 = 1.22)
    assert_eq!(
        recomputed_after(&[[3, 3], [4, 2], [3, 3], [0, 0]]),
        [false, false, false, true]
    );
}

#[test]
fn accept_drop_sigmas_must_be_finite_and_non_negative() {
    for bad in [-0.5, f64::NAN, f64::INFINITY] {
        let cfg = SelectConfig {
            accept_drop_sigmas: bad,
            ..SelectConfig::default()
        };
        match cfg.validate().unwrap_err() {
            dustin_core::CoreError::InvalidInput { name, .. } => {
                assert_eq!(name, "accept_drop_sigmas", "{bad}")
            }
            other => panic!("{bad}: {other}"),
        }
    }
    let zero = SelectConfig {
        accept_drop_sigmas: 0.0,
        ..SelectConfig::default()
    };
    assert!(zero.validate().is_ok());
    assert_eq!(SelectConfig::default().accept_drop_sigmas, 3.0);
}

#[test]
fn select_config_validation_names_budget() {
    let cfg = SelectConfig {
        budget: 68,
        ..SelectConfig::default()
    };
    let err = cfg.validate().unwrap_err();
    match &err {
        dustin_core::CoreError::InvalidInput { name, .. } => assert_eq!(name, "budget"),
        other => panic!("{other}"),
    }
    assert!(Selector::<B, _>::new(Streaming, cfg).is_err());
    assert!(SelectConfig {
        budget: 69,
        ..SelectConfig::default()
    }
    .validate()
    .is_ok());
    assert!(SelectConfig {
        refresh: 0,
        ..SelectConfig::default()
    }
    .validate()
    .is_err());
    assert!(SelectConfig {
        refresh_on_accept_drop: Some(1.5),
        ..SelectConfig::default()
    }
    .validate()
    .is_err());
}

/// `n_sink + window` past `usize::MAX` (a config's `18446744073709551615`) is refused, not
/// wrapped to a small sum that a budget of 100 would pass.
#[test]
fn select_config_refuses_sinks_and_window_that_overflow() {
    for (n_sink, window) in [(usize::MAX, 5), (4, usize::MAX), (usize::MAX, usize::MAX)] {
        let cfg = SelectConfig {
            budget: 100,
            n_sink,
            window,
            ..SelectConfig::default()
        };
        match cfg.validate().unwrap_err() {
            dustin_core::CoreError::InvalidInput { name, expected, .. } => {
                assert_eq!(name, "budget");
                let sum = n_sink as u128 + window as u128;
                assert!(expected.ends_with(&format!("= {sum}")), "{expected}");
            }
            other => panic!("{other}"),
        }
    }
}
