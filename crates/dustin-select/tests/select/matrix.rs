//! The shared matrix: every estimator, plain and under `pyramid(..)`, through the same
//! invariants over GQA groups 5, 6, 7 and 8, a ragged batch of 2, several iterations with
//! commits, then a retain.

use dustin_core::SelectionPolicy;
use dustin_select::registry::build_budgeted;
use dustin_select::{build, names, pyramid_budgets, SelectConfig};

use crate::common::{check_selection, rows, Synth, B};

const LAYERS: usize = 3;

fn specs() -> Vec<String> {
    names()
        .iter()
        .map(|n| n.to_string())
        .chain(names().iter().map(|n| format!("pyramid({n})")))
        .collect()
}

fn budgets(spec: &str, cfg: &SelectConfig) -> Vec<usize> {
    if spec.starts_with("pyramid(") {
        pyramid_budgets(cfg, LAYERS, 20.0)
    } else {
        vec![cfg.budget; LAYERS]
    }
}

fn run(spec: &str, group: usize, cfg: &SelectConfig, prompt: [usize; 2]) {
    let what = format!("{spec} g={group} budget={}", cfg.budget);
    let mut p = build::<B>(spec, cfg).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(p.policy_name(), spec);
    let mut s = Synth::new(group as u64, LAYERS, 2, group, 8, 2, 128);
    let mut lens = prompt.to_vec();
    p.reset(2, LAYERS);
    s.prefill(p.as_mut(), &lens, 16);
    let per_layer = budgets(spec, cfg);
    let is_dense = spec.contains("dense");
    let mut seqs = vec![0usize, 1];
    for it in 0..4 {
        if it == 3 {
            // sequence 0 finished: keep sequence 1 only
            p.retain(&[1]);
            seqs = vec![1];
            lens = vec![lens[1]];
        }
        if p.wants_lookahead() {
            let la = s.lookahead(seqs.len(), *lens.iter().max().unwrap());
            p.observe_lookahead(&la);
        }
        p.begin_verify(it);
        let sels = s.verify(p.as_mut(), &seqs, &lens, 4);
        for (layer, sel) in sels.iter().enumerate() {
            let budget = per_layer[layer];
            let fits = lens.iter().all(|&l| l <= budget);
            match sel {
                None => assert!(
                    is_dense || fits,
                    "{what}: layer {layer} it {it}: dense without reason"
                ),
                Some(sel) => {
                    assert!(
                        !is_dense && !fits,
                        "{what}: layer {layer} it {it}: selection where dense is due"
                    );
                    let keep = cfg.keep_with_budget(budget);
                    check_selection(sel, &lens, keep, &format!("{what} layer {layer} it {it}"));
                }
            }
        }
        let accepted: Vec<usize> = seqs.iter().map(|&q| (it + 2 * q) % 4).collect();
        p.commit(&accepted).unwrap();
        for (l, a) in lens.iter_mut().zip(&accepted) {
            *l += a + 1;
        }
    }
}

#[test]
fn every_estimator_keeps_the_invariants() {
    let cfg = SelectConfig {
        budget: 24,
        n_sink: 2,
        window: 6,
        ..SelectConfig::default()
    };
    for spec in specs() {
        for group in [5, 6, 7, 8] {
            run(&spec, group, &cfg, [37, 58]);
        }
    }
}

#[test]
fn budget_at_least_every_context_is_dense() {
    // pyramid's last layer keeps n_sink + window + free / 20: make even that cover every context
    let cfg = SelectConfig {
        budget: 2000,
        n_sink: 2,
        window: 6,
        ..SelectConfig::default()
    };
    for spec in specs() {
        let mut p = build::<B>(&spec, &cfg).unwrap();
        let mut s = Synth::new(1, LAYERS, 2, 6, 8, 2, 128);
        let lens = [37usize, 58];
        p.reset(2, LAYERS);
        s.prefill(p.as_mut(), &lens, 16);
        if p.wants_lookahead() {
            let la = s.lookahead(2, 58);
            p.observe_lookahead(&la);
        }
        p.begin_verify(0);
        let sels = s.verify(p.as_mut(), &[0, 1], &lens, 4);
        assert!(
            sels.iter().all(Option::is_none),
            "{spec}: budget >= context must be dense"
        );
        assert!(budgets(&spec, &cfg).iter().all(|&b| b >= 58));
    }
}

#[test]
fn mixed_batch_one_sequence_fits() {
    // one sequence fits the budget, the other does not: the short one keeps its whole context
    let cfg = SelectConfig {
        budget: 40,
        n_sink: 2,
        window: 6,
        ..SelectConfig::default()
    };
    for spec in ["oracle", "quest", "dustin", "streaming"] {
        let mut p = build::<B>(spec, &cfg).unwrap();
        let mut s = Synth::new(3, LAYERS, 2, 7, 8, 2, 128);
        let lens = [30usize, 70];
        p.reset(2, LAYERS);
        s.prefill(p.as_mut(), &lens, 16);
        let la = s.lookahead(2, 70);
        p.observe_lookahead(&la);
        p.begin_verify(0);
        for sel in s.verify(p.as_mut(), &[0, 1], &lens, 3) {
            let sel = sel.expect("selection");
            let rows = check_selection(&sel, &lens, cfg.keep(), spec);
            assert!(
                rows[0].iter().all(|r| *r == (0..30).collect::<Vec<_>>()),
                "{spec}: short sequence kept whole"
            );
        }
    }
}

#[test]
fn pyramid_layer_with_no_free_budget_keeps_sinks_and_window() {
    // free = 9 over 3 layers at beta 20: budgets [26, 17, 8], the last = n_sink + window
    let cfg = SelectConfig {
        budget: 17,
        n_sink: 2,
        window: 6,
        ..SelectConfig::default()
    };
    assert_eq!(pyramid_budgets(&cfg, LAYERS, 20.0), vec![26, 17, 8]);
    for spec in ["pyramid(oracle)", "pyramid(dustin)", "pyramid(snapkv)"] {
        run(spec, 6, &cfg, [37, 58]);
    }
}

#[test]
fn a_clone_after_prefill_selects_like_the_original() {
    let cfg = SelectConfig {
        budget: 24,
        n_sink: 2,
        window: 6,
        ..SelectConfig::default()
    };
    for spec in specs() {
        let mut p = build_budgeted::<B>(&spec, &cfg, None).unwrap();
        let mut s = Synth::new(3, LAYERS, 2, 6, 8, 2, 128);
        let mut lens = vec![37usize, 58];
        p.reset(2, LAYERS);
        s.prefill(p.as_mut(), &lens, 16);
        let mut q = p.boxed_clone();
        let mut t = s.clone();
        for it in 0..3 {
            for (pol, syn) in [(&mut p, &mut s), (&mut q, &mut t)] {
                if pol.wants_lookahead() {
                    let la = syn.lookahead(2, *lens.iter().max().unwrap());
                    pol.observe_lookahead(&la);
                }
                pol.begin_verify(it);
            }
            let a = s.verify(p.as_mut(), &[0, 1], &lens, 4);
            let b = t.verify(q.as_mut(), &[0, 1], &lens, 4);
            for (layer, (x, y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    x.as_ref().map(rows),
                    y.as_ref().map(rows),
                    "{spec} it {it} layer {layer}"
                );
            }
            p.commit(&[1, 3]).unwrap();
            q.commit(&[1, 3]).unwrap();
            lens[0] += 2;
            lens[1] += 4;
        }
        assert_eq!(p.estimation_reads(), q.estimation_reads(), "{spec}");
    }
}
