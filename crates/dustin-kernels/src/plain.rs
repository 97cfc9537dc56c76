//! The plain path: every op from Burn tensor ops (and host code for the top-k), generic over
//! the backend. [`KernelOps`](crate::KernelOps) for `burn_flex::Flex` calls these; they are
//! also the fallback for any other backend. Same shapes and rules as the trait's docs.

use burn_tensor::{activation, backend::Backend, Int, Tensor, TensorData};

use crate::{
    check_attn, check_attn_upto, check_fold, check_heads, check_mix, check_pages, check_selection,
    check_top_k, Keep, KernelError, Positions, Result, MAX_NEW, MAX_PREFILL_NEW,
};

/// Additive causal mask `[batch, 1, 1, n, l]`: key `j` visible to query `i` of `b` iff
/// `j <= ctx_lens[b] + i`.
fn causal_mask<B: Backend>(
    ctx_lens: &[usize],
    n: usize,
    l: usize,
    device: &B::Device,
) -> Tensor<B, 5> {
    let b = ctx_lens.len();
    let mut m = Vec::with_capacity(b * n * l);
    for &c in ctx_lens {
        for i in 0..n {
            let lim = (c + i + 1).min(l);
            m.extend(std::iter::repeat_n(0.0f32, lim));
            m.extend(std::iter::repeat_n(f32::NEG_INFINITY, l - lim));
        }
    }
    Tensor::from_data(TensorData::new(m, [b, 1, 1, n, l]), device)
}

/// The first `l` cache positions with every slot at or past `ctx_lens[b] + n` zeroed (stale
/// slots may hold anything, NaN too; masked scores alone would turn NaN into NaN).
fn live_keys<B: Backend>(t: Tensor<B, 4>, ctx_lens: &[usize], n: usize, l: usize) -> Tensor<B, 4> {
    let [b, h, _, d] = t.dims();
    let device = t.device();
    let mut stale = Vec::with_capacity(b * l);
    for &c in ctx_lens {
        stale.extend((0..l).map(|p| p >= c + n));
    }
    let stale =
        Tensor::<B, 4, burn_tensor::Bool>::from_data(TensorData::new(stale, [b, 1, l, 1]), &device)
            .expand([b, h, l, d]);
    t.narrow(2, 0, l).mask_fill(stale, 0.0)
}

fn check_v(k: [usize; 4], v: [usize; 4]) -> Result<()> {
    if k == v {
        Ok(())
    } else {
        Err(KernelError::Shape {
            name: "v",
            expected: k.to_vec(),
            found: v.to_vec(),
        })
    }
}

/// Dense verify attention ([`KernelOps::verify_attention`](crate::AttentionOps::verify_attention)).
///
/// # Errors
/// As the trait method.
pub fn verify_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    ctx_lens: &[usize],
    scale: f32,
) -> Result<Tensor<B, 4>> {
    dense_attention(q, k, v, ctx_lens, scale, MAX_NEW)
}

/// Cache write ([`KernelOps::kv_write`](crate::MemoryOps::kv_write)): one slice-assign for
/// equal starts, one slice and slice-assign per sequence otherwise.
///
/// # Errors
/// As the trait method.
pub fn kv_write<B: Backend>(
    dst: Tensor<B, 4>,
    src: Tensor<B, 4>,
    starts: &[usize],
) -> Result<Tensor<B, 4>> {
    crate::check_kv_write(dst.dims(), src.dims(), starts)?;
    let [_, h, n, d] = src.dims();
    if n == 0 {
        return Ok(dst);
    }
    if starts.windows(2).all(|w| w[0] == w[1]) {
        let start = starts.first().copied().unwrap_or(0);
        return Ok(dst.slice_assign([0..starts.len(), 0..h, start..start + n, 0..d], src));
    }
    let mut dst = dst;
    for (b, &start) in starts.iter().enumerate() {
        let row = src.clone().slice([b..b + 1, 0..h, 0..n, 0..d]);
        dst = dst.slice_assign([b..b + 1, 0..h, start..start + n, 0..d], row);
    }
    Ok(dst)
}

/// Dense prefill attention
/// ([`KernelOps::prefill_attention`](crate::AttentionOps::prefill_attention)): the verify
/// attention's masked score matrix for up to [`MAX_PREFILL_NEW`] new tokens. The matrix is
/// `[batch, kv_heads, group * n_new, ctx + n_new]` in `q`'s dtype: keep chunks small (the
/// model's automatic chunk here is 512; 32768 new tokens over themselves at 28 heads would
/// be 120 GB in f32).
///
/// # Errors
/// As the trait method.
pub fn prefill_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    ctx_lens: &[usize],
    scale: f32,
) -> Result<Tensor<B, 4>> {
    dense_attention(q, k, v, ctx_lens, scale, MAX_PREFILL_NEW)
}

fn dense_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    ctx_lens: &[usize],
    scale: f32,
    max_new: usize,
) -> Result<Tensor<B, 4>> {
    let dims = check_attn_upto(q.dims(), k.dims(), ctx_lens, max_new)?;
    check_v(k.dims(), v.dims())?;
    let (b, kvh, n, d, l, g) = (
        dims.batch,
        dims.kv_heads,
        dims.n_new,
        dims.head_dim,
        dims.keys,
        dims.group(),
    );
    let device = q.device();
    let kk = live_keys(k, ctx_lens, n, l);
    let vv = live_keys(v, ctx_lens, n, l);
    let scores = q
        .reshape([b, kvh, g * n, d])
        .matmul(kk.swap_dims(2, 3))
        .mul_scalar(scale)
        .reshape([b, kvh, g, n, l])
        + causal_mask::<B>(ctx_lens, n, l, &device);
    let p = activation::softmax(scores, 4).reshape([b, kvh, g * n, l]);
    Ok(p.matmul(vv).reshape([b, dims.q_heads, n, d]))
}

/// Sparse verify attention
/// ([`KernelOps::sparse_verify_attention`](crate::AttentionOps::sparse_verify_attention)):
/// gathers the selected rows and the new tokens, then attends with a mask.
///
/// # Errors
/// As the trait method.
#[allow(clippy::too_many_arguments)]
pub fn sparse_verify_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    ctx_lens: &[usize],
    indices: Tensor<B, 3, Int>,
    counts: &[usize],
    scale: f32,
) -> Result<Tensor<B, 4>> {
    let dims = check_attn(q.dims(), k.dims(), ctx_lens)?;
    check_v(k.dims(), v.dims())?;
    check_selection(&dims, indices.dims(), counts)?;
    let (b, kvh, n, d, g, cap) = (
        dims.batch,
        dims.kv_heads,
        dims.n_new,
        dims.head_dim,
        dims.group(),
        dims.capacity,
    );
    let budget = indices.dims()[2];
    let m = budget + n;
    let device = q.device();
    let ctx_i: Vec<i64> = ctx_lens.iter().map(|&c| c as i64).collect();
    let ctx_t = Tensor::<B, 1, Int>::from_data(TensorData::new(ctx_i, [b]), &device)
        .reshape([b, 1, 1])
        .expand([b, kvh, budget]);
    let cnt_i: Vec<i64> = counts.iter().map(|&c| c as i64).collect();
    let cnt_t = Tensor::<B, 1, Int>::from_data(TensorData::new(cnt_i, [b]), &device)
        .reshape([b, 1, 1])
        .expand([b, kvh, budget]);
    let slot = Tensor::<B, 1, Int>::arange(0..budget as i64, &device)
        .reshape([1, 1, budget])
        .expand([b, kvh, budget]);
    // a listed position is read iff slot < count and 0 <= position < ctx
    let valid = slot
        .lower(cnt_t)
        .bool_and(indices.clone().greater_equal_elem(0))
        .bool_and(indices.clone().lower(ctx_t));
    let ctx_mask = Tensor::<B, 3>::zeros([b, kvh, budget], &device)
        .mask_fill(valid.clone().bool_not(), f32::NEG_INFINITY)
        .reshape([b, kvh, 1, 1, budget])
        .expand([b, kvh, 1, n, budget]);
    let mut new_mask = Vec::with_capacity(b * n * n);
    for _ in 0..b {
        for i in 0..n {
            for j in 0..n {
                new_mask.push(if j <= i { 0.0f32 } else { f32::NEG_INFINITY });
            }
        }
    }
    let new_mask = Tensor::<B, 5>::from_data(TensorData::new(new_mask, [b, 1, 1, n, n]), &device)
        .expand([b, kvh, 1, n, n]);
    let mask = Tensor::cat(vec![ctx_mask, new_mask], 4);
    // positions: the selection (invalid ones replaced by 0) then ctx_b + i
    let sel = indices.mask_fill(valid.bool_not(), 0);
    let mut newp = Vec::with_capacity(b * kvh * n);
    for &c in ctx_lens {
        for _ in 0..kvh {
            newp.extend((0..n).map(|i| (c + i) as i64));
        }
    }
    let newp = Tensor::<B, 3, Int>::from_data(TensorData::new(newp, [b, kvh, n]), &device);
    let pos = Tensor::cat(vec![sel, newp], 2);
    let offs: Vec<i64> = (0..b * kvh).map(|r| (r * cap) as i64).collect();
    let offs = Tensor::<B, 3, Int>::from_data(TensorData::new(offs, [b, kvh, 1]), &device);
    let flat = (pos + offs).reshape([b * kvh * m]);
    let ks = k
        .reshape([b * kvh * cap, d])
        .select(0, flat.clone())
        .reshape([b, kvh, m, d]);
    let vs = v
        .reshape([b * kvh * cap, d])
        .select(0, flat)
        .reshape([b, kvh, m, d]);
    let scores = q
        .reshape([b, kvh, g * n, d])
        .matmul(ks.swap_dims(2, 3))
        .mul_scalar(scale)
        .reshape([b, kvh, g, n, m])
        + mask;
    let p = activation::softmax(scores, 4).reshape([b, kvh, g * n, m]);
    Ok(p.matmul(vs).reshape([b, dims.q_heads, n, d]))
}

/// Head-subset scores
/// ([`KernelOps::head_subset_scores`](crate::SelectionOps::head_subset_scores)).
///
/// # Errors
/// As the trait method.
pub fn head_subset_scores<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    ctx_lens: &[usize],
    heads: &[usize],
    scale: f32,
) -> Result<Tensor<B, 3>> {
    let rows = head_subset_row_scores(q, k, ctx_lens, heads, scale)?;
    let [b, kvh, _, l] = rows.dims();
    Ok(rows.sum_dim(2).reshape([b, kvh, l]))
}

/// Per-row head-subset scores
/// ([`KernelOps::head_subset_row_scores`](crate::SelectionOps::head_subset_row_scores)).
///
/// # Errors
/// As the trait method.
pub fn head_subset_row_scores<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    ctx_lens: &[usize],
    heads: &[usize],
    scale: f32,
) -> Result<Tensor<B, 4>> {
    let dims = check_attn(q.dims(), k.dims(), ctx_lens)?;
    check_heads(heads, dims.q_heads)?;
    // every position of `k` (see the trait method): those past ctx + n are masked
    let (b, kvh, n, l, g) = (
        dims.batch,
        dims.kv_heads,
        dims.n_new,
        dims.capacity,
        dims.group(),
    );
    let e = heads.len();
    let device = q.device();
    let qh: Vec<i64> = heads.iter().map(|&h| h as i64).collect();
    let kh: Vec<i64> = heads.iter().map(|&h| (h / g) as i64).collect();
    let qh = Tensor::<B, 1, Int>::from_data(TensorData::new(qh, [e]), &device);
    let kh = Tensor::<B, 1, Int>::from_data(TensorData::new(kh, [e]), &device);
    let logits = q
        .select(1, qh)
        .matmul(live_keys(k, ctx_lens, n, l).select(1, kh).swap_dims(2, 3))
        .mul_scalar(scale)
        .reshape([b, e, 1, n, l])
        + causal_mask::<B>(ctx_lens, n, l, &device);
    let p = activation::softmax(logits, 4).reshape([b, e, n * l]);
    let mut mix = vec![0.0f32; kvh * e];
    for (i, &h) in heads.iter().enumerate() {
        mix[(h / g) * e + i] = 1.0;
    }
    let mix =
        Tensor::<B, 3>::from_data(TensorData::new(mix, [1, kvh, e]), &device).expand([b, kvh, e]);
    Ok(mix.matmul(p).reshape([b, kvh, n, l]))
}

/// The `dustin` history fold ([`KernelOps::fold_rows`](crate::SelectionOps::fold_rows)).
pub fn fold_rows<B: Backend>(
    hist: Option<Tensor<B, 3>>,
    factor: &[f32],
    rows: Tensor<B, 4>,
    w: &[f32],
    own: &[f32],
    all: &[f32],
) -> Result<Tensor<B, 3>> {
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
    let t4 = |v: &[f32], shape: [usize; 4]| {
        Tensor::<B, 4>::from_data(TensorData::new(v.to_vec(), shape), &device)
            .expand([b, kvh, n, l])
    };
    let mut mixed = if own.iter().all(|&x| x == 1.0) {
        rows.clone()
    } else {
        rows.clone() * t4(own, [1, kvh, 1, 1])
    };
    if all.iter().any(|&x| x != 0.0) {
        mixed = mixed + rows.sum_dim(1).expand([b, kvh, n, l]) * t4(all, [1, kvh, 1, 1]);
    }
    let add = (mixed * t4(w, [b, 1, n, 1]))
        .sum_dim(2)
        .reshape([b, kvh, l]);
    Ok(match hist {
        // one factor for the whole batch (as in a verification's provisional fold): no upload
        Some(h) if factor.windows(2).all(|p| p[0] == p[1]) && b > 0 => {
            h.mul_scalar(factor[0]) + add
        }
        Some(h) => {
            let f = Tensor::<B, 3>::from_data(TensorData::new(factor.to_vec(), [b, 1, 1]), &device);
            h * f.expand([b, kvh, l]) + add
        }
        None => add,
    })
}

/// The `dustin` normalise-and-mix ([`KernelOps::mix_scores`](crate::SelectionOps::mix_scores)).
pub fn mix_scores<B: Backend>(
    hist: Tensor<B, 3>,
    la: Option<Tensor<B, 2>>,
    free: &[(usize, usize)],
    alpha: f32,
    width: usize,
) -> Result<Tensor<B, 3>> {
    let [b, kvh, _] = hist.dims();
    check_mix(b, la.as_ref().map(Tensor::dims), free, alpha)?;
    let device = hist.device();
    let mut mask = vec![0.0f32; b * width];
    for (row, &(lo, hi)) in mask.chunks_mut(width.max(1)).zip(free) {
        row.iter_mut()
            .take(hi.min(width))
            .skip(lo)
            .for_each(|x| *x = 1.0);
    }
    let mask = Tensor::<B, 3>::from_data(TensorData::new(mask, [b, 1, width]), &device);
    let norm = |x: Tensor<B, 3>| {
        let r = x.dims()[1];
        let x = fit_width(x, width) * mask.clone().expand([b, r, width]);
        let sum = x.clone().sum_dim(2).clamp_min(1e-30);
        x / sum
    };
    let hist_n = norm(hist);
    Ok(match la {
        None => hist_n,
        Some(la) => {
            let la_n = norm(la.unsqueeze_dim(1)).expand([b, kvh, width]);
            la_n.mul_scalar(alpha) + hist_n.mul_scalar(1.0 - alpha)
        }
    })
}

/// `x` `[batch, rows, len]` cut or zero-padded to `[batch, rows, width]`.
fn fit_width<B: Backend>(x: Tensor<B, 3>, width: usize) -> Tensor<B, 3> {
    let [b, r, l] = x.dims();
    if l >= width {
        x.narrow(2, 0, width)
    } else {
        let (device, dtype) = (x.device(), x.dtype());
        Tensor::cat(
            vec![x, Tensor::zeros([b, r, width - l], (&device, dtype))],
            2,
        )
    }
}

/// Quest page bounds
/// ([`KernelOps::quest_page_bounds`](crate::SelectionOps::quest_page_bounds)).
///
/// # Errors
/// As the trait method.
pub fn quest_page_bounds<B: Backend>(
    k: Tensor<B, 4>,
    ctx_lens: &[usize],
    page_size: usize,
) -> Result<(Tensor<B, 4>, Tensor<B, 4>)> {
    let [b, kvh, cap, d] = k.dims();
    let pages = check_pages(ctx_lens, b, cap, page_size)?;
    let device = k.device();
    let cp = pages * page_size;
    let avail = cp.min(cap);
    let mut keys = k.narrow(2, 0, avail);
    if avail < cp {
        keys = Tensor::cat(
            vec![keys, Tensor::zeros([b, kvh, cp - avail, d], &device)],
            2,
        );
    }
    // per position: 0 inside the context of b, 1 outside
    let mut outside = Vec::with_capacity(b * cp);
    for &c in ctx_lens {
        outside.extend((0..cp).map(|p| p >= c));
    }
    let outside = Tensor::<B, 4, burn_tensor::Bool>::from_data(
        TensorData::new(outside, [b, 1, cp, 1]),
        &device,
    )
    .expand([b, kvh, cp, d]);
    let kmin = keys
        .clone()
        .mask_fill(outside.clone(), f32::INFINITY)
        .reshape([b, kvh, pages, page_size, d])
        .min_dim(3)
        .reshape([b, kvh, pages, d]);
    let kmax = keys
        .mask_fill(outside, f32::NEG_INFINITY)
        .reshape([b, kvh, pages, page_size, d])
        .max_dim(3)
        .reshape([b, kvh, pages, d]);
    let empty =
        page_empty_mask::<B>(ctx_lens, pages, page_size, &device).expand([b, kvh, pages, d]);
    Ok((
        kmin.mask_fill(empty.clone(), 0.0),
        kmax.mask_fill(empty, 0.0),
    ))
}

/// `[batch, 1, pages, 1]`: true where the page starts at or past the context.
fn page_empty_mask<B: Backend>(
    ctx_lens: &[usize],
    pages: usize,
    page_size: usize,
    device: &B::Device,
) -> Tensor<B, 4, burn_tensor::Bool> {
    let b = ctx_lens.len();
    let mut e = Vec::with_capacity(b * pages);
    for &c in ctx_lens {
        e.extend((0..pages).map(|p| p * page_size >= c));
    }
    Tensor::from_data(TensorData::new(e, [b, 1, pages, 1]), device)
}

/// Quest page scores
/// ([`KernelOps::quest_page_scores`](crate::SelectionOps::quest_page_scores)), as
/// `relu(q) . max + min(q, 0) . min` (two matmuls, same value as the elementwise max).
///
/// # Errors
/// As the trait method.
pub fn quest_page_scores<B: Backend>(
    q: Tensor<B, 4>,
    kmin: Tensor<B, 4>,
    kmax: Tensor<B, 4>,
    ctx_lens: &[usize],
    page_size: usize,
) -> Result<Tensor<B, 3>> {
    let pages = crate::check_quest_scores(q.dims(), kmin.dims(), kmax.dims(), ctx_lens, page_size)?;
    let [b, hq, n, d] = q.dims();
    let kvh = kmin.dims()[1];
    let g = hq / kvh;
    let device = q.device();
    let qg = q.reshape([b, kvh, g * n, d]);
    let s = qg.clone().clamp_min(0.0).matmul(kmax.swap_dims(2, 3))
        + qg.clamp_max(0.0).matmul(kmin.swap_dims(2, 3));
    let s = s.max_dim(2); // [b, kvh, 1, pages]
    let empty = page_empty_mask::<B>(ctx_lens, pages, page_size, &device)
        .reshape([b, 1, 1, pages])
        .expand([b, kvh, 1, pages]);
    Ok(s.mask_fill(empty, 0.0).reshape([b, kvh, pages]))
}

/// Top-k on the host
/// ([`KernelOps::top_k_positions`](crate::SelectionOps::top_k_positions)).
///
/// # Errors
/// As the trait method.
pub fn top_k_positions<B: Backend>(
    scores: Tensor<B, 3>,
    ctx_lens: &[usize],
    keep: Keep,
) -> Result<Positions<B>> {
    let [b, h, c] = scores.dims();
    let (counts, kk) = check_top_k([b, h, c], ctx_lens, keep)?;
    let device = scores.device();
    let host: Vec<f32> = scores
        .into_data()
        .convert::<f32>()
        .to_vec()
        .map_err(|e| KernelError::Unsupported(format!("reading scores: {e:?}")))?;
    let rows = crate::reference::top_k(&host, b, h, c, ctx_lens, keep);
    let mut idx = vec![0i64; b * h * kk];
    for (r, row) in rows.iter().enumerate() {
        for (s, &p) in row.iter().enumerate() {
            idx[r * kk + s] = p as i64;
        }
    }
    Ok(Positions {
        indices: Tensor::from_data(TensorData::new(idx, [b, h, kk]), &device),
        counts,
    })
}

/// RMSNorm over the last dimension of `x` `[batch, n, hidden]`: `x / sqrt(mean(x^2) + eps) *
/// weight` in `x`'s dtype; `weight` `[hidden]`.
///
/// # Errors
/// As [`crate::check_rms_norm`].
pub fn rms_norm<B: Backend>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 1>,
    eps: f64,
) -> Result<Tensor<B, 3>> {
    crate::check_rms_norm(x.dims(), weight.dims(), eps)?;
    if x.dims()[2] == 0 {
        // nothing to normalise (and no mean of an empty row)
        return Ok(x);
    }
    let ms = x.clone().powi_scalar(2).mean_dim(2);
    let inv = (ms + eps).sqrt().recip();
    Ok(x * inv * weight.unsqueeze::<3>())
}

/// The SwiGLU product `silu(gate) * up` of two `[batch, n, intermediate]` tensors (Burn's
/// `silu`, `x * sigmoid(x)`).
///
/// # Errors
/// [`KernelError::Shape`] when the shapes differ.
pub fn silu_mul<B: Backend>(gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
    crate::check_same("up", gate.dims(), up.dims())?;
    Ok(activation::silu(gate) * up)
}

/// Rotate-half RoPE of `x` `[batch, heads, n, head_dim]` with per-position tables `cos`
/// `[batch, 1, n, head_dim]` (`[cos, cos]`) and `sin` (`[-sin, sin]`, signed):
/// `x * cos + [x2, x1] * sin`, which is HF's `x * cos + rotate_half(x) * sin`.
///
/// # Errors
/// [`KernelError::Shape`] for tables of another shape; [`KernelError::InvalidInput`] for an
/// odd `head_dim`.
pub fn rope<B: Backend>(
    x: Tensor<B, 4>,
    cos: Tensor<B, 4>,
    sin: Tensor<B, 4>,
) -> Result<Tensor<B, 4>> {
    let [b, h, n, d] = x.dims();
    crate::check_rope(x.dims(), cos.dims(), sin.dims())?;
    let half = d / 2;
    let x1 = x.clone().slice([0..b, 0..h, 0..n, 0..half]);
    let x2 = x.clone().slice([0..b, 0..h, 0..n, half..d]);
    let swapped = Tensor::cat(vec![x2, x1], 3);
    Ok(x * cos + swapped * sin)
}

/// Dequantizes a packed matrix with Burn ops (shift, mask, multiply, add); see
/// [`KernelOps::dequantize_packed`](crate::ElementwiseOps::dequantize_packed).
///
/// # Errors
/// As [`crate::check_packed`].
pub fn dequantize_packed<B: Backend>(
    words: Tensor<B, 3, Int>,
    scale: Tensor<B, 3>,
    min: Tensor<B, 3>,
    bits: u32,
    group: usize,
    rows: usize,
) -> Result<Tensor<B, 2>> {
    crate::check_packed(words.dims(), scale.dims(), min.dims(), bits, group, rows)?;
    let cols = words.dims()[2];
    if rows == 0 || cols == 0 {
        return Ok(Tensor::zeros([rows, cols], &words.device()));
    }
    Ok(dequantize_packed_unchecked(
        words, scale, min, bits, group, rows,
    ))
}

/// [`dequantize_packed`] without the checks, for callers whose layout holds by construction
/// (`dustin_qwen::substitute::PackedWeight`). The inputs must pass
/// [`crate::check_packed`]; otherwise Burn's ops panic on the shapes.
pub fn dequantize_packed_unchecked<B: Backend>(
    words: Tensor<B, 3, Int>,
    scale: Tensor<B, 3>,
    min: Tensor<B, 3>,
    bits: u32,
    group: usize,
    rows: usize,
) -> Tensor<B, 2> {
    use burn_tensor::ElementConversion;
    let per = (32 / bits.max(1)) as usize;
    let [groups, wpg, cols] = words.dims();
    let device = words.device();
    let shifts: Vec<i32> = (0..per).map(|k| (k as u32 * bits) as i32).collect();
    let shifts = Tensor::<B, 4, Int>::from_data(TensorData::new(shifts, [1, 1, per, 1]), &device);
    let shape = [groups, wpg, per, cols];
    let mask = ((1i64 << bits) - 1).elem::<B::IntElem>();
    let codes = words
        .unsqueeze_dim::<4>(2)
        .expand(shape)
        .bitwise_right_shift(shifts.expand(shape))
        .bitwise_and_scalar(mask)
        .reshape([groups, wpg * per, cols]);
    let codes = if wpg * per == group {
        codes
    } else {
        codes.slice([0..groups, 0..group, 0..cols])
    };
    let w = (codes.float() * scale + min).reshape([groups * group, cols]);
    if groups * group == rows {
        w
    } else {
        w.slice([0..rows, 0..cols])
    }
}

/// `x [m, k] . w [k, n] + bias [n]` with Burn's matmul; see
/// [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear).
///
/// # Errors
/// As [`crate::check_skinny`].
pub fn skinny_linear<B: Backend>(
    x: Tensor<B, 2>,
    w: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Result<Tensor<B, 2>> {
    linear(x, w, bias)
}

/// [`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear) (and the skinny GEMM's plain path): Burn's matmul
/// `x . w` (`[m, k] x [k, n]`), then `+ bias` broadcast over the rows.
///
/// # Errors
/// [`crate::KernelError::Shape`] naming `w` or `bias` when they do not fit `x`.
pub fn linear<B: Backend>(
    x: Tensor<B, 2>,
    w: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Result<Tensor<B, 2>> {
    crate::check_skinny(x.dims(), w.dims(), bias.as_ref().map(|b| b.dims()))?;
    let y = x.matmul(w);
    Ok(match bias {
        Some(b) => y + b.unsqueeze::<2>(),
        None => y,
    })
}
