//! The CubeCL kernels. Shapes and formulas are documented on the launchers in
//! [`super`]; this file holds the device code only.
//!
//! Block layout of the split kernel (flash-decoding, one block per (split, row block, slot,
//! sequence), 128 threads = 4 warps): a tile of 64 keys (and values) is staged in shared
//! memory; warp `w` computes the scores of keys `16w .. 16w + 16` for all the block's rows on
//! tensor cores; then four threads per row run its online softmax over the tile (16 keys
//! each, two quad shuffles per reduction, 32 rows per pass); `P V` accumulates in WMMA
//! fragments, warp `w` owning output columns `d/4 * w ..`. A block stops at the last key
//! any of its rows can see (causal among the new tokens), which is what makes the kernel
//! serve prefill chunks too.
//! The running maximum of a row is only moved when a tile's maximum exceeds it by more than
//! [`RESCALE_SLACK`] (so the accumulators are rescaled rarely; `exp(s - m)` stays below
//! `e^8` and the final normalisation is exact). Masked logits and empty maxima are `f32::MIN`
//! (CubeCL's C++ output has no spelling for an infinite constant).

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::cmma::{self, MatrixIdent, MatrixLayout};
use cubecl::prelude::barrier::{copy_async, Barrier};
use cubecl::prelude::*;

/// Keys per tile.
pub const TILE: usize = 64;
/// Threads per block of the split kernel.
pub const THREADS: usize = 128;
/// A row's reference maximum moves only when a tile's maximum exceeds it by this much
/// (natural-log units).
pub const RESCALE_SLACK: f32 = 8.0;
/// One block of the flash-decoding split: partial `(max, sum, acc)` of its rows over the keys
/// `split * chunk .. (split + 1) * chunk` of its (sequence, slot); `score` mode writes the
/// scaled logits instead of `P V`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn split_kernel<F: Float, I: Int, N: Size>(
    q: &Tensor<F>,
    k: &Tensor<Vector<F, N>>,
    v: &Tensor<Vector<F, N>>,
    ctx: &Tensor<I>,
    table: &Tensor<I>,
    idx: &Tensor<I>,
    counts: &Tensor<I>,
    pm: &mut Tensor<f32>,
    pl: &mut Tensor<f32>,
    pacc: &mut Tensor<f32>,
    logits: &mut Tensor<f32>,
    scale: f32,
    n_new: u32,
    chunk: u32,
    splits: u32,
    rowblocks: u32,
    slots: u32,
    lmax: u32,
    #[comptime] mt: usize,
    #[comptime] d: usize,
    #[comptime] nv: usize,
    #[comptime] sparse: bool,
    #[comptime] score: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let tid = UNIT_POS as usize;
    let warp = tid / 32;
    let lane = tid % 32;
    let rowblocks = rowblocks as usize;
    let rb = CUBE_POS_X as usize % rowblocks;
    let split = CUBE_POS_X as usize / rowblocks;
    let slot = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let rows = comptime![16 * mt];
    let sq = comptime![d + 8];
    let sst = comptime![TILE + 4];
    let pst = comptime![TILE + 8];
    let cpw = comptime![d / 64];
    let vsize = comptime![if score { 16usize } else { TILE * (d + 8) }];
    let psize = comptime![if score { 16usize } else { 16 * mt * (TILE + 8) }];
    let n = n_new as usize;
    let lowest = f32::new(f32::MIN);

    let tstride = table.stride(0);
    let kvh = u32::cast_from(table[slot * tstride]) as usize;
    let hcount = u32::cast_from(table[slot * tstride + 1]) as usize;
    let rtot = hcount * n;
    let ctx_b = u32::cast_from(ctx[b]) as usize;
    let mut cnt = 0usize;
    if sparse {
        cnt = u32::cast_from(counts[b]) as usize;
    }
    let total = if sparse { cnt + n } else { ctx_b + n };
    let start = split * chunk as usize;
    let mut end = start + chunk as usize;
    if end > total {
        end = total;
    }
    // causal early stop: key `base + j` (a new token) is visible from query `i` only for
    // `j <= i`, so the keys past `base + imax` are masked for every row of this block (the
    // block's rows are one head's consecutive queries, or they span a head boundary and
    // imax is n - 1). Score mode writes a logit for every key and keeps the whole range.
    if comptime![!score] {
        let r0 = rb * rows;
        let mut imax = n - 1;
        if r0 < rtot {
            let mut rl = r0 + rows;
            if rl > rtot {
                rl = rtot;
            }
            rl -= 1;
            if r0 / n == rl / n {
                imax = rl % n;
            }
        }
        let lim = total - n + imax + 1;
        if end > lim {
            end = lim;
        }
    }

    let mut qs = SharedMemory::<F>::new_aligned(rows * sq, 32usize);
    let mut ks = SharedMemory::<F>::new_aligned(TILE * sq, 32usize);
    let mut vs = SharedMemory::<F>::new_aligned(vsize, 32usize);
    let mut ss = SharedMemory::<f32>::new_aligned(rows * sst, 32usize);
    let mut ps = SharedMemory::<F>::new_aligned(psize, 32usize);
    let mut stage = SharedMemory::<f32>::new_aligned(1024usize, 32usize);
    let mut mref = SharedMemory::<f32>::new(rows);
    let mut lsum = SharedMemory::<f32>::new(rows);
    let mut alpha = SharedMemory::<f32>::new(rows);
    let mut kpos = SharedMemory::<u32>::new(TILE);
    let mut kneed = SharedMemory::<u32>::new(TILE);
    let mut flag = SharedMemory::<u32>::new(1usize);

    // queries of the block's rows: row rg = e * n + i is head table[2 + e], query i
    let mut e = tid;
    while e < rows * d {
        let r = e / d;
        let c = e % d;
        let rg = rb * rows + r;
        let mut val = F::new(0.0);
        if rg < rtot {
            let h = u32::cast_from(table[slot * tstride + 2 + rg / n]) as usize;
            let i = rg % n;
            val = q[b * q.stride(0) + h * q.stride(1) + i * q.stride(2) + c * q.stride(3)];
        }
        qs[r * sq + c] = val;
        e += THREADS;
    }
    if tid < rows {
        mref[tid] = lowest;
        lsum[tid] = 0.0;
        alpha[tid] = 1.0;
    }
    if tid == 0 {
        flag[0usize] = 0;
    }

    let mut oacc = Sequence::<cmma::Matrix<f32>>::new();
    if comptime![!score] {
        #[unroll]
        for _ in 0..mt * cpw {
            oacc.push(cmma::Matrix::<f32>::from_value(
                MatrixIdent::Accumulator,
                16usize,
                16usize,
                16usize,
                MatrixLayout::Undefined,
                0.0,
            ));
        }
    }

    let kb = b * k.stride(0) + kvh * k.stride(1);
    let vb = b * v.stride(0) + kvh * v.stride(1);
    let vpr = comptime![d / nv];
    let mut t0 = start;
    while t0 < end {
        // which cache slot each key of the tile reads, and from which query row it is visible
        if tid < TILE {
            let j = t0 + tid;
            let mut p = 0u32;
            let mut need = 1073741824u32;
            if j < end {
                if sparse {
                    if j < cnt {
                        let ix = i32::cast_from(
                            idx[b * idx.stride(0) + kvh * idx.stride(1) + j * idx.stride(2)],
                        );
                        if ix >= 0 && usize::cast_from(ix) < ctx_b {
                            p = u32::cast_from(ix);
                            need = 0;
                        }
                    } else {
                        p = (ctx_b + j - cnt) as u32;
                        need = (j - cnt) as u32;
                    }
                } else {
                    p = j as u32;
                    if j >= ctx_b {
                        need = (j - ctx_b) as u32;
                    } else {
                        need = 0;
                    }
                }
            }
            kpos[tid] = p;
            kneed[tid] = need;
        }
        sync_cube();

        // stage K (and V): invisible slots read position 0 (finite) and are masked below
        let iters = comptime![TILE * d / (nv * THREADS)];
        let mut kreg = Array::<Vector<F, N>>::new(iters);
        #[unroll]
        for it in 0..iters {
            let e = tid + it * THREADS;
            let t = e / vpr;
            let c = e % vpr;
            let p = kpos[t] as usize;
            kreg[it] = k[(kb + p * k.stride(2)) / nv + c];
        }
        if comptime![!score] {
            let mut vreg = Array::<Vector<F, N>>::new(iters);
            #[unroll]
            for it in 0..iters {
                let e = tid + it * THREADS;
                let t = e / vpr;
                let c = e % vpr;
                let p = kpos[t] as usize;
                vreg[it] = v[(vb + p * v.stride(2)) / nv + c];
            }
            #[unroll]
            for it in 0..iters {
                let e = tid + it * THREADS;
                let t = e / vpr;
                let c = e % vpr;
                let vv = vreg[it];
                #[unroll]
                for jj in 0..nv {
                    vs[t * sq + c * nv + jj] = vv[jj];
                }
            }
        }
        #[unroll]
        for it in 0..iters {
            let e = tid + it * THREADS;
            let t = e / vpr;
            let c = e % vpr;
            let kv = kreg[it];
            #[unroll]
            for jj in 0..nv {
                ks[t * sq + c * nv + jj] = kv[jj];
            }
        }
        sync_cube();

        // S = Q K^T for keys 16 warp .. 16 warp + 16
        let mut sacc = Sequence::<cmma::Matrix<f32>>::new();
        #[unroll]
        for _ in 0..mt {
            sacc.push(cmma::Matrix::<f32>::from_value(
                MatrixIdent::Accumulator,
                16usize,
                16usize,
                16usize,
                MatrixLayout::Undefined,
                0.0,
            ));
        }
        #[unroll]
        for kk in 0..comptime![d / 16] {
            let kst = warp * 16 * sq + kk * 16;
            let bm = cmma::Matrix::<F>::from_slice(
                MatrixIdent::B,
                16usize,
                16usize,
                16usize,
                MatrixLayout::ColMajor,
                &ks.slice(kst, kst + 15 * sq + 16),
                sq as u32,
            );
            #[unroll]
            for m in 0..mt {
                let qst = m * 16 * sq + kk * 16;
                let am = cmma::Matrix::<F>::from_slice(
                    MatrixIdent::A,
                    16usize,
                    16usize,
                    16usize,
                    MatrixLayout::RowMajor,
                    &qs.slice(qst, qst + 15 * sq + 16),
                    sq as u32,
                );
                let acc = sacc.index(m);
                cmma::execute::<F, F, f32, f32>(&am, &bm, acc, acc);
            }
        }
        #[unroll]
        for m in 0..mt {
            let o = m * 16 * sst + warp * 16;
            cmma::store(
                &mut ss.slice_mut(o, o + 15 * sst + 16),
                sacc.index(m),
                sst as u32,
                MatrixLayout::RowMajor,
            );
        }
        sync_cube();

        // online softmax, four threads per row (quad member `quad` takes keys quad, quad + 4,
        // ..., quad + 60: the shared-memory reads of a warp hit 32 distinct banks), 32 rows
        // per pass; every thread runs every pass, so the quad shuffles stay converged
        let quad = tid % 4;
        #[unroll]
        for pass in 0..comptime![rows.div_ceil(32)] {
            let rr = pass * 32 + tid / 4;
            let active = rr < rows;
            let rg = rb * rows + rr;
            let i = (rg % n) as u32;
            let rvalid = active && rg < rtot;
            let lrow = ((b * slots as usize + slot) * rowblocks * rows + rg) * lmax as usize;
            let mut sv = Array::<f32>::new(16usize);
            let mut tm = lowest;
            #[unroll]
            for jj in 0..16usize {
                let key = jj * 4 + quad;
                let mut s = lowest;
                if rvalid {
                    if kneed[key] <= i {
                        s = ss[rr * sst + key] * scale;
                    }
                    if score {
                        if kneed[key] < 1073741824u32 {
                            logits[lrow + kpos[key] as usize] = s;
                        }
                    }
                }
                sv[jj] = s;
                if s > tm {
                    tm = s;
                }
            }
            let t1 = plane_shuffle_xor(tm, 1u32);
            if t1 > tm {
                tm = t1;
            }
            let t2 = plane_shuffle_xor(tm, 2u32);
            if t2 > tm {
                tm = t2;
            }
            let mut mold = lowest;
            if active {
                mold = mref[rr];
            }
            let mut mnew = mold;
            if tm > mold + RESCALE_SLACK {
                mnew = tm;
            }
            let mut psum = 0.0f32;
            #[unroll]
            for jj in 0..16usize {
                let mut p = 0.0f32;
                if sv[jj] > lowest {
                    p = (sv[jj] - mnew).exp();
                }
                psum += p;
                if comptime![!score] {
                    if active {
                        ps[rr * pst + jj * 4 + quad] = F::cast_from(p);
                    }
                }
            }
            psum += plane_shuffle_xor(psum, 1u32);
            psum += plane_shuffle_xor(psum, 2u32);
            if active && quad == 0 {
                let mut a = 1.0f32;
                if mnew > mold {
                    a = (mold - mnew).exp();
                    if mold > lowest {
                        flag[0usize] = 1;
                    }
                }
                alpha[rr] = a;
                lsum[rr] = lsum[rr] * a + psum;
                mref[rr] = mnew;
            }
        }
        sync_cube();

        if comptime![!score] {
            // rare: a row's reference maximum moved, rescale its accumulators
            if flag[0usize] == 1 {
                let so = warp * 256;
                #[unroll]
                for m in 0..mt {
                    #[unroll]
                    for c in 0..cpw {
                        let acc = oacc.index(m * cpw + c);
                        cmma::store(
                            &mut stage.slice_mut(so, so + 256),
                            acc,
                            16u32,
                            MatrixLayout::RowMajor,
                        );
                        sync_plane();
                        #[unroll]
                        for el in 0..8usize {
                            let x = lane * 8 + el;
                            stage[so + x] = stage[so + x] * alpha[m * 16 + x / 16];
                        }
                        sync_plane();
                        cmma::load_with_layout(
                            acc,
                            &stage.slice(so, so + 256),
                            16u32,
                            MatrixLayout::RowMajor,
                        );
                        sync_plane();
                    }
                }
            }
            // O += P V
            #[unroll]
            for kk in 0..comptime![TILE / 16] {
                #[unroll]
                for c in 0..cpw {
                    let vst = kk * 16 * sq + (warp * cpw + c) * 16;
                    let bm = cmma::Matrix::<F>::from_slice(
                        MatrixIdent::B,
                        16usize,
                        16usize,
                        16usize,
                        MatrixLayout::RowMajor,
                        &vs.slice(vst, vst + 15 * sq + 16),
                        sq as u32,
                    );
                    #[unroll]
                    for m in 0..mt {
                        let pst0 = m * 16 * pst + kk * 16;
                        let am = cmma::Matrix::<F>::from_slice(
                            MatrixIdent::A,
                            16usize,
                            16usize,
                            16usize,
                            MatrixLayout::RowMajor,
                            &ps.slice(pst0, pst0 + 15 * pst + 16),
                            pst as u32,
                        );
                        let acc = oacc.index(m * cpw + c);
                        cmma::execute::<F, F, f32, f32>(&am, &bm, acc, acc);
                    }
                }
            }
        }
        sync_cube();
        if tid == 0 {
            flag[0usize] = 0;
        }
        t0 += TILE;
    }

    // partial results of the block's rows
    let rpad = rowblocks * rows;
    let pbase = ((b * slots as usize + slot) * splits as usize + split) * rpad + rb * rows;
    if tid < rows {
        pm[pbase + tid] = mref[tid];
        pl[pbase + tid] = lsum[tid];
    }
    if comptime![!score] {
        #[unroll]
        for m in 0..mt {
            #[unroll]
            for c in 0..cpw {
                let o = (pbase + m * 16) * d + (warp * cpw + c) * 16;
                cmma::store(
                    &mut pacc.slice_mut(o, o + 15 * d + 16),
                    oacc.index(m * cpw + c),
                    d as u32,
                    MatrixLayout::RowMajor,
                );
            }
        }
    }
}

/// Merges the splits of one query row: `out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)`.
/// One block per (row, slot, sequence), one thread per output column (`d` threads, a
/// multiple of 32). The block's threads read the splits' maxima and sums in parallel
/// (strided by `d`, then a warp and a block reduction), and the weights `e^(m_s - M)` of
/// `d` splits at a time go through shared memory, so each thread's `acc_s` reads are
/// independent loads four at a time rather than a chain of dependent ones (a first version
/// looped over the splits serially in every thread: 12.5 us of GPU time at 7B, B=8, 32k,
/// ncu on the H200, `docs/perf/kernel-gpu-time-2026-11-30/`). A split with no visible key
/// (`m_s` the mask value) or a weight that underflows to 0 adds nothing, and its `acc_s`
/// (possibly never written) is not used.
/// Arguments are arrays, `out` written through its strides `o0 .. o3` (`[b, heads, n, d]`)
/// and `table` rows `tstride` apart: no per-launch upload of tensor metadata.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn combine_kernel<F: Float, I: Int>(
    pm: &Array<f32>,
    pl: &Array<f32>,
    pacc: &Array<f32>,
    table: &Array<I>,
    out: &mut Array<F>,
    tstride: u32,
    o0: u32,
    o1: u32,
    o2: u32,
    o3: u32,
    n_new: u32,
    splits: u32,
    rpad: u32,
    slots: u32,
    #[comptime] d: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let rg = CUBE_POS_X as usize;
    let slot = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let c = UNIT_POS as usize;
    let warp = c / 32;
    let lane = c % 32;
    let n = n_new as usize;
    let ns = splits as usize;
    let lowest = f32::new(f32::MIN);
    let tstride = tstride as usize;
    let hcount = u32::cast_from(table[slot * tstride + 1]) as usize;
    let mut red = SharedMemory::<f32>::new(comptime![d / 32]);
    let mut wsh = SharedMemory::<f32>::new(d);
    // uniform over the block, so the barriers below are reached by all its threads or none
    if rg < hcount * n {
        let rpad = rpad as usize;
        let base = (b * slots as usize + slot) * ns * rpad + rg;
        // M = max over the splits
        let mut mm = lowest;
        let mut s = c;
        while s < ns {
            let m = pm[base + s * rpad];
            if m > mm {
                mm = m;
            }
            s += d;
        }
        mm = plane_max(mm);
        if lane == 0 {
            red[warp] = mm;
        }
        sync_cube();
        let mut mmax = red[0];
        #[unroll]
        for w in 1..comptime![d / 32] {
            let x = red[w];
            if x > mmax {
                mmax = x;
            }
        }
        sync_cube();
        // the weights of d splits at a time; l over the splits, acc over them for column c
        let mut lsum = 0.0f32;
        let mut acc = 0.0f32;
        let mut s0 = 0usize;
        while s0 < ns {
            let sc = s0 + c;
            let mut w = 0.0f32;
            if sc < ns {
                let m = pm[base + sc * rpad];
                if m > lowest {
                    w = (m - mmax).exp();
                    lsum += pl[base + sc * rpad] * w;
                }
            }
            wsh[c] = w;
            sync_cube();
            let mut cnt = ns - s0;
            if cnt > d {
                cnt = d;
            }
            let mut j = 0usize;
            while j + 4 <= cnt {
                let r = base + (s0 + j) * rpad;
                let x0 = pacc[r * d + c];
                let x1 = pacc[(r + rpad) * d + c];
                let x2 = pacc[(r + 2 * rpad) * d + c];
                let x3 = pacc[(r + 3 * rpad) * d + c];
                let w0 = wsh[j];
                let w1 = wsh[j + 1];
                let w2 = wsh[j + 2];
                let w3 = wsh[j + 3];
                acc += select(w0 > 0.0, x0 * w0, 0.0f32);
                acc += select(w1 > 0.0, x1 * w1, 0.0f32);
                acc += select(w2 > 0.0, x2 * w2, 0.0f32);
                acc += select(w3 > 0.0, x3 * w3, 0.0f32);
                j += 4;
            }
            while j < cnt {
                let wj = wsh[j];
                if wj > 0.0 {
                    acc += pacc[(base + (s0 + j) * rpad) * d + c] * wj;
                }
                j += 1;
            }
            sync_cube();
            s0 += d;
        }
        lsum = plane_sum(lsum);
        if lane == 0 {
            red[warp] = lsum;
        }
        sync_cube();
        let mut l = 0.0f32;
        #[unroll]
        for w in 0..comptime![d / 32] {
            l += red[w];
        }
        let h = u32::cast_from(table[slot * tstride + 2 + rg / n]) as usize;
        let i = rg % n;
        out[b * o0 as usize + h * o1 as usize + i * o2 as usize + c * o3 as usize] =
            F::cast_from(acc / l);
    }
}

/// Positions of the score reduction one thread takes, 256 apart.
pub const SCORE_POS_PER_THREAD: usize = 4;
/// Positions of one block of [`score_reduce_kernel`]: 256 threads times
/// [`SCORE_POS_PER_THREAD`].
pub const SCORE_BLOCK_POSITIONS: usize = 256 * SCORE_POS_PER_THREAD;

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

/// Quest page scores: one thread per page, `max over rows of sum_c max(q_c mn_c, q_c mx_c)`
/// with the group's `rows = group * n_new` query rows staged in shared memory (f32).
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
    let page = CUBE_POS_X as usize * 128 + tid;
    let rows = comptime![group * n_new];
    let mut qs = SharedMemory::<f32>::new(rows * d);
    let mut e = tid;
    while e < rows * d {
        let r = e / d;
        let c = e % d;
        let head = h * group + r / n_new;
        let i = r % n_new;
        qs[e] = f32::cast_from(
            q[b * q.stride(0) + head * q.stride(1) + i * q.stride(2) + c * q.stride(3)],
        );
        e += 128usize;
    }
    sync_cube();
    if page < pages as usize {
        let ctx_b = u32::cast_from(ctx[b]) as usize;
        let mut best = 0.0f32;
        if page * (page_size as usize) < ctx_b {
            best = f32::new(f32::MIN);
            let base = b * kmin.stride(0) + h * kmin.stride(1) + page * kmin.stride(2);
            for r in 0..rows {
                let mut s = 0.0f32;
                for c in 0..d {
                    let qv = qs[r * d + c];
                    let lo = qv * f32::cast_from(kmin[base + c * kmin.stride(3)]);
                    let hi = qv * f32::cast_from(kmax[base + c * kmax.stride(3)]);
                    if lo > hi {
                        s += lo;
                    } else {
                        s += hi;
                    }
                }
                if s > best {
                    best = s;
                }
            }
        }
        out[b * out.stride(0) + h * out.stride(1) + page] = best;
    }
}

/// Order-preserving key of a score for the radix select: forced positions highest, NaN as
/// `f32::MIN`, `+-inf` as the extreme finite values.
#[cube]
fn select_key<F: Float>(x: F, forced: bool) -> u32 {
    let mut key = 0xFFFF_FFFFu32;
    if !forced {
        let mut s = f32::cast_from(x);
        let lo = f32::new(f32::MIN);
        let hi = f32::new(f32::MAX);
        if s.is_nan() {
            s = lo;
        }
        if s > hi {
            s = hi;
        }
        if s < lo {
            s = lo;
        }
        if s == f32::new(0.0) {
            // -0 ranks with +0
            s = f32::new(0.0);
        }
        let bits = u32::reinterpret(s);
        if bits >= 0x8000_0000u32 {
            key = 0xFFFF_FFFFu32 - bits;
        } else {
            key = bits | 0x8000_0000u32;
        }
    }
    key
}

/// Threads per block of [`topk_kernel`] (32 warps).
pub const TOPK_THREADS: usize = 1024;
/// Positions each thread of [`topk_kernel`] loads per step of a histogram pass (independent
/// loads in flight).
const TOPK_UNROLL: usize = 4;

/// Block-wide exclusive prefix sum of one `u32` per thread of a [`TOPK_THREADS`]-thread
/// block, and the block's total; `wt` is 32 words of scratch. Every thread must call it.
#[cube]
fn block_exclusive_sum(x: u32, wt: &mut SharedMemory<u32>) -> (u32, u32) {
    let tid = UNIT_POS as usize;
    let (lane, warp) = (tid % 32, tid / 32);
    let ex = plane_exclusive_sum(x);
    if lane == 31 {
        wt[warp] = ex + x;
    }
    sync_cube();
    let mut before = 0u32;
    let mut total = 0u32;
    for w in 0..32usize {
        let t = wt[w];
        if w < warp {
            before += t;
        }
        total += t;
    }
    sync_cube();
    (before + ex, total)
}

/// Top-k per (KV head, sequence): one block of [`TOPK_THREADS`] threads per row.
///
/// `passes` radix passes (8 bits each, from the top) find the k-th largest key `T` and how
/// many keys equal to `T` to take (lowest positions first). 16-bit scores need 3 passes:
/// their keys' low byte follows from the byte above it. Each pass counts into per-warp
/// histograms in shared memory; a warp adds the lanes that share lane 0's bin with one
/// atomic (scores cluster in a few exponents, so most lanes of a warp hit one bin). The bin
/// holding the k-th key comes from a parallel suffix sum over the 256 bins. Then each thread
/// takes a contiguous segment of positions: two block-wide scans give each segment its
/// share of the ties and its output offset, and the kept positions are written ascending;
/// padding slots get 0. `scores` is read through its strides `(ls0, ls1, ls2)` and `out`
/// through `(lo0, lo1, lo2)`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn topk_kernel<F: Float, I: Int>(
    scores: &Array<F>,
    ctx: &Array<I>,
    out: &mut Array<I>,
    ls0: u32,
    ls1: u32,
    ls2: u32,
    lo0: u32,
    lo1: u32,
    lo2: u32,
    budget: u32,
    n_sink: u32,
    window: u32,
    kout: u32,
    #[comptime] passes: u32,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tid = UNIT_POS as usize;
    let lane = tid % 32;
    let warp = tid / 32;
    let nt = TOPK_THREADS;
    let c = u32::cast_from(ctx[b]) as usize;
    let mut kk = budget as usize;
    if c < kk {
        kk = c;
    }
    let sbase = b * ls0 as usize + h * ls1 as usize;
    let s2 = ls2 as usize;
    let mut win_lo = 0usize;
    if c > window as usize {
        win_lo = c - window as usize;
    }
    let nsink = n_sink as usize;

    // per-warp histograms: hist[warp * 256 + bin]
    let hist = SharedMemory::<Atomic<u32>>::new(32usize * 256usize);
    let mut shared = SharedMemory::<u32>::new(4usize);
    let mut wt = SharedMemory::<u32>::new(32usize);

    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut remaining = kk as u32;
    #[unroll]
    for pass in 0..passes {
        let shift = 24 - 8 * pass;
        #[unroll]
        for i in 0..8usize {
            hist[tid + i * nt].store(0u32);
        }
        if tid == 0 {
            // kept when no bin holds the k-th key (k = 0)
            shared[0usize] = prefix;
            shared[1usize] = remaining;
        }
        sync_cube();
        let mut base = 0usize;
        while base < c {
            let mut keys = Array::<u32>::new(TOPK_UNROLL);
            #[unroll]
            for u in 0..TOPK_UNROLL {
                let pos = base + u * nt + tid;
                let mut key = 0u32;
                if pos < c {
                    key = select_key::<F>(scores[sbase + pos * s2], pos < nsink || pos >= win_lo);
                }
                keys[u] = key;
            }
            #[unroll]
            for u in 0..TOPK_UNROLL {
                let pos = base + u * nt + tid;
                let key = keys[u];
                let active = pos < c && (key & mask) == prefix;
                let mut bin = 256u32;
                if active {
                    bin = (key >> shift) & 255u32;
                }
                let lead = plane_broadcast(bin, 0u32);
                let same = active && bin == lead;
                let ones = plane_ballot(same)[0usize].count_ones();
                if lane == 0 && same {
                    hist[warp * 256 + lead as usize].fetch_add(ones);
                }
                if active && !same {
                    hist[warp * 256 + bin as usize].fetch_add(1u32);
                }
            }
            base += TOPK_UNROLL * nt;
        }
        sync_cube();
        // bins in descending order over threads 0..256: thread t holds bin 255 - t
        let mut cnt = 0u32;
        if tid < 256 {
            let bin = 255 - tid;
            for w in 0..32usize {
                cnt += hist[w * 256 + bin].load();
            }
        }
        let incl = plane_inclusive_sum(cnt);
        if lane == 31 && tid < 256 {
            wt[warp] = incl;
        }
        sync_cube();
        if tid < 256 {
            let mut suffix = incl;
            for w in 0..8usize {
                if w < warp {
                    suffix += wt[w];
                }
            }
            // suffix = keys in bins >= this one; the k-th key is in the bin where the
            // count first reaches `remaining`
            if suffix >= remaining && suffix - cnt < remaining {
                shared[0usize] = prefix | ((255 - tid as u32) << shift);
                shared[1usize] = remaining - (suffix - cnt);
            }
        }
        sync_cube();
        prefix = shared[0usize];
        remaining = shared[1usize];
        mask |= 255u32 << shift;
        sync_cube();
    }

    // keys > prefix, and the first `remaining` keys == prefix, in position order, comparing
    // the bits the passes fixed (`mask`; with 16-bit scores the low byte is not among them,
    // and a negative score's key has it 0xFF); thread t owns positions t * seg ..
    // (t + 1) * seg
    let need_eq = remaining;
    let seg = (c + nt - 1) / nt;
    let lo = tid * seg;
    let mut hi = lo + seg;
    if hi > c {
        hi = c;
    }
    if kk == 0 || lo > c {
        // nothing to keep (the passes found no bin)
        hi = lo;
    }
    let mut n_gt = 0u32;
    let mut n_eq = 0u32;
    let mut pos = lo;
    while pos < hi {
        let key = select_key::<F>(scores[sbase + pos * s2], pos < nsink || pos >= win_lo) & mask;
        if key > prefix {
            n_gt += 1;
        }
        if key == prefix {
            n_eq += 1;
        }
        pos += 1;
    }
    let (eq_before, _) = block_exclusive_sum(n_eq, &mut wt);
    let mut eq_take = 0u32;
    if eq_before < need_eq {
        eq_take = need_eq - eq_before;
        if eq_take > n_eq {
            eq_take = n_eq;
        }
    }
    let (mut at, _) = block_exclusive_sum(n_gt + eq_take, &mut wt);
    let obase = b * lo0 as usize + h * lo1 as usize;
    let o2 = lo2 as usize;
    let mut eq_seen = 0u32;
    pos = lo;
    while pos < hi {
        let key = select_key::<F>(scores[sbase + pos * s2], pos < nsink || pos >= win_lo) & mask;
        let mut take = key > prefix;
        if key == prefix {
            take = eq_seen < eq_take;
            eq_seen += 1;
        }
        // `at < kk` holds when the passes are right; the guard keeps a wrong count in its row
        if take && (at as usize) < kk {
            out[obase + at as usize * o2] = I::cast_from(pos);
            at += 1;
        }
        pos += 1;
    }
    let mut j = kk + tid;
    while j < kout as usize {
        out[obase + j * o2] = I::cast_from(0u32);
        j += nt;
    }
}

/// Top-k per (KV head, sequence), the first kernel (`TopkKernel::Block`, the reference):
/// one block of 256 threads per row. A 4-pass radix select (8 bits a pass, one shared
/// histogram) finds the k-th largest key `T` and how many keys equal to `T` to take (lowest
/// positions first); a scan in position order, 256 positions a step with two block barriers
/// each, writes the kept positions ascending; padding slots get 0. Kept beside
/// [`topk_kernel`] (the default since the two were compared end to end on the GPU;
/// docs/perf.md, "GPU kernels: verification attention, scoring, top-k") as the reference for
/// its benchmark and checks.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn topk_block_kernel<F: Float, I: Int>(
    scores: &Tensor<F>,
    ctx: &Tensor<I>,
    out: &mut Tensor<I>,
    budget: u32,
    n_sink: u32,
    window: u32,
    kout: u32,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let tid = UNIT_POS as usize;
    let lane = tid % 32;
    let warp = tid / 32;
    let c = u32::cast_from(ctx[b]) as usize;
    let mut kk = budget as usize;
    if c < kk {
        kk = c;
    }
    let sbase = b * scores.stride(0) + h * scores.stride(1);
    let s2 = scores.stride(2);
    let mut win_lo = 0usize;
    if c > window as usize {
        win_lo = c - window as usize;
    }
    let nsink = n_sink as usize;

    let hist = SharedMemory::<Atomic<u32>>::new(256usize);
    let mut shared = SharedMemory::<u32>::new(4usize);
    let mut wt = SharedMemory::<u32>::new(16usize);

    let mut prefix = 0u32;
    let mut mask = 0u32;
    let mut remaining = kk as u32;
    #[unroll]
    for pass in 0..4u32 {
        let shift = 24 - 8 * pass;
        hist[tid].store(0u32);
        sync_cube();
        let mut pos = tid;
        while pos < c {
            let key = select_key::<F>(scores[sbase + pos * s2], pos < nsink || pos >= win_lo);
            if (key & mask) == prefix {
                hist[((key >> shift) & 255) as usize].fetch_add(1u32);
            }
            pos += 256usize;
        }
        sync_cube();
        if tid == 0 {
            let mut cum = 0u32;
            let mut sel = 0u32;
            let mut found = false;
            let mut bin = 256u32;
            while bin > 0 && !found {
                bin -= 1;
                let cnt = hist[bin as usize].load();
                if cum + cnt >= remaining {
                    sel = bin;
                    found = true;
                } else {
                    cum += cnt;
                }
            }
            shared[0usize] = prefix | (sel << shift);
            shared[1usize] = remaining - cum;
        }
        sync_cube();
        prefix = shared[0usize];
        remaining = shared[1usize];
        mask |= 255u32 << shift;
        sync_cube();
    }

    // keys > prefix, and the first `remaining` keys == prefix, in position order
    let need_eq = remaining;
    let mut carry_sel = 0u32;
    let mut carry_eq = 0u32;
    let obase = b * out.stride(0) + h * out.stride(1);
    let mut base = 0usize;
    while base < c {
        let pos = base + tid;
        let mut key = 0u32;
        let mut valid = false;
        if pos < c {
            key = select_key::<F>(scores[sbase + pos * s2], pos < nsink || pos >= win_lo);
            valid = true;
        }
        let gt = valid && key > prefix;
        let is_eq = valid && key == prefix;
        let eq = u32::cast_from(is_eq);
        let ex = plane_exclusive_sum(eq);
        if lane == 31 {
            wt[warp] = ex + eq;
        }
        sync_cube();
        let mut before = 0u32;
        let mut tot = 0u32;
        for w in 0..8usize {
            let t = wt[w];
            if w < warp {
                before += t;
            }
            tot += t;
        }
        let take = gt || (is_eq && carry_eq + before + ex < need_eq);
        let sel = u32::cast_from(take);
        carry_eq += tot;
        let ex2 = plane_exclusive_sum(sel);
        if lane == 31 {
            wt[warp + 8] = ex2 + sel;
        }
        sync_cube();
        let mut before2 = 0u32;
        let mut tot2 = 0u32;
        for w in 0..8usize {
            let t = wt[w + 8];
            if w < warp {
                before2 += t;
            }
            tot2 += t;
        }
        if take {
            out[obase + (carry_sel + before2 + ex2) as usize * out.stride(2)] = I::cast_from(pos);
        }
        carry_sel += tot2;
        sync_cube();
        base += 256usize;
    }
    let mut j = kk + tid;
    while j < kout as usize {
        out[obase + j * out.stride(2)] = I::cast_from(0u32);
        j += 256usize;
    }
}

/// Threads per block of [`fold_rows_kernel`].
pub const FOLD_THREADS: usize = 256;

/// `dustin`'s history fold, one thread per (position, KV head, sequence):
/// `out[b, h, j] = factor[b] hist[b, h, j] + sum_i w[b, i] (own[h] rows[b, h, i, j] +
/// all[h] sum_h' rows[b, h', i, j])`. `params` packs `factor [batch] | w [batch * n] | own
/// [kv_heads] | all [kv_heads]`; `rows` is read through its strides `lr*`, `hist` through
/// `lh*`; `out` is contiguous f32 `[batch, kv_heads, len]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn fold_rows_kernel<F: Float, H: Float>(
    rows: &Array<F>,
    hist: &Array<H>,
    params: &Array<f32>,
    out: &mut Array<f32>,
    lr0: u32,
    lr1: u32,
    lr2: u32,
    lr3: u32,
    lh0: u32,
    lh1: u32,
    lh2: u32,
    batch: u32,
    n: u32,
    kvh: u32,
    len: u32,
    #[comptime] has_hist: bool,
    #[define(F, H)] _dtypes: [StorageType; 2],
) {
    let p = CUBE_POS_X as usize * FOLD_THREADS + UNIT_POS as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    if p < len as usize {
        let nn = n as usize;
        let wbase = batch as usize;
        let obase = wbase + batch as usize * nn;
        let abase = obase + kvh as usize;
        let own = params[obase + h];
        let all = params[abase + h];
        let rb = b * lr0 as usize + p * lr3 as usize;
        let mut acc = 0.0f32;
        for i in 0..nn {
            let ri = rb + i * lr2 as usize;
            let mut m = own * f32::cast_from(rows[ri + h * lr1 as usize]);
            if all != 0.0f32 {
                let mut tot = 0.0f32;
                for g in 0..kvh as usize {
                    tot += f32::cast_from(rows[ri + g * lr1 as usize]);
                }
                m += all * tot;
            }
            acc += params[wbase + b * nn + i] * m;
        }
        if has_hist {
            let hv = hist[b * lh0 as usize + h * lh1 as usize + p * lh2 as usize];
            acc += params[b] * f32::cast_from(hv);
        }
        out[(b * kvh as usize + h) * len as usize + p] = acc;
    }
}

/// Threads per block of [`mix_scores_kernel`]: 32 warps, so that a row of 32k positions
/// takes 8 steps of the sum pass (with [`MIX_UNROLL`] loads in flight) and 32 of the write
/// pass. With 256 threads and one load at a time (the kernel's first build), a row took 128
/// dependent steps in each pass, and at Qwen2.5-7B, B=8 the kernel had only 32 blocks.
pub const MIX_THREADS: usize = 1024;
/// Positions each thread of [`mix_scores_kernel`] loads per step of its sum pass.
const MIX_UNROLL: usize = 4;

/// Block-wide sum of one `f32` per thread of a [`MIX_THREADS`]-thread block; `ws` is 32
/// words of scratch. Every thread must call it; all get the sum.
#[cube]
fn block_sum(x: f32, ws: &mut SharedMemory<f32>) -> f32 {
    let tid = UNIT_POS as usize;
    let s = plane_sum(x);
    if tid % 32 == 0 {
        ws[tid / 32] = s;
    }
    sync_cube();
    let mut t = 0.0f32;
    for w in 0..MIX_THREADS / 32 {
        t += ws[w];
    }
    sync_cube();
    t
}

/// `dustin`'s normalise-and-mix, one block of [`MIX_THREADS`] per (KV head, row): over the
/// free range `[lo_b, hi_b)` (`free[2b]`, `free[2b + 1]`), `out[b, h, p] = alpha la[b, p] /
/// S_la(b) + (1 - alpha) hist[b, h, p] / S_hist(b, h)` (`hist[b, h, p] / S_hist(b, h)`
/// without a lookahead), 0 elsewhere; sums over the free range, clamped below at 1e-30;
/// columns past an input's width read 0. `out` is contiguous `[rows, kv_heads, width]`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn mix_scores_kernel<H: Float, L: Float, I: Int>(
    hist: &Array<H>,
    la: &Array<L>,
    free: &Array<I>,
    out: &mut Array<H>,
    lh0: u32,
    lh1: u32,
    lh2: u32,
    ll0: u32,
    ll1: u32,
    hist_len: u32,
    la_len: u32,
    kvh: u32,
    width: u32,
    alpha: f32,
    #[comptime] has_la: bool,
    #[define(H, L, I)] _dtypes: [StorageType; 3],
) {
    let h = CUBE_POS_X as usize;
    let b = CUBE_POS_Y as usize;
    let tid = UNIT_POS as usize;
    let nt = MIX_THREADS;
    let mut ws = SharedMemory::<f32>::new(32usize);
    let lo = u32::cast_from(free[2 * b]) as usize;
    let mut hi = u32::cast_from(free[2 * b + 1]) as usize;
    if hi > width as usize {
        hi = width as usize;
    }
    let hb = b * lh0 as usize + h * lh1 as usize;
    let lb = b * ll0 as usize;
    let hl = hist_len as usize;
    let ll = la_len as usize;
    let mut sh = 0.0f32;
    let mut sl = 0.0f32;
    let mut base = lo;
    while base < hi {
        // MIX_UNROLL independent loads of each input, then the adds
        let mut hv = Array::<f32>::new(MIX_UNROLL);
        let mut lv = Array::<f32>::new(MIX_UNROLL);
        #[unroll]
        for u in 0..MIX_UNROLL {
            let p = base + u * nt + tid;
            let mut x = 0.0f32;
            if p < hi && p < hl {
                x = f32::cast_from(hist[hb + p * lh2 as usize]);
            }
            hv[u] = x;
            if has_la {
                let mut y = 0.0f32;
                if p < hi && p < ll {
                    y = f32::cast_from(la[lb + p * ll1 as usize]);
                }
                lv[u] = y;
            }
        }
        #[unroll]
        for u in 0..MIX_UNROLL {
            sh += hv[u];
            if has_la {
                sl += lv[u];
            }
        }
        base += MIX_UNROLL * nt;
    }
    sh = block_sum(sh, &mut ws);
    if sh < 1e-30f32 {
        sh = 1e-30f32;
    }
    if has_la {
        sl = block_sum(sl, &mut ws);
        if sl < 1e-30f32 {
            sl = 1e-30f32;
        }
    }
    let ob = (b * kvh as usize + h) * width as usize;
    let mut p = tid;
    while p < width as usize {
        let mut v = 0.0f32;
        if p >= lo && p < hi {
            let mut hv = 0.0f32;
            if p < hl {
                hv = f32::cast_from(hist[hb + p * lh2 as usize]) / sh;
            }
            if has_la {
                let mut lv = 0.0f32;
                if p < ll {
                    lv = f32::cast_from(la[lb + p * ll1 as usize]) / sl;
                }
                v = alpha * lv + (1.0f32 - alpha) * hv;
            } else {
                v = hv;
            }
        }
        out[ob + p] = H::cast_from(v);
        p += nt;
    }
}

/// Fills a float tensor with `value` (used to poison outputs before a checked run).
#[cube(launch)]
pub fn fill_kernel<F: Float>(
    out: &mut Tensor<F>,
    value: f32,
    len: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < len as usize {
        out[i] = F::cast_from(value);
    }
}

/// Launch-cost probe, tensor arguments: `out[i] = a[i] + b[i]` for `i < len`. Each tensor
/// argument's shape and strides are dynamic metadata, which cubecl-cuda 0.10 uploads to the
/// device before every launch (`launch_checked`: `create_with_data`); for
/// [`crate::cuda::launch_probe`].
#[cube(launch)]
pub fn probe_tensor_kernel<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    out: &mut Tensor<F>,
    len: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < len as usize {
        out[i] = a[i] + b[i];
    }
}

/// Launch-cost probe, array arguments: the same sum as [`probe_tensor_kernel`], with only
/// static metadata (buffer lengths, passed as kernel parameters: no upload).
#[cube(launch)]
pub fn probe_array_kernel<F: Float>(
    a: &Array<F>,
    b: &Array<F>,
    out: &mut Array<F>,
    len: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < len as usize {
        out[i] = a[i] + b[i];
    }
}

/// Threads per block of the element-wise and row kernels below.
pub const ELEM_THREADS: usize = 256;

/// RMSNorm, one block per row of `x` `[rows, hidden]` (any strides: element `(r, c)` at `r
/// ldx0 + c ldx1`; array arguments with the strides as scalars, as the skinny GEMMs, which
/// saves the per-launch upload of tensor metadata): the sum of squares in
/// f32 (each warp's partial sums added across its lanes, then the 8 warp sums in shared
/// memory), then
/// `out = dtype(x * inv) * weight` in the dtype (HF `Qwen2RMSNorm`'s order).
#[cube(launch)]
pub fn rms_norm_kernel<F: Float>(
    x: &Array<F>,
    w: &Array<F>,
    out: &mut Array<F>,
    ldx0: u32,
    ldx1: u32,
    ldw: u32,
    eps: f32,
    inv_hidden: f32,
    #[comptime] hidden: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS_X as usize;
    let tid = UNIT_POS as usize;
    let mut part = SharedMemory::<f32>::new(ELEM_THREADS / 32);
    let base = row * ldx0 as usize;
    let mut s = 0.0f32;
    let mut c = tid;
    while c < hidden {
        let v = f32::cast_from(x[base + c * ldx1 as usize]);
        s += v * v;
        c += ELEM_THREADS;
    }
    // one sum per warp (plane of 32 lanes), then every thread adds the 8 warp sums
    let ws = plane_sum(s);
    let lane = tid % 32;
    if lane == 0 {
        part[tid / 32] = ws;
    }
    sync_cube();
    let mut total = 0.0f32;
    for w in 0..ELEM_THREADS / 32 {
        total += part[w];
    }
    let inv = 1.0f32 / (total * inv_hidden + eps).sqrt();
    let mut c = tid;
    while c < hidden {
        let v = f32::cast_from(x[base + c * ldx1 as usize]);
        let t = F::cast_from(v * inv);
        out[row * hidden + c] = t * w[c * ldw as usize];
        c += ELEM_THREADS;
    }
}

/// `out = dtype(silu(gate)) * up` element-wise over `[rows, cols]` (any strides; `out`
/// contiguous), `silu` in f32.
/// Cache write of a ragged batch: one block per (new row `i`, KV head `h`, sequence `b`), one
/// thread per column: `dst[b, h, starts[b] + i, c] = src[b, h, i, c]`, both through their
/// strides (the cache is written in place).
#[cube(launch)]
pub fn kv_write_kernel<F: Float, I: Int>(
    src: &Tensor<F>,
    starts: &Tensor<I>,
    dst: &mut Tensor<F>,
    #[comptime] d: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let c = UNIT_POS as usize;
    if c < d {
        let p = u32::cast_from(starts[b]) as usize + i;
        dst[b * dst.stride(0) + h * dst.stride(1) + p * dst.stride(2) + c * dst.stride(3)] =
            src[b * src.stride(0) + h * src.stride(1) + i * src.stride(2) + c * src.stride(3)];
    }
}

/// Element strides of [`kv_write_pair_kernel`]'s four tensors, `[batch, kv_heads, seq,
/// head_dim]` each (`sk`, `sv` the new keys and values, `dk`, `dv` the caches).
#[derive(CubeLaunch, CubeType)]
pub struct KvPairStrides {
    pub sk0: u32,
    pub sk1: u32,
    pub sk2: u32,
    pub sk3: u32,
    pub sv0: u32,
    pub sv1: u32,
    pub sv2: u32,
    pub sv3: u32,
    pub dk0: u32,
    pub dk1: u32,
    pub dk2: u32,
    pub dk3: u32,
    pub dv0: u32,
    pub dv1: u32,
    pub dv2: u32,
    pub dv3: u32,
}

/// Cache write of a layer's keys and values in one launch: one block per (new row `i`, KV
/// head `h`, sequence `b`), one thread per column: `dk[b, h, p + i, c] = sk[b, h, i, c]` and
/// `dv[..] = sv[..]` with `p = starts[b]` (`ragged`) or `start` (every sequence at the same
/// length: no `starts` upload). Array arguments, strides in `st` (no per-launch metadata
/// upload); the caches are written in place.
#[cube(launch)]
pub fn kv_write_pair_kernel<F: Float, I: Int>(
    sk: &Array<F>,
    sv: &Array<F>,
    starts: &Array<I>,
    dk: &mut Array<F>,
    dv: &mut Array<F>,
    st: &KvPairStrides,
    start: u32,
    #[comptime] ragged: bool,
    #[comptime] d: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = CUBE_POS_X as usize;
    let h = CUBE_POS_Y as usize;
    let b = CUBE_POS_Z as usize;
    let c = UNIT_POS as usize;
    if c < d {
        let mut p = start as usize + i;
        if comptime![ragged] {
            p = u32::cast_from(starts[b]) as usize + i;
        }
        dk[b * st.dk0 as usize + h * st.dk1 as usize + p * st.dk2 as usize + c * st.dk3 as usize] =
            sk[b * st.sk0 as usize
                + h * st.sk1 as usize
                + i * st.sk2 as usize
                + c * st.sk3 as usize];
        dv[b * st.dv0 as usize + h * st.dv1 as usize + p * st.dv2 as usize + c * st.dv3 as usize] =
            sv[b * st.sv0 as usize
                + h * st.sv1 as usize
                + i * st.sv2 as usize
                + c * st.sv3 as usize];
    }
}

/// Residual add and RMSNorm of one row (one block per row): `s = a + x` rounded to `F` and
/// written to `sum`, then `out = F(s * inv) * w` with `inv` from the mean of the rounded
/// `s^2` in f32 (as [`rms_norm_kernel`] over the stored sum). Each thread reads back only the
/// sums it wrote itself. `a`, `x` rows and columns `lda0`, `lda1` and `ldx0`, `ldx1` apart;
/// array arguments (as [`rms_norm_kernel`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_kernel<F: Float>(
    a: &Array<F>,
    x: &Array<F>,
    w: &Array<F>,
    sum: &mut Array<F>,
    out: &mut Array<F>,
    lda0: u32,
    lda1: u32,
    ldx0: u32,
    ldx1: u32,
    ldw: u32,
    eps: f32,
    inv_hidden: f32,
    #[comptime] hidden: usize,
    #[define(F)] _dtype: StorageType,
) {
    let row = CUBE_POS_X as usize;
    let tid = UNIT_POS as usize;
    let mut part = SharedMemory::<f32>::new(ELEM_THREADS / 32);
    let abase = row * lda0 as usize;
    let xbase = row * ldx0 as usize;
    let mut s = 0.0f32;
    let mut c = tid;
    while c < hidden {
        let t = a[abase + c * lda1 as usize] + x[xbase + c * ldx1 as usize];
        sum[row * hidden + c] = t;
        let v = f32::cast_from(t);
        s += v * v;
        c += ELEM_THREADS;
    }
    let ws = plane_sum(s);
    let lane = tid % 32;
    if lane == 0 {
        part[tid / 32] = ws;
    }
    sync_cube();
    let mut total = 0.0f32;
    for wi in 0..ELEM_THREADS / 32 {
        total += part[wi];
    }
    let inv = 1.0f32 / (total * inv_hidden + eps).sqrt();
    let mut c = tid;
    while c < hidden {
        let v = f32::cast_from(sum[row * hidden + c]);
        let t = F::cast_from(v * inv);
        out[row * hidden + c] = t * w[c * ldw as usize];
        c += ELEM_THREADS;
    }
}

#[cube(launch)]
pub fn silu_mul_kernel<F: Float>(
    gate: &Tensor<F>,
    up: &Tensor<F>,
    out: &mut Tensor<F>,
    total: u32,
    #[comptime] cols: usize,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let r = i / cols;
        let c = i % cols;
        let g = f32::cast_from(gate[r * gate.stride(0) + c * gate.stride(1)]);
        let s = F::cast_from(g / (1.0f32 + (-g).exp()));
        out[i] = s * up[r * up.stride(0) + c * up.stride(1)];
    }
}

/// Rotate-half RoPE element-wise: `out[b, h, t, i] = x[i] cos[i] + x[i +- d/2] sin[i]` in the
/// dtype, `x` `[batch, heads, n, d]` (any strides: `x0 .. x3`), `cos` / `sin` `[batch, 1, n,
/// d]` (`sin` signed; strides of dims 0, 2, 3 given), `out` contiguous. Array arguments with
/// the strides as scalars (as [`rms_norm_kernel`]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn rope_kernel<F: Float>(
    x: &Array<F>,
    cos: &Array<F>,
    sin: &Array<F>,
    out: &mut Array<F>,
    x0: u32,
    x1: u32,
    x2: u32,
    x3: u32,
    cos0: u32,
    cos2: u32,
    cos3: u32,
    sin0: u32,
    sin2: u32,
    sin3: u32,
    total: u32,
    heads: u32,
    n: u32,
    #[comptime] d: usize,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let half = comptime![d / 2];
        let c = i % d;
        let t = (i / d) % (n as usize);
        let h = (i / (d * n as usize)) % (heads as usize);
        let b = i / (d * n as usize * heads as usize);
        let xb = b * x0 as usize + h * x1 as usize + t * x2 as usize;
        let mut other = c + half;
        if c >= half {
            other = c - half;
        }
        let tb = b * cos0 as usize + t * cos2 as usize + c * cos3 as usize;
        let sb = b * sin0 as usize + t * sin2 as usize + c * sin3 as usize;
        let a = x[xb + c * x3 as usize] * cos[tb];
        let r = x[xb + other * x3 as usize] * sin[sb];
        out[i] = a + r;
    }
}

/// Dequantization of a packed matrix, one thread per output element `(r, c)` of `[rows,
/// cols]`: the code is bits `k * bits ..` of word `(g, r_in_group / per, c)`; `out = code *
/// scale + min` in the dtype (each op rounded, as the plain path's).
#[cube(launch)]
pub fn dequant_kernel<F: Float, I: Int>(
    words: &Tensor<I>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    out: &mut Tensor<F>,
    total: u32,
    bits: u32,
    #[comptime] cols: usize,
    #[comptime] group: usize,
    #[comptime] per: usize,
    #[comptime] wpg: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let r = i / cols;
        let c = i % cols;
        let g = r / group;
        let rr = r % group;
        let w = rr / per;
        let k = rr % per;
        let word = u32::cast_from(words[(g * wpg + w) * cols + c]);
        let mask = (1u32 << bits) - 1u32;
        let code = (word >> (k as u32 * bits)) & mask;
        let q = F::cast_from(code);
        out[i] = q * scale[g * cols + c] + min[g * cols + c];
    }
}

/// Columns per block of the skinny GEMM (32 lanes x [`SKINNY_COLS`]).
pub const SKINNY_TILE: usize = 128;
/// Consecutive output columns per thread of the skinny GEMM.
pub const SKINNY_COLS: usize = 4;
/// Most rows of `w` (and columns of `x`) one block of the skinny GEMM stages.
pub const SKINNY_CHUNK: usize = 512;

/// Skinny GEMM `x [mt, k] . w [k, n]` (`x` element `(m, j)` at `m ldx0 + j ldx1`; `w`
/// row-major, rows `ldw >= n` apart: a pitched allocation pads them), split over `k`. Array
/// arguments with the strides as scalars: a tensor argument's shape and strides are uploaded
/// before every launch, 4.4-4.8 us more host time a launch (`dustin-kernels-gpu launchcost`,
/// H200, docs/perf.md, 2026-12-01). Block
/// `(tile, split)` takes columns `tile * 128 ..` and rows `split * rows_per_split ..` of `w`;
/// its 8 warps take every eighth row of that range, lane `l` four consecutive columns, all
/// `mt` rows of `x` (staged in shared memory as f32) at once, f32 accumulators; the warps'
/// sums meet in shared memory and go to `part [splits, mt, ldp]` (f32) at columns `col_off ..
/// col_off + n` (several weights of one `x` share a buffer: [`skinny_reduce3_kernel`],
/// [`skinny_reduce_swiglu_kernel`]; one weight: `ldp = n`, `col_off = 0`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn skinny_gemm_kernel<F: Float>(
    x: &Array<F>,
    w: &Array<F>,
    part: &mut Array<f32>,
    ldx0: u32,
    ldx1: u32,
    ldw: u32,
    k: u32,
    n: u32,
    rows_per_split: u32,
    ldp: u32,
    col_off: u32,
    #[comptime] mt: usize,
    #[define(F)] _dtype: StorageType,
) {
    let tid = UNIT_POS as usize;
    let warp = tid / 32;
    let lane = tid % 32;
    let col0 = CUBE_POS_X as usize * SKINNY_TILE;
    let split = CUBE_POS_Y as usize;
    let k0 = split * rows_per_split as usize;
    let mut k1 = k0 + rows_per_split as usize;
    if k1 > k as usize {
        k1 = k as usize;
    }
    let len = k1 - k0;
    let mut xs = SharedMemory::<f32>::new(comptime![mt * SKINNY_CHUNK]);
    let mut e = tid;
    while e < mt * len {
        let m = e / len;
        let r = e % len;
        xs[m * SKINNY_CHUNK + r] = f32::cast_from(x[m * ldx0 as usize + (k0 + r) * ldx1 as usize]);
        e += 256usize;
    }
    sync_cube();
    let c = col0 + lane * SKINNY_COLS;
    let mut acc = Array::<f32>::new(comptime![mt * SKINNY_COLS]);
    for i in 0..mt * SKINNY_COLS {
        acc[i] = 0.0f32;
    }
    if c < n as usize {
        let mut r = k0 + warp;
        while r < k1 {
            let base = r * ldw as usize + c;
            let w0 = f32::cast_from(w[base]);
            let w1 = f32::cast_from(w[base + 1]);
            let w2 = f32::cast_from(w[base + 2]);
            let w3 = f32::cast_from(w[base + 3]);
            for m in 0..mt {
                let xv = xs[m * SKINNY_CHUNK + (r - k0)];
                acc[m * SKINNY_COLS] += xv * w0;
                acc[m * SKINNY_COLS + 1] += xv * w1;
                acc[m * SKINNY_COLS + 2] += xv * w2;
                acc[m * SKINNY_COLS + 3] += xv * w3;
            }
            r += 8usize;
        }
    }
    let mut red = SharedMemory::<f32>::new(8 * SKINNY_TILE);
    for m in 0..mt {
        for j in 0..SKINNY_COLS {
            red[warp * SKINNY_TILE + lane * SKINNY_COLS + j] = acc[m * SKINNY_COLS + j];
        }
        sync_cube();
        if tid < SKINNY_TILE {
            let col = col0 + tid;
            if col < n as usize {
                let mut s = 0.0f32;
                for wi in 0..8usize {
                    s += red[wi * SKINNY_TILE + tid];
                }
                part[(split * mt + m) * ldp as usize + col_off as usize + col] = s;
            }
        }
        sync_cube();
    }
}

/// Columns per block of the tensor-core skinny GEMM ([`skinny_mma_kernel`]): 8 lane groups
/// of a warp x 8 columns (one 16-byte load each); the block's 4 warps share them.
pub const MMA_TILE: usize = 64;
/// Warps per block of [`skinny_mma_kernel`] (they interleave the block's 16-row steps).
pub const MMA_WARPS: usize = 4;
/// Most 16-row tiles of `x` one launch of [`skinny_mma_kernel`] takes (its accumulators are
/// `32 mt` registers a thread); more rows take one launch per 48 rows. Four tiles measured
/// 2.5x slower per launch than three (7B q/o: 102.9 us for 128 rows in two launches of 64,
/// 20.4 us for 40 rows in one; ncu, docs/perf.md, 2026-12-01), most likely from register
/// spills (three tiles already use 219 registers).
pub const MMA_ROW_TILES: usize = 3;

/// The loads of [`skinny_mma_kernel`]'s `unroll` steps from step `s` (this warp's steps `s,
/// s + 4, ..`; steps past `nsteps` read the last step again, and the caller zeroes them):
/// rows `4t .. 4t + 4` of each step's `w` at this lane's 8 columns into `raw`, and this
/// lane's 4 columns of each of its `x` rows into `xv`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn mma_load<F: Float, NX: Size, NW: Size>(
    x: &Array<Vector<F, NX>>,
    w: &Array<Vector<F, NW>>,
    raw: &mut Array<Vector<F, NW>>,
    xv: &mut Array<Vector<F, NX>>,
    xrow: &Array<usize>,
    s: usize,
    nsteps: usize,
    k0: usize,
    t4: usize,
    lcol: usize,
    ldw: usize,
    ldx: usize,
    #[comptime] mt: usize,
    #[comptime] unroll: usize,
) {
    #[unroll]
    for u in 0..unroll {
        let mut su = s + u * MMA_WARPS;
        if su >= nsteps {
            su = nsteps - 1;
        }
        let kr = k0 + su * 16usize + t4 * 4usize;
        #[unroll]
        for q in 0..4usize {
            raw[u * 4 + q] = w[((kr + q) * ldw + lcol) / 8usize];
        }
        #[unroll]
        for i in 0..comptime![mt * 2] {
            xv[u * 2 * mt + i] = x[(xrow[i] * ldx + kr) / 4usize];
        }
    }
}

/// One block's work of [`skinny_mma_kernel`] on one weight: column tile `tile` of `w`
/// (`ldw` elements a row), `x` rows `ldx` elements apart; `red` is the block's
/// `MMA_WARPS x 16 x 68` f32 shared buffer for the warps' sums.
#[cube]
#[allow(clippy::too_many_arguments)]
fn mma_tile<F: Float, NX: Size, NW: Size>(
    x: &Array<Vector<F, NX>>,
    w: &Array<Vector<F, NW>>,
    part: &mut Array<f32>,
    red: &mut SharedMemory<f32>,
    tile: usize,
    m: u32,
    r0: u32,
    k: u32,
    n: u32,
    rows_per_split: u32,
    ldp: u32,
    col_off: u32,
    ldw: usize,
    ldx: usize,
    #[comptime] mt: usize,
    #[comptime] unroll: usize,
    #[comptime] db: bool,
) {
    let tid = UNIT_POS as usize;
    let warp = tid / 32usize;
    let lane = tid % 32usize;
    let g = lane / 4usize;
    let t4 = lane % 4usize;
    let rows = m as usize;
    let rbase = r0 as usize;
    let cbase = tile * MMA_TILE;
    let col = cbase + g * 8usize;
    // lanes past `n` load column 0 (their sums are never written) so the warp's `mma`s run
    let mut lcol = col;
    if col >= n as usize {
        lcol = 0usize;
    }
    let split = CUBE_POS_Y as usize;
    let k0 = split * rows_per_split as usize;
    let mut k1 = k0 + rows_per_split as usize;
    if k1 > k as usize {
        k1 = k as usize;
    }
    let nsteps = (k1 - k0) / 16usize;
    let zero = F::new(0.0);
    // the x rows of this lane's A fragments, clamped to `m - 1`, and whether each is real
    let mut xrow = Array::<usize>::new(comptime![mt * 2]);
    let mut xok = Array::<bool>::new(comptime![mt * 2]);
    #[unroll]
    for i in 0..comptime![mt * 2] {
        let r = rbase + (i / 2) * 16usize + g + (i % 2) * 8usize;
        xok[i] = r < rows;
        let mut rc = r;
        if rc >= rows {
            rc = rows - 1;
        }
        xrow[i] = rc;
    }
    let def = cmma::MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    // acc[(t * 8 + j) * 2 + h]: m-tile t, n-tile j, rows g (h 0) and g + 8 (h 1)
    let mut acc = Array::<Vector<f32, Const<2>>>::new(comptime![mt * 16]);
    #[unroll]
    for i in 0..comptime![mt * 16] {
        acc[i] = Vector::<f32, Const<2>>::cast_from(0.0f32);
    }
    // with `db`, register double buffering: the loads of the next `unroll` steps are in
    // flight while this batch multiplies; without, each batch loads, then multiplies
    let mut raw = Array::<Vector<F, NW>>::new(comptime![4 * unroll]);
    let mut xv = Array::<Vector<F, NX>>::new(comptime![2 * mt * unroll]);
    let mut nraw = Array::<Vector<F, NW>>::new(comptime![if db { 4 * unroll } else { 1 }]);
    let mut nxv = Array::<Vector<F, NX>>::new(comptime![if db { 2 * mt * unroll } else { 1 }]);
    let mut s = warp;
    if comptime![db] {
        mma_load::<F, NX, NW>(
            x, w, &mut raw, &mut xv, &xrow, s, nsteps, k0, t4, lcol, ldw, ldx, mt, unroll,
        );
    }
    while s < nsteps {
        let sn = s + MMA_WARPS * unroll;
        if comptime![db] {
            mma_load::<F, NX, NW>(
                x, w, &mut nraw, &mut nxv, &xrow, sn, nsteps, k0, t4, lcol, ldw, ldx, mt, unroll,
            );
        } else {
            mma_load::<F, NX, NW>(
                x, w, &mut raw, &mut xv, &xrow, s, nsteps, k0, t4, lcol, ldw, ldx, mt, unroll,
            );
        }
        #[unroll]
        for u in 0..unroll {
            let live = s + u * MMA_WARPS < nsteps;
            // A fragments of every m-tile: a0 rows g, a1 rows g + 8 (slots 2t, 2t + 1 = this
            // lane's columns 0, 1); a2, a3 the same rows (slots 2t + 8, 2t + 9 = columns 2, 3)
            let mut xa = Array::<Vector<F, Const<2>>>::new(comptime![mt * 4]);
            #[unroll]
            for t in 0..mt {
                #[unroll]
                for h in 0..2usize {
                    let ok = live && xok[t * 2 + h];
                    let v = xv[u * 2 * mt + t * 2 + h];
                    let mut lo = Vector::<F, Const<2>>::empty();
                    lo[0] = select(ok, v[0], zero);
                    lo[1] = select(ok, v[1], zero);
                    let mut hi = Vector::<F, Const<2>>::empty();
                    hi[0] = select(ok, v[2], zero);
                    hi[1] = select(ok, v[3], zero);
                    xa[t * 4 + h] = lo;
                    xa[t * 4 + 2 + h] = hi;
                }
            }
            let w0 = raw[u * 4];
            let w1 = raw[u * 4 + 1];
            let w2 = raw[u * 4 + 2];
            let w3 = raw[u * 4 + 3];
            #[unroll]
            for j in 0..8usize {
                let mut b0 = Vector::<F, Const<2>>::empty();
                b0[0] = w0[j];
                b0[1] = w1[j];
                let mut b1 = Vector::<F, Const<2>>::empty();
                b1[0] = w2[j];
                b1[1] = w3[j];
                #[unroll]
                for t in 0..mt {
                    mma_16816::<F>(def, &xa, t * 4, b0, b1, &mut acc, (t * 8 + j) * 2);
                }
            }
        }
        if comptime![db] {
            #[unroll]
            for i in 0..comptime![4 * unroll] {
                raw[i] = nraw[i];
            }
            #[unroll]
            for i in 0..comptime![2 * mt * unroll] {
                xv[i] = nxv[i];
            }
        }
        s = sn;
    }
    // the warps' sums, one m-tile at a time: red[warp][row][col] (rows 68 apart), then each
    // thread adds the four warps for 8 of the tile's 16 x 64 outputs
    #[unroll]
    for t in 0..mt {
        #[unroll]
        for j in 0..8usize {
            #[unroll]
            for h in 0..2usize {
                let v = acc[(t * 8 + j) * 2 + h];
                let rr = g + h * 8usize;
                let o = (warp * 16usize + rr) * 68usize + 16usize * t4 + j;
                red[o] = v[0];
                red[o + 8usize] = v[1];
            }
        }
        sync_cube();
        #[unroll]
        for e in 0..8usize {
            let idx = tid + e * 128usize;
            let rr = idx / 64usize;
            let cc = idx % 64usize;
            let row = rbase + t * 16usize + rr;
            let c = cbase + cc;
            if row < rows && c < n as usize {
                let mut sum = 0.0f32;
                #[unroll]
                for wi in 0..MMA_WARPS {
                    sum += red[(wi * 16usize + rr) * 68usize + cc];
                }
                part[(split * rows + row) * ldp as usize + col_off as usize + c] = sum;
            }
        }
        sync_cube();
    }
}

/// Skinny GEMM on tensor cores: `x [m, k] . w_i [k, n_i]` for up to three weights of one `x`
/// (`weights`; the q, k and v projections take one launch), rows `r0 .. r0 + 16 mt` of `x`
/// (rows past `m` count as zeros), split over `k` as [`skinny_gemm_kernel`] and writing the
/// same `part [splits, m, ldp]` (f32, weight `i` at columns `col_off_i ..`), so the same reduce
/// kernels finish it. Column tiles `first_tile_i ..` of the grid belong to weight `i`
/// (`first_tile_0 = 0`); unused weight slots repeat the last weight (never read). Array arguments with the row strides
/// as scalars (`ldx`, `ldw_i`), as [`skinny_gemm_kernel`]. `x` has a unit column stride and a row stride that is a multiple of 4, read in 8-byte
/// vectors of 4 (`nx`); `w` row-major, read in 16-byte
/// vectors of 8 (`nw`); `n` and `w`'s row stride are multiples of 8, `k` and
/// `rows_per_split` multiples of 16.
///
/// Block `(tile, split)`, 4 warps: the block owns columns `tile * 64 .. + 64` and rows
/// `split * rows_per_split ..` of `w`; warp `wp` takes that range's 16-row steps `wp, wp + 4,
/// ..`, `unroll` at a time; with `db` the loads of the next `unroll` steps (of `w` and of `x`)
/// are in flight while these multiply (register double buffering; without it, each batch's
/// loads are all issued before its multiplies). A
/// step is one `mma.m16n8k16` per (16-row tile of `x`, 8 columns). Its 16 k-slots are
/// mapped to rows so that each lane reads whole vectors: lane `(g, t)` (`g = lane / 4`,
/// `t = lane % 4`) holds the B fragment `B[2t, 2t + 1][g]`, `B[2t + 8, 2t + 9][g]` (PTX ISA,
/// "Matrix Fragments for mma.m16n8k16") and the A fragment of the same k-slots, so giving
/// those four slots rows `4t .. 4t + 4` of the step makes its `x` read one 8-byte vector per
/// row of `x`, and its `w` read rows `4t .. 4t + 4` at columns `8 g .. 8 g + 8` (four
/// 16-byte loads; eight lanes cover a row's 128 bytes); n-tile `j` of the step is column `8 g
/// + j` of lane group `g`. The sum over `k` does not depend on the order of its terms, so
/// this is the product. The four warps' f32 sums meet in shared memory, one 16-row tile at a
/// time, and go to `part`. Steps past the range and rows past `m` read clamped (valid)
/// addresses and are zeroed, so the loop has no branches around its loads.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn skinny_mma_kernel<F: Float, NX: Size, NW: Size>(
    x: &Array<Vector<F, NX>>,
    w0: &Array<Vector<F, NW>>,
    w1: &Array<Vector<F, NW>>,
    w2: &Array<Vector<F, NW>>,
    part: &mut Array<f32>,
    counters: &mut Array<Atomic<u32>>,
    out0: &mut Array<F>,
    out1: &mut Array<F>,
    out2: &mut Array<F>,
    b0: &Array<F>,
    b1: &Array<F>,
    b2: &Array<F>,
    bias_mask: u32,
    m: u32,
    r0: u32,
    k: u32,
    ldx: u32,
    rows_per_split: u32,
    ldp: u32,
    n0: u32,
    n1: u32,
    n2: u32,
    ldw0: u32,
    ldw1: u32,
    ldw2: u32,
    col_off0: u32,
    col_off1: u32,
    col_off2: u32,
    first_tile1: u32,
    first_tile2: u32,
    #[comptime] weights: usize,
    #[comptime] mt: usize,
    #[comptime] unroll: usize,
    #[comptime] db: bool,
    #[comptime] mode: u32,
    #[define(F)] _dtype: StorageType,
) {
    let mut red = SharedMemory::<f32>::new(comptime![MMA_WARPS * 16 * 68]);
    let tile = CUBE_POS_X as usize;
    let ldx = ldx as usize;
    let (t1, t2) = (first_tile1 as usize, first_tile2 as usize);
    // the weight is chosen per block (uniform, no divergence); the weight count is a
    // compile-time choice, so a one-weight launch compiles one call
    if comptime![weights == 1] {
        mma_tile::<F, NX, NW>(
            x,
            w0,
            part,
            &mut red,
            tile,
            m,
            r0,
            k,
            n0,
            rows_per_split,
            ldp,
            col_off0,
            ldw0 as usize,
            ldx,
            mt,
            unroll,
            db,
        );
    } else if comptime![weights == 2] {
        if tile >= t1 {
            mma_tile::<F, NX, NW>(
                x,
                w1,
                part,
                &mut red,
                tile - t1,
                m,
                r0,
                k,
                n1,
                rows_per_split,
                ldp,
                col_off1,
                ldw1 as usize,
                ldx,
                mt,
                unroll,
                db,
            );
        } else {
            mma_tile::<F, NX, NW>(
                x,
                w0,
                part,
                &mut red,
                tile,
                m,
                r0,
                k,
                n0,
                rows_per_split,
                ldp,
                col_off0,
                ldw0 as usize,
                ldx,
                mt,
                unroll,
                db,
            );
        }
    } else if tile >= t2 {
        mma_tile::<F, NX, NW>(
            x,
            w2,
            part,
            &mut red,
            tile - t2,
            m,
            r0,
            k,
            n2,
            rows_per_split,
            ldp,
            col_off2,
            ldw2 as usize,
            ldx,
            mt,
            unroll,
            db,
        );
    } else if tile >= t1 {
        mma_tile::<F, NX, NW>(
            x,
            w1,
            part,
            &mut red,
            tile - t1,
            m,
            r0,
            k,
            n1,
            rows_per_split,
            ldp,
            col_off1,
            ldw1 as usize,
            ldx,
            mt,
            unroll,
            db,
        );
    } else {
        mma_tile::<F, NX, NW>(
            x,
            w0,
            part,
            &mut red,
            tile,
            m,
            r0,
            k,
            n0,
            rows_per_split,
            ldp,
            col_off0,
            ldw0 as usize,
            ldx,
            mt,
            unroll,
            db,
        );
    }
    if comptime![mode != SPLIT_PARTIALS] {
        // `mma_tile` ended on a block-wide barrier after its partial sums
        let mut wi = 0usize;
        let mut tl = tile;
        let mut n = n0 as usize;
        let mut coff = col_off0 as usize;
        if comptime![weights >= 2] {
            if tile >= t1 {
                wi = 1usize;
                tl = tile - t1;
                n = n1 as usize;
                coff = col_off1 as usize;
            }
        }
        if comptime![weights >= 3] {
            if tile >= t2 {
                wi = 2usize;
                tl = tile - t2;
                n = n2 as usize;
                coff = col_off2 as usize;
            }
        }
        // SwiGLU's gate and up tiles of the same columns share a count
        let mut slot = tile;
        if comptime![mode == SPLIT_SWIGLU] {
            slot = tl;
        }
        split_tail::<F>(
            part,
            counters,
            out0,
            out1,
            out2,
            b0,
            b1,
            b2,
            bias_mask,
            slot,
            wi,
            tl,
            n,
            coff,
            m as usize,
            ldp as usize,
            CUBE_COUNT_Y as usize,
            UNIT_POS as usize,
            MMA_TILE,
            comptime![32 * MMA_WARPS],
            mode,
        );
    }
}

/// Most 16-row tiles of `x` [`skinny_ring_kernel`] takes in one launch (128 rows: batch 16 x
/// (gamma + 1) at gamma 7).
pub const RING_MAX_TILES: usize = 8;
/// Threads per block of [`skinny_ring_kernel`] (4 warps).
pub const RING_THREADS: usize = 128;

/// Issues the `cp.async` copies of one stage of [`skinny_ring_kernel`] into ring buffer
/// `buf`: rows `kr .. kr + kc` of `w` at columns `cbase .. cbase + cols` (16-byte vectors of
/// 8; a column vector past `n` reads the last one, never used), rows of `cols / 8 + 1`
/// vectors (one of padding, so `ldmatrix`'s eight 16-byte rows fall in distinct banks), and
/// columns `kr .. kr + kc` of the rows of `x` below `m` (rows of `kc / 8 + 1` vectors; the
/// stage's rows past `m` are left as they are: they only reach accumulator rows that are
/// never written). Every thread of the block takes part; the caller commits the copies to
/// the buffer's barrier.
#[cube]
#[allow(clippy::too_many_arguments)]
fn ring_copy<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    w: &Array<Vector<F, N>>,
    xs: &mut SharedMemory<Vector<F, N>>,
    ws: &mut SharedMemory<Vector<F, N>>,
    buf: usize,
    kr: usize,
    cbase: usize,
    n: usize,
    ldw: usize,
    ldx: usize,
    m: usize,
    tid: usize,
    #[comptime] mt: usize,
    #[comptime] cols: usize,
    #[comptime] kc: usize,
) {
    let wrow = comptime![cols / 8 + 1];
    let xrow = comptime![kc / 8 + 1];
    let wstage = comptime![kc * (cols / 8 + 1)];
    let xstage = comptime![mt * 16 * (kc / 8 + 1)];
    #[unroll]
    for it in 0..comptime![kc * cols / 8 / RING_THREADS] {
        let e = tid + it * RING_THREADS;
        let r = e / comptime![cols / 8];
        let c = e % comptime![cols / 8];
        let mut col = cbase + c * 8usize;
        if col >= n {
            col = n - 8usize;
        }
        let src = ((kr + r) * ldw + col) / 8usize;
        let o = buf * wstage + r * wrow + c;
        copy_async(&w.slice(src, src + 1), &mut ws.slice_mut(o, o + 1), 8u32);
    }
    #[unroll]
    for it in 0..comptime![(mt * 16 * (kc / 8)).div_ceil(RING_THREADS)] {
        let e = tid + it * RING_THREADS;
        let r = e / comptime![kc / 8];
        let c = e % comptime![kc / 8];
        if r < m && e < comptime![mt * 16 * (kc / 8)] {
            let src = (r * ldx + kr) / 8usize + c;
            let o = buf * xstage + r * xrow + c;
            copy_async(&x.slice(src, src + 1), &mut xs.slice_mut(o, o + 1), 8u32);
        }
    }
}

/// [`ring_copy`] from the weight `wi` (0, 1 or 2) of [`skinny_ring_kernel`]: the choice is
/// uniform over a block, and `weights` (compile time) drops the branches of unused slots.
#[cube]
#[allow(clippy::too_many_arguments)]
fn ring_copy_any<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    w0: &Array<Vector<F, N>>,
    w1: &Array<Vector<F, N>>,
    w2: &Array<Vector<F, N>>,
    wi: usize,
    xs: &mut SharedMemory<Vector<F, N>>,
    ws: &mut SharedMemory<Vector<F, N>>,
    buf: usize,
    kr: usize,
    cbase: usize,
    n: usize,
    ldw: usize,
    ldx: usize,
    m: usize,
    tid: usize,
    #[comptime] weights: usize,
    #[comptime] mt: usize,
    #[comptime] cols: usize,
    #[comptime] kc: usize,
) {
    if comptime![weights == 1] {
        ring_copy::<F, N>(
            x, w0, xs, ws, buf, kr, cbase, n, ldw, ldx, m, tid, mt, cols, kc,
        );
    } else if comptime![weights == 2] {
        if wi == 0 {
            ring_copy::<F, N>(
                x, w0, xs, ws, buf, kr, cbase, n, ldw, ldx, m, tid, mt, cols, kc,
            );
        } else {
            ring_copy::<F, N>(
                x, w1, xs, ws, buf, kr, cbase, n, ldw, ldx, m, tid, mt, cols, kc,
            );
        }
    } else if wi == 0 {
        ring_copy::<F, N>(
            x, w0, xs, ws, buf, kr, cbase, n, ldw, ldx, m, tid, mt, cols, kc,
        );
    } else if wi == 1 {
        ring_copy::<F, N>(
            x, w1, xs, ws, buf, kr, cbase, n, ldw, ldx, m, tid, mt, cols, kc,
        );
    } else {
        ring_copy::<F, N>(
            x, w2, xs, ws, buf, kr, cbase, n, ldw, ldx, m, tid, mt, cols, kc,
        );
    }
}

/// Commits this thread's pending `cp.async` copies to barrier `nb` of four and arrives on it.
#[cube]
fn ring_commit(bar0: &Barrier, bar1: &Barrier, bar2: &Barrier, bar3: &Barrier, nb: usize) {
    if nb == 0 {
        bar0.commit_copy_async();
        let _a = bar0.arrive();
    } else if nb == 1 {
        bar1.commit_copy_async();
        let _a = bar1.arrive();
    } else if nb == 2 {
        bar2.commit_copy_async();
        let _a = bar2.arrive();
    } else {
        bar3.commit_copy_async();
        let _a = bar3.arrive();
    }
}

/// Skinny GEMM on tensor cores with the weight staged once per block: `x [m, k] . w_i [k,
/// n_i]` for up to three weights of one `x` (`weights`), all `m <= 16 mt` rows in one launch
/// (`mt <=` [`RING_MAX_TILES`]), split over `k` and writing the same `part [splits, m, ldp]`
/// (f32, weight `i` at columns `col_off_i ..`) as [`skinny_mma_kernel`], so the same reduce
/// kernels finish it. Column tiles `first_tile_i ..` of the grid belong to weight `i`.
///
/// Block `(tile, split)`, 4 warps, owns columns `tile * cols .. + cols` (`cols` 64 or 128) of
/// its weight and rows `split * rows_per_split ..` (a multiple of `kc`, 32 or 64; `k` too).
/// Its rows of `w` and the matching columns of `x` go through a ring of `bufs` (3 or 4)
/// shared-memory stages of `kc` rows, copied by `cp.async` (completion tracked by one
/// mbarrier per stage) while earlier stages are multiplied, so the weight tile is read from
/// DRAM once and feeds every 16-row tile of `x`, and no register holds a load in flight. Warp
/// `wp` owns columns `wp cols / 4 .. + cols / 4` (`cols / 32` n-tiles of 8): per 16-row step
/// of `w`, one `ldmatrix.x4.trans` per 16 columns gives its B fragments (the stage is
/// row-major `[k, n]`, as the flash kernel's V tile), one `ldmatrix.x4` per m-tile its A
/// fragments, and one `mma.m16n8k16` per (m-tile, n-tile) accumulates in f32 (PTX ISA,
/// "Matrix Fragments for mma.m16n8k16"). The warps own distinct columns, so each writes its
/// sums straight to `part` (rows past `m` and columns past `n` skipped). `x` has a unit
/// column stride and a row stride that is a multiple of 8; `w` row-major with `n` and the row
/// stride multiples of 8; both start 16-byte aligned (each copy moves one 16-byte vector).
/// Shared memory: `bufs x (kc (cols + 8) + 16 mt (kc + 8)) x 2` bytes (33.8 KB at `cols`
/// 64, `kc` 32, 4 stages and `mt` 3).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn skinny_ring_kernel<F: Float, N: Size>(
    x: &Array<Vector<F, N>>,
    w0: &Array<Vector<F, N>>,
    w1: &Array<Vector<F, N>>,
    w2: &Array<Vector<F, N>>,
    part: &mut Array<f32>,
    counters: &mut Array<Atomic<u32>>,
    out0: &mut Array<F>,
    out1: &mut Array<F>,
    out2: &mut Array<F>,
    b0: &Array<F>,
    b1: &Array<F>,
    b2: &Array<F>,
    bias_mask: u32,
    m: u32,
    k: u32,
    ldx: u32,
    rows_per_split: u32,
    ldp: u32,
    n0: u32,
    n1: u32,
    n2: u32,
    ldw0: u32,
    ldw1: u32,
    ldw2: u32,
    col_off0: u32,
    col_off1: u32,
    col_off2: u32,
    first_tile1: u32,
    first_tile2: u32,
    #[comptime] weights: usize,
    #[comptime] mt: usize,
    #[comptime] cols: usize,
    #[comptime] kc: usize,
    #[comptime] bufs: usize,
    #[comptime] mode: u32,
    #[define(F)] _dtype: StorageType,
) {
    let tid = UNIT_POS as usize;
    let warp = tid / 32usize;
    let lane = tid % 32usize;
    let g = lane / 4usize;
    let t4 = lane % 4usize;
    let rows = m as usize;
    let ldx = ldx as usize;
    // this block's weight (uniform over the block)
    let gt = CUBE_POS_X as usize;
    let mut wi = 0usize;
    let mut tile = gt;
    let mut n = n0 as usize;
    let mut ldw = ldw0 as usize;
    let mut coff = col_off0 as usize;
    if comptime![weights >= 2] {
        if gt >= first_tile1 as usize {
            wi = 1usize;
            tile = gt - first_tile1 as usize;
            n = n1 as usize;
            ldw = ldw1 as usize;
            coff = col_off1 as usize;
        }
    }
    if comptime![weights >= 3] {
        if gt >= first_tile2 as usize {
            wi = 2usize;
            tile = gt - first_tile2 as usize;
            n = n2 as usize;
            ldw = ldw2 as usize;
            coff = col_off2 as usize;
        }
    }
    let cbase = tile * cols;
    let split = CUBE_POS_Y as usize;
    let k0 = split * rows_per_split as usize;
    let mut k1 = k0 + rows_per_split as usize;
    if k1 > k as usize {
        k1 = k as usize;
    }
    let nchunks = (k1 - k0) / kc;
    let wrowv = comptime![cols / 8 + 1];
    let xrowv = comptime![kc / 8 + 1];
    let wstage = comptime![kc * (cols / 8 + 1)];
    let xstage = comptime![mt * 16 * (kc / 8 + 1)];
    // n-tiles of 8 columns per warp
    let ntw = comptime![cols / 32];
    let mut ws = SharedMemory::<Vector<F, N>>::new_aligned(comptime![bufs * wstage], 16usize);
    let mut xs = SharedMemory::<Vector<F, N>>::new_aligned(comptime![bufs * xstage], 16usize);
    // stage i is complete when every thread arrived on bar_i and its copies landed
    let bar0 = Barrier::shared(RING_THREADS as u32, tid == 0);
    let bar1 = Barrier::shared(RING_THREADS as u32, tid == 0);
    let bar2 = Barrier::shared(RING_THREADS as u32, tid == 0);
    let bar3 = Barrier::shared(RING_THREADS as u32, tid == 0);
    sync_cube();

    let def = cmma::MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    // acc[(t * ntw + j) * 2 + h]: m-tile t, n-tile j (columns warp cols / 4 + 8 j ..), rows
    // g (h 0) and g + 8 (h 1), columns 2 t4 and the next
    let mut acc = Array::<Vector<f32, Const<2>>>::new(comptime![mt * ntw * 2]);
    #[unroll]
    for i in 0..comptime![mt * ntw * 2] {
        acc[i] = Vector::<f32, Const<2>>::cast_from(0.0f32);
    }
    // prologue: stages 0 .. bufs - 1 into buffers 0 .. bufs - 1
    #[unroll]
    for pre in 0..comptime![bufs - 1] {
        if pre < nchunks {
            ring_copy_any::<F, N>(
                x,
                w0,
                w1,
                w2,
                wi,
                &mut xs,
                &mut ws,
                pre,
                k0 + pre * kc,
                cbase,
                n,
                ldw,
                ldx,
                rows,
                tid,
                weights,
                mt,
                cols,
                kc,
            );
            ring_commit(&bar0, &bar1, &bar2, &bar3, pre);
        }
    }
    // ldmatrix x4: lane l addresses row l % 8 of matrix l / 8
    let mj = lane / 8usize;
    let mrow = lane % 8usize;
    let mut c = 0usize;
    while c < nchunks {
        let sb = c % bufs;
        // copy stage c + bufs - 1 into its buffer (read last by stage c - 1, which every warp
        // finished at its closing barrier), then wait for stage c
        let cn = c + bufs - 1;
        if cn < nchunks {
            let nb = cn % bufs;
            ring_copy_any::<F, N>(
                x,
                w0,
                w1,
                w2,
                wi,
                &mut xs,
                &mut ws,
                nb,
                k0 + cn * kc,
                cbase,
                n,
                ldw,
                ldx,
                rows,
                tid,
                weights,
                mt,
                cols,
                kc,
            );
            ring_commit(&bar0, &bar1, &bar2, &bar3, nb);
        }
        // buffer sb's use number c / bufs completes its phase of that parity
        let ph = ((c / bufs) % 2) as u32;
        if sb == 0 {
            bar0.wait_parity(ph);
        } else if sb == 1 {
            bar1.wait_parity(ph);
        } else if sb == 2 {
            bar2.wait_parity(ph);
        } else {
            bar3.wait_parity(ph);
        }
        let wb = sb * wstage;
        let xb = sb * xstage;
        #[unroll]
        for kk in 0..comptime![kc / 16] {
            // B fragments of this warp's columns, 16 at a time: matrix mj = (k half mj % 2,
            // column half mj / 2); bv[0], bv[1] n-tile 2p, bv[2], bv[3] n-tile 2p + 1
            let wrow = kk * 16 + (mj % 2) * 8 + mrow;
            let mut bfr = Array::<Vector<F, Const<2>>>::new(comptime![ntw * 2]);
            #[unroll]
            for p in 0..comptime![ntw / 2] {
                let wo = wb + wrow * wrowv + warp * comptime![cols / 32] + p * 2 + mj / 2;
                let bv = def.load_matrix::<Vector<F, N>, Const<2>>(
                    &ws.slice(wo, wo + 1),
                    MatrixIdent::B,
                    4usize,
                    true,
                );
                #[unroll]
                for q in 0..4usize {
                    bfr[p * 4 + q] = bv[q];
                }
            }
            #[unroll]
            for t in 0..mt {
                // A fragments of m-tile t: lane l addresses row l % 16, columns 8 (l / 16) ..
                let xo = xb + (t * 16 + lane % 16usize) * xrowv + kk * 2 + lane / 16usize;
                let xa = def.load_matrix::<Vector<F, N>, Const<2>>(
                    &xs.slice(xo, xo + 1),
                    MatrixIdent::A,
                    4usize,
                    false,
                );
                #[unroll]
                for j in 0..ntw {
                    mma_16816::<F>(
                        def,
                        &xa,
                        0usize,
                        bfr[j * 2],
                        bfr[j * 2 + 1],
                        &mut acc,
                        (t * ntw + j) * 2,
                    );
                }
            }
        }
        sync_cube();
        c += 1;
    }
    #[unroll]
    for t in 0..mt {
        #[unroll]
        for j in 0..ntw {
            #[unroll]
            for h in 0..2usize {
                let v = acc[(t * ntw + j) * 2 + h];
                let row = t * 16 + g + h * 8usize;
                let col = cbase + warp * comptime![cols / 4] + j * 8usize + t4 * 2usize;
                if row < rows && col < n {
                    let o = (split * rows + row) * ldp as usize + coff + col;
                    part[o] = v[0];
                    part[o + 1] = v[1];
                }
            }
        }
    }
    if comptime![mode != SPLIT_PARTIALS] {
        sync_cube();
        // SwiGLU's gate and up tiles of the same columns share a count
        let mut slot = gt;
        if comptime![mode == SPLIT_SWIGLU] {
            slot = tile;
        }
        split_tail::<F>(
            part,
            counters,
            out0,
            out1,
            out2,
            b0,
            b1,
            b2,
            bias_mask,
            slot,
            wi,
            tile,
            n,
            coff,
            rows,
            ldp as usize,
            CUBE_COUNT_Y as usize,
            tid,
            cols,
            RING_THREADS,
            mode,
        );
    }
}

/// Sum of the skinny GEMM's partial products over the splits, plus the bias, rounded once:
/// `out[m, c] = dtype(sum_s part[s, m, c] + bias[c])`, one thread per output element. All
/// contiguous, passed as arrays (no per-launch metadata upload; [`skinny_gemm_kernel`]).
#[cube(launch)]
pub fn skinny_reduce_kernel<F: Float>(
    part: &Array<f32>,
    bias: &Array<F>,
    out: &mut Array<F>,
    total: u32,
    n: u32,
    splits: u32,
    #[comptime] has_bias: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let mut s = 0.0f32;
        for sp in 0..splits as usize {
            s += part[sp * total as usize + i];
        }
        if has_bias {
            s += f32::cast_from(bias[i % n as usize]);
        }
        out[i] = F::cast_from(s);
    }
}

/// `out [m, n]` (contiguous, `total = m * n`) filled with `bias [n]` on every row, one thread
/// per element: the starting value of the cuBLAS GEMM that adds its product into it
/// (`beta = 1`, [`crate::KernelOps::prefill_linear`]).
#[cube(launch)]
pub fn broadcast_rows_kernel<F: Float>(
    bias: &Tensor<F>,
    out: &mut Tensor<F>,
    total: u32,
    n: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        out[i] = bias[(i % n as usize) * bias.stride(0)];
    }
}

/// The sums of three skinny GEMMs sharing `part [splits, m, ldp]` (columns `0 .. n0`, `n0 ..
/// n0 + n1`, `n0 + n1 .. ldp`), each plus its bias and rounded once into `out0 [m, n0]`,
/// `out1 [m, n1]`, `out2 [m, ldp - n0 - n1]` (contiguous), one thread per element of `[m,
/// ldp]`; as [`skinny_reduce_kernel`] per weight.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn skinny_reduce3_kernel<F: Float>(
    part: &Array<f32>,
    b0: &Array<F>,
    b1: &Array<F>,
    b2: &Array<F>,
    out0: &mut Array<F>,
    out1: &mut Array<F>,
    out2: &mut Array<F>,
    total: u32,
    ldp: u32,
    n0: u32,
    n1: u32,
    splits: u32,
    #[comptime] bias0: bool,
    #[comptime] bias1: bool,
    #[comptime] bias2: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let mut s = 0.0f32;
        for sp in 0..splits as usize {
            s += part[sp * total as usize + i];
        }
        let r = i / ldp as usize;
        let c = i % ldp as usize;
        let e0 = n0 as usize;
        let e1 = (n0 + n1) as usize;
        if c < e0 {
            if bias0 {
                s += f32::cast_from(b0[c]);
            }
            out0[r * e0 + c] = F::cast_from(s);
        } else if c < e1 {
            let cc = c - e0;
            if bias1 {
                s += f32::cast_from(b1[cc]);
            }
            out1[r * n1 as usize + cc] = F::cast_from(s);
        } else {
            let cc = c - e1;
            let n2 = ldp as usize - e1;
            if bias2 {
                s += f32::cast_from(b2[cc]);
            }
            out2[r * n2 + cc] = F::cast_from(s);
        }
    }
}

/// SwiGLU from two skinny GEMMs sharing `part [splits, m, 2 inter]` (gate at columns `0 ..
/// inter`, up at `inter .. 2 inter`): `out[r, c] = dtype(silu(gate)) * up` `[m, inter]`
/// (contiguous), with `gate` and `up` each summed in f32 and rounded once to the dtype first,
/// silu in f32 (as [`skinny_reduce_kernel`] then [`silu_mul_kernel`]); one thread per output.
#[cube(launch)]
pub fn skinny_reduce_swiglu_kernel<F: Float>(
    part: &Array<f32>,
    out: &mut Array<F>,
    total: u32,
    inter: u32,
    splits: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < total as usize {
        let w = inter as usize;
        let r = i / w;
        let c = i % w;
        let rows = total as usize / w;
        let mut sg = 0.0f32;
        let mut su = 0.0f32;
        for sp in 0..splits as usize {
            let base = (sp * rows + r) * 2 * w;
            sg += part[base + c];
            su += part[base + w + c];
        }
        let g = f32::cast_from(F::cast_from(sg));
        let up = F::cast_from(su);
        let act = F::cast_from(g / (1.0f32 + (-g).exp()));
        out[i] = act * up;
    }
}

/// Where a skinny GEMM launch leaves its sums: [`SPLIT_PARTIALS`] (only `part`, finished by
/// a reduce kernel) or, finished inside the launch by [`split_tail`], [`SPLIT_OUTPUTS`] (each
/// weight's own `[m, n_i]` output plus its bias) or [`SPLIT_SWIGLU`] (SwiGLU of the two
/// weights, gate and up, into `[m, n]`).
pub const SPLIT_PARTIALS: u32 = 0;
/// See [`SPLIT_PARTIALS`].
pub const SPLIT_OUTPUTS: u32 = 1;
/// See [`SPLIT_PARTIALS`].
pub const SPLIT_SWIGLU: u32 = 2;

/// `__threadfence()`: orders this thread's global-memory writes before its later ones for
/// every thread of the device (PTX `fence.sc.gpu`; CUDA C++ Programming Guide, "Memory Fence
/// Functions", whose example is this use: the last block of a grid reads what the others
/// wrote). cubecl 0.10's frontend has no fence (its C++ compiler knows
/// `Instruction::ThreadFence` but nothing emits it), and it writes a comment that has a line
/// break as `/* ... */`, so this comment closes itself, puts the fence on its own line and
/// opens a comment again. The GPU check of the fused split reduction (`dustin-kernels-gpu
/// check --op skinny`) is what shows it in effect.
#[cube]
fn grid_fence() {
    comment!("grid fence (cubecl 0.10 has no frontend for it)\n*/ __threadfence(); /*");
}

/// The split reduction of a skinny GEMM inside its own launch (one launch where a GEMM and
/// a reduce kernel took two). Called by every block after its partial sums are in `part
/// [splits, m, ldp]` (f32) and its block-wide barrier: the block counts itself in
/// `counters[slot]` (zero before the launch), and the block that completes the count (the
/// last of the slot's `splits` blocks, `2 splits` with [`SPLIT_SWIGLU`], where the gate's and
/// the up projection's tile `tile` share a slot) sums the slot's columns over the splits and
/// writes them as the matching reduce kernel does, then sets the counter back to zero for the
/// next launch. The writes before the count and the reads after it are ordered by
/// [`grid_fence`] (the "last block" pattern of the CUDA C++ Programming Guide, "Memory Fence
/// Functions").
///
/// - [`SPLIT_OUTPUTS`]: columns `tile * cols .. + cols` (below `n`) of weight `wi`, which
///   start at column `coff` of `part`, into `out_wi [m, n]` as `dtype(sum + bias_wi)`
///   (`bias_mask` bit `i`: weight `i` has a bias), as [`skinny_reduce_kernel`] and
///   [`skinny_reduce3_kernel`];
/// - [`SPLIT_SWIGLU`]: columns `c` of that range of the gate (`part` columns `0 .. n`) and
///   up (`n .. 2 n`), `out0[r, c] = dtype(silu(dtype(gate))) * dtype(up)`, as
///   [`skinny_reduce_swiglu_kernel`].
///
/// Uniform over the block; `threads` is the block's size.
#[cube]
#[allow(clippy::too_many_arguments)]
pub fn split_tail<F: Float>(
    part: &Array<f32>,
    counters: &mut Array<Atomic<u32>>,
    out0: &mut Array<F>,
    out1: &mut Array<F>,
    out2: &mut Array<F>,
    b0: &Array<F>,
    b1: &Array<F>,
    b2: &Array<F>,
    bias_mask: u32,
    slot: usize,
    wi: usize,
    tile: usize,
    n: usize,
    coff: usize,
    rows: usize,
    ldp: usize,
    splits: usize,
    tid: usize,
    #[comptime] cols: usize,
    #[comptime] threads: usize,
    #[comptime] mode: u32,
) {
    let mut flag = SharedMemory::<u32>::new(1usize);
    if tid == 0 {
        // this block's partial sums (every thread's, ordered before this one's by the
        // caller's barrier) before its count
        grid_fence();
        let mut expect = splits as u32;
        if comptime![mode == SPLIT_SWIGLU] {
            expect = 2u32 * splits as u32;
        }
        let old = counters[slot].fetch_add(1u32);
        let mut last = 0u32;
        if old + 1u32 == expect {
            last = 1u32;
            counters[slot].store(0u32);
        }
        // the count before the other blocks' partial sums are read
        grid_fence();
        flag[0] = last;
    }
    sync_cube();
    if flag[0] == 1u32 {
        // 8 consecutive columns a thread and step (`n` and the tile start are multiples of 8,
        // so a group is all inside `n` or all past it): 8 (SwiGLU: 16) independent loads a
        // split in flight, where one column a step left the block waiting on one load chain
        // per element (40 rows of a 128-column tile: 40 steps of 128 threads)
        let cbase = tile * cols;
        let groups = comptime![cols / 8];
        let mut e = tid;
        while e < rows * groups {
            let r = e / groups;
            let c = cbase + (e % groups) * 8usize;
            if c < n {
                if comptime![mode == SPLIT_SWIGLU] {
                    let mut sg = Array::<f32>::new(8usize);
                    let mut su = Array::<f32>::new(8usize);
                    #[unroll]
                    for j in 0..8usize {
                        sg[j] = 0.0f32;
                        su[j] = 0.0f32;
                    }
                    // four splits a step: their loads are independent, so all are in
                    // flight before the sums wait on them
                    let mut sp = 0usize;
                    while sp + 4usize <= splits {
                        #[unroll]
                        for u in 0..4usize {
                            let base = ((sp + u) * rows + r) * ldp + c;
                            #[unroll]
                            for j in 0..8usize {
                                sg[j] += part[base + j];
                                su[j] += part[base + n + j];
                            }
                        }
                        sp += 4usize;
                    }
                    while sp < splits {
                        let base = (sp * rows + r) * ldp + c;
                        #[unroll]
                        for j in 0..8usize {
                            sg[j] += part[base + j];
                            su[j] += part[base + n + j];
                        }
                        sp += 1usize;
                    }
                    #[unroll]
                    for j in 0..8usize {
                        let g = f32::cast_from(F::cast_from(sg[j]));
                        let up = F::cast_from(su[j]);
                        let act = F::cast_from(g / (1.0f32 + (-g).exp()));
                        out0[r * n + c + j] = act * up;
                    }
                } else {
                    let mut acc = Array::<f32>::new(8usize);
                    #[unroll]
                    for j in 0..8usize {
                        acc[j] = 0.0f32;
                    }
                    // four splits a step, as above
                    let mut sp = 0usize;
                    while sp + 4usize <= splits {
                        #[unroll]
                        for u in 0..4usize {
                            let base = ((sp + u) * rows + r) * ldp + coff + c;
                            #[unroll]
                            for j in 0..8usize {
                                acc[j] += part[base + j];
                            }
                        }
                        sp += 4usize;
                    }
                    while sp < splits {
                        let base = (sp * rows + r) * ldp + coff + c;
                        #[unroll]
                        for j in 0..8usize {
                            acc[j] += part[base + j];
                        }
                        sp += 1usize;
                    }
                    if wi == 0 {
                        let hb = bias_mask % 2u32 == 1u32;
                        #[unroll]
                        for j in 0..8usize {
                            let mut v = acc[j];
                            if hb {
                                v += f32::cast_from(b0[c + j]);
                            }
                            out0[r * n + c + j] = F::cast_from(v);
                        }
                    } else if wi == 1 {
                        let hb = (bias_mask / 2u32) % 2u32 == 1u32;
                        #[unroll]
                        for j in 0..8usize {
                            let mut v = acc[j];
                            if hb {
                                v += f32::cast_from(b1[c + j]);
                            }
                            out1[r * n + c + j] = F::cast_from(v);
                        }
                    } else {
                        let hb = (bias_mask / 4u32) % 2u32 == 1u32;
                        #[unroll]
                        for j in 0..8usize {
                            let mut v = acc[j];
                            if hb {
                                v += f32::cast_from(b2[c + j]);
                            }
                            out2[r * n + c + j] = F::cast_from(v);
                        }
                    }
                }
            }
            e += comptime![threads];
        }
    }
}

/// Query rows per block of [`flash_kernel`] in verification: 4 warps x one 16-row MMA tile
/// (score mode's blocks take 16 rows, shared by the 4 warps). Prefill blocks take `warps x
/// 16` rows, `warps` 4 or 8 (`KernelConfig::prefill_warps`).
pub const FLASH_ROWS: usize = 64;
/// Keys per shared-memory tile of [`flash_kernel`] (the verification split plan's unit).
pub const FLASH_KEYS: usize = crate::split_plan::FLASH_KEYS;

/// One `mma.sync.m16n8k16` (bf16/f16 in, f32 accumulate) on register fragments: the A
/// fragment is `a[a0 .. a0 + 4]`, the B fragment `b0`, `b1`, the accumulator
/// `c[c0 .. c0 + 2]` (PTX ISA, "Matrix Fragments for mma.m16n8k16"; the register layouts
/// are those of cubecl's `MmaDefinition` on CUDA).
#[cube]
#[allow(clippy::too_many_arguments)]
fn mma_16816<F: Float>(
    def: cmma::MmaDefinition<F, F, f32>,
    a: &Array<Vector<F, Const<2>>>,
    #[comptime] a0: usize,
    b0: Vector<F, Const<2>>,
    b1: Vector<F, Const<2>>,
    c: &mut Array<Vector<f32, Const<2>>>,
    #[comptime] c0: usize,
) {
    let mut fa = Array::<Vector<F, Const<2>>>::new(4usize);
    #[unroll]
    for i in 0..4usize {
        fa[i] = a[a0 + i];
    }
    let mut fb = Array::<Vector<F, Const<2>>>::new(2usize);
    fb[0] = b0;
    fb[1] = b1;
    let mut fc = Array::<Vector<f32, Const<2>>>::new(2usize);
    fc[0] = c[c0];
    fc[1] = c[c0 + 1];
    def.execute_inplace(&fa, &fb, &mut fc);
    c[c0] = fc[0];
    c[c0 + 1] = fc[1];
}

/// Stages virtual keys `t0 .. t0 + FLASH_KEYS` of [`flash_kernel`] (clamped to `kend - 1`)
/// into shared buffer `buf`: K and V rows of `d / nv` 16-byte vectors at row stride
/// `d / nv + 1` (the padding keeps `ldmatrix` free of bank conflicts), by `cp.async`
/// (`async_copy`: the caller commits them to the buffer's barrier) or plain loads and
/// stores. A key's slot is `j` itself (dense), or for a selection the listed position
/// (`j < vctx`; an entry outside `0 .. ctx_b` reads slot 0 and is flagged unlisted in `kok`,
/// which the caller masks) and then the new tokens `ctx_b + j - vctx`. Without `with_v`
/// (score mode), K only. Every thread of the block takes part. `kb`, `vb`, `ib`: the
/// sequence's and KV head's first element of `k`, `v` and the selection `idx`; `k2s`, `v2s`,
/// `i2s`: their strides along positions.
#[cube]
#[allow(clippy::too_many_arguments)]
fn flash_stage<F: Float, I: Int, N: Size>(
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    idx: &Array<I>,
    ib: usize,
    i2s: usize,
    k2s: usize,
    v2s: usize,
    ks: &mut SharedMemory<Vector<F, N>>,
    vs: &mut SharedMemory<Vector<F, N>>,
    kok: &mut SharedMemory<u32>,
    kb: usize,
    vb: usize,
    vctx: usize,
    ctx_b: usize,
    t0: usize,
    kend: usize,
    buf: usize,
    tid: usize,
    #[comptime] d: usize,
    #[comptime] nv: usize,
    #[comptime] async_copy: bool,
    #[comptime] sparse: bool,
    #[comptime] with_v: bool,
    #[comptime] threads: usize,
) {
    let vpr = comptime![d / nv];
    let sqv = comptime![d / nv + 1];
    let base = buf * comptime![FLASH_KEYS * (d / nv + 1)];
    let iters = comptime![FLASH_KEYS * d / (nv * threads)];
    // the cache slot of each of this thread's vectors first, then the copies: a selection's
    // index loads are then all in flight together instead of one latency per copy (7B
    // sparse at budget 1024 went from 33.2 to 30.4 us of GPU time on the H200,
    // docs/perf/kernel-gpu-time-2026-11-30/ktime-combine-selection/)
    let mut slots = Array::<u32>::new(iters);
    #[unroll]
    for it in 0..iters {
        let e = tid + it * threads;
        let t = e / vpr;
        // the key's first vector (one thread a key) writes the key's flag
        let first = e % vpr;
        let mut j = t0 + t;
        if j >= kend {
            j = kend - 1;
        }
        let mut p = j;
        if comptime![sparse] {
            if j < vctx {
                let ix = i32::cast_from(idx[ib + j * i2s]);
                // negative entries and entries past the context are both unlisted
                let listed = ix >= 0 && usize::cast_from(ix) < ctx_b;
                p = select(listed, usize::cast_from(ix), 0usize);
                if first == 0 {
                    kok[buf * FLASH_KEYS + t] = select(listed, 1u32, 0u32);
                }
            } else {
                p = ctx_b + j - vctx;
                if first == 0 {
                    kok[buf * FLASH_KEYS + t] = 1u32;
                }
            }
        }
        slots[it] = u32::cast_from(p);
    }
    #[unroll]
    for it in 0..iters {
        let e = tid + it * threads;
        let t = e / vpr;
        let c = e % vpr;
        let p = slots[it] as usize;
        let kx = (kb + p * k2s) / nv + c;
        let vx = (vb + p * v2s) / nv + c;
        let o = base + t * sqv + c;
        if comptime![async_copy] {
            copy_async(&k.slice(kx, kx + 1), &mut ks.slice_mut(o, o + 1), nv as u32);
            if comptime![with_v] {
                copy_async(&v.slice(vx, vx + 1), &mut vs.slice_mut(o, o + 1), nv as u32);
            }
        } else {
            ks[o] = k[kx];
            if comptime![with_v] {
                vs[o] = v[vx];
            }
        }
    }
}

/// Element strides of [`flash_kernel`]'s tensors, passed as scalars: its arguments are arrays
/// (a tensor argument's shape and strides are uploaded before every launch, 4.4-4.8 us of
/// host time; `dustin-kernels-gpu launchcost`, docs/perf.md, 2026-12-01). `q` `[b, heads, n,
/// d]`, `k` / `v` `[b, kv_heads, capacity, d]` (dims 0-2), `idx` `[b, kv_heads, width]`,
/// `out` `[b, heads, n, d]` (dims 0-2; prefill), `table` (its row stride).
#[derive(CubeLaunch, CubeType)]
pub struct FlashStrides {
    pub q0: u32,
    pub q1: u32,
    pub q2: u32,
    pub q3: u32,
    pub k0: u32,
    pub k1: u32,
    pub k2: u32,
    pub v0: u32,
    pub v1: u32,
    pub v2: u32,
    pub idx0: u32,
    pub idx1: u32,
    pub idx2: u32,
    pub out0: u32,
    pub out1: u32,
    pub out2: u32,
    pub table0: u32,
}

/// GQA attention with the scores in registers, flash-attention-2 style (Dao,
/// "FlashAttention-2", 2023, Algorithm 1), for prefill chunks and for verification.
///
/// Each warp owns 16 query rows (in score mode, the block's 16 rows and a quarter of each
/// tile's keys) and keeps everything of them in registers: the Q
/// fragments, the scores `S = Q K^T` of a [`FLASH_KEYS`]-key tile (`mma.m16n8k16`, f32), the
/// online softmax (each lane holds two rows' partial maxima and sums, reduced over its quad
/// by two shuffles) and `O` (f32). The probabilities go from the score accumulators straight
/// into the A fragments of `P V` (the accumulator layout of an m16n8 tile pair is the A
/// layout of m16k16), so scores never touch shared memory. K and V tiles are staged in
/// shared memory (16-byte copies, rows padded by 16 bytes so `ldmatrix` is free of bank
/// conflicts) and read into B fragments by `ldmatrix` (`.trans` for V). With `nbuf` 2 or 3,
/// a ring of buffers: the next `nbuf - 1` tiles are copied by `cp.async` (completion tracked
/// by one mbarrier per buffer) while this one is used; with `nbuf` 1, one buffer filled by
/// plain loads and stores between two block barriers. Shared memory per block: `nbuf` x 2 x
/// 64 x (d + 8) x 2 bytes (104 KB at d 128 and `nbuf` 3, so two blocks still fit an SM;
/// half that in score mode, which stages K only).
///
/// `warps` (4, or 8 for prefill only) is the block's warp count: a block stages each tile once
/// for all its warps, so 8 warps (128 rows) halve the copies and their address arithmetic per
/// FLOP against 4 (ncu on the 4-warp prefill found the integer pipe the busiest,
/// `docs/perf/flash-attention-kernel-2026-11-30/ncu-prefill-ttft/`; 8 warps measured 5-6%
/// slower in chunks of 2048, `docs/perf/lookahead-half-2026-12-02/prefill-8-warps/`).
/// Verification and score mode take 4.
///
/// The rows attend to a virtual sequence: `vctx` keys (the context `ctx[b]`, or with
/// `sparse` the `counts[b]` positions listed in `idx`) and then the `n_new` new tokens; row
/// token `i` sees virtual keys `0 ..= vctx + i`.
/// - prefill (`verify` false): block `(row block, q head, sequence)` takes `16 warps`
///   consecutive new tokens of one query head, row blocks heaviest first, over all the keys
///   they see; writes `out [b, q_heads, n_new, d]` normalised.
/// - verify: block `(split * rowblocks + row block, slot, sequence)` takes 64 rows
///   `e * n_new + i` of slot `slot` of `table` (`[slots, 2 + heads]`: KV head, head count,
///   query heads; the identity table of the KV heads for verification), row `e * n_new + i`
///   being its `e`-th query head's token `i`, over the virtual keys
///   `split * chunk .. (split + 1) * chunk`, and writes the partial `(max, sum, acc)` of
///   [`combine_kernel`] into `pm`, `pl`, `pacc`.
/// - score (with `verify`, dense): K only, no `P V`, and a block takes 16 rows (a head
///   subset's rows are few: 2 heads x 5 tokens fill 10), which all four warps share, warp
///   `w` taking keys `16 w .. 16 w + 16` of every tile (with one warp computing while three
///   waited at the barrier it ran at 1.9 TB/s, `docs/perf/kernel-gpu-time-2026-11-30/`).
///   Writes every scaled,
///   masked logit to `logits[b, slot, row, key]` (`[b, slots, rpad, lmax]`, `rpad` a
///   multiple of 16) and each warp's partial `(max, sum)` as split `4 split + w` into `pm`,
///   `pl` (`[b, slots, 4 splits, rpad]`), which [`score_reduce_kernel`] turns into
///   probabilities (Dustin's head-subset importance scores).
///
/// Key slots past a block's last key are clamped to it (finite values, masked), so slots
/// past `ctx + n_new` are never read.
///
/// Compiled with fast math for `exp` (`__expf`: one `ex2.approx` and a multiply, where the
/// accurate `expf` is a longer sequence; its error, a few ulp growing with `|x|`, is listed in
/// the CUDA C++ Programming Guide's intrinsic-functions table; the check's float64 rows
/// bound the result). Inputs are finite: masked logits are `f32::MIN`, whose exponentials
/// underflow to 0.
#[cube(
    launch_unchecked,
    fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
)]
#[allow(clippy::too_many_arguments, unused_assignments)]
pub fn flash_kernel<F: Float, I: Int, N: Size>(
    q: &Array<F>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    ctx: &Array<I>,
    idx: &Array<I>,
    counts: &Array<I>,
    table: &Array<I>,
    out: &mut Array<F>,
    pm: &mut Array<f32>,
    pl: &mut Array<f32>,
    pacc: &mut Array<f32>,
    logits: &mut Array<f32>,
    st: &FlashStrides,
    scale: f32,
    n_new: u32,
    group: u32,
    rowblocks: u32,
    chunk: u32,
    splits: u32,
    rpad: u32,
    lmax: u32,
    #[comptime] d: usize,
    #[comptime] nv: usize,
    #[comptime] nbuf: usize,
    #[comptime] verify: bool,
    #[comptime] sparse: bool,
    #[comptime] score: bool,
    #[comptime] warps: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let threads = comptime![warps * 32];
    let rows = comptime![warps * 16];
    let tid = UNIT_POS as usize;
    let warp = tid / 32;
    let lane = tid % 32;
    let g = lane / 4;
    let t4 = lane % 4;
    let n = n_new as usize;
    let grp = group as usize;
    let rowblocks = rowblocks as usize;
    let b = CUBE_POS_Z as usize;
    let ctx_b = u32::cast_from(ctx[b]) as usize;
    let lowest = f32::new(f32::MIN);
    let sqv = comptime![d / nv + 1];
    let kchunks = comptime![d / 16];

    // block coordinates; in verification, block y is a slot of `table` (KV head, head
    // count, query heads)
    let mut rb = 0usize;
    let mut split = 0usize;
    let mut kvh = 0usize;
    let mut qh = 0usize;
    let slot = CUBE_POS_Y as usize;
    let tb = slot * st.table0 as usize;
    let mut hcount = 0usize;
    if comptime![verify] {
        rb = CUBE_POS_X as usize % rowblocks;
        split = CUBE_POS_X as usize / rowblocks;
        kvh = u32::cast_from(table[tb]) as usize;
        hcount = u32::cast_from(table[tb + 1]) as usize;
    } else {
        rb = rowblocks - 1 - CUBE_POS_X as usize;
        qh = CUBE_POS_Y as usize;
        kvh = qh / grp;
    }
    let mut vctx = ctx_b;
    if comptime![sparse] {
        vctx = u32::cast_from(counts[b]) as usize;
    }
    let mut rtot = n;
    if comptime![verify] {
        rtot = hcount * n;
    }
    // this lane's two rows, block rows r0 + g and r0 + g + 8, as (query head, token)
    let mut r0 = rb * rows + warp * 16;
    // score mode: the block's 16 rows are every warp's, and warp w takes keys 16 w .. 16 w +
    // 16 of each tile (its own partial maxima and sums, split `4 split + w`), so all four
    // warps compute where a head subset's rows fill one warp
    if comptime![score] {
        r0 = rb * 16;
    }
    let ra = r0 + g;
    let rc = ra + 8;
    let mut ha = qh;
    let mut ia = ra;
    let mut hc = qh;
    let mut ic = rc;
    let va = ra < rtot;
    let vc = rc < rtot;
    if comptime![verify] {
        if va {
            ha = u32::cast_from(table[tb + 2 + ra / n]) as usize;
        }
        ia = ra % n;
        if vc {
            hc = u32::cast_from(table[tb + 2 + rc / n]) as usize;
        }
        ic = rc % n;
    }
    let active = r0 < rtot;
    // the block's keys kstart .. kend; this warp's rows see none at or past wend
    let mut kstart = 0usize;
    let mut kend = 0usize;
    let mut wend = 0usize;
    if comptime![verify] {
        kstart = split * chunk as usize;
        kend = kstart + chunk as usize;
        if kend > vctx + n {
            kend = vctx + n;
        }
        if kend < kstart {
            kend = kstart;
        }
        wend = kend;
    } else {
        let mut bl = rb * rows + rows;
        if bl > n {
            bl = n;
        }
        kend = vctx + bl;
        let mut wl = r0 + 16;
        if wl > n {
            wl = n;
        }
        wend = vctx + wl;
    }
    // key kp is visible to row a iff kp < lim0 (causal, and inside the block's range)
    let mut lim0 = vctx + ia + 1;
    if lim0 > kend {
        lim0 = kend;
    }
    let mut lim1 = vctx + ic + 1;
    if lim1 > kend {
        lim1 = kend;
    }
    let mut lmin = lim0;
    if lim1 < lmin {
        lmin = lim1;
    }

    // one tile per buffer; with `nbuf` > 1, a ring of buffers: the next `nbuf - 1` tiles are
    // copied (cp.async) while this one is used
    let tsz = comptime![FLASH_KEYS * sqv];
    let mut ks = SharedMemory::<Vector<F, N>>::new_aligned(nbuf * tsz, 16usize);
    // (score mode reads no V)
    let mut vs = SharedMemory::<Vector<F, N>>::new_aligned(
        comptime![if score { 1usize } else { nbuf * tsz }],
        16usize,
    );
    // listed-in-context flags of a selection's keys, per buffer
    let mut kok = SharedMemory::<u32>::new(comptime![nbuf * FLASH_KEYS]);
    // buffer i's tile is complete when every thread arrived on bar_i and its copies landed
    let bar0 = Barrier::shared(comptime![threads as u32], tid == 0);
    let bar1 = Barrier::shared(comptime![threads as u32], tid == 0);
    let bar2 = Barrier::shared(comptime![threads as u32], tid == 0);
    sync_cube();

    let def = cmma::MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    // warps sharing each tile's keys (score mode: all four, warp w the 16 keys at kw)
    let kshare = comptime![if score { 4usize } else { 1usize }];
    let mut kw = 0usize;
    if comptime![score] {
        kw = warp * 16;
    }

    // Q fragments: chunk kc of the head dimension is qa[4 kc .. 4 kc + 4]; register i holds
    // row g + 8 (i % 2), columns 16 kc + 2 t4 + 8 (i / 2) and the next
    let mut qa = Array::<Vector<F, Const<2>>>::new(comptime![d / 4]);
    #[unroll]
    for kc in 0..kchunks {
        #[unroll]
        for i in 0..4usize {
            let col = kc * 16 + t4 * 2 + (i / 2) * 8;
            let mut x0 = F::new(0.0);
            let mut x1 = F::new(0.0);
            let mut ok = va;
            let mut hh = ha;
            let mut tt = ia;
            if i % 2 == 1 {
                ok = vc;
                hh = hc;
                tt = ic;
            }
            if ok {
                let base = b * st.q0 as usize + hh * st.q1 as usize + tt * st.q2 as usize;
                x0 = q[base + col * st.q3 as usize];
                x1 = q[base + (col + 1) * st.q3 as usize];
            }
            let mut vv = Vector::<F, Const<2>>::empty();
            vv[0] = x0;
            vv[1] = x1;
            qa[kc * 4 + i] = vv;
        }
    }
    // O: n-tile j of the head dimension (8 columns) is oacc[2 j] (row g) and oacc[2 j + 1]
    // (row g + 8), columns 8 j + 2 t4 and the next
    let mut oacc = Array::<Vector<f32, Const<2>>>::new(comptime![d / 4]);
    #[unroll]
    for i in 0..comptime![d / 4] {
        oacc[i] = Vector::<f32, Const<2>>::cast_from(0.0f32);
    }
    let mut m0 = lowest;
    let mut m1 = lowest;
    let mut l0 = 0.0f32;
    let mut l1 = 0.0f32;

    let kb = b * st.k0 as usize + kvh * st.k1 as usize;
    let vb = b * st.v0 as usize + kvh * st.v1 as usize;
    let ib = b * st.idx0 as usize + kvh * st.idx1 as usize;
    let (i2s, k2s, v2s) = (st.idx2 as usize, st.k2 as usize, st.v2 as usize);
    if comptime![nbuf > 1] {
        // prologue: the first nbuf - 1 tiles into buffers 0 .. nbuf - 1
        #[unroll]
        for pre in 0..comptime![nbuf - 1] {
            let tp = kstart + pre * FLASH_KEYS;
            if tp < kend {
                flash_stage::<F, I, N>(
                    k, v, idx, ib, i2s, k2s, v2s, &mut ks, &mut vs, &mut kok, kb, vb, vctx, ctx_b,
                    tp, kend, pre, tid, d, nv, true, sparse, !score, threads,
                );
                if pre == 0 {
                    bar0.commit_copy_async();
                    let _a = bar0.arrive();
                } else {
                    bar1.commit_copy_async();
                    let _a = bar1.arrive();
                }
            }
        }
    }
    let mut t0 = kstart;
    let mut tile = 0usize;
    while t0 < kend {
        let mut sb = 0usize;
        if comptime![nbuf > 1] {
            sb = tile % nbuf;
            // copy tile + nbuf - 1 into its buffer (read last by tile - 1, which every warp
            // finished at its closing barrier), then wait for this one
            let tn = t0 + (nbuf - 1) * FLASH_KEYS;
            if tn < kend {
                let nb = (tile + nbuf - 1) % nbuf;
                flash_stage::<F, I, N>(
                    k, v, idx, ib, i2s, k2s, v2s, &mut ks, &mut vs, &mut kok, kb, vb, vctx, ctx_b,
                    tn, kend, nb, tid, d, nv, true, sparse, !score, threads,
                );
                if nb == 0 {
                    bar0.commit_copy_async();
                    let _a = bar0.arrive();
                } else if nb == 1 {
                    bar1.commit_copy_async();
                    let _a = bar1.arrive();
                } else {
                    bar2.commit_copy_async();
                    let _a = bar2.arrive();
                }
            }
            // buffer sb's use number tile / nbuf completes its phase of that parity
            let ph = ((tile / nbuf) % 2) as u32;
            if sb == 0 {
                bar0.wait_parity(ph);
            } else if sb == 1 {
                bar1.wait_parity(ph);
            } else {
                bar2.wait_parity(ph);
            }
        } else {
            // stage the tile with plain 16-byte loads and stores between two barriers
            flash_stage::<F, I, N>(
                k, v, idx, ib, i2s, k2s, v2s, &mut ks, &mut vs, &mut kok, kb, vb, vctx, ctx_b, t0,
                kend, 0, tid, d, nv, false, sparse, !score, threads,
            );
            sync_cube();
        }
        let so = sb * tsz;

        if active && t0 < wend {
            // S = Q K^T: key n-tile j (8 keys) is sacc[2 j] (row g), sacc[2 j + 1] (row g + 8)
            let mut sacc = Array::<Vector<f32, Const<2>>>::new(comptime![FLASH_KEYS / 4 / kshare]);
            #[unroll]
            for i in 0..comptime![FLASH_KEYS / 4 / kshare] {
                sacc[i] = Vector::<f32, Const<2>>::cast_from(0.0f32);
            }
            // ldmatrix x4: lane l addresses row l % 8 of matrix l / 8 = (key half, dim half)
            let mj = lane / 8;
            let mrow = lane % 8;
            #[unroll]
            for kc in 0..kchunks {
                #[unroll]
                for np in 0..comptime![4 / kshare] {
                    let key = kw + np * 16 + (mj / 2) * 8 + mrow;
                    let off = so + key * sqv + kc * 2 + mj % 2;
                    let bk = def.load_matrix::<Vector<F, N>, Const<2>>(
                        &ks.slice(off, off + 1),
                        MatrixIdent::B,
                        4usize,
                        false,
                    );
                    mma_16816::<F>(def, &qa, kc * 4, bk[0], bk[1], &mut sacc, np * 4);
                    mma_16816::<F>(def, &qa, kc * 4, bk[2], bk[3], &mut sacc, np * 4 + 2);
                }
            }
            // scale; mask (causal, the block's range, unlisted selections) where the tile
            // reaches a limit; row maxima over the quad
            let diag = t0 + FLASH_KEYS > lmin;
            let lgb = (b * CUBE_COUNT_Y as usize + slot) * rpad as usize * lmax as usize;
            let mut mx0 = lowest;
            let mut mx1 = lowest;
            #[unroll]
            for j in 0..comptime![8 / kshare] {
                let mut s0 = sacc[2 * j];
                let mut s1 = sacc[2 * j + 1];
                #[unroll]
                for e in 0..2usize {
                    let kl = kw + j * 8 + t4 * 2 + e;
                    let kp = t0 + kl;
                    let mut a = s0[e] * scale;
                    let mut c = s1[e] * scale;
                    if diag {
                        if kp >= lim0 {
                            a = lowest;
                        }
                        if kp >= lim1 {
                            c = lowest;
                        }
                    }
                    if comptime![sparse] {
                        if kok[sb * FLASH_KEYS + kl] == 0 {
                            a = lowest;
                            c = lowest;
                        }
                    }
                    s0[e] = a;
                    s1[e] = c;
                    if comptime![score] {
                        // the scaled, masked logit of every key of the block's range
                        if kp < kend {
                            if va {
                                logits[lgb + ra * lmax as usize + kp] = a;
                            }
                            if vc {
                                logits[lgb + rc * lmax as usize + kp] = c;
                            }
                        }
                    }
                    if a > mx0 {
                        mx0 = a;
                    }
                    if c > mx1 {
                        mx1 = c;
                    }
                }
                sacc[2 * j] = s0;
                sacc[2 * j + 1] = s1;
            }
            let xa = plane_shuffle_xor(mx0, 1u32);
            if xa > mx0 {
                mx0 = xa;
            }
            let xb = plane_shuffle_xor(mx0, 2u32);
            if xb > mx0 {
                mx0 = xb;
            }
            let xc = plane_shuffle_xor(mx1, 1u32);
            if xc > mx1 {
                mx1 = xc;
            }
            let xd = plane_shuffle_xor(mx1, 2u32);
            if xd > mx1 {
                mx1 = xd;
            }
            let mut mn0 = m0;
            if mx0 > mn0 {
                mn0 = mx0;
            }
            let mut mn1 = m1;
            if mx1 > mn1 {
                mn1 = mx1;
            }
            let al0 = (m0 - mn0).exp();
            let al1 = (m1 - mn1).exp();
            m0 = mn0;
            m1 = mn1;
            // the reference the probabilities subtract: the row maximum, or 0 while every key
            // of the row so far was masked (then exp(lowest - 0) = 0, where
            // exp(lowest - lowest) would be 1)
            let mut me0 = mn0;
            if mn0 == lowest {
                me0 = 0.0f32;
            }
            let mut me1 = mn1;
            if mn1 == lowest {
                me1 = 0.0f32;
            }
            // P = exp(S - m) (0 where masked: exp(lowest - m) underflows) as the A fragments
            // of P V: key chunk c (16 keys) is pa[4 c .. 4 c + 4] = (sacc[4 c], sacc[4 c + 1],
            // sacc[4 c + 2], sacc[4 c + 3])
            let mut pa = Array::<Vector<F, Const<2>>>::new(comptime![FLASH_KEYS / 4 / kshare]);
            let mut ps0 = 0.0f32;
            let mut ps1 = 0.0f32;
            #[unroll]
            for j in 0..comptime![8 / kshare] {
                let s0 = sacc[2 * j];
                let s1 = sacc[2 * j + 1];
                let mut p0 = Vector::<F, Const<2>>::empty();
                let mut p1 = Vector::<F, Const<2>>::empty();
                #[unroll]
                for e in 0..2usize {
                    let a = (s0[e] - me0).exp();
                    let c = (s1[e] - me1).exp();
                    ps0 += a;
                    ps1 += c;
                    p0[e] = F::cast_from(a);
                    p1[e] = F::cast_from(c);
                }
                pa[2 * j] = p0;
                pa[2 * j + 1] = p1;
            }
            l0 = l0 * al0 + ps0;
            l1 = l1 * al1 + ps1;
            if comptime![!score] {
                #[unroll]
                for j in 0..comptime![d / 8] {
                    let mut o0 = oacc[2 * j];
                    let mut o1 = oacc[2 * j + 1];
                    o0[0] = o0[0] * al0;
                    o0[1] = o0[1] * al0;
                    o1[0] = o1[0] * al1;
                    o1[1] = o1[1] * al1;
                    oacc[2 * j] = o0;
                    oacc[2 * j + 1] = o1;
                }
                // O += P V: ldmatrix x4 .trans, lane l addresses row l % 8 of matrix
                // l / 8 = (key half l / 8 % 2, dim half l / 16)
                #[unroll]
                for kc in 0..4usize {
                    #[unroll]
                    for dp in 0..comptime![d / 16] {
                        let key = kc * 16 + (mj % 2) * 8 + mrow;
                        let off = so + key * sqv + dp * 2 + mj / 2;
                        let bv = def.load_matrix::<Vector<F, N>, Const<2>>(
                            &vs.slice(off, off + 1),
                            MatrixIdent::B,
                            4usize,
                            true,
                        );
                        mma_16816::<F>(def, &pa, kc * 4, bv[0], bv[1], &mut oacc, dp * 4);
                        mma_16816::<F>(def, &pa, kc * 4, bv[2], bv[3], &mut oacc, dp * 4 + 2);
                    }
                }
            }
        }
        sync_cube();
        t0 += FLASH_KEYS;
        tile += 1;
    }

    // row sums over the quad
    let ya = plane_shuffle_xor(l0, 1u32);
    l0 += ya;
    let yb = plane_shuffle_xor(l0, 2u32);
    l0 += yb;
    let yc = plane_shuffle_xor(l1, 1u32);
    l1 += yc;
    let yd = plane_shuffle_xor(l1, 2u32);
    l1 += yd;
    if comptime![verify] {
        // partial (max, sum, unnormalised acc) of the rows for combine_kernel
        let rpad = rpad as usize;
        let mut wsplits = splits as usize;
        let mut wsplit = split;
        if comptime![score] {
            wsplits = 4 * splits as usize;
            wsplit = 4 * split + warp;
        }
        let pb = ((b * CUBE_COUNT_Y as usize + slot) * wsplits + wsplit) * rpad;
        if va && t4 == 0 {
            pm[pb + ra] = m0;
            pl[pb + ra] = l0;
        }
        if vc && t4 == 0 {
            pm[pb + rc] = m1;
            pl[pb + rc] = l1;
        }
        #[unroll]
        for j in 0..comptime![if score { 0usize } else { d / 8 }] {
            let col = j * 8 + t4 * 2;
            let o0 = oacc[2 * j];
            let o1 = oacc[2 * j + 1];
            if va {
                let base = (pb + ra) * d + col;
                pacc[base] = o0[0];
                pacc[base + 1] = o0[1];
            }
            if vc {
                let base = (pb + rc) * d + col;
                pacc[base] = o1[0];
                pacc[base + 1] = o1[1];
            }
        }
    } else {
        // O / l, rows inside the chunk only
        let inv0 = 1.0f32 / l0;
        let inv1 = 1.0f32 / l1;
        let ob = b * st.out0 as usize + qh * st.out1 as usize;
        #[unroll]
        for j in 0..comptime![d / 8] {
            let col = j * 8 + t4 * 2;
            let o0 = oacc[2 * j];
            let o1 = oacc[2 * j + 1];
            if va {
                let base = ob + ra * st.out2 as usize + col;
                out[base] = F::cast_from(o0[0] * inv0);
                out[base + 1] = F::cast_from(o0[1] * inv0);
            }
            if vc {
                let base = ob + rc * st.out2 as usize + col;
                out[base] = F::cast_from(o1[0] * inv1);
                out[base + 1] = F::cast_from(o1[1] * inv1);
            }
        }
    }
}

/// Query rows per warp of [`prefill_kernel`]: two 16-row m-tiles.
pub const PREFILL2_WARP_ROWS: usize = 32;
/// Query rows per block of [`prefill_kernel`] (4 warps).
pub const PREFILL2_ROWS: usize = 4 * PREFILL2_WARP_ROWS;

/// Causal GQA prefill attention with two 16-row m-tiles per warp, FlashAttention-2's
/// layout for head dimension 128 on sm80 (Dao, "FlashAttention-2", 2023, section 3.3 and
/// its `Flash_fwd_kernel_traits<128, 128, 64, 4>`: 128 query rows a block of 4 warps, Q read
/// from shared memory every tile).
///
/// Against [`flash_kernel`]'s prefill (16 rows a warp, Q fragments in registers), every
/// `ldmatrix` of a K or V fragment feeds both m-tiles: 0.31 shared-memory fragment loads per
/// `mma.m16n8k16` instead of 0.5, and each warp has two independent MMA chains per
/// fragment (more to issue while a load is in flight at the 2 blocks an SM its registers
/// allow). The Q tile `[128, d]` is staged once per block in shared memory (row stride
/// `d / nv + 1` vectors, as the K/V tiles) and read into A fragments by `ldmatrix` for each
/// 16-column chunk of every key tile (64 registers a thread fewer than keeping both
/// m-tiles' fragments resident). Each staged tile is computed in steps of `kstep` keys (64:
/// the tile at once; 32: two online-softmax updates, half the score registers), and the
/// accumulators are rescaled only when a row maximum of the warp moved. The softmax works
/// on the raw scores: the causal mask only in a step that reaches a row's limit, maxima by
/// `max`, and `exp(scale s - scale m)` as one `fma` and `exp` (FlashAttention-2's folding
/// of the scale); that cut a tile's instructions from 1535 to 1278 (SASS and ptxas output in
/// `docs/perf/prefill-softmax-chunks-2026-12-03/softmax-fewer-instructions/`: 255 registers a
/// thread, 252 with `kv_apart`). With
/// `kv_apart` (the automatic choice) each copy's offsets come from per-thread terms the
/// kernel computes once ([`prefill_stage`]).
///
/// Block `(row block, q head, sequence)`, row blocks heaviest first, in runs of `heads_x`
/// query heads (a divisor of `q_heads`): x runs over a run's heads fastest, then its row
/// blocks, y over the runs (every head of a run starts its heaviest block before any starts
/// a lighter one; `heads_x` 1: row blocks along x, heads along y): new tokens
/// `128 rb .. 128 rb + 128` of query head `qh` (KV head `qh / group`) against the virtual keys
/// `0 ..= ctx[b] + i` (the cached context, then the new tokens; row `i` sees its own key);
/// writes `out [b, q_heads, n_new, d]` normalised. K/V tiles of [`FLASH_KEYS`] keys are
/// staged by [`flash_stage`] into a ring of `nbuf` buffers (`cp.async` with one mbarrier per
/// buffer; `nbuf` 1: plain loads between two block barriers), or with `kv_apart` (`nbuf` 1,
/// `kstep` 64) into one K and one V buffer by [`prefill_stage`], each with its own
/// mbarrier, FlashAttention-2's schedule: a tile's V is in flight during its scores
/// ([`prefill_scores`]), the next tile's K during its `P V` ([`prefill_pv`]). Shared memory per block:
/// `128 (d + 8) 2` bytes of Q and `nbuf 2 64 (d + 8) 2` of K/V (104 KB at d 128, `nbuf` 2).
/// Row maxima and sums are reduced over the quad by two shuffles as in [`flash_kernel`]
/// (`exp` as `__expf`, masked logits `f32::MIN`), but on raw scores (above). `scale` must
/// be positive (maxima of raw scores are then those of the scaled ones). `slack`: how far
/// (raw-score units, `>= 0`) a tile's row maximum may pass the row's reference maximum before
/// the reference moves and the accumulators are rescaled (FlashAttention-4's conditional
/// rescaling; `RESCALE_SLACK / scale` keeps every probability below `e^8`).
#[cube(
    launch_unchecked,
    fast_math = FastMath::ReducedPrecision | FastMath::NotNaN | FastMath::NotInf
)]
#[allow(clippy::too_many_arguments, unused_assignments)]
pub fn prefill_kernel<F: Float, I: Int, N: Size>(
    q: &Array<F>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    ctx: &Array<I>,
    out: &mut Array<F>,
    st: &FlashStrides,
    scale: f32,
    slack: f32,
    n_new: u32,
    group: u32,
    rowblocks: u32,
    heads_x: u32,
    #[comptime] d: usize,
    #[comptime] nv: usize,
    #[comptime] nbuf: usize,
    #[comptime] kstep: usize,
    #[comptime] kv_apart: bool,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let threads = comptime![128usize];
    let rows = comptime![PREFILL2_ROWS];
    let tid = UNIT_POS as usize;
    let warp = tid / 32;
    let lane = tid % 32;
    let g = lane / 4;
    let t4 = lane % 4;
    let n = n_new as usize;
    let grp = group as usize;
    let b = CUBE_POS_Z as usize;
    let ctx_b = u32::cast_from(ctx[b]) as usize;
    let lowest = f32::new(f32::MIN);
    let vpr = comptime![d / nv];
    let sqv = comptime![d / nv + 1];
    let otiles = comptime![d / 4];
    // runs of `heads_x` query heads along x (x = heads_x (rowblocks - 1 - rb) + qh % heads_x,
    // y = qh / heads_x): each run's heaviest row blocks before any lighter one
    let hx = heads_x as usize;
    let rb = rowblocks as usize - 1 - CUBE_POS_X as usize / hx;
    let qh = CUBE_POS_X as usize % hx + CUBE_POS_Y as usize * hx;
    let kvh = qh / grp;
    let vctx = ctx_b;

    // this warp's rows: m-tile mi holds rows r0 + 16 mi + g and r0 + 16 mi + g + 8
    let r0 = rb * rows + warp * PREFILL2_WARP_ROWS;
    let active = r0 < n;
    // the block's keys end at kend; this warp's rows see none at or past wend
    let mut bl = rb * rows + rows;
    if bl > n {
        bl = n;
    }
    let kend = vctx + bl;
    let mut wl = r0 + PREFILL2_WARP_ROWS;
    if wl > n {
        wl = n;
    }
    let wend = vctx + wl;
    // key kp is visible to this lane's row j (m-tile j / 2, half j % 2) iff kp < lim[j]
    let mut lim = Array::<usize>::new(4usize);
    #[unroll]
    for j in 0..4usize {
        let row = r0 + (j / 2) * 16 + (j % 2) * 8 + g;
        let mut l = vctx + row + 1;
        if l > kend {
            l = kend;
        }
        lim[j] = l;
    }
    let lmin = lim[0];

    let mut qs = SharedMemory::<Vector<F, N>>::new_aligned(comptime![rows * sqv], 16usize);
    let tsz = comptime![FLASH_KEYS * sqv];
    let mut ks = SharedMemory::<Vector<F, N>>::new_aligned(comptime![nbuf * tsz], 16usize);
    let mut vs = SharedMemory::<Vector<F, N>>::new_aligned(comptime![nbuf * tsz], 16usize);
    // (unused: dense keys are all listed)
    let mut kok = SharedMemory::<u32>::new(comptime![nbuf * FLASH_KEYS]);
    let bar0 = Barrier::shared(comptime![threads as u32], tid == 0);
    let bar1 = Barrier::shared(comptime![threads as u32], tid == 0);
    let bar2 = Barrier::shared(comptime![threads as u32], tid == 0);
    sync_cube();

    let def = cmma::MmaDefinition::<F, F, f32>::new(16usize, 8usize, 16usize);
    // O of m-tile mi: n-tile j (8 columns) is oacc[otiles mi + 2 j] (row g) and
    // oacc[otiles mi + 2 j + 1] (row g + 8), columns 8 j + 2 t4 and the next
    let mut oacc = Array::<Vector<f32, Const<2>>>::new(comptime![2 * d / 4]);
    #[unroll]
    for i in 0..comptime![2 * d / 4] {
        oacc[i] = Vector::<f32, Const<2>>::cast_from(0.0f32);
    }
    // running maxima and sums of the lane's four rows (index as lim)
    let mut mrun = Array::<f32>::new(4usize);
    let mut lrun = Array::<f32>::new(4usize);
    #[unroll]
    for j in 0..4usize {
        mrun[j] = lowest;
        lrun[j] = 0.0f32;
    }

    // ldmatrix x4: lane l addresses row l % 8 of matrix l / 8
    let mj = lane / 8;
    let mrow = lane % 8;
    // A (Q): matrix mj = (row half mj % 2, column half mj / 2)
    let qoff = (warp * PREFILL2_WARP_ROWS + (mj % 2) * 8 + mrow) * sqv + mj / 2;
    // B (K): matrix mj = (key half mj / 2, column half mj % 2)
    let koff = ((mj / 2) * 8 + mrow) * sqv + mj % 2;
    // B (V, transposed): matrix mj = (key half mj % 2, column half mj / 2)
    let voff = ((mj % 2) * 8 + mrow) * sqv + mj / 2;

    let kb = b * st.k0 as usize + kvh * st.k1 as usize;
    let vb = b * st.v0 as usize + kvh * st.v1 as usize;
    let (k2s, v2s) = (st.k2 as usize, st.v2 as usize);
    // `prefill_stage`'s per-thread terms (K and V staged apart): this thread's column vector
    // and first row of a tile, in vectors (element offsets and strides are multiples of nv)
    let srow = tid / vpr;
    let scol = tid % vpr;
    let (kvb, vvb) = (kb / nv + scol, vb / nv + scol);
    let (k2v, v2v) = (k2s / nv, v2s / nv);
    let sob = srow * sqv + scol;
    let klast = kend - 1;
    if comptime![nbuf > 1] {
        #[unroll]
        for pre in 0..comptime![nbuf - 1] {
            let tp = pre * FLASH_KEYS;
            if tp < kend {
                flash_stage::<F, I, N>(
                    k, v, ctx, 0usize, 0usize, k2s, v2s, &mut ks, &mut vs, &mut kok, kb, vb, vctx,
                    ctx_b, tp, kend, pre, tid, d, nv, true, false, true, threads,
                );
                if pre == 0 {
                    bar0.commit_copy_async();
                    let _a = bar0.arrive();
                } else {
                    bar1.commit_copy_async();
                    let _a = bar1.arrive();
                }
            }
        }
    }
    if comptime![kv_apart] {
        // K and V of the first tile in flight while Q is staged
        prefill_stage::<F, N>(k, &mut ks, kvb, k2v, srow, klast, sob, d, nv, threads);
        bar0.commit_copy_async();
        let _a = bar0.arrive();
        prefill_stage::<F, N>(v, &mut vs, vvb, v2v, srow, klast, sob, d, nv, threads);
        bar1.commit_copy_async();
        let _a = bar1.arrive();
    }
    // Q tile of the block's rows (zeros past n_new), 16-byte vectors, padded rows
    let qb = b * st.q0 as usize + qh * st.q1 as usize;
    let mut e = tid;
    while e < rows * vpr {
        let r = e / vpr;
        let c = e % vpr;
        let i = rb * rows + r;
        let mut vv = Vector::<F, N>::empty();
        #[unroll]
        for x in 0..nv {
            let mut val = F::new(0.0);
            if i < n {
                val = q[qb + i * st.q2 as usize + (c * nv + x) * st.q3 as usize];
            }
            vv[x] = val;
        }
        qs[r * sqv + c] = vv;
        e += threads;
    }

    sync_cube();
    // P of the current tile (bf16 A fragments of both m-tiles), from `prefill_scores` to
    // `prefill_pv`
    let mut pa = Array::<Vector<F, Const<2>>>::new(comptime![2 * kstep / 4]);

    let mut t0 = 0usize;
    let mut tile = 0usize;
    while t0 < kend {
        if comptime![kv_apart] {
            // FlashAttention-2's schedule with one K and one V buffer: V of this tile was
            // staged during the previous tile's P V, K of the next one is staged during this
            // tile's P V, and V of the next one during its scores
            let ph = (tile % 2) as u32;
            let comp = active && t0 < wend;
            bar0.wait_parity(ph);
            if comp {
                prefill_scores::<F, N>(
                    def, &qs, &ks, &mut pa, &mut oacc, &mut mrun, &mut lrun, &lim, 0usize, qoff,
                    koff, t0, lmin, t4, scale, slack, d, nv, kstep,
                );
            }
            sync_cube();
            let more = t0 + FLASH_KEYS < kend;
            if more {
                prefill_stage::<F, N>(
                    k,
                    &mut ks,
                    kvb,
                    k2v,
                    t0 + FLASH_KEYS + srow,
                    klast,
                    sob,
                    d,
                    nv,
                    threads,
                );
                bar0.commit_copy_async();
                let _a = bar0.arrive();
            }
            bar1.wait_parity(ph);
            if comp {
                prefill_pv::<F, N>(def, &vs, &pa, &mut oacc, 0usize, voff, d, nv, kstep);
            }
            sync_cube();
            if more {
                prefill_stage::<F, N>(
                    v,
                    &mut vs,
                    vvb,
                    v2v,
                    t0 + FLASH_KEYS + srow,
                    klast,
                    sob,
                    d,
                    nv,
                    threads,
                );
                bar1.commit_copy_async();
                let _a = bar1.arrive();
            }
        } else {
            let mut sb = 0usize;
            if comptime![nbuf > 1] {
                sb = tile % nbuf;
                let tn = t0 + (nbuf - 1) * FLASH_KEYS;
                if tn < kend {
                    let nb = (tile + nbuf - 1) % nbuf;
                    flash_stage::<F, I, N>(
                        k, v, ctx, 0usize, 0usize, k2s, v2s, &mut ks, &mut vs, &mut kok, kb, vb,
                        vctx, ctx_b, tn, kend, nb, tid, d, nv, true, false, true, threads,
                    );
                    if nb == 0 {
                        bar0.commit_copy_async();
                        let _a = bar0.arrive();
                    } else if nb == 1 {
                        bar1.commit_copy_async();
                        let _a = bar1.arrive();
                    } else {
                        bar2.commit_copy_async();
                        let _a = bar2.arrive();
                    }
                }
                let ph = ((tile / nbuf) % 2) as u32;
                if sb == 0 {
                    bar0.wait_parity(ph);
                } else if sb == 1 {
                    bar1.wait_parity(ph);
                } else {
                    bar2.wait_parity(ph);
                }
            } else {
                flash_stage::<F, I, N>(
                    k, v, ctx, 0usize, 0usize, k2s, v2s, &mut ks, &mut vs, &mut kok, kb, vb, vctx,
                    ctx_b, t0, kend, 0, tid, d, nv, false, false, true, threads,
                );
                sync_cube();
            }
            let so = sb * tsz;

            // the staged tile in compute steps of `kstep` keys, each its own online-softmax
            // update (32 keys halve the score registers; the accumulators are rescaled only
            // where a row maximum moved)
            #[unroll]
            for hs in 0..comptime![FLASH_KEYS / kstep] {
                let ko = hs * kstep;
                if active && t0 + ko < wend {
                    prefill_scores::<F, N>(
                        def,
                        &qs,
                        &ks,
                        &mut pa,
                        &mut oacc,
                        &mut mrun,
                        &mut lrun,
                        &lim,
                        so + ko * sqv,
                        qoff,
                        koff,
                        t0 + ko,
                        lmin,
                        t4,
                        scale,
                        slack,
                        d,
                        nv,
                        kstep,
                    );
                    prefill_pv::<F, N>(def, &vs, &pa, &mut oacc, so + ko * sqv, voff, d, nv, kstep);
                }
            }
            sync_cube();
        }
        t0 += FLASH_KEYS;
        tile += 1;
    }

    // row sums over the quad, O / l, rows inside the chunk only
    let ob = b * st.out0 as usize + qh * st.out1 as usize;
    #[unroll]
    for j in 0..4usize {
        let mut l = lrun[j];
        let ya = plane_shuffle_xor(l, 1u32);
        l += ya;
        let yb = plane_shuffle_xor(l, 2u32);
        l += yb;
        let inv = 1.0f32 / l;
        let row = r0 + (j / 2) * 16 + (j % 2) * 8 + g;
        if row < n {
            #[unroll]
            for c in 0..comptime![d / 8] {
                let col = c * 8 + t4 * 2;
                let o = oacc[otiles * (j / 2) + 2 * c + j % 2];
                let base = ob + row * st.out2 as usize + col;
                out[base] = F::cast_from(o[0] * inv);
                out[base + 1] = F::cast_from(o[1] * inv);
            }
        }
    }
}

/// The scores half of one compute step of [`prefill_kernel`] over the `kstep` (32 or 64)
/// staged keys at shared-memory offset `so` (virtual keys `t0 ..`): `S = Q K^T` for both
/// m-tiles of the warp (each K fragment load feeding both), the causal mask where the step
/// reaches a row's limit `lim`, the online softmax of the lane's four rows on the raw scores
/// (`mrun` raw reference maxima, moved only where the step's maximum passes them by more
/// than `slack` raw units, so `P <= exp(scale slack)`; `lrun` sums; `exp(scale s - scale m)`
/// as one `fma` and `exp`; the accumulators `oacc` rescaled only when a reference maximum of
/// the warp moved), and the
/// probabilities into `pa` (bf16 A fragments of `P V`, m-tile `mi`'s key n-tile `j` at
/// `pa[kstep / 4 mi + 2 j]`, rows `g` and `g + 8`). `qoff`, `koff`: this lane's `ldmatrix`
/// row offsets into the Q and K tiles.
#[cube]
#[allow(clippy::too_many_arguments)]
fn prefill_scores<F: Float, N: Size>(
    def: cmma::MmaDefinition<F, F, f32>,
    qs: &SharedMemory<Vector<F, N>>,
    ks: &SharedMemory<Vector<F, N>>,
    pa: &mut Array<Vector<F, Const<2>>>,
    oacc: &mut Array<Vector<f32, Const<2>>>,
    mrun: &mut Array<f32>,
    lrun: &mut Array<f32>,
    lim: &Array<usize>,
    so: usize,
    qoff: usize,
    koff: usize,
    t0: usize,
    lmin: usize,
    t4: usize,
    scale: f32,
    slack: f32,
    #[comptime] d: usize,
    #[comptime] nv: usize,
    #[comptime] kstep: usize,
) {
    let lowest = f32::new(f32::MIN);
    let sqv = comptime![d / nv + 1];
    let otiles = comptime![d / 4];
    // per m-tile: kstep / 8 key n-tiles of two rows each
    let mst = comptime![kstep / 4];
    // S: m-tile mi, key n-tile j is sacc[mst mi + 2 j] (row g), sacc[mst mi + 2 j + 1]
    let mut sacc = Array::<Vector<f32, Const<2>>>::new(comptime![2 * kstep / 4]);
    #[unroll]
    for i in 0..comptime![2 * kstep / 4] {
        sacc[i] = Vector::<f32, Const<2>>::cast_from(0.0f32);
    }
    #[unroll]
    for kc in 0..comptime![d / 16] {
        let o0 = qoff + kc * 2;
        let qa0 = def.load_matrix::<Vector<F, N>, Const<2>>(
            &qs.slice(o0, o0 + 1),
            MatrixIdent::A,
            4usize,
            false,
        );
        let o1 = qoff + 16 * sqv + kc * 2;
        let qa1 = def.load_matrix::<Vector<F, N>, Const<2>>(
            &qs.slice(o1, o1 + 1),
            MatrixIdent::A,
            4usize,
            false,
        );
        #[unroll]
        for np in 0..comptime![kstep / 16] {
            let off = so + koff + np * 16 * sqv + kc * 2;
            let bk = def.load_matrix::<Vector<F, N>, Const<2>>(
                &ks.slice(off, off + 1),
                MatrixIdent::B,
                4usize,
                false,
            );
            mma_16816::<F>(def, &qa0, 0usize, bk[0], bk[1], &mut sacc, np * 4);
            mma_16816::<F>(def, &qa0, 0usize, bk[2], bk[3], &mut sacc, np * 4 + 2);
            mma_16816::<F>(def, &qa1, 0usize, bk[0], bk[1], &mut sacc, mst + np * 4);
            mma_16816::<F>(def, &qa1, 0usize, bk[2], bk[3], &mut sacc, mst + np * 4 + 2);
        }
    }
    // the causal mask, only in a step that reaches one of the lane's rows' limits (`lmin`,
    // its smallest: lanes of one warp can disagree, each masking its own rows; the steps
    // before the diagonal branch over it)
    if t0 + kstep > lmin {
        #[unroll]
        for mi in 0..2usize {
            let la = lim[2 * mi];
            let lc = lim[2 * mi + 1];
            #[unroll]
            for j in 0..comptime![kstep / 8] {
                let mut s0 = sacc[mst * mi + 2 * j];
                let mut s1 = sacc[mst * mi + 2 * j + 1];
                #[unroll]
                for x in 0..2usize {
                    let kp = t0 + j * 8 + t4 * 2 + x;
                    s0[x] = select(kp >= la, lowest, s0[x]);
                    s1[x] = select(kp >= lc, lowest, s1[x]);
                }
                sacc[mst * mi + 2 * j] = s0;
                sacc[mst * mi + 2 * j + 1] = s1;
            }
        }
    }
    // the online softmax on the raw scores (the scale is positive, so their maxima are the
    // scaled scores' maxima divided by it): `exp(scale s - scale m)` as one `fma` and `exp`
    // (FlashAttention-2 folds the scale the same way); `mrun` holds raw maxima
    let mut alpha = Array::<f32>::new(4usize);
    let mut moved = false;
    #[unroll]
    for mi in 0..2usize {
        let mut mx0 = lowest;
        let mut mx1 = lowest;
        #[unroll]
        for j in 0..comptime![kstep / 8] {
            let s0 = sacc[mst * mi + 2 * j];
            let s1 = sacc[mst * mi + 2 * j + 1];
            mx0 = max(mx0, max(s0[0], s0[1]));
            mx1 = max(mx1, max(s1[0], s1[1]));
        }
        mx0 = max(mx0, plane_shuffle_xor(mx0, 1u32));
        mx0 = max(mx0, plane_shuffle_xor(mx0, 2u32));
        mx1 = max(mx1, plane_shuffle_xor(mx1, 1u32));
        mx1 = max(mx1, plane_shuffle_xor(mx1, 2u32));
        // a reference maximum moves only where the step's maximum passes it by more than
        // `slack` (raw units; 0: wherever it passes it)
        let m0 = mrun[2 * mi];
        let m1 = mrun[2 * mi + 1];
        let up0 = mx0 > m0 + slack;
        let up1 = mx1 > m1 + slack;
        let mn0 = select(up0, mx0, m0);
        let mn1 = select(up1, mx1, m1);
        if up0 || up1 {
            moved = true;
        }
        alpha[2 * mi] = ((m0 - mn0) * scale).exp();
        alpha[2 * mi + 1] = ((m1 - mn1) * scale).exp();
        mrun[2 * mi] = mn0;
        mrun[2 * mi + 1] = mn1;
        // 0 while every key of the row so far was masked (see flash_kernel): masked raw
        // scores, f32::MIN, then give exp(scale f32::MIN) = 0
        let nm0 = select(mn0 == lowest, 0.0f32, -(mn0 * scale));
        let nm1 = select(mn1 == lowest, 0.0f32, -(mn1 * scale));
        let mut ps0 = 0.0f32;
        let mut ps1 = 0.0f32;
        #[unroll]
        for j in 0..comptime![kstep / 8] {
            let s0 = sacc[mst * mi + 2 * j];
            let s1 = sacc[mst * mi + 2 * j + 1];
            let mut p0 = Vector::<F, Const<2>>::empty();
            let mut p1 = Vector::<F, Const<2>>::empty();
            #[unroll]
            for x in 0..2usize {
                let a = fma(s0[x], scale, nm0).exp();
                let c = fma(s1[x], scale, nm1).exp();
                ps0 += a;
                ps1 += c;
                p0[x] = F::cast_from(a);
                p1[x] = F::cast_from(c);
            }
            pa[mst * mi + 2 * j] = p0;
            pa[mst * mi + 2 * j + 1] = p1;
        }
        lrun[2 * mi] = lrun[2 * mi] * alpha[2 * mi] + ps0;
        lrun[2 * mi + 1] = lrun[2 * mi + 1] * alpha[2 * mi + 1] + ps1;
    }
    // where no maximum of the warp moved every alpha is exactly 1: skip the rescale
    if plane_any(moved) {
        #[unroll]
        for mi in 0..2usize {
            let al0 = alpha[2 * mi];
            let al1 = alpha[2 * mi + 1];
            #[unroll]
            for j in 0..comptime![d / 8] {
                let mut o0 = oacc[otiles * mi + 2 * j];
                let mut o1 = oacc[otiles * mi + 2 * j + 1];
                o0[0] = o0[0] * al0;
                o0[1] = o0[1] * al0;
                o1[0] = o1[0] * al1;
                o1[1] = o1[1] * al1;
                oacc[otiles * mi + 2 * j] = o0;
                oacc[otiles * mi + 2 * j + 1] = o1;
            }
        }
    }
}

/// The `O += P V` half of one compute step of [`prefill_kernel`]: the probabilities `pa` of
/// [`prefill_scores`] against the `kstep` staged V rows at shared-memory offset `so`, one
/// `ldmatrix` x4 `.trans` of V feeding both m-tiles. `voff`: this lane's `ldmatrix` row
/// offset into the V tile.
#[cube]
#[allow(clippy::too_many_arguments)]
fn prefill_pv<F: Float, N: Size>(
    def: cmma::MmaDefinition<F, F, f32>,
    vs: &SharedMemory<Vector<F, N>>,
    pa: &Array<Vector<F, Const<2>>>,
    oacc: &mut Array<Vector<f32, Const<2>>>,
    so: usize,
    voff: usize,
    #[comptime] d: usize,
    #[comptime] nv: usize,
    #[comptime] kstep: usize,
) {
    let sqv = comptime![d / nv + 1];
    let otiles = comptime![d / 4];
    let mst = comptime![kstep / 4];
    // one ldmatrix x4 .trans of V for both m-tiles
    #[unroll]
    for kc in 0..comptime![kstep / 16] {
        #[unroll]
        for dp in 0..comptime![d / 16] {
            let off = so + voff + kc * 16 * sqv + dp * 2;
            let bv = def.load_matrix::<Vector<F, N>, Const<2>>(
                &vs.slice(off, off + 1),
                MatrixIdent::B,
                4usize,
                true,
            );
            mma_16816::<F>(def, pa, kc * 4, bv[0], bv[1], oacc, dp * 4);
            mma_16816::<F>(def, pa, kc * 4, bv[2], bv[3], oacc, dp * 4 + 2);
            mma_16816::<F>(def, pa, mst + kc * 4, bv[0], bv[1], oacc, otiles + dp * 4);
            mma_16816::<F>(
                def,
                pa,
                mst + kc * 4,
                bv[2],
                bv[3],
                oacc,
                otiles + dp * 4 + 2,
            );
        }
    }
}

/// Stages the [`FLASH_KEYS`] rows from `jb - srow` of one of [`prefill_kernel`]'s K or V
/// caches (clamped to `klast`, the block's last key; dense keys) into its shared tile `dst`
/// by `cp.async`, rows of `d / nv` 16-byte vectors at stride `d / nv + 1`; the caller commits
/// the copies to the tile's barrier. Thread `tid` copies column vector `scol = tid % (d /
/// nv)` of rows `srow = tid / (d / nv)`, `srow + threads / (d / nv)`, ..: `jb` is the tile's
/// first row plus `srow`, `vbase` the vector index of the sequence's and KV head's column
/// `scol` at position 0 (its first element over `nv`, plus `scol`), `s2v` the stride along
/// positions in vectors, `obase` `srow (d / nv + 1) + scol`. Every thread of the block takes
/// part; per copy one add, one `min` and one multiply-add of addresses.
#[cube]
#[allow(clippy::too_many_arguments)]
fn prefill_stage<F: Float, N: Size>(
    src: &Array<Vector<F, N>>,
    dst: &mut SharedMemory<Vector<F, N>>,
    vbase: usize,
    s2v: usize,
    jb: usize,
    klast: usize,
    obase: usize,
    #[comptime] d: usize,
    #[comptime] nv: usize,
    #[comptime] threads: usize,
) {
    let sqv = comptime![d / nv + 1];
    // rows a pass of the block's threads covers
    let rpi = comptime![threads / (d / nv)];
    #[unroll]
    for it in 0..comptime![FLASH_KEYS * d / (nv * threads)] {
        let j = min(jb + it * rpi, klast);
        let x = vbase + j * s2v;
        let o = obase + it * rpi * sqv;
        copy_async(
            &src.slice(x, x + 1),
            &mut dst.slice_mut(o, o + 1),
            nv as u32,
        );
    }
}
