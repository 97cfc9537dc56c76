//! Attention probabilities the estimators compute themselves (on the layer's device), with
//! the model's causal rule: query `i` of sequence `b` sits at position `first[b] + i` and
//! sees keys `j <= first[b] + i` (`first[b] = ctx_lens[b]` for all the new queries of a pass).

use burn_tensor::{activation, backend::Backend, Int, Tensor, TensorData};

use crate::topk::lens_tensor;

/// Causal softmax over the last dim of `logits` `[batch, x, y, n, keys]`: an additive mask
/// `[batch, 1, 1, n, keys]` built on the host (as the model builds its own) and broadcast,
/// so no full-size index tensor is materialised.
pub(crate) fn causal_softmax<B: Backend>(logits: Tensor<B, 5>, first: &[usize]) -> Tensor<B, 5> {
    let [b, _, _, n, l] = logits.dims();
    let device = logits.device();
    let mut mask = Vec::with_capacity(b * n * l);
    for &f in first.iter().take(b) {
        for i in 0..n {
            let lim = (f + i + 1).min(l);
            mask.extend(std::iter::repeat_n(0.0f32, lim));
            mask.extend(std::iter::repeat_n(f32::NEG_INFINITY, l - lim));
        }
    }
    let mask = Tensor::<B, 5>::from_data(TensorData::new(mask, [b, 1, 1, n, l]), &device);
    activation::softmax(logits + mask, 4)
}

/// All query heads' probabilities grouped by KV head: `q` `[batch, heads, n, head_dim]`,
/// `k` `[batch, kv_heads, keys, head_dim]` -> `[batch, kv_heads, group, n, keys]`.
pub(crate) fn grouped_probs<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    first: &[usize],
    scale: f32,
) -> Tensor<B, 5> {
    let [b, nh, n, d] = q.dims();
    let [_, kvh, l, _] = k.dims();
    let g = nh / kvh.max(1);
    let logits = q
        .reshape([b, kvh, g * n, d])
        .matmul(k.swap_dims(2, 3))
        .mul_scalar(scale)
        .reshape([b, kvh, g, n, l]);
    causal_softmax(logits, first)
}

/// Probabilities of the query heads `heads` only (the others are never computed):
/// -> `[batch, heads.len(), n, keys]`. Head `h` reads KV head `h / group`.
pub(crate) fn head_probs<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    heads: &[usize],
    group: usize,
    first: &[usize],
    scale: f32,
) -> Tensor<B, 4> {
    let [b, _, n, _] = q.dims();
    let [_, _, l, _] = k.dims();
    let e = heads.len();
    let device = q.device();
    let qh: Vec<i64> = heads.iter().map(|&h| h as i64).collect();
    let kh: Vec<i64> = heads.iter().map(|&h| (h / group.max(1)) as i64).collect();
    let qh = Tensor::<B, 1, Int>::from_data(TensorData::new(qh, [e]), &device);
    let kh = Tensor::<B, 1, Int>::from_data(TensorData::new(kh, [e]), &device);
    let logits = q
        .select(1, qh)
        .matmul(k.select(1, kh).swap_dims(2, 3))
        .mul_scalar(scale)
        .reshape([b, e, 1, n, l]);
    causal_softmax(logits, first).reshape([b, e, n, l])
}

/// Zero-pads or truncates the last dim of `t` to `len`.
pub(crate) fn fit_last<B: Backend, const D: usize>(t: Tensor<B, D>, len: usize) -> Tensor<B, D> {
    let dims = t.dims();
    let cur = dims[D - 1];
    if cur == len {
        t
    } else if cur > len {
        t.narrow(D - 1, 0, len)
    } else {
        let mut pad = dims;
        pad[D - 1] = len - cur;
        let (device, dtype) = (t.device(), t.dtype());
        Tensor::cat(vec![t, Tensor::zeros(pad, (&device, dtype))], D - 1)
    }
}

/// `[batch, 1, c]` float mask: 1 on each sequence's free range `[n_sink, ctx_b - window)`
/// (the positions the scores choose among), 0 elsewhere.
pub(crate) fn free_mask<B: Backend>(
    ctx_lens: &[usize],
    c: usize,
    keep: crate::KeepRule,
    device: &B::Device,
) -> Tensor<B, 3> {
    let b = ctx_lens.len();
    let lo: Vec<usize> = ctx_lens.iter().map(|&l| keep.free_range(l).0).collect();
    let hi: Vec<usize> = ctx_lens.iter().map(|&l| keep.free_range(l).1).collect();
    let pos = Tensor::<B, 1, Int>::arange(0..c as i64, device)
        .reshape([1, 1, c])
        .expand([b, 1, c]);
    let lo = lens_tensor::<B>(&lo, device)
        .reshape([b, 1, 1])
        .expand([b, 1, c]);
    let hi = lens_tensor::<B>(&hi, device)
        .reshape([b, 1, 1])
        .expand([b, 1, c]);
    pos.clone()
        .greater_equal(lo)
        .bool_and(pos.lower(hi))
        .float()
}

/// Normalises each row of `x` `[batch, rows, c]` to sum 1 over the positions where `mask`
/// `[batch, 1, c]` is 1 (rows with no mass there stay near 0).
pub(crate) fn normalise_on<B: Backend>(x: Tensor<B, 3>, mask: &Tensor<B, 3>) -> Tensor<B, 3> {
    let [b, r, c] = x.dims();
    let m = mask.clone().expand([b, r, c]);
    let x = x * m;
    let sum = x.clone().sum_dim(2).clamp_min(1e-30);
    x / sum
}
