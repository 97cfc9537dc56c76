//! The `dustin` estimator's history fold and normalise-and-mix.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::prelude::*;

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
