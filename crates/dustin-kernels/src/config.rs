//! [`KernelConfig`]: every kernel choice of the model and of the CUDA launch paths, as one
//! value.
//!
//! The model (`dustin_qwen::Qwen2::with_kernel_config`) reads the path switches
//! ([`Switch`] fields) itself and installs the whole value for its device
//! ([`KernelOps::set_kernel_config`](crate::KernelBackend::set_kernel_config)) at the start of each forward pass; the CUDA
//! launch paths read the kernel choices of the device their tensors live on
//! ([`KernelOps::kernel_config`](crate::KernelBackend::kernel_config)). Every enum parses from and prints as its
//! kebab-case name (`FromStr`, `Display`, serde), and with the `clap` feature is a
//! `clap::ValueEnum`. `docs/decisions.md`, "Kernel selection", says why the value is held
//! per device.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{KernelError, RingConfig, RING_CONFIG};

/// Implements `Display` and `FromStr` (an [`KernelError::InvalidInput`] naming the accepted
/// names otherwise) from a table of variants and their names.
macro_rules! named {
    ($t:ty, $what:literal, { $($v:ident => $n:literal),+ $(,)? }) => {
        impl $t {
            /// Every value's name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($n),+];

            /// This value's name (what `Display` prints and `FromStr` takes).
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$v => $n),+
                }
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $t {
            type Err = KernelError;

            fn from_str(s: &str) -> Result<Self, KernelError> {
                match s {
                    $($n => Ok(Self::$v),)+
                    other => Err(KernelError::invalid(
                        $what,
                        format!("one of {}", Self::NAMES.join(", ")),
                        format!("{other:?}"),
                    )),
                }
            }
        }
    };
}

/// A path switch of the model: on, off, or the backend's own default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum Switch {
    /// The backend's default (each field of [`KernelConfig`] says which).
    #[default]
    Auto,
    /// On.
    On,
    /// Off.
    Off,
}

named!(Switch, "switch", { Auto => "auto", On => "on", Off => "off" });

impl Switch {
    /// Whether the switch is on, `auto` standing for `default`.
    pub fn resolve(self, default: bool) -> bool {
        match self {
            Switch::Auto => default,
            Switch::On => true,
            Switch::Off => false,
        }
    }
}

impl From<bool> for Switch {
    fn from(on: bool) -> Self {
        if on {
            Switch::On
        } else {
            Switch::Off
        }
    }
}

impl From<Option<bool>> for Switch {
    /// `None` is [`Switch::Auto`].
    fn from(on: Option<bool>) -> Self {
        on.map_or(Switch::Auto, Switch::from)
    }
}

/// Which kernel runs an attention call on CUDA: prefill chunks
/// ([`KernelConfig::prefill_kernel`]) and verification, decoding included
/// ([`KernelConfig::verify_kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKernel {
    /// The default: each call's rule, in [`KernelConfig::prefill_kernel`] and
    /// [`KernelConfig::verify_kernel`].
    #[default]
    Auto,
    /// `flash_kernel`: FlashAttention-2 style, scores and softmax in registers, `cp.async`
    /// double buffering. Prefill: a block per 64 query rows of one head; verification: a
    /// block per 64 rows of a KV head's group and split of the context, merged by
    /// `combine_kernel`.
    Flash,
    /// `split_kernel` (flash-decoding, scores through shared memory) and `combine_kernel`:
    /// the context split across blocks, so it fills the GPU when few query rows are left.
    Split,
}

named!(AttentionKernel, "attention kernel", { Auto => "auto", Flash => "flash", Split => "split" });

impl AttentionKernel {
    /// Whether this choice is the flash kernel, `auto` deciding [`AttentionKernel::Auto`].
    pub fn flash(self, auto: impl FnOnce() -> bool) -> bool {
        match self {
            AttentionKernel::Flash => true,
            AttentionKernel::Split => false,
            AttentionKernel::Auto => auto(),
        }
    }
}

/// Which kernel runs the skinny GEMMs (decode and verify rows) on CUDA
/// ([`KernelConfig::skinny_kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum SkinnyKernel {
    /// The default: one row on the CUDA-core kernel, 2 to 32 rows on the tensor-core kernel
    /// (`skinny_mma_kernel`), `cuda::AUTO_RING_MIN_ROWS` (33) to `cuda::MMA_MAX_ROWS` (128)
    /// on the ring kernel (`skinny_ring_kernel`), each where its shape rules allow (33-48
    /// rows the ring kernel does not take go to the tensor-core kernel); the rest on Burn's
    /// matmul. The ring kernel at 33-128 rows: Qwen2.5-72B shapes (20 layers), 32k, dense
    /// speculative decoding, verification phase synced, 20.2 against 23.9 ms at B=8 (40
    /// rows) and 29.3 against 57.2 at B=16 (80 rows, where Burn's matmul ran them;
    /// `docs/perf/skinny-ring-kernel-2026-12-02/ring-shapes-e2e-ab/`). The tensor-core
    /// kernel (H200, host-timed, `docs/perf/skinny-gemm-tensor-cores-2026-12-01/`,
    /// `gemm-decode-e2e-auto-vs-cores/`) took 73.0 against 104.9 us for Qwen2.5-7B's gate
    /// projection at 8 rows, 169.8 against 310.5 us for 72B's, and 72.8 against 202.2 us at
    /// 16 rows; at one row the CUDA-core kernel was as fast or faster (7B down: 70 against
    /// 104 us).
    #[default]
    Auto,
    /// The tensor-core kernel wherever its shape rules allow, one row and up to
    /// `cuda::MMA_MAX_ROWS` rows included (benchmarks).
    Mma,
    /// The ring kernel (`skinny_ring_kernel`: the weight tile staged once per block through a
    /// `cp.async` ring, all rows in one launch) wherever its shape rules allow, from one row
    /// up to `cuda::MMA_MAX_ROWS`; elsewhere as `Mma` (benchmarks).
    Ring,
    /// As `Auto` without the ring kernel: 2 to `cuda::AUTO_MMA_MAX_ROWS` (48) rows on the
    /// tensor-core kernel and more on Burn's matmul (benchmarks that compare the two).
    NoRing,
    /// The CUDA-core kernel (`skinny_gemm_kernel`) only, up to [`crate::SKINNY_MAX_ROWS`]
    /// rows; more rows take Burn's matmul.
    Cores,
}

named!(SkinnyKernel, "skinny kernel", {
    Auto => "auto", Mma => "mma", Ring => "ring", NoRing => "no-ring", Cores => "cores"
});

/// Which kernel runs [`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions) on CUDA
/// ([`KernelConfig::topk_kernel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum TopkKernel {
    /// `topk_block_kernel`: one block of 256 threads per (KV head, sequence), one shared
    /// histogram, a position-order scan with two block barriers per 256 positions (the
    /// reference). On the H200 (docs/perf.md, "GPU kernels: verification attention,
    /// scoring, top-k") 232 us per Qwen2.5-7B layer at B=8, 32k (32 rows), 637 us for 28
    /// layers stacked.
    Block,
    /// `topk_kernel` (the default): 1024 threads per row, per-warp histograms, contiguous
    /// segments per thread in the last pass. On the H200 66 us per 7B layer at B=8, 32k and
    /// 364 us for 28 layers stacked (3.5x and 1.7x faster than `Block`); end to end (7B +
    /// 0.5B, 32k, B=8, `dustin`) 261.3 against 240.4 tokens/s, side by side in one process.
    /// Its check passes every case, negative boundary scores included
    /// (`dustin-kernels-gpu check --op topk`).
    #[default]
    Warp,
}

named!(TopkKernel, "top-k kernel", { Block => "block", Warp => "warp" });

/// Where the skinny GEMMs sum their splits over `k` ([`KernelConfig::split_reduce`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum SplitReduce {
    /// A reduce kernel after the GEMM (two launches). The default.
    #[default]
    Kernel,
    /// Inside the GEMM's own launch: the last block of each column tile to finish sums the
    /// tile's partial sums and writes the output (`split_tail`; with its bias, or SwiGLU's
    /// product), one launch a projection where two ran. The tensor-core kernels only, the
    /// tensor-core one with at most 48 rows (one launch); the rest keep the reduce kernel.
    /// Checked on the H200, but 1 ms slower a 72B-shape verification (20 layers, B=8) than
    /// [`SplitReduce::Kernel`] (`docs/perf/split-reduce-fused-2026-12-02/`), so not the
    /// default.
    Fused,
}

named!(SplitReduce, "split reduce", { Kernel => "kernel", Fused => "fused" });

/// Which of the `dustin` estimator's steps run as one backend kernel each
/// ([`KernelOps::estimator_kernels`](crate::SelectionOps::estimator_kernels), [`KernelConfig::estimator_kernels`]). Names:
/// `off` (neither), `mix`, `fold`, `on` (both); serde writes and reads the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(into = "&'static str", try_from = "String")]
pub struct EstimatorKernels {
    /// The history fold, [`KernelOps::fold_rows`](crate::SelectionOps::fold_rows).
    pub fold: bool,
    /// The normalise-and-mix, [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores).
    pub mix: bool,
}

impl EstimatorKernels {
    /// Neither step (the Burn-op path).
    pub const NONE: Self = Self {
        fold: false,
        mix: false,
    };

    /// Both steps.
    pub const ALL: Self = Self {
        fold: true,
        mix: true,
    };

    /// Every value's name: `off`, `mix`, `fold`, `on`.
    pub const NAMES: &'static [&'static str] = &["off", "mix", "fold", "on"];

    /// This value's name (what `Display` prints and `FromStr` takes).
    pub fn name(self) -> &'static str {
        match (self.fold, self.mix) {
            (false, false) => "off",
            (false, true) => "mix",
            (true, false) => "fold",
            (true, true) => "on",
        }
    }
}

impl fmt::Display for EstimatorKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for EstimatorKernels {
    type Err = KernelError;

    fn from_str(s: &str) -> Result<Self, KernelError> {
        let (fold, mix) = match s {
            "off" => (false, false),
            "mix" => (false, true),
            "fold" => (true, false),
            "on" => (true, true),
            other => {
                return Err(KernelError::invalid(
                    "estimator kernels",
                    format!("one of {}", Self::NAMES.join(", ")),
                    format!("{other:?}"),
                ))
            }
        };
        Ok(Self { fold, mix })
    }
}

impl From<EstimatorKernels> for &'static str {
    fn from(k: EstimatorKernels) -> Self {
        k.name()
    }
}

impl TryFrom<String> for EstimatorKernels {
    type Error = KernelError;

    fn try_from(s: String) -> Result<Self, KernelError> {
        s.parse()
    }
}

impl FromStr for RingConfig {
    type Err = KernelError;

    /// [`RingConfig::parse`].
    fn from_str(s: &str) -> Result<Self, KernelError> {
        RingConfig::parse(s)
    }
}

/// K/V tile buffers of the flash kernel by default: two (the next tile in flight while one
/// is used). A ring of three ran prefill at 149 TFLOP/s against 192 with two (16k prompt,
/// chunks of 2048; H200, `docs/perf/flash-everywhere-2026-11-30/ring-of-three-buffers/`).
pub const FLASH_BUFFERS: usize = 2;

/// Warps per block of the flash kernel's prefill by default (16 query rows each).
pub const PREFILL_WARPS: usize = 4;

/// Query m-tiles (16 rows each) per warp of the causal prefill by default: 0, automatic:
/// `prefill_kernel` (two a warp) with K and V staged apart for chunks of at least
/// `cuda::PREFILL2_KV_MIN_NEW` (512) new tokens, `flash_kernel` (one) for smaller chunks.
/// On the H200 (7B heads, one sequence; docs/perf.md, "GPU: prefill and time to first
/// token", raw output in `docs/perf/prefill-head-runs-gemm-many-2026-12-04/kv-staging-hoisted/`)
/// K and V staged apart ran 1.00-1.08x the ring of two buffers and 1.03-1.09x one buffer at
/// every chunk of 2048 to 32768 at 16k and 32k (334.8-340.6 TFLOP/s for a 16k prompt in one
/// chunk), and 1.17-1.19x `flash_kernel` in chunks of 512 at 16k and 32k (211.9 against
/// 179.2 at 16k).
pub const PREFILL_TILES: usize = 0;

/// Keys per compute step of `prefill_kernel` by default (each staged 64-key tile in one
/// step).
pub const PREFILL_KEY_STEP: usize = 64;

/// Whether `prefill_kernel` moves a row's reference maximum (and rescales its accumulators)
/// only where a tile's maximum passes it by more than `cuda::RESCALE_SLACK` (natural-log
/// units: every probability stays below `e^8`), by default: FlashAttention-4's conditional
/// rescaling, as the split kernel does. Without it, every tile that raises a maximum of the
/// warp rescales 128 accumulators a lane.
pub const PREFILL_LAZY_RESCALE: bool = true;

/// K tile buffers of the flash kernel's score mode by default: two, as verification. A
/// ring of three (two tiles' copies in flight, 52 KB of shared memory; scoring stages no V)
/// measured 36.0 us against 35.2 with two at 7B, B=8, 32k (ncu GPU time on the H200,
/// `docs/perf/kernel-gpu-time-2026-11-30/ktime-ring-sparse-waves/`), so it stays opt-in.
pub const SCORE_BUFFERS: usize = 2;

/// Waves of resident blocks sparse verification's splits aim for by default, in splits of
/// at least one tile.
pub const SPARSE_WAVES: usize = 2;

/// Waves of resident blocks dense verification and decoding aim for by default.
pub const DENSE_WAVES: usize = crate::split_plan::FLASH_WAVES;

/// Every kernel choice: which paths the model takes ([`Switch`] fields, read by
/// `dustin_qwen::Qwen2`) and which kernels and launch shapes the CUDA backend uses for them
/// (the rest, read by the launch paths of the device the config is installed for; the CPU
/// backend has one kernel per op and ignores them). [`KernelConfig::default`] holds the
/// defaults; values out of a field's range are brought into it by
/// [`KernelConfig::normalized`], which installing applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KernelConfig {
    /// Whether the model's attention (decoding, verification and, where
    /// [`KernelConfig::prefill_attention`] allows, prefill) runs through the backend's
    /// attention ops (`on`: fused kernels on CUDA, the host kernels of [`crate::cpu_attn`]
    /// on the CPU) or the model's own plain ops (`off`). Default `auto`:
    /// [`KernelOps::ATTENTION_KERNELS`](crate::AttentionOps::ATTENTION_KERNELS) (decoding, verification and prefill).
    pub attention: Switch,
    /// Whether RMSNorm, the MLP's SwiGLU product, RoPE and the dequantization of packed
    /// weights run as the backend's kernels (`on`) or the model's Burn ops (`off`). Default
    /// `auto`: [`KernelOps::ELEMENTWISE_KERNELS`](crate::ElementwiseOps::ELEMENTWISE_KERNELS) (packed weights through the kernel
    /// only where the backend has fused kernels, [`KernelOps::FUSED`](crate::KernelBackend::FUSED)).
    pub elementwise: Switch,
    /// Whether linear layers of at most [`KernelOps::skinny_max_rows`](crate::LinearOps::skinny_max_rows) rows run
    /// through [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear) (`on`) or Burn's matmul (`off`). Default
    /// `auto`: [`KernelOps::SKINNY_GEMM`](crate::LinearOps::SKINNY_GEMM).
    pub skinny_gemm: Switch,
    /// With the skinny GEMM on, whether a layer's q/k/v projections run as one
    /// [`KernelOps::skinny_linear3`](crate::LinearOps::skinny_linear3) and its gate/up projections with the SiLU product
    /// as one [`KernelOps::skinny_swiglu`](crate::LinearOps::skinny_swiglu) (`on`) or one skinny GEMM per projection
    /// (`off`). Default `auto`: on.
    pub grouped_gemm: Switch,
    /// Whether the dense attention of prefill chunks (more than [`crate::MAX_NEW`] new
    /// tokens) runs through [`KernelOps::prefill_attention`](crate::AttentionOps::prefill_attention) (`on`) or the model's
    /// plain ops (`off`), when the attention runs through the backend's ops at all. Default
    /// `auto`: on.
    pub prefill_attention: Switch,
    /// Whether linear layers of at least [`crate::PREFILL_GEMM_MIN_ROWS`] rows run through
    /// [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear) (`on`: cuBLAS on CUDA) or Burn's matmul (`off`).
    /// Default `auto`: [`KernelOps::FUSED`](crate::KernelBackend::FUSED).
    pub prefill_gemm: Switch,
    /// Whether linear layers over block weights (`dustin_qwen::WeightFormat::Blocks`) with
    /// more rows than [`KernelOps::skinny_max_rows`](crate::LinearOps::skinny_max_rows) (prefill chunks) run through
    /// [`KernelOps::quant_prefill_linear`](crate::LinearOps::quant_prefill_linear) (`on`: AMX tiles on the CPU,
    /// [`crate::cpu_amx`]) or decode the weight for Burn's matmul (`off`). Default `auto`:
    /// [`KernelOps::quant_prefill_available`](crate::LinearOps::quant_prefill_available).
    pub quant_prefill: Switch,
    /// Whether each residual add runs with the RMSNorm after it as one
    /// [`KernelOps::add_rms_norm`](crate::ElementwiseOps::add_rms_norm) (`on`, with the element-wise kernels on). Default
    /// `auto`: off.
    pub fused_residual: Switch,
    /// Whether new keys and values go into the cache through
    /// [`KernelOps::kv_write_pair`](crate::MemoryOps::kv_write_pair) (`on`) or Burn's slice-assigns (`off`). Default
    /// `auto`: [`KernelOps::ATTENTION_KERNELS`](crate::AttentionOps::ATTENTION_KERNELS).
    pub kv_write: Switch,
    /// Whether a layer's RoPE of its queries and keys and its cache write run as one
    /// [`KernelOps::rope_kv_write`](crate::MemoryOps::rope_kv_write) (`on`, with the
    /// element-wise kernels and `kv_write` on: one launch on CUDA where they take three).
    /// Default `auto`: off.
    pub rope_kv_write: Switch,
    /// Which kernel runs verification and decoding attention on CUDA. Default
    /// [`AttentionKernel::Auto`]: the flash kernel at every shape (at B=8, 32k it took 0.36x
    /// the split kernel's time at Qwen2.5-7B's verification, 0.34x at 72B's and 0.67x at the
    /// 0.5B draft's decoding, and end to end the 7B target with the 0.5B draft ran 1.15-1.2x
    /// faster with it; H200, raw output in
    /// `docs/perf/flash-everywhere-2026-11-30/verify-kernel-ab/`).
    pub verify_kernel: AttentionKernel,
    /// Which kernel computes attention scores (`head_subset_scores`, `head_subset_row_scores`:
    /// Dustin's estimator heads and the draft's lookahead mass, `Qwen2::key_mass`) on CUDA.
    /// [`AttentionKernel::Flash`]: `flash_kernel`'s score mode, 16 rows a block (a slot with
    /// more rows takes several blocks, each reading the keys); [`AttentionKernel::Split`]:
    /// `split_kernel`'s score mode, up to 64 rows a block (the draft's lookahead: 7 query heads
    /// of a KV head x 4-5 tokens, one block). Both write every row's logits, which a reduction
    /// turns into probabilities. Default [`AttentionKernel::Auto`]: the kernel of
    /// [`KernelConfig::verify_kernel`].
    pub score_kernel: AttentionKernel,
    /// Whether attention scores on the flash kernel sum each row's probabilities per key in
    /// the kernel (`on`: two passes over the keys, the rows' maxima and sums first, no logits
    /// in memory) or write every logit for a reduction kernel (`off`). Row scores
    /// (`head_subset_row_scores`) and the split kernel always take the logits. Default
    /// `auto`: on. The draft's lookahead scores at the pair's shapes (0.5B, 7 heads x 5
    /// tokens per KV head, 32k, B=16) took 263 us of GPU time a layer against 426 with the
    /// logits, and `dustin` decoded 1789.1 against 1715.1 tokens/s (H100, 2026-12-06,
    /// `docs/perf/gpu-score-kernels-h100-2026-12-06/mass/`).
    pub score_mass: Switch,
    /// Whether the in-kernel score sums ([`KernelConfig::score_mass`]) take a slot of more than
    /// 16 rows in blocks of 64 (`on`: each warp its own 16 rows, the keys read once per 64
    /// rows) or of 16 (`off`: the 4 warps share 16 rows, each block reading all the keys).
    /// Default `auto`: off. `on` passes `dustin-kernels-gpu check --op scores` (its "mass
    /// wide" rows, max relative error 8.3e-7 against the float64 reference) but made
    /// `dustin` slower at the pair's shapes, 32k, B=16: 1562.5 against 1798.4 tokens/s
    /// (H100, 2026-12-06, `docs/perf/gpu-draft-budget-h100-2026-12-06/score-wide/`).
    pub score_wide: Switch,
    /// Which kernel runs prefill attention on CUDA. Default [`AttentionKernel::Auto`]: the
    /// flash kernel for chunks of more than [`crate::MAX_NEW`] tokens that make at least
    /// `cuda::FLASH_MIN_BLOCKS` (132) blocks of 64 rows, else the split kernel.
    pub prefill_kernel: AttentionKernel,
    /// Shared-memory K/V tile buffers of the flash kernel (prefill and verification): 2 or
    /// 3, a ring whose next 1 or 2 tiles are copied by `cp.async` while the current one is
    /// computed on; 1, each tile staged with plain loads between two block barriers; other
    /// values are clamped to `1..=3`. Default [`FLASH_BUFFERS`] (2). The automatic prefill's
    /// `prefill_kernel` ([`KernelConfig::prefill_tiles`] 0) stages K and V apart instead; a
    /// forced `prefill_tiles` 2 takes this count, at most 2.
    pub flash_buffers: usize,
    /// K tile buffers of the flash kernel's score mode (head-subset scoring), clamped to
    /// `1..=3`. Default [`SCORE_BUFFERS`] (2).
    pub score_buffers: usize,
    /// Warps per block of the flash kernel's causal prefill: 4 (64 query rows a block) or 8
    /// (128 rows; each K/V tile staged once for twice the rows); values other than 8 select
    /// 4. Verification always runs 4. Default [`PREFILL_WARPS`] (4).
    pub prefill_warps: usize,
    /// Query m-tiles per warp of the causal prefill on the flash path: 1, `flash_kernel` (16
    /// rows a warp, [`KernelConfig::prefill_warps`] warps a block), or 2, `prefill_kernel`
    /// (32 rows a warp, 4 warps and 128 rows a block, Q in shared memory, each K/V fragment
    /// load shared by both m-tiles; [`KernelConfig::flash_buffers`]' count, at most 2), 3,
    /// `prefill_kernel` with one K and one V buffer staged apart by `cp.async`
    /// (FlashAttention-2's schedule), or 0, automatic. Values over 3 select 1. Default
    /// [`PREFILL_TILES`] (0).
    pub prefill_tiles: usize,
    /// Keys per compute step of `prefill_kernel` (`prefill_tiles` 2): 64 (a staged tile at
    /// once) or 32 (two online-softmax updates a tile, half the score registers); values
    /// other than 32 select 64. Default [`PREFILL_KEY_STEP`] (64).
    pub prefill_key_step: usize,
    /// Query heads per run of `prefill_kernel`'s grid: x runs over a run's heads fastest,
    /// then its row blocks heaviest first, y over the runs, so that the last blocks of a run
    /// to start are the lightest of all its heads rather than of one head. 0 (the default):
    /// automatic, one KV head's query heads (`group`), whose blocks share that head's K and
    /// V in L2; 1: row blocks along x, heads along y. A count that does not divide
    /// `q_heads` falls back to automatic. Measured on the H200 (7B heads, raw output in
    /// `docs/perf/prefill-head-runs-gemm-many-2026-12-04/`): runs of 7 against 1 for a 16k
    /// prompt in one chunk, 1.05-1.07x; runs of 28 within 2% of 7.
    pub prefill_head_run: usize,
    /// `prefill_kernel`'s rescaling: conditional (`true`) or wherever a maximum moves.
    /// Default [`PREFILL_LAZY_RESCALE`] (`true`).
    pub prefill_lazy_rescale: bool,
    /// Waves of resident blocks sparse verification on the flash kernel aims its splits at
    /// (at least 1). Default [`SPARSE_WAVES`] (2).
    pub sparse_waves: usize,
    /// Waves of resident blocks dense verification and decoding on the flash kernel aim
    /// their splits at (at least 1). More waves make more, shorter splits: more tiles in
    /// flight at once where a call has few (sequence, KV head) pairs, as the 0.5B draft's 16
    /// at B=8. Default [`DENSE_WAVES`] (2).
    pub dense_waves: usize,
    /// Which kernel runs the skinny GEMMs on CUDA. Default [`SkinnyKernel::Auto`].
    pub skinny_kernel: SkinnyKernel,
    /// The ring skinny GEMM's block shape (out-of-range values are brought to the nearest
    /// allowed). Default [`RING_CONFIG`].
    pub ring: RingConfig,
    /// Where the skinny GEMMs sum their splits over `k`. Default [`SplitReduce::Kernel`].
    pub split_reduce: SplitReduce,
    /// Which kernel runs the selectors' top-k on CUDA. Default [`TopkKernel::Warp`].
    pub topk_kernel: TopkKernel,
    /// Which of the `dustin` estimator's history fold and normalise-and-mix run as one
    /// kernel each on CUDA rather than as Burn ops (the CPU runs Burn ops either way).
    /// Default [`EstimatorKernels::ALL`]: on the H200 (Qwen2.5-7B + 0.5B draft, 32k, B=8,
    /// `dustin`, 12 timed iterations, side by side in one process, both orders; raw output in
    /// `docs/perf/topk-estimator-kernels-2026-12-01/`) both kernels took 42.6 ms per
    /// iteration against 49.3 for the Burn ops (kernels first), and 47.3 against 49.2 (Burn
    /// ops first).
    pub estimator_kernels: EstimatorKernels,
}

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            attention: Switch::Auto,
            elementwise: Switch::Auto,
            skinny_gemm: Switch::Auto,
            grouped_gemm: Switch::Auto,
            prefill_attention: Switch::Auto,
            prefill_gemm: Switch::Auto,
            quant_prefill: Switch::Auto,
            fused_residual: Switch::Auto,
            kv_write: Switch::Auto,
            rope_kv_write: Switch::Auto,
            verify_kernel: AttentionKernel::Auto,
            score_kernel: AttentionKernel::Auto,
            score_mass: Switch::Auto,
            score_wide: Switch::Auto,
            prefill_kernel: AttentionKernel::Auto,
            flash_buffers: FLASH_BUFFERS,
            score_buffers: SCORE_BUFFERS,
            prefill_warps: PREFILL_WARPS,
            prefill_tiles: PREFILL_TILES,
            prefill_key_step: PREFILL_KEY_STEP,
            prefill_head_run: 0,
            prefill_lazy_rescale: PREFILL_LAZY_RESCALE,
            sparse_waves: SPARSE_WAVES,
            dense_waves: DENSE_WAVES,
            skinny_kernel: SkinnyKernel::Auto,
            ring: RING_CONFIG,
            split_reduce: SplitReduce::Kernel,
            topk_kernel: TopkKernel::Warp,
            estimator_kernels: EstimatorKernels::ALL,
        }
    }
}

impl KernelConfig {
    /// This config with every numeric field in its range: `flash_buffers` and
    /// `score_buffers` clamped to `1..=3`, `prefill_warps` 4 or 8, `prefill_tiles` over 3
    /// made 1, `prefill_key_step` 32 or 64, the wave counts at least 1, and the ring shape's
    /// `cols` 64 or 128, `kc` 32 or 64, `bufs` 3 or 4 (the nearest allowed).
    pub fn normalized(mut self) -> Self {
        self.flash_buffers = self.flash_buffers.clamp(1, 3);
        self.score_buffers = self.score_buffers.clamp(1, 3);
        self.prefill_warps = if self.prefill_warps == 8 { 8 } else { 4 };
        if self.prefill_tiles > 3 {
            self.prefill_tiles = 1;
        }
        self.prefill_key_step = if self.prefill_key_step == 32 { 32 } else { 64 };
        self.sparse_waves = self.sparse_waves.max(1);
        self.dense_waves = self.dense_waves.max(1);
        let r = self.ring;
        self.ring = RingConfig {
            cols: if r.cols > 64 { 128 } else { 64 },
            kc: if r.kc > 32 { 64 } else { 32 },
            bufs: r.bufs.clamp(3, 4),
        };
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in SkinnyKernel::NAMES {
            assert_eq!(n.parse::<SkinnyKernel>().unwrap().to_string(), *n);
        }
        for n in EstimatorKernels::NAMES {
            assert_eq!(n.parse::<EstimatorKernels>().unwrap().to_string(), *n);
        }
        for n in AttentionKernel::NAMES {
            assert_eq!(n.parse::<AttentionKernel>().unwrap().to_string(), *n);
        }
        assert!("nope".parse::<TopkKernel>().is_err());
        assert_eq!(
            "no-ring".parse::<SkinnyKernel>().unwrap(),
            SkinnyKernel::NoRing
        );
    }

    #[test]
    fn defaults_are_in_range() {
        let c = KernelConfig::default();
        assert_eq!(c, c.normalized());
        assert_eq!(c.estimator_kernels, EstimatorKernels::ALL);
        assert_eq!(Switch::from(None::<bool>), Switch::Auto);
        assert!(Switch::Auto.resolve(true) && !Switch::Off.resolve(true));
    }
}
