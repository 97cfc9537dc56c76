//! [`crate::KernelOps`] attention, RoPE and the SwiGLU product on [`Flex`]:
//! [`crate::cpu_attn`], a host RoPE and a one-pass `silu(gate) * up` on the f32 storage of
//! Burn-flex tensors, read in place through their strides.

use burn_flex::{Flex, FlexTensor};
use burn_tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};

use crate::cpu_attn::{self, Context, Shape, Strided};
use crate::quant_flex::host_f32;
use crate::{check_selection, KernelError, Result};

/// The f32 primitive of `t`.
pub(crate) fn prim<const D: usize>(t: Tensor<Flex, D>) -> FlexTensor {
    t.into_primitive().tensor()
}

/// A tensor of `values` `shape` (contiguous f32).
pub(crate) fn tensor<const D: usize>(values: Vec<f32>, shape: [usize; D]) -> Tensor<Flex, D> {
    let t = FlexTensor::from_data(TensorData::new(values, shape));
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// `t` `[b, h, p, d]` as a [`Strided`] view, when it is f32 with a contiguous last dimension
/// and non-negative strides (`None` otherwise: the caller copies it).
pub(crate) fn strided(t: &FlexTensor) -> Option<Strided<'_>> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let layout = t.layout();
    let dims = layout.shape().to_vec();
    let s = layout.strides();
    if dims.len() != 4 || s.iter().any(|&x| x < 0) || (dims[3] > 1 && s[3] != 1) {
        return None;
    }
    Some(Strided {
        data: t.storage::<f32>(),
        offset: layout.start_offset(),
        strides: [s[0] as usize, s[1] as usize, s[2] as usize],
        head_dim: dims[3],
    })
}

/// `t` itself when [`strided`] reads it, else a contiguous f32 copy.
pub(crate) fn readable(t: FlexTensor) -> FlexTensor {
    if strided(&t).is_some() {
        t
    } else {
        host_f32(t)
    }
}

/// [`KernelOps::verify_attention`](crate::AttentionOps::verify_attention) (`selection` `None`),
/// [`KernelOps::sparse_verify_attention`](crate::AttentionOps::sparse_verify_attention) and
/// [`KernelOps::prefill_attention`](crate::AttentionOps::prefill_attention) on the CPU
/// ([`cpu_attn::attention`]; [`crate::cpu_prefill::attention`] for a dense context and at
/// least [`crate::cpu_prefill::MIN_NEW`] new tokens), with at most `max_new` new tokens.
///
/// # Errors
/// As the trait methods: [`KernelError::Shape`] / [`KernelError::InvalidInput`] naming the
/// first input that does not fit.
pub(crate) fn attention(
    q: Tensor<Flex, 4>,
    k: Tensor<Flex, 4>,
    v: Tensor<Flex, 4>,
    ctx_lens: &[usize],
    selection: Option<(Tensor<Flex, 3, Int>, &[usize])>,
    scale: f32,
    max_new: usize,
) -> Result<Tensor<Flex, 4>> {
    let dims = crate::check_attn_upto(q.dims(), k.dims(), ctx_lens, max_new)?;
    if k.dims() != v.dims() {
        return Err(KernelError::Shape {
            name: "v",
            expected: k.dims().to_vec(),
            found: v.dims().to_vec(),
        });
    }
    let indices = match &selection {
        Some((idx, counts)) => {
            check_selection(&dims, idx.dims(), counts)?;
            let budget = idx.dims()[2];
            let values = idx
                .clone()
                .into_data()
                .convert::<i64>()
                .to_vec::<i64>()
                .map_err(|e| KernelError::invalid("indices", "integer positions", e))?;
            Some((values, budget))
        }
        None => None,
    };
    let qs = host_f32(prim(q));
    let (ks, vs) = (readable(prim(k)), readable(prim(v)));
    let (Some(kv), Some(vv)) = (strided(&ks), strided(&vs)) else {
        return Err(KernelError::Unsupported(
            "cache views of this layout".into(),
        ));
    };
    let ctx = match (&indices, &selection) {
        (Some((values, budget)), Some((_, counts))) => Context::Selected {
            indices: values,
            budget: *budget,
            counts,
        },
        _ => Context::Dense,
    };
    let shape = Shape::from(dims);
    let q_host = qs.as_slice::<f32>().unwrap_or(&[]);
    // a prefill chunk of many tokens over a dense context in tiles, else the chunked kernel
    let tiled = match ctx {
        Context::Dense if dims.n_new >= crate::cpu_prefill::MIN_NEW => {
            crate::cpu_prefill::attention(q_host, kv, vv, shape, ctx_lens, scale)
        }
        _ => None,
    };
    let out = match tiled {
        Some(out) => out,
        None => cpu_attn::attention(q_host, kv, vv, shape, ctx_lens, ctx, scale),
    };
    Ok(tensor(
        out,
        [dims.batch, dims.q_heads, dims.n_new, dims.head_dim],
    ))
}

/// [`KernelOps::rope`](crate::ElementwiseOps::rope) on the CPU: `x * cos + [x2, x1] * sin` per element, rounded
/// as the plain path rounds it (two products, then their sum), reading `x` through its
/// strides.
///
/// # Errors
/// As [`crate::check_rope`].
pub(crate) fn rope(
    x: Tensor<Flex, 4>,
    cos: Tensor<Flex, 4>,
    sin: Tensor<Flex, 4>,
) -> Result<Tensor<Flex, 4>> {
    let [b, h, n, d] = x.dims();
    crate::check_rope(x.dims(), cos.dims(), sin.dims())?;
    let half = d / 2;
    let xs = readable(prim(x));
    let (cs, ss) = (host_f32(prim(cos)), host_f32(prim(sin)));
    let (Some(xv), Some(c), Some(s)) = (strided(&xs), cs.as_slice::<f32>(), ss.as_slice::<f32>())
    else {
        return Err(KernelError::Unsupported("RoPE input of this layout".into()));
    };
    let mut out = vec![0f32; b * h * n * d];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..n {
                let row = xv.row_at(bi, hi, i);
                let t = (bi * n + i) * d;
                let (cr, sr) = (&c[t..t + d], &s[t..t + d]);
                let o = &mut out[((bi * h + hi) * n + i) * d..][..d];
                for j in 0..half {
                    o[j] = row[j] * cr[j] + row[j + half] * sr[j];
                    o[j + half] = row[j + half] * cr[j + half] + row[j] * sr[j + half];
                }
            }
        }
    }
    Ok(tensor(out, [b, h, n, d]))
}

/// [`KernelOps::kv_write`](crate::MemoryOps::kv_write) on the CPU: the new rows copied into the cache's storage in
/// place (Burn-flex copies a storage another tensor still shares before writing, as its
/// slice-assign does), reading `src` through its strides. A cache that is not f32 takes the
/// plain path.
///
/// # Errors
/// As [`crate::check_kv_write`].
pub(crate) fn kv_write(
    dst: Tensor<Flex, 4>,
    src: Tensor<Flex, 4>,
    starts: &[usize],
) -> Result<Tensor<Flex, 4>> {
    crate::check_kv_write(dst.dims(), src.dims(), starts)?;
    let [b, h, n, d] = src.dims();
    let cap = dst.dims()[2];
    let dt = prim(dst);
    if dt.dtype() != DType::F32 || n == 0 {
        let dst = Tensor::from_primitive(TensorPrimitive::Float(dt));
        return crate::plain::kv_write(dst, src, starts);
    }
    // the whole buffer in row-major order, so that element (b, h, p, :) is at
    // ((b h_total + h) cap + p) d
    let whole = dt.is_contiguous()
        && dt.layout().start_offset() == 0
        && dt.bytes().len() == b * h * cap * d * 4;
    let mut dt = if whole { dt } else { dt.to_contiguous() };
    let st = readable(prim(src));
    let Some(sv) = strided(&st) else {
        return Err(KernelError::Unsupported("new rows of this layout".into()));
    };
    let buf = dt.storage_mut::<f32>();
    for (bi, &start) in starts.iter().enumerate() {
        for hi in 0..h {
            for i in 0..n {
                let at = ((bi * h + hi) * cap + start + i) * d;
                buf[at..at + d].copy_from_slice(sv.row_at(bi, hi, i));
            }
        }
    }
    Ok(Tensor::from_primitive(TensorPrimitive::Float(dt)))
}

/// `silu(g) = g sigmoid(g)` with `sigmoid(g) = 1 / (1 + e^-g)` for `g >= 0` and
/// `e^g / (1 + e^g)` below (so the exponential's argument is never positive), `e^x` by
/// [`cpu_attn::exp_approx`] (relative error under `2e-7`). Branch-free, so loops over it
/// vectorize.
#[inline(always)]
fn silu(g: f32) -> f32 {
    let e = cpu_attn::exp_approx(-g.abs());
    let s = if g >= 0.0 {
        1.0 / (1.0 + e)
    } else {
        e / (1.0 + e)
    };
    g * s
}

/// Elements a task of [`silu_mul`] takes.
const SILU_CHUNK: usize = 1 << 16;

/// [`KernelOps::silu_mul`](crate::ElementwiseOps::silu_mul) on the CPU: `silu(gate) * up`
/// in one pass over both (the plain path makes three, each with its own output), tasks of
/// [`SILU_CHUNK`] elements across threads. Within `4e-7` relative of the plain path's values
/// (the exponential's error and one rounding).
///
/// # Errors
/// [`KernelError::Shape`] when the shapes differ.
pub(crate) fn silu_mul(gate: Tensor<Flex, 3>, up: Tensor<Flex, 3>) -> Result<Tensor<Flex, 3>> {
    use rayon::prelude::*;
    crate::check_same("up", gate.dims(), up.dims())?;
    let dims = gate.dims();
    let (gt, ut) = (host_f32(prim(gate)), host_f32(prim(up)));
    let (Some(g), Some(u)) = (gt.as_slice::<f32>(), ut.as_slice::<f32>()) else {
        return Err(KernelError::Unsupported(
            "SwiGLU inputs of this layout".into(),
        ));
    };
    let mut out = vec![0f32; g.len()];
    let body = |(o, (g, u)): (&mut [f32], (&[f32], &[f32]))| {
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = silu(g) * u;
        }
    };
    if g.len() <= SILU_CHUNK {
        body((&mut out, (g, u)));
    } else {
        out.par_chunks_mut(SILU_CHUNK)
            .zip(g.par_chunks(SILU_CHUNK).zip(u.par_chunks(SILU_CHUNK)))
            .for_each(body);
    }
    Ok(tensor(out, dims))
}
