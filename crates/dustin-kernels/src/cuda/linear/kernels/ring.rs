//! The ring skinny GEMM (`skinny_ring_kernel`) and its `cp.async` ring.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::cmma::{self, MatrixIdent};
use cubecl::prelude::barrier::{copy_async, Barrier};
use cubecl::prelude::*;

use crate::cuda::mma::mma_16816;

use super::*;

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
