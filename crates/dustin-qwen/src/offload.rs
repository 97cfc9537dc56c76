//! Target layers offloaded to host memory, and the plan of which layers fit a GPU budget
//! (SubSpec, "Speculate Deep and Accurate").
//!
//! An offloaded layer keeps its norms and biases on the device and its seven linear weights
//! in host memory ([`HostWeight`], in the backend's float dtype, so a copy moves 2 bytes per
//! weight in bf16). [`crate::Qwen2::forward`] stages such a layer on the device just before it
//! runs ([`crate::model::Layer::staged`]) and drops the copy right after; with prefetching
//! (the default) the next offloaded layer is staged by a helper thread on its own CubeCL
//! stream while the current layer computes, so the copy can overlap the compute.
//!
//! [`plan_offload`] decides how many layers stay resident under a `--gpu-memory` budget:
//! layers fill the GPU from the bottom (layer 0 first), as offloading runtimes do
//! (HF accelerate's `device_map="auto"`), and the remaining top layers are offloaded.

use std::sync::Arc;

use burn_tensor::{backend::Backend, Tensor, TensorData};

use crate::config::QwenConfig;
use crate::error::{QwenError, Result};
use crate::substitute::SubstituteConfig;
use dustin_kernels::KernelOps;

/// A weight matrix `[in, out]` in host memory, in the dtype it will have on the device:
/// pageable (a [`TensorData`]) or, after [`HostWeight::pinned`], page-locked
/// ([`dustin_kernels::PinnedHost`], copied to the device by one DMA transfer).
#[derive(Clone)]
pub struct HostWeight {
    data: Arc<Store>,
}

enum Store {
    Pageable(TensorData),
    Pinned(dustin_kernels::PinnedHost),
}

impl std::fmt::Debug for HostWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dims = self.dims();
        write!(
            f,
            "HostWeight({dims:?}, {:?}, {} bytes{})",
            self.dtype(),
            self.bytes(),
            if self.is_pinned() { ", pinned" } else { "" }
        )
    }
}

impl HostWeight {
    fn pageable(data: TensorData) -> Self {
        Self {
            data: Arc::new(Store::Pageable(data)),
        }
    }

    /// Copies a device weight `[in, out]` to host memory (dtype kept).
    ///
    /// The bytes are copied once more into a buffer of our own. cubecl-cuda 0.10 reads every
    /// device tensor into a slot of its per-stream page-locked host pool
    /// (`read_async` -> `reserve_cpu(.., marked_pinned = true)`), and that pool never gives
    /// memory back (`memory_cleanup` cleans the device pool only). Holding the read itself
    /// would keep one pool slot per offloaded matrix: at Qwen2.5-32B with 60 offloaded layers,
    /// 56 GB of the host held by the pool, and the same again once [`HostWeight::pinned`]
    /// copies them (the host's out-of-memory killer ended that run, docs/perf.md). Dropping
    /// the read at once lets the next matrix's read reuse the slot.
    pub fn from_device<B: Backend>(w: &Tensor<B, 2>) -> Self {
        let read = w.clone().into_data();
        let owned =
            TensorData::from_bytes_vec(read.as_bytes().to_vec(), read.shape.clone(), read.dtype);
        drop(read);
        Self::pageable(owned)
    }

    /// A host weight `[rows, cols]` from row-major f32 values, converted to the float dtype
    /// of backend `B` (bf16 on our CUDA backend), so uploads need no conversion.
    pub fn from_f32<B: Backend>(values: Vec<f32>, rows: usize, cols: usize) -> Self {
        let dtype = <B::FloatElem as burn_tensor::Element>::dtype();
        Self::pageable(TensorData::new(values, [rows, cols]).convert_dtype(dtype))
    }

    /// `[in, out]`.
    pub fn dims(&self) -> [usize; 2] {
        match &*self.data {
            Store::Pageable(d) => [
                d.shape.first().copied().unwrap_or(0),
                d.shape.get(1).copied().unwrap_or(0),
            ],
            Store::Pinned(p) => p.dims(),
        }
    }

    fn dtype(&self) -> burn_tensor::DType {
        match &*self.data {
            Store::Pageable(d) => d.dtype,
            Store::Pinned(p) => p.dtype(),
        }
    }

    /// Bytes held in host memory.
    pub fn bytes(&self) -> usize {
        match &*self.data {
            Store::Pageable(d) => d.bytes.len(),
            Store::Pinned(p) => p.bytes(),
        }
    }

    /// Whether the weight is in page-locked memory.
    pub fn is_pinned(&self) -> bool {
        matches!(&*self.data, Store::Pinned(_))
    }

    /// This weight in page-locked host memory for uploads to `device`
    /// ([`KernelOps::pin_host`](dustin_kernels::MemoryOps::pin_host)), or a shared handle to itself where backend `B` has no
    /// page-locked memory (the CPU) or it already is. The pageable copy is dropped with the
    /// last handle to it.
    ///
    /// # Errors
    /// [`QwenError::Kernel`] when the driver cannot lock the memory.
    pub fn pinned<B: KernelOps>(&self, device: &B::Device) -> Result<Self> {
        match &*self.data {
            Store::Pinned(_) => Ok(self.clone()),
            Store::Pageable(d) => Ok(match B::pin_host(d, device)? {
                Some(p) => Self {
                    data: Arc::new(Store::Pinned(p)),
                },
                None => self.clone(),
            }),
        }
    }

    /// A device copy of the weight through Burn's `Tensor::from_data` (pageable host memory;
    /// a page-locked weight is first copied to a pageable buffer).
    pub fn upload<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2> {
        match &*self.data {
            Store::Pageable(d) => Tensor::from_data(d.clone(), device),
            Store::Pinned(p) => Tensor::from_data(p.to_data(), device),
        }
    }

    /// A device copy of the weight, by one DMA transfer when it is page-locked
    /// ([`KernelOps::upload_pinned`](dustin_kernels::MemoryOps::upload_pinned)); [`HostWeight::upload`] otherwise, or when the driver
    /// refuses the transfer (the values are the same either way, only the speed differs; such
    /// fallbacks are counted, [`pinned_fallbacks`]).
    pub fn upload_fast<B: KernelOps>(&self, device: &B::Device) -> Tensor<B, 2> {
        match &*self.data {
            Store::Pinned(p) => B::upload_pinned(p, device).unwrap_or_else(|_| {
                PINNED_FALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.upload(device)
            }),
            Store::Pageable(_) => self.upload(device),
        }
    }

    /// The values as f32, row-major `[in, out]`.
    ///
    /// # Errors
    /// [`QwenError::Core`] if the stored dtype cannot be converted.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let data = match &*self.data {
            Store::Pageable(d) => d.clone(),
            Store::Pinned(p) => p.to_data(),
        };
        data.convert::<f32>()
            .into_vec::<f32>()
            .map_err(|e| QwenError::Core(dustin_core::CoreError::Model(format!("{e:?}"))))
    }
}

static PINNED_FALLBACKS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Page-locked uploads the driver refused since the process started, each copied through
/// pageable memory instead ([`HostWeight::upload_fast`]); benchmarks report it next to their
/// copy rate.
pub fn pinned_fallbacks() -> usize {
    PINNED_FALLBACKS.load(std::sync::atomic::Ordering::Relaxed)
}

/// What the device allocator holds, bytes `(in use, reserved)`, summed over the calling
/// thread's CubeCL stream and the prefetch thread's stream (each stream has its own pool);
/// `None` where the backend does not say ([`KernelOps::memory_usage`](dustin_kernels::MemoryOps::memory_usage)).
pub fn memory_usage<B: KernelOps>(device: &B::Device) -> Option<(u64, u64)> {
    let main = B::memory_usage(device)?;
    let upload = cubecl_common::stream_id::StreamId {
        value: crate::model::UPLOAD_STREAM,
    }
    .executes(|| B::memory_usage(device))
    .unwrap_or((0, 0));
    Some((main.0 + upload.0, main.1 + upload.1))
}

/// Releases the blocks the device allocator keeps for reuse, on the calling thread's stream
/// and the prefetch stream ([`Backend::memory_cleanup`]).
pub fn memory_cleanup<B: Backend>(device: &B::Device) {
    B::memory_cleanup(device);
    cubecl_common::stream_id::StreamId {
        value: crate::model::UPLOAD_STREAM,
    }
    .executes(|| B::memory_cleanup(device));
}

/// [`dustin_core::memory::release_freed`] on the calling thread's stream and on the prefetch
/// stream: each one's pools cleaned up and the stream synchronised, so that the releases
/// CubeCL queues on a stream are carried out now (cubecl-cuda 0.10 frees queued buffers when
/// the stream is flushed; [`dustin_core::memory::release_freed`] says more): for the end of
/// a phase whose temporaries decoding never asks for again (a prefill's per-sequence caches
/// and chunk activations, a loader's staging buffers), so that they do not stay reserved
/// through the decoding and add to the process's peak.
///
/// # Errors
/// [`QwenError::Core`] when the device reports an execution error at
/// a synchronisation.
pub fn release_freed<B: Backend>(device: &B::Device) -> crate::Result<()> {
    dustin_core::memory::release_freed::<B>(device)?;
    cubecl_common::stream_id::StreamId {
        value: crate::model::UPLOAD_STREAM,
    }
    .executes(|| dustin_core::memory::release_freed::<B>(device))?;
    Ok(())
}

/// Which target layers stay on the GPU under a memory budget, and the bytes behind it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OffloadPlan {
    /// The budget, bytes.
    pub budget_bytes: u64,
    /// Layers resident on the GPU (`0 .. resident`).
    pub resident: usize,
    /// Layers offloaded to host memory (`resident .. num_layers`).
    pub offloaded: Vec<usize>,
    /// Embedding, LM head, final norm: always resident.
    pub fixed_bytes: u64,
    /// One decoder layer's weights in the compute dtype.
    pub layer_bytes: u64,
    /// What an offloaded layer keeps on the device: its norms and biases, plus its substitute's
    /// packed matrices when a substitute draft is used.
    pub substitute_layer_bytes: u64,
    /// Device copies of offloaded layers alive at once (1, or 2 with prefetching) and the
    /// dequantized copy of the largest substitute matrix.
    pub staging_bytes: u64,
    /// Everything else the caller keeps on the device: KV caches, a separate draft's weights.
    pub other_bytes: u64,
    /// The sum the plan fits under the budget.
    pub total_bytes: u64,
}

/// Plans which layers of a `config` model stay on a GPU of `budget_bytes`: the fewest
/// offloaded layers (taken from the top) such that
///
/// ```text
/// fixed + resident * layer + offloaded * substitute_layer + staging + other <= budget
/// ```
///
/// where `fixed` = embedding + LM head (`2 * vocab * hidden` weights: the LM head is its own
/// matrix even when tied, see [`crate::Qwen2::load`]) + final norm, `layer` = one decoder
/// layer's weights (seven matrices, biases, two norms), all at `dtype_bytes` per weight (2 for
/// bf16); `substitute_layer` = the layer's norms and biases, plus its seven matrices at
/// [`SubstituteConfig::bytes_per_weight`] when `substitute` is given; `staging` = one layer
/// (two with `prefetch`) when anything is offloaded, plus the largest matrix dequantized
/// when a substitute is used; `other` = what the caller keeps beside the model (KV caches, a
/// separate draft's weights). Activations and the allocator's slack are not counted: leave
/// room for them in the budget.
///
/// # Errors
/// [`QwenError::ConfigValue`] naming `gpu_memory` when no placement fits, with the smallest
/// budget that would; naming `dtype_bytes` for a non-positive size, or the substitute's
/// settings when they are invalid.
pub fn plan_offload(
    config: &QwenConfig,
    budget_bytes: u64,
    dtype_bytes: f64,
    other_bytes: u64,
    substitute: Option<SubstituteConfig>,
    prefetch: bool,
) -> Result<OffloadPlan> {
    if !(dtype_bytes.is_finite() && dtype_bytes > 0.0) {
        return Err(QwenError::ConfigValue {
            key: "dtype_bytes",
            value: dtype_bytes.to_string(),
            expected: "a positive number of bytes per weight (2 for bf16)".into(),
        });
    }
    if let Some(s) = substitute {
        s.validate()?;
    }
    let c = config;
    let (h, i, nh, kv, d) = (
        c.hidden_size as f64,
        c.intermediate_size as f64,
        c.num_attention_heads as f64,
        c.kv_heads() as f64,
        c.head_dim() as f64,
    );
    let matrices = c.layer_matrix_weights();
    let small = if c.qkv_bias() {
        nh * d + 2.0 * kv * d
    } else {
        0.0
    } + 2.0 * h;
    let layer = ((matrices + small) * dtype_bytes).ceil() as u64;
    let fixed = ((2.0 * c.vocab_size as f64 * h + h) * dtype_bytes).ceil() as u64;
    let (sub_layer, dequant) = match substitute {
        Some(s) => (
            (matrices * s.bytes_per_weight() + small * dtype_bytes).ceil() as u64,
            (h * i * dtype_bytes).ceil() as u64,
        ),
        None => ((small * dtype_bytes).ceil() as u64, 0),
    };
    let n = c.num_hidden_layers;
    let staged: u64 = if prefetch { 2 } else { 1 };
    // saturating: a config of absurd sizes gives u64::MAX, which fits no budget
    let staging = |off: usize| -> u64 {
        if off > 0 {
            staged.saturating_mul(layer).saturating_add(dequant)
        } else {
            0
        }
    };
    let total = |off: usize| -> u64 {
        fixed
            .saturating_add(((n - off) as u64).saturating_mul(layer))
            .saturating_add((off as u64).saturating_mul(sub_layer))
            .saturating_add(staging(off))
            .saturating_add(other_bytes)
    };
    let off = (0..=n)
        .find(|&off| total(off) <= budget_bytes)
        .ok_or_else(|| QwenError::ConfigValue {
            key: "gpu_memory",
            value: format!("{budget_bytes} bytes"),
            expected: format!(
                "at least {} bytes for this model (its cheapest placement)",
                (0..=n).map(total).min().unwrap_or(u64::MAX)
            ),
        })?;
    Ok(OffloadPlan {
        budget_bytes,
        resident: n - off,
        offloaded: (n - off..n).collect(),
        fixed_bytes: fixed,
        layer_bytes: layer,
        substitute_layer_bytes: sub_layer,
        staging_bytes: staging(off),
        other_bytes,
        total_bytes: total(off),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen2.5-7B-Instruct's `config.json` (the values of `../shared/data/qwen2.5/`).
    fn cfg7b() -> QwenConfig {
        let json = r#"{"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944,
            "max_position_embeddings": 32768, "num_attention_heads": 28,
            "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0, "tie_word_embeddings": false, "vocab_size": 152064}"#;
        QwenConfig::from_json(json, "7B").unwrap()
    }

    #[test]
    fn qwen_7b_at_8_gib_by_hand() {
        // Qwen2.5-7B (config.json): hidden 3584, intermediate 18944, 28 heads, 4 KV heads,
        // head_dim 128, vocab 152064, 28 layers, q/k/v bias.
        // layer weights: 2*3584*3584 + 2*3584*512 + 3*3584*18944 = 233_046_016;
        // small: 3584 + 2*512 (bias) + 2*3584 (norms) = 11_776 -> 233_057_792 * 2 bytes
        let c = cfg7b();
        let p = plan_offload(&c, 8 << 30, 2.0, 0, None, false).unwrap();
        assert_eq!(p.layer_bytes, 466_115_584);
        // fixed: (2 * 152064 * 3584 + 3584) * 2
        assert_eq!(p.fixed_bytes, 2_179_996_672);
        // 8 GiB = 8_589_934_592; r resident with fixed + r * layer + one staged layer (+ the
        // norms and biases of the offloaded ones) <= budget:
        // (8_589_934_592 - 2_179_996_672 - 466_115_584) / 466_115_584 = 12.75 -> 12 resident
        assert_eq!(p.resident, 12);
        assert_eq!(p.offloaded, (12..28).collect::<Vec<_>>());
        assert!(p.total_bytes <= 8 << 30);
        // the whole model fits 16 GiB: nothing offloaded, no staging
        let all = plan_offload(&c, 16 << 30, 2.0, 0, None, true).unwrap();
        assert_eq!((all.resident, all.staging_bytes), (28, 0));
    }

    #[test]
    fn a_substitute_takes_room_and_too_small_a_budget_is_named() {
        let c = cfg7b();
        let sub = SubstituteConfig::default();
        let p = plan_offload(&c, 8 << 30, 2.0, 0, Some(sub), true).unwrap();
        // 4-bit group 64: 0.5625 bytes per weight of the 233_046_016 matrix weights + 23_552
        // bytes of norms and biases
        assert_eq!(
            p.substitute_layer_bytes,
            (233_046_016.0f64 * 0.5625).ceil() as u64 + 23_552
        );
        assert!(p.resident < 12 && p.total_bytes <= 8 << 30);
        let err = plan_offload(&c, 1 << 30, 2.0, 0, Some(sub), true).unwrap_err();
        assert!(err.to_string().contains("gpu_memory"), "{err}");
    }

    #[test]
    fn the_error_quotes_the_cheapest_placement_and_nonsense_is_named() {
        let c = cfg7b();
        // 8-bit groups of 1 cost more per weight (1 + 4 bytes) than bf16 (2): keeping every
        // layer resident is the cheapest placement, 15.2 GB
        let wide = SubstituteConfig { bits: 8, group: 1 };
        let all_resident = plan_offload(&c, u64::MAX, 2.0, 0, Some(wide), true)
            .unwrap()
            .total_bytes;
        let err = plan_offload(&c, 1 << 30, 2.0, 0, Some(wide), true)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("at least {all_resident} bytes")),
            "{err}"
        );
        for bad in [0.0, -2.0, f64::NAN] {
            let e = plan_offload(&c, 8 << 30, bad, 0, None, true).unwrap_err();
            assert!(e.to_string().contains("dtype_bytes"), "{e}");
        }
        let e = plan_offload(
            &c,
            8 << 30,
            2.0,
            0,
            Some(SubstituteConfig { bits: 0, group: 0 }),
            true,
        )
        .unwrap_err();
        assert!(e.to_string().contains("substitute.bits"), "{e}");
        // sizes that overflow u64 fit no budget, without a panic
        let huge = QwenConfig {
            hidden_size: 1 << 24,
            intermediate_size: 1 << 24,
            vocab_size: 1 << 24,
            num_hidden_layers: 1 << 24,
            ..c.clone()
        };
        assert!(plan_offload(&huge, 8 << 30, 2.0, u64::MAX, None, true).is_err());
    }
}
