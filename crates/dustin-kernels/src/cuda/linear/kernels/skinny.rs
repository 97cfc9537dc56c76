//! The skinny GEMMs on CUDA cores (`skinny_gemm_kernel`) and tensor cores (`skinny_mma_kernel`).

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::cmma;
use cubecl::prelude::*;

use crate::cuda::mma::mma_16816;

use super::*;

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
