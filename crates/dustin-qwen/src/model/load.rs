//! Building a model: from a weight source, with random weights, and as a tensor-parallel
//! shard of another.

use burn_tensor::{backend::Backend, Tensor, TensorData};

use std::sync::Arc;

use dustin_kernels::cpu_quant::QuantMatrix;
use dustin_kernels::KernelConfig;

#[cfg(doc)]
use super::WEIGHT_TABLE;
use super::{Layer, Linear, Qwen2, RmsNorm, Rope, Weight};
use crate::blocks::{Embedding, WeightFormat};
use crate::config::QwenConfig;
use crate::error::{QwenError, Result};
use crate::offload::HostWeight;
use crate::tp::{check_divisible, TpRank};
use crate::weights::{HostTensor, WeightSource};

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

/// `build()` with its weights in exact-size device buffers, not in pool pages
/// ([`dustin_core::memory::persistent`]), then the builder's temporaries given back
/// ([`crate::offload::release_freed`]).
fn built_persistently<B: Backend>(
    device: &B::Device,
    build: impl Fn() -> Result<Qwen2<B>> + Send,
) -> Result<Qwen2<B>> {
    let model = dustin_core::memory::persistent::<B, _, _>(device, (), move |()| build())?;
    crate::offload::release_freed::<B>(device)?;
    Ok(model)
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
        built_persistently(device, || {
            Self::load_inner(config, src, max_positions, device, offloaded, format)
        })
    }

    fn load_inner(
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
            kernels: KernelConfig::default(),
            prefetch: true,
            tp: None,
            profile: None,
            cancel: None,
            head_subset: None,
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
        built_persistently(device, || {
            Self::random_inner(config, max_positions, device, offloaded, None)
        })
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
            kernels: KernelConfig::default(),
            prefetch: true,
            tp,
            profile: None,
            cancel: None,
            head_subset: None,
        })
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
            prefetch: self.prefetch,
            tp: Some(rank),
            profile: self.profile,
            cancel: self.cancel.clone(),
            head_subset: None,
        })
    }
}
