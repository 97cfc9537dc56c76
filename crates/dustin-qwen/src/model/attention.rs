//! The attention of one decoder layer (dense, sparse over a hook's selection, or through
//! the backend's kernels) and the attention mass per key of queries already run.

use burn_tensor::{activation, Int, Tensor, TensorData};
use dustin_core::{AttentionHook, KvStore, KvView, LayerAttnCtx, LayerSelection};
use dustin_kernels::{KernelOps, MAX_NEW, MAX_PREFILL_NEW};
use dustin_kv::DenseKvCache;

use super::forward::{any_blocks, fallback, Pass};
use super::{Layer, Linear, Qwen2, KV_VIEW_MULTIPLE};
use crate::error::{QwenError, Result};

impl<B: KernelOps> Qwen2<B> {
    /// Whether the dense attention of prefill chunks runs as the backend's kernel
    /// ([`KernelOps::prefill_attention`](dustin_kernels::AttentionOps::prefill_attention), no score matrix in memory): the model's kernels on
    /// ([`Qwen2::with_kernels`], by default where the backend has them), its prefill kernel
    /// on ([`Qwen2::with_prefill_attention`]) and its head width one the backend takes
    /// ([`KernelOps::PREFILL_HEAD_DIMS`](dustin_kernels::AttentionOps::PREFILL_HEAD_DIMS)). Chunks whose probabilities a hook wants take the
    /// plain path either way.
    pub fn prefill_attention_fused(&self) -> bool {
        self.kernels.attention.resolve(B::ATTENTION_KERNELS)
            && self.kernels.prefill_attention.resolve(true)
            && B::PREFILL_HEAD_DIMS.contains(&self.config.head_dim())
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
            let kernel = if self.kernels.attention.resolve(B::ATTENTION_KERNELS) {
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

    pub(super) fn attention<H: AttentionHook<B> + ?Sized>(
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
        let kv_kernel = self.kernels.kv_write.resolve(B::ATTENTION_KERNELS);
        // a row of a batch cache writes with Burn's slice-assign, not the write closures
        let (q, k) = if kv_kernel
            && !cache.is_row()
            && self.kernels.rope_kv_write.resolve(false)
            && self.kernels.elementwise.resolve(B::ELEMENTWISE_KERNELS)
        {
            // one op: the cache takes the rotated keys the op returns (the closure runs once)
            let roped = std::cell::RefCell::new(None);
            timer.time("rope_kv_append", || {
                cache.append_pair_with(li, k, v.clone(), |kd, vd, ks, vs, lens| {
                    let out = B::rope_kv_write(
                        q.clone(),
                        ks,
                        vs,
                        rope.cos.clone(),
                        rope.sin.clone(),
                        kd,
                        vd,
                        lens,
                    )
                    .map_err(|e| dustin_core::CoreError::Model(format!("rope_kv_write: {e}")))?;
                    *roped.borrow_mut() = Some((out.q, out.k));
                    Ok((out.k_dst, out.v_dst))
                })
            })?;
            roped.into_inner().ok_or_else(|| {
                QwenError::Core(dustin_core::CoreError::Model(
                    "rope_kv_write: no output".into(),
                ))
            })?
        } else {
            let (q, k) = timer.time("rope", || -> Result<_> {
                Ok((self.rope_forward(rope, q)?, self.rope_forward(rope, k)?))
            })?;
            timer.time("kv_append", || {
                if kv_kernel {
                    cache.append_pair_with(li, k.clone(), v.clone(), |kd, vd, ks, vs, lens| {
                        B::kv_write_pair(kd, vd, ks, vs, lens).map_err(|e| {
                            dustin_core::CoreError::Model(format!("kv_write_pair: {e}"))
                        })
                    })
                } else {
                    cache.append(li, k.clone(), v.clone())
                }
            })?;
            (q, k)
        };
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
        let fused = self.kernels.attention.resolve(B::ATTENTION_KERNELS);
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
