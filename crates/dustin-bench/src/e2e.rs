//! `dustin-bench e2e`: end-to-end speed of autoregressive and speculative decoding at real
//! model shapes (random weights), every mode under the same acceptance schedule.
//!
//! For each context length and batch size, each mode starts from a KV cache whose first
//! `ctx - tail` positions hold random keys and values (a real prefill of 32k tokens takes
//! seconds per sequence, `dustin-bench bench`, and measures nothing this benchmark is
//! about); the last `tail` prompt tokens are prefilled for real through the mode's selection
//! policy, so the estimators see the prompt end as they would. Then the real engine runs
//! ([`SpeculativeDecoder`] with [`SpeculativeDecoder::set_forced_acceptance`], or
//! [`dustin_spec::autoregressive`]): draft, estimate, select, verify, accept, roll back, all
//! measured.
//! Random weights make acceptance meaningless, so every sequence accepts the schedule's mean
//! (`--accept`, mean acceptance length tau = accepted drafts + 1); tokens/s follows from it.
//!
//! Next to every row: a bandwidth floor, the bytes the mode must read per iteration over the
//! H200's 4.3 TB/s (`../shared/docs/GPU.md`): target weights once per verification, draft
//! weights once per draft step, the draft's dense KV per draft step (a draft with a selection,
//! `--draft-budget`: its budget's K and V per step and its keys once per iteration for its
//! mass), the target's KV read by the verification (dense, or the selection as the engine
//! counts it) and by the estimator.
//!
//! [`SpeculativeDecoder`]: dustin_spec::SpeculativeDecoder
//! [`SpeculativeDecoder::set_forced_acceptance`]:
//!     dustin_spec::SpeculativeDecoder::set_forced_acceptance

mod args;
mod checks;
mod measure;
mod rows;

pub use args::{E2eArgs, Elementwise, OnOff};
pub(crate) use rows::timed_window;

use std::sync::Arc;
use std::time::Instant;

use dustin_cli::generate::check_kv_memory;
use dustin_cli::CliError;
use dustin_kernels::KernelOps;
use dustin_qwen::{Qwen2, QwenConfig, TpGroup, TpRank};

use crate::jsonl::check_json_path;
use checks::{extra_positions, max_positions, validate};
use measure::measure;

/// HBM bandwidth of the H200 used for the floors, bytes/s: the figure `../shared/docs/GPU.md`
/// uses for its floors (NVIDIA's datasheet peak is 4.8 TB/s; a device-to-device copy
/// measured 4.0 TB/s counting read and write).
pub const HBM_BYTES_PER_SEC: f64 = 4.3e12;

/// `dustin-bench e2e`.
pub fn run(mut args: E2eArgs) -> Result<(), CliError> {
    // `--modes "dense, dustin"`: the spaces are not part of the names
    args.modes = args.modes.iter().map(|m| m.trim().to_string()).collect();
    // `-0` is 0 (its label and JSON value would say `-0`)
    args.accept_drop_sigmas = args.accept_drop_sigmas.iter().map(|v| v + 0.0).collect();
    validate(&args)?;
    let mut inputs = vec![args.target.as_path(), args.draft.as_path()];
    inputs.extend(args.accept_trace.as_deref());
    check_json_path(args.json.as_deref(), &inputs)?;
    dustin_core::memory::set_persistent_allocations(args.persistent_alloc == OnOff::On);
    dustin_qwen::profile::set_trace(args.trace_phases);
    dustin_cli::with_backend!(args.device, |B, _dev, dev_of| run_on::<B>(
        &args,
        (0..args.tp).map(dev_of).collect()
    ))
}

/// Builds the random target and draft on `devices` (one rank each: the target split over
/// them when there are several, the draft replicated) and measures every row on every rank.
fn run_on<B: KernelOps>(args: &E2eArgs, devices: Vec<B::Device>) -> Result<(), CliError> {
    let mut tcfg = QwenConfig::from_file(&args.target)?;
    let mut dcfg = QwenConfig::from_file(&args.draft)?;
    // the depth the rows are scaled to when --target-layers keeps fewer
    let full_layers = tcfg.num_hidden_layers;
    // every --lookahead-layers setting fits the draft, before any weights are built
    for la in &args.lookahead_layers {
        la.resolve(dcfg.num_hidden_layers)
            .map_err(|e| CliError::Usage(format!("--lookahead-layers: {e}")))?;
    }
    if let Some(n) = args.target_layers {
        if n == 0 || n > tcfg.num_hidden_layers {
            return Err(CliError::Usage(format!(
                "--target-layers {n}: expected 1 ..= {}",
                tcfg.num_hidden_layers
            )));
        }
        tcfg.num_hidden_layers = n;
    }
    let extra = extra_positions(args);
    let positions = max_positions(args);
    // the largest row's KV caches (target and draft) against the free memory, before any
    // weights are built (on the CPU; Burn 0.21 reports no free device memory)
    let (max_ctx, max_batch) = (
        args.ctx.iter().copied().max().unwrap_or(0),
        args.batch.iter().copied().max().unwrap_or(0),
    );
    // an autoregressive-only run builds no draft: its weights would count in the process's
    // memory (the peak a `--modes ar` process reports) without being read
    let with_draft = args.modes.iter().any(|m| m != "ar");
    if let Some(dev) = devices.first() {
        let cfgs: &[&QwenConfig] = if with_draft {
            &[&tcfg, &dcfg]
        } else {
            &[&tcfg]
        };
        check_kv_memory::<B>(cfgs, max_batch, max_ctx + extra, dev)?;
    }
    // a 32k prompt plus the tokens generated passes Qwen2.5's 32768 positions; with random
    // weights the RoPE table is simply extended (no long-context scaling is involved)
    tcfg.max_position_embeddings = tcfg.max_position_embeddings.max(positions);
    dcfg.max_position_embeddings = dcfg.max_position_embeddings.max(positions);
    let t = Instant::now();
    let world = devices.len();
    let mut models = Vec::with_capacity(world);
    if world == 1 {
        // the same weights in every run
        B::seed(&devices[0], 0x5eed);
        models.push((
            Arc::new(Qwen2::<B>::random(&tcfg, positions, &devices[0])?),
            with_draft
                .then(|| Qwen2::<B>::random(&dcfg, positions, &devices[0]).map(Arc::new))
                .transpose()?,
        ));
    } else {
        let group = TpGroup::<B>::new(devices.clone())?;
        // one rank after the other, each from the same seed: the replicated tensors (draft,
        // embedding, LM head) are the same on every rank
        for (r, dev) in devices.iter().enumerate() {
            B::seed(dev, 0x5eed);
            let rank = TpRank::new(r, group.clone())?;
            models.push((
                Arc::new(Qwen2::<B>::random_shard(&tcfg, positions, rank)?),
                with_draft
                    .then(|| Qwen2::<B>::random(&dcfg, positions, dev).map(Arc::new))
                    .transpose()?,
            ));
        }
    }
    eprintln!(
        "e2e: target {} ({} layers{}), {}, random bf16 weights built in {:.1} s",
        args.target.display(),
        tcfg.num_hidden_layers,
        if world > 1 {
            format!(", tensor parallel over {world} ranks")
        } else {
            String::new()
        },
        if with_draft {
            format!(
                "draft {} ({} layers)",
                args.draft.display(),
                dcfg.num_hidden_layers
            )
        } else {
            "no draft (autoregressive decoding only)".into()
        },
        t.elapsed().as_secs_f64()
    );
    let cfgs = (&tcfg, &dcfg, extra, full_layers);
    if world == 1 {
        let (target, draft) = models.remove(0);
        return measure(args, cfgs, target, draft, &devices[0], true);
    }
    // SPMD: every rank runs the same modes in the same order (the all-reduces pair up); a
    // rank's error is reported after all have stopped
    let results: Vec<Result<(), CliError>> = std::thread::scope(|s| {
        let hands: Vec<_> = models
            .into_iter()
            .zip(&devices)
            .enumerate()
            .map(|(r, ((target, draft), dev))| {
                s.spawn(move || measure(args, cfgs, target, draft, dev, r == 0))
            })
            .collect();
        hands
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CliError::Usage("a tensor-parallel rank panicked".into()))
                })
            })
            .collect()
    });
    results.into_iter().collect()
}
