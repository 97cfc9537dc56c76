//! The forward pass: embedding, the layer loop with offloaded layers staged on the device,
//! the MLP, norms and residual adds, the linear layers' kernels and the LM head.

use burn_tensor::{activation, backend::Backend, Int, Tensor, TensorData};
use dustin_core::{AttentionHook, KvStore, Phase};
use dustin_kernels::{KernelError, KernelOps};
use dustin_kv::DenseKvCache;

use super::{
    ForwardOpts, ForwardOut, Layer, Linear, LogitsMode, Qwen2, RmsNorm, RopeAt, Weight,
    UPLOAD_STREAM,
};
use crate::error::{QwenError, Result};
use crate::profile::Timer;

impl<B: KernelOps> Qwen2<B> {
    /// `norm` applied to `x` `[batch, n, hidden]`, by the fused kernel when chosen.
    fn norm_forward(&self, norm: &RmsNorm<B>, x: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
        if self.kernels.elementwise.resolve(B::ELEMENTWISE_KERNELS) {
            if let Some(t) = fallback(B::rms_norm(x.clone(), norm.weight.clone(), norm.eps))? {
                return Ok(t);
            }
        }
        Ok(norm.forward(x))
    }

    /// `lin`'s weight `[in, out]` dense on `device`: a packed (substitute) weight dequantized
    /// by the fused kernel when chosen, else [`Weight::to_dense`].
    pub(super) fn dense_weight(&self, lin: &Linear<B>, device: &B::Device) -> Result<Tensor<B, 2>> {
        if let Weight::Packed(p) = &lin.weight {
            if self.kernels.elementwise.resolve(B::FUSED) {
                if let Some(w) = fallback(p.dequantize_fused())? {
                    return Ok(w);
                }
            }
        }
        lin.weight.to_dense(device)
    }

    /// Whether a product of `rows` rows goes through the skinny GEMM
    /// ([`Qwen2::with_skinny_gemm`], at most [`KernelOps::skinny_max_rows`](dustin_kernels::LinearOps::skinny_max_rows) rows).
    fn skinny_rows(&self, rows: usize) -> bool {
        self.kernels.skinny_gemm.resolve(B::SKINNY_GEMM)
            && rows <= B::skinny_max_rows(&self.kernels)
    }

    /// `x . head` for `x` `[rows, hidden]` and an LM head `[hidden, n]`: `[rows, n]`.
    fn head_product(&self, head: &Weight<B>, x: Tensor<B, 2>, rows: usize) -> Result<Tensor<B, 2>> {
        Ok(match head {
            Weight::Blocks(q) if B::QUANT_KERNELS => B::quant_linear(x, q, None)?,
            Weight::Dense(w) if self.skinny_rows(rows) => B::skinny_linear(x, w.clone(), None)?,
            head => x.matmul(head.to_dense(&self.device)?),
        })
    }

    /// Whether `rows` rows go through the grouped skinny GEMMs ([`Qwen2::with_grouped_gemm`]).
    pub(super) fn grouped(&self, rows: usize) -> bool {
        self.kernels.grouped_gemm.resolve(true) && self.skinny_rows(rows)
    }

    /// `lin` applied to `x` `[batch, n, in]`; a packed (substitute) weight is dequantized by
    /// the fused kernel when chosen ([`crate::substitute::PackedWeight::dequantize_fused`]).
    /// With [`Qwen2::with_skinny_gemm`], `x` of at most [`KernelOps::skinny_max_rows`](dustin_kernels::LinearOps::skinny_max_rows)
    /// rows goes through [`KernelOps::skinny_linear`](dustin_kernels::LinearOps::skinny_linear); with [`Qwen2::with_prefill_gemm`], `x`
    /// of at least [`dustin_kernels::PREFILL_GEMM_MIN_ROWS`] rows through
    /// [`KernelOps::prefill_linear`](dustin_kernels::LinearOps::prefill_linear).
    pub(super) fn linear(&self, lin: &Linear<B>, x: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
        let [b, n, d] = x.dims();
        if let Weight::Blocks(q) = &lin.weight {
            // decode and verify rows (up to the skinny GEMM's rows) through the block kernels;
            // a prefill chunk decodes the weight for Burn's matmul: with the prompt's rows
            // quantized to int8 the logits of Qwen2.5-Coder-1.5B moved by up to 1.29 from
            // HF's (the first positions' large activations leave the rest of their blocks
            // few steps), against 0.085 this way (tests/pair_parity.rs)
            if B::QUANT_KERNELS && b * n <= B::skinny_max_rows(&self.kernels) {
                let y = B::quant_linear(x.reshape([b * n, d]), q, lin.bias.clone())?;
                return Ok(y.reshape([b, n, q.rows()]));
            }
            // prefill chunks through the backend's f32-accurate block product where it has
            // one (AMX on the CPU: the activations split into two bf16 parts, not int8)
            if self
                .kernels
                .quant_prefill
                .resolve(B::quant_prefill_available())
            {
                let y = B::quant_prefill_linear(x.reshape([b * n, d]), q, lin.bias.clone())?;
                return Ok(y.reshape([b, n, q.rows()]));
            }
        }
        let w = self.dense_weight(lin, &x.device())?;
        if self.skinny_rows(b * n) {
            let out = w.dims()[1];
            let y = B::skinny_linear(x.reshape([b * n, d]), w, lin.bias.clone())?;
            return Ok(y.reshape([b, n, out]));
        }
        if self.kernels.prefill_gemm.resolve(B::FUSED)
            && b * n >= dustin_kernels::PREFILL_GEMM_MIN_ROWS
        {
            let out = w.dims()[1];
            let y = B::prefill_linear(x.reshape([b * n, d]), w, lin.bias.clone())?;
            return Ok(y.reshape([b, n, out]));
        }
        Ok(lin.forward_dense(x, w))
    }

    /// Each of `lins` applied to one `x` `[batch, n, in]`, in order, as [`Qwen2::linear`]
    /// would; where that would take [`KernelOps::prefill_linear`](dustin_kernels::LinearOps::prefill_linear), the products go through
    /// [`KernelOps::prefill_linear_many`](dustin_kernels::LinearOps::prefill_linear_many) together (on CUDA one pair of device waits for
    /// all of them) from [`dustin_kernels::PREFILL_MANY_MIN_ROWS`] rows, except where a
    /// weight is packed (a substitute draft's): dequantized
    /// together, the weights would all be dense at once, so those go one at a time as
    /// before.
    pub(super) fn linear_many<const N: usize>(
        &self,
        lins: [&Linear<B>; N],
        x: Tensor<B, 3>,
    ) -> Result<[Tensor<B, 3>; N]> {
        let [b, n, d] = x.dims();
        let rows = b * n;
        let ys: Vec<Tensor<B, 3>> = if self.skinny_rows(rows)
            || !self.kernels.prefill_gemm.resolve(B::FUSED)
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
    pub(super) fn rope_forward(&self, rope: &RopeAt<B>, x: Tensor<B, 4>) -> Result<Tensor<B, 4>> {
        if self.kernels.elementwise.resolve(B::ELEMENTWISE_KERNELS) {
            if let Some(t) = fallback(B::rope(x.clone(), rope.cos.clone(), rope.sin.clone()))? {
                return Ok(t);
            }
        }
        Ok(rope.apply(x))
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
        check_batch(batch, n, cache)?;
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
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(flat, [batch * n]), &self.device);
        self.forward_flat(ids, batch, n, cache, hook, opts)
    }

    /// [`Qwen2::forward`] of token ids already on the device, `ids` `[batch, n]` (for
    /// example a draft's greedy choices, fed to its next step without a read back to the
    /// host). The ids cannot be checked without that read back: any outside `0 ..
    /// vocab_size` are clamped into it, and a caller that can produce such ids checks them
    /// itself when it reads them.
    ///
    /// # Errors
    /// As [`Qwen2::forward`], without the token checks: [`QwenError::Prompt`] for a batch
    /// other than the cache's, no sequences or no tokens; cache and hook errors.
    pub fn forward_ids<H: AttentionHook<B> + ?Sized>(
        &self,
        ids: Tensor<B, 2, Int>,
        cache: &mut DenseKvCache<B>,
        hook: &mut H,
        opts: ForwardOpts,
    ) -> Result<ForwardOut<B>> {
        let [batch, n] = ids.dims();
        check_batch(batch, n, cache)?;
        let top = self.config.vocab_size.saturating_sub(1) as i64;
        let ids = ids
            .to_device(&self.device)
            .clamp(0, top)
            .reshape([batch * n]);
        self.forward_flat(ids, batch, n, cache, hook, opts)
    }

    /// The forward pass of `ids` `[batch * n]` (sequence-major, in the vocabulary), checked
    /// against `cache` by [`check_batch`].
    fn forward_flat<H: AttentionHook<B> + ?Sized>(
        &self,
        ids: Tensor<B, 1, Int>,
        batch: usize,
        n: usize,
        cache: &mut DenseKvCache<B>,
        hook: &mut H,
        opts: ForwardOpts,
    ) -> Result<ForwardOut<B>> {
        // the launch paths read the kernel choices of the device (a read lock where they are
        // installed already)
        B::set_kernel_config(&self.device, &self.kernels);
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
        let prefill = matches!(opts.phase, Phase::Prefill { .. });
        for li in 0..n_layers {
            // a prefill stops between layers once cancelled (`with_cancel`): on a CPU a chunk
            // of a long prompt takes tens of seconds; the cache keeps the layers written
            if prefill && self.cancelled() {
                return Err(QwenError::Core(dustin_core::CoreError::Cancelled {
                    during: "prefill",
                }));
            }
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
                let rows = b * m;
                let product = |x: Tensor<B, 2>| -> Result<Tensor<B, 2>> {
                    Ok(match &self.head_subset {
                        Some(sub) => sub.expand(self.head_product(&sub.weight, x, rows)?),
                        None => self.head_product(&self.lm_head, x, rows)?,
                    })
                };
                // decode and verification logits (a few rows x the vocabulary, and the
                // split-K GEMM's f32 partial sums) in exact-size persistent buffers, which the
                // next step of the same rows reuses: in CubeCL's dynamic pool each opened a
                // page of 1.33 GB at the pair's shapes (batch 16, 32k; docs/perf.md,
                // "`dustin`'s extra memory"). Prefill rows stay in the pool: their sizes vary.
                let y = if self.skinny_rows(rows) {
                    dustin_core::memory::persistent::<B, _, _>(&self.device, x, product)?
                } else {
                    product(x)?
                };
                Ok(y.reshape([b, m, self.config.vocab_size]))
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
            let act = if self.kernels.elementwise.resolve(B::ELEMENTWISE_KERNELS) {
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
        self.kernels.fused_residual.resolve(false)
            && self.kernels.elementwise.resolve(B::ELEMENTWISE_KERNELS)
    }

    /// `x + delta` (when there is a delta; `delta` on the left, see `layer_forward`) and its
    /// RMSNorm, as one [`KernelOps::add_rms_norm`](dustin_kernels::ElementwiseOps::add_rms_norm) when the fused residual is on.
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
}

/// What every layer of one forward pass shares: its inputs, the cache and hook it writes to,
/// and the context positions read so far per sequence (read and dense counts).
pub(super) struct Pass<'a, B: Backend, H: ?Sized> {
    pub(super) timer: Timer<'a, B>,
    pub(super) rope: &'a RopeAt<B>,
    pub(super) ctx_lens: &'a [usize],
    pub(super) n: usize,
    pub(super) cache: &'a mut DenseKvCache<B>,
    pub(super) hook: &'a mut H,
    pub(super) phase: Phase,
    pub(super) reads: Vec<u64>,
    pub(super) dense: Vec<u64>,
}

/// Whether any of `lins` holds a block weight (which the grouped GEMMs do not take).
pub(super) fn any_blocks<B: Backend>(lins: &[&Linear<B>]) -> bool {
    lins.iter().any(|l| matches!(l.weight, Weight::Blocks(_)))
}

/// A kernel's result, `None` where the backend's kernels do not take the input (dtype, head
/// width): the caller then runs its plain path.
pub(super) fn fallback<T>(r: std::result::Result<T, KernelError>) -> Result<Option<T>> {
    match r {
        Ok(t) => Ok(Some(t)),
        Err(KernelError::Unsupported(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Checks a forward pass of `batch` sequences of `n` new tokens each against `cache`.
///
/// # Errors
/// [`QwenError::Prompt`] for a batch other than the cache's, no sequences or no new tokens.
fn check_batch<B: KernelOps>(batch: usize, n: usize, cache: &DenseKvCache<B>) -> Result<()> {
    if batch == 0 {
        return Err(QwenError::Prompt {
            index: 0,
            msg: "no sequences".into(),
        });
    }
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
    Ok(())
}
