//! Head-subset score reduction and Quest page bounds and scores.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::prelude::*;

/// Positions of the score reduction one thread takes, 256 apart.
pub const SCORE_POS_PER_THREAD: usize = 4;
/// Positions of one block of [`score_reduce_kernel`]: 256 threads times
/// [`SCORE_POS_PER_THREAD`].
pub const SCORE_BLOCK_POSITIONS: usize = 256 * SCORE_POS_PER_THREAD;

/// Scores from the per-row-group probability mass of `flash_kernel`'s mass pass
/// (`SCORE_MASS`, `part` `[b, slots, groups, lmax]`, a group 16 rows): per (sequence, KV
/// head, position) the sum over the slot's groups that hold rows (`16 g < heads x n_new`), 0 past the
/// sequence's `ctx + n_new` and for a KV head without a slot. One block of
/// [`SCORE_BLOCK_POSITIONS`] positions (256 threads, [`SCORE_POS_PER_THREAD`] positions each,
/// 256 apart) per (block, KV head, sequence); `out` is `[b, kv_heads, width]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn mass_sum_kernel<I: Int>(
    part: &Tensor<f32>,
    table: &Tensor<I>,
    kv2slot: &Tensor<I>,
    ctx: &Tensor<I>,
    out: &mut Tensor<f32>,
    n_new: u32,
    groups: u32,
    slots: u32,
    lmax: u32,
    width: u32,
    #[define(I)] _dtype: StorageType,
) {
    let kvh = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tid = UNIT_POS as usize;
    let pos = CUBE_POS_X as usize * SCORE_BLOCK_POSITIONS + tid;
    let n = n_new as usize;
    let slot_i = i32::cast_from(kv2slot[kvh]);
    let mut blocks = 0usize;
    let mut slot = 0usize;
    if slot_i >= 0 {
        slot = usize::cast_from(slot_i);
        let rtot = u32::cast_from(table[slot * table.stride(0) + 1]) as usize * n;
        blocks = (rtot + 15) / 16;
    }
    let keys = u32::cast_from(ctx[b]) as usize + n;
    let lmax = lmax as usize;
    let pb = (b * slots as usize + slot) * groups as usize * lmax;
    let ob = b * out.stride(0) + kvh * out.stride(1);
    #[unroll]
    for u in 0..SCORE_POS_PER_THREAD {
        let p = pos + u * 256;
        if p < width as usize {
            let mut acc = 0.0f32;
            if p < keys {
                for gi in 0..blocks {
                    acc += part[pb + gi * lmax + p];
                }
            }
            out[ob + p] = acc;
        }
    }
}

/// Scores from the logits the split or flash kernel wrote in `score` mode: per (sequence, KV head,
/// position) `sum over the slot's rows of exp(logit - M_r) / L_r`, with `(M_r, L_r)` merged
/// from the splits; with `per_row`, one sum per query `i` (rows `e * n + i`) into
/// `out[b, kvh, i, pos]`. One block of [`SCORE_BLOCK_POSITIONS`] positions (256 threads, 8
/// warps, [`SCORE_POS_PER_THREAD`] positions each, 256 apart) per (block, KV head,
/// sequence).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn score_reduce_kernel<I: Int>(
    pm: &Tensor<f32>,
    pl: &Tensor<f32>,
    logits: &Tensor<f32>,
    table: &Tensor<I>,
    kv2slot: &Tensor<I>,
    ctx: &Tensor<I>,
    out: &mut Tensor<f32>,
    n_new: u32,
    splits: u32,
    rpad: u32,
    slots: u32,
    lmax: u32,
    width: u32,
    #[comptime] rmax: usize,
    #[comptime] per_row: bool,
    #[define(I)] _dtype: StorageType,
) {
    let kvh = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tid = UNIT_POS as usize;
    let pos = CUBE_POS_X as usize * SCORE_BLOCK_POSITIONS + tid;
    let n = n_new as usize;
    let rpad = rpad as usize;
    let slot_i = i32::cast_from(kv2slot[kvh]);
    let mut mrow = SharedMemory::<f32>::new(rmax);
    let mut lrow = SharedMemory::<f32>::new(rmax);
    let mut rtot = 0usize;
    let mut slot = 0usize;
    if slot_i >= 0 {
        slot = usize::cast_from(slot_i);
        rtot = u32::cast_from(table[slot * table.stride(0) + 1]) as usize * n;
    }
    // (M_r, L_r) of each row, a warp per row: each lane loads the maxima and sums of 4
    // splits 32 apart at once (128 splits a round), then an online merge across the warp
    // (a first version merged each row's splits serially in one thread: 31 us of GPU time
    // for 65 splits at 7B, B=8, 32k, ncu, docs/perf/kernel-gpu-time-2026-11-30/)
    let warp = tid / 32;
    let lane = tid % 32;
    let ns = splits as usize;
    let lowest = f32::new(f32::MIN);
    let mut r = warp;
    while r < rtot {
        let base = (b * slots as usize + slot) * ns * rpad + r;
        let mut mmax = lowest;
        let mut lsum = 0.0f32;
        let mut s0 = 0usize;
        while s0 < ns {
            let mut ms = Array::<f32>::new(4usize);
            let mut ls = Array::<f32>::new(4usize);
            #[unroll]
            for u in 0..4usize {
                let sp = s0 + lane + u * 32;
                let ok = sp < ns;
                let at = base + select(ok, sp, 0usize) * rpad;
                ms[u] = select(ok, pm[at], lowest);
                ls[u] = pl[at];
            }
            let mut cm = lowest;
            #[unroll]
            for u in 0..4usize {
                cm = select(ms[u] > cm, ms[u], cm);
            }
            cm = plane_max(cm);
            let nm = select(cm > mmax, cm, mmax);
            let mut add = 0.0f32;
            #[unroll]
            for u in 0..4usize {
                add += select(ms[u] > lowest, ls[u] * (ms[u] - nm).exp(), 0.0f32);
            }
            add = plane_sum(add);
            // the running sum was relative to mmax; 0 while no split had a visible key
            lsum = select(mmax > lowest, lsum * (mmax - nm).exp(), 0.0f32) + add;
            mmax = nm;
            s0 += 128;
        }
        if lane == 0 {
            mrow[r] = mmax;
            lrow[r] = lsum;
        }
        r += 8;
    }
    sync_cube();
    let lmax = lmax as usize;
    // positions lmax .. width (the output is as wide as the keys tensor) are past every
    // sequence's keys (keys <= lmax), so they get 0 and no logit is read there
    {
        let keys = u32::cast_from(ctx[b]) as usize + n;
        let lbase = (b * slots as usize + slot) * rpad * lmax;
        let ob = b * out.stride(0) + kvh * out.stride(1) + pos;
        if per_row {
            let hcount = rtot / n;
            #[unroll]
            for u in 0..SCORE_POS_PER_THREAD {
                let p = pos + u * 256;
                if p < width as usize {
                    for i in 0..n {
                        let mut acc = 0.0f32;
                        if p < keys {
                            for e in 0..hcount {
                                let r = e * n + i;
                                let s = logits[lbase + r * lmax + p];
                                acc += select(s > lowest, (s - mrow[r]).exp() / lrow[r], 0.0f32);
                            }
                        }
                        out[ob + u * 256 + i * out.stride(2)] = acc;
                    }
                }
            }
        } else {
            // SCORE_POS_PER_THREAD positions 256 apart, four rows at a time: 16 independent
            // loads in flight (indices clamped to a valid logit and the result dropped past
            // `keys`, so no branch stands between them)
            let mut acc = Array::<f32>::new(SCORE_POS_PER_THREAD);
            let mut pc = Array::<usize>::new(SCORE_POS_PER_THREAD);
            #[unroll]
            for u in 0..SCORE_POS_PER_THREAD {
                acc[u] = 0.0f32;
                let p = pos + u * 256;
                pc[u] = select(p < keys, p, 0usize);
            }
            let mut r = 0usize;
            while r < rtot {
                let mut sv = Array::<f32>::new(comptime![4 * SCORE_POS_PER_THREAD]);
                #[unroll]
                for q in 0..4usize {
                    let rr = select(r + q < rtot, r + q, r);
                    #[unroll]
                    for u in 0..SCORE_POS_PER_THREAD {
                        sv[q * SCORE_POS_PER_THREAD + u] = logits[lbase + rr * lmax + pc[u]];
                    }
                }
                #[unroll]
                for q in 0..4usize {
                    if r + q < rtot {
                        let mr = mrow[r + q];
                        let il = 1.0f32 / lrow[r + q];
                        #[unroll]
                        for u in 0..SCORE_POS_PER_THREAD {
                            let x = sv[q * SCORE_POS_PER_THREAD + u];
                            acc[u] += select(x > lowest, (x - mr).exp() * il, 0.0f32);
                        }
                    }
                }
                r += 4;
            }
            #[unroll]
            for u in 0..SCORE_POS_PER_THREAD {
                let p = pos + u * 256;
                if p < width as usize {
                    out[ob + u * 256] = select(p < keys, acc[u], 0.0f32);
                }
            }
        }
    }
}

/// Quest page bounds: one block per (page, KV head, sequence), thread `c` = column `c`
/// (and `c + blockDim`, ...): min and max of the keys `page * page_size ..` below `ctx[b]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn page_bounds_kernel<F: Float, I: Int>(
    k: &Tensor<F>,
    ctx: &Tensor<I>,
    kmin: &mut Tensor<F>,
    kmax: &mut Tensor<F>,
    page_size: u32,
    #[comptime] d: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let page = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let ctx_b = u32::cast_from(ctx[b]) as usize;
    let start = page * page_size as usize;
    let mut end = start + page_size as usize;
    if end > ctx_b {
        end = ctx_b;
    }
    let mut c = UNIT_POS as usize;
    while c < d {
        let mut mn = F::new(0.0);
        let mut mx = F::new(0.0);
        if start < ctx_b {
            let base = b * k.stride(0) + h * k.stride(1) + c * k.stride(3);
            mn = k[base + start * k.stride(2)];
            mx = mn;
            for t in start + 1..end {
                let x = k[base + t * k.stride(2)];
                if x < mn {
                    mn = x;
                }
                if x > mx {
                    mx = x;
                }
            }
        }
        let o =
            b * kmin.stride(0) + h * kmin.stride(1) + page * kmin.stride(2) + c * kmin.stride(3);
        kmin[o] = mn;
        kmax[o] = mx;
        c += CUBE_DIM_X as usize;
    }
}

/// Pages of one block of [`page_scores_kernel`]: one a thread.
pub const PAGE_BLOCK: usize = 128;
/// Columns of the page bounds a block of [`page_scores_kernel`] holds in shared memory at a
/// time.
pub const PAGE_COLS: usize = 16;
/// Shared memory of [`page_scores_kernel`] besides its query rows: both bounds of
/// [`PAGE_BLOCK`] pages x [`PAGE_COLS`] columns, f32, each page's row padded by one.
pub const PAGE_TILE_BYTES: usize = 2 * PAGE_BLOCK * (PAGE_COLS + 1) * 4;

/// Quest page scores: one thread per page (blocks of [`PAGE_BLOCK`]), `max over rows of
/// sum_c q_c * (q_c >= 0 ? mx_c : mn_c)` (= `sum_c max(q_c mn_c, q_c mx_c)`, as `mn_c <=
/// mx_c`) with the group's `rows = group * n_new` query rows staged in shared memory (f32)
/// and one register sum per row. The block stages its pages' bounds [`PAGE_COLS`] columns at
/// a time, read from global memory by consecutive threads along a page's columns, each page's
/// row padded by one float so that the threads' reads (one page each) fall in distinct banks.
/// A thread per page reading its bounds straight from global memory (every load of a warp
/// then touches 32 rows `d` elements apart, once per query row) took 4.6 ms a call at the
/// Qwen2.5-1.5B's shapes, 32k, B=16 (ncu, H100).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn page_scores_kernel<F: Float, I: Int>(
    q: &Tensor<F>,
    kmin: &Tensor<F>,
    kmax: &Tensor<F>,
    ctx: &Tensor<I>,
    out: &mut Tensor<f32>,
    page_size: u32,
    pages: u32,
    #[comptime] group: usize,
    #[comptime] n_new: usize,
    #[comptime] d: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tid = UNIT_POS as usize;
    let first = CUBE_POS_X as usize * PAGE_BLOCK;
    let page = first + tid;
    let rows = comptime![group * n_new];
    let width = comptime![PAGE_COLS + 1];
    let mut qs = SharedMemory::<f32>::new(rows * d);
    let mut lo = SharedMemory::<f32>::new(comptime![PAGE_BLOCK * (PAGE_COLS + 1)]);
    let mut hi = SharedMemory::<f32>::new(comptime![PAGE_BLOCK * (PAGE_COLS + 1)]);
    let mut e = tid;
    while e < rows * d {
        let r = e / d;
        let c = e % d;
        let head = h * group + r / n_new;
        let i = r % n_new;
        qs[e] = f32::cast_from(
            q[b * q.stride(0) + head * q.stride(1) + i * q.stride(2) + c * q.stride(3)],
        );
        e += PAGE_BLOCK;
    }
    let mut acc = Array::<f32>::new(rows);
    #[unroll]
    for r in 0..rows {
        acc[r] = 0.0f32;
    }
    let lbase = b * kmin.stride(0) + h * kmin.stride(1);
    let hbase = b * kmax.stride(0) + h * kmax.stride(1);
    let mut c0 = 0usize;
    while c0 < d {
        // the previous columns are read (and, the first time, the query rows written)
        sync_cube();
        let mut e = tid;
        while e < comptime![PAGE_BLOCK * PAGE_COLS] {
            let pg = e / PAGE_COLS;
            let c = c0 + e % PAGE_COLS;
            let ok = first + pg < pages as usize && c < d;
            let gp = select(ok, first + pg, 0usize);
            let gc = select(ok, c, 0usize);
            let mn = f32::cast_from(kmin[lbase + gp * kmin.stride(2) + gc * kmin.stride(3)]);
            let mx = f32::cast_from(kmax[hbase + gp * kmax.stride(2) + gc * kmax.stride(3)]);
            lo[pg * width + e % PAGE_COLS] = select(ok, mn, 0.0f32);
            hi[pg * width + e % PAGE_COLS] = select(ok, mx, 0.0f32);
            e += PAGE_BLOCK;
        }
        sync_cube();
        #[unroll]
        for c in 0..PAGE_COLS {
            let l = lo[tid * width + c];
            let u = hi[tid * width + c];
            // past `d` the bounds are 0: any query column gives 0
            let qc = select(c0 + c < d, c0 + c, 0usize);
            #[unroll]
            for r in 0..rows {
                let qv = qs[r * d + qc];
                acc[r] += qv * select(qv >= 0.0f32, u, l);
            }
        }
        c0 += PAGE_COLS;
    }
    if page < pages as usize {
        let ctx_b = u32::cast_from(ctx[b]) as usize;
        let mut best = 0.0f32;
        if page * (page_size as usize) < ctx_b {
            best = acc[0];
            #[unroll]
            for r in 1..rows {
                best = select(acc[r] > best, acc[r], best);
            }
        }
        out[b * out.stride(0) + h * out.stride(1) + page] = best;
    }
}
