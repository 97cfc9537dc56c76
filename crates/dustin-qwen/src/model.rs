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

use burn_tensor::{activation, backend::Backend, Int, Tensor, TensorData};
use dustin_core::{AttentionHook, KvStore, KvView, LayerAttnCtx, LayerSelection, Phase};
use dustin_kernels::{KernelError, KernelOps, MAX_NEW, MAX_PREFILL_NEW};
use dustin_kv::{DenseKvCache, KvShape};

use std::sync::Arc;

use dustin_kernels::cpu_quant::QuantMatrix;

use crate::blocks::{Embedding, WeightFormat};
use crate::config::QwenConfig;
use crate::error::{QwenError, Result};
use crate::offload::HostWeight;
use crate::profile::Timer;
use crate::tp::{check_divisible, TpRank};
use crate::weights::{HostTensor, WeightSource};

/// Where and in what form a linear layer's weight `[in, out]` lives.
#[derive(Debug, Clone)]
pub enum Weight<B: Backend> {
    /// On the device in the backend's float dtype, `[in, out]`.
    Dense(Tensor<B, 2>),
    /// On the device as packed group-quantized codes (a SubSpec substitute,
    /// [`crate::substitute::PackedWeight`]), dequantized for each product.
    Packed(crate::substitute::PackedWeight<B>),
    /// In host memory (an offloaded target layer, [`crate::offload::HostWeight`]), copied to
    /// the device for each product unless the forward pass staged the layer first.
    Host(crate::offload::HostWeight),
    /// In host memory as the GGUF file stores it, `[out, in]` in blocks
    /// ([`crate::WeightFormat::Blocks`]), multiplied by [`KernelOps::quant_linear`] where the
    /// backend has block kernels ([`KernelOps::QUANT_KERNELS`]), else dequantized for each
    /// product.
    Blocks(Arc<QuantMatrix>),
}

impl<B: Backend> Weight<B> {
    /// `[in, out]`.
    pub fn dims(&self) -> [usize; 2] {
        match self {
            Weight::Dense(w) => w.dims(),
            Weight::Packed(p) => [p.rows, p.cols],
            Weight::Host(h) => h.dims(),
            Weight::Blocks(q) => [q.cols(), q.rows()],
        }
    }

    /// The weight as a dense device tensor `[in, out]`: the tensor itself, the dequantized
    /// codes, a copy uploaded from host memory to `device`, or the decoded blocks.
    ///
    /// # Errors
    /// [`QwenError::Format`] when blocks cannot be decoded.
    pub fn to_dense(&self, device: &B::Device) -> Result<Tensor<B, 2>> {
        Ok(match self {
            Weight::Dense(w) => w.clone(),
            Weight::Packed(p) => p.dequantize(),
            Weight::Host(h) => h.upload(device),
            Weight::Blocks(q) => crate::blocks::dense_t(q, device)?,
        })
    }

    /// Bytes this weight holds on the device (0 for an offloaded host weight; the blocks'
    /// bytes for a block weight, which lives in the host memory the CPU backend computes in).
    pub fn device_bytes(&self) -> usize {
        match self {
            Weight::Dense(w) => w.dims().iter().product::<usize>() * w.dtype().size(),
            Weight::Packed(p) => p.device_bytes(),
            Weight::Host(_) => 0,
            Weight::Blocks(q) => q.bytes(),
        }
    }
}

/// A linear layer `y = x W + b` with `W` stored `[in, out]` (transposed from HF's `[out, in]`).
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    /// Weight `[in_features, out_features]`.
    pub weight: Weight<B>,
    /// Bias `[out_features]`.
    pub bias: Option<Tensor<B, 1>>,
}

impl<B: Backend> Linear<B> {
    /// A linear layer over a dense device weight `[in, out]`.
    pub fn dense(weight: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Self {
        Self {
            weight: Weight::Dense(weight),
            bias,
        }
    }

    /// Applies the layer to `x` of shape `[batch, n, in]`, giving `[batch, n, out]`, with
    /// the weight made dense first ([`Weight::to_dense`]).
    ///
    /// # Errors
    /// As [`Weight::to_dense`].
    pub fn forward(&self, x: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
        let w = self.weight.to_dense(&x.device())?;
        Ok(self.forward_dense(x, w))
    }

    /// [`Linear::forward`] with the weight already dense on the device, `w` `[in, out]`.
    fn forward_dense(&self, x: Tensor<B, 3>, w: Tensor<B, 2>) -> Tensor<B, 3> {
        let [b, n, d] = x.dims();
        let out = w.dims()[1];
        let y = x.reshape([b * n, d]).matmul(w);
        let y = match &self.bias {
            Some(bias) => y + bias.clone().unsqueeze::<2>(),
            None => y,
        };
        y.reshape([b, n, out])
    }
}

/// RMSNorm (Zhang & Sennrich 2019): `x / sqrt(mean(x^2) + eps) * weight`.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: Backend> {
    /// Scale `[hidden]`.
    pub weight: Tensor<B, 1>,
    /// Epsilon from `rms_norm_eps`.
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Normalises the last dimension of `x` `[batch, n, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let ms = x.clone().powi_scalar(2).mean_dim(2);
        let inv = (ms + self.eps).sqrt().recip();
        x * inv * self.weight.clone().unsqueeze::<3>()
    }
}

/// Rotate-half RoPE tables, full head width: `cos` `[max_positions, head_dim]` holds
/// `[cos, cos]` and `sin` `[max_positions, head_dim]` holds `[-sin, sin]`, so that
/// `rotate_half(x) * [sin, sin] = swap_halves(x) * [-sin, sin]` (one negation fewer per call).
///
/// `inv_freq[i] = theta^(-2i / head_dim)` and angle `= position * inv_freq[i]`, computed in
/// f64 and rounded to the compute dtype (HF `Qwen2RotaryEmbedding`, default rope type).
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
    half: usize,
    max_positions: usize,
}

impl<B: Backend> Rope<B> {
    /// Builds tables for positions `0 .. max_positions`.
    pub fn new(theta: f64, head_dim: usize, max_positions: usize, device: &B::Device) -> Self {
        let half = head_dim / 2;
        let width = 2 * half;
        let mut cos = vec![0f32; max_positions * width];
        let mut sin = vec![0f32; max_positions * width];
        for p in 0..max_positions {
            for i in 0..half {
                let inv = theta.powf(-(2.0 * i as f64) / head_dim as f64);
                let a = p as f64 * inv;
                let (c, s) = (a.cos() as f32, a.sin() as f32);
                let row = p * width;
                cos[row + i] = c;
                cos[row + half + i] = c;
                sin[row + i] = -s;
                sin[row + half + i] = s;
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, [max_positions, width]), device),
            sin: Tensor::from_data(TensorData::new(sin, [max_positions, width]), device),
            half,
            max_positions,
        }
    }

    /// The tables at `positions` `[batch * n]` (row-major `[batch, n]`), gathered once per
    /// forward pass and shared by every layer's queries and keys.
    pub fn at(&self, positions: Tensor<B, 1, Int>, batch: usize, n: usize) -> RopeAt<B> {
        let width = 2 * self.half;
        RopeAt {
            cos: self
                .cos
                .clone()
                .select(0, positions.clone())
                .reshape([batch, 1, n, width]),
            sin: self
                .sin
                .clone()
                .select(0, positions)
                .reshape([batch, 1, n, width]),
            half: self.half,
        }
    }

    /// Rotates `x` `[batch, heads, n, head_dim]` at `positions` `[batch * n]` (row-major
    /// `[batch, n]`); the same as `self.at(positions, batch, n).apply(x)`.
    pub fn apply(&self, x: Tensor<B, 4>, positions: Tensor<B, 1, Int>) -> Tensor<B, 4> {
        let [b, _, n, _] = x.dims();
        self.at(positions, b, n).apply(x)
    }
}

/// RoPE tables gathered at one forward pass's positions ([`Rope::at`]): `cos`, signed `sin`
/// `[batch, 1, n, head_dim]`.
#[derive(Debug, Clone)]
pub struct RopeAt<B: Backend> {
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
    half: usize,
}

impl<B: Backend> RopeAt<B> {
    /// Rotates `x` `[batch, heads, n, head_dim]`: `x * cos + rotate_half(x) * sin`, with
    /// `rotate_half(x) = [-x2, x1]` (HF `apply_rotary_pos_emb`), computed as
    /// `[x2, x1] * [-sin, sin]`: the same products, so the same values in every dtype.
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, h, n, d] = x.dims();
        let x1 = x.clone().slice([0..b, 0..h, 0..n, 0..self.half]);
        let x2 = x.clone().slice([0..b, 0..h, 0..n, self.half..d]);
        let swapped = Tensor::cat(vec![x2, x1], 3);
        x * self.cos.clone() + swapped * self.sin.clone()
    }
}

/// One decoder layer's weights.
#[derive(Debug, Clone)]
pub struct Layer<B: Backend> {
    /// Pre-attention RMSNorm.
    pub input_norm: RmsNorm<B>,
    /// Query projection `[hidden, heads * head_dim]`.
    pub q: Linear<B>,
    /// Key projection `[hidden, kv_heads * head_dim]`.
    pub k: Linear<B>,
    /// Value projection `[hidden, kv_heads * head_dim]`.
    pub v: Linear<B>,
    /// Output projection `[heads * head_dim, hidden]`.
    pub o: Linear<B>,
    /// Pre-MLP RMSNorm.
    pub post_norm: RmsNorm<B>,
    /// SwiGLU gate `[hidden, intermediate]`.
    pub gate: Linear<B>,
    /// SwiGLU up `[hidden, intermediate]`.
    pub up: Linear<B>,
    /// SwiGLU down `[intermediate, hidden]`.
    pub down: Linear<B>,
}

impl<B: Backend> Layer<B> {
    /// The seven linear layers: q, k, v, o, gate, up, down.
    pub fn linears(&self) -> [&Linear<B>; 7] {
        [
            &self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down,
        ]
    }

    /// A copy of this layer whose seven linear layers are `f` of the originals (q, k, v, o,
    /// gate, up, down in that order); the norms are shared.
    ///
    /// # Errors
    /// The first error `f` returns.
    pub fn map_linears<E>(
        &self,
        mut f: impl FnMut(&Linear<B>) -> std::result::Result<Linear<B>, E>,
    ) -> std::result::Result<Self, E> {
        Ok(Self {
            input_norm: self.input_norm.clone(),
            q: f(&self.q)?,
            k: f(&self.k)?,
            v: f(&self.v)?,
            o: f(&self.o)?,
            post_norm: self.post_norm.clone(),
            gate: f(&self.gate)?,
            up: f(&self.up)?,
            down: f(&self.down)?,
        })
    }

    /// [`Layer::map_linears`] with a function that cannot fail.
    fn map_each(&self, mut f: impl FnMut(&Linear<B>) -> Linear<B>) -> Self {
        let r: std::result::Result<Self, std::convert::Infallible> = self.map_linears(|l| Ok(f(l)));
        match r {
            Ok(layer) => layer,
            Err(never) => match never {},
        }
    }

    /// Whether any of its weights lives in host memory (an offloaded layer).
    pub fn is_offloaded(&self) -> bool {
        self.linears()
            .iter()
            .any(|l| matches!(l.weight, Weight::Host(_)))
    }

    /// Bytes of the layer's weights resident on the device (norms and biases included).
    pub fn device_bytes(&self) -> usize {
        let vec_bytes = |t: &Tensor<B, 1>| t.dims()[0] * t.dtype().size();
        let lin = self
            .linears()
            .iter()
            .map(|l| l.weight.device_bytes() + l.bias.as_ref().map_or(0, vec_bytes))
            .sum::<usize>();
        lin + vec_bytes(&self.input_norm.weight) + vec_bytes(&self.post_norm.weight)
    }
}

impl<B: KernelOps> Layer<B> {
    /// This layer with every host weight copied to `device` (dense); device weights are
    /// shared. The copy is what an offloaded layer's forward pass computes with. The seven
    /// copies run on seven threads (host-side staging copies in parallel), all issued on the
    /// calling thread's CubeCL stream.
    pub fn staged(&self, device: &B::Device) -> Self {
        self.staged_on(device, cubecl_common::stream_id::StreamId::current())
    }

    fn staged_on(&self, device: &B::Device, stream: cubecl_common::stream_id::StreamId) -> Self {
        let uploads: Vec<Option<Tensor<B, 2>>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .linears()
                .into_iter()
                .map(|l| match &l.weight {
                    Weight::Host(h) => {
                        Some(s.spawn(move || stream.executes(|| h.upload_fast::<B>(device))))
                    }
                    _ => None,
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.and_then(|h| h.join().ok()))
                .collect()
        });
        // CubeCL keeps each upload's host buffer in its stream's drop queue until the stream
        // launches enough kernels or is flushed; the prefetch stream launches none, so without
        // the release every staged layer's host copy stays alive (two 32B runs were killed for
        // host memory; a sync alone does not empty the queue). Syncing also means the copies
        // are done before the layer is used.
        if uploads.iter().any(Option::is_some) {
            let _ = stream.executes(|| {
                let r = B::sync(device);
                B::release_uploads(device);
                r
            });
        }
        let mut uploads = uploads.into_iter();
        self.map_each(|l| match (uploads.next().flatten(), &l.weight) {
            (Some(w), _) => Linear::dense(w, l.bias.clone()),
            // a host weight whose upload thread panicked is uploaded here (and panics here,
            // with its message)
            (None, Weight::Host(h)) => Linear::dense(h.upload_fast::<B>(device), l.bias.clone()),
            (None, _) => l.clone(),
        })
    }
}

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
    /// Whether attention runs through the backend's [`KernelOps`] kernels (`None`: when the
    /// backend has them, [`KernelOps::ATTENTION_KERNELS`]).
    kernels: Option<bool>,
    /// Whether RMSNorm, the SwiGLU product and RoPE run as the backend's kernels
    /// ([`Qwen2::with_fused_elementwise`]; by default [`KernelOps::ELEMENTWISE_KERNELS`]:
    /// `None`), and the dequantization of packed weights too where the backend has fused
    /// kernels ([`KernelOps::FUSED`]).
    elementwise: Option<bool>,
    /// Whether linear layers of at most [`KernelOps::skinny_max_rows`] rows run through
    /// [`KernelOps::skinny_linear`] ([`Qwen2::with_skinny_gemm`]; by default
    /// [`KernelOps::SKINNY_GEMM`]: `None`).
    skinny_gemm: Option<bool>,
    /// Whether the q/k/v projections and the MLP's gate/up/SiLU of at most
    /// [`KernelOps::skinny_max_rows`] rows run as one grouped skinny GEMM each
    /// ([`KernelOps::skinny_linear3`], [`KernelOps::skinny_swiglu`];
    /// [`Qwen2::with_grouped_gemm`]; by default exactly when the skinny GEMM is on: `None`).
    grouped_gemm: Option<bool>,
    /// Whether dense attention of more than [`MAX_NEW`] new tokens (prefill chunks) runs
    /// through [`KernelOps::prefill_attention`] ([`Qwen2::with_prefill_attention`]; by
    /// default exactly when the attention runs through the kernels: `None`).
    prefill_kernel: Option<bool>,
    /// Whether each residual add runs with the RMSNorm after it as one
    /// [`KernelOps::add_rms_norm`] ([`Qwen2::with_fused_residual`]; off unless asked for:
    /// `None`).
    fused_residual: Option<bool>,
    /// Whether linear layers of at least [`dustin_kernels::PREFILL_GEMM_MIN_ROWS`] rows run
    /// through [`KernelOps::prefill_linear`] ([`Qwen2::with_prefill_gemm`]; by default exactly
    /// when the backend has fused kernels: `None`).
    prefill_gemm: Option<bool>,
    /// Whether new keys and values go into the cache through [`KernelOps::kv_write`]
    /// ([`Qwen2::with_kv_write_kernel`]; by default exactly when the backend has fused
    /// kernels: `None`).
    kv_write_kernel: Option<bool>,
    /// Whether the next offloaded layer is staged by a helper thread while the current layer
    /// computes ([`Qwen2::with_prefetch`]).
    prefetch: bool,
    /// This shard's rank and group under tensor parallelism ([`crate::tp`]); `None` for a
    /// whole model.
    tp: Option<TpRank<B>>,
    /// Label under which forward passes time their phases ([`crate::profile`]); `None`: not
    /// profiled.
    profile: Option<&'static str>,
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

struct Loader<'a, B: Backend> {
    src: &'a dyn WeightSource,
    device: &'a B::Device,
    /// whether linear weights go to host memory (an offloaded layer)
    offload: bool,
    /// whether block weights stay in their blocks
    format: WeightFormat,
}

impl<B: Backend> Loader<'_, B> {
    /// The embedding and the LM head (the embedding's transpose, or its blocks, when tied or
    /// when the source has no `lm_head.weight`).
    fn embed_and_head(&self, c: &QwenConfig) -> Result<(Embedding<B>, Weight<B>)> {
        let (v, h) = (c.vocab_size, c.hidden_size);
        let untied = self.src.contains("lm_head.weight") && !c.tie_word_embeddings;
        // a tied head: the embedding's blocks, or its transpose (contiguous `[hidden, vocab]`
        // for the skinny GEMM)
        let (embed, tied_head) = match self.blocks("model.embed_tokens.weight", v, h)? {
            Some(e) => (Embedding::Blocks(e.clone()), Some(Weight::Blocks(e))),
            None => {
                let e = self.host("model.embed_tokens.weight", &[v, h])?;
                let head = (!untied).then(|| {
                    let t = transpose(&e.data, v, h);
                    Weight::Dense(Tensor::from_data(TensorData::new(t, [h, v]), self.device))
                });
                let embed = Tensor::from_data(TensorData::new(e.data, [v, h]), self.device);
                (Embedding::Dense(embed), head)
            }
        };
        let head = match (untied, tied_head) {
            (false, Some(head)) => head,
            _ => match self.blocks("lm_head.weight", v, h)? {
                Some(q) => Weight::Blocks(q),
                None => Weight::Dense(self.matrix_t("lm_head.weight", v, h)?),
            },
        };
        Ok((embed, head))
    }

    fn host(&self, name: &str, shape: &[usize]) -> Result<HostTensor> {
        let t = self.src.load(name)?;
        if t.shape != shape {
            return Err(QwenError::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: t.shape,
            });
        }
        Ok(t)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Tensor<B, 1>> {
        let t = self.host(name, &[len])?;
        Ok(Tensor::from_data(
            TensorData::new(t.data, [len]),
            self.device,
        ))
    }

    /// Loads an HF `[out, in]` matrix and returns it transposed, `[in, out]`.
    fn matrix_t(&self, name: &str, out: usize, inp: usize) -> Result<Tensor<B, 2>> {
        let t = self.host(name, &[out, inp])?;
        Ok(Tensor::from_data(
            TensorData::new(transpose(&t.data, out, inp), [inp, out]),
            self.device,
        ))
    }

    /// `name` `[rows, cols]` as its stored blocks, where [`WeightFormat::Blocks`] asks for
    /// them and the source has them.
    fn blocks(&self, name: &str, rows: usize, cols: usize) -> Result<Option<Arc<QuantMatrix>>> {
        if self.format != WeightFormat::Blocks {
            return Ok(None);
        }
        let Some(q) = self.src.load_blocks(name)? else {
            return Ok(None);
        };
        if [q.rows(), q.cols()] != [rows, cols] {
            return Err(QwenError::TensorShape {
                name: name.to_string(),
                expected: vec![rows, cols],
                found: vec![q.rows(), q.cols()],
            });
        }
        Ok(Some(Arc::new(q)))
    }

    fn linear(&self, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Linear<B>> {
        let name = format!("{prefix}.weight");
        let blocks = if self.offload {
            None
        } else {
            self.blocks(&name, out, inp)?
        };
        let weight = if let Some(q) = blocks {
            Weight::Blocks(q)
        } else if self.offload {
            let t = self.host(&name, &[out, inp])?;
            Weight::Host(HostWeight::from_f32::<B>(
                transpose(&t.data, out, inp),
                inp,
                out,
            ))
        } else {
            Weight::Dense(self.matrix_t(&name, out, inp)?)
        };
        let bias = if bias {
            Some(self.vector(&format!("{prefix}.bias"), out)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

/// How [`Qwen2::shard_with`] copies one piece to a rank's device: through host memory, not at
/// all (the rank's device is the model's), or device to device from a buffer of its own with
/// the destination synchronised before the next piece (see the comment there).
struct PieceCopy<'a, B: Backend> {
    from: &'a B::Device,
    to: &'a B::Device,
    via_host: bool,
    rank: usize,
    what: &'static str,
}

impl<B: Backend> PieceCopy<'_, B> {
    fn run<const D: usize>(&self, t: &Tensor<B, D>) -> Result<Tensor<B, D>> {
        if self.via_host {
            return Ok(Tensor::from_data(t.to_data(), self.to));
        }
        if self.from == self.to {
            return Ok(t.clone());
        }
        let own = t.clone().add_scalar(0.0);
        let out = own.clone().to_device(self.to);
        B::sync(self.to).map_err(|e| {
            QwenError::Parallel(format!(
                "device copy of {} to rank {}: {e:?}",
                self.what, self.rank
            ))
        })?;
        drop(own);
        Ok(out)
    }
}

/// Whether any of `lins` holds a block weight (which the grouped GEMMs do not take).
fn any_blocks<B: Backend>(lins: &[&Linear<B>]) -> bool {
    lins.iter().any(|l| matches!(l.weight, Weight::Blocks(_)))
}

/// The embedding as a dense device tensor, for the tensor-parallel split (which takes dense
/// weights only).
fn dense_embed<B: Backend>(e: &Embedding<B>) -> Result<Tensor<B, 2>> {
    match e {
        Embedding::Dense(t) => Ok(t.clone()),
        Embedding::Blocks(_) => Err(QwenError::Parallel(
            "the embedding holds blocks; only dense weights shard (load with WeightFormat::Dense)"
                .into(),
        )),
    }
}

/// The LM head as a dense device tensor `[hidden, vocab]`, as [`dense_embed`].
fn dense_head<B: Backend>(w: &Weight<B>) -> Result<Tensor<B, 2>> {
    match w {
        Weight::Dense(t) => Ok(t.clone()),
        _ => Err(QwenError::Parallel(
            "the LM head is not a dense device weight; only dense weights shard".into(),
        )),
    }
}

fn transpose(data: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = data[r * cols + c];
        }
    }
    out
}

/// `layer` with its seven linear weights copied to host memory (norms and biases stay).
fn to_host<B: Backend>(layer: &Layer<B>) -> Layer<B> {
    layer.map_each(|l| Linear {
        weight: match &l.weight {
            Weight::Dense(w) => Weight::Host(HostWeight::from_device(w)),
            w => w.clone(),
        },
        bias: l.bias.clone(),
    })
}

impl<B: Backend> Qwen2<B> {
    /// Builds the model from `src` (HF names and shapes, see [`WEIGHT_TABLE`]'s doc), with RoPE
    /// tables for `max_positions` positions (at most `max_position_embeddings`).
    ///
    /// # Errors
    /// [`QwenError::MissingTensor`] or [`QwenError::TensorShape`] naming the tensor with the
    /// expected and found shapes; the loader's errors.
    pub fn load(
        config: &QwenConfig,
        src: &dyn WeightSource,
        max_positions: usize,
        device: &B::Device,
    ) -> Result<Self> {
        Self::load_offloaded(config, src, max_positions, device, &[])
    }

    /// As [`Qwen2::load`], with the linear weights of the layers listed in `offloaded` kept
    /// in host memory ([`crate::offload`]); the forward pass stages each such layer on the
    /// device when it runs. Indices past the last layer are ignored.
    ///
    /// # Errors
    /// As [`Qwen2::load`].
    pub fn load_offloaded(
        config: &QwenConfig,
        src: &dyn WeightSource,
        max_positions: usize,
        device: &B::Device,
        offloaded: &[usize],
    ) -> Result<Self> {
        Self::load_as(
            config,
            src,
            max_positions,
            device,
            offloaded,
            WeightFormat::Dense,
        )
    }

    /// As [`Qwen2::load_offloaded`], with the weights in `format`: with
    /// [`WeightFormat::Blocks`], every linear weight, the embedding and the LM head that the
    /// source stores in a block format the kernels read stay in it
    /// ([`WeightSource::load_blocks`]; offloaded layers stay dense).
    ///
    /// # Errors
    /// As [`Qwen2::load`].
    pub fn load_as(
        config: &QwenConfig,
        src: &dyn WeightSource,
        max_positions: usize,
        device: &B::Device,
        offloaded: &[usize],
        format: WeightFormat,
    ) -> Result<Self> {
        config.validate()?;
        let c = config;
        let (h, hd, nh, kv) = (
            c.hidden_size,
            c.head_dim(),
            c.num_attention_heads,
            c.kv_heads(),
        );
        let mut ld = Loader::<B> {
            src,
            device,
            offload: false,
            format,
        };
        let (embed, lm_head) = ld.embed_and_head(c)?;
        let bias = c.qkv_bias();
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for l in 0..c.num_hidden_layers {
            ld.offload = offloaded.contains(&l);
            let ld = &ld;
            let p = format!("model.layers.{l}");
            let norm = |name: &str| -> Result<RmsNorm<B>> {
                Ok(RmsNorm {
                    weight: ld.vector(&format!("{p}.{name}.weight"), h)?,
                    eps: c.rms_norm_eps,
                })
            };
            layers.push(Layer {
                input_norm: norm("input_layernorm")?,
                q: ld.linear(&format!("{p}.self_attn.q_proj"), nh * hd, h, bias)?,
                k: ld.linear(&format!("{p}.self_attn.k_proj"), kv * hd, h, bias)?,
                v: ld.linear(&format!("{p}.self_attn.v_proj"), kv * hd, h, bias)?,
                o: ld.linear(&format!("{p}.self_attn.o_proj"), h, nh * hd, false)?,
                post_norm: norm("post_attention_layernorm")?,
                gate: ld.linear(&format!("{p}.mlp.gate_proj"), c.intermediate_size, h, false)?,
                up: ld.linear(&format!("{p}.mlp.up_proj"), c.intermediate_size, h, false)?,
                down: ld.linear(&format!("{p}.mlp.down_proj"), h, c.intermediate_size, false)?,
            });
        }
        let norm = RmsNorm {
            weight: ld.vector("model.norm.weight", h)?,
            eps: c.rms_norm_eps,
        };
        let max_positions = max_positions.clamp(1, c.max_position_embeddings);
        Ok(Self {
            config: c.clone(),
            embed,
            layers,
            norm,
            lm_head,
            rope: Rope::new(c.rope_theta, hd, max_positions, device),
            device: device.clone(),
            kernels: None,
            elementwise: None,
            skinny_gemm: None,
            grouped_gemm: None,
            prefill_kernel: None,
            prefill_gemm: None,
            fused_residual: None,
            kv_write_kernel: None,
            prefetch: true,
            tp: None,
            profile: None,
        })
    }

    /// A model with random weights drawn on the device (normal, std 0.02 as HF
    /// `initializer_range`; norms 1), for speed measurements at real shapes.
    pub fn random(config: &QwenConfig, max_positions: usize, device: &B::Device) -> Result<Self> {
        Self::random_offloaded(config, max_positions, device, &[])
    }

    /// As [`Qwen2::random`], with the linear weights of the layers listed in `offloaded`
    /// moved to host memory as soon as each is drawn (so the device never holds more than one
    /// of them; see [`crate::offload`]).
    ///
    /// # Errors
    /// As [`Qwen2::random`].
    pub fn random_offloaded(
        config: &QwenConfig,
        max_positions: usize,
        device: &B::Device,
        offloaded: &[usize],
    ) -> Result<Self> {
        Self::random_inner(config, max_positions, device, offloaded, None)
    }

    /// Rank `rank`'s shard of a model with random weights ([`Qwen2::random`]) drawn directly
    /// at the shard's shapes on the rank's device (for speed measurements of a model that
    /// does not fit one device; the shards of different ranks are not slices of one model:
    /// [`Qwen2::shard`] makes those). The embedding, norms and LM head are drawn first, so
    /// ranks that seed the backend alike (`B::seed`) before building get identical copies.
    ///
    /// # Errors
    /// As [`Qwen2::random`]; [`QwenError::Parallel`] as [`Qwen2::shard`].
    pub fn random_shard(
        config: &QwenConfig,
        max_positions: usize,
        rank: TpRank<B>,
    ) -> Result<Self> {
        let world = rank.world();
        check_divisible("num_attention_heads", config.num_attention_heads, world)?;
        check_divisible("num_key_value_heads", config.kv_heads(), world)?;
        check_divisible("intermediate_size", config.intermediate_size, world)?;
        let dev = rank.device().clone();
        Self::random_inner(config, max_positions, &dev, &[], Some(rank))
    }

    fn random_inner(
        config: &QwenConfig,
        max_positions: usize,
        device: &B::Device,
        offloaded: &[usize],
        tp: Option<TpRank<B>>,
    ) -> Result<Self> {
        use burn_tensor::Distribution;
        config.validate()?;
        let c = config;
        let w = tp.as_ref().map_or(1, TpRank::world);
        let (h, hd, nh, kv, mid) = (
            c.hidden_size,
            c.head_dim(),
            c.num_attention_heads / w,
            c.kv_heads() / w,
            c.intermediate_size / w,
        );
        let dist = Distribution::Normal(0.0, 0.02);
        let mat = |i: usize, o: usize| Tensor::<B, 2>::random([i, o], dist, device);
        let lin = |i: usize, o: usize, bias: bool| {
            Linear::dense(
                mat(i, o),
                bias.then(|| Tensor::<B, 1>::random([o], dist, device)),
            )
        };
        let norm = || RmsNorm {
            weight: Tensor::<B, 1>::ones([h], device),
            eps: c.rms_norm_eps,
        };
        let bias = c.qkv_bias();
        // replicated tensors first (see random_shard)
        // tied: the LM head is the stored matrix `[hidden, vocab]` and the embedding its
        // transposed view, so that the head is contiguous for the skinny GEMM (the LM head
        // reads the whole matrix at every step, the embedding gathers a few rows)
        let (embed, lm_head) = if c.tie_word_embeddings {
            let head = mat(h, c.vocab_size);
            (
                Embedding::Dense(head.clone().transpose()),
                Weight::Dense(head),
            )
        } else {
            (
                Embedding::Dense(mat(c.vocab_size, h)),
                Weight::Dense(mat(h, c.vocab_size)),
            )
        };
        let layers = (0..c.num_hidden_layers)
            .map(|l| {
                (
                    l,
                    Layer {
                        input_norm: norm(),
                        q: lin(h, nh * hd, bias),
                        k: lin(h, kv * hd, bias),
                        v: lin(h, kv * hd, bias),
                        o: lin(nh * hd, h, false),
                        post_norm: norm(),
                        gate: lin(h, mid, false),
                        up: lin(h, mid, false),
                        down: lin(mid, h, false),
                    },
                )
            })
            .map(|(l, layer)| {
                if offloaded.contains(&l) {
                    to_host(&layer)
                } else {
                    layer
                }
            })
            .collect();
        let max_positions = max_positions.clamp(1, c.max_position_embeddings);
        Ok(Self {
            config: c.clone(),
            embed,
            layers,
            norm: norm(),
            lm_head,
            rope: Rope::new(c.rope_theta, hd, max_positions, device),
            device: device.clone(),
            kernels: None,
            elementwise: None,
            skinny_gemm: None,
            grouped_gemm: None,
            prefill_kernel: None,
            prefill_gemm: None,
            fused_residual: None,
            kv_write_kernel: None,
            prefetch: true,
            tp,
            profile: None,
        })
    }

    /// Chooses the attention path: `Some(true)` the backend's [`KernelOps`] (fused kernels
    /// on CUDA, the host kernels of [`dustin_kernels::cpu_attn`] on the CPU), `Some(false)`
    /// the model's own plain ops, `None` (the default) [`KernelOps::ATTENTION_KERNELS`]. Both
    /// paths compute the same attention; tests use this to check one against the other.
    pub fn with_kernels(mut self, kernels: Option<bool>) -> Self {
        self.kernels = kernels;
        self
    }

    /// Chooses how RMSNorm, the MLP's SwiGLU product, RoPE and the dequantization of packed
    /// substitute weights run: `true` through [`KernelOps::rms_norm`],
    /// [`KernelOps::silu_mul`], [`KernelOps::rope`] and [`KernelOps::dequantize_packed`] (one
    /// kernel each on CUDA, where the plain ops launch 7, 10, 7 and about 8), `false` the
    /// model's own Burn ops. The default is [`KernelOps::ELEMENTWISE_KERNELS`]: on CUDA,
    /// where `dustin-bench kernel-check --device cuda` holds the kernels to float64 references and
    /// they made 7B decoding at 32k 1.1-1.9x faster (docs/perf.md), and on the CPU, whose
    /// RoPE is one host loop with the plain ops' rounding (RMSNorm and the SwiGLU product
    /// are the plain ops there). Packed weights are dequantized by the kernel only where the
    /// backend has fused kernels ([`KernelOps::FUSED`]).
    pub fn with_fused_elementwise(mut self, on: bool) -> Self {
        self.elementwise = Some(on);
        self
    }

    /// Runs linear layers of at most [`KernelOps::skinny_max_rows`] rows (decoding and
    /// verification: batch x new tokens) through [`KernelOps::skinny_linear`] (`true`) or
    /// Burn's matmul (`false`). The default is [`KernelOps::SKINNY_GEMM`]: on for CUDA (7B
    /// decoding at batch 1 went from 25.4 to 74.8 tokens/s, the 0.5B draft got 3-5% slower,
    /// docs/perf.md 2026-11-30) and on the CPU (`dustin_kernels::cpu_skinny`: Burn's matmul
    /// packs the weight from 2 rows on); `dustin-bench e2e --skinny-gemm on|off` compares. The same
    /// products up to f32 summation order.
    pub fn with_skinny_gemm(mut self, on: bool) -> Self {
        self.skinny_gemm = Some(on);
        self
    }

    /// With the skinny GEMM on ([`Qwen2::with_skinny_gemm`]), runs a layer's q, k and v
    /// projections as one [`KernelOps::skinny_linear3`] and its gate and up projections with
    /// the SiLU product as one [`KernelOps::skinny_swiglu`] (`true`): on CUDA 4 launches
    /// instead of 6 and 3 instead of 5 per layer and step (the default wherever the skinny
    /// GEMM is on: checked on the H200 and faster in every row of docs/perf.md, 2026-11-30).
    /// `false` keeps one [`KernelOps::skinny_linear`] per projection. The same values either
    /// way.
    pub fn with_grouped_gemm(mut self, on: bool) -> Self {
        self.grouped_gemm = Some(on);
        self
    }

    /// Runs the dense attention of prefill chunks (more than [`MAX_NEW`] and at most
    /// [`dustin_kernels::MAX_PREFILL_NEW`] new tokens) through
    /// [`KernelOps::prefill_attention`] (`true`: on CUDA a flash-attention kernel, with no
    /// score matrix in memory) or the model's own plain ops (`false`: the masked score matrix
    /// of the chunk against its context, Burn's matmul and softmax). The default is `true`
    /// wherever the attention runs through the kernels ([`Qwen2::with_kernels`]). Chunks
    /// whose attention probabilities a hook asks for (H2O, SnapKV observing the prompt) take
    /// the plain path either way. The same attention up to rounding; `dustin-bench bench
    /// --prefill-attention kernel,plain` compares their speed.
    pub fn with_prefill_attention(mut self, on: bool) -> Self {
        self.prefill_kernel = Some(on);
        self
    }

    /// Runs the linear layers of prefill chunks (at least
    /// [`dustin_kernels::PREFILL_GEMM_MIN_ROWS`] rows: batch x new tokens) through
    /// [`KernelOps::prefill_linear`] (`true`: on CUDA cuBLAS where `libcublas` loads) or
    /// Burn's matmul (`false`). The default is `true` on backends with fused kernels (CUDA)
    /// and `false` elsewhere (the CPU, where both are Burn's matmul). The same products up to
    /// rounding (the order of the f32 sums; with a bias cuBLAS rounds once, Burn's matmul and
    /// add twice); `dustin-bench bench --prefill-gemm cublas,burn` compares their
    /// speed.
    pub fn with_prefill_gemm(mut self, on: bool) -> Self {
        self.prefill_gemm = Some(on);
        self
    }

    /// Runs each residual add together with the RMSNorm that follows it as one
    /// [`KernelOps::add_rms_norm`] (`true`; with the fused element-wise ops on,
    /// [`Qwen2::with_fused_elementwise`]): after attention with the layer's post-attention
    /// norm, and after the MLP with the next layer's input norm (the MLP's output is carried
    /// into the next layer un-added; the last layer's is added before the final norm). On
    /// CUDA that is one kernel where the separate add and norm take two, so two launches
    /// fewer per layer (48 per step of the 24-layer 0.5B draft). Off by default: its GPU
    /// check passed (`dustin-bench kernel-check --device cuda`, H200, 2026-11-30), but turning it on
    /// showed no gain at 7B, 32k (`dustin-bench e2e --fused-residual on`, docs/perf.md). The same
    /// values either way (the sum is rounded to the dtype once, as Burn's add rounds it).
    pub fn with_fused_residual(mut self, on: bool) -> Self {
        self.fused_residual = Some(on);
        self
    }

    /// Writes each layer's new keys and values into the cache through
    /// [`KernelOps::kv_write_pair`] (`true`) instead of Burn's slice-assigns. For a ragged
    /// batch (sequences that accepted different numbers of drafts) the slice-assigns take one
    /// or two launches per sequence, tensor and layer (32-64 per layer at batch 16: a
    /// slice-assign, and the slice of the sequence's rows where Burn copies it), the CUDA
    /// kernel one per layer for keys and values together; equal lengths take two
    /// slice-assigns against the kernel's one launch (since 2026-12-01; before, the kernel
    /// wrote one tensor a launch and left equal lengths to the slice-assigns). On by default
    /// where the backend has fused kernels (CUDA):
    /// `dustin-bench kernel-check --device cuda` passed its `kv_write` rows and the model rows
    /// (whose decode step is ragged) on the H200, and a ragged batch of 8 at 7B, 32k decoded
    /// 1.35-1.55x faster with it (docs/perf.md, 2026-11-30). The same cache either way (a
    /// copy).
    pub fn with_kv_write_kernel(mut self, on: bool) -> Self {
        self.kv_write_kernel = Some(on);
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

    /// This model's shard for `rank` of a tensor-parallel group ([`crate::tp`]), on the rank's
    /// device: columns of q/k/v/gate/up and rows of o/down for the rank's heads and
    /// intermediate block, a full copy of the rest (a bias of o or down stays on rank 0
    /// only). Each piece is copied with `Tensor::to_device` (device to device on CUDA, through
    /// cubecl's NCCL peer copy, one piece at a time, each into a buffer of its own first;
    /// nothing is copied for the rank on the model's own device).
    /// The result computes, with the other ranks, what this model computes.
    ///
    /// # Errors
    /// [`QwenError::Parallel`] when heads, KV heads or `intermediate_size` do not divide by
    /// the world size, the model is already a shard, or a layer holds packed or host weights
    /// (substitutes and offloaded layers do not shard).
    pub fn shard(&self, rank: TpRank<B>) -> Result<Self> {
        self.shard_with(rank, false)
    }

    /// [`Qwen2::shard`], copying each piece through host memory when `via_host` (a check of
    /// the device-to-device copy against the plain upload path; slower).
    ///
    /// # Errors
    /// As [`Qwen2::shard`].
    pub fn shard_with(&self, rank: TpRank<B>, via_host: bool) -> Result<Self> {
        if self.tp.is_some() {
            return Err(QwenError::Parallel(
                "the model is already a tensor-parallel shard".into(),
            ));
        }
        let c = &self.config;
        let world = rank.world();
        check_divisible("num_attention_heads", c.num_attention_heads, world)?;
        check_divisible("num_key_value_heads", c.kv_heads(), world)?;
        check_divisible("intermediate_size", c.intermediate_size, world)?;
        let dev = rank.device().clone();
        let hd = c.head_dim();
        // Device path: the piece is first copied into a fresh tensor of its own on the source
        // device (`+ 0`, exact), sent, and the destination synchronised before the next piece.
        // cubecl 0.10's peer copy (`Tensor::to_device`, NCCL send/recv) of a slice view gave
        // wrong weights on two H200s (docs/perf.md, "Tensor parallelism"): either the view
        // itself, or the temporary that made it contiguous being reused by the next piece's
        // kernels while the send still read it (not told apart; this path avoids both, and
        // `own` lives until the destination has synchronised).
        let copy = |what: &'static str| PieceCopy {
            from: &self.device,
            to: &dev,
            via_host,
            rank: rank.rank,
            what,
        };
        let move_to = |t: &Tensor<B, 2>| copy("a weight").run(t);
        let move1 = |t: &Tensor<B, 1>| copy("a norm or bias").run(t);
        let norm = |n: &RmsNorm<B>| -> Result<RmsNorm<B>> {
            Ok(RmsNorm {
                weight: move1(&n.weight)?,
                eps: n.eps,
            })
        };
        let dense = |l: &Linear<B>, li: usize| match &l.weight {
            Weight::Dense(w) => Ok(w.clone()),
            _ => Err(QwenError::Parallel(format!(
                "layer {li} holds packed or host weights; only dense device weights shard"
            ))),
        };
        // column-parallel: output columns `cols`, bias sliced alike
        let column = |l: &Linear<B>, li: usize, cols: std::ops::Range<usize>| {
            let w = dense(l, li)?;
            let [rows, _] = w.dims();
            Ok::<_, QwenError>(Linear::dense(
                move_to(&w.slice([0..rows, cols.clone()]))?,
                l.bias
                    .as_ref()
                    .map(|b| move1(&b.clone().slice([cols])))
                    .transpose()?,
            ))
        };
        // row-parallel: input rows `rows`; a bias is added once, by rank 0
        let row = |l: &Linear<B>, li: usize, rows: std::ops::Range<usize>| {
            let w = dense(l, li)?;
            let [_, cols] = w.dims();
            Ok::<_, QwenError>(Linear::dense(
                move_to(&w.slice([rows, 0..cols]))?,
                l.bias
                    .as_ref()
                    .filter(|_| rank.rank == 0)
                    .map(move1)
                    .transpose()?,
            ))
        };
        let heads = rank.part(c.num_attention_heads);
        let kv = rank.part(c.kv_heads());
        let q_cols = heads.start * hd..heads.end * hd;
        let kv_cols = kv.start * hd..kv.end * hd;
        let mid = rank.part(c.intermediate_size);
        let layers = self
            .layers
            .iter()
            .enumerate()
            .map(|(li, l)| {
                Ok(Layer {
                    input_norm: norm(&l.input_norm)?,
                    q: column(&l.q, li, q_cols.clone())?,
                    k: column(&l.k, li, kv_cols.clone())?,
                    v: column(&l.v, li, kv_cols.clone())?,
                    o: row(&l.o, li, q_cols.clone())?,
                    post_norm: norm(&l.post_norm)?,
                    gate: column(&l.gate, li, mid.clone())?,
                    up: column(&l.up, li, mid.clone())?,
                    down: row(&l.down, li, mid.clone())?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config: c.clone(),
            embed: Embedding::Dense(move_to(&dense_embed(&self.embed)?)?),
            layers,
            norm: norm(&self.norm)?,
            lm_head: Weight::Dense(move_to(&dense_head(&self.lm_head)?)?),
            rope: Rope::new(c.rope_theta, hd, self.rope.max_positions, &dev),
            device: dev,
            kernels: self.kernels,
            elementwise: self.elementwise,
            skinny_gemm: self.skinny_gemm,
            grouped_gemm: self.grouped_gemm,
            prefill_kernel: self.prefill_kernel,
            prefill_gemm: self.prefill_gemm,
            fused_residual: self.fused_residual,
            kv_write_kernel: self.kv_write_kernel,
            prefetch: self.prefetch,
            tp: Some(rank),
            profile: self.profile,
        })
    }

    /// Shape of a KV cache for `batch` sequences of `capacity` tokens over the first `layers`
    /// layers (`None`: all).
    pub fn kv_shape(&self, batch: usize, capacity: usize, layers: Option<usize>) -> KvShape {
        KvShape {
            batch,
            layers: layers.unwrap_or(self.config.num_hidden_layers),
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

impl<B: KernelOps> Qwen2<B> {
    /// Whether the dense attention of prefill chunks runs as the backend's kernel
    /// ([`KernelOps::prefill_attention`], no score matrix in memory): the model's kernels on
    /// ([`Qwen2::with_kernels`], by default where the backend has them), its prefill kernel
    /// on ([`Qwen2::with_prefill_attention`]) and its head width one the backend takes
    /// ([`KernelOps::PREFILL_HEAD_DIMS`]). Chunks whose probabilities a hook wants take the
    /// plain path either way.
    pub fn prefill_attention_fused(&self) -> bool {
        self.kernels.unwrap_or(B::FUSED)
            && self.prefill_kernel.unwrap_or(true)
            && B::PREFILL_HEAD_DIMS.contains(&self.config.head_dim())
    }

    /// `norm` applied to `x` `[batch, n, hidden]`, by the fused kernel when chosen.
    fn norm_forward(&self, norm: &RmsNorm<B>, x: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
        if self.elementwise.unwrap_or(B::ELEMENTWISE_KERNELS) {
            if let Some(t) = fallback(B::rms_norm(x.clone(), norm.weight.clone(), norm.eps))? {
                return Ok(t);
            }
        }
        Ok(norm.forward(x))
    }

    /// `lin`'s weight `[in, out]` dense on `device`: a packed (substitute) weight dequantized
    /// by the fused kernel when chosen, else [`Weight::to_dense`].
    fn dense_weight(&self, lin: &Linear<B>, device: &B::Device) -> Result<Tensor<B, 2>> {
        if let Weight::Packed(p) = &lin.weight {
            if self.elementwise.unwrap_or(B::FUSED) {
                if let Some(w) = fallback(p.dequantize_fused())? {
                    return Ok(w);
                }
            }
        }
        lin.weight.to_dense(device)
    }

    /// Whether a product of `rows` rows goes through the skinny GEMM
    /// ([`Qwen2::with_skinny_gemm`], at most [`KernelOps::skinny_max_rows`] rows).
    fn skinny_rows(&self, rows: usize) -> bool {
        self.skinny_gemm.unwrap_or(B::SKINNY_GEMM) && rows <= B::skinny_max_rows()
    }

    /// Whether `rows` rows go through the grouped skinny GEMMs ([`Qwen2::with_grouped_gemm`]).
    fn grouped(&self, rows: usize) -> bool {
        self.grouped_gemm.unwrap_or(true) && self.skinny_rows(rows)
    }

    /// `lin` applied to `x` `[batch, n, in]`; a packed (substitute) weight is dequantized by
    /// the fused kernel when chosen ([`crate::substitute::PackedWeight::dequantize_fused`]).
    /// With [`Qwen2::with_skinny_gemm`], `x` of at most [`KernelOps::skinny_max_rows`]
    /// rows goes through [`KernelOps::skinny_linear`]; with [`Qwen2::with_prefill_gemm`], `x`
    /// of at least [`dustin_kernels::PREFILL_GEMM_MIN_ROWS`] rows through
    /// [`KernelOps::prefill_linear`].
    fn linear(&self, lin: &Linear<B>, x: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
        let [b, n, d] = x.dims();
        if let Weight::Blocks(q) = &lin.weight {
            // decode and verify rows (up to the skinny GEMM's rows) through the block kernels;
            // a prefill chunk decodes the weight for Burn's matmul: with the prompt's rows
            // quantized to int8 the logits of Qwen2.5-Coder-1.5B moved by up to 1.29 from
            // HF's (the first positions' large activations leave the rest of their blocks
            // few steps), against 0.085 this way (tests/pair_parity.rs)
            if B::QUANT_KERNELS && b * n <= B::skinny_max_rows() {
                let y = B::quant_linear(x.reshape([b * n, d]), q, lin.bias.clone())?;
                return Ok(y.reshape([b, n, q.rows()]));
            }
        }
        let w = self.dense_weight(lin, &x.device())?;
        if self.skinny_rows(b * n) {
            let out = w.dims()[1];
            let y = B::skinny_linear(x.reshape([b * n, d]), w, lin.bias.clone())?;
            return Ok(y.reshape([b, n, out]));
        }
        if self.prefill_gemm.unwrap_or(B::FUSED) && b * n >= dustin_kernels::PREFILL_GEMM_MIN_ROWS {
            let out = w.dims()[1];
            let y = B::prefill_linear(x.reshape([b * n, d]), w, lin.bias.clone())?;
            return Ok(y.reshape([b, n, out]));
        }
        Ok(lin.forward_dense(x, w))
    }

    /// Each of `lins` applied to one `x` `[batch, n, in]`, in order, as [`Qwen2::linear`]
    /// would; where that would take [`KernelOps::prefill_linear`], the products go through
    /// [`KernelOps::prefill_linear_many`] together (on CUDA one pair of device waits for
    /// all of them) from [`dustin_kernels::PREFILL_MANY_MIN_ROWS`] rows, except where a
    /// weight is packed (a substitute draft's): dequantized
    /// together, the weights would all be dense at once, so those go one at a time as
    /// before.
    fn linear_many<const N: usize>(
        &self,
        lins: [&Linear<B>; N],
        x: Tensor<B, 3>,
    ) -> Result<[Tensor<B, 3>; N]> {
        let [b, n, d] = x.dims();
        let rows = b * n;
        let ys: Vec<Tensor<B, 3>> = if self.skinny_rows(rows)
            || !self.prefill_gemm.unwrap_or(B::FUSED)
            || rows < dustin_kernels::PREFILL_MANY_MIN_ROWS
            || lins
                .iter()
                .any(|lin| matches!(lin.weight, Weight::Packed(_) | Weight::Blocks(_)))
        {
            lins.iter()
                .map(|lin| self.linear(lin, x.clone()))
                .collect::<Result<_>>()?
        } else {
            let dev = x.device();
            let parts = lins
                .iter()
                .map(|lin| Ok((self.dense_weight(lin, &dev)?, lin.bias.clone())))
                .collect::<Result<Vec<_>>>()?;
            B::prefill_linear_many(x.reshape([rows, d]), parts)?
                .into_iter()
                .map(|y| {
                    let out = y.dims()[1];
                    y.reshape([b, n, out])
                })
                .collect()
        };
        let found = ys.len();
        ys.try_into().map_err(|_| {
            dustin_kernels::KernelError::invalid(
                "prefill_linear_many outputs",
                format!("{N}, one a weight"),
                found,
            )
            .into()
        })
    }

    /// `x` `[batch, heads, n, head_dim]` rotated by `rope`, by the fused kernel when chosen.
    fn rope_forward(&self, rope: &RopeAt<B>, x: Tensor<B, 4>) -> Result<Tensor<B, 4>> {
        if self.elementwise.unwrap_or(B::ELEMENTWISE_KERNELS) {
            if let Some(t) = fallback(B::rope(x.clone(), rope.cos.clone(), rope.sin.clone()))? {
                return Ok(t);
            }
        }
        Ok(rope.apply(x))
    }

    /// The attention mass per key of `layer` for queries already run through it: what
    /// [`AttentionHook::on_key_mass`] would have received, had the rows been the new tokens
    /// of one forward pass at that layer, computed from the keys `cache` holds now.
    ///
    /// `q` `[batch, heads, n, head_dim]`: queries after RoPE (as
    /// [`LayerAttnCtx::q`] shows them), row `i` of sequence `b` at position
    /// `ctx_lens[b] + i`, whose key and every earlier one are in `cache` (so
    /// `ctx_lens[b] + n <= cache.lens()[b]`). Row `i` attends to keys `0 ..= ctx_lens[b] + i`
    /// (the causal rule of a forward pass). Returns f32 `[batch, kv_heads, width]`, entry
    /// `(b, h, j)` the softmax probability of key `j` summed over the query heads of KV head
    /// `h` and over the `n` rows (0 past a row's visible keys); `width` is
    /// `max(ctx_lens) + n` rounded up to [`KV_VIEW_MULTIPLE`], at most the capacity, as in a
    /// forward pass. Scale `1 / sqrt(head_dim)` (Vaswani et al. 2017).
    ///
    /// A drafter uses this to score all of its steps' queries against its cache once after
    /// drafting, instead of once per step (docs/decisions.md, "The speculative loop"): the keys are
    /// read once per layer, not once per draft step. Rows beyond
    /// [`dustin_kernels::MAX_NEW`] are scored in chunks of that many.
    ///
    /// # Errors
    /// [`dustin_core::CoreError::InvalidInput`] (as [`QwenError::Core`]) for a layer outside
    /// the cache, a shape other than the model's heads and head width, a batch other than the
    /// cache's, no rows, or a row whose key is not in the cache; kernel errors.
    pub fn key_mass(
        &self,
        cache: &DenseKvCache<B>,
        layer: usize,
        q: Tensor<B, 4>,
        ctx_lens: &[usize],
    ) -> Result<Tensor<B, 3>> {
        let [b, nh, n, hd] = q.dims();
        let ((heads, _), head_dim) = (self.local_heads(), self.config.head_dim());
        let layers = cache.num_layers().min(self.layers.len());
        if layer >= layers {
            return Err(dustin_core::CoreError::invalid(
                "layer",
                format!("a layer below {layers}"),
                layer,
            )
            .into());
        }
        if b != cache.batch() || nh != heads || hd != head_dim || n == 0 {
            return Err(dustin_core::CoreError::invalid(
                "q",
                format!(
                    "[{}, {heads}, n >= 1, {head_dim}] (batch, heads, rows, head_dim)",
                    cache.batch()
                ),
                format!("{:?}", [b, nh, n, hd]),
            )
            .into());
        }
        if ctx_lens.len() != b {
            return Err(dustin_core::CoreError::invalid(
                "ctx_lens",
                format!("{b} lengths"),
                ctx_lens.len(),
            )
            .into());
        }
        if let Some((s, (&l, &have))) = ctx_lens
            .iter()
            .zip(cache.lens())
            .enumerate()
            .find(|(_, (&l, &have))| l + n > have)
        {
            return Err(dustin_core::CoreError::invalid(
                format!("ctx_lens[{s}]"),
                format!(
                    "at most {} (the cache holds {have} keys, {n} rows)",
                    have.saturating_sub(n)
                ),
                l,
            )
            .into());
        }
        let keys_len = (ctx_lens.iter().max().copied().unwrap_or(0) + n)
            .next_multiple_of(KV_VIEW_MULTIPLE)
            .min(cache.capacity());
        let k = B::kv_prefix(cache.view(layer, cache.capacity()).k, keys_len);
        let scale = 1.0 / (hd as f32).sqrt();
        let all: Vec<usize> = (0..nh).collect();
        let mut mass: Option<Tensor<B, 3>> = None;
        for r0 in (0..n).step_by(MAX_NEW) {
            let rows = MAX_NEW.min(n - r0);
            let qc = if rows == n {
                q.clone()
            } else {
                q.clone().slice([0..b, 0..nh, r0..r0 + rows, 0..hd])
            };
            let lens: Vec<usize> = ctx_lens.iter().map(|&l| l + r0).collect();
            // the scoring kernel where the model runs its kernels, else the plain ops
            let kernel = if self.kernels.unwrap_or(B::ATTENTION_KERNELS) {
                fallback(B::head_subset_scores(
                    qc.clone(),
                    k.clone(),
                    &lens,
                    &all,
                    scale,
                ))?
            } else {
                None
            };
            let part = match kernel {
                Some(m) => m,
                None => {
                    dustin_kernels::plain::head_subset_scores(qc, k.clone(), &lens, &all, scale)?
                }
            };
            mass = Some(match mass {
                Some(m) => m + part,
                None => part,
            });
        }
        // n >= 1, so the loop ran
        mass.ok_or_else(|| dustin_core::CoreError::Model("key_mass: no rows".into()).into())
    }

    /// Runs `tokens` (`[batch][n]`, the same `n` for every sequence) at each sequence's
    /// positions `cache.lens()[b] ..`, appends their K/V to `cache` and advances it by `n`.
    ///
    /// # Errors
    /// [`QwenError::Prompt`] for a ragged batch or a token id outside the vocabulary,
    /// cache errors ([`dustin_core::CoreError::CacheFull`]), and the hook's errors. On error
    /// the cache lengths are unchanged (written slots past them are stale and harmless).
    pub fn forward<H: AttentionHook<B> + ?Sized>(
        &self,
        tokens: &[Vec<u32>],
        cache: &mut DenseKvCache<B>,
        hook: &mut H,
        opts: ForwardOpts,
    ) -> Result<ForwardOut<B>> {
        let batch = tokens.len();
        let n = tokens.first().map_or(0, Vec::len);
        if batch != cache.batch() {
            return Err(QwenError::Prompt {
                index: 0,
                msg: format!(
                    "batch of {batch} sequences for a cache of {}",
                    cache.batch()
                ),
            });
        }
        if n == 0 {
            return Err(QwenError::Prompt {
                index: 0,
                msg: "no new tokens".into(),
            });
        }
        let vocab = self.config.vocab_size;
        let mut flat = Vec::with_capacity(batch * n);
        for (i, t) in tokens.iter().enumerate() {
            if t.len() != n {
                return Err(QwenError::Prompt {
                    index: i,
                    msg: format!("{} tokens where the batch has {n}", t.len()),
                });
            }
            if let Some(&bad) = t.iter().find(|&&id| id as usize >= vocab) {
                return Err(QwenError::Prompt {
                    index: i,
                    msg: format!("token id {bad} is outside the vocabulary of {vocab}"),
                });
            }
            flat.extend(t.iter().map(|&id| id as i64));
        }
        let ctx_lens: Vec<usize> = cache.lens().to_vec();
        let max_end = ctx_lens.iter().map(|l| l + n).max().unwrap_or(n);
        if max_end > self.rope.max_positions || max_end > cache.capacity() {
            return Err(QwenError::Prompt {
                index: ctx_lens.iter().position(|l| l + n == max_end).unwrap_or(0),
                msg: format!(
                    "position {} is past the model's RoPE table ({}) or the KV capacity ({})",
                    max_end - 1,
                    self.rope.max_positions,
                    cache.capacity()
                ),
            });
        }
        let n_layers = opts
            .layers
            .unwrap_or(self.layers.len())
            .min(self.layers.len())
            .min(cache.num_layers());
        let dev = &self.device;
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(flat, [batch * n]), dev);
        let positions: Vec<i64> = ctx_lens
            .iter()
            .flat_map(|&l| (l..l + n).map(|p| p as i64))
            .collect();
        let positions =
            Tensor::<B, 1, Int>::from_data(TensorData::new(positions, [batch * n]), dev);
        // gathered once, shared by every layer's queries and keys
        let rope = self.rope.at(positions, batch, n);
        let hidden = self.config.hidden_size;
        let timer = Timer {
            label: self
                .profile
                .filter(|_| self.tp.as_ref().is_none_or(|t| t.rank == 0)),
            stage: match opts.phase {
                Phase::Prefill { .. } => "prefill",
                Phase::Decode => "decode",
            },
            device: dev,
        };
        let mut x = timer.time("embed", || -> Result<Tensor<B, 3>> {
            Ok(self.embed.rows(ids, dev)?.reshape([batch, n, hidden]))
        })?;
        let mut pass = Pass {
            timer,
            rope: &rope,
            ctx_lens: &ctx_lens,
            n,
            cache,
            hook,
            phase: opts.phase,
            reads: vec![0u64; batch],
            dense: vec![0u64; batch],
        };
        // an offloaded layer is staged on the device before it runs; with prefetching, the
        // next offloaded layer is staged by a helper thread (its own CUDA stream on
        // CubeCL backends) while the current one computes
        let mut next: Option<Layer<B>> = None;
        // the previous layer's MLP output not yet added to `x` (`with_fused_residual`)
        let mut pending: Option<Tensor<B, 3>> = None;
        for li in 0..n_layers {
            let stored = &self.layers[li];
            let staged;
            let layer = if stored.is_offloaded() {
                staged = match next.take() {
                    Some(l) => l,
                    None => timer.time("stage", || stored.staged(dev)),
                };
                &staged
            } else {
                stored
            };
            let mut step = |(x, pending): (Tensor<B, 3>, Option<Tensor<B, 3>>)| {
                self.layer_forward(li, layer, x, pending, &mut pass)
            };
            let upcoming = self
                .layers
                .get(li + 1)
                .filter(|l| li + 1 < n_layers && l.is_offloaded());
            (x, pending) = match upcoming {
                Some(up) if self.prefetch => std::thread::scope(|s| {
                    let handle = s.spawn(move || {
                        up.staged_on(
                            dev,
                            cubecl_common::stream_id::StreamId {
                                value: UPLOAD_STREAM,
                            },
                        )
                    });
                    let out = step((x, pending));
                    next = handle.join().ok();
                    out
                })?,
                _ => step((x, pending))?,
            };
        }
        // the last layer's MLP output, when it was carried un-added
        let x = match pending {
            Some(m) => m + x,
            None => x,
        };
        let Pass {
            cache,
            reads,
            dense,
            ..
        } = pass;
        cache.advance(n)?;
        let logits = match opts.logits {
            LogitsMode::None => None,
            mode => Some(timer.time("lm_head", || -> Result<Tensor<B, 3>> {
                let x = if mode == LogitsMode::Last {
                    x.slice([0..batch, n - 1..n, 0..hidden])
                } else {
                    x
                };
                let x = self.norm_forward(&self.norm, x)?;
                let [b, m, _] = x.dims();
                let x = x.reshape([b * m, hidden]);
                // decode and verify rows through the skinny GEMM (the head is the largest
                // single weight: 152,064 x 8192 bf16 = 2.5 GB at 72B); a backend whose
                // kernel does not take the layout runs Burn's matmul inside it
                let y = match &self.lm_head {
                    Weight::Blocks(q) if B::QUANT_KERNELS => B::quant_linear(x, q, None)?,
                    Weight::Dense(w) if self.skinny_rows(b * m) => {
                        B::skinny_linear(x, w.clone(), None)?
                    }
                    head => x.matmul(head.to_dense(dev)?),
                };
                Ok(y.reshape([b, m, vocab]))
            })?),
        };
        Ok(ForwardOut {
            logits,
            ctx_reads: reads,
            ctx_dense: dense,
        })
    }

    /// One decoder layer: `x + attn(rmsnorm(x))`, then `+ mlp(rmsnorm(.))`. `pending` is the
    /// previous layer's MLP output when it was carried un-added (`with_fused_residual`): the
    /// layer's `x` is then `x + pending`. Returns the new `x` and, with the fused residual on,
    /// this layer's MLP output un-added.
    fn layer_forward<H: AttentionHook<B> + ?Sized>(
        &self,
        li: usize,
        layer: &Layer<B>,
        x: Tensor<B, 3>,
        pending: Option<Tensor<B, 3>>,
        pass: &mut Pass<'_, B, H>,
    ) -> Result<(Tensor<B, 3>, Option<Tensor<B, 3>>)> {
        let timer = pass.timer;
        let (x, h) = timer.time("input_norm", || {
            self.residual_norm(&layer.input_norm, pending, x)
        })?;
        let a = self.attention(li, layer, h, pass)?;
        // the layer's output on the left: Burn's add writes in place into its left operand
        // when it can, and the projection's output is contiguous, where the residual stream
        // `x` (Burn's own allocations) has rows pitched to 512 bytes on CUDA (a 896-wide bf16
        // row of the 0.5B takes 2048 bytes); a pitched `x` made the next reshape copy it
        // (three copy kernels per 0.5B layer, H200 trace of 2026-11-30). Same sum either way.
        let a = self.all_reduce(a, timer)?;
        let (x, h) = timer.time("post_norm", || {
            self.residual_norm(&layer.post_norm, Some(a), x)
        })?;
        let m = timer.time("mlp", || -> Result<Tensor<B, 3>> {
            let [b, n, d] = h.dims();
            if self.grouped(b * n)
                && layer.gate.bias.is_none()
                && layer.up.bias.is_none()
                && !any_blocks(&[&layer.gate, &layer.up])
            {
                let dev = h.device();
                let (wg, wu) = (
                    self.dense_weight(&layer.gate, &dev)?,
                    self.dense_weight(&layer.up, &dev)?,
                );
                let inter = wg.dims()[1];
                let act = B::skinny_swiglu(h.reshape([b * n, d]), wg, wu)?.reshape([b, n, inter]);
                return self.linear(&layer.down, act);
            }
            let [gate, up] = self.linear_many([&layer.gate, &layer.up], h)?;
            let act = if self.elementwise.unwrap_or(B::ELEMENTWISE_KERNELS) {
                fallback(B::silu_mul(gate.clone(), up.clone()))?
            } else {
                None
            };
            let act = act.unwrap_or_else(|| activation::silu(gate) * up);
            self.linear(&layer.down, act)
        })?;
        let m = self.all_reduce(m, timer)?;
        if self.fuses_residual() {
            return Ok((x, Some(m)));
        }
        // left operand: see the attention residual above
        Ok((m + x, None))
    }

    /// Whether residual adds run fused with the next RMSNorm ([`Qwen2::with_fused_residual`]).
    fn fuses_residual(&self) -> bool {
        self.fused_residual.unwrap_or(false) && self.elementwise.unwrap_or(B::ELEMENTWISE_KERNELS)
    }

    /// `x + delta` (when there is a delta; `delta` on the left, see `layer_forward`) and its
    /// RMSNorm, as one [`KernelOps::add_rms_norm`] when the fused residual is on.
    fn residual_norm(
        &self,
        norm: &RmsNorm<B>,
        delta: Option<Tensor<B, 3>>,
        x: Tensor<B, 3>,
    ) -> Result<(Tensor<B, 3>, Tensor<B, 3>)> {
        let Some(d) = delta else {
            let h = self.norm_forward(norm, x.clone())?;
            return Ok((x, h));
        };
        if self.fuses_residual() {
            if let Some(pair) = fallback(B::add_rms_norm(
                d.clone(),
                x.clone(),
                norm.weight.clone(),
                norm.eps,
            ))? {
                return Ok(pair);
            }
        }
        let x = d + x;
        let h = self.norm_forward(norm, x.clone())?;
        Ok((x, h))
    }

    /// Under tensor parallelism, the sum of a row-parallel layer's partial outputs over the
    /// group ([`crate::tp::TpGroup::sum`]); otherwise `x` itself.
    fn all_reduce(&self, x: Tensor<B, 3>, timer: Timer<'_, B>) -> Result<Tensor<B, 3>> {
        match &self.tp {
            Some(t) => timer.time("all_reduce", || t.group.sum(t.rank, x)),
            None => Ok(x),
        }
    }

    fn attention<H: AttentionHook<B> + ?Sized>(
        &self,
        li: usize,
        layer: &Layer<B>,
        h: Tensor<B, 3>,
        pass: &mut Pass<'_, B, H>,
    ) -> Result<Tensor<B, 3>> {
        let Pass {
            timer,
            rope,
            ctx_lens,
            n,
            ref mut cache,
            ref mut hook,
            phase,
            ref mut reads,
            ref mut dense,
        } = *pass;
        let c = &self.config;
        let ((nh, kvh), hd) = (self.local_heads(), c.head_dim());
        let g = nh / kvh;
        let batch = ctx_lens.len();
        let (q, k, v) = timer.time("qkv", || -> Result<_> {
            if self.grouped(batch * n) && !any_blocks(&[&layer.q, &layer.k, &layer.v]) {
                let dev = h.device();
                let d = h.dims()[2];
                let part = |lin: &Linear<B>| -> Result<dustin_kernels::LinearParts<B>> {
                    Ok((self.dense_weight(lin, &dev)?, lin.bias.clone()))
                };
                let [q, k, v] = B::skinny_linear3(
                    h.reshape([batch * n, d]),
                    [part(&layer.q)?, part(&layer.k)?, part(&layer.v)?],
                )?;
                return Ok((
                    q.reshape([batch, n, nh, hd]).swap_dims(1, 2),
                    k.reshape([batch, n, kvh, hd]).swap_dims(1, 2),
                    v.reshape([batch, n, kvh, hd]).swap_dims(1, 2),
                ));
            }
            let [q, k, v] = self.linear_many([&layer.q, &layer.k, &layer.v], h)?;
            Ok((
                q.reshape([batch, n, nh, hd]).swap_dims(1, 2),
                k.reshape([batch, n, kvh, hd]).swap_dims(1, 2),
                v.reshape([batch, n, kvh, hd]).swap_dims(1, 2),
            ))
        })?;
        let (q, k) = timer.time("rope", || -> Result<_> {
            Ok((self.rope_forward(rope, q)?, self.rope_forward(rope, k)?))
        })?;
        timer.time("kv_append", || {
            if self.kv_write_kernel.unwrap_or(B::FUSED) {
                cache.append_pair_with(li, k.clone(), v.clone(), |kd, vd, ks, vs, lens| {
                    B::kv_write_pair(kd, vd, ks, vs, lens)
                        .map_err(|e| dustin_core::CoreError::Model(format!("kv_write_pair: {e}")))
                })
            } else {
                cache.append(li, k.clone(), v.clone())
            }
        })?;
        // keys every sequence needs, padded to KV_VIEW_MULTIPLE positions (the padding is
        // past every sequence's own length, where readers mask, as for the shorter sequences
        // of a ragged batch)
        let keys_len = (ctx_lens.iter().max().copied().unwrap_or(0) + n)
            .next_multiple_of(KV_VIEW_MULTIPLE)
            .min(cache.capacity());
        // the whole capacity is a view on every backend; `kv_prefix` cuts it without the copy
        // Burn's slice makes for most lengths on CUDA (KernelOps::kv_prefix)
        let view = {
            let full = cache.view(li, cache.capacity());
            KvView {
                k: B::kv_prefix(full.k, keys_len),
                v: B::kv_prefix(full.v, keys_len),
            }
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let ctx = LayerAttnCtx {
            layer: li,
            phase,
            q: &q,
            k: &view.k,
            ctx_lens,
            n_new: n,
            scale,
        };
        let selection = timer.time("select", || hook.on_layer(&ctx))?;
        for (b, &l) in ctx_lens.iter().enumerate() {
            dense[b] += (l * kvh) as u64;
        }
        let dev = &self.device;
        let fused = self.kernels.unwrap_or(B::ATTENTION_KERNELS);
        // a hook that needs only the mass per key gets it from the scoring kernel, and the
        // layer keeps its fused attention
        let mut mass_done = false;
        if fused && n <= MAX_NEW && selection.is_none() && hook.wants_key_mass(li, phase) {
            let all: Vec<usize> = (0..nh).collect();
            let scored = timer.time("key_mass", || {
                fallback(B::head_subset_scores(
                    q.clone(),
                    view.k.clone(),
                    ctx_lens,
                    &all,
                    scale,
                ))
            })?;
            if let Some(mass) = scored {
                timer.time("select", || hook.on_key_mass(li, phase, &mass))?;
                mass_done = true;
            }
        }
        // context positions read, per sequence (the new tokens are not counted)
        match &selection {
            None => {
                for (b, &l) in ctx_lens.iter().enumerate() {
                    reads[b] += (l * kvh) as u64;
                }
            }
            Some(sel) => {
                for (b, &cnt) in sel.counts.iter().enumerate().take(batch) {
                    reads[b] += (cnt.min(ctx_lens[b]) * kvh) as u64;
                }
            }
        }
        let wants_probs = hook.wants_probs(li, phase);
        let out = timer.time("attention", || -> Result<Tensor<B, 3>> {
            let kernel_out = match &selection {
                None if fused && n <= MAX_NEW && (mass_done || !wants_probs) => fallback(
                    B::verify_attention(q.clone(), view.k.clone(), view.v.clone(), ctx_lens, scale),
                )?,
                None if self.prefill_attention_fused()
                    && n > MAX_NEW
                    && n <= MAX_PREFILL_NEW
                    && !wants_probs =>
                {
                    fallback(B::prefill_attention(
                        q.clone(),
                        view.k.clone(),
                        view.v.clone(),
                        ctx_lens,
                        scale,
                    ))?
                }
                Some(sel) if fused && n <= MAX_NEW => fallback(B::sparse_verify_attention(
                    q.clone(),
                    view.k.clone(),
                    view.v.clone(),
                    ctx_lens,
                    sel.indices.clone(),
                    &sel.counts,
                    scale,
                ))?,
                _ => None,
            };
            if let Some(out) = kernel_out {
                // [batch, q_heads, n, head_dim] -> [batch, n, q_heads * head_dim]: with one new
                // token the memory order is already right, and the reshape is a view (the
                // swap first made Burn copy it)
                return Ok(if n == 1 {
                    out.reshape([batch, 1, nh * hd])
                } else {
                    out.swap_dims(1, 2).reshape([batch, n, nh * hd])
                });
            }
            let qg = q.reshape([batch, kvh, g * n, hd]);
            let out = match selection {
                None => {
                    // key j is visible to new token i of sequence b iff j <= ctx_lens[b] + i
                    let mut mask = Vec::with_capacity(batch * n * keys_len);
                    for &l in ctx_lens {
                        for i in 0..n {
                            for j in 0..keys_len {
                                mask.push(if j <= l + i {
                                    0.0f32
                                } else {
                                    f32::NEG_INFINITY
                                });
                            }
                        }
                    }
                    let mask = Tensor::<B, 5>::from_data(
                        TensorData::new(mask, [batch, 1, 1, n, keys_len]),
                        dev,
                    );
                    let scores = qg.matmul(view.k.swap_dims(2, 3)).mul_scalar(scale);
                    let scores = scores.reshape([batch, kvh, g, n, keys_len]) + mask;
                    let probs =
                        activation::softmax(scores, 4).reshape([batch, kvh, g * n, keys_len]);
                    if !mass_done && hook.wants_probs(li, phase) {
                        hook.on_probs(li, phase, &probs.clone().reshape([batch, nh, n, keys_len]))?;
                    }
                    probs.matmul(view.v)
                }
                Some(sel) => {
                    let LayerSelection { indices, counts } = sel;
                    let [sb, sh, kk] = indices.dims();
                    if sb != batch || sh != kvh || counts.len() != batch {
                        return Err(QwenError::Core(dustin_core::CoreError::Shape {
                            name: format!("selection of layer {li}"),
                            expected: vec![batch, kvh, kk],
                            found: vec![sb, sh, kk],
                        }));
                    }
                    // flat row index ((b * kvh + h) * keys_len + pos) into [batch*kvh*keys_len, hd]
                    let offs: Vec<i64> = (0..batch * kvh).map(|r| (r * keys_len) as i64).collect();
                    let offs =
                        Tensor::<B, 3, Int>::from_data(TensorData::new(offs, [batch, kvh, 1]), dev);
                    let flat = (indices + offs).reshape([batch * kvh * kk]);
                    let kf = view.k.reshape([batch * kvh * keys_len, hd]);
                    let vf = view.v.reshape([batch * kvh * keys_len, hd]);
                    let ks = kf.select(0, flat.clone()).reshape([batch, kvh, kk, hd]);
                    let vs = vf.select(0, flat).reshape([batch, kvh, kk, hd]);
                    let ks = Tensor::cat(vec![ks, k], 2);
                    let vs = Tensor::cat(vec![vs, v], 2);
                    let m = kk + n;
                    let mut mask = Vec::with_capacity(batch * n * m);
                    for &cnt in &counts {
                        for i in 0..n {
                            for s in 0..m {
                                let ok = if s < kk { s < cnt } else { s - kk <= i };
                                mask.push(if ok { 0.0f32 } else { f32::NEG_INFINITY });
                            }
                        }
                    }
                    let mask =
                        Tensor::<B, 5>::from_data(TensorData::new(mask, [batch, 1, 1, n, m]), dev);
                    let scores = qg.matmul(ks.swap_dims(2, 3)).mul_scalar(scale);
                    let scores = scores.reshape([batch, kvh, g, n, m]) + mask;
                    let probs = activation::softmax(scores, 4).reshape([batch, kvh, g * n, m]);
                    probs.matmul(vs)
                }
            };
            Ok(out
                .reshape([batch, nh, n, hd])
                .swap_dims(1, 2)
                .reshape([batch, n, nh * hd]))
        })?;
        timer.time("o_proj", || self.linear(&layer.o, out))
    }
}

/// What every layer of one forward pass shares: its inputs, the cache and hook it writes to,
/// and the context positions read so far per sequence (read and dense counts).
struct Pass<'a, B: Backend, H: ?Sized> {
    timer: Timer<'a, B>,
    rope: &'a RopeAt<B>,
    ctx_lens: &'a [usize],
    n: usize,
    cache: &'a mut DenseKvCache<B>,
    hook: &'a mut H,
    phase: Phase,
    reads: Vec<u64>,
    dense: Vec<u64>,
}

/// The per-layer KV view (and with it every hook's keys and scores) spans a multiple of this
/// many positions: `max(ctx) + n` rounded up, at most the cache's capacity. The view's
/// length then changes once every 64 decoded tokens, not at every step. Each new length gave
/// the element-wise and reduction ops of the selection path (tensors `[batch, kv_heads,
/// len]`) new shapes, and so new vectorizations to compile and new keys to tune on CUDA in
/// the middle of decoding (H200, 2026-11-30: `dustin`'s verification at batch 1 took 144 to
/// 498 ms in four runs of one binary, 233 kernel compilations in a run of 8 iterations). Our
/// choice: 64, the widest vector (8) times 8.
pub const KV_VIEW_MULTIPLE: usize = 64;

/// A kernel's result, `None` where the backend's kernels do not take the input (dtype, head
/// width): the caller then runs its plain path.
fn fallback<T>(r: std::result::Result<T, KernelError>) -> Result<Option<T>> {
    match r {
        Ok(t) => Ok(Some(t)),
        Err(KernelError::Unsupported(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
