//! The fidelity harness on the tiny fixture model: fitting budgets, the figures of a fixed
//! small case.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::*;
use crate::harness::engine::EvalPair;
use burn_flex::{Flex, FlexDevice};
use dustin_qwen::{Qwen2, QwenConfig, SafetensorsDir};

fn tiny() -> Arc<Qwen2<Flex>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../dustin-qwen/tests/fixtures/parity/llama");
    let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
    let src = SafetensorsDir::open(&dir).expect("weights");
    Arc::new(Qwen2::load(&cfg, &src, 256, &FlexDevice).expect("model"))
}

/// The fixed small case's options: a 1-layer self-draft, 3 windows at a context of 128,
/// gamma 3, 6 speculative tokens.
fn fixed_args() -> FidelityOptions {
    FidelityOptions {
        models: ModelFlags {
            model: None,
            draft: "self:layers=1".into(),
        },
        lookahead_layers: "all".into(),
        data: PathBuf::new(),
        rows: WindowFlags {
            books: None,
            ctx: vec![128],
            tuning: SelectorFlags::default(),
            windows: 3,
            gamma: 3,
        },
        selectors: vec![],
        spec_tokens: 6,
        out: PathBuf::new(),
    }
}

/// The fixed small case's context: `target` drafting for itself with its first layer.
fn fixed_ctx<'a>(args: &'a FidelityOptions, target: &Arc<Qwen2<Flex>>) -> Ctx<'a, Flex> {
    Ctx {
        args,
        pair: EvalPair {
            target: target.clone(),
            draft: target.clone(),
            draft_layers: Some(1),
            lookahead_layers: None,
            self_draft: true,
            vocab: 96,
        },
        capacity: 128,
        observed: 16,
        device: "test".into(),
    }
}

/// The fixed small case's book tokens and prompt length:
/// `extra = max(W (gamma + 1) + 1, spec + 2 (gamma + 1)) = 14` positions after the prompt.
fn fixed_ids() -> (Vec<u32>, usize) {
    let ids = (0..150).map(|i| ((i * 37 + 11) % 96) as u32).collect();
    (ids, 128 - 14)
}

/// A row for every registry selector and `pyramid(dustin)` at each (budget, label).
fn every_selector(budgets: &[(usize, &str)]) -> Vec<Pending<Flex>> {
    let mut names: Vec<String> = dustin_select::names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    names.push("pyramid(dustin)".into());
    let mut pend = Vec::new();
    for &(budget, label) in budgets {
        for name in &names {
            let sel = SelectorSpec {
                label: name.clone(),
                spec: name.clone(),
                knobs: None,
                select: None,
            };
            pend.push(Pending {
                key: format!("{label}|{name}"),
                budget,
                budget_label: label.into(),
                fid: sel.build::<Flex>(budget).unwrap(),
                spec: None,
                sel,
            });
        }
    }
    pend
}

/// Every selector with a budget over the context is dense verification bit for bit
/// (top-1 1, KL 0, the same acceptance length); a small budget reads about its share.
#[test]
fn fitting_budgets_are_dense_bit_for_bit_and_small_ones_read_their_share() {
    let target = tiny();
    let args = fixed_args();
    let cx = fixed_ctx(&args, &target);
    let (ids, p) = fixed_ids();
    let mut pend = every_selector(&[(4096, "fits"), (80, "sparse")]);
    let mut prefix = None;
    let sh = shared_part(&cx, &ids, p, &mut pend, &mut prefix).unwrap();
    let rows: Vec<Row> = pend
        .into_iter()
        .map(|pe| run_row(&cx, &ids, p, &sh, pe, "b", 128).unwrap())
        .collect();
    let dense_tau = rows[0].accept_len.unwrap();
    for r in &rows {
        let what = format!("{} budget {}", r.selector, r.budget);
        assert_eq!(r.positions, 12, "{what}");
        // the per-window and per-iteration figures are the row's, split
        assert_eq!(r.win_agree.len(), 3, "{what}");
        let agree: usize = r.win_agree.iter().sum();
        assert_eq!(agree as f64 / 12.0, r.top1, "{what}");
        assert!(
            (r.win_kl.iter().sum::<f64>() / 12.0 - r.kl).abs() < 1e-12,
            "{what}"
        );
        assert!(
            (r.win_nll.iter().sum::<f64>() / 12.0 - r.nll).abs() < 1e-12,
            "{what}"
        );
        let it = r.spec_iterations.unwrap();
        assert_eq!(r.spec_accepted.len(), it, "{what}");
        let tau = r.spec_accepted.iter().map(|&a| (a + 1) as f64).sum::<f64>() / it as f64;
        assert!((tau - r.accept_len.unwrap()).abs() < 1e-12, "{what}");
        assert!(
            (0.0..=1.0).contains(&r.top1) && r.kl >= -1e-6 && r.kl.is_finite(),
            "{what}"
        );
        if r.budget == 4096 || r.selector == "dense" {
            assert_eq!(r.top1, 1.0, "{what}");
            assert_eq!(r.kl, 0.0, "{what}");
            assert_eq!(r.nll, r.dense_nll, "{what}");
            assert_eq!(r.kv_selected, 1.0, "{what}");
            assert_eq!(r.kv_estimation, 0.0, "{what}");
            assert_eq!(r.accept_len, Some(dense_tau), "{what}");
        } else {
            // 80 of about 114 .. 126 context tokens, new tokens aside
            assert!(
                r.kv_selected > 0.5 && r.kv_selected < 0.8,
                "{what}: {}",
                r.kv_selected
            );
        }
    }
}

/// The figures of a fixed small case at a budget of 80 are the recorded ones: the engine's
/// drafter (teacher-forced lookaheads, speculative run) and verifier, driven by the harness,
/// give these selections and figures.
#[test]
fn sparse_figures_of_a_fixed_case_are_the_recorded_ones() {
    let target = tiny();
    let args = fixed_args();
    let cx = fixed_ctx(&args, &target);
    let (ids, p) = fixed_ids();
    let mut pend = every_selector(&[(80, "sparse")]);
    let mut prefix = None;
    let sh = shared_part(&cx, &ids, p, &mut pend, &mut prefix).unwrap();
    // (top-1 agreement, KL, mean acceptance length, iterations)
    let want: BTreeMap<&str, (f64, f64, f64, usize)> = [
        ("streaming", (2.0 / 12.0, 0.4344516880810261, 1.0, 5)),
        ("h2o", (5.0 / 12.0, 0.3254195662836234, 1.75, 4)),
        ("oracle", (7.0 / 12.0, 0.11433123013315101, 1.5, 4)),
        ("draft-only", (3.0 / 12.0, 0.2129144755502542, 1.0, 5)),
        ("dustin", (5.0 / 12.0, 0.2147403839044273, 1.25, 4)),
        ("pyramid(dustin)", (7.0 / 12.0, 0.12726490447918573, 1.2, 5)),
    ]
    .into_iter()
    .collect();
    for pe in pend {
        let r = run_row(&cx, &ids, p, &sh, pe, "b", 128).unwrap();
        eprintln!(
            "{:<16} top-1 {:.17} KL {:.17} tau {:?} iterations {:?} KV {:.17}",
            r.selector, r.top1, r.kl, r.accept_len, r.spec_iterations, r.kv_selected
        );
        let Some(&(top1, kl, tau, it)) = want.get(r.selector.as_str()) else {
            continue;
        };
        let what = &r.selector;
        assert!((r.top1 - top1).abs() < 1e-12, "{what}: top-1 {}", r.top1);
        assert!((r.kl - kl).abs() < 1e-6, "{what}: KL {}", r.kl);
        assert_eq!(r.accept_len, Some(tau), "{what}");
        assert_eq!(r.spec_iterations, Some(it), "{what}");
        assert!((r.kv_selected - 40.0 / 59.0).abs() < 1e-12, "{what}");
    }
}

/// `--data` takes a comma-separated list of files and directories; a source file is kept as
/// it is; two sources with one file stem are refused, naming it.
#[test]
fn data_lists_sources_and_refuses_duplicate_ids() {
    let dir = std::env::temp_dir().join(format!("dustin-fid-sources-{}", std::process::id()));
    let books = dir.join("books");
    std::fs::create_dir_all(&books).unwrap();
    std::fs::write(books.join("1.txt"), "A book.\n").unwrap();
    std::fs::write(dir.join("a.py"), "def f():\n    return 1\n").unwrap();
    std::fs::write(dir.join("1.rs"), "fn main() {}\n").unwrap();
    let list = format!("{},{}", books.display(), dir.join("a.py").display());
    let got = load_sources(std::path::Path::new(&list)).unwrap();
    let ids: Vec<&str> = got.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(ids, ["1", "a"]);
    assert_eq!(got[1].text, "def f():\n    return 1");
    let dup = format!("{},{}", books.display(), dir.join("1.rs").display());
    let e = load_sources(std::path::Path::new(&dup))
        .unwrap_err()
        .to_string();
    assert!(e.contains("two sources named 1"), "{e}");
    let missing = dir.join("missing.txt");
    let e = load_sources(&missing).unwrap_err().to_string();
    assert!(e.contains("missing.txt"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
