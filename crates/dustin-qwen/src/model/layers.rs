//! The building blocks of a decoder layer: weights, linear layers, RMSNorm, RoPE tables and
//! a layer's weights.

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};
use dustin_kernels::KernelOps;

use std::sync::Arc;

use dustin_kernels::cpu_quant::QuantMatrix;

#[cfg(doc)]
use crate::error::QwenError;
use crate::error::Result;

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
    /// ([`crate::WeightFormat::Blocks`]), multiplied by [`KernelOps::quant_linear`](dustin_kernels::LinearOps::quant_linear) where the
    /// backend has block kernels ([`KernelOps::QUANT_KERNELS`](dustin_kernels::LinearOps::QUANT_KERNELS)), else dequantized for each
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
    pub(super) fn forward_dense(&self, x: Tensor<B, 3>, w: Tensor<B, 2>) -> Tensor<B, 3> {
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
    pub(super) max_positions: usize,
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
    pub(super) cos: Tensor<B, 4>,
    pub(super) sin: Tensor<B, 4>,
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
    pub(super) fn map_each(&self, mut f: impl FnMut(&Linear<B>) -> Linear<B>) -> Self {
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

    pub(super) fn staged_on(
        &self,
        device: &B::Device,
        stream: cubecl_common::stream_id::StreamId,
    ) -> Self {
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
