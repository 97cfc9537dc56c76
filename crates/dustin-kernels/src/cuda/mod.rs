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
//!
//! One module per operation family, each holding its launchers and its part of
//! [`KernelOps`], with the family's CubeCL device code in its `kernels` module: `attention`,
//! `selection`, `linear`, `elementwise`, `memory` and `probe` (the launch-cost probe); `mma`
//! holds the tensor-core step the attention and linear kernels share.

mod attention;
pub mod compile_cache;
mod elementwise;
mod linear;
mod memory;
mod mma;
mod probe;
mod selection;

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

pub use attention::*;
use elementwise::ELEM_THREADS;
pub use linear::{AUTO_MMA_MAX_ROWS, AUTO_RING_MIN_ROWS, MMA_MAX_ROWS};
pub(crate) use memory::*;
pub use probe::*;

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
    fill_kernel::launch::<CudaRuntime>(
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

/// Blocks of `ELEM_THREADS` threads for `total` elements, one thread each.
///
/// # Errors
/// [`KernelError::InvalidInput`] when `total` does not fit the kernels' 32-bit indices.
fn elementwise_count(total: usize) -> Result<CubeCount> {
    if total > u32::MAX as usize - ELEM_THREADS {
        return Err(KernelError::invalid(
            "elements",
            format!("at most {}", u32::MAX as usize - ELEM_THREADS),
            total,
        ));
    }
    Ok(CubeCount::Static(total.div_ceil(ELEM_THREADS) as u32, 1, 1))
}

/// `t` as a contiguous tensor (itself when it is one): the reduce kernels index biases flat.
fn contiguous(t: Ct) -> Ct {
    if t.is_contiguous() {
        t
    } else {
        into_contiguous(t)
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

/// [`empty`] in an exact-size buffer of CubeCL's persistent pool
/// (`ComputeClient::memory_persistent_allocation`), for a large scratch buffer of a size that
/// recurs: once it is dropped, the next allocation of the same byte size, by anyone, takes it
/// back (cubecl-runtime 0.10, `MemoryManagement::reserve`), and an explicit cleanup
/// (`Backend::memory_cleanup`) frees it. Why: the dynamic pool serves an allocation of 41.5
/// to 332 MB from a page of 1.33 GB (page sizes of cubecl-runtime 0.10's default pools, as
/// its memory log prints them), which then stays reserved for the process.
fn empty_persistent(t: &Ct, shape: Vec<usize>, dtype: DType) -> Ct {
    let fallback = shape.clone();
    t.client
        .memory_persistent_allocation(shape, |shape| empty(t, shape, dtype))
        .unwrap_or_else(|_| empty(t, fallback, dtype))
}

/// Small integer tables (lengths, head tables, counts) uploaded once per distinct content and
/// device: a decode step calls every layer with the same lengths, and a host-to-device copy
/// per call costs more than the kernels at small sizes. At most [`INT_CACHE`] entries (FIFO);
/// the kernels only read these tensors.
const INT_CACHE: usize = 64;

/// Content, shape, device and integer dtype of a cached table (compared without formatting
/// anything: this runs on every attention and selection call).
type IntKey = (Vec<i64>, Vec<usize>, CudaDevice, DType);

thread_local! {
    static INTS: std::cell::RefCell<std::collections::VecDeque<(IntKey, Ct)>> =
        const { std::cell::RefCell::new(std::collections::VecDeque::new()) };
}

fn int_tensor<F: FloatElement, I: IntElement, BT: BoolElement, const D: usize>(
    vals: Vec<i64>,
    shape: [usize; D],
    device: &<Cube<F, I, BT> as burn_tensor::backend::BackendTypes>::Device,
) -> Ct {
    let key: IntKey = (vals, shape.to_vec(), device.clone(), I::dtype());
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

/// SMs of `t`'s device ([`DEFAULT_SMS`] where it does not say).
fn sm_count(t: &Ct) -> usize {
    t.client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .map_or(DEFAULT_SMS, |n| n as usize)
}

impl<F: FloatElement, I: IntElement, BT: BoolElement> KernelBackend for Cube<F, I, BT> {
    const FUSED: bool = true;

    fn set_kernel_config(device: &Self::Device, config: &KernelConfig) {
        set_config(device, *config);
    }

    fn kernel_config(device: &Self::Device) -> KernelConfig {
        config(device)
    }

    /// `cuda:<ordinal> <card name>` (the driver's `cuDeviceGetName`); `cuda:<ordinal>` alone
    /// where the driver does not answer.
    fn device_description(device: &Self::Device) -> String {
        use cudarc::driver::result as cu;
        let name = cu::init()
            .and_then(|()| cu::device::get(device.index as std::ffi::c_int))
            .and_then(cu::device::get_name);
        match name {
            Ok(n) => format!("cuda:{} {}", device.index, n.trim()),
            Err(_) => format!("cuda:{}", device.index),
        }
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
