//! The measurement of `dustin-bench e2e`: every (context, batch, mode) row and every setting
//! of the list flags, each a real run of the engine under the forced acceptance schedule.

use std::sync::Arc;

use burn_tensor::{Distribution, Tensor};
use dustin_cli::footprint::{kv_bytes_per_token, weight_bytes_per_forward};
use dustin_cli::generate::{build_policy, draft_selection, FileConfig};
use dustin_cli::CliError;
use dustin_core::{DenseHook, TokenId};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::{Qwen2, QwenConfig};
use dustin_spec::{
    autoregressive_with_barrier, LookaheadConfig, LookaheadLayers, ModelDrafter, ModelVerifier,
    PhaseBarrier, SpecConfig, SpeculativeDecoder,
};

use super::args::{E2eArgs, Elementwise, OnOff, Scoring, DENSE_WAVES};
use super::checks::{accept_of, trace_of};
use super::rows::{mean, print_scaled_summary, report_profile, timed_window, Row};
use super::HBM_BYTES_PER_SEC;
use crate::jsonl::append_json;
use dustin_kernels::{EstimatorKernels, KernelConfig, SplitReduce, TopkKernel};

/// `+ads{v}`, `v` in its shortest decimal form up to 8 characters, else in scientific
/// notation (`1e-9`), so that labels and host-profile file names stay short.
fn drop_sigmas_label(v: f64) -> String {
    let plain = format!("{v}");
    if plain.len() <= 8 {
        format!("+ads{plain}")
    } else {
        format!("+ads{v:e}")
    }
}

/// Whether `mode`'s selector is the `dustin` estimator (what `--estimator-kernels` changes).
fn uses_dustin_estimator(mode: &str) -> bool {
    matches!(mode, "dustin" | "history-only")
}

/// Whether `mode` selects positions by top-k (what `--topk-kernel` changes).
fn selects_top_k(mode: &str) -> bool {
    !matches!(mode, "ar" | "dense")
}

/// The label suffix of a `--lookahead-layers` setting: its written form without `:` and with
/// `_` for `,` (`+lastride2`, `+la0_5_9`), so that host-profile file names stay plain.
fn lookahead_layers_label(la: &LookaheadLayers) -> String {
    format!("+la{}", la.to_string().replace(':', "").replace(',', "_"))
}

/// A batch-1 K/V cache whose first `len` positions are "filled" with N(0, 1) keys and values
/// (the whole capacity is random; only `len` counts).
fn random_prefix<B: KernelOps>(
    model: &Qwen2<B>,
    capacity: usize,
    len: usize,
    layers: usize,
    dev: &B::Device,
) -> Result<DenseKvCache<B>, CliError> {
    let s = model.kv_shape(1, capacity, Some(layers));
    let dims = [1, s.kv_heads, capacity, s.head_dim];
    let mk = || Tensor::<B, 4>::random(dims, Distribution::Normal(0.0, 1.0), dev);
    let k = (0..layers).map(|_| mk()).collect();
    let v = (0..layers).map(|_| mk()).collect();
    Ok(DenseKvCache::from_layers(k, v, &[len])?)
}

/// Seed of the backend's generator before each row's random KV prefixes (with the context
/// and batch mixed in): arbitrary, fixed so that runs and rows are comparable.
const PREFIX_SEED: u64 = 0xd057_1e5e_ed00_0000;

/// Every (context, batch, mode) row on one rank (`report`: print and write the rows).
pub(super) fn measure<B: KernelOps>(
    args: &E2eArgs,
    (tcfg, dcfg, extra, full_layers): (&QwenConfig, &QwenConfig, usize, usize),
    target: Arc<Qwen2<B>>,
    draft: Option<Arc<Qwen2<B>>>,
    dev: &B::Device,
    report: bool,
) -> Result<(), CliError> {
    // only the reporting rank records (the draft is replicated, not split: every rank's copy
    // would add to the one table)
    let (target, draft) = if args.profile && report {
        (
            Arc::new((*target).clone().with_profile(Some("target"))),
            draft.map(|d| Arc::new((*d).clone().with_profile(Some("draft")))),
        )
    } else {
        (target, draft)
    };
    let (fused, skinny, grouped, kv_write) = (
        args.elementwise == Elementwise::Fused,
        args.skinny_gemm == OnOff::On,
        args.grouped_gemm == OnOff::On,
        args.kv_write_kernel == OnOff::On,
    );
    // always set: the models' own default is on where the backend has fused kernels, so
    // `plain` / `off` must be asked for explicitly
    let with = |m: &Qwen2<B>, residual: OnOff, rope_kv: OnOff| {
        let kernels = KernelConfig {
            elementwise: fused.into(),
            skinny_gemm: skinny.into(),
            grouped_gemm: grouped.into(),
            fused_residual: (residual == OnOff::On).into(),
            kv_write: kv_write.into(),
            rope_kv_write: (rope_kv == OnOff::On).into(),
            skinny_kernel: args.skinny_kernel,
            ring: args.ring_config,
            verify_kernel: args.verify_kernel,
            score_kernel: args.score_kernel,
            score_mass: (args.score_mass == OnOff::On).into(),
            score_wide: (args.score_wide == OnOff::On).into(),
            ..*m.kernel_config()
        };
        Arc::new(m.clone().with_kernel_config(kernels))
    };
    // one (target, draft) pair per (`--fused-residual`, `--rope-kv-write`) setting (clones
    // share the weights)
    type Pair<B> = ((OnOff, OnOff), Arc<Qwen2<B>>, Option<Arc<Qwen2<B>>>);
    // (one setting where the backend has no fused kernels or they are off: the rows would
    // be the same)
    let residuals = if B::FUSED && fused {
        &args.fused_residual[..]
    } else {
        &args.fused_residual[..1]
    };
    // (the model takes the one op wherever both switches are on, the CPU included)
    let rope_kvs = if fused && kv_write {
        &args.rope_kv_write[..]
    } else {
        &args.rope_kv_write[..1]
    };
    let pairs: Vec<Pair<B>> = residuals
        .iter()
        .flat_map(|&r| rope_kvs.iter().map(move |&k| (r, k)))
        .map(|(r, k)| {
            let d = draft.as_deref().map(|d| with(d, r, k));
            ((r, k), with(&target, r, k), d)
        })
        .collect();
    let target = &pairs[0].1;
    let world = target.tp().map_or(1, |(_, w)| w) as f64;
    let vocab = tcfg.vocab_size.min(dcfg.vocab_size);
    // per rank: 1/world of the target's layers and KV (the replicated LM head is counted
    // once per rank too, a small overcount)
    let wt = weight_bytes_per_forward(tcfg, 2.0) / world;
    let wd = weight_bytes_per_forward(dcfg, 2.0);
    let kvt = kv_bytes_per_token(tcfg, 2.0) / world;
    let kvd = kv_bytes_per_token(dcfg, 2.0);
    // the same at the target's full depth (`--target-layers` keeps fewer)
    let full = QwenConfig {
        num_hidden_layers: full_layers,
        ..tcfg.clone()
    };
    let layer_scale = full_layers as f64 / tcfg.num_hidden_layers as f64;
    let (wt_full, kvt_full) = (
        weight_bytes_per_forward(&full, 2.0) / world,
        kv_bytes_per_token(&full, 2.0) / world,
    );
    // (mode, row) of every row reported, for the summary at the end
    let mut done: Vec<(String, Row)> = Vec::new();
    if report {
        println!(
            "| mode | ctx | B | tau | draft ms | verify ms | accept+commit ms | iter ms | tokens/s | KV read (+est.) | floor ms | over floor |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    }
    for &ctx in &args.ctx {
        for &batch in &args.batch {
            for mode in &args.modes {
                // whether the mode's selector reads the draft's lookahead (the scoring
                // settings after the first run only such modes)
                let reads_lookahead = mode != "ar"
                    && build_policy::<B>(mode, args.budget, &FileConfig::default())?
                        .wants_lookahead();
                // every setting of the lists, but for the scoring only modes that read the
                // lookahead, and for the draft budget only speculative modes
                // and for the estimator kernels only `dustin` estimator modes, for the top-k
                // kernel only modes that select
                let mut variants = Vec::new();
                for (pair, (pi, &sr), (wi, &dw)) in pairs.iter().flat_map(|p| {
                    args.split_reduce.iter().enumerate().flat_map(move |s| {
                        args.dense_waves.iter().enumerate().map(move |w| (p, s, w))
                    })
                }) {
                    // the CPU has no fused GEMMs nor flash kernel: one setting
                    if (pi > 0 || wi > 0) && !B::FUSED {
                        continue;
                    }
                    for (si, &scoring) in args.lookahead_scoring.iter().enumerate() {
                        for (li, la) in args.lookahead_layers.iter().enumerate() {
                            for (bi, &db) in args.draft_budget.iter().enumerate() {
                                for (ei, &ek) in args.estimator_kernels.iter().enumerate() {
                                    for (ti, &tk) in args.topk_kernel.iter().enumerate() {
                                        for (ri, &br) in args.batched_reuse.iter().enumerate() {
                                            for (ai, &ads) in
                                                args.accept_drop_sigmas.iter().enumerate()
                                            {
                                                if ((si > 0 || li > 0) && !reads_lookahead)
                                                    || (bi > 0 && mode == "ar")
                                                    || (ei > 0
                                                        && !(B::FUSED
                                                            && uses_dustin_estimator(mode)))
                                                    || (ti > 0
                                                        && !(B::FUSED && selects_top_k(mode)))
                                                    || (ri > 0 && !uses_dustin_estimator(mode))
                                                    || (ai > 0 && mode != "dustin")
                                                {
                                                    continue;
                                                }
                                                variants.push((
                                                    (pair, sr, dw),
                                                    scoring,
                                                    la.clone(),
                                                    db,
                                                    ek,
                                                    tk,
                                                    br,
                                                    ads,
                                                ));
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                // every round runs the mode's rows in the same order: A B A B
                let rounds = (1..=args.rounds).flat_map(|r| variants.iter().map(move |v| (r, v)));
                for (
                    round,
                    (
                        ((residual, target, draft), split, dense_waves),
                        scoring,
                        la_layers,
                        draft_budget,
                        est_kernels,
                        topk,
                        batched,
                        drop_sigmas,
                    ),
                ) in rounds
                {
                    let (scoring, la_layers, draft_budget) =
                        (*scoring, la_layers.clone(), *draft_budget);
                    let (est_kernels, topk, batched, drop_sigmas) =
                        (*est_kernels, *topk, *batched, *drop_sigmas);
                    // the noise test of `dustin`'s early refresh (the only mode that has one)
                    let drop_sigmas = (mode == "dustin").then_some(drop_sigmas);
                    let batched = if uses_dustin_estimator(mode) {
                        batched
                    } else {
                        OnOff::On
                    };
                    let (residual, rope_kv) = *residual;
                    // the settings in effect for this row (the CPU has neither kernel)
                    let est_kernels = if B::FUSED && uses_dustin_estimator(mode) {
                        est_kernels
                    } else {
                        EstimatorKernels::NONE
                    };
                    let topk = if B::FUSED && selects_top_k(mode) {
                        topk
                    } else {
                        TopkKernel::Block
                    };
                    // (the CPU has no fused GEMMs)
                    let split = if B::FUSED {
                        *split
                    } else {
                        SplitReduce::Kernel
                    };
                    let dense_waves = if B::FUSED { *dense_waves } else { DENSE_WAVES };
                    // this row's kernel choices, installed by each forward pass of the models
                    let row = |m: &Arc<Qwen2<B>>| {
                        Arc::new((**m).clone().with_kernel_config(KernelConfig {
                            dense_waves,
                            split_reduce: split,
                            estimator_kernels: est_kernels,
                            topk_kernel: topk,
                            ..*m.kernel_config()
                        }))
                    };
                    let (target, draft) = (&row(target), draft.as_ref().map(row));
                    // the mode's name in the table, profiles and JSON rows: `+res` where a list of
                    // settings ran it with the fused residual in effect
                    let mut label = if residuals.len() > 1 && residual == OnOff::On {
                        format!("{mode}+res")
                    } else {
                        mode.clone()
                    };
                    // `+rkv` where a list of settings ran it with RoPE and the cache write as one
                    // op
                    if rope_kvs.len() > 1 && rope_kv == OnOff::On {
                        label.push_str("+rkv");
                    }
                    // `+db<n>` where the draft attends to a selection of n tokens
                    if mode != "ar" && draft_budget > 0 {
                        label.push_str(&format!("+db{draft_budget}"));
                    }
                    // `+step` where a list of scoring settings ran it with per-step scoring
                    if args.lookahead_scoring.len() > 1
                        && reads_lookahead
                        && scoring == Scoring::PerStep
                    {
                        label.push_str("+step");
                    }
                    // `+la...` where a list of lookahead-layer settings ran it
                    if args.lookahead_layers.len() > 1 && reads_lookahead {
                        label.push_str(&lookahead_layers_label(&la_layers));
                    }
                    // `+ek` / `+ekmix` / `+ekfold` where a list of estimator-kernel settings ran
                    // it with kernels
                    if args.estimator_kernels.len() > 1 {
                        label.push_str(match est_kernels {
                            EstimatorKernels {
                                fold: false,
                                mix: false,
                            } => "",
                            EstimatorKernels {
                                fold: false,
                                mix: true,
                            } => "+ekmix",
                            EstimatorKernels {
                                fold: true,
                                mix: false,
                            } => "+ekfold",
                            EstimatorKernels {
                                fold: true,
                                mix: true,
                            } => "+ek",
                        });
                    }
                    // `+ads{v}` where a list of noise tests ran it
                    if let (true, Some(v)) = (args.accept_drop_sigmas.len() > 1, drop_sigmas) {
                        label.push_str(&drop_sigmas_label(v));
                    }
                    // `+perlayer` where a list of batched-reuse settings ran it layer by layer
                    if args.batched_reuse.len() > 1 && batched == OnOff::Off {
                        label.push_str("+perlayer");
                    }
                    // `+tkb` / `+tkw` where a list of top-k kernels ran it
                    if args.topk_kernel.len() > 1 && B::FUSED && selects_top_k(mode) {
                        label.push_str(match topk {
                            TopkKernel::Block => "+tkb",
                            TopkKernel::Warp => "+tkw",
                        });
                    }
                    // `+srk` where a list of split-reduce settings ran it with the reduce kernel
                    if args.split_reduce.len() > 1 && B::FUSED && split == SplitReduce::Kernel {
                        label.push_str("+srk");
                    }
                    // `+dw<n>` where a list of dense-wave settings ran it
                    if args.dense_waves.len() > 1 && B::FUSED {
                        label.push_str(&format!("+dw{dense_waves}"));
                    }
                    // `#r` where several rounds ran it
                    if args.rounds > 1 {
                        label.push_str(&format!("#{round}"));
                    }
                    let trace = trace_of(args, mode, ctx)?;
                    let tau = match &trace {
                        Some(t) => 1.0 + mean(t.iter().map(|&a| a as f64)),
                        None => accept_of(args, mode)?,
                    };
                    let prompts: Vec<Vec<TokenId>> = (0..batch)
                        .map(|b| {
                            (0..ctx)
                                .map(|i| ((i * 7919 + b * 104_729 + 13) % vocab) as TokenId)
                                .collect()
                        })
                        .collect();
                    let capacity = ctx + extra;
                    let pre = ctx - args.tail;
                    // the same random prefixes for every row of a (context, batch): the
                    // rows of a list flag then see the same KV values (unseeded, `dustin`'s
                    // calibrated estimator heads and so its estimation reads changed between
                    // runs and between side-by-side rows)
                    B::seed(dev, PREFIX_SEED ^ ((ctx as u64) << 20) ^ batch as u64);
                    // one random prefix shared by every sequence (clones share storage until the
                    // prefill writes each sequence's tail, one sequence at a time)
                    let tprefix =
                        vec![
                            random_prefix(target, capacity, pre, tcfg.num_hidden_layers, dev)?;
                            batch
                        ];
                    let cfg = SpecConfig {
                        gamma: if mode == "ar" { 1 } else { args.gamma },
                        max_new_tokens: if mode == "ar" {
                            args.warmup + args.iters + 1
                        } else if let Some(t) = &trace {
                            // the most tokens any sequence's offset into the trace emits
                            // over the iterations run
                            (0..t.len())
                                .map(|s| {
                                    (0..=args.warmup + args.iters)
                                        .map(|i| t[(i + s) % t.len()] + 1)
                                        .sum::<usize>()
                                })
                                .max()
                                .unwrap_or(0)
                                + 1
                        } else {
                            ((args.warmup + args.iters + 1) as f64 * tau).ceil() as usize + 1
                        },
                        ..SpecConfig::default()
                    };
                    // the first call for sequence 0 follows the prefill, then one per iteration:
                    // the profiles (phase and host) start once the warm-up iterations are done
                    // and are read when the timed iterations are done
                    let mut seen = 0usize;
                    let mut window: Option<Vec<dustin_qwen::profile::PhaseTime>> = None;
                    let (warmup, iters) = (args.warmup, args.iters);
                    let mut host: Option<dustin_cli::host_profile::HostProfile> = None;
                    let mut host_err: Option<CliError> = None;
                    // `+` and `#` of a label become `_`: file names of letters, digits, `-`, `_`, `.`
                    // travel everywhere (the device tool drops other names)
                    let host_name = format!(
                        "host-{}-{ctx}-b{batch}-l{}{}",
                        label.replace(['+', '#'], "_"),
                        tcfg.num_hidden_layers,
                        if world > 1.0 {
                            format!("-tp{world}")
                        } else {
                            String::new()
                        }
                    );
                    let mut on_tokens = |seq: usize, _: &[TokenId]| {
                        if seq != 0 || !report {
                            return;
                        }
                        seen += 1;
                        if args.mark_iterations {
                            match seen - 1 {
                                0 => eprintln!("e2e: {label}: prefill done"),
                                i if i <= warmup => {
                                    eprintln!("e2e: {label}: iteration {i} done (warm-up)")
                                }
                                i if i <= warmup + iters => {
                                    eprintln!("e2e: {label}: iteration {i} done (timed)")
                                }
                                i => eprintln!(
                                    "e2e: {label}: iteration {i} done (after the timed ones)"
                                ),
                            }
                        }
                        if let Some(dir) = &args.host_profile {
                            let r = if seen == warmup + 1 {
                                dustin_cli::host_profile::HostProfile::start(dir, &host_name)
                                    .map(|p| host = Some(p))
                            } else if seen == warmup + iters + 1 {
                                host.take().map_or(Ok(()), |p| {
                                    p.finish(&format!("{host_name}, {iters} iterations"))
                                        .map(|path| eprintln!("host profile: {}", path.display()))
                                })
                            } else {
                                Ok(())
                            };
                            if let Err(e) = r {
                                host_err.get_or_insert(e);
                            }
                        }
                        if args.profile {
                            if seen == warmup + 1 {
                                dustin_qwen::profile::reset();
                            } else if seen == warmup + iters + 1 {
                                window = Some(dustin_qwen::profile::snapshot());
                            }
                        }
                    };
                    // `--sync-phases on`: the device's queued work done at each phase's end
                    let mut barrier = (args.sync_phases == OnOff::On).then(|| {
                        let dev = dev.clone();
                        PhaseBarrier(Box::new(move || {
                            B::sync(&dev).map_err(|e| {
                                dustin_core::CoreError::Model(format!("device sync: {e:?}"))
                            })
                        }))
                    });
                    let out = if mode == "ar" {
                        let mut v = ModelVerifier::new(target.clone(), DenseHook, extra, vocab)
                            .with_prefix(tprefix);
                        autoregressive_with_barrier(
                            &mut v,
                            &prompts,
                            &cfg,
                            None,
                            &mut on_tokens,
                            barrier.as_mut(),
                        )?
                    } else {
                        let draft = draft.as_ref().ok_or_else(|| {
                            CliError::Usage(format!("mode {mode}: no draft model was built"))
                        })?;
                        let dprefix =
                            vec![
                                random_prefix(draft, capacity, pre, dcfg.num_hidden_layers, dev)?;
                                batch
                            ];
                        let mut select = serde_json::Map::new();
                        if batched == OnOff::Off {
                            select.insert("batched_reuse".into(), false.into());
                        }
                        if let Some(v) = drop_sigmas {
                            select.insert("accept_drop_sigmas".into(), v.into());
                        }
                        let file = FileConfig {
                            select: (!select.is_empty()).then_some(select.into()),
                            ..FileConfig::default()
                        };
                        let policy = build_policy::<B>(mode, args.budget, &file)?;
                        let drafter = ModelDrafter::new(draft.clone(), None, extra)
                            .with_prefix(dprefix)
                            .with_lookahead(LookaheadConfig {
                                layers: la_layers.resolve(dcfg.num_hidden_layers).map_err(|e| {
                                    CliError::Usage(format!("--lookahead-layers: {e}"))
                                })?,
                                scoring: scoring.into(),
                            })
                            .with_draft_selection(draft_selection(draft_budget)?)?;
                        let verifier = ModelVerifier::new(target.clone(), policy, extra, vocab)
                            .with_prefix(tprefix);
                        let mut dec = SpeculativeDecoder::new(drafter, verifier);
                        match trace.clone() {
                            Some(t) => dec.set_forced_trace(Some(t))?,
                            None => dec.set_forced_acceptance(Some(tau - 1.0))?,
                        }
                        dec.set_forced_ragged(args.ragged_accept == OnOff::On);
                        dec.set_phase_barrier(barrier.take());
                        dec.generate(&prompts, &cfg, None, &mut on_tokens)?
                    };
                    if let Some(e) = host_err {
                        return Err(e);
                    }
                    // the generation ended before the timed window did: report what was sampled
                    if let Some(p) = host.take() {
                        let path = p.finish(&format!(
                        "{host_name}, {} iterations (the run ended before the window's {iters})",
                        seen.saturating_sub(warmup + 1)
                    ))?;
                        eprintln!("host profile (partial window): {}", path.display());
                    }
                    // the generation stops within a few iterations of the timed window's end, so
                    // the window is complete; otherwise the profile covers what ran after warm-up
                    let profiled = window.take().map_or_else(
                        || {
                            (
                                dustin_qwen::profile::snapshot(),
                                out.iterations.len().saturating_sub(args.warmup),
                            )
                        },
                        |w| (w, args.iters),
                    );
                    let setup_secs = out.summary.prefill_secs;
                    let w = timed_window(&out.iterations, args.warmup, args.iters, mode)?;
                    let (draft_ms, verify_ms, accept_ms, commit_ms) =
                        (w.draft_ms, w.verify_ms, w.accept_ms, w.commit_ms);
                    let iter_ms = draft_ms + verify_ms + accept_ms + commit_ms;
                    let tau_run = w.tau_measured;
                    // a replayed trace: the tokens the timed iterations emitted
                    let tau_rate = if trace.is_some() { tau_run } else { tau };
                    let timed = w.iterations;
                    let kv_read = mean(
                        timed
                            .iter()
                            .flat_map(|i| i.kv_read_fraction.iter().copied()),
                    );
                    let est = mean(
                        timed
                            .iter()
                            .flat_map(|i| i.estimation_read_fraction.iter().copied()),
                    );
                    let (b, c) = (batch as f64, ctx as f64);
                    let g = if mode == "ar" { 0.0 } else { args.gamma as f64 };
                    // the draft's KV: dense per step, or its selection per step plus its keys
                    // (half of K and V) once for the mass
                    let draft_kv = if mode != "ar" && draft_budget > 0 {
                        g * b * c.min(draft_budget as f64) * kvd + b * c * kvd / 2.0
                    } else {
                        g * b * c * kvd
                    };
                    let floor_bytes = wt + g * wd + draft_kv + (kv_read + est) * b * c * kvt;
                    let floor_ms = 1e3 * floor_bytes / HBM_BYTES_PER_SEC;
                    // at full depth: the draft as measured, the target's phases (verify,
                    // accept, commit) times full / measured layers
                    let scaled_iter_ms =
                        draft_ms + (verify_ms + accept_ms + commit_ms) * layer_scale;
                    let scaled_floor_ms = 1e3
                        * (wt_full + g * wd + draft_kv + (kv_read + est) * b * c * kvt_full)
                        / HBM_BYTES_PER_SEC;
                    let row = Row {
                        mode: label.clone(),
                        ctx,
                        batch,
                        target_layers: tcfg.num_hidden_layers,
                        tp: world as usize,
                        gamma: g as usize,
                        tau,
                        tau_measured: tau_run,
                        draft_ms,
                        verify_ms,
                        accept_ms,
                        commit_ms,
                        iter_ms,
                        iter_ms_each: timed
                            .iter()
                            .map(|i| {
                                1e3 * (i.draft_secs + i.verify_secs + i.accept_secs + i.commit_secs)
                            })
                            .collect(),
                        tokens_per_sec: b * tau_rate / (iter_ms / 1e3),
                        kv_read,
                        estimation_read: est,
                        floor_bytes,
                        floor_ms,
                        over_floor: iter_ms / floor_ms,
                        full_layers,
                        scaled_iter_ms,
                        scaled_tokens_per_sec: b * tau_rate / (scaled_iter_ms / 1e3),
                        scaled_floor_ms,
                        scaled_over_floor: scaled_iter_ms / scaled_floor_ms,
                        setup_secs,
                        elementwise: if B::FUSED {
                            args.elementwise
                        } else {
                            Elementwise::Plain
                        },
                        skinny_gemm: if B::FUSED {
                            args.skinny_gemm
                        } else {
                            OnOff::Off
                        },
                        grouped_gemm: if B::FUSED && skinny {
                            args.grouped_gemm
                        } else {
                            OnOff::Off
                        },
                        fused_residual: if B::FUSED && fused {
                            residual
                        } else {
                            OnOff::Off
                        },
                        lookahead_scoring: reads_lookahead.then_some(scoring),
                        lookahead_layers: reads_lookahead.then(|| la_layers.to_string()),
                        draft_budget: if mode == "ar" { 0 } else { draft_budget },
                        ragged_accept: if mode == "ar" {
                            OnOff::Off
                        } else {
                            args.ragged_accept
                        },
                        kv_write_kernel: args.kv_write_kernel,
                        rope_kv_write: if fused && kv_write {
                            rope_kv
                        } else {
                            OnOff::Off
                        },
                        skinny_kernel: args.skinny_kernel,
                        ring_config: args.ring_config.to_string(),
                        verify_kernel: args.verify_kernel,
                        score_kernel: args.score_kernel,
                        score_mass: args.score_mass,
                        score_wide: args.score_wide,
                        estimator_kernels: est_kernels,
                        topk_kernel: topk,
                        split_reduce: split,
                        dense_waves,
                        batched_reuse: uses_dustin_estimator(mode).then_some(batched),
                        accept_drop_sigmas: drop_sigmas,
                        sync_phases: args.sync_phases,
                        round,
                    };
                    if !report {
                        continue;
                    }
                    println!(
                    "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.3} (+{:.3}) | {:.2} | {:.1}x |",
                    row.mode,
                    row.ctx,
                    row.batch,
                    row.tau,
                    row.draft_ms,
                    row.verify_ms,
                    row.accept_ms + row.commit_ms,
                    row.iter_ms,
                    row.tokens_per_sec,
                    row.kv_read,
                    row.estimation_read,
                    row.floor_ms,
                    row.over_floor
                );
                    if let Some(p) = &args.json {
                        append_json(p, &row)?;
                    }
                    if args.profile {
                        report_profile(args, &label, ctx, batch, profiled)?;
                    }
                    done.push((mode.clone(), row));
                }
            }
        }
    }
    if report {
        print_scaled_summary(&done);
    }
    Ok(())
}

#[cfg(test)]
mod drop_label_tests {
    use super::drop_sigmas_label;

    #[test]
    fn drop_sigmas_labels_stay_short() {
        assert_eq!(drop_sigmas_label(0.0), "+ads0");
        assert_eq!(drop_sigmas_label(3.0), "+ads3");
        assert_eq!(drop_sigmas_label(0.5), "+ads0.5");
        assert_eq!(drop_sigmas_label(1e-320), "+ads1e-320");
        assert_eq!(drop_sigmas_label(0.123456789), "+ads1.23456789e-1");
    }
}
