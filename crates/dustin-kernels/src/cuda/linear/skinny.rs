//! Which skinny GEMM kernel takes a product, its split plan, and the launches of the skinny GEMMs (CUDA cores, tensor cores, the ring) with their split reductions.

use super::*;

/// Whether the skinny GEMM kernel takes `x [m, k] . w`: `1 <= m <=` [`crate::SKINNY_MAX_ROWS`],
/// `k > 0`, and `w` `[k, n]` row-major (unit column stride, rows at least `n` apart) with
/// `n > 0` a multiple of 4 (a thread reads four consecutive columns).
///
/// Rows further apart than `n` are what cubecl-cuda's pitched allocation makes of a weight
/// whose row is not a multiple of 512 bytes (Qwen2.5-0.5B's `[896, 896]` and `[4864, 896]`:
/// 1792-byte rows padded to 2048). Asking for `[n, 1]` strides sent exactly those weights to
/// Burn's matmul (the H200 trace of 2026-11-30).
pub(super) fn skinny_takes(m: usize, k: usize, w: &Ct) -> bool {
    let n = w.meta.shape()[1];
    let st = w.meta.strides();
    (1..=crate::SKINNY_MAX_ROWS).contains(&m)
        && k > 0
        && n > 0
        && n.is_multiple_of(4)
        && st[1] == 1
        && (k == 1 || st[0] >= n)
}

/// Most rows of `x` the tensor-core skinny GEMM takes (batch 16 x (gamma + 1) at gamma 7 is
/// 128); above 48 rows it runs one launch per 48 rows ([`AUTO_MMA_MAX_ROWS`]).
pub const MMA_MAX_ROWS: usize = 128;

/// Most rows [`SkinnyKernel::Auto`] sends to the tensor-core kernel: one launch (3 tiles of 16
/// rows). Above, it reads the weight once per launch, and at 128 rows (then two launches of
/// 64) it was slower than Burn's matmul for 4 of the 8 projections measured (7B gate/up: 252
/// against 144 us; docs/perf.md, 2026-12-01), so more rows keep Burn's matmul.
pub const AUTO_MMA_MAX_ROWS: usize = 16 * kernels::MMA_ROW_TILES;

/// Which kernel runs a skinny GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SkinnyPath {
    /// `skinny_gemm_kernel`: CUDA cores, up to [`crate::SKINNY_MAX_ROWS`] rows.
    Cores,
    /// `skinny_mma_kernel`: tensor cores, up to [`MMA_MAX_ROWS`] rows.
    Mma,
    /// `skinny_ring_kernel` in this block shape (read once per call, so the plan and the
    /// launch agree): tensor cores fed from a shared-memory ring, up to [`MMA_MAX_ROWS`] rows
    /// in one launch.
    Ring(RingConfig),
}

/// Whether the tensor-core kernel takes `x [m, k] . w`: bf16 or f16, `1 <= m <=`
/// [`MMA_MAX_ROWS`], `k` a multiple of 16 (whole `mma.m16n8k16` steps), `n` a multiple of 8
/// and `w` row-major with a row stride that is a multiple of 8 elements and a 16-byte aligned
/// start (each lane reads 8 columns of a row as one 16-byte vector).
pub(super) fn mma_takes(kernel: SkinnyKernel, m: usize, k: usize, w: &Ct) -> bool {
    let n = w.meta.shape()[1];
    let st = w.meta.strides();
    let on = match kernel {
        SkinnyKernel::Cores => false,
        SkinnyKernel::Auto | SkinnyKernel::NoRing => (2..=AUTO_MMA_MAX_ROWS).contains(&m),
        SkinnyKernel::Mma | SkinnyKernel::Ring => true,
    };
    on && matches!(w.dtype, DType::BF16 | DType::F16)
        && (1..=MMA_MAX_ROWS).contains(&m)
        && k > 0
        && k.is_multiple_of(16)
        && n > 0
        && n.is_multiple_of(8)
        && st[1] == 1
        && st[0] >= n
        && st[0].is_multiple_of(8)
        && w.handle.offset_start.unwrap_or(0).is_multiple_of(16)
}

/// Whether the tensor-core kernel can read `x` in 8-byte vectors, directly or after
/// [`skinny_gemm_into`]'s contiguous copy: a start that is not 8-byte aligned with strides that
/// need no copy (a column slice) cannot.
pub(super) fn mma_x_ok(x: &Ct) -> bool {
    let st = x.meta.strides();
    let needs_copy = !(st[1] == 1 && st[0].is_multiple_of(MMA_XVEC));
    needs_copy || x.handle.offset_start.unwrap_or(0).is_multiple_of(8)
}

/// Whether the ring kernel takes `x [m, k] . w`: as the tensor-core kernel
/// ([`mma_takes`]), and `k` a multiple of the ring's stage ([`RingConfig::kc`]), `x` with a
/// unit column stride, a row stride that is a multiple of 8 and a 16-byte aligned start
/// (each copy moves 16 bytes; otherwise a contiguous copy of `x` is made first, which is).
pub(super) fn ring_takes(
    kernel: SkinnyKernel,
    m: usize,
    k: usize,
    x: &Ct,
    w: &Ct,
    rc: RingConfig,
) -> bool {
    let on = match kernel {
        SkinnyKernel::Ring => true,
        SkinnyKernel::Auto => (AUTO_RING_MIN_ROWS..=MMA_MAX_ROWS).contains(&m),
        SkinnyKernel::Cores | SkinnyKernel::Mma | SkinnyKernel::NoRing => false,
    };
    let xs = x.meta.strides();
    let x_ok = !(xs[1] == 1 && xs[0].is_multiple_of(8))
        || x.handle.offset_start.unwrap_or(0).is_multiple_of(16);
    on && x_ok
        && w.dtype == x.dtype
        && matches!(w.dtype, DType::BF16 | DType::F16)
        && (1..=MMA_MAX_ROWS).contains(&m)
        && k.is_multiple_of(rc.kc)
        && k > 0
        && w.meta.shape()[1] > 0
        && w.meta.shape()[1].is_multiple_of(8)
        && w.meta.strides()[1] == 1
        && w.meta.strides()[0] >= w.meta.shape()[1]
        && w.meta.strides()[0].is_multiple_of(8)
        && w.handle.offset_start.unwrap_or(0).is_multiple_of(16)
}

/// Arrival counts of the fused split reduction: one `u32` per column tile of a launch, zero
/// between launches (the last block of a tile sets its count back to zero).
pub(super) const SPLIT_COUNTERS: usize = 8192;

thread_local! {
    /// One count buffer per (device, stream) used from this thread: launches of one stream
    /// run one after another, so no two of them use a count at the same time.
    static COUNTERS: std::cell::RefCell<Vec<(CountersKey, Ct)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The device and stream a count buffer belongs to (compared without allocating: this runs
/// on every skinny GEMM launch).
pub(super) type CountersKey = (CudaDevice, cubecl::stream_id::StreamId);

/// The zeroed count buffer ([`SPLIT_COUNTERS`] entries) of `t`'s device and the current
/// stream, made on first use.
pub(super) fn split_counters(t: &Ct) -> Ct {
    let key: CountersKey = (t.device.clone(), cubecl::stream_id::StreamId::current());
    if let Some(c) = COUNTERS.with(|c| {
        c.borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, c)| c.clone())
    }) {
        return c;
    }
    let handle = t.client.create(cubecl::bytes::Bytes::from_bytes_vec(vec![
        0u8;
        4 * SPLIT_COUNTERS
    ]));
    let c = CubeTensor::new_contiguous(
        t.client.clone(),
        t.device.clone(),
        Shape::from(vec![SPLIT_COUNTERS]),
        handle,
        DType::U32,
    );
    COUNTERS.with(|cs| cs.borrow_mut().push((key, c.clone())));
    c
}

/// Whether a skinny GEMM on `path` of `m` rows over weights of `ns` columns finishes its
/// split reduction in its own launch ([`SplitReduce::Fused`]): the tensor-core kernels in
/// one launch, with a count for every column tile of the grid.
pub(super) fn fuses_split(x: &Ct, path: SkinnyPath, m: usize, ns: &[usize]) -> bool {
    let tiles = |cols: usize| ns.iter().map(|n| n.div_ceil(cols)).sum::<usize>();
    config_of(x).split_reduce == SplitReduce::Fused
        && match path {
            SkinnyPath::Cores => false,
            SkinnyPath::Mma => {
                m <= 16 * kernels::MMA_ROW_TILES && tiles(kernels::MMA_TILE) <= SPLIT_COUNTERS
            }
            SkinnyPath::Ring(rc) => tiles(rc.cols) <= SPLIT_COUNTERS,
        }
}

/// How a skinny GEMM launch finishes ([`skinny_gemm_into`]): `mode` is one of
/// `kernels::SPLIT_PARTIALS` (the partial sums only, for a reduce kernel),
/// `kernels::SPLIT_OUTPUTS` (`outs[i]` `[m, n_i]` contiguous, plus `biases[i]` where bit `i`
/// of `bias_mask` is set) or `kernels::SPLIT_SWIGLU` (`outs[0]` `[m, n]`). Unused slots hold
/// any tensor of the dtype (never read or written).
pub(super) struct Finish<'a> {
    pub(super) mode: u32,
    pub(super) outs: [&'a Ct; 3],
    pub(super) biases: [&'a Ct; 3],
    pub(super) bias_mask: u32,
    pub(super) counters: Ct,
}

impl<'a> Finish<'a> {
    /// A finish in `mode`; `x` is the GEMM's input (its device and stream pick the count
    /// buffer).
    pub(super) fn new(
        x: &Ct,
        mode: u32,
        outs: [&'a Ct; 3],
        biases: [&'a Ct; 3],
        bias_mask: u32,
    ) -> Self {
        Self {
            mode,
            outs,
            biases,
            bias_mask,
            counters: split_counters(x),
        }
    }

    /// The partial sums only; `x` fills the unused bindings.
    pub(super) fn partials(x: &'a Ct) -> Self {
        Self::new(x, kernels::SPLIT_PARTIALS, [x; 3], [x; 3], 0)
    }

    /// The outputs `outs` with `biases[i]` added where bit `i` of `bias_mask` is set.
    pub(super) fn outputs(x: &Ct, outs: [&'a Ct; 3], biases: [&'a Ct; 3], bias_mask: u32) -> Self {
        Self::new(x, kernels::SPLIT_OUTPUTS, outs, biases, bias_mask)
    }

    /// SwiGLU's product into `out`; `x` fills the unused bindings.
    pub(super) fn swiglu(x: &'a Ct, out: &'a Ct) -> Self {
        Self::new(x, kernels::SPLIT_SWIGLU, [out; 3], [x; 3], 0)
    }
}

/// Fewest rows [`SkinnyKernel::Auto`] sends to the ring kernel (`skinny_ring_kernel`); from
/// here to [`MMA_MAX_ROWS`] it takes them all in one launch, where the tensor-core kernel
/// re-reads the weight once per 48 rows and keeps three tiles' loads in registers.
pub const AUTO_RING_MIN_ROWS: usize = 33;

/// The kernel for `x [m, k]` times every weight of `ws`, or `None` (Burn's matmul).
pub(super) fn skinny_path(m: usize, k: usize, x: &Ct, ws: &[&Ct]) -> Option<SkinnyPath> {
    let cfg = config_of(x);
    let (kernel, rc) = (cfg.skinny_kernel, cfg.ring);
    if ws.iter().all(|w| ring_takes(kernel, m, k, x, w, rc)) {
        Some(SkinnyPath::Ring(rc))
    } else if mma_x_ok(x)
        && ws
            .iter()
            .all(|w| w.dtype == x.dtype && mma_takes(kernel, m, k, w))
    {
        Some(SkinnyPath::Mma)
    } else if ws.iter().all(|w| skinny_takes(m, k, w)) {
        Some(SkinnyPath::Cores)
    } else {
        None
    }
}

/// Rows of `w` per split and the number of splits for skinny GEMMs of `m` rows and inner size
/// `k` over weights of `ns` columns sharing one partial-sum buffer.
///
/// [`SkinnyPath::Cores`]: about 4 blocks per SM of the H200 (132 SMs) over all their
/// 128-column tiles; each split stages at most `SKINNY_CHUNK` rows of `x`, a
/// multiple of the 8 warps.
///
/// [`SkinnyPath::Mma`]: over the 64-column tiles, the split count (rows a multiple of 16)
/// whose blocks fill whole waves of `sms` SMs best ([`mma_blocks_per_sm`] each), but no more
/// splits than keep the partial sums (written, then read by the reduce: `2 splits m n` f32)
/// under a quarter of the weight read (`k n` bf16), i.e. `splits <= k / (16 m)`, nor than
/// leave a split under [`MMA_MIN_SPLIT_ROWS`](crate::split_plan::MMA_MIN_SPLIT_ROWS) rows; the fewest splits that fill 95% of
/// their waves.
pub(super) fn skinny_plan(
    k: usize,
    m: usize,
    ns: &[usize],
    path: SkinnyPath,
    sms: usize,
) -> (usize, usize) {
    match path {
        SkinnyPath::Cores => {
            let tiles: usize = ns.iter().map(|n| n.div_ceil(kernels::SKINNY_TILE)).sum();
            let want = (4 * 132usize)
                .div_ceil(tiles.max(1))
                .clamp(1, k.div_ceil(8));
            let rows = k
                .div_ceil(want)
                .next_multiple_of(8)
                .min(kernels::SKINNY_CHUNK);
            (rows, k.div_ceil(rows))
        }
        SkinnyPath::Mma => {
            let tiles: usize = ns
                .iter()
                .map(|n| n.div_ceil(kernels::MMA_TILE))
                .sum::<usize>()
                .max(1);
            let mt = m.clamp(1, 16 * kernels::MMA_ROW_TILES).div_ceil(16);
            let slots = mma_blocks_per_sm(mt) * sms.max(1);
            crate::split_plan::mma_splits(k, m, tiles, slots)
        }
        SkinnyPath::Ring(rc) => {
            let tiles: usize = ns.iter().map(|n| n.div_ceil(rc.cols)).sum::<usize>().max(1);
            let mt = m.clamp(1, 16 * kernels::RING_MAX_TILES).div_ceil(16);
            let slots = ring_blocks_per_sm(rc, mt) * sms.max(1);
            crate::split_plan::splits_in_units(k, m, tiles, slots, rc.kc)
        }
    }
}

/// Blocks of the ring skinny GEMM resident on one SM, as the split plan counts them: as many
/// as its shared memory allows ([`RingConfig::shared_bytes`] of the H200's 227 KB a block can
/// use of an SM's 228), at most 4 (registers: about 100 a thread, 128 threads).
pub(super) fn ring_blocks_per_sm(rc: RingConfig, mt: usize) -> usize {
    (227 * 1024 / rc.shared_bytes(mt).max(1)).clamp(1, 4)
}

/// Blocks of the tensor-core skinny GEMM resident on one SM for `mt` 16-row tiles of `x`:
/// registers decide it (the accumulators are `32 mt` a thread, the double-buffered loads
/// 40-80 more; 65,536 registers an SM, 128 threads a block).
pub(super) fn mma_blocks_per_sm(mt: usize) -> usize {
    if mt <= 2 {
        3
    } else {
        2
    }
}

/// Launches the skinny GEMMs of `x [m, k]` and each `(w [k, n], col_off)` of `ws` (one to
/// three weights) into columns `col_off .. col_off + n` of `part [splits, m, ldp]`: on the
/// tensor cores one launch per 48 rows for all of them, on the CUDA cores one per weight.
#[allow(clippy::too_many_arguments)]
pub(super) fn skinny_gemm_into(
    xp: &Ct,
    ws: &[(Ct, usize)],
    part: &Ct,
    k: usize,
    ldp: usize,
    rows: usize,
    splits: usize,
    path: SkinnyPath,
    fin: &Finish<'_>,
) {
    let m = xp.meta.shape()[0];
    match path {
        SkinnyPath::Cores => {
            let st = xp.meta.strides();
            for (w, col_off) in ws {
                let n = w.meta.shape()[1];
                kernels::skinny_gemm_kernel::launch::<CudaRuntime>(
                    &xp.client,
                    CubeCount::Static(n.div_ceil(kernels::SKINNY_TILE) as u32, splits as u32, 1),
                    CubeDim::new_1d(256),
                    xp.clone().into_array_arg(),
                    w.clone().into_array_arg(),
                    part.clone().into_array_arg(),
                    st[0] as u32,
                    st[1] as u32,
                    w.meta.strides()[0] as u32,
                    k as u32,
                    n as u32,
                    rows as u32,
                    ldp as u32,
                    *col_off as u32,
                    m,
                    xp.dtype.into(),
                )
            }
        }
        SkinnyPath::Ring(rc) => {
            // `x` in 16-byte vectors
            let (xv, ldx) = x_in_vectors(xp, 8);
            let mt = m.clamp(1, 16 * kernels::RING_MAX_TILES).div_ceil(16);
            for chunk in ws.chunks(3) {
                let sl = WeightSlots::of(chunk, rc.cols);
                kernels::skinny_ring_kernel::launch::<CudaRuntime>(
                    &xp.client,
                    CubeCount::Static(sl.blocks as u32, splits as u32, 1),
                    CubeDim::new_1d(kernels::RING_THREADS as u32),
                    MMA_VEC,
                    xv.clone().into_array_arg(),
                    sl.w[0].clone().into_array_arg(),
                    sl.w[1].clone().into_array_arg(),
                    sl.w[2].clone().into_array_arg(),
                    part.clone().into_array_arg(),
                    fin.counters.clone().into_array_arg(),
                    fin.outs[0].clone().into_array_arg(),
                    fin.outs[1].clone().into_array_arg(),
                    fin.outs[2].clone().into_array_arg(),
                    fin.biases[0].clone().into_array_arg(),
                    fin.biases[1].clone().into_array_arg(),
                    fin.biases[2].clone().into_array_arg(),
                    fin.bias_mask,
                    m as u32,
                    k as u32,
                    ldx as u32,
                    rows as u32,
                    ldp as u32,
                    sl.n[0],
                    sl.n[1],
                    sl.n[2],
                    sl.ldw[0],
                    sl.ldw[1],
                    sl.ldw[2],
                    sl.col_off[0],
                    sl.col_off[1],
                    sl.col_off[2],
                    sl.first_tile[0],
                    sl.first_tile[1],
                    sl.count,
                    mt,
                    rc.cols,
                    rc.kc,
                    rc.bufs,
                    fin.mode,
                    xp.dtype.into(),
                )
            }
        }
        SkinnyPath::Mma => {
            // `x` in 8-byte vectors (a pitched row is a multiple of 4 apart; `skinny_path`
            // took this path only if an uncopied `x` starts 8-byte aligned)
            let (xv, ldx) = x_in_vectors(xp, MMA_XVEC);
            for chunk in ws.chunks(3) {
                let sl = WeightSlots::of(chunk, kernels::MMA_TILE);
                // one launch per 48 rows of `x` (3 m-tiles: 96 accumulator registers a thread)
                let group = 16 * kernels::MMA_ROW_TILES;
                // the fused reduction sums whole tiles: one launch ([`fuses_split`])
                debug_assert!(fin.mode == kernels::SPLIT_PARTIALS || m <= group);
                for r0 in (0..m).step_by(group) {
                    let mt = (m - r0).min(group).div_ceil(16);
                    let (unroll, db) = mma_unroll(mt);
                    kernels::skinny_mma_kernel::launch::<CudaRuntime>(
                        &xp.client,
                        CubeCount::Static(sl.blocks as u32, splits as u32, 1),
                        CubeDim::new_1d((32 * kernels::MMA_WARPS) as u32),
                        MMA_XVEC,
                        MMA_VEC,
                        xv.clone().into_array_arg(),
                        sl.w[0].clone().into_array_arg(),
                        sl.w[1].clone().into_array_arg(),
                        sl.w[2].clone().into_array_arg(),
                        part.clone().into_array_arg(),
                        fin.counters.clone().into_array_arg(),
                        fin.outs[0].clone().into_array_arg(),
                        fin.outs[1].clone().into_array_arg(),
                        fin.outs[2].clone().into_array_arg(),
                        fin.biases[0].clone().into_array_arg(),
                        fin.biases[1].clone().into_array_arg(),
                        fin.biases[2].clone().into_array_arg(),
                        fin.bias_mask,
                        m as u32,
                        r0 as u32,
                        k as u32,
                        ldx as u32,
                        rows as u32,
                        ldp as u32,
                        sl.n[0],
                        sl.n[1],
                        sl.n[2],
                        sl.ldw[0],
                        sl.ldw[1],
                        sl.ldw[2],
                        sl.col_off[0],
                        sl.col_off[1],
                        sl.col_off[2],
                        sl.first_tile[0],
                        sl.first_tile[1],
                        sl.count,
                        mt,
                        unroll,
                        db,
                        fin.mode,
                        xp.dtype.into(),
                    )
                }
            }
        }
    }
}

/// `x` with a unit column stride and rows a multiple of `vec` elements apart (itself when it
/// is so, else a contiguous copy: a fresh allocation, so aligned), and its row stride: what
/// the tensor-core kernels read in vectors of `vec`.
pub(super) fn x_in_vectors(x: &Ct, vec: usize) -> (Ct, usize) {
    let st = x.meta.strides();
    let xv = if st[1] == 1 && st[0].is_multiple_of(vec) {
        x.clone()
    } else {
        burn_cubecl::kernel::into_contiguous(x.clone())
    };
    let ldx = xv.meta.strides()[0];
    (xv, ldx)
}

/// The three weight slots of one tensor-core launch (`skinny_mma_kernel`,
/// `skinny_ring_kernel`) over one to three `(w, col_off)`: unused slots repeat the last weight
/// (never read); each weight's column count, row stride and column offset in the partial
/// sums, the first column tile (of `tile` columns) of weights 1 and 2 in the grid, and the
/// grid's column tiles in all.
pub(super) struct WeightSlots<'a> {
    pub(super) w: [&'a Ct; 3],
    pub(super) n: [u32; 3],
    pub(super) ldw: [u32; 3],
    pub(super) col_off: [u32; 3],
    pub(super) first_tile: [u32; 2],
    pub(super) blocks: usize,
    pub(super) count: usize,
}

impl<'a> WeightSlots<'a> {
    pub(super) fn of(chunk: &'a [(Ct, usize)], tile: usize) -> Self {
        let pick = |i: usize| &chunk[i.min(chunk.len() - 1)];
        let tiles = |i: usize| {
            if i < chunk.len() {
                pick(i).0.meta.shape()[1].div_ceil(tile)
            } else {
                0
            }
        };
        let (t0, t1, t2) = (tiles(0), tiles(1), tiles(2));
        Self {
            w: [&pick(0).0, &pick(1).0, &pick(2).0],
            n: [0, 1, 2].map(|i| pick(i).0.meta.shape()[1] as u32),
            ldw: [0, 1, 2].map(|i| pick(i).0.meta.strides()[0] as u32),
            col_off: [0, 1, 2].map(|i| pick(i).1 as u32),
            first_tile: [t0 as u32, (t0 + t1) as u32],
            blocks: t0 + t1 + t2,
            count: chunk.len(),
        }
    }
}

/// Elements of `x` per load of the tensor-core skinny GEMM: 4 bf16, 8 bytes (a lane's four
/// k-slots of a step).
pub(super) const MMA_XVEC: usize = 4;

/// Elements of `w` per load of the tensor-core skinny GEMM: 8 bf16, 16 bytes.
pub(super) const MMA_VEC: usize = 8;

/// Steps (16 rows of `w`) a warp of the tensor-core skinny GEMM loads before it multiplies,
/// and whether those loads are double-buffered: for one or two m-tiles (accumulators of
/// 32-64 registers) 2 steps, double-buffered (8 16-byte loads a lane in flight while the
/// previous 2 multiply; 7B gate/up at 8 rows: 76 to 45 us of GPU time, ncu 2026-12-01); for
/// three, 2 steps loaded then multiplied (double-buffering 1 step measured 91 us
/// against 70 at 40 rows: the registers allow no more).
pub(super) fn mma_unroll(mt: usize) -> (usize, bool) {
    if mt <= 2 {
        (2, true)
    } else {
        (2, false)
    }
}
