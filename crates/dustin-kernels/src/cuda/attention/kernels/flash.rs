//! FlashAttention-2 style attention (`flash_kernel`) and its MMA and staging helpers.

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

#[cfg(doc)]
use super::*;

/// Query rows per block of [`flash_kernel`] in verification: 4 warps x one 16-row MMA tile
/// (score mode's blocks take 16 rows, shared by the 4 warps). Prefill blocks take `warps x
/// 16` rows, `warps` 4 or 8 (`KernelConfig::prefill_warps`).
pub const FLASH_ROWS: usize = 64;
/// Keys per shared-memory tile of [`flash_kernel`] (the verification split plan's unit).
pub const FLASH_KEYS: usize = crate::split_plan::FLASH_KEYS;
/// [`flash_kernel`]'s score mode writes every logit and the `(max, sum)` partials.
pub const SCORE_LOGITS: usize = 0;
/// [`flash_kernel`]'s score mode writes the `(max, sum)` partials only.
pub const SCORE_STATS: usize = 1;
/// [`flash_kernel`]'s score mode writes each row block's probability mass per key, from the
/// partials of a [`SCORE_STATS`] pass.
pub const SCORE_MASS: usize = 2;

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
pub(super) fn flash_stage<F: Float, I: Int, N: Size>(
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
///   `pl` (`[b, slots, 4 splits, rpad]`), which `score_reduce_kernel` (`cuda::selection`) turns into
///   probabilities (Dustin's head-subset importance scores). `smode` picks what score mode
///   writes: [`SCORE_LOGITS`] the logits and the partials (as above), [`SCORE_STATS`] the
///   partials only, [`SCORE_MASS`] (a second pass over the same keys, same grid, after a
///   [`SCORE_STATS`] pass) each row's probabilities `exp(logit - M) / L` with `(M, L)` merged
///   from that pass's partials in `pm`, `pl` (read, not written), summed over the block's 16
///   rows per key into `logits[b, slot, row block, key]` (`[b, slots, rowblocks, lmax]`): no
///   logit reaches memory. With `wide` (stats and mass passes only), score mode lays rows out
///   as verification does: each warp its own 16 rows over every key of the tile, `16 warps`
///   rows a block, so a slot of up to that many rows reads its keys once (the partials are
///   then one per split, and the mass of row group `warps rb + warp` goes to
///   `logits[b, slot, warps rb + warp, key]`, `[b, slots, warps rowblocks, lmax]`).
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
    #[comptime] smode: usize,
    #[comptime] wide: bool,
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
    if comptime![score && !wide] {
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
    let kshare = comptime![if score && !wide { 4usize } else { 1usize }];
    let mut kw = 0usize;
    if comptime![score && !wide] {
        kw = warp * 16;
    }
    // mass pass: each of the block's rows' maximum M and 1 / L over all keys, merged from
    // the stats pass's partials (as `score_reduce_kernel` merges them); a row whose keys are
    // all masked gets 1 / L = 0. The block's rows: 16, or 64 with `wide`; partials: 4 a
    // split, or 1 with `wide`
    let brows = comptime![if wide { warps * 16 } else { 16usize }];
    let mut rstat = SharedMemory::<f32>::new(comptime![if smode == SCORE_MASS {
        2 * brows
    } else {
        1usize
    }]);
    let mut ma = 0.0f32;
    let mut ila = 0.0f32;
    let mut mc = 0.0f32;
    let mut ilc = 0.0f32;
    if comptime![score && smode == SCORE_MASS] {
        let rbase = rb * brows;
        if tid < brows {
            let r = rbase + tid;
            let mut mm = lowest;
            let mut ll = 0.0f32;
            if r < rtot {
                let mut ws = 4 * splits as usize;
                if comptime![wide] {
                    ws = splits as usize;
                }
                let rpd = rpad as usize;
                let base = (b * CUBE_COUNT_Y as usize + slot) * ws * rpd + r;
                for w in 0..ws {
                    let pmw = pm[base + w * rpd];
                    if pmw > mm {
                        mm = pmw;
                    }
                }
                for w in 0..ws {
                    let pmw = pm[base + w * rpd];
                    if pmw > lowest {
                        ll += pl[base + w * rpd] * (pmw - mm).exp();
                    }
                }
            }
            let mut il = 0.0f32;
            if ll > 0.0f32 {
                il = 1.0f32 / ll;
            }
            rstat[tid] = mm;
            rstat[brows + tid] = il;
        }
        sync_cube();
        let wr = r0 - rbase;
        ma = rstat[wr + g];
        ila = rstat[brows + wr + g];
        mc = rstat[wr + g + 8];
        ilc = rstat[brows + wr + g + 8];
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
            // mass pass: this row group's slice of `[b, slots, groups, lmax]` (a group is the
            // block's 16 rows, or with `wide` the warp's)
            let mut groups = rowblocks;
            let mut group = rb;
            if comptime![wide] {
                groups = warps * rowblocks;
                group = warps * rb + warp;
            }
            let mgb = ((b * CUBE_COUNT_Y as usize + slot) * groups + group) * lmax as usize;
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
                    if comptime![score && smode == SCORE_LOGITS] {
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
                    if comptime![score && smode == SCORE_MASS] {
                        // both rows' probabilities of key kp, summed over the 8 row pairs of
                        // the warp (lanes of one t4 hold the same keys): lanes 0 .. 4 write
                        let mut pv = 0.0f32;
                        if va && a > lowest {
                            pv += (a - ma).exp() * ila;
                        }
                        if vc && c > lowest {
                            pv += (c - mc).exp() * ilc;
                        }
                        pv += plane_shuffle_xor(pv, 4u32);
                        pv += plane_shuffle_xor(pv, 8u32);
                        pv += plane_shuffle_xor(pv, 16u32);
                        if g == 0 && kp < kend {
                            logits[mgb + kp] = pv;
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
        if comptime![score && !wide] {
            wsplits = 4 * splits as usize;
            wsplit = 4 * split + warp;
        }
        let pb = ((b * CUBE_COUNT_Y as usize + slot) * wsplits + wsplit) * rpad;
        // (the mass pass reads the stats pass's partials: other blocks still do)
        if comptime![!(score && smode == SCORE_MASS)] {
            if va && t4 == 0 {
                pm[pb + ra] = m0;
                pl[pb + ra] = l0;
            }
            if vc && t4 == 0 {
                pm[pb + rc] = m1;
                pl[pb + rc] = l1;
            }
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
