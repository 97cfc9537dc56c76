//! `dustin bench-e2e`: end-to-end speed of autoregressive and speculative decoding at real
//! model shapes (random weights), every mode under the same acceptance schedule.
//!
//! For each context length and batch size, each mode starts from a KV cache whose first
//! `ctx - tail` positions hold random keys and values (a real prefill of 32k tokens takes
//! seconds per sequence, `dustin bench`, and measures nothing this benchmark is about); the last
//! `tail` prompt tokens are prefilled for real through the mode's selection policy, so the
//! estimators see the prompt end as they would. Then the real engine runs
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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use burn_tensor::{Distribution, Tensor};
use clap::Args;
use dustin_core::{DenseHook, TokenId};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::{Qwen2, QwenConfig, TpGroup, TpRank};
use dustin_spec::{
    autoregressive_with_barrier, IterationStats, LookaheadConfig, LookaheadLayers,
    LookaheadScoring, ModelDrafter, ModelVerifier, PhaseBarrier, SpecConfig, SpeculativeDecoder,
};

use crate::backend::DeviceKind;
use crate::generate::{build_policy, draft_selection, FileConfig};
use crate::CliError;

/// HBM bandwidth of the H200 used for the floors, bytes/s: the figure `../shared/docs/GPU.md`
/// uses for its floors (NVIDIA's datasheet peak is 4.8 TB/s; a device-to-device copy
/// measured 4.0 TB/s counting read and write).
pub const HBM_BYTES_PER_SEC: f64 = 4.3e12;

/// Arguments of `dustin bench-e2e`.
#[derive(Debug, Args)]
pub struct E2eArgs {
    /// HF `config.json` of the target (for example Qwen2.5-7B-Instruct's).
    #[arg(long)]
    pub target: PathBuf,
    /// Keep only the first N target layers (a 72B target on one GPU); the rows state the
    /// layers measured, and a summary at the end scales them to the config's full depth
    /// (`Row::scaled_iter_ms`) with each mode's speed over autoregressive decoding's.
    #[arg(long)]
    pub target_layers: Option<usize>,
    /// HF `config.json` of the draft model (for example Qwen2.5-0.5B-Instruct's).
    #[arg(long)]
    pub draft: PathBuf,
    /// Context lengths (comma-separated), tokens of prompt per sequence.
    #[arg(long, value_delimiter = ',', default_value = "8192")]
    pub ctx: Vec<usize>,
    /// Batch sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub batch: Vec<usize>,
    /// Draft tokens per iteration.
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// Modes (comma-separated): `ar` (autoregressive, dense) or a selector of the registry
    /// for speculative decoding (`dense`, `dustin`, `streaming`, `quest`, `snapkv`, ...).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ar,dense,dustin,streaming,quest,snapkv"
    )]
    pub modes: Vec<String>,
    /// Token budget of the sparse modes.
    #[arg(long, default_value_t = 1024)]
    pub budget: usize,
    /// Mean acceptance length tau per mode (`mode=tau`, comma-separated; `default=tau` for
    /// the rest). Accepted drafts per iteration = tau - 1, at most gamma.
    #[arg(long, value_delimiter = ',', default_value = "default=2.0")]
    pub accept: Vec<String>,
    /// Iterations run first and not timed (JIT compilation, autotuning).
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Iterations timed.
    #[arg(long, default_value_t = 8)]
    pub iters: usize,
    /// Prompt tokens prefilled for real (the rest of the context is random KV). At most 16
    /// runs the prefill through the verify kernels; more runs `KernelOps::prefill_attention`
    /// (or Burn's plain attention where a selector asks for the prompt's probabilities).
    #[arg(long, default_value_t = 16)]
    pub tail: usize,
    /// Tensor-parallel ranks: the target split over this many devices (CUDA devices
    /// `0 .. tp`, NCCL all-reduce; on the CPU, ranks share the one device and sum on the host),
    /// one host thread per rank, the draft replicated on every rank. Rows are rank 0's.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Append one JSON line per row to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also time every phase of the target's and the draft's forward passes over the
    /// iterations after the warm-up (`dustin_qwen::profile`: the device is waited for around
    /// each phase, so these runs are slower; read the shares, take the speed from a run
    /// without it). Printed per mode, and one JSON line per mode (`"profile"`) with `--json`.
    #[arg(long)]
    pub profile: bool,
    /// Profile the host over each row's timed iterations: one report per row in this folder
    /// (`host-{mode}-{ctx}-b{batch}-l{target layers}[-tp{n}].txt`): each thread's CPU time
    /// next to the wall time and, in a binary built with the `host-profile` feature (xtask's
    /// GPU staging is), functions by sampled CPU time (`crate::host_profile`). Sampling costs
    /// some host time, so take speeds from a run without it.
    #[arg(long)]
    pub host_profile: Option<PathBuf>,
    /// How RMSNorm, the SwiGLU product and RoPE run in target and draft: `fused` (one kernel
    /// each where the backend has them, `Qwen2::with_fused_elementwise`; the default) or
    /// `plain` (Burn ops: 7, 10 and 7 kernels on CUDA). The same values up to rounding; the
    /// rows say which ran (`plain` on the CPU, which has no fused kernels).
    #[arg(long, value_enum, default_value_t = Elementwise::Fused)]
    pub elementwise: Elementwise,
    /// Linear layers of decoding and verification (at most 16 rows) through our split-K
    /// skinny GEMM kernel (`on`, the default, `Qwen2::with_skinny_gemm`) or Burn's matmul
    /// (`off`; rows on the CPU, which has no such kernel, say `off`).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub skinny_gemm: OnOff,
    /// With the skinny GEMM: q/k/v as one grouped GEMM and gate/up/SiLU as another
    /// (`Qwen2::with_grouped_gemm`; `on`, the default) or one skinny GEMM per projection
    /// (`off`; rows on the CPU say `off`).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub grouped_gemm: OnOff,
    /// Which kernel runs the skinny GEMMs on CUDA (`dustin_kernels::cuda::set_skinny_kernel`):
    /// `auto` (the default: one row on CUDA cores, 2-32 rows on tensor cores, 33-128 on the
    /// ring kernel), `mma` (tensor cores wherever the shape allows), `ring` (the ring kernel
    /// wherever it allows), `no-ring` (`auto` without the ring kernel: 2-48 rows on tensor
    /// cores, more on Burn's matmul, the default before 2026-12-02) or `cores` (the CUDA-core
    /// kernel up to 16 rows, Burn's matmul above: the default before 2026-12-01). No effect
    /// on the CPU.
    #[arg(long, value_enum, default_value_t = SkinnyKernel::Auto)]
    pub skinny_kernel: SkinnyKernel,
    /// The ring kernel's block shape, `COLSxKCxBUFS` (`dustin_kernels::cuda::RingConfig`:
    /// columns a block 64 or 128, rows a stage 32 or 64, stages 3 or 4). No effect on the CPU.
    #[arg(long, default_value = "128x64x3")]
    pub ring_config: String,
    /// Which kernel runs dense and sparse verification (and decoding) attention on CUDA
    /// (`dustin_kernels::cuda::set_verify_kernel`): `auto` (the default: `flash`),
    /// `flash` (scores in registers, `cp.async` double buffering) or `split` (the earlier
    /// flash-decoding kernel, scores through shared memory). No effect on the CPU.
    #[arg(long, value_enum, default_value_t = VerifyKernel::Auto)]
    pub verify_kernel: VerifyKernel,
    /// Each residual add fused with the RMSNorm after it (`on`, `Qwen2::with_fused_residual`:
    /// one `KernelOps::add_rms_norm` launch where the add and the norm take two) or not
    /// (`off`, the default). Needs `--elementwise fused`; the same values either way. A
    /// list (`off,on`) runs every mode once per setting, side by side in one process (the
    /// table's mode then says `+res` for `on`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "off")]
    pub fused_residual: Vec<OnOff>,
    /// When the draft scores its lookahead (`dustin_spec::LookaheadScoring`): `deferred`
    /// (the default: every draft step's queries against the draft cache in one call per
    /// layer after drafting) or `per-step` (each draft step scores its own rows in its pass,
    /// the default before 2026-12-01). The same signal either way. A list
    /// (`deferred,per-step`) runs every mode whose selector reads the lookahead once per
    /// setting, side by side in one process (the table's mode then says `+step` for
    /// `per-step`); the other modes run once.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "deferred")]
    pub lookahead_scoring: Vec<Scoring>,
    /// Which draft layers feed the lookahead (`dustin_spec::LookaheadLayers`): `half` (the
    /// default: the later half), `all`, `stride:S` (every S-th layer counted back from the
    /// last), `last:N` or a list of layer indices (`0,5,9`). Several settings separated by `;` (`all;stride:2`) run
    /// every mode whose selector reads the lookahead once per setting, side by side in one
    /// process (the table's mode then says `+laall`, `+lastride2`, `+lalast12`, `+la0_5_9`);
    /// the other modes run once. Checked against the draft's layer count before any weights
    /// are built.
    #[arg(long, value_delimiter = ';', default_value = "half", value_parser = parse_lookahead_layers)]
    pub lookahead_layers: Vec<LookaheadLayers>,
    /// Tokens the draft attends to per layer and KV head (`ModelDrafter::with_draft_selection`,
    /// `DraftSelection::new`: sinks and window as the selectors' defaults, the rest the top of
    /// each draft layer's own attention mass in the last proposal), or 0 (the default) for
    /// dense drafting. A list (`0,1024`) runs every
    /// speculative mode once per value, side by side in one process (the table's mode then
    /// says `+db1024`).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub draft_budget: Vec<usize>,
    /// Shift the acceptance schedule per sequence (`on`,
    /// `SpeculativeDecoder::set_forced_ragged`): the same mean tau for every sequence, but
    /// they accept at different iterations, so their cached lengths differ as in real batched
    /// decoding and the ragged cache writes are paid. `off` (the default): every sequence
    /// accepts the same count at every iteration.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub ragged_accept: OnOff,
    /// New keys and values into the caches through `KernelOps::kv_write` (`on`,
    /// `Qwen2::with_kv_write_kernel`: one launch per tensor and layer for a ragged batch) or
    /// Burn's slice-assigns (`off`). `on` is the default, as the model's on CUDA. Only ragged
    /// batches differ (`--ragged-accept on`); the same caches either way.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub kv_write_kernel: OnOff,
    /// How the `dustin` estimator folds its history and mixes it with the lookahead on CUDA
    /// (`dustin_kernels::cuda::set_estimator_kernels`): one kernel each (`on`, the default:
    /// `KernelOps::fold_rows` and `KernelOps::mix_scores`), for the mix only (`mix`), for the
    /// fold only (`fold`), or Burn ops (`off`). The same selections up to rounding. A list
    /// (`off,mix,on`) runs the modes of the `dustin` estimator (`dustin`, `history-only`)
    /// once per setting, side by side in one process (the table's mode then says `+ek`,
    /// `+ekmix` or `+ekfold`); the other modes run once, and so does every mode on the CPU
    /// (no such kernels; its rows say `off`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "on")]
    pub estimator_kernels: Vec<EstKernels>,
    /// Which kernel runs the selectors' top-k on CUDA (`dustin_kernels::cuda::set_topk_kernel`):
    /// `warp` (the default: 1024 threads per row, per-warp histograms) or `block` (256
    /// threads per row, the default before 2026-12-01). The same selections. A list
    /// (`block,warp`) runs every mode that selects (all but `ar` and `dense`) once per
    /// kernel, side by side in one process (the table's mode then says `+tkb` or `+tkw`). On
    /// the CPU every mode runs once (its rows say `block`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "warp")]
    pub topk_kernel: Vec<TopkKernel>,
    /// Where the skinny GEMMs sum their splits over `k` on CUDA
    /// (`dustin_kernels::cuda::set_split_reduce`): `kernel` (the default: a reduce kernel
    /// after the GEMM) or `fused` (the last block of each column tile sums them inside the
    /// GEMM's own launch, one launch a projection; measured 1 ms slower a 72B-shape
    /// verification). The same values either way. A list (`kernel,fused`) runs every mode once per setting, side by
    /// side in one process (the table's mode then says `+srk` for `kernel`). On the CPU
    /// every mode runs once (its rows say `kernel`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kernel")]
    pub split_reduce: Vec<SplitReduce>,
    /// Waves of resident blocks that dense attention's key splits on the CUDA flash kernel aim
    /// for (`dustin_kernels::cuda::set_dense_waves`; 2 by default): more waves, more and
    /// shorter splits. A list (`2,8`) runs every mode once per setting, side by side in one
    /// process (the table's mode then says `+dw<n>`). No effect on the CPU (its rows say 2).
    #[arg(long, value_delimiter = ',', default_values_t = [DENSE_WAVES])]
    pub dense_waves: Vec<usize>,
    /// Whether a `dustin` verification that reuses its selections re-ranks every reusing
    /// layer in one call (`on`, the default: one mix and one top-k over the layers' stacked
    /// rows, `dustin_select::SelectConfig::batched_reuse`) or each layer in its turn (`off`).
    /// The same selections. A list (`on,off`) runs the modes of the `dustin` estimator once
    /// per setting, side by side in one process (the table's mode then says `+perlayer` for
    /// `off`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "on")]
    pub batched_reuse: Vec<OnOff>,
    /// How many standard errors of a batch mean an acceptance drop must exceed before the
    /// `dustin` mode recomputes its selections early (`dustin_select::SelectConfig::
    /// accept_drop_sigmas`; `dustin`'s recommended config refreshes early below half the
    /// running mean). Default 3; 0 is the rule without the noise test; at most 100. A list
    /// (`0,3`) runs `dustin` once per value, side by side in one process (the table's mode
    /// then says `+ads0`, `+ads3`, ...); the other modes run once.
    #[arg(long, value_delimiter = ',', default_value = "3")]
    pub accept_drop_sigmas: Vec<f64>,
    /// Wait for the device at the end of each phase of every iteration (`on`:
    /// `dustin_spec::PhaseBarrier`, one device sync per phase, four per iteration), so that
    /// the draft, verify, accept and commit columns each hold their own GPU work. `off` (the
    /// default) times the phases on the host only: a phase's queued kernels can finish in the
    /// next phase's time (only the iteration total is exact), and the iteration keeps the
    /// overlap of host and device across phases that the syncs remove. Under tensor
    /// parallelism it waits for the first rank's device.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub sync_phases: OnOff,
    /// Runs every mode's rows (all its list settings, in order) this many times in turn, A B
    /// A B for two settings (at most 10; the default 1). Rows of one process are not all
    /// alike: on the H200 the second row of a process ran about 4.5 ms an iteration slower
    /// than the first, its draft included (`docs/perf/lm-head-phase-times-2026-12-02/`), so
    /// an A/B in one order measures the order too; interleaved rounds show it and let the
    /// means cancel it. With more than one round the table's mode says `#1`, `#2`, .. and each
    /// JSON row its `round`.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// The largest `--accept-drop-sigmas` value: beyond a few standard errors the early refresh
/// never fires (the drop is at most the running mean), and the value goes into row labels
/// and file names.
const MAX_DROP_SIGMAS: f64 = 100.0;

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

/// `--estimator-kernels`: which of the `dustin` estimator's steps run as one CUDA kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EstKernels {
    /// Neither (Burn ops).
    Off,
    /// The normalise-and-mix only.
    Mix,
    /// The history fold only.
    Fold,
    /// Both.
    On,
}

#[cfg(feature = "cuda")]
impl EstKernels {
    /// The kernels this setting runs.
    pub fn kernels(self) -> dustin_kernels::EstimatorKernels {
        dustin_kernels::EstimatorKernels {
            fold: matches!(self, Self::Fold | Self::On),
            mix: matches!(self, Self::Mix | Self::On),
        }
    }
}

/// `--topk-kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TopkKernel {
    /// `dustin_kernels::cuda::TopkKernel::Block`.
    Block,
    /// `dustin_kernels::cuda::TopkKernel::Warp`.
    Warp,
}

/// Whether `mode`'s selector is the `dustin` estimator (what `--estimator-kernels` changes).
fn uses_dustin_estimator(mode: &str) -> bool {
    matches!(mode, "dustin" | "history-only")
}

/// Whether `mode` selects positions by top-k (what `--topk-kernel` changes).
fn selects_top_k(mode: &str) -> bool {
    !matches!(mode, "ar" | "dense")
}

/// `--skinny-gemm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

/// `--lookahead-scoring`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scoring {
    /// `dustin_spec::LookaheadScoring::Deferred`.
    Deferred,
    /// `dustin_spec::LookaheadScoring::PerStep`.
    PerStep,
}

impl From<Scoring> for LookaheadScoring {
    fn from(s: Scoring) -> Self {
        match s {
            Scoring::Deferred => LookaheadScoring::Deferred,
            Scoring::PerStep => LookaheadScoring::PerStep,
        }
    }
}

/// `--skinny-kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkinnyKernel {
    /// One row on CUDA cores, 2-32 rows on tensor cores, 33-128 on the ring kernel.
    Auto,
    /// Tensor cores (`skinny_mma_kernel`).
    Mma,
    /// Tensor cores fed from a shared-memory ring (`skinny_ring_kernel`), every row count.
    Ring,
    /// The default before the ring kernel: as `auto` with the ring kernel off (2-48 rows on
    /// `skinny_mma_kernel`, more on Burn's matmul).
    NoRing,
    /// CUDA cores (`skinny_gemm_kernel`).
    Cores,
}

/// `--split-reduce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitReduce {
    /// Inside the GEMM's launch (`dustin_kernels::cuda::SplitReduce::Fused`).
    Fused,
    /// A reduce kernel after the GEMM (`dustin_kernels::cuda::SplitReduce::Kernel`).
    Kernel,
}

/// `--verify-kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyKernel {
    /// The kernels' own choice (`flash` for every verification).
    Auto,
    /// `flash_kernel` (verify mode) and `combine_kernel`.
    Flash,
    /// `split_kernel` and `combine_kernel`.
    Split,
}

/// `--elementwise`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Elementwise {
    /// The backend's fused kernels where it has them.
    Fused,
    /// Burn ops.
    Plain,
}

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

/// `dustin bench-e2e`.
pub fn run(mut args: E2eArgs) -> Result<(), CliError> {
    // `--modes "dense, dustin"`: the spaces are not part of the names
    args.modes = args.modes.iter().map(|m| m.trim().to_string()).collect();
    // `-0` is 0 (its label and JSON value would say `-0`)
    args.accept_drop_sigmas = args.accept_drop_sigmas.iter().map(|v| v + 0.0).collect();
    validate(&args)?;
    // ` 64 x 32 x 4` is `64x32x4` (one spelling a shape in the rows' labels and JSON)
    if let Ok(c) = dustin_kernels::RingConfig::parse(&args.ring_config) {
        args.ring_config = c.to_string();
    }
    check_json_path(args.json.as_deref())?;
    crate::with_backend!(args.device, |B, _dev, dev_of| run_on::<B>(
        &args,
        (0..args.tp).map(dev_of).collect()
    ))
}

fn validate(a: &E2eArgs) -> Result<(), CliError> {
    let bad = |m: String| Err(CliError::Usage(m));
    crate::check_gamma(a.gamma)?;
    if a.ctx.iter().any(|&c| c <= a.tail) {
        return bad(format!(
            "--ctx {:?}: every context must be longer than --tail {}",
            a.ctx, a.tail
        ));
    }
    if a.tail == 0 {
        return bad("--tail 0: at least one prompt token is prefilled for real".into());
    }
    if a.batch.contains(&0) {
        return bad("--batch: sizes must be at least 1".into());
    }
    if a.iters == 0 {
        return bad("--iters 0: nothing would be timed".into());
    }
    if let Err(e) = dustin_kernels::RingConfig::parse(&a.ring_config) {
        return bad(format!("--ring-config: {e}"));
    }
    if !(1..=MAX_ROUNDS).contains(&a.rounds) {
        return bad(format!(
            "--rounds {}: expected 1 ..= {MAX_ROUNDS}",
            a.rounds
        ));
    }
    if a.tp == 0 {
        return bad("--tp 0: expected at least one rank".into());
    }
    for m in &a.modes {
        if m != "ar" && !dustin_select::registry::names().contains(&m.as_str()) {
            return bad(format!(
                "--modes {m}: expected ar or one of {}",
                dustin_select::registry::names().join(", ")
            ));
        }
    }
    for m in &a.modes {
        accept_of(a, m)?;
    }
    check_accept_keys(a)?;
    // sizes before anything is allocated (a wrapped sum or a huge batch aborted the process)
    if a.warmup.saturating_add(a.iters) > MAX_ITERATIONS {
        return bad(format!(
            "--warmup {} + --iters {}: at most {MAX_ITERATIONS} iterations",
            a.warmup, a.iters
        ));
    }
    let positions = max_positions(a);
    if positions > MAX_TOKENS {
        return bad(format!(
            "--ctx {}: with the tokens the run decodes ({} more), at most {MAX_TOKENS} positions",
            a.ctx.iter().max().copied().unwrap_or(0),
            positions - a.ctx.iter().max().copied().unwrap_or(0)
        ));
    }
    for &c in &a.ctx {
        for &b in &a.batch {
            if b.saturating_mul(c) > MAX_TOKENS {
                return bad(format!(
                    "--batch {b} x --ctx {c}: at most {MAX_TOKENS} context tokens in all"
                ));
            }
        }
    }
    // a list flag naming a value twice would print the same row twice
    no_repeats("--modes", &a.modes)?;
    no_repeats("--ctx", &a.ctx)?;
    no_repeats("--batch", &a.batch)?;
    no_repeats("--draft-budget", &a.draft_budget)?;
    no_repeats("--fused-residual", &a.fused_residual)?;
    no_repeats("--lookahead-scoring", &a.lookahead_scoring)?;
    // by the written form (`last:1`), not the enum's debug name
    no_repeats_named("--lookahead-layers", &a.lookahead_layers, |v| v.to_string())?;
    no_repeats("--estimator-kernels", &a.estimator_kernels)?;
    no_repeats("--topk-kernel", &a.topk_kernel)?;
    no_repeats("--split-reduce", &a.split_reduce)?;
    no_repeats_named("--dense-waves", &a.dense_waves, |v| v.to_string())?;
    if let Some(w) = a.dense_waves.iter().find(|&&w| !(1..=16).contains(&w)) {
        return Err(CliError::Usage(format!(
            "--dense-waves {w}: expected 1 to 16 waves"
        )));
    }
    no_repeats("--batched-reuse", &a.batched_reuse)?;
    if let Some(bad) = a
        .accept_drop_sigmas
        .iter()
        .find(|v| !(v.is_finite() && (0.0..=MAX_DROP_SIGMAS).contains(*v)))
    {
        return Err(CliError::Usage(format!(
            "--accept-drop-sigmas {bad}: expected numbers in 0 ..= {MAX_DROP_SIGMAS} (standard \
             errors)"
        )));
    }
    no_repeats("--accept-drop-sigmas", &a.accept_drop_sigmas)?;
    if let Some(dir) = &a.host_profile {
        std::fs::create_dir_all(dir).map_err(|e| {
            CliError::Usage(format!(
                "--host-profile {}: expected a folder that exists or can be made ({e})",
                dir.display()
            ))
        })?;
    }
    // the budget is checked before any weights are built or any row measured (also for
    // `dense`: its policy is a selector built with the same config, and failed after the
    // `ar` rows had run)
    if a.modes.iter().any(|m| m != "ar") {
        dustin_select::SelectConfig::with_budget(a.budget)
            .validate()
            .map_err(|e| CliError::Usage(format!("--budget {}: {e}", a.budget)))?;
    }
    for &db in &a.draft_budget {
        draft_selection(db)?;
    }
    Ok(())
}

/// Most timed plus warm-up iterations of one row (as `bench-subspec`).
const MAX_ITERATIONS: usize = 10_000;

/// Most `--rounds`: each round repeats every row's setup (the prefill of a 32k context).
const MAX_ROUNDS: usize = 10;

/// Most positions (a context and the tokens decoded after it) and most context tokens of a
/// batch: 2^24, the `max_position_embeddings` bound of `QwenConfig` (and of `tp-check`).
const MAX_TOKENS: usize = 1 << 24;

/// Positions the models need: the longest context, the tokens decoded (every iteration
/// appends up to gamma + 1) and room for a verification; saturating (checked by `validate`).
fn max_positions(a: &E2eArgs) -> usize {
    let max_ctx = a.ctx.iter().copied().max().unwrap_or(0);
    max_ctx.saturating_add(extra_positions(a)).saturating_add(1)
}

/// Positions past the context a row may write (see [`max_positions`]).
fn extra_positions(a: &E2eArgs) -> usize {
    let max_new = a
        .warmup
        .saturating_add(a.iters)
        .saturating_add(2)
        .saturating_mul(a.gamma.saturating_add(1));
    max_new.saturating_add(a.gamma.saturating_add(2).saturating_mul(2))
}

/// `--dense-waves`'s default: the CUDA flash kernel's own (`dustin_kernels::cuda::set_dense_waves`,
/// `split_plan::FLASH_WAVES`), and what the CPU's rows report.
const DENSE_WAVES: usize = 2;

/// `--lookahead-layers` values (`LookaheadLayers`'s `FromStr`, whose error names the input).
fn parse_lookahead_layers(s: &str) -> Result<LookaheadLayers, String> {
    s.parse().map_err(|e: dustin_spec::SpecError| e.to_string())
}

/// The label suffix of a `--lookahead-layers` setting: its written form without `:` and with
/// `_` for `,` (`+lastride2`, `+la0_5_9`), so that host-profile file names stay plain.
fn lookahead_layers_label(la: &LookaheadLayers) -> String {
    format!("+la{}", la.to_string().replace(':', "").replace(',', "_"))
}

/// [`CliError::Usage`] naming `flag` and the first value it lists twice.
fn no_repeats<T: PartialEq + std::fmt::Debug>(flag: &str, vals: &[T]) -> Result<(), CliError> {
    no_repeats_named(flag, vals, |v| {
        format!("{v:?}").trim_matches('"').to_lowercase()
    })
}

/// [`no_repeats`] with the value written by `name`.
fn no_repeats_named<T: PartialEq>(
    flag: &str,
    vals: &[T],
    name: impl Fn(&T) -> String,
) -> Result<(), CliError> {
    for (i, v) in vals.iter().enumerate() {
        if vals[..i].contains(v) {
            return Err(CliError::Usage(format!(
                "{flag}: {} is listed twice (each value runs once)",
                name(v)
            )));
        }
    }
    Ok(())
}

/// Every `--accept` key is `default` or a selector's name, at most once (a misspelt mode
/// would silently take the default; `ar` always runs at 1); a selector not among `--modes`
/// is warned about.
fn check_accept_keys(a: &E2eArgs) -> Result<(), CliError> {
    let mut seen: Vec<&str> = Vec::new();
    for item in &a.accept {
        let k = item.split_once('=').map_or(item.as_str(), |(k, _)| k);
        if seen.contains(&k) {
            return Err(CliError::Usage(format!(
                "--accept {item}: {k} is given twice"
            )));
        }
        seen.push(k);
        if k == "ar" {
            return Err(CliError::Usage(format!(
                "--accept {item}: ar has no acceptance length (it decodes one token a step)"
            )));
        }
        if k == "default" || a.modes.iter().any(|m| m == k) {
            continue;
        }
        if dustin_select::registry::names().contains(&k) {
            eprintln!(
                "bench-e2e: warning: --accept {item}: {k} is not among --modes {} (unused)",
                a.modes.join(",")
            );
        } else {
            return Err(CliError::Usage(format!(
                "--accept {item}: expected default or a mode ({}), not {k}",
                dustin_select::registry::names().join(", ")
            )));
        }
    }
    Ok(())
}

/// The mean acceptance length tau of `mode` from `--accept`.
fn accept_of(a: &E2eArgs, mode: &str) -> Result<f64, CliError> {
    let mut default = None;
    let mut own = None;
    for item in &a.accept {
        let (k, v) = item.split_once('=').ok_or_else(|| {
            CliError::Usage(format!(
                "--accept {item}: expected mode=tau, e.g. dustin=2.1"
            ))
        })?;
        let tau: f64 = v
            .parse()
            .ok()
            .filter(|t: &f64| t.is_finite() && *t >= 1.0)
            .ok_or_else(|| {
                CliError::Usage(format!("--accept {item}: tau must be a number >= 1"))
            })?;
        if k == "default" {
            default = Some(tau);
        } else if k == mode {
            own = Some(tau);
        }
    }
    let tau = if mode == "ar" {
        1.0
    } else {
        own.or(default).ok_or_else(|| {
            CliError::Usage(format!(
                "--accept: no tau for mode {mode} (give {mode}=tau or default=tau)"
            ))
        })?
    };
    if tau - 1.0 > a.gamma as f64 {
        return Err(CliError::Usage(format!(
            "--accept {mode}={tau}: at most gamma + 1 = {}",
            a.gamma + 1
        )));
    }
    Ok(tau)
}

/// Bytes of the weights one forward pass reads: every layer's matrices and the LM head
/// (the embedding is only gathered from), at `bytes` per parameter.
pub fn weight_bytes_per_forward(c: &QwenConfig, bytes: f64) -> f64 {
    let h = c.hidden_size as f64;
    let layer = c.layer_matrix_weights() + 2.0 * h;
    (c.num_hidden_layers as f64 * layer + c.vocab_size as f64 * h) * bytes
}

/// KV bytes of one token over all layers of `c` (keys and values).
pub fn kv_bytes_per_token(c: &QwenConfig, bytes: f64) -> f64 {
    (c.num_hidden_layers * 2 * c.kv_heads() * c.head_dim()) as f64 * bytes
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

/// Appends `row` as one JSON line to `path` (created if missing).
///
/// # Errors
/// [`CliError::Io`] naming the file.
pub fn append_json<T: serde::Serialize>(path: &std::path::Path, row: &T) -> Result<(), CliError> {
    use std::io::Write;
    let line = serde_json::to_string(row).map_err(|e| CliError::Usage(format!("json: {e}")))?;
    let mut f = open_append(path)?;
    writeln!(f, "{line}").map_err(|source| CliError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Checks before a run that `--json PATH` can be appended to (creating it), so a bad path is
/// reported before anything is measured rather than after the first row.
///
/// # Errors
/// [`CliError::Io`] naming the path.
pub fn check_json_path(path: Option<&std::path::Path>) -> Result<(), CliError> {
    path.map_or(Ok(()), |p| open_append(p).map(drop))
}

fn open_append(path: &std::path::Path) -> Result<std::fs::File, CliError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| CliError::Io {
            path: path.display().to_string(),
            source,
        })
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
    /// `--skinny-kernel` (CUDA only; the CPU has neither).
    pub skinny_kernel: SkinnyKernel,
    /// `--ring-config` (CUDA only).
    pub ring_config: String,
    /// `--verify-kernel` (CUDA only).
    pub verify_kernel: VerifyKernel,
    /// `--estimator-kernels` (`off` on the CPU and for modes without the `dustin` estimator).
    pub estimator_kernels: EstKernels,
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
    if let Some(dev) = devices.first() {
        crate::generate::check_kv_memory::<B>(&[&tcfg, &dcfg], max_batch, max_ctx + extra, dev)?;
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
            Arc::new(Qwen2::<B>::random(&dcfg, positions, &devices[0])?),
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
                Arc::new(Qwen2::<B>::random(&dcfg, positions, dev)?),
            ));
        }
    }
    eprintln!(
        "bench-e2e: target {} ({} layers{}), draft {} ({} layers), random bf16 weights built in {:.1} s",
        args.target.display(),
        tcfg.num_hidden_layers,
        if world > 1 {
            format!(", tensor parallel over {world} ranks")
        } else {
            String::new()
        },
        args.draft.display(),
        dcfg.num_hidden_layers,
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

/// Prints (and appends to `--json`) the decode-phase times recorded since the warm-up, per
/// iteration.
fn report_profile(
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

/// Seed of the backend's generator before each row's random KV prefixes (with the context
/// and batch mixed in): arbitrary, fixed so that runs and rows are comparable.
const PREFIX_SEED: u64 = 0xd057_1e5e_ed00_0000;

/// Every (context, batch, mode) row on one rank (`report`: print and write the rows).
fn measure<B: KernelOps>(
    args: &E2eArgs,
    (tcfg, dcfg, extra, full_layers): (&QwenConfig, &QwenConfig, usize, usize),
    target: Arc<Qwen2<B>>,
    draft: Arc<Qwen2<B>>,
    dev: &B::Device,
    report: bool,
) -> Result<(), CliError> {
    // only the reporting rank records (the draft is replicated, not split: every rank's copy
    // would add to the one table)
    let (target, draft) = if args.profile && report {
        (
            Arc::new((*target).clone().with_profile(Some("target"))),
            Arc::new((*draft).clone().with_profile(Some("draft"))),
        )
    } else {
        (target, draft)
    };
    #[cfg(feature = "cuda")]
    dustin_kernels::cuda::set_skinny_kernel(match args.skinny_kernel {
        SkinnyKernel::Auto => dustin_kernels::cuda::SkinnyKernel::Auto,
        SkinnyKernel::Mma => dustin_kernels::cuda::SkinnyKernel::Mma,
        SkinnyKernel::Ring => dustin_kernels::cuda::SkinnyKernel::Ring,
        SkinnyKernel::NoRing => dustin_kernels::cuda::SkinnyKernel::NoRing,
        SkinnyKernel::Cores => dustin_kernels::cuda::SkinnyKernel::Cores,
    });
    #[cfg(feature = "cuda")]
    if let Ok(c) = dustin_kernels::cuda::RingConfig::parse(&args.ring_config) {
        dustin_kernels::cuda::set_ring_config(c);
    }
    #[cfg(feature = "cuda")]
    dustin_kernels::cuda::set_verify_kernel(match args.verify_kernel {
        VerifyKernel::Auto => dustin_kernels::cuda::AttentionKernel::Auto,
        VerifyKernel::Flash => dustin_kernels::cuda::AttentionKernel::Flash,
        VerifyKernel::Split => dustin_kernels::cuda::AttentionKernel::Split,
    });
    let (fused, skinny, grouped, kv_write) = (
        args.elementwise == Elementwise::Fused,
        args.skinny_gemm == OnOff::On,
        args.grouped_gemm == OnOff::On,
        args.kv_write_kernel == OnOff::On,
    );
    // always set: the models' own default is on where the backend has fused kernels, so
    // `plain` / `off` must be asked for explicitly
    let with = |m: &Qwen2<B>, residual: OnOff| {
        Arc::new(
            m.clone()
                .with_fused_elementwise(fused)
                .with_skinny_gemm(skinny)
                .with_grouped_gemm(grouped)
                .with_fused_residual(residual == OnOff::On)
                .with_kv_write_kernel(kv_write),
        )
    };
    // one (target, draft) pair per `--fused-residual` setting (clones share the weights)
    type Pair<B> = (OnOff, Arc<Qwen2<B>>, Arc<Qwen2<B>>);
    // (one setting where the backend has no fused kernels or they are off: the rows would
    // be the same)
    let residuals = if B::FUSED && fused {
        &args.fused_residual[..]
    } else {
        &args.fused_residual[..1]
    };
    let pairs: Vec<Pair<B>> = residuals
        .iter()
        .map(|&r| (r, with(&target, r), with(&draft, r)))
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
                    let residual = *residual;
                    // the settings in effect for this row (the CPU has neither kernel)
                    let est_kernels = if B::FUSED && uses_dustin_estimator(mode) {
                        est_kernels
                    } else {
                        EstKernels::Off
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
                    #[cfg(feature = "cuda")]
                    {
                        dustin_kernels::cuda::set_dense_waves(dense_waves);
                        dustin_kernels::cuda::set_split_reduce(match split {
                            SplitReduce::Fused => dustin_kernels::cuda::SplitReduce::Fused,
                            SplitReduce::Kernel => dustin_kernels::cuda::SplitReduce::Kernel,
                        });
                        dustin_kernels::cuda::set_estimator_kernels(est_kernels.kernels());
                        dustin_kernels::cuda::set_topk_kernel(match topk {
                            TopkKernel::Block => dustin_kernels::cuda::TopkKernel::Block,
                            TopkKernel::Warp => dustin_kernels::cuda::TopkKernel::Warp,
                        });
                    }
                    // the mode's name in the table, profiles and JSON rows: `+res` where a list of
                    // settings ran it with the fused residual in effect
                    let mut label = if pairs.len() > 1 && residual == OnOff::On && B::FUSED && fused
                    {
                        format!("{mode}+res")
                    } else {
                        mode.clone()
                    };
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
                            EstKernels::Off => "",
                            EstKernels::Mix => "+ekmix",
                            EstKernels::Fold => "+ekfold",
                            EstKernels::On => "+ek",
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
                    let tau = accept_of(args, mode)?;
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
                    let mut host: Option<crate::host_profile::HostProfile> = None;
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
                        if let Some(dir) = &args.host_profile {
                            let r = if seen == warmup + 1 {
                                crate::host_profile::HostProfile::start(dir, &host_name)
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
                        dec.set_forced_acceptance(Some(tau - 1.0))?;
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
                        tokens_per_sec: b * tau / (iter_ms / 1e3),
                        kv_read,
                        estimation_read: est,
                        floor_bytes,
                        floor_ms,
                        over_floor: iter_ms / floor_ms,
                        full_layers,
                        scaled_iter_ms,
                        scaled_tokens_per_sec: b * tau / (scaled_iter_ms / 1e3),
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
                        skinny_kernel: args.skinny_kernel,
                        ring_config: args.ring_config.clone(),
                        verify_kernel: args.verify_kernel,
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

/// The rows at the target's full depth ([`Row::scaled_iter_ms`]), each with its tokens/s over
/// that of the first `ar` row of the same context, batch and round (`-` where the run had
/// none): the figure the paper's speed-up is stated in. `rows` pairs each row with its mode.
fn print_scaled_summary(rows: &[(String, Row)]) {
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
