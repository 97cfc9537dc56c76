//! Float64 host references of every op (plain loops, independent of Burn), the random inputs
//! the checks use, and the error measure. Used by the CPU tests and by the GPU check.
//!
//! Layouts are row-major and as in the crate docs: `q` `[batch, q_heads, n_new, head_dim]`,
//! `k`, `v` `[batch, kv_heads, capacity, head_dim]`.

// Plain index loops mirror the formulas.
#![allow(clippy::needless_range_loop, clippy::too_many_arguments)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::Keep;

/// Sizes of a reference call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    /// Sequences.
    pub batch: usize,
    /// Query heads.
    pub q_heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// New tokens per sequence.
    pub n_new: usize,
    /// Head width.
    pub head_dim: usize,
    /// Cache capacity per sequence.
    pub capacity: usize,
}

impl Dims {
    fn q(&self, b: usize, h: usize, i: usize) -> usize {
        ((b * self.q_heads + h) * self.n_new + i) * self.head_dim
    }
    fn kv(&self, b: usize, h: usize, p: usize) -> usize {
        ((b * self.kv_heads + h) * self.capacity + p) * self.head_dim
    }
    fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

/// Softmax attention of one query row over `keys` (cache positions) of `(b, kvh)`:
/// `sum_j softmax(scale q.k_j) v_j` in f64.
fn attend_row(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: &Dims,
    b: usize,
    kvh: usize,
    keys: &[usize],
    scale: f64,
) -> Vec<f64> {
    let d = dims.head_dim;
    let logits: Vec<f64> = keys
        .iter()
        .map(|&p| scale * dot(q, &k[dims.kv(b, kvh, p)..dims.kv(b, kvh, p) + d]))
        .collect();
    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = logits.iter().map(|&s| (s - m).exp()).collect();
    let z: f64 = w.iter().sum();
    let mut out = vec![0.0f64; d];
    for (&p, &wj) in keys.iter().zip(&w) {
        let row = &v[dims.kv(b, kvh, p)..dims.kv(b, kvh, p) + d];
        for (o, &x) in out.iter_mut().zip(row) {
            *o += wj / z * x as f64;
        }
    }
    out
}

/// A sparse selection for [`attention`]: `indices` `[batch, kv_heads, budget]`, `counts`.
#[derive(Debug, Clone, Copy)]
pub struct Sel<'a> {
    /// Positions, row-major `[batch, kv_heads, budget]`.
    pub indices: &'a [i64],
    /// Columns of `indices`.
    pub budget: usize,
    /// Valid entries per sequence.
    pub counts: &'a [usize],
}

/// Verify attention, dense (`sel` `None`) or sparse: `[batch, q_heads, n_new, head_dim]`.
/// Query `i` of `b` sees keys `j <= ctx_lens[b] + i` (dense), or the selected positions in
/// `0 .. ctx_lens[b]` plus the new tokens `ctx_lens[b] + i'` with `i' <= i` (sparse).
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: &Dims,
    ctx_lens: &[usize],
    scale: f64,
    sel: Option<Sel<'_>>,
) -> Vec<f64> {
    let (d, n, g) = (dims.head_dim, dims.n_new, dims.group());
    let mut out = vec![0.0f64; dims.batch * dims.q_heads * n * d];
    for b in 0..dims.batch {
        let c = ctx_lens[b];
        for h in 0..dims.q_heads {
            let kvh = h / g;
            for i in 0..n {
                let keys: Vec<usize> = match sel {
                    None => (0..=c + i).collect(),
                    Some(s) => {
                        let row = &s.indices[(b * dims.kv_heads + kvh) * s.budget..][..s.counts[b]];
                        let mut ks: Vec<usize> = row
                            .iter()
                            .filter(|&&p| p >= 0 && (p as usize) < c)
                            .map(|&p| p as usize)
                            .collect();
                        ks.extend(c..=c + i);
                        ks
                    }
                };
                let o = dims.q(b, h, i);
                let r = attend_row(&q[o..o + d], k, v, dims, b, kvh, &keys, scale);
                out[o..o + d].copy_from_slice(&r);
            }
        }
    }
    out
}

/// Head-subset scores `[batch, kv_heads, capacity]`: per KV head the sum over the chosen
/// heads of that KV head and the query rows of the dense softmax probabilities (0 past each
/// sequence's `ctx + n_new`).
pub fn head_scores(
    q: &[f32],
    k: &[f32],
    dims: &Dims,
    ctx_lens: &[usize],
    heads: &[usize],
    scale: f64,
) -> Vec<f64> {
    let n = dims.n_new;
    let rows = head_row_scores(q, k, dims, ctx_lens, heads, scale);
    let l = dims.capacity;
    let mut out = vec![0.0f64; dims.batch * dims.kv_heads * l];
    for (r, row) in rows.chunks(l).enumerate() {
        let bh = r / n;
        for (o, x) in out[bh * l..(bh + 1) * l].iter_mut().zip(row) {
            *o += x;
        }
    }
    out
}

/// Per-row head-subset scores `[batch, kv_heads, n_new, capacity]`: per KV head and query
/// row `i` the sum over the chosen heads of that KV head of the dense softmax probabilities
/// of row `i` (0 past each sequence's `ctx + i`).
pub fn head_row_scores(
    q: &[f32],
    k: &[f32],
    dims: &Dims,
    ctx_lens: &[usize],
    heads: &[usize],
    scale: f64,
) -> Vec<f64> {
    let (d, n, g) = (dims.head_dim, dims.n_new, dims.group());
    let l = dims.capacity;
    let mut out = vec![0.0f64; dims.batch * dims.kv_heads * n * l];
    for b in 0..dims.batch {
        let c = ctx_lens[b];
        for &h in heads {
            let kvh = h / g;
            for i in 0..n {
                let o = dims.q(b, h, i);
                let qr = &q[o..o + d];
                let logits: Vec<f64> = (0..=c + i)
                    .map(|p| scale * dot(qr, &k[dims.kv(b, kvh, p)..dims.kv(b, kvh, p) + d]))
                    .collect();
                let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = logits.iter().map(|&s| (s - m).exp()).sum();
                let base = ((b * dims.kv_heads + kvh) * n + i) * l;
                for (p, &s) in logits.iter().enumerate() {
                    out[base + p] += (s - m).exp() / z;
                }
            }
        }
    }
    out
}

/// Quest page bounds `(kmin, kmax)`, each `[batch, kv_heads, pages, head_dim]`; pages past the
/// context are 0.
pub fn page_bounds(
    k: &[f32],
    dims: &Dims,
    ctx_lens: &[usize],
    page: usize,
    pages: usize,
) -> (Vec<f64>, Vec<f64>) {
    let d = dims.head_dim;
    let mut mn = vec![0.0f64; dims.batch * dims.kv_heads * pages * d];
    let mut mx = mn.clone();
    for b in 0..dims.batch {
        for h in 0..dims.kv_heads {
            for pg in 0..pages {
                let (s, e) = (pg * page, ((pg + 1) * page).min(ctx_lens[b]));
                if s >= e {
                    continue;
                }
                for c in 0..d {
                    let vals = (s..e).map(|p| k[dims.kv(b, h, p) + c] as f64);
                    let o = ((b * dims.kv_heads + h) * pages + pg) * d + c;
                    mn[o] = vals.clone().fold(f64::INFINITY, f64::min);
                    mx[o] = vals.fold(f64::NEG_INFINITY, f64::max);
                }
            }
        }
    }
    (mn, mx)
}

/// Quest page scores `[batch, kv_heads, pages]`: max over the group's heads and rows of
/// `sum_c max(q_c mn_c, q_c mx_c)`; pages starting at or past the context score 0.
pub fn page_scores(
    q: &[f32],
    mn: &[f64],
    mx: &[f64],
    dims: &Dims,
    ctx_lens: &[usize],
    page: usize,
    pages: usize,
) -> Vec<f64> {
    let (d, n, g) = (dims.head_dim, dims.n_new, dims.group());
    let mut out = vec![0.0f64; dims.batch * dims.kv_heads * pages];
    for b in 0..dims.batch {
        for h in 0..dims.kv_heads {
            for pg in 0..pages {
                if pg * page >= ctx_lens[b] {
                    continue;
                }
                let o = ((b * dims.kv_heads + h) * pages + pg) * d;
                let mut best = f64::NEG_INFINITY;
                for hq in h * g..(h + 1) * g {
                    for i in 0..n {
                        let qo = dims.q(b, hq, i);
                        let s: f64 = (0..d)
                            .map(|c| {
                                let x = q[qo + c] as f64;
                                (x * mn[o + c]).max(x * mx[o + c])
                            })
                            .sum();
                        best = best.max(s);
                    }
                }
                out[(b * dims.kv_heads + h) * pages + pg] = best;
            }
        }
    }
    out
}

/// Top-k reference: per (sequence, KV head) row of `scores` `[batch, heads, c]`, the kept
/// positions ascending (sinks and window forced, NaN lowest, `+-inf` clamped to the finite
/// extremes, ties to the lower position).
pub fn top_k(
    scores: &[f32],
    batch: usize,
    heads: usize,
    c: usize,
    ctx_lens: &[usize],
    keep: Keep,
) -> Vec<Vec<usize>> {
    let mut rows = Vec::with_capacity(batch * heads);
    for b in 0..batch {
        let cb = ctx_lens[b];
        let kk = keep.budget.min(cb);
        for h in 0..heads {
            let row = &scores[(b * heads + h) * c..][..cb];
            let mut order: Vec<(bool, f64, usize)> = row
                .iter()
                .enumerate()
                .map(|(p, &s)| {
                    let forced = p < keep.n_sink || p + keep.window >= cb;
                    let s = if s.is_nan() {
                        f32::MIN
                    } else {
                        s.clamp(f32::MIN, f32::MAX)
                    };
                    (forced, s as f64, p)
                })
                .collect();
            order.sort_by(|a, b| {
                b.0.cmp(&a.0)
                    .then(b.1.partial_cmp(&a.1).unwrap_or(std::cmp::Ordering::Equal))
                    .then(a.2.cmp(&b.2))
            });
            let mut kept: Vec<usize> = order[..kk].iter().map(|x| x.2).collect();
            kept.sort_unstable();
            rows.push(kept);
        }
    }
    rows
}

/// [`KernelOps::fold_rows`](crate::SelectionOps::fold_rows) in float64: `rows` `[b, kvh, n,
/// len]`, `hist` `[b, kvh, len]` (`None`: zeros), `factor` `[b]`, `w` `[b * n]`, `own`, `all`
/// `[kvh]`; returns `[b, kvh, len]`.
#[allow(clippy::too_many_arguments)]
pub fn fold_rows(
    hist: Option<&[f32]>,
    factor: &[f32],
    rows: &[f32],
    dims: [usize; 4],
    w: &[f32],
    own: &[f32],
    all: &[f32],
) -> Vec<f64> {
    let [b, kvh, n, l] = dims;
    let at =
        |bb: usize, h: usize, i: usize, j: usize| f64::from(rows[((bb * kvh + h) * n + i) * l + j]);
    let mut out = vec![0.0f64; b * kvh * l];
    for bb in 0..b {
        for h in 0..kvh {
            for j in 0..l {
                let mut acc = hist.map_or(0.0, |hs| {
                    f64::from(factor[bb]) * f64::from(hs[(bb * kvh + h) * l + j])
                });
                for i in 0..n {
                    let tot: f64 = (0..kvh).map(|g| at(bb, g, i, j)).sum();
                    acc += f64::from(w[bb * n + i])
                        * (f64::from(own[h]) * at(bb, h, i, j) + f64::from(all[h]) * tot);
                }
                out[(bb * kvh + h) * l + j] = acc;
            }
        }
    }
    out
}

/// [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores) in float64: `hist` `[b, kvh,
/// hist_len]`, `la` `[b, la_len]`; returns `[b, kvh, width]`.
#[allow(clippy::too_many_arguments)]
pub fn mix_scores(
    hist: &[f32],
    dims: [usize; 3],
    la: Option<(&[f32], usize)>,
    free: &[(usize, usize)],
    alpha: f64,
    width: usize,
) -> Vec<f64> {
    let [b, kvh, hl] = dims;
    let mut out = vec![0.0f64; b * kvh * width];
    for bb in 0..b {
        let (lo, hi) = (free[bb].0, free[bb].1.min(width));
        let la_n: Option<Vec<f64>> = la.map(|(v, ll)| {
            let row: Vec<f64> = (0..width)
                .map(|p| {
                    if p < ll {
                        f64::from(v[bb * ll + p])
                    } else {
                        0.0
                    }
                })
                .collect();
            let s = row[lo.min(hi)..hi].iter().sum::<f64>().max(1e-30);
            row.iter().map(|x| x / s).collect()
        });
        for h in 0..kvh {
            let row: Vec<f64> = (0..width)
                .map(|p| {
                    if p < hl {
                        f64::from(hist[(bb * kvh + h) * hl + p])
                    } else {
                        0.0
                    }
                })
                .collect();
            let s = row[lo.min(hi)..hi].iter().sum::<f64>().max(1e-30);
            for p in lo..hi {
                let hv = row[p] / s;
                out[(bb * kvh + h) * width + p] = match &la_n {
                    Some(l) => alpha * l[p] + (1.0 - alpha) * hv,
                    None => hv,
                };
            }
        }
    }
    out
}

/// RMSNorm of `rows` rows of `hidden` values (row-major `x`), `weight` `[hidden]`:
/// `x / sqrt(mean(x^2) + eps) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f64, rows: usize, hidden: usize) -> Vec<f64> {
    let mut out = vec![0.0f64; rows * hidden];
    for r in 0..rows {
        let row = &x[r * hidden..(r + 1) * hidden];
        let ms = row.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / hidden as f64;
        let inv = 1.0 / (ms + eps).sqrt();
        for c in 0..hidden {
            out[r * hidden + c] = row[c] as f64 * inv * weight[c] as f64;
        }
    }
    out
}

/// `silu(gate) * up` elementwise, `silu(x) = x / (1 + exp(-x))`.
pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = g as f64;
            g / (1.0 + (-g).exp()) * u as f64
        })
        .collect()
}

/// Rotate-half RoPE of `x` `[batch, heads, n, head_dim]` (row-major) at `positions`
/// `[batch, n]` with base `theta`, angles computed here in f64 from the formula (HF
/// `Qwen2RotaryEmbedding`): `x_i cos(a_i) - x_{i+d/2} sin(a_i)` for `i < d/2`, and
/// `x_i cos(a_i) + x_{i-d/2} sin(a_i)` above, `a_i = p theta^(-2 (i mod d/2) / d)`.
pub fn rope(
    x: &[f32],
    positions: &[usize],
    theta: f64,
    [batch, heads, n, d]: [usize; 4],
) -> Vec<f64> {
    let half = d / 2;
    let mut out = vec![0.0f64; x.len()];
    for b in 0..batch {
        for h in 0..heads {
            for t in 0..n {
                let p = positions[b * n + t] as f64;
                let base = ((b * heads + h) * n + t) * d;
                for i in 0..d {
                    let j = i % half;
                    let a = p * theta.powf(-(2.0 * j as f64) / d as f64);
                    let (c, s) = (a.cos(), a.sin());
                    let xi = x[base + i] as f64;
                    out[base + i] = if i < half {
                        xi * c - x[base + i + half] as f64 * s
                    } else {
                        xi * c + x[base + i - half] as f64 * s
                    };
                }
            }
        }
    }
    out
}

/// Dequantizes a packed matrix (layout of [`KernelOps::dequantize_packed`](crate::ElementwiseOps::dequantize_packed)): `words`
/// `[groups, wpg, cols]` (row-major), `scale`, `min` `[groups, cols]`; returns `[rows, cols]`
/// `code * scale + min`, each code read with plain shifts on `u32`.
pub fn dequantize_packed(
    words: &[i32],
    scale: &[f32],
    min: &[f32],
    [groups, wpg, cols]: [usize; 3],
    bits: u32,
    group: usize,
    rows: usize,
) -> Vec<f64> {
    let per = (32 / bits) as usize;
    let mask = (1u32 << bits) - 1;
    let mut out = vec![0.0f64; rows * cols];
    for r in 0..rows {
        let (g, rr) = (r / group, r % group);
        let (w, k) = (rr / per, rr % per);
        assert!(g < groups && w < wpg, "row {r} outside the words");
        for c in 0..cols {
            let word = words[(g * wpg + w) * cols + c] as u32;
            let code = (word >> (k as u32 * bits)) & mask;
            out[r * cols + c] = code as f64 * scale[g * cols + c] as f64 + min[g * cols + c] as f64;
        }
    }
    out
}

/// `x [m, k] . w [k, n] + bias [n]` (row-major), in f64.
pub fn linear(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for c in 0..n {
            let mut s = bias.map_or(0.0, |b| b[c] as f64);
            for r in 0..k {
                s += x[i * k + r] as f64 * w[r * n + c] as f64;
            }
            out[i * n + c] = s;
        }
    }
    out
}

/// `len` random words (any 32 bits).
pub fn random_words(len: usize, seed: u64) -> Vec<i32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random::<u32>() as i32).collect()
}

/// Normwise relative error `max |out - ref| / max |ref|`; infinite if any output or
/// reference value is not finite (a NaN must never pass: `f64::max` would skip it) or the
/// lengths differ. Two empty slices give 0: callers that expect values check the length.
pub fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    if out.len() != reference.len()
        || out.iter().any(|x| !x.is_finite())
        || reference.iter().any(|x| !x.is_finite())
    {
        return f64::INFINITY;
    }
    let den = reference
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(1e-30);
    let num = out
        .iter()
        .zip(reference)
        .fold(0.0f64, |m, (&o, &r)| m.max((o as f64 - r).abs()));
    num / den
}

/// `len` values uniform in `[-amp, amp)`, rounded to bf16 (so a bf16 device copy holds them
/// exactly), never exactly zero.
pub fn random_bf16(len: usize, amp: f32, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..len)
        .map(|_| {
            let mut x: f32 = rng.random_range(-amp..amp);
            if x == 0.0 {
                x = amp * 0.5;
            }
            half::bf16::from_f32(x).to_f32()
        })
        .collect()
}

/// A random selection `[batch, kv_heads, budget]` of distinct positions `< ctx_lens[b]`
/// (ascending), `counts[b] = min(budget, ctx_lens[b])`; padding slots hold 0.
pub fn random_selection(
    batch: usize,
    kv_heads: usize,
    budget: usize,
    ctx_lens: &[usize],
    seed: u64,
) -> (Vec<i64>, Vec<usize>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let counts: Vec<usize> = ctx_lens.iter().map(|&c| c.min(budget)).collect();
    let mut idx = vec![0i64; batch * kv_heads * budget];
    for b in 0..batch {
        for h in 0..kv_heads {
            let mut all: Vec<usize> = (0..ctx_lens[b]).collect();
            for i in 0..counts[b] {
                let j = rng.random_range(i..all.len());
                all.swap(i, j);
            }
            let mut pick = all[..counts[b]].to_vec();
            pick.sort_unstable();
            for (s, p) in pick.into_iter().enumerate() {
                idx[(b * kv_heads + h) * budget + s] = p as i64;
            }
        }
    }
    (idx, counts)
}

#[cfg(test)]
mod tests {
    use super::rel_err;

    /// Hand-worked values: `max |out - ref| = 0.5`, `max |ref| = 4`, so 0.125; a NaN or an
    /// infinity on either side and a length mismatch never pass.
    #[test]
    fn rel_err_values_and_non_finite_inputs() {
        assert_eq!(rel_err(&[1.0, -3.5, 2.0], &[1.0, -4.0, 2.0]), 0.125);
        assert_eq!(rel_err(&[1.0, 1000.0], &[1.0, f64::NAN]), f64::INFINITY);
        assert_eq!(rel_err(&[1.0, 2.0], &[f64::NAN, f64::NAN]), f64::INFINITY);
        assert_eq!(rel_err(&[1.0, f32::NAN], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(rel_err(&[1.0], &[f64::NEG_INFINITY]), f64::INFINITY);
        assert_eq!(rel_err(&[1.0, 2.0], &[1.0]), f64::INFINITY);
    }
}
