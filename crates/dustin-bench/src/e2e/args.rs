//! The arguments of `dustin-bench e2e` and the value sets of its kernel and engine switches.

use std::path::PathBuf;

use clap::Args;
use dustin_cli::backend::DeviceKind;
use dustin_kernels::{
    AttentionKernel, EstimatorKernels, RingConfig, SkinnyKernel, SplitReduce, TopkKernel,
};
use dustin_spec::{LookaheadLayers, LookaheadScoring};

/// Arguments of `dustin-bench e2e`.
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
    /// A recorded acceptance trace replayed instead of `--accept`'s means: the
    /// `results.jsonl` of a `dustin eval acceptance` run with the real models, whose cells
    /// keep the drafts accepted at each verification
    /// (`SpeculativeDecoder::set_forced_trace`). A speculative mode takes the traces of the
    /// cells with its selector (`dense` for dense verification) whose budget is the same
    /// fraction of their context as `--budget` is of the row's (within 1%), one after the
    /// other; `ar` runs one token a step. With `--ragged-accept on` each sequence starts at
    /// its own offset in the trace. The rows' tau is the trace's mean and their tokens/s come
    /// from the drafts accepted in the timed iterations.
    #[arg(long)]
    pub accept_trace: Option<std::path::PathBuf>,
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
    /// With `--profile`: write each phase's start and end to standard error, in order with a
    /// backend log written there (for example CubeCL's memory logger with `stderr = true` in
    /// a `cubecl.toml`), to see which phase makes an allocation (`dustin_qwen::profile::set_trace`).
    #[arg(long, requires = "profile")]
    pub trace_phases: bool,
    /// Write a line to standard error as the prefill and each iteration end (`e2e: MODE:
    /// iteration N done (warm-up)`, `(timed)` or `(after the timed ones)`), in order with a backend log written there
    /// (CubeCL's compilation or autotune logger with `stderr = true` in a `cubecl.toml`), to
    /// see which iteration first meets a kernel or a tuning.
    #[arg(long)]
    pub mark_iterations: bool,
    /// Profile the host over each row's timed iterations: one report per row in this folder
    /// (`host-{mode}-{ctx}-b{batch}-l{target layers}[-tp{n}].txt`): each thread's CPU time
    /// next to the wall time and, in a binary built with the `host-profile` feature (xtask's
    /// GPU staging is), functions by sampled CPU time (`dustin_cli::host_profile`). Sampling costs
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
    /// Which kernel runs the skinny GEMMs on CUDA (`KernelConfig::skinny_kernel`):
    /// `auto` (the default: one row on CUDA cores, 2-32 rows on tensor cores, 33-128 on the
    /// ring kernel), `mma` (tensor cores wherever the shape allows), `ring` (the ring kernel
    /// wherever it allows), `no-ring` (`auto` without the ring kernel: 2-48 rows on tensor
    /// cores, more on Burn's matmul) or `cores` (the CUDA-core kernel up to 16 rows, Burn's
    /// matmul above). No effect on the CPU.
    #[arg(long, value_enum, default_value_t = SkinnyKernel::Auto)]
    pub skinny_kernel: SkinnyKernel,
    /// The ring kernel's block shape, `COLSxKCxBUFS` (`KernelConfig::ring`: columns a block
    /// 64 or 128, rows a stage 32 or 64, stages 3 or 4). No effect on the CPU.
    #[arg(long, default_value = "128x64x3")]
    pub ring_config: RingConfig,
    /// Which kernel runs dense and sparse verification (and decoding) attention on CUDA
    /// (`KernelConfig::verify_kernel`): `auto` (the default: `flash`),
    /// `flash` (scores in registers, `cp.async` double buffering) or `split` (the
    /// flash-decoding kernel, scores through shared memory). No effect on the CPU.
    #[arg(long, value_enum, default_value_t = AttentionKernel::Auto)]
    pub verify_kernel: AttentionKernel,
    /// Which kernel computes attention scores on CUDA: Dustin's estimator heads and the
    /// draft's lookahead mass (`KernelConfig::score_kernel`): `auto` (the default: the
    /// `--verify-kernel` one), `flash` (16 rows a block) or `split` (up to 64 rows a block).
    /// No effect on the CPU.
    #[arg(long, value_enum, default_value_t = AttentionKernel::Auto)]
    pub score_kernel: AttentionKernel,
    /// Whether the flash kernel's attention scores sum the probabilities per key in the
    /// kernel (`on`, the default, `KernelConfig::score_mass`: no logits in memory) or write
    /// the logits for a reduction (`off`). No effect on the CPU.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub score_mass: OnOff,
    /// Whether those in-kernel sums take a KV head's rows 64 to a block (`on`,
    /// `KernelConfig::score_wide`) or 16 (`off`, the default). No effect on the CPU.
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub score_wide: OnOff,
    /// Each residual add fused with the RMSNorm after it (`on`, `Qwen2::with_fused_residual`:
    /// one `KernelOps::add_rms_norm` launch where the add and the norm take two) or not
    /// (`off`, the default). Needs `--elementwise fused`; the same values either way. A
    /// list (`off,on`) runs every mode once per setting, side by side in one process (the
    /// table's mode then says `+res` for `on`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "off")]
    pub fused_residual: Vec<OnOff>,
    /// When the draft scores its lookahead (`dustin_spec::LookaheadScoring`): `deferred`
    /// (the default: every draft step's queries against the draft cache in one call per
    /// layer after drafting) or `per-step` (each draft step scores its own rows in its
    /// pass). The same signal either way. A list
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
    /// Weights and KV caches in exact-size persistent device buffers (`on`, the default:
    /// `dustin_core::memory::persistent`) or in the backend's pooled pages (`off`), to
    /// measure the peak device memory of both. No effect on the CPU.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub persistent_alloc: OnOff,
    /// New keys and values into the caches through `KernelOps::kv_write` (`on`,
    /// `Qwen2::with_kv_write_kernel`: one launch per tensor and layer for a ragged batch) or
    /// Burn's slice-assigns (`off`). `on` is the default, as the model's on CUDA. Only ragged
    /// batches differ (`--ragged-accept on`); the same caches either way.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub kv_write_kernel: OnOff,
    /// Each layer's RoPE of its queries and keys and its cache write as one
    /// `KernelOps::rope_kv_write` (`on`, `Qwen2::with_rope_kv_write`: one launch on CUDA
    /// where they take three) or not (`off`, the default). Needs `--elementwise fused` and
    /// `--kv-write-kernel on`; the same values either way. A list (`off,on`) runs every mode
    /// once per setting, side by side in one process (the table's mode then says `+rkv` for
    /// `on`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "off")]
    pub rope_kv_write: Vec<OnOff>,
    /// How the `dustin` estimator folds its history and mixes it with the lookahead on CUDA
    /// (`KernelConfig::estimator_kernels`): one kernel each (`on`, the default:
    /// `KernelOps::fold_rows` and `KernelOps::mix_scores`), for the mix only (`mix`), for the
    /// fold only (`fold`), or Burn ops (`off`). The same selections up to rounding. A list
    /// (`off,mix,on`) runs the modes of the `dustin` estimator (`dustin`, `history-only`)
    /// once per setting, side by side in one process (the table's mode then says `+ek`,
    /// `+ekmix` or `+ekfold`); the other modes run once, and so does every mode on the CPU
    /// (no such kernels; its rows say `off`).
    #[arg(long, value_delimiter = ',', default_value = "on")]
    pub estimator_kernels: Vec<EstimatorKernels>,
    /// Which kernel runs the selectors' top-k on CUDA (`KernelConfig::topk_kernel`):
    /// `warp` (the default: 1024 threads per row, per-warp histograms) or `block` (256
    /// threads per row). The same selections. A list
    /// (`block,warp`) runs every mode that selects (all but `ar` and `dense`) once per
    /// kernel, side by side in one process (the table's mode then says `+tkb` or `+tkw`). On
    /// the CPU every mode runs once (its rows say `block`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "warp")]
    pub topk_kernel: Vec<TopkKernel>,
    /// Where the skinny GEMMs sum their splits over `k` on CUDA
    /// (`KernelConfig::split_reduce`): `kernel` (the default: a reduce kernel
    /// after the GEMM) or `fused` (the last block of each column tile sums them inside the
    /// GEMM's own launch, one launch a projection; measured 1 ms slower a 72B-shape
    /// verification). The same values either way. A list (`kernel,fused`) runs every mode once per setting, side by
    /// side in one process (the table's mode then says `+srk` for `kernel`). On the CPU
    /// every mode runs once (its rows say `kernel`).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kernel")]
    pub split_reduce: Vec<SplitReduce>,
    /// Waves of resident blocks that dense attention's key splits on the CUDA flash kernel aim
    /// for (`KernelConfig::dense_waves`; 2 by default): more waves, more and
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

/// `--elementwise`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Elementwise {
    /// The backend's fused kernels where it has them.
    Fused,
    /// Burn ops.
    Plain,
}

/// `--dense-waves`'s default: the CUDA flash kernel's own ([`dustin_kernels::config::DENSE_WAVES`]),
/// and what the CPU's rows report.
pub(super) const DENSE_WAVES: usize = dustin_kernels::config::DENSE_WAVES;

/// `--lookahead-layers` values (`LookaheadLayers`'s `FromStr`, whose error names the input).
fn parse_lookahead_layers(s: &str) -> Result<LookaheadLayers, String> {
    s.parse().map_err(|e: dustin_spec::SpecError| e.to_string())
}
