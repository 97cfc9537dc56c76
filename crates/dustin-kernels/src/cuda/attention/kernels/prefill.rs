//! Causal prefill with two m-tiles a warp (`prefill_kernel`).

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
