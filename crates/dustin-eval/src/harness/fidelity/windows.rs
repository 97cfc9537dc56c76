//! The shared part of one (book, context) and one (budget, selector) row of it.

use std::time::Instant;

use burn_tensor::{activation, backend::Backend, Tensor};
use dustin_core::{DenseHook, Drafter, KvStore, Phase, TokenId, Verifier};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::generate::prefill_from;
use dustin_qwen::{ForwardOpts, LogitsMode};
use dustin_select::BudgetedPolicy;
use dustin_spec::ModelVerifier;

use super::timed::Timed;
use super::{FidelityOptions, Row};
use crate::harness::engine::{
    forced_window, host_f32, host_i64, nll_of, EvalPair, FanOut, Prefilled,
};
use crate::harness::selectors::SelectorSpec;
use crate::harness::HarnessError;

/// What one (book, context) shares between its selectors.
pub(crate) struct Shared<B: KernelOps> {
    /// Both caches after the whole prompt (dense) and the target's last logits.
    pub(crate) start: Prefilled<B>,
    /// Teacher-forced lookahead per window (when a selector wants it).
    pub(crate) lookaheads: Vec<Tensor<B, 2>>,
    /// Dense log-probabilities per window `[1, gamma + 1, vocab]`.
    pub(crate) dense_logp: Vec<Tensor<B, 3>>,
    /// Dense argmax per verified position, all windows.
    pub(crate) dense_top: Vec<i64>,
    /// Dense NLL of the true next tokens, summed.
    pub(crate) dense_nll: f64,
    /// Seconds: dense prefill, fan-out chunk, draft cache and lookaheads, dense reference.
    pub(crate) secs: [f64; 4],
}

pub(crate) struct Ctx<'a, B: Backend> {
    pub(crate) args: &'a FidelityOptions,
    pub(crate) pair: EvalPair<B>,
    pub(crate) capacity: usize,
    /// Prompt tokens every selector sees as its last prefill chunk.
    pub(crate) observed: usize,
    /// Where the rows run ([`KernelBackend::device_description`](dustin_kernels::KernelBackend::device_description)).
    pub(crate) device: String,
}

/// A selector instance pair for one (budget, selector) row: the windows' and the
/// speculative run's.
pub(crate) struct Pending<B: KernelOps> {
    pub(crate) key: String,
    pub(crate) sel: SelectorSpec,
    pub(crate) budget: usize,
    pub(crate) budget_label: String,
    pub(crate) fid: Box<dyn BudgetedPolicy<B>>,
    pub(crate) spec: Option<Box<dyn BudgetedPolicy<B>>>,
}

/// Prefill (dense, once), the selectors' prefill observation (fan-out), the draft cache, the
/// teacher-forced lookaheads and the dense reference windows.
///
/// `prefix` is a dense cache of the book's first tokens from a shorter context (contexts run
/// in ascending order): the prefill continues from it.
pub(crate) fn shared_part<B: KernelOps>(
    cx: &Ctx<'_, B>,
    ids: &[TokenId],
    p: usize,
    pend: &mut [Pending<B>],
    prefix: &mut Option<DenseKvCache<B>>,
) -> Result<Shared<B>, HarnessError> {
    let args = cx.args;
    let g1 = args.rows.gamma + 1;
    let head = p - cx.observed;
    let mut clock = Instant::now();
    let mut secs = [0.0; 4];
    let mut lap = |i: usize, secs: &mut [f64; 4]| {
        secs[i] = clock.elapsed().as_secs_f64();
        clock = Instant::now();
    };
    let from = prefix
        .take()
        .filter(|c| c.lens()[0] < head && c.capacity() == cx.capacity);
    let (mut cache, _, _) = prefill_from(
        &cx.pair.target,
        &[ids[..head].to_vec()],
        from.map(|c| vec![c]),
        cx.capacity,
        None,
        &mut DenseHook,
        cx.observed,
        false,
    )?;
    *prefix = Some(cache.clone());
    lap(0, &mut secs);
    let layers = cx.pair.target.config.num_hidden_layers;
    let mut policies: Vec<&mut Box<dyn BudgetedPolicy<B>>> =
        pend.iter_mut().map(|pe| &mut pe.fid).collect();
    for pol in policies.iter_mut() {
        pol.reset(1, layers);
    }
    let mut fan = FanOut { policies };
    let out = cx.pair.target.forward(
        &[ids[head..p].to_vec()],
        &mut cache,
        &mut fan,
        ForwardOpts {
            phase: Phase::Prefill {
                seq: 0,
                last_chunk: true,
            },
            logits: LogitsMode::Last,
            layers: None,
        },
    )?;
    let logits = out
        .logits
        .ok_or_else(|| HarnessError::Usage("prefill: no logits".into()))?;
    let v = logits.dims()[2];
    let last = logits.reshape([1, v]);
    // the speculative run's instance: a copy after the prefill observation
    if args.spec_tokens > 0 {
        for pe in pend.iter_mut() {
            pe.spec = Some(pe.fid.boxed_clone());
        }
    }
    lap(1, &mut secs);
    let draft_cache = cx
        .pair
        .draft_cache(&cache, &ids[..p], cx.capacity, cx.observed)?;
    let window = |j: usize| ids[p + j * g1..p + (j + 1) * g1].to_vec();
    // teacher-forced lookaheads: the draft reads the window as if it had drafted the book's
    // tokens; its first gamma query rows are the ones a real proposal computes
    let mut lookaheads = Vec::new();
    if pend.iter().any(|pe| pe.fid.wants_lookahead()) {
        let mut drafter = cx.pair.drafter(draft_cache.clone());
        drafter.prefill(&[ids[..p].to_vec()], &[ids[p]])?;
        for j in 0..args.rows.windows {
            lookaheads.push(drafter.force_window(&[window(j)], &[ids[p + (j + 1) * g1]])?);
        }
    }
    lap(2, &mut secs);
    // dense reference
    let mut verifier = cx.pair.verifier(DenseHook, cache.clone(), last.clone());
    verifier.prefill(&[ids[..p].to_vec()])?;
    verifier.set_pending(&[ids[p]])?;
    let mut dense_logp = Vec::new();
    let mut dense_top = Vec::new();
    let mut dense_nll = 0.0;
    for j in 0..args.rows.windows {
        let w = window(j);
        let (logits, _, _) = forced_window(&mut verifier, &w[1..], None, j, ids[p + (j + 1) * g1])?;
        let lp = activation::log_softmax(logits, 2);
        dense_top.extend(host_i64(lp.clone().argmax(2))?);
        dense_nll += nll_of(&lp, &ids[p + j * g1 + 1..p + (j + 1) * g1 + 1])?;
        dense_logp.push(lp);
    }
    lap(3, &mut secs);
    Ok(Shared {
        start: Prefilled {
            cache,
            draft_cache,
            last,
        },
        lookaheads,
        dense_logp,
        dense_top,
        dense_nll,
        secs,
    })
}

/// One (budget, selector) row: the windows through its selector, compared with the dense
/// reference of `sh`, then the speculative run when the row has its instance.
pub(crate) fn run_row<B: KernelOps>(
    cx: &Ctx<'_, B>,
    ids: &[TokenId],
    p: usize,
    sh: &Shared<B>,
    pe: Pending<B>,
    book: &str,
    n: usize,
) -> Result<Row, HarnessError> {
    let args = cx.args;
    let g1 = args.rows.gamma + 1;
    let Pending {
        sel,
        budget,
        budget_label,
        fid,
        spec,
        ..
    } = pe;
    let t = Instant::now();
    let mut verifier = cx.pair.verifier(
        Timed::new(fid),
        sh.start.cache.clone(),
        sh.start.last.clone(),
    );
    verifier.prefill(&[ids[..p].to_vec()])?;
    verifier.set_pending(&[ids[p]])?;
    let (mut win_agree, mut win_kl, mut win_nll) = (Vec::new(), Vec::new(), Vec::new());
    let (mut reads, mut dense) = (0u64, 0u64);
    // the estimator's own reads so far (token-equivalents of the sequence)
    let est_reads = |v: &ModelVerifier<B, Timed<Box<dyn BudgetedPolicy<B>>>>| {
        v.policy()
            .inner()
            .estimation_reads()
            .first()
            .copied()
            .unwrap_or(0.0)
    };
    let mut est_before = est_reads(&verifier);
    let mut est = 0.0f64;
    for j in 0..args.rows.windows {
        // every verified position is committed (teacher forcing)
        let (logits, r, d) = forced_window(
            &mut verifier,
            &ids[p + j * g1 + 1..p + (j + 1) * g1],
            sh.lookaheads.get(j),
            j,
            ids[p + (j + 1) * g1],
        )?;
        let e = est_reads(&verifier);
        est += e - est_before;
        est_before = e;
        reads += r;
        dense += d;
        let lp = activation::log_softmax(logits, 2);
        let dl = &sh.dense_logp[j];
        let kls = (dl.clone().exp() * (dl.clone() - lp.clone())).sum_dim(2);
        win_kl.push(host_f32(kls)?.iter().map(|&x| f64::from(x)).sum::<f64>());
        let top = host_i64(lp.clone().argmax(2))?;
        win_agree.push(
            top.iter()
                .zip(&sh.dense_top[j * g1..(j + 1) * g1])
                .filter(|(a, b)| a == b)
                .count(),
        );
        win_nll.push(nll_of(&lp, &ids[p + j * g1 + 1..p + (j + 1) * g1 + 1])?);
    }
    let secs_windows = t.elapsed().as_secs_f64();
    let secs_select = verifier.policy().secs();
    let agree: usize = win_agree.iter().sum();
    let kl: f64 = win_kl.iter().sum();
    let nll: f64 = win_nll.iter().sum();
    let positions = args.rows.windows * g1;
    let t = Instant::now();
    let (mut sd, mut sv) = (0.0, 0.0);
    let mut spec_accepted = Vec::new();
    let (accept_len, spec_iterations) = match spec {
        Some(policy) => {
            let o = cx.pair.speculate(
                &sh.start,
                &ids[..p],
                policy,
                args.rows.gamma,
                args.spec_tokens,
                Vec::new(),
            )?;
            sd = o.summary.draft_secs;
            sv = o.summary.verify_secs;
            spec_accepted = o
                .iterations
                .iter()
                .map(|it| it.accepted.first().copied().unwrap_or(0))
                .collect();
            (
                Some(o.summary.mean_acceptance_length),
                Some(o.summary.iterations),
            )
        }
        None => (None, None),
    };
    let secs_spec = t.elapsed().as_secs_f64();
    let dense_f = dense.max(1) as f64;
    Ok(Row {
        book: book.to_string(),
        ctx: n,
        prompt_tokens: p,
        budget,
        budget_label,
        selector: sel.label.clone(),
        spec: sel.spec.clone(),
        windows: args.rows.windows,
        gamma: args.rows.gamma,
        positions,
        top1: agree as f64 / positions as f64,
        kl: kl / positions as f64,
        nll: nll / positions as f64,
        dense_nll: sh.dense_nll / positions as f64,
        kv_selected: reads as f64 / dense_f,
        kv_estimation: est / dense_f,
        accept_len,
        spec_iterations,
        secs_windows,
        secs_spec,
        secs_spec_draft: sd,
        secs_spec_verify: sv,
        secs_select,
        win_agree,
        win_kl,
        win_nll,
        spec_accepted,
        device: cx.device.clone(),
    })
}
