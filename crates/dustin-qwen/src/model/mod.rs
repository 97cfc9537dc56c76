//! The Qwen2 / Llama decoder on Burn.
//!
//! Architecture (HF `modeling_qwen2.py`, `modeling_llama.py`): token embedding; per layer
//! `x + attn(rmsnorm(x))` then `x + mlp(rmsnorm(x))`; final RMSNorm; LM head (tied to the
//! embedding or not). Attention is grouped-query (GQA) with rotate-half RoPE (Su et al. 2021,
//! as HF implements it) and optional q/k/v bias (Qwen2); the MLP is SwiGLU
//! `down(silu(gate(x)) * up(x))` (Shazeer 2020).
//!
//! Every attention layer calls an [`AttentionHook`] before attending: the hook may return a
//! [`LayerSelection`] (sparse attention over selected context positions plus the new tokens)
//! and may read the dense attention probabilities. This is how sparse verification and the
//! estimators' signal taps work without a second forward pass.
//!
//! Shapes: hidden states `[batch, n_new, hidden]`; q `[batch, heads, n_new, head_dim]`;
//! k/v `[batch, kv_heads, seq, head_dim]`.

mod attention;
mod forward;
mod head;
mod layers;
mod load;

pub use head::HeadVocab;
pub use layers::{Layer, Linear, RmsNorm, Rope, RopeAt, Weight};

use std::sync::Arc;

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::Phase;
use dustin_kernels::{KernelConfig, KernelOps, Switch};
use dustin_kv::{DenseKvCache, KvShape};

use crate::blocks::Embedding;
use crate::config::QwenConfig;
use crate::error::{QwenError, Result};
use crate::tp::TpRank;

#[cfg(doc)]
use crate::blocks::WeightFormat;
#[cfg(doc)]
use crate::offload::HostWeight;
#[cfg(doc)]
use dustin_core::{AttentionHook, LayerSelection};
#[cfg(doc)]
use dustin_kernels::MAX_NEW;

/// Which logits a forward pass returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsMode {
    /// Only the last new position of each sequence: `[batch, 1, vocab]`.
    Last,
    /// Every new position: `[batch, n_new, vocab]`.
    All,
    /// No LM head (hidden states only).
    None,
}

/// Options of one forward pass.
#[derive(Debug, Clone, Copy)]
pub struct ForwardOpts {
    /// Pass kind, shown to the hook.
    pub phase: Phase,
    /// Which logits to compute.
    pub logits: LogitsMode,
    /// Run only the first `layers` decoder layers, then the final norm and LM head (early
    /// exit, for self-drafting); `None` runs all.
    pub layers: Option<usize>,
}

/// What a forward pass returns.
#[derive(Debug)]
pub struct ForwardOut<B: Backend> {
    /// Logits `[batch, n, vocab]` (`n` per [`LogitsMode`]); `None` for [`LogitsMode::None`].
    pub logits: Option<Tensor<B, 3>>,
    /// Context positions read per sequence, summed over layers and KV heads.
    pub ctx_reads: Vec<u64>,
    /// Context positions dense attention would have read, per sequence (same sums).
    pub ctx_dense: Vec<u64>,
}

/// A Qwen2 / Llama model on device `B`.
#[derive(Debug, Clone)]
pub struct Qwen2<B: Backend> {
    /// Hyperparameters.
    pub config: QwenConfig,
    /// Token embedding `[vocab, hidden]` (in a random tied model, a transposed view of
    /// `lm_head`'s storage; with [`WeightFormat::Blocks`], the file's blocks, shared with a
    /// tied LM head).
    pub embed: Embedding<B>,
    /// Decoder layers.
    pub layers: Vec<Layer<B>>,
    /// Final RMSNorm.
    pub norm: RmsNorm<B>,
    /// LM head `[hidden, vocab]`, contiguous (a transposed copy of the loaded embedding when
    /// tied; a random tied model's embedding is a view of it; with [`WeightFormat::Blocks`],
    /// the embedding's blocks themselves when tied).
    pub lm_head: Weight<B>,
    /// RoPE tables.
    pub rope: Rope<B>,
    device: B::Device,
    /// Which paths and kernels the forward passes take ([`Qwen2::with_kernel_config`]; its
    /// [`Switch`] fields at `auto` take the backend's defaults), installed for the device at
    /// the start of each forward pass ([`KernelOps::set_kernel_config`](dustin_kernels::KernelBackend::set_kernel_config)).
    kernels: KernelConfig,
    /// Whether the next offloaded layer is staged by a helper thread while the current layer
    /// computes ([`Qwen2::with_prefetch`]).
    prefetch: bool,
    /// This shard's rank and group under tensor parallelism ([`crate::tp`]); `None` for a
    /// whole model.
    tp: Option<TpRank<B>>,
    /// Label under which forward passes time their phases ([`crate::profile`]); `None`: not
    /// profiled.
    profile: Option<&'static str>,
    /// The LM head restricted to part of the vocabulary ([`Qwen2::with_head_vocab`]); `None`:
    /// every id.
    head_subset: Option<Arc<head::HeadSubset<B>>>,
    /// Checked between the layers of a prefill forward pass and between the matrices of a
    /// substitute's quantization ([`Qwen2::with_cancel`]); `None`: both run to their end.
    cancel: Option<dustin_core::CancelToken>,
}

/// CubeCL stream id of the prefetch thread's uploads (a fixed id, so that every upload
/// reuses one stream and its memory pool; CubeCL maps ids to streams modulo 128).
pub(crate) const UPLOAD_STREAM: u64 = 127;

/// Table from HF tensor names to ours (`L` = layer index):
///
/// | HF name | ours |
/// |---|---|
/// | `model.embed_tokens.weight` `[vocab, hidden]` | `embed` |
/// | `model.layers.L.input_layernorm.weight` | `layers[L].input_norm` |
/// | `model.layers.L.self_attn.{q,k,v,o}_proj.{weight,bias}` | `layers[L].{q,k,v,o}` (transposed) |
/// | `model.layers.L.post_attention_layernorm.weight` | `layers[L].post_norm` |
/// | `model.layers.L.mlp.{gate,up,down}_proj.weight` | `layers[L].{gate,up,down}` (transposed) |
/// | `model.norm.weight` | `norm` |
/// | `lm_head.weight` `[vocab, hidden]` (absent when tied) | `lm_head` (transposed) |
pub const WEIGHT_TABLE: &str = "see the doc comment of this constant";

/// The per-layer KV view (and with it every hook's keys and scores) spans a multiple of this
/// many positions: `max(ctx) + n` rounded up, at most the cache's capacity. The view's
/// length then changes once every 64 decoded tokens, not at every step. Each new length gave
/// the element-wise and reduction ops of the selection path (tensors `[batch, kv_heads,
/// len]`) new shapes, and so new vectorizations to compile and new keys to tune on CUDA in
/// the middle of decoding (H200, 2026-11-30: `dustin`'s verification at batch 1 took 144 to
/// 498 ms in four runs of one binary, 233 kernel compilations in a run of 8 iterations). Our
/// choice: 64, the widest vector (8) times 8.
pub const KV_VIEW_MULTIPLE: usize = 64;

impl<B: Backend> Qwen2<B> {
    /// Sets every path and kernel choice at once ([`KernelConfig`]; the default holds the
    /// backend defaults the `with_*` switches below describe). The path switches are read by
    /// this model; the kernel choices by the launch paths of its device, on which each
    /// forward pass installs the whole config ([`KernelOps::set_kernel_config`](dustin_kernels::KernelBackend::set_kernel_config)).
    pub fn with_kernel_config(mut self, kernels: KernelConfig) -> Self {
        self.kernels = kernels;
        self
    }

    /// The path and kernel choices of this model ([`Qwen2::with_kernel_config`]).
    pub fn kernel_config(&self) -> &KernelConfig {
        &self.kernels
    }

    /// Computes the LM head's logits for the ids of `keep` only, every other id's logit
    /// `-inf` (`None`: every id, the default). For a draft model: its LM head is its largest
    /// product, and verification keeps the target's output whatever the draft proposes
    /// ([`HeadVocab`] says which ids and why). The kept rows are copied once (for the
    /// 0.5B's head in `Q8_0`, 32,768 rows are 31 MB).
    ///
    /// # Errors
    /// [`QwenError::ConfigValue`] naming `head_vocab` when an id is outside the vocabulary or
    /// the head is offloaded or packed.
    pub fn with_head_vocab(mut self, keep: Option<&HeadVocab>) -> Result<Self> {
        self.head_subset = match keep {
            Some(k) => Some(Arc::new(head::HeadSubset::new(
                &self.lm_head,
                k,
                &self.device,
            )?)),
            None => None,
        };
        Ok(self)
    }

    /// Ids the LM head computes: `Some(n)` with [`Qwen2::with_head_vocab`], `None` for
    /// every id.
    pub fn head_vocab_len(&self) -> Option<usize> {
        self.head_subset.as_ref().map(|h| h.weight.dims()[1])
    }

    /// Chooses the attention path ([`KernelConfig::attention`]): `Some(true)` the backend's [`KernelOps`] (fused kernels
    /// on CUDA, the host kernels of [`dustin_kernels::cpu_attn`] on the CPU), `Some(false)`
    /// the model's own plain ops, `None` (the default) [`KernelOps::ATTENTION_KERNELS`](dustin_kernels::AttentionOps::ATTENTION_KERNELS). Both
    /// paths compute the same attention; tests use this to check one against the other.
    pub fn with_kernels(mut self, kernels: Option<bool>) -> Self {
        self.kernels.attention = Switch::from(kernels);
        self
    }

    /// Chooses how RMSNorm, the MLP's SwiGLU product, RoPE and the dequantization of packed
    /// substitute weights run: `true` through [`KernelOps::rms_norm`](dustin_kernels::ElementwiseOps::rms_norm),
    /// [`KernelOps::silu_mul`](dustin_kernels::ElementwiseOps::silu_mul), [`KernelOps::rope`](dustin_kernels::ElementwiseOps::rope) and [`KernelOps::dequantize_packed`](dustin_kernels::ElementwiseOps::dequantize_packed) (one
    /// kernel each on CUDA, where the plain ops launch 7, 10, 7 and about 8), `false` the
    /// model's own Burn ops. The default is [`KernelOps::ELEMENTWISE_KERNELS`](dustin_kernels::ElementwiseOps::ELEMENTWISE_KERNELS): on CUDA,
    /// where `dustin-bench kernel-check --device cuda` holds the kernels to float64 references and
    /// they made 7B decoding at 32k 1.1-1.9x faster (docs/perf.md), and on the CPU, whose
    /// RoPE is one host loop with the plain ops' rounding (RMSNorm and the SwiGLU product
    /// are the plain ops there). Packed weights are dequantized by the kernel only where the
    /// backend has fused kernels ([`KernelOps::FUSED`](dustin_kernels::KernelBackend::FUSED)).
    pub fn with_fused_elementwise(mut self, on: bool) -> Self {
        self.kernels.elementwise = Switch::from(on);
        self
    }

    /// Runs linear layers of at most [`KernelOps::skinny_max_rows`](dustin_kernels::LinearOps::skinny_max_rows) rows (decoding and
    /// verification: batch x new tokens) through [`KernelOps::skinny_linear`](dustin_kernels::LinearOps::skinny_linear) (`true`) or
    /// Burn's matmul (`false`). The default is [`KernelOps::SKINNY_GEMM`](dustin_kernels::LinearOps::SKINNY_GEMM): on for CUDA (7B
    /// decoding at batch 1 went from 25.4 to 74.8 tokens/s, the 0.5B draft got 3-5% slower,
    /// docs/perf.md 2026-11-30) and on the CPU (`dustin_kernels::cpu_skinny`: Burn's matmul
    /// packs the weight from 2 rows on); `dustin-bench e2e --skinny-gemm on|off` compares. The same
    /// products up to f32 summation order.
    pub fn with_skinny_gemm(mut self, on: bool) -> Self {
        self.kernels.skinny_gemm = Switch::from(on);
        self
    }

    /// With the skinny GEMM on ([`Qwen2::with_skinny_gemm`]), runs a layer's q, k and v
    /// projections as one [`KernelOps::skinny_linear3`](dustin_kernels::LinearOps::skinny_linear3) and its gate and up projections with
    /// the SiLU product as one [`KernelOps::skinny_swiglu`](dustin_kernels::LinearOps::skinny_swiglu) (`true`): on CUDA 4 launches
    /// instead of 6 and 3 instead of 5 per layer and step (the default wherever the skinny
    /// GEMM is on: checked on the H200 and faster in every row of docs/perf.md, 2026-11-30).
    /// `false` keeps one [`KernelOps::skinny_linear`](dustin_kernels::LinearOps::skinny_linear) per projection. The same values either
    /// way.
    pub fn with_grouped_gemm(mut self, on: bool) -> Self {
        self.kernels.grouped_gemm = Switch::from(on);
        self
    }

    /// Runs the dense attention of prefill chunks (more than [`MAX_NEW`] and at most
    /// [`dustin_kernels::MAX_PREFILL_NEW`] new tokens) through
    /// [`KernelOps::prefill_attention`](dustin_kernels::AttentionOps::prefill_attention) (`true`: on CUDA a flash-attention kernel, with no
    /// score matrix in memory) or the model's own plain ops (`false`: the masked score matrix
    /// of the chunk against its context, Burn's matmul and softmax). The default is `true`
    /// wherever the attention runs through the kernels ([`Qwen2::with_kernels`]). Chunks
    /// whose attention probabilities a hook asks for (H2O, SnapKV observing the prompt) take
    /// the plain path either way. The same attention up to rounding; `dustin-bench bench
    /// --prefill-attention kernel,plain` compares their speed.
    pub fn with_prefill_attention(mut self, on: bool) -> Self {
        self.kernels.prefill_attention = Switch::from(on);
        self
    }

    /// Runs the linear layers of prefill chunks (at least
    /// [`dustin_kernels::PREFILL_GEMM_MIN_ROWS`] rows: batch x new tokens) through
    /// [`KernelOps::prefill_linear`](dustin_kernels::LinearOps::prefill_linear) (`true`: on CUDA cuBLAS where `libcublas` loads) or
    /// Burn's matmul (`false`). The default is `true` on backends with fused kernels (CUDA)
    /// and `false` elsewhere (the CPU, where both are Burn's matmul). The same products up to
    /// rounding (the order of the f32 sums; with a bias cuBLAS rounds once, Burn's matmul and
    /// add twice); `dustin-bench bench --prefill-gemm cublas,burn` compares their
    /// speed.
    pub fn with_prefill_gemm(mut self, on: bool) -> Self {
        self.kernels.prefill_gemm = Switch::from(on);
        self
    }

    /// Runs the linear layers of prefill chunks over block weights
    /// ([`crate::WeightFormat::Blocks`], more rows than the skinny GEMM takes) through
    /// [`KernelOps::quant_prefill_linear`](dustin_kernels::LinearOps::quant_prefill_linear) (`true`: AMX tiles on the CPU, each
    /// operand split into two bf16 parts, within about `2^-15` of the f32 product) or
    /// decodes each weight for Burn's f32 matmul (`false`). The default is `true` where the
    /// backend has the product on this machine
    /// ([`KernelOps::quant_prefill_available`](dustin_kernels::LinearOps::quant_prefill_available)).
    pub fn with_quant_prefill(mut self, on: bool) -> Self {
        self.kernels.quant_prefill = Switch::from(on);
        self
    }

    /// Runs each residual add together with the RMSNorm that follows it as one
    /// [`KernelOps::add_rms_norm`](dustin_kernels::ElementwiseOps::add_rms_norm) (`true`; with the fused element-wise ops on,
    /// [`Qwen2::with_fused_elementwise`]): after attention with the layer's post-attention
    /// norm, and after the MLP with the next layer's input norm (the MLP's output is carried
    /// into the next layer un-added; the last layer's is added before the final norm). On
    /// CUDA that is one kernel where the separate add and norm take two, so two launches
    /// fewer per layer (48 per step of the 24-layer 0.5B draft). Off by default: its GPU
    /// check passed (`dustin-bench kernel-check --device cuda`, H200, 2026-11-30), but turning it on
    /// showed no gain at 7B, 32k (`dustin-bench e2e --fused-residual on`, docs/perf.md). The same
    /// values either way (the sum is rounded to the dtype once, as Burn's add rounds it).
    pub fn with_fused_residual(mut self, on: bool) -> Self {
        self.kernels.fused_residual = Switch::from(on);
        self
    }

    /// Writes each layer's new keys and values into the cache through
    /// [`KernelOps::kv_write_pair`](dustin_kernels::MemoryOps::kv_write_pair) (`true`) instead of Burn's slice-assigns. For a ragged
    /// batch (sequences that accepted different numbers of drafts) the slice-assigns take one
    /// or two launches per sequence, tensor and layer (32-64 per layer at batch 16: a
    /// slice-assign, and the slice of the sequence's rows where Burn copies it), the CUDA
    /// kernel one per layer for keys and values together; equal lengths take two
    /// slice-assigns against the kernel's one launch. On by default
    /// where the backend runs its attention kernels ([`KernelOps::ATTENTION_KERNELS`](dustin_kernels::AttentionOps::ATTENTION_KERNELS)): on the
    /// CPU a host copy into the cache's storage in place, and on CUDA
    /// `dustin-bench kernel-check --device cuda` passed its `kv_write` rows and the model rows
    /// (whose decode step is ragged) on the H200, and a ragged batch of 8 at 7B, 32k decoded
    /// 1.35-1.55x faster with it (docs/perf.md, 2026-11-30). The same cache either way (a
    /// copy).
    pub fn with_kv_write_kernel(mut self, on: bool) -> Self {
        self.kernels.kv_write = Switch::from(on);
        self
    }

    /// Runs each layer's RoPE of its new queries and keys and the cache write of its keys and
    /// values as one [`KernelOps::rope_kv_write`](dustin_kernels::MemoryOps::rope_kv_write)
    /// (`true`; with the fused element-wise ops and the cache-write kernel on), one launch on
    /// CUDA where the separate ops take three. Off by default. The same values either way
    /// (the same rounding as `rope`, and a copy).
    pub fn with_rope_kv_write(mut self, on: bool) -> Self {
        self.kernels.rope_kv_write = Switch::from(on);
        self
    }

    /// Whether an offloaded layer is copied to the device by a helper thread while the layer
    /// before it computes (`true`, the default) or when its turn comes (`false`). Both compute
    /// the same values; the benchmark compares their speed.
    pub fn with_prefetch(mut self, prefetch: bool) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Moves every offloaded weight to page-locked host memory ([`HostWeight::pinned`]), so
    /// each forward pass copies it to the device by one DMA transfer instead of through
    /// Burn's pageable `Tensor::from_data` (1.1-1.5 GB/s measured on the H200 machine,
    /// docs/perf.md). Layer by layer, so host memory holds at most one layer twice. Nothing
    /// changes on backends without page-locked memory (the CPU). The values computed are the
    /// same. Models cloned before share the pageable weights, which then stay alive.
    ///
    /// # Errors
    /// [`QwenError::Kernel`] when the driver cannot lock the memory; the layers pinned by then
    /// stay pinned, the rest pageable, and the model computes as before.
    pub fn pin_offloaded(&mut self) -> Result<()>
    where
        B: KernelOps,
    {
        let dev = self.device.clone();
        for layer in &mut self.layers {
            if !layer.is_offloaded() {
                continue;
            }
            *layer = layer.map_linears(|lin| {
                Ok::<_, QwenError>(Linear {
                    weight: match &lin.weight {
                        Weight::Host(h) => Weight::Host(h.pinned::<B>(&dev)?),
                        w => w.clone(),
                    },
                    bias: lin.bias.clone(),
                })
            })?;
        }
        Ok(())
    }

    /// Whether every offloaded weight is in page-locked host memory (true when none is
    /// offloaded).
    pub fn offloaded_pinned(&self) -> bool {
        self.layers.iter().all(|l| {
            l.linears().iter().all(|lin| match &lin.weight {
                Weight::Host(h) => h.is_pinned(),
                _ => true,
            })
        })
    }

    /// Times every phase of this model's forward passes under `label` (`None`: off, the
    /// default), waiting for the device around each phase; see [`crate::profile`] for the
    /// phases and what the times mean. The times go to [`crate::profile::snapshot`].
    pub fn with_profile(mut self, label: Option<&'static str>) -> Self {
        self.profile = label;
        self
    }

    /// Stops a prefill forward pass between two layers once `token` is set, with
    /// [`CoreError::Cancelled`](dustin_core::CoreError::Cancelled) (Ctrl-C during a long
    /// prompt's prefill: on a CPU a 14k-token prompt takes minutes). The cache then holds
    /// the chunk's keys and values of the layers before that one only: prefill it again.
    /// [`substitute_model`](crate::substitute_model) built from this model checks it between
    /// matrices. Decoding passes do not check it; decoding loops check their own token once
    /// per step.
    pub fn with_cancel(mut self, token: dustin_core::CancelToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Whether [`Qwen2::with_cancel`]'s token is set.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancel
            .as_ref()
            .is_some_and(dustin_core::CancelToken::is_cancelled)
    }

    /// The device the weights live on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Indices of the layers whose weights live in host memory.
    pub fn offloaded_layers(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| self.layers[l].is_offloaded())
            .collect()
    }

    /// Bytes of weights resident on the device: embedding, LM head (counted even where a
    /// random tied model shares the embedding's storage), final norm and every layer's device
    /// weights (packed size for substitute layers, nothing for offloaded matrices).
    pub fn device_bytes(&self) -> usize {
        self.embed.bytes()
            + self.lm_head.device_bytes()
            + self.norm.weight.dims()[0] * self.norm.weight.dtype().size()
            + self.layers.iter().map(Layer::device_bytes).sum::<usize>()
    }

    /// Largest position the RoPE tables cover (exclusive).
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions
    }

    /// `(rank, world)` of this shard under tensor parallelism; `None` for a whole model.
    pub fn tp(&self) -> Option<(usize, usize)> {
        self.tp.as_ref().map(|t| (t.rank, t.world()))
    }

    /// Query heads and KV heads this model (or shard) computes: the config's, divided by the
    /// world size under tensor parallelism.
    pub fn local_heads(&self) -> (usize, usize) {
        let w = self.tp.as_ref().map_or(1, TpRank::world);
        (
            self.config.num_attention_heads / w,
            self.config.kv_heads() / w,
        )
    }

    /// Shape of a KV cache for `batch` sequences of `capacity` tokens over the first `layers`
    /// layers (`None`: all). A `layers` above the model's depth is clamped to it, as the
    /// forward pass clamps it: a cache never holds layers the model does not run.
    pub fn kv_shape(&self, batch: usize, capacity: usize, layers: Option<usize>) -> KvShape {
        let depth = self.layers.len();
        KvShape {
            batch,
            layers: layers.unwrap_or(depth).min(depth),
            kv_heads: self.local_heads().1,
            capacity,
            head_dim: self.config.head_dim(),
        }
    }

    /// Allocates an empty KV cache (see [`Qwen2::kv_shape`]).
    pub fn new_cache(
        &self,
        batch: usize,
        capacity: usize,
        layers: Option<usize>,
    ) -> DenseKvCache<B> {
        DenseKvCache::new(self.kv_shape(batch, capacity, layers), &self.device)
    }
}
