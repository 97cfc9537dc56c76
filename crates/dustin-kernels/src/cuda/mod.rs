//! [`KernelOps`] for `burn_cubecl::CubeBackend<CudaRuntime, F, I, BT>`: CubeCL kernels.
//!
//! What the kernels take (else [`KernelError::Unsupported`]): `q`, `k`, `v` in bf16 or f16
//! (the WMMA input types; f32 accumulation), `head_dim` 64 or 128 (attention and scoring;
//! any width for Quest), contiguous last dimension with a row stride that is a multiple of 8
//! (true of the `dustin-kv` cache and its views). Query rows per block: up to 64
//! (`group * n_new` rows are split into blocks of at most 64, 16 in head-subset scoring; the
//! blocks of one split run side by side, so a key is read from HBM once and from L2 by the
//! other blocks).
//!
//! Verification, head-subset scoring and long prefill chunks run on `flash_kernel` (scores
//! in registers, `cp.async` double buffering; [`KernelConfig::verify_kernel`], [`KernelConfig::prefill_kernel`]),
//! short prefill chunks on `split_kernel` (and everything it is forced onto).
//!
//! Outputs are freshly allocated; [`set_poison_outputs`] fills them (and the partial buffers)
//! with NaN before each launch, so a checked run fails on any element a kernel leaves
//! unwritten.

mod blas;
mod kernels;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

use burn_cubecl::{
    kernel::into_contiguous,
    ops::numeric::{empty_device_contiguous_dtype, empty_device_dtype},
    tensor::CubeTensor,
    BoolElement, CubeBackend, FloatElement, IntElement,
};
use burn_tensor::{backend::Backend, DType, Int, Shape, Tensor, TensorData, TensorPrimitive};
use cubecl::cuda::{CudaDevice, CudaRuntime};
use cubecl::prelude::*;

#[cfg(doc)]
use crate::KernelOps;
use crate::{
    check_attn, check_attn_upto, check_fold, check_heads, check_kv_write, check_kv_write_pair,
    check_mix, check_packed, check_pages, check_rms_norm, check_rope, check_same, check_selection,
    check_skinny, check_top_k, AttentionOps, AttnDims, CollectiveOps, ElementwiseOps,
    EstimatorKernels, Keep, KernelBackend, KernelConfig, KernelError, LinearOps, MemoryOps,
    Positions, Result, SelectionOps, MAX_NEW, MAX_PREFILL_NEW,
};

pub use crate::config::{
    AttentionKernel, SkinnyKernel, SplitReduce, TopkKernel, FLASH_BUFFERS, PREFILL_KEY_STEP,
    PREFILL_LAZY_RESCALE, PREFILL_TILES, PREFILL_WARPS, SCORE_BUFFERS, SPARSE_WAVES,
};
pub use crate::ring::{RingConfig, RING_CONFIG};
pub use kernels::{RESCALE_SLACK, THREADS, TILE};

static POISON: AtomicBool = AtomicBool::new(false);

/// When `on`, every output and partial buffer is filled with NaN before the kernels run
/// (for correctness checks: an element a kernel does not write stays NaN).
pub fn set_poison_outputs(on: bool) {
    POISON.store(on, Ordering::Relaxed);
}

/// The CUDA backend the kernels are implemented for.
type Cube<F, I, BT> = CubeBackend<CudaRuntime, F, I, BT>;
type Ct = CubeTensor<CudaRuntime>;

/// Thread blocks per SM the split kernel's splitter aims for (about 6 resident: 800 blocks
/// on an H200's 132 SMs, the figure its plan was tuned with).
const SPLIT_BLOCKS_PER_SM: usize = 6;
/// Fewest keys per split (both kernels' split plans).
const MIN_CHUNK: usize = crate::split_plan::MIN_CHUNK;
/// Elements per vector load of K and V (16 bytes of bf16).
const NV: usize = 8;

fn float_prim<B: Backend>(t: Tensor<B, 4>) -> TensorPrimitive<B> {
    t.into_primitive()
}

fn check_dtype(name: &'static str, dt: DType) -> Result<()> {
    match dt {
        DType::BF16 | DType::F16 => Ok(()),
        other => Err(KernelError::Unsupported(format!(
            "{name} of dtype {other:?} (the CUDA kernels take bf16 or f16)"
        ))),
    }
}

/// Contiguous last dim, row stride a multiple of [`NV`] (else a contiguous copy).
fn rows_ready(t: Ct) -> Ct {
    let s = t.meta.strides();
    let ok = s[3] == 1 && s[..3].iter().all(|x| x.is_multiple_of(NV));
    if ok {
        t
    } else {
        into_contiguous(t)
    }
}

fn poison(t: &Ct) {
    if !POISON.load(Ordering::Relaxed) {
        return;
    }
    let len = t.meta.shape().num_elements();
    let dim = CubeDim::new_1d(256);
    let count = CubeCount::Static(len.div_ceil(256) as u32, 1, 1);
    kernels::fill_kernel::launch::<CudaRuntime>(
        &t.client,
        count,
        dim,
        t.clone().into_tensor_arg(),
        f32::NAN,
        len as u32,
        t.dtype.into(),
    );
}

/// The kernel choices installed per device, indexed by [`CudaDevice::index`] (devices never
/// installed for hold [`KernelConfig::default`]). A read lock and a copy per lookup: the
/// launch paths look the config up once per op, next to launches that cost microseconds.
static CONFIGS: RwLock<Vec<KernelConfig>> = RwLock::new(Vec::new());

/// The kernel choices installed for `device` ([`set_config`]; [`KernelConfig::default`]
/// where none was).
pub fn config(device: &CudaDevice) -> KernelConfig {
    CONFIGS
        .read()
        .ok()
        .and_then(|c| c.get(device.index).copied())
        .unwrap_or_default()
}

/// Installs `config` ([`KernelConfig::normalized`]) as the kernel choices of `device`: every
/// op launched on it from then on reads them. What [`KernelOps::set_kernel_config`](crate::KernelBackend::set_kernel_config) does on
/// CUDA; a config equal to the installed one takes a read lock only.
pub fn set_config(device: &CudaDevice, config: KernelConfig) {
    let config = config.normalized();
    let installed = CONFIGS
        .read()
        .ok()
        .and_then(|c| c.get(device.index).copied());
    if installed == Some(config) {
        return;
    }
    if let Ok(mut c) = CONFIGS.write() {
        if c.len() <= device.index {
            c.resize(device.index + 1, KernelConfig::default());
        }
        c[device.index] = config;
    }
}

/// Changes the kernel choices of `device` by `change` ([`config`], then [`set_config`]).
pub fn update_config(device: &CudaDevice, change: impl FnOnce(&mut KernelConfig)) {
    let mut c = config(device);
    change(&mut c);
    set_config(device, c);
}

/// The kernel choices of the device `t` lives on.
fn config_of(t: &Ct) -> KernelConfig {
    config(&t.device)
}

/// How [`launch_probe`] launches its kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchProbe {
    /// Three tensor arguments (shapes and strides uploaded per launch).
    Tensor,
    /// Three array arguments (no per-launch upload).
    Array,
}

/// Launches `a + b` into `out` `launches` times with the argument kind of `probe`, without
/// waiting for the GPU (`dustin-kernels-gpu launchcost` times it; a measuring tool for the
/// host cost of a launch). `a`, `b`, `out`: any shape, the same number of elements,
/// contiguous, one float dtype.
///
/// # Errors
/// [`KernelError::InvalidInput`] when the element counts or dtypes differ or a tensor is not
/// contiguous.
pub fn launch_probe<F: FloatElement, I: IntElement, BT: BoolElement, const D: usize>(
    a: &Tensor<Cube<F, I, BT>, D>,
    b: &Tensor<Cube<F, I, BT>, D>,
    out: &Tensor<Cube<F, I, BT>, D>,
    probe: LaunchProbe,
    launches: usize,
) -> Result<()> {
    let [a, b, out] = [a, b, out].map(|t| t.clone().into_primitive().tensor());
    let len = a.meta.shape().num_elements();
    for (name, t) in [("b", &b), ("out", &out)] {
        let found = (t.meta.shape().num_elements(), t.dtype);
        if found != (len, a.dtype) {
            return Err(KernelError::invalid(
                name,
                format!("a's element count and dtype {:?}", (len, a.dtype)),
                format!("{found:?}"),
            ));
        }
    }
    for (name, t) in [("a", &a), ("b", &b), ("out", &out)] {
        if !t.is_contiguous() {
            return Err(KernelError::invalid(
                name,
                "a contiguous tensor",
                format!("strides {:?}", t.meta.strides()),
            ));
        }
    }
    let count = elementwise_count(len)?;
    let dim = CubeDim::new_1d(kernels::ELEM_THREADS as u32);
    for _ in 0..launches {
        match probe {
            LaunchProbe::Tensor => kernels::probe_tensor_kernel::launch::<CudaRuntime>(
                &a.client,
                count.clone(),
                dim,
                a.clone().into_tensor_arg(),
                b.clone().into_tensor_arg(),
                out.clone().into_tensor_arg(),
                len as u32,
                a.dtype.into(),
            ),
            LaunchProbe::Array => kernels::probe_array_kernel::launch::<CudaRuntime>(
                &a.client,
                count.clone(),
                dim,
                a.clone().into_array_arg(),
                b.clone().into_array_arg(),
                out.clone().into_array_arg(),
                len as u32,
                a.dtype.into(),
            ),
        }
    }
    Ok(())
}

/// Blocks of `ELEM_THREADS` threads for `total` elements, one thread each.
///
/// # Errors
/// [`KernelError::InvalidInput`] when `total` does not fit the kernels' 32-bit indices.
fn elementwise_count(total: usize) -> Result<CubeCount> {
    if total > u32::MAX as usize - kernels::ELEM_THREADS {
        return Err(KernelError::invalid(
            "elements",
            format!("at most {}", u32::MAX as usize - kernels::ELEM_THREADS),
            total,
        ));
    }
    Ok(CubeCount::Static(
        total.div_ceil(kernels::ELEM_THREADS) as u32,
        1,
        1,
    ))
}

/// Whether the skinny GEMM kernel takes `x [m, k] . w`: `1 <= m <=` [`crate::SKINNY_MAX_ROWS`],
/// `k > 0`, and `w` `[k, n]` row-major (unit column stride, rows at least `n` apart) with
/// `n > 0` a multiple of 4 (a thread reads four consecutive columns).
///
/// Rows further apart than `n` are what cubecl-cuda's pitched allocation makes of a weight
/// whose row is not a multiple of 512 bytes (Qwen2.5-0.5B's `[896, 896]` and `[4864, 896]`:
/// 1792-byte rows padded to 2048). Asking for `[n, 1]` strides sent exactly those weights to
/// Burn's matmul (the H200 trace of 2026-11-30).
fn skinny_takes(m: usize, k: usize, w: &Ct) -> bool {
    let n = w.meta.shape()[1];
    let st = w.meta.strides();
    (1..=crate::SKINNY_MAX_ROWS).contains(&m)
        && k > 0
        && n > 0
        && n.is_multiple_of(4)
        && st[1] == 1
        && (k == 1 || st[0] >= n)
}

/// Most rows of `x` the tensor-core skinny GEMM takes (batch 16 x (gamma + 1) at gamma 7 is
/// 128); above 48 rows it runs one launch per 48 rows ([`AUTO_MMA_MAX_ROWS`]).
pub const MMA_MAX_ROWS: usize = 128;

/// Blocks (row blocks x query heads x sequences) from which [`AttentionKernel::Auto`] takes
/// the flash kernel for a prefill chunk: one per SM of an H200 (132). Fewer leave SMs idle,
/// where the split kernel parallelises over the context instead.
pub const FLASH_MIN_BLOCKS: usize = 132;

/// Fewest new tokens of a chunk the automatic choice ([`PREFILL_TILES`] 0) sends to
/// `prefill_kernel` (K and V staged apart); `flash_kernel` below. In chunks of 512 it was
/// faster than `flash_kernel` at 4k, 16k and 32k in every run that timed it on the H200
/// (135.1 / 195.6 / 209.1 against 105.5 / 180.4 / 189.0 TFLOP/s,
/// `docs/perf/prefill-softmax-chunks-2026-12-03/softmax-fewer-instructions/`; 133.3 / 206.2 /
/// 217.5 against 107.8 / 179.5 / 188.8, `docs/perf/prefill-head-runs-gemm-many-2026-12-04/
/// head-runs-rescale/`); smaller chunks were not timed.
pub const PREFILL2_KV_MIN_NEW: usize = 512;

/// Query heads per run of `prefill_kernel`'s grid ([`KernelConfig::prefill_head_run`]) for
/// `dims`.
fn prefill_head_run(cfg: &KernelConfig, dims: &AttnDims) -> usize {
    let forced = cfg.prefill_head_run;
    if forced > 0 && dims.q_heads.is_multiple_of(forced) {
        forced
    } else {
        dims.group()
    }
}

/// Whether verification runs on the flash kernel.
fn use_flash_verify(cfg: &KernelConfig) -> bool {
    cfg.verify_kernel.flash(|| true)
}

/// SMs assumed where the device does not say (an H200 has 132).
const DEFAULT_SMS: usize = 132;

/// Whether a prefill chunk of these dimensions runs on the flash kernel.
fn use_flash(cfg: &KernelConfig, dims: &AttnDims) -> bool {
    let blocks = dims.n_new.div_ceil(kernels::FLASH_ROWS) * dims.q_heads * dims.batch;
    cfg.prefill_kernel
        .flash(|| dims.n_new > MAX_NEW && blocks >= FLASH_MIN_BLOCKS)
}

/// Most rows [`SkinnyKernel::Auto`] sends to the tensor-core kernel: one launch (3 tiles of 16
/// rows). Above, it reads the weight once per launch, and at 128 rows (then two launches of
/// 64) it was slower than Burn's matmul for 4 of the 8 projections measured (7B gate/up: 252
/// against 144 us; docs/perf.md, 2026-12-01), so more rows keep Burn's matmul.
pub const AUTO_MMA_MAX_ROWS: usize = 16 * kernels::MMA_ROW_TILES;

/// Which kernel runs a skinny GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SkinnyPath {
    /// `skinny_gemm_kernel`: CUDA cores, up to [`crate::SKINNY_MAX_ROWS`] rows.
    Cores,
    /// `skinny_mma_kernel`: tensor cores, up to [`MMA_MAX_ROWS`] rows.
    Mma,
    /// `skinny_ring_kernel` in this block shape (read once per call, so the plan and the
    /// launch agree): tensor cores fed from a shared-memory ring, up to [`MMA_MAX_ROWS`] rows
    /// in one launch.
    Ring(RingConfig),
}

/// Whether the tensor-core kernel takes `x [m, k] . w`: bf16 or f16, `1 <= m <=`
/// [`MMA_MAX_ROWS`], `k` a multiple of 16 (whole `mma.m16n8k16` steps), `n` a multiple of 8
/// and `w` row-major with a row stride that is a multiple of 8 elements and a 16-byte aligned
/// start (each lane reads 8 columns of a row as one 16-byte vector).
fn mma_takes(kernel: SkinnyKernel, m: usize, k: usize, w: &Ct) -> bool {
    let n = w.meta.shape()[1];
    let st = w.meta.strides();
    let on = match kernel {
        SkinnyKernel::Cores => false,
        SkinnyKernel::Auto | SkinnyKernel::NoRing => (2..=AUTO_MMA_MAX_ROWS).contains(&m),
        SkinnyKernel::Mma | SkinnyKernel::Ring => true,
    };
    on && matches!(w.dtype, DType::BF16 | DType::F16)
        && (1..=MMA_MAX_ROWS).contains(&m)
        && k > 0
        && k.is_multiple_of(16)
        && n > 0
        && n.is_multiple_of(8)
        && st[1] == 1
        && st[0] >= n
        && st[0].is_multiple_of(8)
        && w.handle.offset_start.unwrap_or(0).is_multiple_of(16)
}

/// Whether the tensor-core kernel can read `x` in 8-byte vectors, directly or after
/// [`skinny_gemm_into`]'s contiguous copy: a start that is not 8-byte aligned with strides that
/// need no copy (a column slice) cannot.
fn mma_x_ok(x: &Ct) -> bool {
    let st = x.meta.strides();
    let needs_copy = !(st[1] == 1 && st[0].is_multiple_of(MMA_XVEC));
    needs_copy || x.handle.offset_start.unwrap_or(0).is_multiple_of(8)
}

/// Whether the ring kernel takes `x [m, k] . w`: as the tensor-core kernel
/// ([`mma_takes`]), and `k` a multiple of the ring's stage ([`RingConfig::kc`]), `x` with a
/// unit column stride, a row stride that is a multiple of 8 and a 16-byte aligned start
/// (each copy moves 16 bytes; otherwise a contiguous copy of `x` is made first, which is).
fn ring_takes(kernel: SkinnyKernel, m: usize, k: usize, x: &Ct, w: &Ct, rc: RingConfig) -> bool {
    let on = match kernel {
        SkinnyKernel::Ring => true,
        SkinnyKernel::Auto => (AUTO_RING_MIN_ROWS..=MMA_MAX_ROWS).contains(&m),
        SkinnyKernel::Cores | SkinnyKernel::Mma | SkinnyKernel::NoRing => false,
    };
    let xs = x.meta.strides();
    let x_ok = !(xs[1] == 1 && xs[0].is_multiple_of(8))
        || x.handle.offset_start.unwrap_or(0).is_multiple_of(16);
    on && x_ok
        && w.dtype == x.dtype
        && matches!(w.dtype, DType::BF16 | DType::F16)
        && (1..=MMA_MAX_ROWS).contains(&m)
        && k.is_multiple_of(rc.kc)
        && k > 0
        && w.meta.shape()[1] > 0
        && w.meta.shape()[1].is_multiple_of(8)
        && w.meta.strides()[1] == 1
        && w.meta.strides()[0] >= w.meta.shape()[1]
        && w.meta.strides()[0].is_multiple_of(8)
        && w.handle.offset_start.unwrap_or(0).is_multiple_of(16)
}

/// Arrival counts of the fused split reduction: one `u32` per column tile of a launch, zero
/// between launches (the last block of a tile sets its count back to zero).
const SPLIT_COUNTERS: usize = 8192;

thread_local! {
    /// One count buffer per (device, stream) used from this thread: launches of one stream
    /// run one after another, so no two of them use a count at the same time.
    static COUNTERS: std::cell::RefCell<Vec<(CountersKey, Ct)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The device and stream a count buffer belongs to (compared without allocating: this runs
/// on every skinny GEMM launch).
type CountersKey = (CudaDevice, cubecl::stream_id::StreamId);

/// The zeroed count buffer ([`SPLIT_COUNTERS`] entries) of `t`'s device and the current
/// stream, made on first use.
fn split_counters(t: &Ct) -> Ct {
    let key: CountersKey = (t.device.clone(), cubecl::stream_id::StreamId::current());
    if let Some(c) = COUNTERS.with(|c| {
        c.borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, c)| c.clone())
    }) {
        return c;
    }
    let handle = t.client.create(cubecl::bytes::Bytes::from_bytes_vec(vec![
        0u8;
        4 * SPLIT_COUNTERS
    ]));
    let c = CubeTensor::new_contiguous(
        t.client.clone(),
        t.device.clone(),
        Shape::from(vec![SPLIT_COUNTERS]),
        handle,
        DType::U32,
    );
    COUNTERS.with(|cs| cs.borrow_mut().push((key, c.clone())));
    c
}

/// Whether a skinny GEMM on `path` of `m` rows over weights of `ns` columns finishes its
/// split reduction in its own launch ([`SplitReduce::Fused`]): the tensor-core kernels in
/// one launch, with a count for every column tile of the grid.
fn fuses_split(x: &Ct, path: SkinnyPath, m: usize, ns: &[usize]) -> bool {
    let tiles = |cols: usize| ns.iter().map(|n| n.div_ceil(cols)).sum::<usize>();
    config_of(x).split_reduce == SplitReduce::Fused
        && match path {
            SkinnyPath::Cores => false,
            SkinnyPath::Mma => {
                m <= 16 * kernels::MMA_ROW_TILES && tiles(kernels::MMA_TILE) <= SPLIT_COUNTERS
            }
            SkinnyPath::Ring(rc) => tiles(rc.cols) <= SPLIT_COUNTERS,
        }
}

/// How a skinny GEMM launch finishes ([`skinny_gemm_into`]): `mode` is one of
/// `kernels::SPLIT_PARTIALS` (the partial sums only, for a reduce kernel),
/// `kernels::SPLIT_OUTPUTS` (`outs[i]` `[m, n_i]` contiguous, plus `biases[i]` where bit `i`
/// of `bias_mask` is set) or `kernels::SPLIT_SWIGLU` (`outs[0]` `[m, n]`). Unused slots hold
/// any tensor of the dtype (never read or written).
struct Finish<'a> {
    mode: u32,
    outs: [&'a Ct; 3],
    biases: [&'a Ct; 3],
    bias_mask: u32,
    counters: Ct,
}

impl<'a> Finish<'a> {
    /// A finish in `mode`; `x` is the GEMM's input (its device and stream pick the count
    /// buffer).
    fn new(x: &Ct, mode: u32, outs: [&'a Ct; 3], biases: [&'a Ct; 3], bias_mask: u32) -> Self {
        Self {
            mode,
            outs,
            biases,
            bias_mask,
            counters: split_counters(x),
        }
    }

    /// The partial sums only; `x` fills the unused bindings.
    fn partials(x: &'a Ct) -> Self {
        Self::new(x, kernels::SPLIT_PARTIALS, [x; 3], [x; 3], 0)
    }

    /// The outputs `outs` with `biases[i]` added where bit `i` of `bias_mask` is set.
    fn outputs(x: &Ct, outs: [&'a Ct; 3], biases: [&'a Ct; 3], bias_mask: u32) -> Self {
        Self::new(x, kernels::SPLIT_OUTPUTS, outs, biases, bias_mask)
    }

    /// SwiGLU's product into `out`; `x` fills the unused bindings.
    fn swiglu(x: &'a Ct, out: &'a Ct) -> Self {
        Self::new(x, kernels::SPLIT_SWIGLU, [out; 3], [x; 3], 0)
    }
}

/// Fewest rows [`SkinnyKernel::Auto`] sends to the ring kernel (`skinny_ring_kernel`); from
/// here to [`MMA_MAX_ROWS`] it takes them all in one launch, where the tensor-core kernel
/// re-reads the weight once per 48 rows and keeps three tiles' loads in registers.
pub const AUTO_RING_MIN_ROWS: usize = 33;

/// The kernel for `x [m, k]` times every weight of `ws`, or `None` (Burn's matmul).
fn skinny_path(m: usize, k: usize, x: &Ct, ws: &[&Ct]) -> Option<SkinnyPath> {
    let cfg = config_of(x);
    let (kernel, rc) = (cfg.skinny_kernel, cfg.ring);
    if ws.iter().all(|w| ring_takes(kernel, m, k, x, w, rc)) {
        Some(SkinnyPath::Ring(rc))
    } else if mma_x_ok(x)
        && ws
            .iter()
            .all(|w| w.dtype == x.dtype && mma_takes(kernel, m, k, w))
    {
        Some(SkinnyPath::Mma)
    } else if ws.iter().all(|w| skinny_takes(m, k, w)) {
        Some(SkinnyPath::Cores)
    } else {
        None
    }
}

/// Rows of `w` per split and the number of splits for skinny GEMMs of `m` rows and inner size
/// `k` over weights of `ns` columns sharing one partial-sum buffer.
///
/// [`SkinnyPath::Cores`]: about 4 blocks per SM of the H200 (132 SMs) over all their
/// 128-column tiles; each split stages at most `SKINNY_CHUNK` rows of `x`, a
/// multiple of the 8 warps.
///
/// [`SkinnyPath::Mma`]: over the 64-column tiles, the split count (rows a multiple of 16)
/// whose blocks fill whole waves of `sms` SMs best ([`mma_blocks_per_sm`] each), but no more
/// splits than keep the partial sums (written, then read by the reduce: `2 splits m n` f32)
/// under a quarter of the weight read (`k n` bf16), i.e. `splits <= k / (16 m)`, nor than
/// leave a split under [`MMA_MIN_SPLIT_ROWS`] rows; the fewest splits that fill 95% of
/// their waves.
fn skinny_plan(k: usize, m: usize, ns: &[usize], path: SkinnyPath, sms: usize) -> (usize, usize) {
    match path {
        SkinnyPath::Cores => {
            let tiles: usize = ns.iter().map(|n| n.div_ceil(kernels::SKINNY_TILE)).sum();
            let want = (4 * 132usize)
                .div_ceil(tiles.max(1))
                .clamp(1, k.div_ceil(8));
            let rows = k
                .div_ceil(want)
                .next_multiple_of(8)
                .min(kernels::SKINNY_CHUNK);
            (rows, k.div_ceil(rows))
        }
        SkinnyPath::Mma => {
            let tiles: usize = ns
                .iter()
                .map(|n| n.div_ceil(kernels::MMA_TILE))
                .sum::<usize>()
                .max(1);
            let mt = m.clamp(1, 16 * kernels::MMA_ROW_TILES).div_ceil(16);
            let slots = mma_blocks_per_sm(mt) * sms.max(1);
            crate::split_plan::mma_splits(k, m, tiles, slots)
        }
        SkinnyPath::Ring(rc) => {
            let tiles: usize = ns.iter().map(|n| n.div_ceil(rc.cols)).sum::<usize>().max(1);
            let mt = m.clamp(1, 16 * kernels::RING_MAX_TILES).div_ceil(16);
            let slots = ring_blocks_per_sm(rc, mt) * sms.max(1);
            crate::split_plan::splits_in_units(k, m, tiles, slots, rc.kc)
        }
    }
}

/// Blocks of the ring skinny GEMM resident on one SM, as the split plan counts them: as many
/// as its shared memory allows ([`RingConfig::shared_bytes`] of the H200's 227 KB a block can
/// use of an SM's 228), at most 4 (registers: about 100 a thread, 128 threads).
fn ring_blocks_per_sm(rc: RingConfig, mt: usize) -> usize {
    (227 * 1024 / rc.shared_bytes(mt).max(1)).clamp(1, 4)
}

/// Blocks of the tensor-core skinny GEMM resident on one SM for `mt` 16-row tiles of `x`:
/// registers decide it (the accumulators are `32 mt` a thread, the double-buffered loads
/// 40-80 more; 65,536 registers an SM, 128 threads a block).
fn mma_blocks_per_sm(mt: usize) -> usize {
    if mt <= 2 {
        3
    } else {
        2
    }
}

/// Launches the skinny GEMMs of `x [m, k]` and each `(w [k, n], col_off)` of `ws` (one to
/// three weights) into columns `col_off .. col_off + n` of `part [splits, m, ldp]`: on the
/// tensor cores one launch per 48 rows for all of them, on the CUDA cores one per weight.
#[allow(clippy::too_many_arguments)]
fn skinny_gemm_into(
    xp: &Ct,
    ws: &[(Ct, usize)],
    part: &Ct,
    k: usize,
    ldp: usize,
    rows: usize,
    splits: usize,
    path: SkinnyPath,
    fin: &Finish<'_>,
) {
    let m = xp.meta.shape()[0];
    match path {
        SkinnyPath::Cores => {
            let st = xp.meta.strides();
            for (w, col_off) in ws {
                let n = w.meta.shape()[1];
                kernels::skinny_gemm_kernel::launch::<CudaRuntime>(
                    &xp.client,
                    CubeCount::Static(n.div_ceil(kernels::SKINNY_TILE) as u32, splits as u32, 1),
                    CubeDim::new_1d(256),
                    xp.clone().into_array_arg(),
                    w.clone().into_array_arg(),
                    part.clone().into_array_arg(),
                    st[0] as u32,
                    st[1] as u32,
                    w.meta.strides()[0] as u32,
                    k as u32,
                    n as u32,
                    rows as u32,
                    ldp as u32,
                    *col_off as u32,
                    m,
                    xp.dtype.into(),
                )
            }
        }
        SkinnyPath::Ring(rc) => {
            // `x` in 16-byte vectors
            let (xv, ldx) = x_in_vectors(xp, 8);
            let mt = m.clamp(1, 16 * kernels::RING_MAX_TILES).div_ceil(16);
            for chunk in ws.chunks(3) {
                let sl = WeightSlots::of(chunk, rc.cols);
                kernels::skinny_ring_kernel::launch::<CudaRuntime>(
                    &xp.client,
                    CubeCount::Static(sl.blocks as u32, splits as u32, 1),
                    CubeDim::new_1d(kernels::RING_THREADS as u32),
                    MMA_VEC,
                    xv.clone().into_array_arg(),
                    sl.w[0].clone().into_array_arg(),
                    sl.w[1].clone().into_array_arg(),
                    sl.w[2].clone().into_array_arg(),
                    part.clone().into_array_arg(),
                    fin.counters.clone().into_array_arg(),
                    fin.outs[0].clone().into_array_arg(),
                    fin.outs[1].clone().into_array_arg(),
                    fin.outs[2].clone().into_array_arg(),
                    fin.biases[0].clone().into_array_arg(),
                    fin.biases[1].clone().into_array_arg(),
                    fin.biases[2].clone().into_array_arg(),
                    fin.bias_mask,
                    m as u32,
                    k as u32,
                    ldx as u32,
                    rows as u32,
                    ldp as u32,
                    sl.n[0],
                    sl.n[1],
                    sl.n[2],
                    sl.ldw[0],
                    sl.ldw[1],
                    sl.ldw[2],
                    sl.col_off[0],
                    sl.col_off[1],
                    sl.col_off[2],
                    sl.first_tile[0],
                    sl.first_tile[1],
                    sl.count,
                    mt,
                    rc.cols,
                    rc.kc,
                    rc.bufs,
                    fin.mode,
                    xp.dtype.into(),
                )
            }
        }
        SkinnyPath::Mma => {
            // `x` in 8-byte vectors (a pitched row is a multiple of 4 apart; `skinny_path`
            // took this path only if an uncopied `x` starts 8-byte aligned)
            let (xv, ldx) = x_in_vectors(xp, MMA_XVEC);
            for chunk in ws.chunks(3) {
                let sl = WeightSlots::of(chunk, kernels::MMA_TILE);
                // one launch per 48 rows of `x` (3 m-tiles: 96 accumulator registers a thread)
                let group = 16 * kernels::MMA_ROW_TILES;
                // the fused reduction sums whole tiles: one launch ([`fuses_split`])
                debug_assert!(fin.mode == kernels::SPLIT_PARTIALS || m <= group);
                for r0 in (0..m).step_by(group) {
                    let mt = (m - r0).min(group).div_ceil(16);
                    let (unroll, db) = mma_unroll(mt);
                    kernels::skinny_mma_kernel::launch::<CudaRuntime>(
                        &xp.client,
                        CubeCount::Static(sl.blocks as u32, splits as u32, 1),
                        CubeDim::new_1d((32 * kernels::MMA_WARPS) as u32),
                        MMA_XVEC,
                        MMA_VEC,
                        xv.clone().into_array_arg(),
                        sl.w[0].clone().into_array_arg(),
                        sl.w[1].clone().into_array_arg(),
                        sl.w[2].clone().into_array_arg(),
                        part.clone().into_array_arg(),
                        fin.counters.clone().into_array_arg(),
                        fin.outs[0].clone().into_array_arg(),
                        fin.outs[1].clone().into_array_arg(),
                        fin.outs[2].clone().into_array_arg(),
                        fin.biases[0].clone().into_array_arg(),
                        fin.biases[1].clone().into_array_arg(),
                        fin.biases[2].clone().into_array_arg(),
                        fin.bias_mask,
                        m as u32,
                        r0 as u32,
                        k as u32,
                        ldx as u32,
                        rows as u32,
                        ldp as u32,
                        sl.n[0],
                        sl.n[1],
                        sl.n[2],
                        sl.ldw[0],
                        sl.ldw[1],
                        sl.ldw[2],
                        sl.col_off[0],
                        sl.col_off[1],
                        sl.col_off[2],
                        sl.first_tile[0],
                        sl.first_tile[1],
                        sl.count,
                        mt,
                        unroll,
                        db,
                        fin.mode,
                        xp.dtype.into(),
                    )
                }
            }
        }
    }
}

/// `x` with a unit column stride and rows a multiple of `vec` elements apart (itself when it
/// is so, else a contiguous copy: a fresh allocation, so aligned), and its row stride: what
/// the tensor-core kernels read in vectors of `vec`.
fn x_in_vectors(x: &Ct, vec: usize) -> (Ct, usize) {
    let st = x.meta.strides();
    let xv = if st[1] == 1 && st[0].is_multiple_of(vec) {
        x.clone()
    } else {
        burn_cubecl::kernel::into_contiguous(x.clone())
    };
    let ldx = xv.meta.strides()[0];
    (xv, ldx)
}

/// The three weight slots of one tensor-core launch (`skinny_mma_kernel`,
/// `skinny_ring_kernel`) over one to three `(w, col_off)`: unused slots repeat the last weight
/// (never read); each weight's column count, row stride and column offset in the partial
/// sums, the first column tile (of `tile` columns) of weights 1 and 2 in the grid, and the
/// grid's column tiles in all.
struct WeightSlots<'a> {
    w: [&'a Ct; 3],
    n: [u32; 3],
    ldw: [u32; 3],
    col_off: [u32; 3],
    first_tile: [u32; 2],
    blocks: usize,
    count: usize,
}

impl<'a> WeightSlots<'a> {
    fn of(chunk: &'a [(Ct, usize)], tile: usize) -> Self {
        let pick = |i: usize| &chunk[i.min(chunk.len() - 1)];
        let tiles = |i: usize| {
            if i < chunk.len() {
                pick(i).0.meta.shape()[1].div_ceil(tile)
            } else {
                0
            }
        };
        let (t0, t1, t2) = (tiles(0), tiles(1), tiles(2));
        Self {
            w: [&pick(0).0, &pick(1).0, &pick(2).0],
            n: [0, 1, 2].map(|i| pick(i).0.meta.shape()[1] as u32),
            ldw: [0, 1, 2].map(|i| pick(i).0.meta.strides()[0] as u32),
            col_off: [0, 1, 2].map(|i| pick(i).1 as u32),
            first_tile: [t0 as u32, (t0 + t1) as u32],
            blocks: t0 + t1 + t2,
            count: chunk.len(),
        }
    }
}

/// `t` as a contiguous tensor (itself when it is one): the reduce kernels index biases flat.
fn contiguous(t: Ct) -> Ct {
    if t.is_contiguous() {
        t
    } else {
        into_contiguous(t)
    }
}

/// Elements of `x` per load of the tensor-core skinny GEMM: 4 bf16, 8 bytes (a lane's four
/// k-slots of a step).
const MMA_XVEC: usize = 4;

/// Elements of `w` per load of the tensor-core skinny GEMM: 8 bf16, 16 bytes.
const MMA_VEC: usize = 8;

/// Steps (16 rows of `w`) a warp of the tensor-core skinny GEMM loads before it multiplies,
/// and whether those loads are double-buffered: for one or two m-tiles (accumulators of
/// 32-64 registers) 2 steps, double-buffered (8 16-byte loads a lane in flight while the
/// previous 2 multiply; 7B gate/up at 8 rows: 76 to 45 us of GPU time, ncu 2026-12-01); for
/// three, 2 steps loaded then multiplied (double-buffering 1 step measured 91 us
/// against 70 at 40 rows: the registers allow no more).
fn mma_unroll(mt: usize) -> (usize, bool) {
    if mt <= 2 {
        (2, true)
    } else {
        (2, false)
    }
}

/// An output tensor on `t`'s device, contiguous (row-major, no padding) and poisoned.
///
/// Contiguous on purpose: cubecl-cuda 0.10's default allocation is pitched (each row padded to
/// a multiple of up to 256 bytes, `PitchedMemoryLayoutPolicy`), and the element-wise kernels
/// write `out[i]` at the flat index. A pitched output passed them when a row filled whole
/// 256-byte lines and was wrong otherwise (kernel-check on the H200, 2026-11-30: the
/// dequantization of 37, 70, 300 and 33 columns).
fn empty(t: &Ct, shape: Vec<usize>, dtype: DType) -> Ct {
    let out = empty_device_contiguous_dtype(
        t.client.clone(),
        t.device.clone(),
        Shape::from(shape),
        dtype,
    );
    poison(&out);
    out
}

/// Small integer tables (lengths, head tables, counts) uploaded once per distinct content and
/// device: a decode step calls every layer with the same lengths, and a host-to-device copy
/// per call costs more than the kernels at small sizes. At most [`INT_CACHE`] entries (FIFO);
/// the kernels only read these tensors.
const INT_CACHE: usize = 64;

type IntKey = (Vec<i64>, Vec<usize>, String);

thread_local! {
    static INTS: std::cell::RefCell<std::collections::VecDeque<(IntKey, Ct)>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

fn int_tensor<F: FloatElement, I: IntElement, BT: BoolElement, const D: usize>(
    vals: Vec<i64>,
    shape: [usize; D],
    device: &<Cube<F, I, BT> as burn_tensor::backend::BackendTypes>::Device,
) -> Ct {
    let key: IntKey = (vals, shape.to_vec(), format!("{device:?}/{:?}", I::dtype()));
    if let Some(t) = INTS.with(|c| {
        c.borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, t)| t.clone())
    }) {
        return t;
    }
    let t: Ct =
        Tensor::<Cube<F, I, BT>, D, Int>::from_data(TensorData::new(key.0.clone(), shape), device)
            .into_primitive();
    INTS.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= INT_CACHE {
            c.pop_front();
        }
        c.push_back((key, t.clone()));
    });
    t
}

fn ctx_tensor<F: FloatElement, I: IntElement, BT: BoolElement>(
    ctx_lens: &[usize],
    device: &<Cube<F, I, BT> as burn_tensor::backend::BackendTypes>::Device,
) -> Ct {
    let v = ctx_lens.iter().map(|&l| l as i64).collect();
    int_tensor::<F, I, BT, 1>(v, [ctx_lens.len()], device)
}

/// Slot table `[slots, 2 + max_heads]`: KV head, head count, query heads.
fn slot_table(slots: &[(usize, Vec<usize>)]) -> (Vec<i64>, [usize; 2]) {
    let w = 2 + slots.iter().map(|s| s.1.len()).max().unwrap_or(0);
    let mut t = vec![0i64; slots.len() * w];
    for (i, (kv, hs)) in slots.iter().enumerate() {
        t[i * w] = *kv as i64;
        t[i * w + 1] = hs.len() as i64;
        for (j, &h) in hs.iter().enumerate() {
            t[i * w + 2 + j] = h as i64;
        }
    }
    (t, [slots.len(), w])
}

/// Launch geometry of the split kernel.
#[derive(Debug, Clone, Copy)]
struct Plan {
    mt: usize,
    rowblocks: usize,
    splits: usize,
    chunk: usize,
}

/// The split kernel's plan for `rows` rows per slot over `max_keys` keys on `sms` SMs.
fn plan(batch: usize, slots: usize, rows: usize, max_keys: usize, sms: usize) -> Plan {
    let tiles = rows.div_ceil(16).max(1);
    let mt = tiles.min(4);
    let rowblocks = tiles.div_ceil(mt);
    let per = batch * slots * rowblocks;
    let want = (SPLIT_BLOCKS_PER_SM * sms.max(1))
        .div_ceil(per.max(1))
        .max(1);
    let most = max_keys.div_ceil(MIN_CHUNK).max(1);
    let splits = want.min(most);
    let chunk = max_keys.div_ceil(splits).div_ceil(TILE).max(1) * TILE;
    let splits = max_keys.div_ceil(chunk).max(1);
    Plan {
        mt,
        rowblocks,
        splits,
        chunk,
    }
}

/// Everything the split kernel reads for one call.
struct SplitArgs {
    q: Ct,
    k: Ct,
    v: Ct,
    ctx: Ct,
    table: Ct,
    idx: Ct,
    counts: Ct,
    slots: usize,
    max_rows: usize,
    max_keys: usize,
    n_new: usize,
    head_dim: usize,
    scale: f32,
    sparse: bool,
    score: bool,
}

/// Partial results of the split kernel.
struct Partials {
    pm: Ct,
    pl: Ct,
    pacc: Ct,
    logits: Ct,
    plan: Plan,
    rpad: usize,
}

fn run_split(a: SplitArgs, batch: usize) -> Partials {
    let plan = plan(batch, a.slots, a.max_rows, a.max_keys, sm_count(&a.q));
    let rpad = plan.rowblocks * plan.mt * 16;
    let d = a.head_dim;
    let pm = empty(&a.q, vec![batch, a.slots, plan.splits, rpad], DType::F32);
    let pl = empty(&a.q, vec![batch, a.slots, plan.splits, rpad], DType::F32);
    let pacc = if a.score {
        empty(&a.q, vec![1], DType::F32)
    } else {
        empty(&a.q, vec![batch, a.slots, plan.splits, rpad, d], DType::F32)
    };
    let lmax = if a.score { a.max_keys } else { 1 };
    let logits = if a.score {
        empty(&a.q, vec![batch, a.slots, rpad, lmax], DType::F32)
    } else {
        empty(&a.q, vec![1], DType::F32)
    };
    let client = a.q.client.clone();
    let (fd, id) = (a.q.dtype, a.ctx.dtype);
    let count = CubeCount::Static(
        (plan.splits * plan.rowblocks) as u32,
        a.slots as u32,
        batch as u32,
    );
    // SAFETY: shapes were validated by the caller; every index the kernel forms is inside
    // the tensors (positions < ctx + n_new <= capacity, rows < rpad, splits * chunk covers
    // max_keys, shared tiles sized from the same comptime values).
    unsafe {
        kernels::split_kernel::launch_unchecked::<CudaRuntime>(
            &client,
            count,
            CubeDim::new_1d(THREADS as u32),
            NV,
            a.q.into_tensor_arg(),
            a.k.into_tensor_arg(),
            a.v.into_tensor_arg(),
            a.ctx.into_tensor_arg(),
            a.table.into_tensor_arg(),
            a.idx.into_tensor_arg(),
            a.counts.into_tensor_arg(),
            pm.clone().into_tensor_arg(),
            pl.clone().into_tensor_arg(),
            pacc.clone().into_tensor_arg(),
            logits.clone().into_tensor_arg(),
            a.scale,
            a.n_new as u32,
            plan.chunk as u32,
            plan.splits as u32,
            plan.rowblocks as u32,
            a.slots as u32,
            lmax as u32,
            plan.mt,
            d,
            NV,
            a.sparse,
            a.score,
            [fd.into(), id.into()],
        );
    }
    Partials {
        pm,
        pl,
        pacc,
        logits,
        plan,
        rpad,
    }
}

/// Head widths the CUDA attention kernels take (their shared-memory tiles and `ldmatrix`
/// layouts are built for these; `KernelOps::PREFILL_HEAD_DIMS` on CUDA).
const KERNEL_HEAD_DIMS: &[usize] = &[64, 128];

fn check_kernel_dims(dims: &AttnDims) -> Result<()> {
    if !KERNEL_HEAD_DIMS.contains(&dims.head_dim) {
        return Err(KernelError::Unsupported(format!(
            "head_dim {} (the CUDA attention kernels take 64 or 128)",
            dims.head_dim
        )));
    }
    Ok(())
}

/// A sparse selection: indices `[batch, kv_heads, budget]` and counts.
type Selection<'a, F, I, BT> = (Tensor<Cube<F, I, BT>, 3, Int>, &'a [usize]);

fn attention<F: FloatElement, I: IntElement, BT: BoolElement>(
    q: Tensor<Cube<F, I, BT>, 4>,
    k: Tensor<Cube<F, I, BT>, 4>,
    v: Tensor<Cube<F, I, BT>, 4>,
    ctx_lens: &[usize],
    sel: Option<Selection<'_, F, I, BT>>,
    scale: f32,
    max_new: usize,
) -> Result<Tensor<Cube<F, I, BT>, 4>> {
    let dims = check_attn_upto(q.dims(), k.dims(), ctx_lens, max_new)?;
    if v.dims() != k.dims() {
        return Err(KernelError::Shape {
            name: "v",
            expected: k.dims().to_vec(),
            found: v.dims().to_vec(),
        });
    }
    check_kernel_dims(&dims)?;
    if let Some((idx, counts)) = &sel {
        check_selection(&dims, idx.dims(), counts)?;
    }
    let device = q.device();
    let (q, k, v) = (
        float_prim(q).tensor(),
        float_prim(k).tensor(),
        float_prim(v).tensor(),
    );
    check_dtype("q", q.dtype)?;
    check_dtype("k", k.dtype)?;
    check_dtype("v", v.dtype)?;
    if k.dtype != q.dtype || v.dtype != q.dtype {
        return Err(KernelError::Unsupported(
            "q, k, v of different dtypes".into(),
        ));
    }
    let (k, v) = (rows_ready(k), rows_ready(v));
    let g = dims.group();
    let cfg = config_of(&q);
    if sel.is_none() && max_new == MAX_PREFILL_NEW && use_flash(&cfg, &dims) {
        let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
        let out = flash_prefill(q, k, v, ctx, &dims, scale);
        return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
    }
    let slots: Vec<(usize, Vec<usize>)> = (0..dims.kv_heads)
        .map(|h| (h, (h * g..(h + 1) * g).collect()))
        .collect();
    let (tv, ts) = slot_table(&slots);
    let table = int_tensor::<F, I, BT, 2>(tv, ts, &device);
    let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
    let (sparse, idx, counts, max_keys) = match sel {
        Some((idx, counts)) => {
            let cv = counts.iter().map(|&c| c as i64).collect();
            let ct = int_tensor::<F, I, BT, 1>(cv, [counts.len()], &device);
            let mk = counts.iter().copied().max().unwrap_or(0) + dims.n_new;
            (true, idx.into_primitive(), ct, mk)
        }
        None => (false, ctx.clone(), ctx.clone(), dims.keys),
    };
    if max_new == MAX_NEW && use_flash_verify(&cfg) {
        let sel = sparse.then_some((idx, counts, max_keys));
        let out = flash_verify(q, k, v, ctx, table, sel, &dims, scale);
        return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
    }
    let b = dims.batch;
    let out_shape = vec![b, dims.q_heads, dims.n_new, dims.head_dim];
    let fd = q.dtype;
    let out = empty(&q, out_shape, fd);
    let parts = run_split(
        SplitArgs {
            q,
            k,
            v,
            ctx,
            table: table.clone(),
            idx,
            counts,
            slots: dims.kv_heads,
            max_rows: g * dims.n_new,
            max_keys,
            n_new: dims.n_new,
            head_dim: dims.head_dim,
            scale,
            sparse,
            score: false,
        },
        b,
    );
    let client = out.client.clone();
    let id = table.dtype;
    kernels::combine_kernel::launch::<CudaRuntime>(
        &client,
        CubeCount::Static((g * dims.n_new) as u32, dims.kv_heads as u32, b as u32),
        CubeDim::new_1d(dims.head_dim as u32),
        parts.pm.into_array_arg(),
        parts.pl.into_array_arg(),
        parts.pacc.into_array_arg(),
        table.clone().into_array_arg(),
        out.clone().into_array_arg(),
        table.meta.strides()[0] as u32,
        out.meta.strides()[0] as u32,
        out.meta.strides()[1] as u32,
        out.meta.strides()[2] as u32,
        out.meta.strides()[3] as u32,
        dims.n_new as u32,
        parts.plan.splits as u32,
        parts.rpad as u32,
        dims.kv_heads as u32,
        dims.head_dim,
        [fd.into(), id.into()],
    );
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// What one launch of `flash_kernel` takes besides `q`, `k`, `v`, `ctx`.
struct FlashLaunch {
    grid: (usize, usize, usize),
    idx: Ct,
    counts: Ct,
    out: Ct,
    pm: Ct,
    pl: Ct,
    pacc: Ct,
    rowblocks: usize,
    chunk: usize,
    /// Slot table of verification `[slots, 2 + heads]` (KV head, head count, query heads):
    /// block y is a slot.
    table: Ct,
    /// Score mode's logits `[b, slots, rpad, lmax]` (f32).
    logits: Ct,
    lmax: usize,
    /// Splits of the keys, one partial each per (sequence, slot) row block.
    splits: usize,
    rpad: usize,
    verify: bool,
    sparse: bool,
    /// Score mode (verification only): logits and (max, sum) partials, no `P V`.
    score: bool,
    /// Warps per block (4; prefill 4 or 8).
    warps: usize,
}

/// Launches `flash_kernel` (shapes checked by the caller: `n_new >= 1`,
/// `ctx + n_new <= capacity`, `head_dim` 64 or 128, rows of `k` and `v` ready by
/// [`rows_ready`], a selection's counts at most its width).
fn launch_flash(q: Ct, k: Ct, v: Ct, ctx: Ct, dims: &AttnDims, scale: f32, a: FlashLaunch) {
    let client = q.client.clone();
    let (fd, id) = (q.dtype, ctx.dtype);
    let (gx, gy, gz) = a.grid;
    // element strides of the first dims (a tensor of lower rank than the kernel reads, as
    // prefill's unused `idx` and `table`, has zeros there: never read)
    let sd = |t: &Ct, i: usize| t.meta.strides().get(i).copied().unwrap_or(0) as u32;
    let st = kernels::FlashStridesLaunch::new(
        sd(&q, 0),
        sd(&q, 1),
        sd(&q, 2),
        sd(&q, 3),
        sd(&k, 0),
        sd(&k, 1),
        sd(&k, 2),
        sd(&v, 0),
        sd(&v, 1),
        sd(&v, 2),
        sd(&a.idx, 0),
        sd(&a.idx, 1),
        sd(&a.idx, 2),
        sd(&a.out, 0),
        sd(&a.out, 1),
        sd(&a.out, 2),
        sd(&a.table, 0),
    );
    // SAFETY: every key the kernel reads is a virtual key below `vctx + n_new` of its
    // sequence (clamped), mapped to a slot below `ctx + n_new <= capacity` (selections:
    // listed positions outside the context read slot 0); rows written are below
    // `rtot <= rpad` (verify) or `n_new` (prefill), query heads read are the slot table's;
    // score mode's logits are written at keys below `kend <= ctx + n_new <= lmax`; shared
    // tiles are sized from the same comptime values.
    unsafe {
        kernels::flash_kernel::launch_unchecked::<CudaRuntime>(
            &client,
            CubeCount::Static(gx as u32, gy as u32, gz as u32),
            CubeDim::new_1d(32 * a.warps as u32),
            NV,
            q.clone().into_array_arg(),
            k.clone().into_array_arg(),
            v.clone().into_array_arg(),
            ctx.into_array_arg(),
            a.idx.clone().into_array_arg(),
            a.counts.into_array_arg(),
            a.table.clone().into_array_arg(),
            a.out.clone().into_array_arg(),
            a.pm.into_array_arg(),
            a.pl.into_array_arg(),
            a.pacc.into_array_arg(),
            a.logits.into_array_arg(),
            st,
            scale,
            dims.n_new as u32,
            dims.group() as u32,
            a.rowblocks as u32,
            a.chunk as u32,
            a.splits as u32,
            a.rpad as u32,
            a.lmax as u32,
            dims.head_dim,
            NV,
            if a.score {
                config_of(&a.out).score_buffers
            } else {
                config_of(&a.out).flash_buffers
            },
            a.verify,
            a.sparse,
            a.score,
            a.warps,
            [fd.into(), id.into()],
        );
    }
}

/// Causal prefill attention through `flash_kernel`: `q` `[b, q_heads, n_new, d]`
/// (any strides), `k`, `v` `[b, kv_heads, capacity, d]` ready by [`rows_ready`], `ctx`
/// `[b]`; returns `[b, q_heads, n_new, d]` in `q`'s dtype. Shapes and dtypes checked by the
/// caller.
fn flash_prefill(q: Ct, k: Ct, v: Ct, ctx: Ct, dims: &AttnDims, scale: f32) -> Ct {
    let b = dims.batch;
    let out = empty(
        &q,
        vec![b, dims.q_heads, dims.n_new, dims.head_dim],
        q.dtype,
    );
    let cfg = config_of(&q);
    match cfg.prefill_tiles {
        2 => {
            let nbuf = cfg.flash_buffers.min(2);
            launch_prefill2(q, k, v, ctx, dims, scale, out.clone(), nbuf, false);
            return out;
        }
        3 => {
            launch_prefill2(q, k, v, ctx, dims, scale, out.clone(), 1, true);
            return out;
        }
        0 if dims.n_new >= PREFILL2_KV_MIN_NEW => {
            launch_prefill2(q, k, v, ctx, dims, scale, out.clone(), 1, true);
            return out;
        }
        _ => {}
    }
    let warps = cfg.prefill_warps;
    let rowblocks = dims.n_new.div_ceil(16 * warps);
    let one = empty(&q, vec![1], DType::F32);
    let a = FlashLaunch {
        grid: (rowblocks, dims.q_heads, b),
        idx: ctx.clone(),
        counts: ctx.clone(),
        out: out.clone(),
        pm: one.clone(),
        pl: one.clone(),
        pacc: one.clone(),
        table: ctx.clone(),
        logits: one,
        lmax: 1,
        rowblocks,
        chunk: 1,
        splits: 1,
        rpad: 1,
        verify: false,
        sparse: false,
        score: false,
        warps,
    };
    launch_flash(q, k, v, ctx, dims, scale, a);
    out
}

/// Launches `prefill_kernel` (two m-tiles a warp) into `out` `[b, q_heads, n_new, d]` with
/// `nbuf` (1 or 2) K/V tile buffers, or with `kv_apart` one K and one V buffer staged apart
/// by `cp.async` (`nbuf` then 1); shapes as [`flash_prefill`]'s. A ring of more than two
/// buffers would leave one block an SM (Q takes 34 KB of shared memory at d 128).
#[allow(clippy::too_many_arguments)]
fn launch_prefill2(
    q: Ct,
    k: Ct,
    v: Ct,
    ctx: Ct,
    dims: &AttnDims,
    scale: f32,
    out: Ct,
    nbuf: usize,
    kv_apart: bool,
) {
    let client = q.client.clone();
    let (fd, id) = (q.dtype, ctx.dtype);
    let rowblocks = dims.n_new.div_ceil(kernels::PREFILL2_ROWS);
    // the kernel's softmax takes the maxima of raw scores
    debug_assert!(scale > 0.0, "prefill_kernel needs a positive scale");
    // K and V staged apart compute each tile in one step, from one buffer each
    debug_assert!(
        !kv_apart || nbuf == 1,
        "kv_apart stages one K and one V buffer"
    );
    let cfg = config_of(&q);
    let kstep = if kv_apart { 64 } else { cfg.prefill_key_step };
    let sd = |t: &Ct, i: usize| t.meta.strides().get(i).copied().unwrap_or(0) as u32;
    let st = kernels::FlashStridesLaunch::new(
        sd(&q, 0),
        sd(&q, 1),
        sd(&q, 2),
        sd(&q, 3),
        sd(&k, 0),
        sd(&k, 1),
        sd(&k, 2),
        sd(&v, 0),
        sd(&v, 1),
        sd(&v, 2),
        0,
        0,
        0,
        sd(&out, 0),
        sd(&out, 1),
        sd(&out, 2),
        0,
    );
    // prefill_stage's vector offsets (K and V staged apart) take element offsets over NV
    debug_assert!(
        [0usize, 1, 2].iter().all(|&i| {
            k.meta.strides().get(i).is_none_or(|s| s % NV == 0)
                && v.meta.strides().get(i).is_none_or(|s| s % NV == 0)
        }),
        "prefill_kernel needs K/V strides that are multiples of {NV}"
    );
    let run = prefill_head_run(&cfg, dims);
    // the slack in raw-score units (the kernel's maxima are of raw scores)
    let slack = if cfg.prefill_lazy_rescale {
        kernels::RESCALE_SLACK / scale
    } else {
        0.0
    };
    let grid = CubeCount::Static(
        (rowblocks * run) as u32,
        (dims.q_heads / run) as u32,
        dims.batch as u32,
    );
    // SAFETY: every key read is below `ctx + n_new <= capacity` of its sequence (tile slots
    // clamped to the block's last key), rows written are below `n_new`, query heads
    // `x % run + y run` below `q_heads` (`run` divides it; the grid), KV heads `qh / group`
    // below `kv_heads`; shared tiles are sized from the same comptime values.
    unsafe {
        kernels::prefill_kernel::launch_unchecked::<CudaRuntime>(
            &client,
            grid,
            CubeDim::new_1d(128),
            NV,
            q.into_array_arg(),
            k.into_array_arg(),
            v.into_array_arg(),
            ctx.into_array_arg(),
            out.into_array_arg(),
            st,
            scale,
            slack,
            dims.n_new as u32,
            dims.group() as u32,
            rowblocks as u32,
            run as u32,
            dims.head_dim,
            NV,
            nbuf,
            kstep,
            kv_apart,
            [fd.into(), id.into()],
        );
    }
}

/// Dense or sparse verification through `flash_kernel` and
/// `combine_kernel`: the rows `e * n_new + i` of each KV head's group in blocks
/// of 64, the virtual keys (context or selection, then the new tokens) split so the grid
/// fills at most two waves of resident blocks (`split_plan::verify_splits`), with at most
/// one split per [`MIN_CHUNK`] keys (each split a multiple of 64 keys); a selection in
/// splits of at least one tile over [`KernelConfig::sparse_waves`] waves. `table` is the
/// identity slot table of the dense path, `sel` the selection (indices, counts tensor,
/// most keys). Returns `[b, q_heads, n_new, d]` in `q`'s dtype.
#[allow(clippy::too_many_arguments)]
fn flash_verify(
    q: Ct,
    k: Ct,
    v: Ct,
    ctx: Ct,
    table: Ct,
    sel: Option<(Ct, Ct, usize)>,
    dims: &AttnDims,
    scale: f32,
) -> Ct {
    let b = dims.batch;
    let rows = dims.group() * dims.n_new;
    let rowblocks = rows.div_ceil(kernels::FLASH_ROWS);
    let rpad = rowblocks * kernels::FLASH_ROWS;
    let (sparse, idx, counts, max_keys) = match sel {
        Some((idx, counts, mk)) => (true, idx, counts, mk),
        None => (false, ctx.clone(), ctx.clone(), dims.keys),
    };
    let per = b * dims.kv_heads * rowblocks;
    let cfg = config_of(&q);
    let (min_chunk, waves) = if sparse {
        (crate::split_plan::SPARSE_MIN_CHUNK, cfg.sparse_waves)
    } else {
        (MIN_CHUNK, cfg.dense_waves)
    };
    let (splits, chunk) =
        crate::split_plan::verify_splits(per, max_keys, sm_count(&q), min_chunk, waves);
    let pm = empty(&q, vec![b, dims.kv_heads, splits, rpad], DType::F32);
    let pl = empty(&q, vec![b, dims.kv_heads, splits, rpad], DType::F32);
    let pacc = empty(
        &q,
        vec![b, dims.kv_heads, splits, rpad, dims.head_dim],
        DType::F32,
    );
    let fd = q.dtype;
    let out = empty(&q, vec![b, dims.q_heads, dims.n_new, dims.head_dim], fd);
    let a = FlashLaunch {
        grid: (splits * rowblocks, dims.kv_heads, b),
        idx,
        counts,
        out: out.clone(),
        pm: pm.clone(),
        pl: pl.clone(),
        pacc: pacc.clone(),
        table: table.clone(),
        logits: pm.clone(),
        lmax: 1,
        rowblocks,
        chunk,
        splits,
        rpad,
        verify: true,
        sparse,
        score: false,
        warps: 4,
    };
    launch_flash(q, k, v, ctx, dims, scale, a);
    let client = out.client.clone();
    let id = table.dtype;
    kernels::combine_kernel::launch::<CudaRuntime>(
        &client,
        CubeCount::Static(rows as u32, dims.kv_heads as u32, b as u32),
        CubeDim::new_1d(dims.head_dim as u32),
        pm.into_array_arg(),
        pl.into_array_arg(),
        pacc.into_array_arg(),
        table.clone().into_array_arg(),
        out.clone().into_array_arg(),
        table.meta.strides()[0] as u32,
        out.meta.strides()[0] as u32,
        out.meta.strides()[1] as u32,
        out.meta.strides()[2] as u32,
        out.meta.strides()[3] as u32,
        dims.n_new as u32,
        splits as u32,
        rpad as u32,
        dims.kv_heads as u32,
        dims.head_dim,
        [fd.into(), id.into()],
    );
    out
}

/// SMs of `t`'s device ([`DEFAULT_SMS`] where it does not say).
fn sm_count(t: &Ct) -> usize {
    t.client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .map_or(DEFAULT_SMS, |n| n as usize)
}

/// What the score mode of `flash_kernel` (or the split kernel's) leaves for
/// `score_reduce_kernel`: partial maxima and sums `[b, slots, splits, rpad]` and the scaled,
/// masked logits `[b, slots, rpad, keys]` (f32; row `e * n_new + i` of a slot is its `e`-th
/// query head's token `i`). `splits` counts partials: on the flash kernel 4 per split of the
/// keys (one per warp).
struct FlashScores {
    pm: Ct,
    pl: Ct,
    logits: Ct,
    splits: usize,
    rpad: usize,
}

/// Head-subset logits through `flash_kernel` in score mode: the rows of each slot of
/// `table` (`slots` of them, at most `max_heads` query heads each) in blocks of 16 rows
/// over every key of the context and the new tokens, the keys split as dense verification's
/// are (`split_plan::verify_splits`), each split leaving 4 partials (one per warp, each warp
/// taking 16 keys of every tile); only K is read. `k` ready by [`rows_ready`].
#[allow(clippy::too_many_arguments)]
fn flash_scores(
    q: Ct,
    k: Ct,
    ctx: Ct,
    table: Ct,
    slots: usize,
    max_heads: usize,
    dims: &AttnDims,
    scale: f32,
) -> FlashScores {
    let b = dims.batch;
    let rows = max_heads * dims.n_new;
    // 16 rows a block, every warp on a quarter of each tile's keys (`flash_kernel`'s score
    // mode), so each split leaves 4 partials
    let rowblocks = rows.div_ceil(16);
    let rpad = rowblocks * 16;
    let per = b * slots * rowblocks;
    let (splits, chunk) = crate::split_plan::verify_splits(
        per,
        dims.keys,
        sm_count(&q),
        MIN_CHUNK,
        crate::split_plan::FLASH_WAVES,
    );
    let pm = empty(&q, vec![b, slots, 4 * splits, rpad], DType::F32);
    let pl = empty(&q, vec![b, slots, 4 * splits, rpad], DType::F32);
    let logits = empty(&q, vec![b, slots, rpad, dims.keys], DType::F32);
    let out = empty(&q, vec![1], q.dtype);
    let a = FlashLaunch {
        grid: (splits * rowblocks, slots, b),
        idx: ctx.clone(),
        counts: ctx.clone(),
        out,
        pm: pm.clone(),
        pl: pl.clone(),
        pacc: pm.clone(),
        table,
        logits: logits.clone(),
        lmax: dims.keys,
        rowblocks,
        chunk,
        splits,
        rpad,
        verify: true,
        sparse: false,
        score: true,
        warps: 4,
    };
    launch_flash(q, k.clone(), k, ctx, dims, scale, a);
    FlashScores {
        pm,
        pl,
        logits,
        splits: 4 * splits,
        rpad,
    }
}

/// Head-subset probabilities of [`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores) (`per_row` false:
/// `[b, kv_heads, capacity]`) or [`KernelOps::head_subset_row_scores`](crate::SelectionOps::head_subset_row_scores) (`per_row`:
/// `[b, kv_heads, n_new, capacity]`), f32, 0 past each sequence's `ctx + n_new`.
fn subset_scores<F: FloatElement, I: IntElement, BT: BoolElement>(
    q: Tensor<Cube<F, I, BT>, 4>,
    k: Tensor<Cube<F, I, BT>, 4>,
    ctx_lens: &[usize],
    heads: &[usize],
    scale: f32,
    per_row: bool,
) -> Result<Ct> {
    let dims = check_attn(q.dims(), k.dims(), ctx_lens)?;
    check_kernel_dims(&dims)?;
    check_heads(heads, dims.q_heads)?;
    let device = q.device();
    let (q, k) = (float_prim(q).tensor(), float_prim(k).tensor());
    check_dtype("q", q.dtype)?;
    check_dtype("k", k.dtype)?;
    if k.dtype != q.dtype {
        return Err(KernelError::Unsupported("q, k of different dtypes".into()));
    }
    let k = rows_ready(k);
    let g = dims.group();
    let mut slots: Vec<(usize, Vec<usize>)> = Vec::new();
    let mut kv2slot = vec![-1i64; dims.kv_heads];
    for (kv, slot) in kv2slot.iter_mut().enumerate() {
        let hs: Vec<usize> = heads.iter().copied().filter(|&h| h / g == kv).collect();
        if !hs.is_empty() {
            *slot = slots.len() as i64;
            slots.push((kv, hs));
        }
    }
    let max_heads = slots.iter().map(|s| s.1.len()).max().unwrap_or(1);
    let (tv, ts) = slot_table(&slots);
    let table = int_tensor::<F, I, BT, 2>(tv, ts, &device);
    let kv2slot = int_tensor::<F, I, BT, 1>(kv2slot, [dims.kv_heads], &device);
    let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
    let b = dims.batch;
    // as wide as `k` (the trait's contract): positions `keys ..` are written 0
    let shape = if per_row {
        vec![b, dims.kv_heads, dims.n_new, dims.capacity]
    } else {
        vec![b, dims.kv_heads, dims.capacity]
    };
    let out = empty(&q, shape, DType::F32);
    let nslots = slots.len();
    // the flash kernel's score mode where verification runs on it, else the split kernel's
    let parts = if use_flash_verify(&config_of(&q)) {
        flash_scores(
            q,
            k,
            ctx.clone(),
            table.clone(),
            nslots,
            max_heads,
            &dims,
            scale,
        )
    } else {
        let s = run_split(
            SplitArgs {
                q,
                k: k.clone(),
                v: k,
                ctx: ctx.clone(),
                table: table.clone(),
                idx: ctx.clone(),
                counts: ctx.clone(),
                slots: nslots,
                max_rows: max_heads * dims.n_new,
                max_keys: dims.keys,
                n_new: dims.n_new,
                head_dim: dims.head_dim,
                scale,
                sparse: false,
                score: true,
            },
            b,
        );
        FlashScores {
            pm: s.pm,
            pl: s.pl,
            logits: s.logits,
            splits: s.plan.splits,
            rpad: s.rpad,
        }
    };
    let client = out.client.clone();
    let id = table.dtype;
    kernels::score_reduce_kernel::launch::<CudaRuntime>(
        &client,
        CubeCount::Static(
            dims.capacity.div_ceil(kernels::SCORE_BLOCK_POSITIONS) as u32,
            dims.kv_heads as u32,
            b as u32,
        ),
        CubeDim::new_1d(256),
        parts.pm.into_tensor_arg(),
        parts.pl.into_tensor_arg(),
        parts.logits.into_tensor_arg(),
        table.into_tensor_arg(),
        kv2slot.into_tensor_arg(),
        ctx.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        dims.n_new as u32,
        parts.splits as u32,
        parts.rpad as u32,
        nslots as u32,
        dims.keys as u32,
        dims.capacity as u32,
        parts.rpad,
        per_row,
        id.into(),
    );
    Ok(out)
}

/// `cuMemHostAlloc` flag: the block is page-locked for every CUDA context, not only the one
/// current when it was made (CUDA driver API, `CU_MEMHOSTALLOC_PORTABLE`).
const HOST_ALLOC_PORTABLE: u32 = 0x01;

fn driver(what: &str, e: impl std::fmt::Debug) -> KernelError {
    KernelError::Driver(format!("{what}: {e:?}"))
}

/// Makes GPU `index`'s primary context current on the calling thread: the context cubecl-cuda
/// 0.10 runs in (`runtime.rs` retains the primary context of each device), so pointers and
/// page-locked blocks are shared with it.
pub(crate) fn make_current(index: usize) -> Result<()> {
    use cudarc::driver::result::{ctx, device, init, primary_ctx};
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    /// Primary contexts retained by this process, by device ordinal (pointers as usize):
    /// retained once each, never released while the process runs.
    static RETAINED: OnceLock<Mutex<HashMap<usize, usize>>> = OnceLock::new();
    let c = {
        let mut map = RETAINED
            .get_or_init(|| Mutex::new(HashMap::new()))
            .lock()
            .map_err(|_| driver("context table", "poisoned"))?;
        match map.get(&index) {
            Some(&c) => c,
            None => {
                init().map_err(|e| driver("cuInit", e))?;
                let ordinal = i32::try_from(index).map_err(|e| driver("device ordinal", e))?;
                let dev = device::get(ordinal).map_err(|e| driver("cuDeviceGet", e))?;
                // SAFETY: `dev` is a valid device handle from `cuDeviceGet`.
                let c = unsafe { primary_ctx::retain(dev) }
                    .map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
                map.insert(index, c as usize);
                c as usize
            }
        }
    };
    // SAFETY: `c` is a primary context retained above and never released.
    unsafe { ctx::set_current(c as cudarc::driver::sys::CUcontext) }
        .map_err(|e| driver("cuCtxSetCurrent", e))
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> KernelBackend for Cube<F, I, BT> {
    const FUSED: bool = true;

    fn set_kernel_config(device: &Self::Device, config: &KernelConfig) {
        set_config(device, *config);
    }

    fn kernel_config(device: &Self::Device) -> KernelConfig {
        config(device)
    }
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> AttentionOps for Cube<F, I, BT> {
    const PREFILL_CHUNK: usize = 16384;

    const PREFILL_HEAD_DIMS: &'static [usize] = KERNEL_HEAD_DIMS;

    fn verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attention(q, k, v, ctx_lens, None, scale, MAX_NEW)
    }

    fn prefill_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attention(q, k, v, ctx_lens, None, scale, MAX_PREFILL_NEW)
    }

    fn sparse_verify_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        ctx_lens: &[usize],
        indices: Tensor<Self, 3, Int>,
        counts: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        attention(q, k, v, ctx_lens, Some((indices, counts)), scale, MAX_NEW)
    }
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> SelectionOps for Cube<F, I, BT> {
    fn estimator_kernels(device: &Self::Device) -> EstimatorKernels {
        config(device).estimator_kernels
    }

    fn head_subset_scores(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        heads: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 3>> {
        let out = subset_scores(q, k, ctx_lens, heads, scale, false)?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn head_subset_row_scores(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        heads: &[usize],
        scale: f32,
    ) -> Result<Tensor<Self, 4>> {
        let out = subset_scores(q, k, ctx_lens, heads, scale, true)?;
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn fold_rows(
        hist: Option<Tensor<Self, 3>>,
        factor: &[f32],
        rows: Tensor<Self, 4>,
        w: &[f32],
        own: &[f32],
        all: &[f32],
    ) -> Result<Tensor<Self, 3>> {
        check_fold(
            hist.as_ref().map(Tensor::dims),
            factor,
            rows.dims(),
            w,
            own,
            all,
        )?;
        let [b, kvh, n, l] = rows.dims();
        let device = rows.device();
        let rows = float_prim(rows).tensor();
        let hist = hist.map(|h| h.into_primitive().tensor());
        // one upload: factor | w | own | all
        let params: Vec<f32> = [factor, w, own, all].concat();
        let np = params.len();
        let params = <Self as burn_tensor::ops::FloatTensorOps<Self>>::float_from_data(
            TensorData::new(params, [np]),
            &device,
        );
        let out = empty(&rows, vec![b, kvh, l], DType::F32);
        if b * kvh * l > 0 {
            let lr = rows.meta.strides().to_vec();
            let (h, lh, has_hist) = match hist {
                Some(h) => {
                    let s = h.meta.strides().to_vec();
                    (h, s, true)
                }
                None => (rows.clone(), vec![0, 0, 0], false),
            };
            let (fd, hd) = (rows.dtype, h.dtype);
            let client = rows.client.clone();
            kernels::fold_rows_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(
                    l.div_ceil(kernels::FOLD_THREADS) as u32,
                    kvh as u32,
                    b as u32,
                ),
                CubeDim::new_1d(kernels::FOLD_THREADS as u32),
                rows.into_array_arg(),
                h.into_array_arg(),
                params.into_array_arg(),
                out.clone().into_array_arg(),
                lr[0] as u32,
                lr[1] as u32,
                lr[2] as u32,
                lr[3] as u32,
                lh[0] as u32,
                lh[1] as u32,
                lh[2] as u32,
                b as u32,
                n as u32,
                kvh as u32,
                l as u32,
                has_hist,
                [fd.into(), hd.into()],
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn mix_scores(
        hist: Tensor<Self, 3>,
        la: Option<Tensor<Self, 2>>,
        free: &[(usize, usize)],
        alpha: f32,
        width: usize,
    ) -> Result<Tensor<Self, 3>> {
        let [b, kvh, hl] = hist.dims();
        check_mix(b, la.as_ref().map(Tensor::dims), free, alpha)?;
        let device = hist.device();
        let hist = hist.into_primitive().tensor();
        let la = la.map(|t| t.into_primitive().tensor());
        let fv: Vec<i64> = free
            .iter()
            .flat_map(|&(lo, hi)| [lo as i64, hi as i64])
            .collect();
        let free = int_tensor::<F, I, BT, 1>(fv, [2 * b], &device);
        let out = empty(&hist, vec![b, kvh, width], hist.dtype);
        if b * kvh * width > 0 {
            let lh = hist.meta.strides().to_vec();
            let (lt, ll, la_len, has_la) = match la {
                Some(t) => {
                    let s = t.meta.strides().to_vec();
                    let len = t.meta.shape()[1];
                    (t, s, len, true)
                }
                None => (hist.clone(), vec![0, 0], 0, false),
            };
            let (hd, ld, id) = (hist.dtype, lt.dtype, free.dtype);
            let client = hist.client.clone();
            kernels::mix_scores_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(kvh as u32, b as u32, 1),
                CubeDim::new_1d(kernels::MIX_THREADS as u32),
                hist.into_array_arg(),
                lt.into_array_arg(),
                free.into_array_arg(),
                out.clone().into_array_arg(),
                lh[0] as u32,
                lh[1] as u32,
                lh[2] as u32,
                ll[0] as u32,
                ll[1] as u32,
                hl as u32,
                la_len as u32,
                kvh as u32,
                width as u32,
                alpha,
                has_la,
                [hd.into(), ld.into(), id.into()],
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn quest_page_bounds(
        k: Tensor<Self, 4>,
        ctx_lens: &[usize],
        page_size: usize,
    ) -> Result<(Tensor<Self, 4>, Tensor<Self, 4>)> {
        let [b, kvh, cap, d] = k.dims();
        let pages = check_pages(ctx_lens, b, cap, page_size)?;
        let device = k.device();
        let k = float_prim(k).tensor();
        let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
        let fd = k.dtype;
        let kmin = empty(&k, vec![b, kvh, pages, d], fd);
        let kmax = empty(&k, vec![b, kvh, pages, d], fd);
        let client = k.client.clone();
        let id = ctx.dtype;
        kernels::page_bounds_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(pages as u32, kvh as u32, b as u32),
            CubeDim::new_1d(d.min(128) as u32),
            k.into_tensor_arg(),
            ctx.into_tensor_arg(),
            kmin.clone().into_tensor_arg(),
            kmax.clone().into_tensor_arg(),
            page_size as u32,
            d,
            [fd.into(), id.into()],
        );
        Ok((
            Tensor::from_primitive(TensorPrimitive::Float(kmin)),
            Tensor::from_primitive(TensorPrimitive::Float(kmax)),
        ))
    }

    fn quest_page_scores(
        q: Tensor<Self, 4>,
        kmin: Tensor<Self, 4>,
        kmax: Tensor<Self, 4>,
        ctx_lens: &[usize],
        page_size: usize,
    ) -> Result<Tensor<Self, 3>> {
        let [b, hq, n, d] = q.dims();
        let [kb, kvh, pages, kd] = kmin.dims();
        if kb != b || kd != d || kvh == 0 || kmax.dims() != kmin.dims() {
            return Err(KernelError::Shape {
                name: "kmin/kmax",
                expected: vec![b, kvh.max(1), pages, d],
                found: kmax.dims().to_vec(),
            });
        }
        if hq % kvh != 0 || n == 0 {
            return Err(KernelError::invalid(
                "q",
                format!("heads a multiple of {kvh}, n_new >= 1"),
                format!("{hq} heads, n_new {n}"),
            ));
        }
        let need = check_pages(ctx_lens, b, usize::MAX, page_size)?;
        if need > pages {
            return Err(KernelError::invalid(
                "kmin",
                format!("at least {need} pages"),
                pages,
            ));
        }
        let g = hq / kvh;
        if g * n * d * 4 > 160 * 1024 {
            return Err(KernelError::Unsupported(format!(
                "{} query rows of width {d} per KV head (shared memory)",
                g * n
            )));
        }
        let device = q.device();
        let q = float_prim(q).tensor();
        let (kmin, kmax) = (float_prim(kmin).tensor(), float_prim(kmax).tensor());
        let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
        let out = empty(&q, vec![b, kvh, pages], DType::F32);
        let client = q.client.clone();
        let (fd, id) = (q.dtype, ctx.dtype);
        if kmin.dtype != fd || kmax.dtype != fd {
            return Err(KernelError::Unsupported(
                "q and bounds of different dtypes".into(),
            ));
        }
        kernels::page_scores_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(pages.div_ceil(128) as u32, kvh as u32, b as u32),
            CubeDim::new_1d(128),
            q.into_tensor_arg(),
            kmin.into_tensor_arg(),
            kmax.into_tensor_arg(),
            ctx.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            page_size as u32,
            pages as u32,
            g,
            n,
            d,
            [fd.into(), id.into()],
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn top_k_positions(
        scores: Tensor<Self, 3>,
        ctx_lens: &[usize],
        keep: Keep,
    ) -> Result<Positions<Self>> {
        let dims = scores.dims();
        let (counts, kk) = check_top_k(dims, ctx_lens, keep)?;
        let device = scores.device();
        let s = match scores.into_primitive() {
            TensorPrimitive::Float(t) => t,
            TensorPrimitive::QFloat(_) => {
                return Err(KernelError::Unsupported("quantized scores".into()))
            }
        };
        let ctx = ctx_tensor::<F, I, BT>(ctx_lens, &device);
        let [b, h, _] = dims;
        let out = empty_device_dtype(
            s.client.clone(),
            s.device.clone(),
            Shape::from(vec![b, h, kk]),
            I::dtype(),
        );
        if kk > 0 {
            let client = s.client.clone();
            let (fd, id) = (s.dtype, ctx.dtype);
            let (ls, lo) = (s.meta.strides().to_vec(), out.meta.strides().to_vec());
            // 16-bit scores: the key's low byte follows from the byte above it
            let passes = if s.dtype.size() == 2 { 3 } else { 4 };
            if config_of(&s).topk_kernel == TopkKernel::Block {
                kernels::topk_block_kernel::launch::<CudaRuntime>(
                    &client,
                    CubeCount::Static(1, h as u32, b as u32),
                    CubeDim::new_1d(256),
                    s.into_tensor_arg(),
                    ctx.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    keep.budget as u32,
                    keep.n_sink as u32,
                    keep.window as u32,
                    kk as u32,
                    [fd.into(), id.into()],
                );
                return Ok(Positions {
                    indices: Tensor::from_primitive(out),
                    counts,
                });
            }
            kernels::topk_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(1, h as u32, b as u32),
                CubeDim::new_1d(kernels::TOPK_THREADS as u32),
                s.into_array_arg(),
                ctx.into_array_arg(),
                out.clone().into_array_arg(),
                ls[0] as u32,
                ls[1] as u32,
                ls[2] as u32,
                lo[0] as u32,
                lo[1] as u32,
                lo[2] as u32,
                keep.budget as u32,
                keep.n_sink as u32,
                keep.window as u32,
                kk as u32,
                passes,
                [fd.into(), id.into()],
            );
        }
        Ok(Positions {
            indices: Tensor::from_primitive(out),
            counts,
        })
    }
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> ElementwiseOps for Cube<F, I, BT> {
    fn rms_norm(x: Tensor<Self, 3>, weight: Tensor<Self, 1>, eps: f64) -> Result<Tensor<Self, 3>> {
        let [b, n, hidden] = x.dims();
        check_rms_norm([b, n, hidden], weight.dims(), eps)?;
        let rows = b * n;
        let x = x.reshape([rows, hidden]).into_primitive().tensor();
        let w = weight.into_primitive().tensor();
        let fd = x.dtype;
        let out = empty(&x, vec![b, n, hidden], fd);
        if rows > 0 && hidden > 0 {
            let client = x.client.clone();
            kernels::rms_norm_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(rows as u32, 1, 1),
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                x.clone().into_array_arg(),
                w.clone().into_array_arg(),
                out.clone().into_array_arg(),
                x.meta.strides()[0] as u32,
                x.meta.strides()[1] as u32,
                w.meta.strides()[0] as u32,
                eps as f32,
                1.0 / hidden as f32,
                hidden,
                fd.into(),
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn add_rms_norm(
        a: Tensor<Self, 3>,
        x: Tensor<Self, 3>,
        weight: Tensor<Self, 1>,
        eps: f64,
    ) -> Result<(Tensor<Self, 3>, Tensor<Self, 3>)> {
        let [b, n, hidden] = a.dims();
        check_same("x", [b, n, hidden], x.dims())?;
        check_rms_norm([b, n, hidden], weight.dims(), eps)?;
        let rows = b * n;
        let a = a.reshape([rows, hidden]).into_primitive().tensor();
        let x = x.reshape([rows, hidden]).into_primitive().tensor();
        if x.dtype != a.dtype {
            return Err(KernelError::Unsupported(
                "a and x of different dtypes".into(),
            ));
        }
        let w = weight.into_primitive().tensor();
        let fd = a.dtype;
        let sum = empty(&a, vec![b, n, hidden], fd);
        let out = empty(&a, vec![b, n, hidden], fd);
        if rows > 0 && hidden > 0 {
            let client = a.client.clone();
            kernels::add_rms_norm_kernel::launch::<CudaRuntime>(
                &client,
                CubeCount::Static(rows as u32, 1, 1),
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                a.clone().into_array_arg(),
                x.clone().into_array_arg(),
                w.clone().into_array_arg(),
                sum.clone().into_array_arg(),
                out.clone().into_array_arg(),
                a.meta.strides()[0] as u32,
                a.meta.strides()[1] as u32,
                x.meta.strides()[0] as u32,
                x.meta.strides()[1] as u32,
                w.meta.strides()[0] as u32,
                eps as f32,
                1.0 / hidden as f32,
                hidden,
                fd.into(),
            );
        }
        Ok((
            Tensor::from_primitive(TensorPrimitive::Float(sum)),
            Tensor::from_primitive(TensorPrimitive::Float(out)),
        ))
    }

    fn silu_mul(gate: Tensor<Self, 3>, up: Tensor<Self, 3>) -> Result<Tensor<Self, 3>> {
        let [b, n, cols] = gate.dims();
        check_same("up", [b, n, cols], up.dims())?;
        let rows = b * n;
        let total = rows * cols;
        let g = gate.reshape([rows, cols]).into_primitive().tensor();
        let u = up.reshape([rows, cols]).into_primitive().tensor();
        let fd = g.dtype;
        let out = empty(&g, vec![b, n, cols], fd);
        if total > 0 {
            let client = g.client.clone();
            kernels::silu_mul_kernel::launch::<CudaRuntime>(
                &client,
                elementwise_count(total)?,
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                g.into_tensor_arg(),
                u.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                total as u32,
                cols,
                fd.into(),
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn rope(
        x: Tensor<Self, 4>,
        cos: Tensor<Self, 4>,
        sin: Tensor<Self, 4>,
    ) -> Result<Tensor<Self, 4>> {
        let [b, h, n, d] = x.dims();
        check_rope([b, h, n, d], cos.dims(), sin.dims())?;
        let total = b * h * n * d;
        let x = float_prim(x).tensor();
        let cos = float_prim(cos).tensor();
        let sin = float_prim(sin).tensor();
        let fd = x.dtype;
        let out = empty(&x, vec![b, h, n, d], fd);
        if total > 0 {
            let client = x.client.clone();
            let (xs, cs, ss) = (x.meta.strides(), cos.meta.strides(), sin.meta.strides());
            kernels::rope_kernel::launch::<CudaRuntime>(
                &client,
                elementwise_count(total)?,
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                x.clone().into_array_arg(),
                cos.clone().into_array_arg(),
                sin.clone().into_array_arg(),
                out.clone().into_array_arg(),
                xs[0] as u32,
                xs[1] as u32,
                xs[2] as u32,
                xs[3] as u32,
                cs[0] as u32,
                cs[2] as u32,
                cs[3] as u32,
                ss[0] as u32,
                ss[2] as u32,
                ss[3] as u32,
                total as u32,
                h as u32,
                n as u32,
                d,
                fd.into(),
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn dequantize_packed(
        words: Tensor<Self, 3, Int>,
        scale: Tensor<Self, 3>,
        min: Tensor<Self, 3>,
        bits: u32,
        group: usize,
        rows: usize,
    ) -> Result<Tensor<Self, 2>> {
        let per = check_packed(words.dims(), scale.dims(), min.dims(), bits, group, rows)?;
        let [_, wpg, cols] = words.dims();
        let total = rows * cols;
        // the kernel indexes the three inputs as contiguous
        let w = into_contiguous(words.into_primitive());
        let sc = into_contiguous(scale.into_primitive().tensor());
        let mn = into_contiguous(min.into_primitive().tensor());
        let (fd, id) = (sc.dtype, w.dtype);
        let out = empty(&sc, vec![rows, cols], fd);
        if total > 0 {
            let client = sc.client.clone();
            kernels::dequant_kernel::launch::<CudaRuntime>(
                &client,
                elementwise_count(total)?,
                CubeDim::new_1d(kernels::ELEM_THREADS as u32),
                w.into_tensor_arg(),
                sc.into_tensor_arg(),
                mn.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                total as u32,
                bits,
                cols,
                group,
                per,
                wpg,
                [fd.into(), id.into()],
            );
        }
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> LinearOps for Cube<F, I, BT> {
    fn skinny_linear(
        x: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        let ([m, k], [_, n]) = (x.dims(), w.dims());
        check_skinny([m, k], w.dims(), bias.as_ref().map(|b| b.dims()))?;
        let wp = w.into_primitive().tensor();
        let xp = x.into_primitive().tensor();
        let Some(path) = skinny_path(m, k, &xp, &[&wp]) else {
            let x = Tensor::from_primitive(TensorPrimitive::Float(xp));
            let w = Tensor::from_primitive(TensorPrimitive::Float(wp));
            return crate::plain::skinny_linear(x, w, bias);
        };
        let fd = xp.dtype;
        let (rows, splits) = skinny_plan(k, m, &[n], path, sm_count(&xp));
        let part = empty(&xp, vec![splits, m, n], DType::F32);
        let out = empty(&xp, vec![m, n], fd);
        let client = xp.client.clone();
        let has_bias = bias.is_some();
        // without a bias the kernels read none; x stands in for the binding
        let b = match bias {
            Some(b) => contiguous(b.into_primitive().tensor()),
            None => xp.clone(),
        };
        if fuses_split(&xp, path, m, &[n]) {
            let fin = Finish::outputs(&xp, [&out; 3], [&b; 3], u32::from(has_bias));
            skinny_gemm_into(&xp, &[(wp, 0)], &part, k, n, rows, splits, path, &fin);
            return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
        }
        skinny_gemm_into(
            &xp,
            &[(wp, 0)],
            &part,
            k,
            n,
            rows,
            splits,
            path,
            &Finish::partials(&xp),
        );
        kernels::skinny_reduce_kernel::launch::<CudaRuntime>(
            &client,
            elementwise_count(m * n)?,
            CubeDim::new_1d(kernels::ELEM_THREADS as u32),
            part.into_array_arg(),
            b.into_array_arg(),
            out.clone().into_array_arg(),
            (m * n) as u32,
            n as u32,
            splits as u32,
            has_bias,
            fd.into(),
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn skinny_linear3(
        x: Tensor<Self, 2>,
        ws: [crate::LinearParts<Self>; 3],
    ) -> Result<[Tensor<Self, 2>; 3]> {
        let [m, k] = x.dims();
        for (i, (w, b)) in ws.iter().enumerate() {
            check_skinny([m, k], w.dims(), b.as_ref().map(|b| b.dims())).map_err(|e| match e {
                KernelError::Shape {
                    name,
                    expected,
                    found,
                } => KernelError::Shape {
                    name: if name == "w" {
                        ["w_0", "w_1", "w_2"][i]
                    } else {
                        ["bias_0", "bias_1", "bias_2"][i]
                    },
                    expected,
                    found,
                },
                e => e,
            })?;
        }
        let [(w0, b0), (w1, b1), (w2, b2)] = ws;
        let wps = [
            w0.into_primitive().tensor(),
            w1.into_primitive().tensor(),
            w2.into_primitive().tensor(),
        ];
        let xp = x.into_primitive().tensor();
        let Some(path) = skinny_path(m, k, &xp, &[&wps[0], &wps[1], &wps[2]]) else {
            let x = Tensor::from_primitive(TensorPrimitive::Float(xp));
            let [w0, w1, w2] = wps.map(|w| Tensor::from_primitive(TensorPrimitive::Float(w)));
            return crate::skinny_linear3_each(x, [(w0, b0), (w1, b1), (w2, b2)]);
        };
        let ns = wps.clone().map(|w| w.meta.shape()[1]);
        let ldp: usize = ns.iter().sum();
        let fd = xp.dtype;
        let (rows, splits) = skinny_plan(k, m, &ns, path, sm_count(&xp));
        let part = empty(&xp, vec![splits, m, ldp], DType::F32);
        let outs = ns.map(|n| empty(&xp, vec![m, n], fd));
        let client = xp.client.clone();
        let offs = [0, ns[0], ns[0] + ns[1]];
        let ws: Vec<(Ct, usize)> = wps.into_iter().zip(offs).collect();
        let has = [b0.is_some(), b1.is_some(), b2.is_some()];
        // a missing bias is not read; x stands in for its binding
        let bias = |b: Option<Tensor<Self, 1>>| match b {
            Some(b) => contiguous(b.into_primitive().tensor()),
            None => xp.clone(),
        };
        let (b0, b1, b2) = (bias(b0), bias(b1), bias(b2));
        if fuses_split(&xp, path, m, &ns) {
            let mask = u32::from(has[0]) | u32::from(has[1]) << 1 | u32::from(has[2]) << 2;
            let fin = Finish::outputs(&xp, [&outs[0], &outs[1], &outs[2]], [&b0, &b1, &b2], mask);
            skinny_gemm_into(&xp, &ws, &part, k, ldp, rows, splits, path, &fin);
            return Ok(outs.map(|o| Tensor::from_primitive(TensorPrimitive::Float(o))));
        }
        skinny_gemm_into(
            &xp,
            &ws,
            &part,
            k,
            ldp,
            rows,
            splits,
            path,
            &Finish::partials(&xp),
        );
        kernels::skinny_reduce3_kernel::launch::<CudaRuntime>(
            &client,
            elementwise_count(m * ldp)?,
            CubeDim::new_1d(kernels::ELEM_THREADS as u32),
            part.into_array_arg(),
            b0.into_array_arg(),
            b1.into_array_arg(),
            b2.into_array_arg(),
            outs[0].clone().into_array_arg(),
            outs[1].clone().into_array_arg(),
            outs[2].clone().into_array_arg(),
            (m * ldp) as u32,
            ldp as u32,
            ns[0] as u32,
            ns[1] as u32,
            splits as u32,
            has[0],
            has[1],
            has[2],
            fd.into(),
        );
        Ok(outs.map(|o| Tensor::from_primitive(TensorPrimitive::Float(o))))
    }

    fn skinny_swiglu(
        x: Tensor<Self, 2>,
        w_gate: Tensor<Self, 2>,
        w_up: Tensor<Self, 2>,
    ) -> Result<Tensor<Self, 2>> {
        let [m, k] = x.dims();
        crate::check_swiglu([m, k], w_gate.dims(), w_up.dims())?;
        let n = w_gate.dims()[1];
        let (g, u) = (
            w_gate.into_primitive().tensor(),
            w_up.into_primitive().tensor(),
        );
        let xp = x.into_primitive().tensor();
        let Some(path) = skinny_path(m, k, &xp, &[&g, &u]) else {
            let x = Tensor::from_primitive(TensorPrimitive::Float(xp));
            let (g, u) = (
                Tensor::from_primitive(TensorPrimitive::Float(g)),
                Tensor::from_primitive(TensorPrimitive::Float(u)),
            );
            return crate::skinny_swiglu_each(x, g, u);
        };
        let fd = xp.dtype;
        let (rows, splits) = skinny_plan(k, m, &[n, n], path, sm_count(&xp));
        let part = empty(&xp, vec![splits, m, 2 * n], DType::F32);
        let out = empty(&xp, vec![m, n], fd);
        let client = xp.client.clone();
        let ws = [(g, 0), (u, n)];
        if fuses_split(&xp, path, m, &[n, n]) {
            let fin = Finish::swiglu(&xp, &out);
            skinny_gemm_into(&xp, &ws, &part, k, 2 * n, rows, splits, path, &fin);
            return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
        }
        skinny_gemm_into(
            &xp,
            &ws,
            &part,
            k,
            2 * n,
            rows,
            splits,
            path,
            &Finish::partials(&xp),
        );
        kernels::skinny_reduce_swiglu_kernel::launch::<CudaRuntime>(
            &client,
            elementwise_count(m * n)?,
            CubeDim::new_1d(kernels::ELEM_THREADS as u32),
            part.into_array_arg(),
            out.clone().into_array_arg(),
            (m * n) as u32,
            n as u32,
            splits as u32,
            fd.into(),
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }

    fn prefill_linear(
        x: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        bias: Option<Tensor<Self, 1>>,
    ) -> Result<Tensor<Self, 2>> {
        // the one-part case of prefill_linear_many (one output for one part)
        let mut outs = Self::prefill_linear_many(x, vec![(w, bias)])?;
        Ok(outs.remove(0))
    }

    fn prefill_linear_many(
        x: Tensor<Self, 2>,
        parts: Vec<crate::LinearParts<Self>>,
    ) -> Result<Vec<Tensor<Self, 2>>> {
        for (w, bias) in &parts {
            check_skinny(x.dims(), w.dims(), bias.as_ref().map(|b| b.dims()))?;
        }
        let plain = |x: Tensor<Self, 2>, parts: Vec<crate::LinearParts<Self>>| {
            parts
                .into_iter()
                .map(|(w, bias)| crate::plain::linear(x.clone(), w, bias))
                .collect::<Result<Vec<_>>>()
        };
        if !blas::available() {
            return plain(x, parts);
        }
        let xp = x.into_primitive().tensor();
        let ps: Vec<(Ct, Option<Ct>)> = parts
            .into_iter()
            .map(|(w, b)| {
                (
                    w.into_primitive().tensor(),
                    b.map(|b| b.into_primitive().tensor()),
                )
            })
            .collect();
        if let Some(outs) = blas::linear_many(xp.clone(), ps.clone())? {
            return Ok(outs
                .into_iter()
                .map(|o| Tensor::from_primitive(TensorPrimitive::Float(o)))
                .collect());
        }
        plain(
            Tensor::from_primitive(TensorPrimitive::Float(xp)),
            ps.into_iter()
                .map(|(w, b)| {
                    (
                        Tensor::from_primitive(TensorPrimitive::Float(w)),
                        b.map(|b| Tensor::from_primitive(TensorPrimitive::Float(b))),
                    )
                })
                .collect(),
        )
    }

    fn skinny_max_rows(config: &KernelConfig) -> usize {
        match config.skinny_kernel {
            SkinnyKernel::Mma | SkinnyKernel::Ring | SkinnyKernel::Auto => MMA_MAX_ROWS,
            SkinnyKernel::NoRing => AUTO_MMA_MAX_ROWS,
            SkinnyKernel::Cores => crate::SKINNY_MAX_ROWS,
        }
    }

    fn prefill_gemm_name(_device: &Self::Device) -> &'static str {
        if blas::available() {
            "cublas"
        } else {
            "burn"
        }
    }
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> MemoryOps for Cube<F, I, BT> {
    fn kv_write(
        dst: Tensor<Self, 4>,
        src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<Tensor<Self, 4>> {
        check_kv_write(dst.dims(), src.dims(), starts)?;
        let [b, h, n, d] = src.dims();
        // equal starts: Burn's one slice-assign launch already
        if n == 0 || d > 1024 || starts.windows(2).all(|w| w[0] == w[1]) {
            return crate::plain::kv_write(dst, src, starts);
        }
        let device = dst.device();
        let dst = float_prim(dst).tensor();
        let src = float_prim(src).tensor();
        if dst.dtype != src.dtype {
            return Err(KernelError::Unsupported(
                "dst and src of different dtypes".into(),
            ));
        }
        // in place, as Burn's slice-assign: a shared or overlapping cache is copied first
        let dst = if dst.can_mut() && dst.is_nonoverlapping() {
            dst
        } else {
            dst.copy()
        };
        let st = ctx_tensor::<F, I, BT>(starts, &device);
        let (fd, id) = (dst.dtype, st.dtype);
        let client = dst.client.clone();
        kernels::kv_write_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(n as u32, h as u32, b as u32),
            CubeDim::new_1d(d as u32),
            src.into_tensor_arg(),
            st.into_tensor_arg(),
            dst.clone().into_tensor_arg(),
            d,
            [fd.into(), id.into()],
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(dst)))
    }

    fn kv_write_pair(
        k_dst: Tensor<Self, 4>,
        v_dst: Tensor<Self, 4>,
        k_src: Tensor<Self, 4>,
        v_src: Tensor<Self, 4>,
        starts: &[usize],
    ) -> Result<(Tensor<Self, 4>, Tensor<Self, 4>)> {
        check_kv_write_pair(
            [k_dst.dims(), v_dst.dims()],
            [k_src.dims(), v_src.dims()],
            starts,
        )?;
        // before anything is consumed: the caches come back unchanged on an error
        if [v_dst.dtype(), k_src.dtype(), v_src.dtype()]
            .iter()
            .any(|&t| t != k_dst.dtype())
        {
            return Err(KernelError::Unsupported(
                "kv_write_pair of tensors of different dtypes".into(),
            ));
        }
        let [b, h, n, d] = k_src.dims();
        if n == 0 || d > 1024 {
            return Ok((
                crate::plain::kv_write(k_dst, k_src, starts)?,
                crate::plain::kv_write(v_dst, v_src, starts)?,
            ));
        }
        let device = k_dst.device();
        let [dk, dv, sk, sv] = [k_dst, v_dst, k_src, v_src].map(|t| float_prim(t).tensor());
        // in place, as Burn's slice-assign: a shared or overlapping cache is copied first
        let own = |t: Ct| {
            if t.can_mut() && t.is_nonoverlapping() {
                t
            } else {
                t.copy()
            }
        };
        let (dk, dv) = (own(dk), own(dv));
        let ragged = !starts.windows(2).all(|w| w[0] == w[1]);
        // equal starts go as one scalar (`sk` stands in for the unread `starts` binding); a
        // ragged batch uploads its starts
        let st = if ragged {
            ctx_tensor::<F, I, BT>(starts, &device)
        } else {
            sk.clone()
        };
        let id: DType = <I as burn_tensor::Element>::dtype();
        let s4 = |t: &Ct| {
            let s = t.meta.strides();
            [s[0] as u32, s[1] as u32, s[2] as u32, s[3] as u32]
        };
        let ([a0, a1, a2, a3], [b0, b1, b2, b3]) = (s4(&sk), s4(&sv));
        let ([c0, c1, c2, c3], [e0, e1, e2, e3]) = (s4(&dk), s4(&dv));
        let strides = kernels::KvPairStridesLaunch::new(
            a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, e0, e1, e2, e3,
        );
        let fd = dk.dtype;
        let client = dk.client.clone();
        kernels::kv_write_pair_kernel::launch::<CudaRuntime>(
            &client,
            CubeCount::Static(n as u32, h as u32, b as u32),
            CubeDim::new_1d(d as u32),
            sk.into_array_arg(),
            sv.into_array_arg(),
            st.into_array_arg(),
            dk.clone().into_array_arg(),
            dv.clone().into_array_arg(),
            strides,
            starts.first().copied().unwrap_or(0) as u32,
            ragged,
            d,
            [fd.into(), id.into()],
        );
        Ok((
            Tensor::from_primitive(TensorPrimitive::Float(dk)),
            Tensor::from_primitive(TensorPrimitive::Float(dv)),
        ))
    }

    fn pin_host(data: &TensorData, device: &Self::Device) -> Result<Option<crate::PinnedHost>> {
        let shape: Vec<usize> = data.shape.iter().copied().collect();
        let [rows, cols] = shape[..] else {
            return Err(KernelError::Shape {
                name: "data",
                expected: vec![0, 0],
                found: shape,
            });
        };
        let bytes = data.as_bytes();
        let len = rows * cols * data.dtype.size();
        if bytes.len() != len {
            return Err(KernelError::invalid(
                "data",
                format!("{len} bytes for [{rows}, {cols}] of {:?}", data.dtype),
                bytes.len(),
            ));
        }
        make_current(device.index)?;
        // SAFETY: a plain allocation call with the primary context current; the block is
        // freed by `Mem`'s drop.
        let ptr = unsafe { cudarc::driver::result::malloc_host(len.max(1), HOST_ALLOC_PORTABLE) }
            .map_err(|e| driver(&format!("cuMemHostAlloc of {len} bytes"), e))?
            .cast::<u8>();
        // SAFETY: `ptr` holds at least `len` bytes and does not overlap `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, len) };
        Ok(Some(crate::PinnedHost {
            shape: [rows, cols],
            dtype: data.dtype,
            mem: crate::pinned::Mem {
                ptr,
                len,
                device: device.index,
            },
        }))
    }

    fn upload_pinned(host: &crate::PinnedHost, device: &Self::Device) -> Result<Tensor<Self, 2>> {
        let want = <F as burn_tensor::Element>::dtype();
        if host.dtype() != want {
            return Err(KernelError::invalid(
                "host",
                format!("a matrix of the backend's float dtype {want:?}"),
                format!("{:?}", host.dtype()),
            ));
        }
        let bytes = host.as_bytes();
        let client = <CudaRuntime as Runtime>::client(device);
        let handle = client.empty(bytes.len().max(1));
        // binding the buffer orders this thread's stream after any other stream that used the
        // block last (cubecl's stream alignment); the pool may also hand back a block that
        // work queued on this stream still reads. The sync waits for both before the copy,
        // which runs outside cubecl's streams, writes the block.
        let res = client
            .get_resource(handle.clone())
            .map_err(|e| driver("device buffer", e))?;
        cubecl::future::block_on(client.sync()).map_err(|e| driver("stream sync", e))?;
        let dst = res.resource().ptr;
        make_current(device.index)?;
        // SAFETY: `dst` is a live device buffer of at least `bytes.len()` bytes (held by `res`
        // and `handle`); from page-locked memory `cuMemcpyHtoD` returns when the copy is done.
        // cubecl's streams are non-blocking, so the legacy stream this runs on does not wait
        // for (or hold up) their work.
        unsafe { cudarc::driver::result::memcpy_htod_sync(dst, bytes) }
            .map_err(|e| driver(&format!("cuMemcpyHtoD of {} bytes", bytes.len()), e))?;
        drop(res);
        let [rows, cols] = host.dims();
        let t = CubeTensor::new_contiguous(
            client,
            device.clone(),
            Shape::new([rows, cols]),
            handle,
            host.dtype(),
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(t)))
    }

    fn release_uploads(device: &Self::Device) {
        let client = <CudaRuntime as Runtime>::client(device);
        // the first flush moves the staged buffers behind a fence, the second waits on it
        // and frees them
        let _ = client.flush();
        let _ = client.flush();
    }

    fn kv_prefix(k: Tensor<Self, 4>, len: usize) -> Tensor<Self, 4> {
        let [b, h, cap, d] = k.dims();
        let len = len.min(cap);
        if len == cap {
            return k;
        }
        let mut view: Ct = k.into_primitive().tensor();
        // the same buffer, not shortened (that is what needs the alignment), the same
        // strides: positions `len ..` stay in the buffer and out of the shape; with
        // `len < cap` the strides are not contiguous ones, so Burn copies before any op that
        // needs contiguous memory
        view.meta.shape = Shape::from(vec![b, h, len, d]);
        Tensor::from_primitive(TensorPrimitive::Float(view))
    }

    fn memory_usage(device: &Self::Device) -> Option<(u64, u64)> {
        let client = <CudaRuntime as Runtime>::client(device);
        client
            .memory_usage()
            .ok()
            .map(|m| (m.bytes_in_use, m.bytes_reserved))
    }
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> CollectiveOps for Cube<F, I, BT> {
    const COLLECTIVE: bool = true;

    fn all_reduce_sum(x: Tensor<Self, 3>, group: &[Self::Device]) -> Result<Tensor<Self, 3>> {
        use burn_tensor::backend::distributed::{DistributedBackend, ReduceOperation};
        use burn_tensor::backend::DeviceOps;
        crate::check_group(group)?;
        let ids = group.iter().map(DeviceOps::id).collect();
        let prim = x.into_primitive().tensor();
        let out = <Self as DistributedBackend>::all_reduce(prim, ReduceOperation::Sum, ids);
        Ok(Tensor::from_primitive(TensorPrimitive::Float(
            out.resolve(),
        )))
    }
}
