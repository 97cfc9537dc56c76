//! Checks of the element-wise ops ([`KernelOps::rms_norm`](crate::ElementwiseOps::rms_norm), [`KernelOps::add_rms_norm`](crate::ElementwiseOps::add_rms_norm),
//! [`KernelOps::silu_mul`](crate::ElementwiseOps::silu_mul), [`KernelOps::rope`](crate::ElementwiseOps::rope), [`KernelOps::dequantize_packed`](crate::ElementwiseOps::dequantize_packed)) and the
//! skinny GEMMs
//! ([`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear), [`KernelOps::skinny_linear3`](crate::LinearOps::skinny_linear3), [`KernelOps::skinny_swiglu`](crate::LinearOps::skinny_swiglu)),
//! the prefill GEMMs ([`KernelOps::prefill_linear`](crate::LinearOps::prefill_linear), [`KernelOps::prefill_linear_many`](crate::LinearOps::prefill_linear_many)),
//! the KV-cache view [`KernelOps::kv_prefix`](crate::MemoryOps::kv_prefix) and writes [`KernelOps::kv_write`](crate::MemoryOps::kv_write),
//! [`KernelOps::kv_write_pair`](crate::MemoryOps::kv_write_pair), and the `dustin` estimator's [`KernelOps::fold_rows`](crate::SelectionOps::fold_rows) and
//! [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores)
//! against the float64 references of [`crate::reference`], on fresh
//! random inputs rounded to bf16 (so a bf16 device copy holds them exactly), odd sizes, and a
//! strided RoPE input (the model's `[batch, n, heads, d]` projection viewed as `[batch,
//! heads, n, d]`). Generic over the backend: the CPU tests run it on the plain path,
//! `dustin-bench kernel-check --device cuda` and `dustin-kernels-gpu check` on the CUDA kernels (with
//! poisoned outputs there, so an unwritten element is NaN and fails).

use burn_tensor::{Tensor, TensorData};

use crate::{reference, KernelOps};

mod gemm;
pub use gemm::check_skinny_gemms;

/// One checked (case, op): normwise relative error `max|out - ref| / max|ref|`
/// ([`reference::rel_err`]) against `bound`.
#[derive(Debug, Clone, PartialEq)]
pub struct CheckRow {
    /// The sizes.
    pub case: String,
    /// The op.
    pub op: &'static str,
    /// Normwise relative error; infinite for a non-finite output or an op error.
    pub err: f64,
    /// The bound it is held to.
    pub bound: f64,
    /// The op's error, if it returned one.
    pub error: Option<String>,
}

impl CheckRow {
    /// Whether the error is within the bound.
    pub fn ok(&self) -> bool {
        self.err < self.bound
    }
}

impl std::fmt::Display for CheckRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<36} {:<10} max rel err {:>10.3e}  bound {:.0e}  {}{}",
            self.case,
            self.op,
            self.err,
            self.bound,
            if self.ok() { "ok" } else { "FAIL" },
            self.error
                .as_ref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default()
        )
    }
}

fn host<B: KernelOps, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap_or_default()
}

/// A row-major `[k, n]` weight `w` on `device`, or (`transposed`) the same values as a
/// transposed view of a row-major `[n, k]` (strides `[1, k]`).
fn weight_tensor<B: KernelOps>(
    w: Vec<f32>,
    k: usize,
    n: usize,
    transposed: bool,
    device: &B::Device,
) -> Tensor<B, 2> {
    if transposed {
        let wt: Vec<f32> = (0..n * k).map(|j| w[(j % k) * n + j / k]).collect();
        Tensor::<B, 2>::from_data(TensorData::new(wt, vec![n, k]), device).transpose()
    } else {
        Tensor::<B, 2>::from_data(TensorData::new(w, vec![k, n]), device)
    }
}

fn row<B: KernelOps, const D: usize>(
    case: String,
    op: &'static str,
    out: crate::Result<Tensor<B, D>>,
    want: &[f64],
    bound: f64,
) -> CheckRow {
    match out {
        Ok(t) => CheckRow {
            case,
            op,
            err: reference::rel_err(&host(t), want),
            bound,
            error: None,
        },
        Err(e) => CheckRow {
            case,
            op,
            err: f64::INFINITY,
            bound,
            error: Some(e.to_string()),
        },
    }
}

/// Runs every case of these ops on `device` and returns one row each (two for
/// `add_rms_norm`: the sum and the normalised value); `bound` is the
/// normwise relative error allowed (1e-2 for bf16, as the attention checks; about 1e-5 for
/// f32).
pub fn check_elementwise<B: KernelOps>(device: &B::Device, bound: f64) -> Vec<CheckRow> {
    let mut rows_out = Vec::new();
    let up = |v: Vec<f32>, shape: Vec<usize>| TensorData::new(v, shape);
    // RMSNorm: rows x hidden, hidden not a multiple of the block; Qwen2.5 eps 1e-6
    for (i, &(b, n, hidden)) in [(1, 1, 896), (3, 5, 1000), (2, 7, 3584)].iter().enumerate() {
        let seed = 7000 + i as u64;
        let x = reference::random_bf16(b * n * hidden, 4.0, seed);
        let w = reference::random_bf16(hidden, 2.0, seed + 1);
        let want = reference::rms_norm(&x, &w, 1e-6, b * n, hidden);
        let xt = Tensor::<B, 3>::from_data(up(x, vec![b, n, hidden]), device);
        let wt = Tensor::<B, 1>::from_data(up(w, vec![hidden]), device);
        rows_out.push(row(
            format!("[{b}, {n}, {hidden}]"),
            "rms_norm",
            B::rms_norm(xt, wt, 1e-6),
            &want,
            bound,
        ));
    }
    // residual add + RMSNorm: both outputs, the sum rounded to the dtype first (the
    // reference adds in f64, so the bound covers the one rounding of the sum)
    for (i, &(b, n, hidden)) in [(1, 1, 896), (3, 5, 1000), (2, 7, 3584)].iter().enumerate() {
        let seed = 7050 + i as u64;
        let a = reference::random_bf16(b * n * hidden, 4.0, seed);
        let x = reference::random_bf16(b * n * hidden, 4.0, seed + 1);
        let w = reference::random_bf16(hidden, 2.0, seed + 2);
        let s64: Vec<f64> = a
            .iter()
            .zip(&x)
            .map(|(&p, &q)| p as f64 + q as f64)
            .collect();
        let s32: Vec<f32> = s64.iter().map(|&v| v as f32).collect();
        let want = reference::rms_norm(&s32, &w, 1e-6, b * n, hidden);
        let at = Tensor::<B, 3>::from_data(up(a, vec![b, n, hidden]), device);
        let xt = Tensor::<B, 3>::from_data(up(x, vec![b, n, hidden]), device);
        let wt = Tensor::<B, 1>::from_data(up(w, vec![hidden]), device);
        let case = format!("[{b}, {n}, {hidden}]");
        match B::add_rms_norm(at, xt, wt, 1e-6) {
            Ok((sum, normed)) => {
                rows_out.push(row(case.clone(), "add_rms_norm sum", Ok(sum), &s64, bound));
                rows_out.push(row(case, "add_rms_norm", Ok(normed), &want, bound));
            }
            Err(e) => rows_out.push(row::<B, 3>(case, "add_rms_norm", Err(e), &want, bound)),
        }
    }
    // SwiGLU product: odd sizes; gate values up to 8 in size (exp's range both ways)
    for (i, &(b, n, cols)) in [(1, 1, 37), (3, 5, 4864), (2, 3, 18944)].iter().enumerate() {
        let seed = 7100 + i as u64;
        let g = reference::random_bf16(b * n * cols, 8.0, seed);
        let u = reference::random_bf16(b * n * cols, 2.0, seed + 1);
        let want = reference::silu_mul(&g, &u);
        let gt = Tensor::<B, 3>::from_data(up(g, vec![b, n, cols]), device);
        let ut = Tensor::<B, 3>::from_data(up(u, vec![b, n, cols]), device);
        rows_out.push(row(
            format!("[{b}, {n}, {cols}]"),
            "silu_mul",
            B::silu_mul(gt, ut),
            &want,
            bound,
        ));
    }
    // RoPE: x made as [batch, n, heads, d] and viewed as [batch, heads, n, d] (strided, as the
    // model's q and k are); positions ragged and large (Qwen2.5 theta 1e6)
    let theta = 1e6;
    for (i, &(b, h, n, d)) in [(1, 3, 1, 64), (3, 7, 5, 128), (2, 4, 16, 128)]
        .iter()
        .enumerate()
    {
        let seed = 7200 + i as u64;
        let x_bnhd = reference::random_bf16(b * n * h * d, 3.0, seed);
        let mut x = vec![0f32; x_bnhd.len()];
        for bi in 0..b {
            for t in 0..n {
                for hi in 0..h {
                    for c in 0..d {
                        x[((bi * h + hi) * n + t) * d + c] =
                            x_bnhd[((bi * n + t) * h + hi) * d + c];
                    }
                }
            }
        }
        let positions: Vec<usize> = (0..b * n)
            .map(|j| 3 + (j / n) * 9973 + 31 * (j % n) + (j / n) * (j / n) * 1001)
            .collect();
        let want = reference::rope(&x, &positions, theta, [b, h, n, d]);
        let (cos, sin) = rope_tables(&positions, theta, d);
        let xt = Tensor::<B, 4>::from_data(up(x_bnhd, vec![b, n, h, d]), device).swap_dims(1, 2);
        let ct = Tensor::<B, 4>::from_data(up(cos, vec![b, 1, n, d]), device);
        let st = Tensor::<B, 4>::from_data(up(sin, vec![b, 1, n, d]), device);
        rows_out.push(row(
            format!("[{b}, {h}, {n}, {d}] strided"),
            "rope",
            B::rope(xt, ct, st),
            &want,
            bound,
        ));
    }
    // Packed substitutes: 4 bits in groups of 64 (the default), 3 bits (a partly filled last
    // word per group: 10 codes per word, 7 words for 64 rows), a last group cut short, 8 and
    // 2 bits, fewer rows than one group, 1 bit
    let packed: [(usize, usize, u32, usize); 6] = [
        (128, 37, 4, 64),
        (150, 300, 3, 64),
        (896, 4864, 4, 64),
        (40, 70, 8, 32),
        (20, 33, 2, 64),
        (9, 16, 1, 9),
    ];
    for (i, &(rows, cols, bits, group)) in packed.iter().enumerate() {
        let seed = 7300 + i as u64;
        let per = (32 / bits) as usize;
        let (groups, wpg) = (rows.div_ceil(group), group.div_ceil(per));
        let words = reference::random_words(groups * wpg * cols, seed);
        let scale = reference::random_bf16(groups * cols, 0.05, seed + 1);
        let min = reference::random_bf16(groups * cols, 0.5, seed + 2);
        let want = reference::dequantize_packed(
            &words,
            &scale,
            &min,
            [groups, wpg, cols],
            bits,
            group,
            rows,
        );
        let wt = Tensor::<B, 3, burn_tensor::Int>::from_data(
            TensorData::new(words, [groups, wpg, cols]),
            device,
        );
        let st = Tensor::<B, 3>::from_data(up(scale, vec![groups, 1, cols]), device);
        let mt = Tensor::<B, 3>::from_data(up(min, vec![groups, 1, cols]), device);
        rows_out.push(row(
            format!("[{rows}, {cols}] {bits} bits, group {group}"),
            "dequant",
            B::dequantize_packed(wt, st, mt, bits, group, rows),
            &want,
            bound,
        ));
    }
    rows_out.extend(check_skinny_gemms::<B>(device, bound));
    // Prefill GEMM (cuBLAS on CUDA): from the model's threshold of 256 rows up, with and
    // without bias, the weight row-major `[k, n]` and as a transposed view of a row-major
    // `[n, k]` (strides `[1, k]`), odd k and n
    let tall: [(usize, usize, usize, bool, bool); 4] = [
        (300, 512, 320, true, false),
        (256, 96, 1000, false, true),
        (333, 77, 302, true, true),
        (260, 3584, 64, false, false),
    ];
    for (i, &(m, k, n, with_bias, transposed)) in tall.iter().enumerate() {
        let seed = 7450 + i as u64;
        let x = reference::random_bf16(m * k, 2.0, seed);
        let w = reference::random_bf16(k * n, 0.05, seed + 1);
        let b = reference::random_bf16(n, 1.0, seed + 2);
        let want = reference::linear(&x, &w, with_bias.then_some(&b[..]), m, k, n);
        let xt = Tensor::<B, 2>::from_data(up(x, vec![m, k]), device);
        let wt = weight_tensor::<B>(w, k, n, transposed, device);
        let bt = with_bias.then(|| Tensor::<B, 1>::from_data(up(b, vec![n]), device));
        rows_out.push(row(
            format!(
                "[{m}, {k}] x [{k}, {n}]{}{}",
                if transposed { "^T view" } else { "" },
                if with_bias { " + bias" } else { "" }
            ),
            "prefill_gemm",
            B::prefill_linear(xt, wt, bt),
            &want,
            bound,
        ));
    }
    // Prefill GEMMs of one x together (KernelOps::prefill_linear_many: on CUDA the products
    // back to back under one pair of device waits): q/k/v-like widths, a bias on the first
    // and last, the last weight a transposed view; each output against its own reference
    {
        let (m, k) = (300usize, 512usize);
        let x = reference::random_bf16(m * k, 2.0, 7480);
        let xt = Tensor::<B, 2>::from_data(up(x.clone(), vec![m, k]), device);
        let mut parts = Vec::new();
        let mut wants = Vec::new();
        for (j, &(n, with_bias, transposed)) in [
            (320usize, true, false),
            (64, false, false),
            (96, true, true),
        ]
        .iter()
        .enumerate()
        {
            let seed = 7481 + 3 * j as u64;
            let w = reference::random_bf16(k * n, 0.05, seed);
            let b = reference::random_bf16(n, 1.0, seed + 1);
            wants.push(reference::linear(
                &x,
                &w,
                with_bias.then_some(&b[..]),
                m,
                k,
                n,
            ));
            let wt = weight_tensor::<B>(w, k, n, transposed, device);
            let bt = with_bias.then(|| Tensor::<B, 1>::from_data(up(b, vec![n]), device));
            parts.push((wt, bt));
        }
        let widths: Vec<usize> = parts.iter().map(|(w, _)| w.dims()[1]).collect();
        let outs = B::prefill_linear_many(xt, parts);
        for (j, want) in wants.iter().enumerate() {
            let out = match &outs {
                Ok(v) => v.get(j).cloned().ok_or_else(|| {
                    crate::KernelError::invalid("prefill_linear_many outputs", 3, v.len())
                }),
                Err(e) => Err(crate::KernelError::Driver(e.to_string())),
            };
            rows_out.push(row(
                format!("[{m}, {k}] x [{k}, {}], {} of 3", widths[j], j + 1),
                "prefill_gemm_many",
                out,
                want,
                bound,
            ));
        }
    }
    // The first 37 of 40 cached positions as a view (KernelOps::kv_prefix), through a Burn op
    // that reads it by its strides: [2, 3, 40, 64] keys, 384 bytes cut from each head's end
    // (not a multiple of the CUDA allocator's alignment: Burn's own slice would copy)
    {
        let (b, h, cap, len, d) = (2, 3, 40, 37, 64);
        let x = reference::random_bf16(b * h * cap * d, 2.0, 7700);
        let mut want = Vec::with_capacity(b * h * len * d);
        for bh in 0..b * h {
            let head = &x[bh * cap * d..][..len * d];
            want.extend(head.iter().map(|&v| f64::from(v) * 1.1));
        }
        let xt = Tensor::<B, 4>::from_data(up(x, vec![b, h, cap, d]), device);
        rows_out.push(row(
            format!("[{b}, {h}, {cap}, {d}] -> {len} positions, x 1.1"),
            "kv_prefix",
            Ok(B::kv_prefix(xt, len).mul_scalar(1.1)),
            &want,
            bound,
        ));
    }
    // Cache writes: a ragged batch and equal starts (KernelOps::kv_write: the CUDA kernel,
    // then Burn's slice-assign; kv_write_pair: the CUDA kernel both times); the whole cache
    // is compared, so a write past its rows or into another sequence fails as well as a
    // missing one
    for (i, starts) in [vec![0usize, 17, 35], vec![9, 9, 9]]
        .into_iter()
        .enumerate()
    {
        let (b, h, cap, n, d) = (3, 2, 40, 5, 128);
        let seed = 7800 + 10 * i as u64;
        let cache = reference::random_bf16(b * h * cap * d, 2.0, seed);
        let new = reference::random_bf16(b * h * n * d, 2.0, seed + 1);
        // the cache with row `r` of sequence `bb`, head `hh` (at `from(bb, hh, r)` of `new`)
        // written at position `starts[bb] + r`
        let written = |cache: &[f32], new: &[f32], from: &dyn Fn(usize, usize, usize) -> usize| {
            let mut want: Vec<f64> = cache.iter().map(|&v| f64::from(v)).collect();
            for (bb, &st) in starts.iter().enumerate() {
                for hh in 0..h {
                    for r in 0..n {
                        let (to, from) = (((bb * h + hh) * cap + st + r) * d, from(bb, hh, r));
                        for c in 0..d {
                            want[to + c] = f64::from(new[from + c]);
                        }
                    }
                }
            }
            want
        };
        let want = written(&cache, &new, &|bb, hh, r| ((bb * h + hh) * n + r) * d);
        let ct = Tensor::<B, 4>::from_data(up(cache.clone(), vec![b, h, cap, d]), device);
        let nt = Tensor::<B, 4>::from_data(up(new.clone(), vec![b, h, n, d]), device);
        rows_out.push(row(
            format!("[{b}, {h}, {cap}, {d}] + {n} at {starts:?}"),
            "kv_write",
            B::kv_write(ct, nt, &starts),
            &want,
            bound,
        ));
        // the pair (KernelOps::kv_write_pair, one launch on CUDA): keys as above, values a
        // second cache whose new rows come strided, `[b, n, h, d]` with heads and positions
        // swapped (as the model's projections give them)
        let vcache = reference::random_bf16(b * h * cap * d, 2.0, seed + 2);
        let vnew_bnhd = reference::random_bf16(b * n * h * d, 2.0, seed + 3);
        let vwant = written(&vcache, &vnew_bnhd, &|bb, hh, r| {
            ((bb * n + r) * h + hh) * d
        });
        let ct = Tensor::<B, 4>::from_data(up(cache, vec![b, h, cap, d]), device);
        let nt = Tensor::<B, 4>::from_data(up(new, vec![b, h, n, d]), device);
        let vct = Tensor::<B, 4>::from_data(up(vcache, vec![b, h, cap, d]), device);
        let vnt =
            Tensor::<B, 4>::from_data(up(vnew_bnhd, vec![b, n, h, d]), device).swap_dims(1, 2);
        let case = format!("[{b}, {h}, {cap}, {d}] + {n} at {starts:?}, v strided");
        match B::kv_write_pair(ct, vct, nt, vnt, &starts) {
            Ok((kt, vt)) => {
                rows_out.push(row(case.clone(), "kv_write_pair k", Ok(kt), &want, bound));
                rows_out.push(row(case, "kv_write_pair v", Ok(vt), &vwant, bound));
            }
            Err(e) => rows_out.push(row::<B, 4>(case, "kv_write_pair", Err(e), &want, bound)),
        }
    }
    rows_out.extend(check_rope_kv_write::<B>(device, bound));
    rows_out.extend(check_dustin_ops::<B>(device, bound));
    rows_out
}

/// [`KernelOps::rope_kv_write`](crate::MemoryOps::rope_kv_write) against float64 RoPE
/// ([`reference::rope`], Qwen2.5's theta 1e6) and a host-side cache write: queries, keys and
/// values made as `[batch, n, heads, d]` and viewed as `[batch, heads, n, d]` (as the model's
/// projections give them), each token at position `starts[b] + i`, a ragged batch and equal
/// starts. Four rows a case: the rotated queries and keys, and both whole caches (so a write
/// past its rows or into another sequence fails as well as a missing one).
fn check_rope_kv_write<B: KernelOps>(device: &B::Device, bound: f64) -> Vec<CheckRow> {
    let mut rows_out = Vec::new();
    let theta: f64 = 1e6;
    let (b, nh, kvh, cap, n, d) = (3, 7, 2, 40, 5, 128);
    // [b, n, h, d] values of `h` heads, and the same as [b, h, n, d] host order
    let strided = |h: usize, seed: u64| {
        let bnhd = reference::random_bf16(b * n * h * d, 3.0, seed);
        let mut bhnd = vec![0f32; bnhd.len()];
        for bi in 0..b {
            for t in 0..n {
                for hi in 0..h {
                    let (to, from) = (((bi * h + hi) * n + t) * d, ((bi * n + t) * h + hi) * d);
                    bhnd[to..to + d].copy_from_slice(&bnhd[from..from + d]);
                }
            }
        }
        let t = Tensor::<B, 4>::from_data(TensorData::new(bnhd, vec![b, n, h, d]), device);
        (t.swap_dims(1, 2), bhnd)
    };
    for (i, starts) in [vec![0usize, 17, 35], vec![9, 9, 9]]
        .into_iter()
        .enumerate()
    {
        let seed = 8100 + 10 * i as u64;
        let positions: Vec<usize> = (0..b * n).map(|j| starts[j / n] + j % n).collect();
        let (cos, sin) = rope_tables(&positions, theta, d);
        let (qt, q) = strided(nh, seed);
        let (kt, k) = strided(kvh, seed + 1);
        let (vt, v) = strided(kvh, seed + 2);
        let kcache = reference::random_bf16(b * kvh * cap * d, 2.0, seed + 3);
        let vcache = reference::random_bf16(b * kvh * cap * d, 2.0, seed + 4);
        let qwant = reference::rope(&q, &positions, theta, [b, nh, n, d]);
        let kwant = reference::rope(&k, &positions, theta, [b, kvh, n, d]);
        // the cache with new row `r` of sequence `bb`, head `hh` written at `starts[bb] + r`
        let written = |cache: &[f32], new: &dyn Fn(usize) -> f64| {
            let mut want: Vec<f64> = cache.iter().map(|&x| f64::from(x)).collect();
            for (bb, &st) in starts.iter().enumerate() {
                for hh in 0..kvh {
                    for r in 0..n {
                        let (to, from) = (
                            ((bb * kvh + hh) * cap + st + r) * d,
                            ((bb * kvh + hh) * n + r) * d,
                        );
                        for c in 0..d {
                            want[to + c] = new(from + c);
                        }
                    }
                }
            }
            want
        };
        let kcwant = written(&kcache, &|j| kwant[j]);
        let vcwant = written(&vcache, &|j| f64::from(v[j]));
        let ct = |x: Vec<f32>| {
            Tensor::<B, 4>::from_data(TensorData::new(x, vec![b, kvh, cap, d]), device)
        };
        let table =
            |x: Vec<f32>| Tensor::<B, 4>::from_data(TensorData::new(x, vec![b, 1, n, d]), device);
        let case =
            format!("q [{b}, {nh}, {n}, {d}], kv [{b}, {kvh}, {cap}, {d}] at {starts:?}, strided");
        match B::rope_kv_write(
            qt,
            kt,
            vt,
            table(cos),
            table(sin),
            ct(kcache),
            ct(vcache),
            &starts,
        ) {
            Ok(out) => {
                rows_out.push(row(
                    case.clone(),
                    "rope_kv_write q",
                    Ok(out.q),
                    &qwant,
                    bound,
                ));
                rows_out.push(row(
                    case.clone(),
                    "rope_kv_write k",
                    Ok(out.k),
                    &kwant,
                    bound,
                ));
                rows_out.push(row(
                    case.clone(),
                    "rope_kv_write k cache",
                    Ok(out.k_dst),
                    &kcwant,
                    bound,
                ));
                rows_out.push(row(
                    case,
                    "rope_kv_write v cache",
                    Ok(out.v_dst),
                    &vcwant,
                    bound,
                ));
            }
            Err(e) => rows_out.push(row::<B, 4>(case, "rope_kv_write", Err(e), &qwant, bound)),
        }
    }
    rows_out
}

/// RoPE tables `[positions, d]` as `KernelOps::rope` takes them: `[cos, cos]` and `[-sin,
/// sin]` of `p * theta^(-2c / d)` at each position `p` (Su et al. 2021), in float64 rounded
/// once to f32.
fn rope_tables(positions: &[usize], theta: f64, d: usize) -> (Vec<f32>, Vec<f32>) {
    let half = d / 2;
    let (mut cos, mut sin) = (
        vec![0f32; positions.len() * d],
        vec![0f32; positions.len() * d],
    );
    for (j, &p) in positions.iter().enumerate() {
        for c in 0..half {
            let a = p as f64 * theta.powf(-(2.0 * c as f64) / d as f64);
            cos[j * d + c] = a.cos() as f32;
            cos[j * d + half + c] = a.cos() as f32;
            sin[j * d + c] = -a.sin() as f32;
            sin[j * d + half + c] = a.sin() as f32;
        }
    }
    (cos, sin)
}

/// `len` positive values (the magnitudes of [`reference::random_bf16`]'s): scores and
/// attention masses.
fn positive_bf16(len: usize, amp: f32, seed: u64) -> Vec<f32> {
    reference::random_bf16(len, amp, seed)
        .into_iter()
        .map(f32::abs)
        .collect()
}

/// The `dustin` estimator's ops ([`KernelOps::fold_rows`](crate::SelectionOps::fold_rows), [`KernelOps::mix_scores`](crate::SelectionOps::mix_scores), two
/// rows each) against [`reference::fold_rows`] and [`reference::mix_scores`]; part of
/// [`check_elementwise`], and on its own for `dustin-kernels-gpu check --op dustin`.
pub fn check_dustin_ops<B: KernelOps>(device: &B::Device, bound: f64) -> Vec<CheckRow> {
    let mut rows_out = Vec::new();
    let up = |v: Vec<f32>, shape: Vec<usize>| TensorData::new(v, shape);
    // dustin's history fold: a history read through a strided view (a wider tensor cut to
    // `len`), a KV head without estimator heads (own 0, all 1/3), per-sequence weights; and
    // no history. Scores are probabilities, so positive.
    for (i, &(b, kvh, n, l, with_hist)) in [(2, 4, 5, 1000, true), (3, 2, 1, 77, false)]
        .iter()
        .enumerate()
    {
        let seed = 7600 + i as u64;
        let rows: Vec<f32> = positive_bf16(b * kvh * n * l, 1.0, seed);
        let wide = l + 30;
        let hist_wide: Vec<f32> = positive_bf16(b * kvh * wide, 2.0, seed + 1);
        let hist: Vec<f32> = hist_wide
            .chunks(wide)
            .flat_map(|r| r[..l].to_vec())
            .collect();
        let factor: Vec<f32> = (0..b).map(|j| 0.8f32.powi(j as i32 + 1)).collect();
        let w: Vec<f32> = (0..b * n).map(|j| 0.2 + 0.13 * (j % 5) as f32).collect();
        let (own, all): (Vec<f32>, Vec<f32>) = if kvh == 4 {
            (vec![0.5, 0.0, 1.0, 1.0], vec![0.0, 1.0 / 3.0, 0.0, 0.0])
        } else {
            (vec![1.0; kvh], vec![0.0; kvh])
        };
        let want = reference::fold_rows(
            with_hist.then_some(hist.as_slice()),
            &factor,
            &rows,
            [b, kvh, n, l],
            &w,
            &own,
            &all,
        );
        let rt = Tensor::<B, 4>::from_data(up(rows, vec![b, kvh, n, l]), device);
        let ht = with_hist.then(|| {
            Tensor::<B, 3>::from_data(up(hist_wide, vec![b, kvh, wide]), device).narrow(2, 0, l)
        });
        rows_out.push(row(
            format!("[{b}, {kvh}, {n}, {l}], history {with_hist}"),
            "fold_rows",
            B::fold_rows(ht, &factor, rt, &w, &own, &all),
            &want,
            bound,
        ));
    }
    // dustin's normalise-and-mix: a lookahead wider than the width and a history narrower
    // (both read 0 past their ends), through a strided view; no lookahead with an empty free
    // range (a row of zeros) and a range reaching the width
    type MixCase = (
        usize,
        usize,
        usize,
        Option<usize>,
        Vec<(usize, usize)>,
        usize,
    );
    let mix_cases: [MixCase; 2] = [
        (2, 4, 1000, Some(1100), vec![(4, 900), (4, 936)], 1024),
        (3, 2, 333, None, vec![(1, 300), (0, 0), (5, 333)], 333),
    ];
    for (i, (b, kvh, hl, la_len, free, width)) in mix_cases.into_iter().enumerate() {
        let seed = 7650 + i as u64;
        let wide = hl + 17;
        let hist_wide: Vec<f32> = positive_bf16(b * kvh * wide, 2.0, seed);
        let hist: Vec<f32> = hist_wide
            .chunks(wide)
            .flat_map(|r| r[..hl].to_vec())
            .collect();
        let la: Option<Vec<f32>> = la_len.map(|ll| positive_bf16(b * ll, 1.0, seed + 1));
        let want = reference::mix_scores(
            &hist,
            [b, kvh, hl],
            la.as_deref().zip(la_len),
            &free,
            0.5,
            width,
        );
        let ht =
            Tensor::<B, 3>::from_data(up(hist_wide, vec![b, kvh, wide]), device).narrow(2, 0, hl);
        let lt = la
            .zip(la_len)
            .map(|(v, ll)| Tensor::<B, 2>::from_data(up(v, vec![b, ll]), device));
        rows_out.push(row(
            format!("[{b}, {kvh}, {hl}] to {width}, lookahead {la_len:?}"),
            "mix_scores",
            B::mix_scores(ht, lt, &free, 0.5, width),
            &want,
            bound,
        ));
    }
    rows_out
}
