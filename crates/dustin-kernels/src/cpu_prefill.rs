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
//! the Qwen2.5-Coder pair spent 154 of its 232 s there on two AVX-512 cores (37 s in these
//! tiles; `docs/perf.md`, "CPU: prefill"). Here:
//! - **Tasks** are `(sequence, KV head, block of new tokens)`: the rows of a task are the
//!   block's tokens times the group's query heads (about [`ROWS`], few of them padding to a
//!   multiple of 32), their queries packed once as `[head_dim, rows]`, in L2 with the
//!   task's output rows.
//! - **Key blocks** of 64 keys walk the entries the block's last token sees. The scores are
//!   held transposed, `[key, row]`: a register tile of 8 keys x 32 rows (AVX-512; 6 x 16
//!   under AVX2) is built from broadcasts of key values, read where the cache holds them,
//!   and vector loads of the packed queries, so nothing is transposed per block and no
//!   product is summed horizontally.
//! - **Online softmax** with the rows in the vector lanes, down the block's keys:
//!   `m' = max(m, max s)`, `p = e^(s - m')`, `l' = l e^(m - m') + sum p`,
//!   `o' = o e^(m - m') + p v`; entries past a row's causal limit get `p = 0` exactly.
//!   `o` accumulates in a register tile of 6 rows x 64 values (2 x 32 under AVX2) over the
//!   block's value rows.
//! - At the end `o / l`.
//!
//! Rows keep their own arithmetic in a fixed order, so the result does not depend on the
//! threads. It differs in rounding from [`crate::cpu_attn`] (another summation order), which
//! still serves decoding and verification, so that those stay bit-identical to each other.

use rayon::prelude::*;

use crate::cpu_attn::{exp_approx, Isa, Shape, Strided};
use crate::cpu_skinny::Simd;

/// New tokens from which `Flex`'s prefill attention takes this kernel (dense contexts
/// only); shorter chunks take [`crate::cpu_attn`], whose tasks split the keys instead.
pub const MIN_NEW: usize = 64;

/// Query rows a task aims at (new tokens x the group's heads): 96 rows of 128 f32, their
/// outputs and the block's scores are 120 KiB, which L2 holds beside a key and a value
/// block.
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

/// New tokens of a task for a group of `g` query heads: between about 2/3 and 5/3 of
/// [`ROWS`] rows, as few padding rows to a multiple of 32 (the score tile's row vectors)
/// as possible, then as close to [`ROWS`] as possible (`g` = 7, Qwen2.5-0.5B's and 7B's
/// groups: 18 tokens, 126 rows of 128).
fn tokens_per_task(g: usize) -> usize {
    let g = g.max(1);
    let lo = (2 * ROWS / 3).div_ceil(g).max(1);
    let hi = (5 * ROWS / 3 / g).max(lo);
    (lo..=hi)
        .min_by_key(|&t| {
            let rows = t * g;
            // padding in thousandths of the rows, then the distance to ROWS
            (
                (rows.next_multiple_of(32) - rows) * 1000 / rows,
                rows.abs_diff(ROWS),
            )
        })
        .unwrap_or(lo)
}

/// One task: a block of new tokens of one `(sequence, KV head)`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the tiles run on x86-64 only
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
    let per = tokens_per_task(g).clamp(1, n.max(1));
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

/// The tile sizes of an instruction set whose vector operations are
/// [`crate::cpu_skinny::Simd`]'s.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the tiles run on x86-64 only
pub(crate) trait Lanes: Simd {
    /// Keys of a score tile (at most 8): `2 QK_KEYS` accumulators, two query vectors and a
    /// broadcast fit the registers.
    const QK_KEYS: usize;
    /// Vectors of an output segment (4): the head width must be a multiple of
    /// `PV_SEG LANES`.
    const PV_SEG: usize = 4;
    /// Output rows of a value tile (at most 6): `PV_ROWS x PV_SEG` accumulators, a segment
    /// of a value row and a broadcast fit the registers.
    const PV_ROWS: usize;
}

/// Keys of a key block: each block costs every row a rescale of its output, spread over
/// this many keys.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the tiles run on x86-64 only
const KEYS: usize = 64;

/// The rows of one task against every entry its last token sees, written to `out`
/// `[rows, head_dim]` (row `r` = token `t0 + r / g`, head `h g + r % g`).
///
/// The scores are held transposed, `[key, row]`: a tile is a few keys (broadcast) times two
/// vectors of rows (loaded from the queries packed as `[head_dim, rows]` once per task), so
/// no key is transposed, and the softmax runs down the keys with rows in the lanes.
///
/// # Safety
/// `L`'s instruction set is available; the head width is a multiple of `PV_SEG L::LANES`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the tiles run on x86-64 only
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
    let (w, rw) = (L::LANES, 2 * L::LANES);
    let tokens = task.t1 - task.t0;
    let rows = tokens * g;
    let rp = rows.next_multiple_of(rw);
    // queries transposed, [d, rp] (token-major rows r = (t, gi); padding rows zero)
    let mut qt = vec![0f32; d * rp];
    for r in 0..rows {
        let (t, gi) = (r / g, r % g);
        let src = ((task.b * q_heads + task.h * g + gi) * n + task.t0 + t) * d;
        for (c, &x) in task.q[src..src + d].iter().enumerate() {
            qt[c * rp + r] = x;
        }
    }
    // entries a row sees: positions 0 .. ctx + t + 1 (padding rows: the last row's)
    let limit = |r: usize| task.ctx + task.t0 + r.min(rows - 1) / g + 1;
    // the first row that sees position p (rows if none)
    let first = |p: usize| {
        let seen = p + 1;
        if seen <= task.ctx + task.t0 + 1 {
            0
        } else {
            ((seen - task.ctx - task.t0 - 1) * g).min(rows)
        }
    };
    let end = limit(rows - 1);
    let mut st = vec![0f32; KEYS * rp];
    let mut m = vec![f32::NEG_INFINITY; rp];
    let mut l = vec![0f32; rp];
    let mut mn = vec![0f32; rp];
    let mut alpha = vec![0f32; rp];
    let mut kv_rows: Vec<&[f32]> = Vec::with_capacity(KEYS);
    for k0 in (0..end).step_by(KEYS) {
        let k1 = end.min(k0 + KEYS);
        let width = k1 - k0;
        kv_rows.clear();
        kv_rows.extend((k0..k1).map(|p| task.k.row_at(task.b, task.h, p)));
        // rows with an entry in the block: a suffix, since the limits grow with the token
        let r0 = first(k0);
        let rv0 = r0 / rw * rw;
        // scores [key, row] of the vectors of rows that see the block
        for rv in (rv0..rp).step_by(rw) {
            // keys up to the last one these rows see
            let kn = limit(rv + rw - 1).min(k1) - k0;
            let mut j = 0;
            while j < kn {
                let kr = L::QK_KEYS.min(kn - j);
                // SAFETY: as this function's; `qt` holds columns rv .. rv + 2 LANES of every
                // value, `st` rows j .. j + kr, keys j .. j + kr are entries of the block
                unsafe {
                    let (qp, sp) = (qt.as_ptr().add(rv), st.as_mut_ptr().add(j * rp + rv));
                    let ks = &kv_rows[j..j + kr];
                    let sc = task.scale;
                    match kr {
                        8 => qk_tile::<L, 8>(ks, qp, rp, d, sc, sp),
                        7 => qk_tile::<L, 7>(ks, qp, rp, d, sc, sp),
                        6 => qk_tile::<L, 6>(ks, qp, rp, d, sc, sp),
                        5 => qk_tile::<L, 5>(ks, qp, rp, d, sc, sp),
                        4 => qk_tile::<L, 4>(ks, qp, rp, d, sc, sp),
                        3 => qk_tile::<L, 3>(ks, qp, rp, d, sc, sp),
                        2 => qk_tile::<L, 2>(ks, qp, rp, d, sc, sp),
                        _ => qk_tile::<L, 1>(ks, qp, rp, d, sc, sp),
                    }
                }
                j += kr;
            }
        }
        // past a row's causal limit: -inf, then 0 once exponentiated (keys the rows of
        // vector rv0 do not see hold stale values up to the same bound)
        let mask = |st: &mut [f32], x: f32| {
            for jj in 0..width {
                let f = first(k0 + jj);
                if f > rv0 {
                    st[jj * rp + rv0..jj * rp + f].fill(x);
                }
            }
        };
        mask(&mut st, f32::NEG_INFINITY);
        // online softmax with the rows in the lanes
        let cols = rv0..rp;
        mn[cols.clone()].copy_from_slice(&m[cols.clone()]);
        for jj in 0..width {
            let srow = &st[jj * rp..(jj + 1) * rp];
            for (x, &y) in mn[cols.clone()].iter_mut().zip(&srow[cols.clone()]) {
                *x = if y > *x { y } else { *x };
            }
        }
        for ((a, &mo), &mx) in alpha[cols.clone()]
            .iter_mut()
            .zip(&m[cols.clone()])
            .zip(&mn[cols.clone()])
        {
            // e^-inf is about 1e-38 by `exp_approx`: a row's first block has l = 0 and o = 0
            *a = exp_approx(mo - mx);
        }
        for jj in 0..width {
            let srow = &mut st[jj * rp..(jj + 1) * rp];
            for (x, &mx) in srow[cols.clone()].iter_mut().zip(&mn[cols.clone()]) {
                *x = exp_approx(*x - mx);
            }
        }
        mask(&mut st, 0.0);
        for (la, &a) in l[cols.clone()].iter_mut().zip(&alpha[cols.clone()]) {
            *la *= a;
        }
        for jj in 0..width {
            let srow = &st[jj * rp..(jj + 1) * rp];
            for (la, &p) in l[cols.clone()].iter_mut().zip(&srow[cols.clone()]) {
                *la += p;
            }
        }
        m[cols.clone()].copy_from_slice(&mn[cols.clone()]);
        for r in r0..rows {
            let a = alpha[r];
            if a != 1.0 {
                for x in &mut out[r * d..(r + 1) * d] {
                    *x *= a;
                }
            }
        }
        // o += p v over the block's value rows (the same list, now of values)
        kv_rows.clear();
        kv_rows.extend((k0..k1).map(|p| task.v.row_at(task.b, task.h, p)));
        let mut r = r0;
        while r < rows {
            let rr = L::PV_ROWS.min(rows - r);
            // value rows up to the last one the group's last row sees
            let vr = &kv_rows[..limit(r + rr - 1).min(k1) - k0];
            for c in (0..d).step_by(L::PV_SEG * w) {
                // SAFETY: as this function's; rows r .. r + rr of `st` (columns) and `out`,
                // values c .. c + PV_SEG LANES of each row
                unsafe {
                    let (pr, or) = (st.as_ptr().add(r), out.as_mut_ptr().add(r * d + c));
                    match rr {
                        6 => pv_tile::<L, 6>(pr, rp, vr, c, or, d),
                        5 => pv_tile::<L, 5>(pr, rp, vr, c, or, d),
                        4 => pv_tile::<L, 4>(pr, rp, vr, c, or, d),
                        3 => pv_tile::<L, 3>(pr, rp, vr, c, or, d),
                        2 => pv_tile::<L, 2>(pr, rp, vr, c, or, d),
                        _ => pv_tile::<L, 1>(pr, rp, vr, c, or, d),
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

/// `s[j][r] = scale * sum_c k_j[c] qt[c][r]` for `R` keys and `2 LANES` rows: `R x 2` vector
/// accumulators, one broadcast of a key value and two loads of transposed queries per `c`.
///
/// # Safety
/// `L`'s instruction set; `k` holds `R` rows of at least `d` values, `qt` `d` rows of stride
/// `rs` with `2 LANES` values each, `s` `R` rows of stride `rs` with `2 LANES` values each.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the tiles run on x86-64 only
#[inline(always)]
unsafe fn qk_tile<L: Lanes, const R: usize>(
    k: &[&[f32]],
    qt: *const f32,
    rs: usize,
    d: usize,
    scale: f32,
    s: *mut f32,
) {
    let w = L::LANES;
    let kp: [*const f32; R] = std::array::from_fn(|j| k[j].as_ptr());
    // SAFETY: as this function's
    unsafe {
        let mut acc = [[L::splat(0.0); 2]; R];
        for c in 0..d {
            let q0 = L::load(qt.add(c * rs));
            let q1 = L::load(qt.add(c * rs + w));
            for (j, a) in acc.iter_mut().enumerate() {
                let kb = L::splat(*kp[j].add(c));
                a[0] = L::fma(kb, q0, a[0]);
                a[1] = L::fma(kb, q1, a[1]);
            }
        }
        // `a * scale + 0`: the product rounded once, as a multiply
        let (sc, zero) = (L::splat(scale), L::splat(0.0));
        for (j, a) in acc.iter().enumerate() {
            L::store(s.add(j * rs), L::fma(a[0], sc, zero));
            L::store(s.add(j * rs + w), L::fma(a[1], sc, zero));
        }
    }
}

/// `o[r][c .. c + S LANES] += sum_j p[r][j] v_j[c ..]` for `R` rows over the block's value rows
/// `v` (`S` = [`Lanes::PV_SEG`]), the segment in `R x S` vector accumulators.
///
/// # Safety
/// `L`'s instruction set; `p` holds `v.len()` rows of stride `ps` with `R` values each (the
/// scores transposed: `p[j ps + r]`), each `v_j` at least `c + S LANES` values, `o` `R` rows of
/// stride `d` from value `c`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the tiles run on x86-64 only
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
    let w = L::LANES;
    // SAFETY: as this function's
    unsafe {
        let mut acc = [[L::splat(0.0); S]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            for (t, x) in a.iter_mut().enumerate() {
                *x = L::load(o.add(r * d + t * w));
            }
        }
        for (j, vj) in v.iter().enumerate() {
            let vp = vj.as_ptr().add(c);
            let mut vv = [L::splat(0.0); S];
            for (t, x) in vv.iter_mut().enumerate() {
                *x = L::load(vp.add(t * w));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let pb = L::splat(*p.add(j * ps + r));
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

#[cfg(test)]
mod tests {
    use super::tokens_per_task;

    #[test]
    fn tasks_pad_few_rows() {
        // (group, tokens): 96 rows for 6, 8, 12 heads a KV head; 126 of 128 for 7
        for (g, t) in [(1, 96), (6, 16), (7, 18), (8, 12), (12, 8), (16, 6)] {
            assert_eq!(tokens_per_task(g), t, "group {g}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes;
    pub(super) use crate::cpu_skinny::x86::{Avx2, Avx512};

    // 16 + 2 + 1 and 24 + 4 + 1 of 32 registers
    impl Lanes for Avx512 {
        const QK_KEYS: usize = 8;
        const PV_ROWS: usize = 6;
    }

    // 12 + 2 + 1 and 8 + 4 + 1 of 16 registers
    impl Lanes for Avx2 {
        const QK_KEYS: usize = 6;
        const PV_ROWS: usize = 2;
    }
}
