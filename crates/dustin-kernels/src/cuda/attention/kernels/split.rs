//! Flash-decoding attention: `split_kernel` and `combine_kernel`.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::cmma::{self, MatrixIdent, MatrixLayout};
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
