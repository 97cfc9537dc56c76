//! Prefill attention on the CPU in tiles (flash attention, Dao et al. 2022, arXiv
//! 2205.14135, with the online softmax of Milakov and Gimelshein 2018): the dense causal
//! attention of a prefill chunk of many new tokens, `Flex`'s
//! [`KernelOps::prefill_attention`](crate::AttentionOps::prefill_attention) from
//! [`MIN_NEW`] new tokens on.
//!
//! [`crate::cpu_attn`] is built for a few query rows: one task per chunk of keys scores every
//! row of its KV head against the chunk, keeps a score buffer of `rows x 512` and merges the
//! chunks afterwards. For a prefill chunk of 2,048 tokens that buffer is 25 MB a task and the
//! products read each key once per query row through a horizontal sum: an 8k-token prefill of
//! the Qwen2.5-Coder pair spent 154 of its 232 s there on two AVX-512 cores (43 s in these
//! tiles; `docs/perf.md`, "CPU: prefill"). Here:
//! - **Tasks** are `(sequence, KV head, block of new tokens)`: the rows of a task are the
//!   block's tokens times the group's query heads (about [`ROWS`]), packed into a buffer
//!   that stays in L2 with its output rows.
//! - **Key blocks** of four sub-blocks of two vector widths (128 keys under AVX-512, 64
//!   under AVX2) walk the entries the block's last token sees. A sub-block's keys are
//!   transposed into `[head_dim, 32]` once, then `s = scale q k^T` is a register tile of 8
//!   rows x 32 keys built from broadcasts of the query and vector loads of the transposed
//!   keys (no horizontal sums).
//! - **Online softmax** per row and key block: `m' = max(m, max s)`, `p = e^(s - m')`,
//!   `l' = l e^(m - m') + sum p`, `o' = o e^(m - m') + p v` (two horizontal reductions a row
//!   per 128 keys); entries past a row's causal limit get `p = 0` exactly. `o` accumulates in a register tile of 6 rows x 64 values over the block's value
//!   rows, read where the cache holds them.
//! - At the end `o / l`.
//!
//! Rows keep their own arithmetic in a fixed order, so the result does not depend on the
//! threads. It differs in rounding from [`crate::cpu_attn`] (another summation order), which
//! still serves decoding and verification, so that those stay bit-identical to each other.

use rayon::prelude::*;

use crate::cpu_attn::{exp_approx, Isa, Shape, Strided};

/// New tokens from which `Flex`'s prefill attention takes this kernel (dense contexts
/// only); shorter chunks take [`crate::cpu_attn`], whose tasks split the keys instead.
pub const MIN_NEW: usize = 64;

/// Query rows a task aims at (new tokens x the group's heads): 96 rows of 128 f32 and their
/// outputs are 96 KiB, which L2 holds beside a key and a value block.
pub const ROWS: usize = 96;

/// The softmax attention of [`crate::cpu_attn::attention`] over dense contexts, in tiles:
/// `q` `[batch, q_heads, n_new, head_dim]` (contiguous), keys and values `k`, `v` holding
/// positions `0 .. ctx_lens[b] + n_new` of each sequence; row `i` of sequence `b` sees
/// positions `0 ..= ctx_lens[b] + i`. Returns `[batch, q_heads, n_new, head_dim]`
/// (contiguous), or `None` where this CPU has no AVX2 with FMA or the head width is not a
/// multiple of 4 vectors (then the caller takes [`crate::cpu_attn::attention`]).
///
/// The caller has checked the shapes ([`crate::check_attn`]).
pub fn attention(
    q: &[f32],
    k: Strided<'_>,
    v: Strided<'_>,
    shape: Shape,
    ctx_lens: &[usize],
    scale: f32,
) -> Option<Vec<f32>> {
    let isa = Isa::detect();
    let d = shape.head_dim;
    #[cfg(target_arch = "x86_64")]
    {
        let run: fn(&Task<'_>, &mut [f32]) = match isa {
            Isa::Avx512 if d.is_multiple_of(64) => task_avx512,
            Isa::Avx512 | Isa::Avx2Fma if d.is_multiple_of(32) => task_avx2,
            _ => return None,
        };
        Some(run_tasks(q, k, v, shape, ctx_lens, scale, run))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, d, q, k, v, ctx_lens, scale);
        None
    }
}

/// One task: a block of new tokens of one `(sequence, KV head)`.
struct Task<'a> {
    q: &'a [f32],
    k: &'a Strided<'a>,
    v: &'a Strided<'a>,
    shape: Shape,
    b: usize,
    h: usize,
    /// Context tokens of the sequence (before its new ones).
    ctx: usize,
    /// New tokens `t0 .. t1` of the block.
    t0: usize,
    t1: usize,
    scale: f32,
}

/// Splits the work into tasks and writes each task's rows into the output.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn run_tasks(
    q: &[f32],
    k: Strided<'_>,
    v: Strided<'_>,
    shape: Shape,
    ctx_lens: &[usize],
    scale: f32,
    run: fn(&Task<'_>, &mut [f32]),
) -> Vec<f32> {
    let Shape {
        batch,
        q_heads,
        kv_heads,
        n_new: n,
        head_dim: d,
    } = shape;
    let g = q_heads / kv_heads;
    let per = ROWS.div_ceil(g).clamp(1, n.max(1));
    let blocks = n.div_ceil(per);
    // the output of each (b, h): the group's heads x new tokens, contiguous
    let mut out = vec![0f32; batch * q_heads * n * d];
    out.par_chunks_mut(g * n * d)
        .enumerate()
        .for_each(|(bh, dst)| {
            let (b, h) = (bh / kv_heads, bh % kv_heads);
            // the blocks of one (b, h) write disjoint token ranges of each head: collect
            // each block's rows, then scatter (latest blocks first: they see the most keys)
            let rows: Vec<(usize, Vec<f32>)> = (0..blocks)
                .into_par_iter()
                .rev()
                .map(|blk| {
                    let t0 = blk * per;
                    let t1 = n.min(t0 + per);
                    let task = Task {
                        q,
                        k: &k,
                        v: &v,
                        shape,
                        b,
                        h,
                        ctx: ctx_lens[b],
                        t0,
                        t1,
                        scale,
                    };
                    let mut o = vec![0f32; (t1 - t0) * g * d];
                    run(&task, &mut o);
                    (t0, o)
                })
                .collect();
            for (t0, o) in rows {
                let tb = o.len() / (g * d);
                for (r, row) in o.chunks_exact(d).enumerate() {
                    let (t, gi) = (r / g, r % g);
                    debug_assert!(t < tb);
                    dst[(gi * n + t0 + t) * d..][..d].copy_from_slice(row);
                }
            }
        });
    out
}

#[cfg(target_arch = "x86_64")]
fn task_avx512(task: &Task<'_>, out: &mut [f32]) {
    // SAFETY: AVX-512F was detected at run time (`Isa::detect`) and the head width is a
    // multiple of 4 vectors of 16 (`attention`)
    unsafe { task_avx512_in(task, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn task_avx512_in(task: &Task<'_>, out: &mut [f32]) {
    // SAFETY: as this function's
    unsafe { tile_task::<x86::Avx512>(task, out) }
}

#[cfg(target_arch = "x86_64")]
fn task_avx2(task: &Task<'_>, out: &mut [f32]) {
    // SAFETY: AVX2 and FMA were detected at run time (`Isa::detect`) and the head width is a
    // multiple of 4 vectors of 8 (`attention`)
    unsafe { task_avx2_in(task, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn task_avx2_in(task: &Task<'_>, out: &mut [f32]) {
    // SAFETY: as this function's
    unsafe { tile_task::<x86::Avx2>(task, out) }
}

/// The vector operations the tiles take.
pub(crate) trait Lanes {
    /// Lanes of a vector.
    const W: usize;
    /// A vector of `W` f32.
    type V: Copy;
    /// Query rows of a score tile (at most 8): `2 QK_ROWS` accumulators, two key vectors
    /// and a broadcast fit the registers.
    const QK_ROWS: usize;
    /// Vectors of an output segment (4): the head width must be a multiple of
    /// `PV_SEG W`.
    const PV_SEG: usize = 4;
    /// Output rows of a value tile (at most 6): `PV_ROWS x PV_SEG` accumulators, a segment
    /// of a value row and a broadcast fit the registers.
    const PV_ROWS: usize;
    /// Zeros.
    unsafe fn zero() -> Self::V;
    /// `W` values from `p`.
    unsafe fn load(p: *const f32) -> Self::V;
    /// `W` values to `p`.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `x` in every lane.
    unsafe fn splat(x: f32) -> Self::V;
    /// `a * b + c`, fused.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `a * b`.
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a + b`.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum.
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// The maximum of the lanes.
    unsafe fn hmax(v: Self::V) -> f32;
    /// The sum of the lanes.
    unsafe fn hsum(v: Self::V) -> f32;

    /// `max x` (`-inf` for none; NaN-blind).
    ///
    /// # Safety
    /// The instruction set; `x.len()` a multiple of `W`.
    #[inline(always)]
    unsafe fn row_max(x: &[f32]) -> f32 {
        // SAFETY: as this function's
        unsafe {
            let mut a = Self::splat(f32::NEG_INFINITY);
            for c in (0..x.len()).step_by(Self::W) {
                a = Self::max(a, Self::load(x.as_ptr().add(c)));
            }
            Self::hmax(a)
        }
    }

    /// `sum x` in `W` lanes, then across them.
    ///
    /// # Safety
    /// As [`Lanes::row_max`].
    #[inline(always)]
    unsafe fn row_sum(x: &[f32]) -> f32 {
        // SAFETY: as this function's
        unsafe {
            let mut a = Self::zero();
            for c in (0..x.len()).step_by(Self::W) {
                a = Self::add(a, Self::load(x.as_ptr().add(c)));
            }
            Self::hsum(a)
        }
    }
}

/// Key sub-blocks of `2 W` keys a key block holds: 128 keys under AVX-512, so that a row's
/// per-block work (two horizontal reductions, the rescale of its output) is spread over many
/// keys.
const SUB: usize = 4;

/// The rows of one task against every entry its last token sees, written to `out`
/// `[rows, head_dim]` (row `r` = token `t0 + r / g`, head `h g + r % g`).
///
/// # Safety
/// `L`'s instruction set is available; the head width is a multiple of `PV_SEG L::W`.
#[inline(always)]
unsafe fn tile_task<L: Lanes>(task: &Task<'_>, out: &mut [f32]) {
    let Shape {
        q_heads,
        kv_heads,
        n_new: n,
        head_dim: d,
        ..
    } = task.shape;
    let g = q_heads / kv_heads;
    let (w, sub) = (L::W, 2 * L::W);
    let kb = SUB * sub;
    let tokens = task.t1 - task.t0;
    let rows = tokens * g;
    // packed query rows, token-major: row r = (t, gi)
    let mut qp = vec![0f32; rows * d];
    for (r, dst) in qp.chunks_exact_mut(d).enumerate() {
        let (t, gi) = (r / g, r % g);
        let src = ((task.b * q_heads + task.h * g + gi) * n + task.t0 + t) * d;
        dst.copy_from_slice(&task.q[src..src + d]);
    }
    // entries a row sees: positions 0 .. ctx + t + 1
    let limit = |r: usize| task.ctx + task.t0 + r / g + 1;
    let end = limit(rows - 1);
    // the keys of a block as SUB transposed sub-blocks [d, 2 W]
    let mut kt = vec![0f32; d * kb];
    let mut s = vec![0f32; rows * kb];
    let mut m = vec![f32::NEG_INFINITY; rows];
    let mut l = vec![0f32; rows];
    let mut vrows: Vec<&[f32]> = Vec::with_capacity(kb);
    for k0 in (0..end).step_by(kb) {
        let k1 = end.min(k0 + kb);
        for (j, p) in (k0..k0 + kb).enumerate() {
            let base = (j / sub) * d * sub + j % sub;
            if p < k1 {
                let row = task.k.row_at(task.b, task.h, p);
                for (c, &x) in row.iter().enumerate() {
                    kt[base + c * sub] = x;
                }
            } else {
                for c in 0..d {
                    kt[base + c * sub] = 0.0;
                }
            }
        }
        // rows with an entry in the block: a suffix, since the limits grow with the token
        let r0 = (0..rows).find(|&r| limit(r) > k0).unwrap_or(rows);
        let mut r = r0;
        while r < rows {
            let rr = L::QK_ROWS.min(rows - r);
            // sub-blocks up to the last key the group's last row sees
            let subs = (limit(r + rr - 1).min(k1) - k0).div_ceil(sub);
            for st in 0..subs {
                // SAFETY: as this function's; `qp` holds rows r .. r + rr, `s` as many,
                // `kt` the sub-block `st`
                unsafe {
                    let qr = qp.as_ptr().add(r * d);
                    let sr = s.as_mut_ptr().add(r * kb + st * sub);
                    let kp = kt.as_ptr().add(st * d * sub);
                    let sc = task.scale;
                    match rr {
                        8 => qk_tile::<L, 8>(qr, kp, d, sc, sr, kb),
                        7 => qk_tile::<L, 7>(qr, kp, d, sc, sr, kb),
                        6 => qk_tile::<L, 6>(qr, kp, d, sc, sr, kb),
                        5 => qk_tile::<L, 5>(qr, kp, d, sc, sr, kb),
                        4 => qk_tile::<L, 4>(qr, kp, d, sc, sr, kb),
                        3 => qk_tile::<L, 3>(qr, kp, d, sc, sr, kb),
                        2 => qk_tile::<L, 2>(qr, kp, d, sc, sr, kb),
                        _ => qk_tile::<L, 1>(qr, kp, d, sc, sr, kb),
                    }
                }
            }
            r += rr;
        }
        // online softmax: p in place of s (0 past each row's limit), the outputs rescaled
        let width = k1 - k0;
        for r in r0..rows {
            let lim = limit(r).min(k1) - k0;
            let sr = &mut s[r * kb..r * kb + width.next_multiple_of(w)];
            sr[lim..].fill(f32::NEG_INFINITY);
            // SAFETY: as this function's; `sr` is a whole number of vectors
            let mn = m[r].max(unsafe { L::row_max(sr) });
            for x in sr.iter_mut() {
                *x = exp_approx(*x - mn);
            }
            sr[lim..].fill(0.0);
            // SAFETY: as above
            let sum = unsafe { L::row_sum(sr) };
            if m[r] == f32::NEG_INFINITY {
                l[r] = sum;
            } else if mn > m[r] {
                let a = exp_approx(m[r] - mn);
                l[r] = l[r] * a + sum;
                for x in &mut out[r * d..(r + 1) * d] {
                    *x *= a;
                }
            } else {
                l[r] += sum;
            }
            m[r] = mn;
        }
        // o += p v over the block's value rows
        vrows.clear();
        vrows.extend((k0..k1).map(|p| task.v.row_at(task.b, task.h, p)));
        let mut r = r0;
        while r < rows {
            let rr = L::PV_ROWS.min(rows - r);
            // value rows up to the last one the group's last row sees
            let vr = &vrows[..limit(r + rr - 1).min(k1) - k0];
            for c in (0..d).step_by(L::PV_SEG * w) {
                // SAFETY: as this function's; rows r .. r + rr of `s` and `out`, values
                // c .. c + PV_SEG W of each row
                unsafe {
                    let (pr, or) = (s.as_ptr().add(r * kb), out.as_mut_ptr().add(r * d + c));
                    match rr {
                        6 => pv_tile::<L, 6>(pr, kb, vr, c, or, d),
                        5 => pv_tile::<L, 5>(pr, kb, vr, c, or, d),
                        4 => pv_tile::<L, 4>(pr, kb, vr, c, or, d),
                        3 => pv_tile::<L, 3>(pr, kb, vr, c, or, d),
                        2 => pv_tile::<L, 2>(pr, kb, vr, c, or, d),
                        _ => pv_tile::<L, 1>(pr, kb, vr, c, or, d),
                    }
                }
            }
            r += rr;
        }
    }
    for (r, o) in out.chunks_exact_mut(d).enumerate() {
        let inv = 1.0 / l[r];
        for x in o {
            *x *= inv;
        }
    }
}

/// `s[r][j] = scale * sum_c q[r][c] kt[c][j]` for `R` rows and `2 W` keys: `R x 2` vector
/// accumulators, one broadcast of a query value and two loads of transposed keys per `c`.
///
/// # Safety
/// `L`'s instruction set; `q` holds `R x d` values (row stride `d`), `kt` `d x 2 W`, `s`
/// `R` rows of stride `ss` with `2 W` values each.
#[inline(always)]
unsafe fn qk_tile<L: Lanes, const R: usize>(
    q: *const f32,
    kt: *const f32,
    d: usize,
    scale: f32,
    s: *mut f32,
    ss: usize,
) {
    let w = L::W;
    // SAFETY: as this function's
    unsafe {
        let mut acc = [[L::zero(); 2]; R];
        for c in 0..d {
            let k0 = L::load(kt.add(c * 2 * w));
            let k1 = L::load(kt.add(c * 2 * w + w));
            for (r, a) in acc.iter_mut().enumerate() {
                let qb = L::splat(*q.add(r * d + c));
                a[0] = L::fma(qb, k0, a[0]);
                a[1] = L::fma(qb, k1, a[1]);
            }
        }
        let sc = L::splat(scale);
        for (r, a) in acc.iter().enumerate() {
            L::store(s.add(r * ss), L::mul(a[0], sc));
            L::store(s.add(r * ss + w), L::mul(a[1], sc));
        }
    }
}

/// `o[r][c .. c + S W] += sum_j p[r][j] v_j[c ..]` for `R` rows over the block's value rows
/// `v` (`S` = [`Lanes::PV_SEG`]), the segment in `R x S` vector accumulators.
///
/// # Safety
/// `L`'s instruction set; `p` holds `R` rows of stride `ps` with at least `v.len()` values,
/// each `v_j` at least `c + S W` values, `o` `R` rows of stride `d` from value `c`.
#[inline(always)]
unsafe fn pv_tile<L: Lanes, const R: usize>(
    p: *const f32,
    ps: usize,
    v: &[&[f32]],
    c: usize,
    o: *mut f32,
    d: usize,
) {
    const S: usize = 4;
    debug_assert_eq!(S, L::PV_SEG);
    let w = L::W;
    // SAFETY: as this function's
    unsafe {
        let mut acc = [[L::zero(); S]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            for (t, x) in a.iter_mut().enumerate() {
                *x = L::load(o.add(r * d + t * w));
            }
        }
        for (j, vj) in v.iter().enumerate() {
            let vp = vj.as_ptr().add(c);
            let mut vv = [L::zero(); S];
            for (t, x) in vv.iter_mut().enumerate() {
                *x = L::load(vp.add(t * w));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let pb = L::splat(*p.add(r * ps + j));
                for (x, &y) in a.iter_mut().zip(&vv) {
                    *x = L::fma(pb, y, *x);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            for (t, x) in a.iter().enumerate() {
                L::store(o.add(r * d + t * w), *x);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::Lanes;

    /// AVX-512F, 16 lanes.
    pub(super) struct Avx512;
    /// AVX2 with FMA, 8 lanes.
    pub(super) struct Avx2;

    // SAFETY (every method): the caller's contract (`Lanes`): the instruction set is
    // available and each pointer has `W` values
    impl Lanes for Avx512 {
        const W: usize = 16;
        type V = __m512;
        // 16 + 2 + 1 and 24 + 4 + 1 of 32 registers
        const QK_ROWS: usize = 8;
        const PV_ROWS: usize = 6;
        #[inline(always)]
        unsafe fn zero() -> __m512 {
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn max(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_max_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn hmax(v: __m512) -> f32 {
            unsafe { _mm512_reduce_max_ps(v) }
        }
        #[inline(always)]
        unsafe fn hsum(v: __m512) -> f32 {
            unsafe { _mm512_reduce_add_ps(v) }
        }
    }

    impl Lanes for Avx2 {
        const W: usize = 8;
        type V = __m256;
        // 12 + 2 + 1 and 8 + 4 + 1 of 16 registers
        const QK_ROWS: usize = 6;
        const PV_ROWS: usize = 2;
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn max(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_max_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn hmax(v: __m256) -> f32 {
            unsafe {
                let h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
                let h = _mm_max_ss(h, _mm_movehdup_ps(h));
                _mm_cvtss_f32(h)
            }
        }
        #[inline(always)]
        unsafe fn hsum(v: __m256) -> f32 {
            unsafe {
                let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
                let h = _mm_add_ss(h, _mm_movehdup_ps(h));
                _mm_cvtss_f32(h)
            }
        }
    }
}
