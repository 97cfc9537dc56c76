//! What `dustin-bench e2e` reports: its rows, the timed window they average, the phase
//! profile of `--profile` and the summary at the target's full depth.

use dustin_cli::CliError;
use dustin_spec::IterationStats;

use super::args::{E2eArgs, Elementwise, OnOff, Scoring};
use crate::jsonl::append_json;
use dustin_kernels::{AttentionKernel, EstimatorKernels, SkinnyKernel, SplitReduce, TopkKernel};

/// Phase times of one mode's profiled run (`--profile`), decode steps only, per iteration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileRow {
    /// The mode.
    pub profile: String,
    /// Context, batch.
    pub ctx: usize,
    /// See `ctx`.
    pub batch: usize,
    /// Iterations the times cover (after the warm-up).
    pub iterations: usize,
    /// `(model, phase, ms per iteration, calls per iteration)`, in the order phases ran.
    pub phases: Vec<(String, String, f64, f64)>,
}

/// One measured row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// Mode (`ar` or a selector).
    pub mode: String,
    /// Context tokens per sequence.
    pub ctx: usize,
    /// Sequences.
    pub batch: usize,
    /// Target layers measured.
    pub target_layers: usize,
    /// Tensor-parallel ranks (GPUs) the target is split over.
    pub tp: usize,
    /// Draft tokens per iteration (0 for `ar`).
    pub gamma: usize,
    /// The schedule's mean acceptance length (tokens per sequence per iteration); tokens/s
    /// uses it, since an iteration's time does not depend on how many drafts are accepted.
    pub tau: f64,
    /// Mean tokens per sequence per iteration in the timed iterations (the schedule's
    /// `floor` pattern over the timed window).
    pub tau_measured: f64,
    /// Mean seconds per iteration: draft, verify (estimation and selection included), accept,
    /// commit.
    pub draft_ms: f64,
    /// See `draft_ms`.
    pub verify_ms: f64,
    /// See `draft_ms`.
    pub accept_ms: f64,
    /// See `draft_ms`.
    pub commit_ms: f64,
    /// Sum of the four, milliseconds.
    pub iter_ms: f64,
    /// Each timed iteration's milliseconds (draft + verify + accept + commit), in order: a
    /// one-time cost (a kernel compiled inside the window) shows as one slow entry, a cost
    /// paid per iteration in every entry.
    pub iter_ms_each: Vec<f64>,
    /// Generated tokens per second over the batch.
    pub tokens_per_sec: f64,
    /// Fraction of the dense KV the verification read (selection + new tokens).
    pub kv_read: f64,
    /// Fraction of a dense read spent by the estimator.
    pub estimation_read: f64,
    /// Bytes the mode must read per iteration (see the module docs), per GPU: under tensor
    /// parallelism each rank reads 1/tp of the target's weights and KV and all of the
    /// replicated draft, in parallel with the others.
    pub floor_bytes: f64,
    /// `floor_bytes / 4.3 TB/s`, milliseconds.
    pub floor_ms: f64,
    /// `iter_ms / floor_ms`.
    pub over_floor: f64,
    /// The target's depth in its config; the `scaled_*` fields extrapolate to it when
    /// `--target-layers` measured fewer (`target_layers`), as docs/perf.md did by hand for
    /// Qwen2.5-72B's 80 layers on one GPU. Equal to `target_layers` otherwise.
    pub full_layers: usize,
    /// `draft_ms + (verify_ms + accept_ms + commit_ms) x full_layers / target_layers`,
    /// milliseconds: the draft is whole, the target's phases scale with its layers (its LM
    /// head and embedding are scaled too, a small overcount). Phase times split the GPU's
    /// work only under `--sync-phases`; without it part of one phase's work is timed in the
    /// next.
    pub scaled_iter_ms: f64,
    /// Tokens per second at `scaled_iter_ms`.
    pub scaled_tokens_per_sec: f64,
    /// The bandwidth floor (`floor_ms`) with the target's weights and KV at `full_layers`.
    pub scaled_floor_ms: f64,
    /// `scaled_iter_ms / scaled_floor_ms`.
    pub scaled_over_floor: f64,
    /// Wall seconds of the engine's prefill: the real tail of every sequence through target
    /// and draft (the random prefixes are made before and not counted).
    pub setup_secs: f64,
    /// `--elementwise`.
    pub elementwise: Elementwise,
    /// `--skinny-gemm`.
    pub skinny_gemm: OnOff,
    /// `--grouped-gemm` (with the skinny GEMM only).
    pub grouped_gemm: OnOff,
    /// `--fused-residual` (with the fused element-wise ops only).
    pub fused_residual: OnOff,
    /// `--lookahead-scoring` (`null` where the mode reads no lookahead).
    pub lookahead_scoring: Option<Scoring>,
    /// `--lookahead-layers`, written as given (`all`, `stride:2`; `null` where the mode reads
    /// no lookahead).
    pub lookahead_layers: Option<String>,
    /// `--draft-budget` (0: dense drafting, and for `ar`).
    pub draft_budget: usize,
    /// `--ragged-accept` (speculative modes).
    pub ragged_accept: OnOff,
    /// `--kv-write-kernel`.
    pub kv_write_kernel: OnOff,
    /// `--rope-kv-write` (with the fused element-wise ops and the cache-write kernel only).
    pub rope_kv_write: OnOff,
    /// `--skinny-kernel` (CUDA only; the CPU has neither).
    pub skinny_kernel: SkinnyKernel,
    /// `--ring-config` (CUDA only).
    pub ring_config: String,
    /// `--verify-kernel` (CUDA only).
    pub verify_kernel: AttentionKernel,
    /// `--score-kernel` (CUDA only).
    pub score_kernel: AttentionKernel,
    /// `--score-mass` (CUDA only).
    pub score_mass: OnOff,
    /// `--score-wide` (CUDA only).
    pub score_wide: OnOff,
    /// `--estimator-kernels` (`off` on the CPU and for modes without the `dustin` estimator).
    pub estimator_kernels: EstimatorKernels,
    /// `--topk-kernel` (`block` on the CPU and for modes that do not select).
    pub topk_kernel: TopkKernel,
    /// `--split-reduce` (`kernel` on the CPU, which has no fused GEMMs).
    pub split_reduce: SplitReduce,
    /// `--dense-waves` (2 on the CPU, which has no flash kernel).
    pub dense_waves: usize,
    /// `--batched-reuse` (`null` for modes without the `dustin` estimator, which have no
    /// one-call path).
    pub batched_reuse: Option<OnOff>,
    /// `--accept-drop-sigmas` (`null` for modes other than `dustin`).
    pub accept_drop_sigmas: Option<f64>,
    /// `--sync-phases`.
    pub sync_phases: OnOff,
    /// Which of `--rounds` this row belongs to, from 1.
    pub round: usize,
}

/// Means over the timed iterations of a run (after `warmup`, at most `iters`).
pub(crate) struct TimedWindow<'a> {
    /// The timed iterations.
    pub iterations: Vec<&'a IterationStats>,
    /// Mean milliseconds per iteration of each phase.
    pub draft_ms: f64,
    /// See `draft_ms`.
    pub verify_ms: f64,
    /// See `draft_ms`.
    pub accept_ms: f64,
    /// See `draft_ms`.
    pub commit_ms: f64,
    /// Mean tokens per sequence per iteration (accepted drafts + 1).
    pub tau_measured: f64,
}

/// The timed window of `iterations`.
///
/// # Errors
/// [`CliError::Usage`] naming `mode` when no iteration is left after the warm-up.
pub(crate) fn timed_window<'a>(
    iterations: &'a [IterationStats],
    warmup: usize,
    iters: usize,
    mode: &str,
) -> Result<TimedWindow<'a>, CliError> {
    let timed: Vec<&IterationStats> = iterations.iter().skip(warmup).take(iters).collect();
    if timed.is_empty() {
        return Err(CliError::Usage(format!(
            "mode {mode}: only {} iterations ran; raise the schedule or lower --warmup",
            iterations.len()
        )));
    }
    let ms = |f: fn(&IterationStats) -> f64| 1e3 * mean(timed.iter().map(|i| f(i)));
    Ok(TimedWindow {
        draft_ms: ms(|i| i.draft_secs),
        verify_ms: ms(|i| i.verify_secs),
        accept_ms: ms(|i| i.accept_secs),
        commit_ms: ms(|i| i.commit_secs),
        tau_measured: mean(
            timed
                .iter()
                .flat_map(|i| i.accepted.iter().map(|&a| a as f64 + 1.0)),
        ),
        iterations: timed,
    })
}

/// Mean of `xs` (0 when empty).
pub(crate) fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Prints (and appends to `--json`) the decode-phase times recorded since the warm-up, per
/// iteration.
pub(super) fn report_profile(
    args: &E2eArgs,
    mode: &str,
    ctx: usize,
    batch: usize,
    (recorded, iterations): (Vec<dustin_qwen::profile::PhaseTime>, usize),
) -> Result<(), CliError> {
    let n = iterations.max(1);
    let phases: Vec<(String, String, f64, f64)> = recorded
        .into_iter()
        .filter(|p| p.stage == "decode")
        .map(|p| {
            (
                p.model.to_string(),
                p.phase.to_string(),
                p.secs * 1e3 / n as f64,
                p.calls as f64 / n as f64,
            )
        })
        .collect();
    let total: f64 = phases.iter().map(|p| p.2).sum();
    println!("profile of {mode} (ctx {ctx}, batch {batch}, {n} iterations after the warm-up; device waited for around each phase):");
    println!("| model | phase | ms per iteration | share | calls per iteration |");
    println!("|---|---|---:|---:|---:|");
    for (model, phase, ms, calls) in &phases {
        println!(
            "| {model} | {phase} | {ms:.2} | {:.1}% | {calls:.2} |",
            100.0 * ms / total.max(f64::MIN_POSITIVE)
        );
    }
    if let Some(p) = &args.json {
        append_json(
            p,
            &ProfileRow {
                profile: mode.to_string(),
                ctx,
                batch,
                iterations: n,
                phases,
            },
        )?;
    }
    Ok(())
}

/// The rows at the target's full depth ([`Row::scaled_iter_ms`]), each with its tokens/s over
/// that of the first `ar` row of the same context, batch and round (`-` where the run had
/// none): the figure the paper's speed-up is stated in. `rows` pairs each row with its mode.
pub(super) fn print_scaled_summary(rows: &[(String, Row)]) {
    let Some((_, first)) = rows.first() else {
        return;
    };
    println!();
    println!(
        "scaled to {} target layers ({} measured): the draft as measured, the target's phases x {}/{}",
        first.full_layers, first.target_layers, first.full_layers, first.target_layers
    );
    println!("| mode | ctx | B | iter ms | tokens/s | x ar | floor ms | over floor |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (_, r) in rows {
        let ar = rows
            .iter()
            .find(|(m, a)| m == "ar" && a.ctx == r.ctx && a.batch == r.batch && a.round == r.round);
        let x_ar = ar.map_or_else(
            || "-".to_string(),
            |(_, a)| format!("{:.2}x", r.scaled_tokens_per_sec / a.scaled_tokens_per_sec),
        );
        println!(
            "| {} | {} | {} | {:.2} | {:.1} | {} | {:.2} | {:.1}x |",
            r.mode,
            r.ctx,
            r.batch,
            r.scaled_iter_ms,
            r.scaled_tokens_per_sec,
            x_ar,
            r.scaled_floor_ms,
            r.scaled_over_floor
        );
    }
}
