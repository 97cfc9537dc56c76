//! Top-k of positions: the radix select of `topk_kernel` and `topk_block_kernel`.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::prelude::*;

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
/// [`topk_kernel`] (the default, faster end to end on the GPU; docs/perf.md, "GPU kernels:
/// verification attention, scoring, top-k") as the reference for its benchmark and checks.
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
