//! Skinny GEMM on the CPU ([`burn_flex::Flex`], f32): `y = x . w + bias` for a few rows
//! (decoding and verification), reading each weight element from memory once.
//!
//! Why: Burn-flex 0.21's matmul goes through the `gemm` 0.19 crate, which runs one row as a
//! matrix-vector product (one thread, one pass over the weight) but from 2 rows on packs
//! the weight into its blocked kernel's layout. At Qwen2.5-1.5B shapes on a 2-core Xeon a
//! product of 5 rows cost 2.3-4x the product of one row (`cargo bench -p dustin-kernels
//! --bench skinny_gemm`), although both only need to stream the same weight, which made
//! speculative verification (gamma + 1 rows) slower per token than decoding.
//!
//! The product here splits the `n` output columns into tiles of `nb` columns that the rayon
//! pool (the one Burn-flex and `gemm` use) runs in parallel. A tile keeps its `m x nb`
//! accumulators in a buffer that stays in cache and walks `k` in blocks of [`K_BLOCK`]
//! weight rows; within a block, a register-blocked micro-kernel takes up to 6 rows of `x`
//! (3 on AVX2) and 64 columns (32 on AVX2, 16 on NEON) at a time, loads its accumulators
//! into registers, and for each weight row loads the 64 weights once (prefetched
//! [`PREFETCH_ROWS`] rows ahead) and multiply-adds them into every row's accumulators. The
//! first group of rows streams the block from memory, the others find it in L2 (a block of a
//! tile is at most 256 x 512 floats, 512 KiB). So every weight element is read from memory
//! once whatever `m` is, and each output element is the sequential sum
//! `((0 + x0 w0) + x1 w1) + ... + b` (a fused multiply-add per term; the bias added last,
//! once): the same value, bit for bit, for a row whether it comes alone or with others, in
//! any tile, row group or thread split, and the same for every instruction set with fused
//! multiply-adds ([`Isa::Portable`] rounds the product and the sum separately).

use burn_flex::{Flex, FlexTensor};
use burn_tensor::{DType, Tensor, TensorData, TensorPrimitive};
use rayon::prelude::*;

use crate::{KernelError, Result};

/// Most rows `x` may have for [`skinny_linear`] to run the product here (and
/// [`KernelOps::skinny_max_rows`](crate::LinearOps::skinny_max_rows) on [`Flex`]: the model sends up to this many rows);
/// more go to Burn's matmul. Bounds the accumulator tile (`m x nb` floats, [`tile_width`]);
/// at Qwen2.5-1.5B shapes the product here still took about half of Burn's time at 64 rows
/// (`cargo bench -p dustin-kernels --bench skinny_gemm`).
pub const CPU_SKINNY_MAX_ROWS: usize = 64;

/// Floats of accumulators a tile keeps (`m x nb`): 4096 floats = 16 KiB, a third of a
/// 48 KiB L1 data cache (Intel since Ice Lake; 32 KiB elsewhere still holds it with the
/// weight rows in flight from L2).
pub const ACC_FLOATS: usize = 4096;

/// Widest tile, floats: a run of 2 KiB per weight row (32 cache lines), long enough for the
/// hardware prefetcher within a page.
pub const MAX_TILE: usize = 512;

/// Narrowest tile, floats: the widest micro-kernel (64 floats, four 64-byte cache lines).
pub const MIN_TILE: usize = 64;

/// Weight rows ahead of the current one that the micro-kernel prefetches: about a memory
/// latency (~100 ns, ~300 cycles) of its work at one weight row per ~12 cycles.
pub const PREFETCH_ROWS: usize = 24;

/// Weight rows per block: the rows of `x` after the first group of a block re-read the
/// block's `K_BLOCK x nb` weights from L2. Fixed (not tuned per `m`) so that the sums do not
/// depend on `m`.
pub const K_BLOCK: usize = 256;

/// Weights (`k x n` elements) below which the product runs on the calling thread: 64 Ki
/// floats = 256 KiB, a few microseconds of work, about what a rayon fork-join costs.
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;

/// Tile width, columns, for `m` rows, `n` columns and `threads` workers: at most
/// [`ACC_FLOATS`]` / m` (the accumulators stay in cache) and [`MAX_TILE`], small enough
/// that there are about 4 tiles per worker (balance under other load), at least
/// [`MIN_TILE`]; a multiple of 64 (whole micro-kernels).
pub fn tile_width(m: usize, n: usize, threads: usize) -> usize {
    let cache = (ACC_FLOATS / m.max(1)).clamp(MIN_TILE, MAX_TILE);
    let balance = n.div_ceil(4 * threads.max(1)).max(MIN_TILE);
    cache.min(balance).div_ceil(MIN_TILE) * MIN_TILE
}

/// `y = x . w + bias` in f32: `x` `[m, k]` and `w` `[k, n]` row-major, `bias` `[n]`;
/// returns `y` `[m, n]` row-major. Each weight element is read once (module docs); the tiles
/// run on the rayon pool when the weight has at least 64 Ki elements. Runs with the best
/// instruction set of this machine ([`Isa::detect`]).
///
/// # Errors
/// [`KernelError::Shape`] naming `x`, `w` or `bias` when a slice's length is not its shape's
/// size.
pub fn gemm_f32(x: &[f32], w: &[f32], bias: Option<&[f32]>, dims: [usize; 3]) -> Result<Vec<f32>> {
    gemm_f32_with(Isa::detect(), x, w, bias, dims)
}

/// [`gemm_f32`] with the instruction set `isa` (for tests and benchmarks).
///
/// # Errors
/// As [`gemm_f32`]; [`KernelError::Unsupported`] when this machine lacks `isa`
/// ([`Isa::available`]).
pub fn gemm_f32_with(
    isa: Isa,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    [m, k, n]: [usize; 3],
) -> Result<Vec<f32>> {
    if !Isa::available().contains(&isa) {
        return Err(KernelError::Unsupported(format!(
            "instruction set {} on this machine",
            isa.name()
        )));
    }
    check_len("x", x.len(), [m, k])?;
    check_len("w", w.len(), [k, n])?;
    if let Some(b) = bias {
        check_len("bias", b.len(), [1, n])?;
    }
    if m == 0 || n == 0 {
        return Ok(Vec::new());
    }
    let parallel = k.saturating_mul(n) >= PARALLEL_MIN_WEIGHTS;
    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    let nb = tile_width(m, n, threads);
    let tiles = n.div_ceil(nb);
    // tile-major accumulators: tile t holds rows 0..m of its columns, `m x nb` floats
    let mut acc = vec![0.0f32; tiles * m * nb];
    let run = |(t, a): (usize, &mut [f32])| {
        let j0 = t * nb;
        let width = nb.min(n - j0);
        isa.tile(x, w, [m, k, n], j0, width, nb, a);
    };
    if parallel {
        acc.par_chunks_mut(m * nb).enumerate().for_each(run);
    } else {
        acc.chunks_mut(m * nb).enumerate().for_each(run);
    }
    let mut y = vec![0.0f32; m * n];
    for (t, a) in acc.chunks(m * nb).enumerate() {
        let j0 = t * nb;
        let width = nb.min(n - j0);
        for r in 0..m {
            let dst = &mut y[r * n + j0..r * n + j0 + width];
            let src = &a[r * nb..r * nb + width];
            match bias {
                Some(b) => {
                    for ((d, &s), &bb) in dst.iter_mut().zip(src).zip(&b[j0..j0 + width]) {
                        *d = s + bb;
                    }
                }
                None => dst.copy_from_slice(src),
            }
        }
    }
    Ok(y)
}

/// [`KernelError::Shape`] unless `len` is the size of `shape`.
fn check_len(name: &'static str, len: usize, shape: [usize; 2]) -> Result<()> {
    if shape[0].checked_mul(shape[1]) == Some(len) {
        Ok(())
    } else {
        Err(KernelError::Shape {
            name,
            expected: shape.to_vec(),
            found: vec![len],
        })
    }
}

/// The f32 storage of a contiguous f32 tensor, without copying; `None` for another dtype or
/// a strided view.
fn f32_slice(t: &FlexTensor) -> Option<&[f32]> {
    if t.dtype() != DType::F32 {
        return None;
    }
    t.as_slice::<f32>()
}

/// [`KernelOps::skinny_linear`](crate::LinearOps::skinny_linear) on [`Flex`]: `x` `[m, k]` times `w` `[k, n]` plus
/// `bias` `[n]`, `[m, n]`. For f32 with `m` up to [`CPU_SKINNY_MAX_ROWS`] and a contiguous
/// `w`, [`gemm_f32`] (a strided `x` or `bias` is copied first: it is small); otherwise
/// Burn's matmul and the bias add ([`crate::plain::linear`]).
///
/// # Errors
/// [`KernelError::Shape`] naming `w` or `bias` when they do not fit `x`.
pub fn skinny_linear(
    x: Tensor<Flex, 2>,
    w: Tensor<Flex, 2>,
    bias: Option<Tensor<Flex, 1>>,
) -> Result<Tensor<Flex, 2>> {
    let [m, k] = x.dims();
    let n = w.dims()[1];
    crate::check_skinny(x.dims(), w.dims(), bias.as_ref().map(|b| b.dims()))?;
    let dtypes_f32 = x.dtype() == DType::F32
        && w.dtype() == DType::F32
        && bias.as_ref().is_none_or(|b| b.dtype() == DType::F32);
    if !dtypes_f32 || m > CPU_SKINNY_MAX_ROWS {
        return crate::plain::linear(x, w, bias);
    }
    let wp = w.into_primitive().tensor();
    let xp = contiguous(x.into_primitive().tensor());
    let bp = bias.map(|b| contiguous(b.into_primitive().tensor()));
    let bs = match &bp {
        Some(b) => f32_slice(b).map(Some),
        None => Some(None),
    };
    let (Some(ws), Some(xs), Some(bs)) = (f32_slice(&wp), f32_slice(&xp), bs) else {
        // a strided weight: Burn's matmul reads it in place
        let bias = bp.map(|b| Tensor::from_primitive(TensorPrimitive::Float(b)));
        return crate::plain::linear(
            Tensor::from_primitive(TensorPrimitive::Float(xp)),
            Tensor::from_primitive(TensorPrimitive::Float(wp)),
            bias,
        );
    };
    let y = gemm_f32(xs, ws, bs, [m, k, n])?;
    let out = FlexTensor::from_data(TensorData::new(y, [m, n]));
    Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
}

/// `t` itself when its storage is contiguous, else a contiguous copy.
fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

/// An instruction set the tiles run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// x86-64 AVX-512F: 16 lanes, micro-kernel of 6 rows x 64 columns (24 of the 32 vector
    /// registers hold accumulators).
    Avx512,
    /// x86-64 AVX2 and FMA: 8 lanes, 3 rows x 32 columns (12 of 16 registers).
    Avx2,
    /// AArch64 NEON (base ISA): 4 lanes, 6 rows x 16 columns (24 of 32 registers).
    Neon,
    /// Any target: a multiply then an add per term, in the tile's accumulator buffer,
    /// vectorised as far as the compiler's baseline target allows.
    Portable,
}

impl Isa {
    /// The instruction sets this machine runs, best first ([`Isa::Portable`] always).
    // on AArch64 the pushes are unconditional
    #[allow(clippy::vec_init_then_push)]
    pub fn available() -> Vec<Self> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(Self::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                v.push(Self::Avx2);
            }
        }
        #[cfg(target_arch = "aarch64")]
        v.push(Self::Neon);
        v.push(Self::Portable);
        v
    }

    /// The best instruction set of this machine (the first of [`Isa::available`]).
    pub fn detect() -> Self {
        Self::available()[0]
    }

    /// Its name, for reports: `"avx512f"`, `"avx2+fma"`, `"neon"` or `"portable"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512 => "avx512f",
            Self::Avx2 => "avx2+fma",
            Self::Neon => "neon",
            Self::Portable => "portable",
        }
    }

    /// One tile: columns `j0 .. j0 + width` of all `m` rows into `acc` (`m` rows of stride
    /// `nb`, zeroed). `self` must be available (checked by [`gemm_f32_with`]).
    #[allow(clippy::too_many_arguments)]
    fn tile(
        self,
        x: &[f32],
        w: &[f32],
        dims: [usize; 3],
        j0: usize,
        width: usize,
        nb: usize,
        acc: &mut [f32],
    ) {
        let t = Tile {
            x,
            w,
            dims,
            j0,
            width,
            nb,
        };
        match self {
            // SAFETY: the features were detected at run time (`Isa::available`).
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => unsafe { x86::tile_avx512(&t, acc) },
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => unsafe { x86::tile_avx2(&t, acc) },
            // SAFETY: NEON is part of the AArch64 base ISA.
            #[cfg(target_arch = "aarch64")]
            Self::Neon => unsafe { arm::tile_neon(&t, acc) },
            _ => t.scalar_cols(0, width, acc, |a, b, c| a * b + c),
        }
    }
}

/// The instruction set [`gemm_f32`] runs with on this machine ([`Isa::detect`]'s name).
pub fn kernel_name() -> &'static str {
    Isa::detect().name()
}

/// One tile's view of the product: `x` `[m, k]`, `w` `[k, n]` (`dims` = `[m, k, n]`),
/// columns `j0 .. j0 + width`, accumulator rows of stride `nb`.
struct Tile<'a> {
    x: &'a [f32],
    w: &'a [f32],
    dims: [usize; 3],
    j0: usize,
    width: usize,
    nb: usize,
}

impl Tile<'_> {
    /// Tile columns `c0 .. c1` with a multiply-add per term from the accumulator buffer,
    /// `fma(a, b, c) = a * b + c` (the columns the micro-kernel does not cover, and the
    /// portable path); the same order of sums as the micro-kernel.
    #[inline(always)]
    fn scalar_cols(
        &self,
        c0: usize,
        c1: usize,
        acc: &mut [f32],
        fma: impl Fn(f32, f32, f32) -> f32 + Copy,
    ) {
        let [m, k, n] = self.dims;
        if c1 <= c0 {
            return;
        }
        let base = self.j0 + c0;
        let width = c1 - c0;
        for kk in 0..k {
            let wr = &self.w[kk * n + base..kk * n + base + width];
            for r in 0..m {
                let a = self.x[r * k + kk];
                let ar = &mut acc[r * self.nb + c0..r * self.nb + c1];
                for (d, &wv) in ar.iter_mut().zip(wr) {
                    *d = fma(a, wv, *d);
                }
            }
        }
    }
}

/// The vector operations a micro-kernel needs; implemented per instruction set with
/// `#[inline(always)]` functions that inline into the `#[target_feature]` tile function
/// (also the prefill attention's tiles, [`crate::cpu_prefill`]).
pub(crate) trait Simd {
    /// A vector of [`Simd::LANES`] f32.
    type V: Copy;
    /// Lanes per vector.
    const LANES: usize;
    /// All lanes `a`.
    unsafe fn splat(a: f32) -> Self::V;
    /// `LANES` floats from `p` (unaligned).
    unsafe fn load(p: *const f32) -> Self::V;
    /// `v` to `LANES` floats at `p` (unaligned).
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c`, rounded once.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Hints the cache to load the line of `p`.
    unsafe fn prefetch(p: *const f32);
}

/// Rows `r0 .. r0 + MR` and tile columns `c0 .. c0 + NV * LANES` over weight rows `k0 .. k1`:
/// the accumulators come from `acc`, stay in registers over the block and go back.
///
/// # Safety
/// The ISA of `S` is available; `r0 + MR <= m`, `c0 + NV * LANES <= width`, `k1 <= k`
/// (the slices of `t` hold the shapes of `t.dims`).
#[inline(always)]
unsafe fn micro<S: Simd, const MR: usize, const NV: usize>(
    t: &Tile<'_>,
    acc: &mut [f32],
    r0: usize,
    c0: usize,
    [k0, k1]: [usize; 2],
) {
    let [_, k, n] = t.dims;
    let (x, w, nb) = (t.x.as_ptr(), t.w.as_ptr(), t.nb);
    let col = t.j0 + c0;
    let ap = acc.as_mut_ptr();
    unsafe {
        let mut c: [[S::V; NV]; MR] = std::array::from_fn(|r| {
            std::array::from_fn(|v| S::load(ap.add((r0 + r) * nb + c0 + v * S::LANES)))
        });
        // prefetch within the weight only (a prefetch past it is harmless, but keep it inside)
        let pf_end = k.min(k1 + PREFETCH_ROWS);
        for kk in k0..k1 {
            let wp = w.add(kk * n + col);
            if kk + PREFETCH_ROWS < pf_end {
                let pp = wp.add(PREFETCH_ROWS * n);
                let mut off = 0;
                while off < NV * S::LANES {
                    S::prefetch(pp.add(off));
                    off += 16;
                }
            }
            let wv: [S::V; NV] = std::array::from_fn(|v| S::load(wp.add(v * S::LANES)));
            for (r, cr) in c.iter_mut().enumerate() {
                let a = S::splat(*x.add((r0 + r) * k + kk));
                for (cv, &wvv) in cr.iter_mut().zip(&wv) {
                    *cv = S::fma(a, wvv, *cv);
                }
            }
        }
        for (r, cr) in c.iter().enumerate() {
            for (v, &cv) in cr.iter().enumerate() {
                S::store(ap.add((r0 + r) * nb + c0 + v * S::LANES), cv);
            }
        }
    }
}

/// The tile with micro-kernels of up to `MR` rows and `NV` vectors; leftover columns (past
/// the last whole micro-kernel) with [`Tile::scalar_cols`] and fused multiply-adds.
///
/// # Safety
/// The ISA of `S` is available; `acc` holds `m` rows of stride `t.nb >= t.width`.
#[inline(always)]
unsafe fn tile_simd<S: Simd, const MR: usize, const NV: usize>(t: &Tile<'_>, acc: &mut [f32]) {
    let [m, k, _] = t.dims;
    let step = NV * S::LANES;
    let whole = t.width / step * step;
    let mut k0 = 0;
    while k0 < k {
        let k1 = (k0 + K_BLOCK).min(k);
        let mut r0 = 0;
        while r0 < m {
            let rows = (m - r0).min(MR);
            let mut c0 = 0;
            while c0 < whole {
                // SAFETY: as this function's; `r0 + rows <= m`, `c0 + step <= width`.
                unsafe {
                    match rows {
                        1 => micro::<S, 1, NV>(t, acc, r0, c0, [k0, k1]),
                        2 => micro::<S, 2, NV>(t, acc, r0, c0, [k0, k1]),
                        3 => micro::<S, 3, NV>(t, acc, r0, c0, [k0, k1]),
                        4 => micro::<S, 4, NV>(t, acc, r0, c0, [k0, k1]),
                        5 => micro::<S, 5, NV>(t, acc, r0, c0, [k0, k1]),
                        _ => micro::<S, MR, NV>(t, acc, r0, c0, [k0, k1]),
                    }
                }
                c0 += step;
            }
            r0 += rows;
        }
        k0 = k1;
    }
    t.scalar_cols(whole, t.width, acc, f32::mul_add);
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    //! AVX-512F and AVX2+FMA micro-kernels.

    use std::arch::x86_64::*;

    use super::{tile_simd, Simd, Tile};

    /// AVX-512F, 16 lanes.
    pub(crate) struct Avx512;
    /// AVX2 with FMA, 8 lanes.
    pub(crate) struct Avx2;

    impl Simd for Avx512 {
        type V = __m512;
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn splat(a: f32) -> __m512 {
            unsafe { _mm512_set1_ps(a) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) }
        }
    }

    impl Simd for Avx2 {
        type V = __m256;
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn splat(a: f32) -> __m256 {
            unsafe { _mm256_set1_ps(a) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) }
        }
    }

    /// # Safety
    /// AVX-512F and FMA are available.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn tile_avx512(t: &Tile<'_>, acc: &mut [f32]) {
        unsafe { tile_simd::<Avx512, 6, 4>(t, acc) }
    }

    /// # Safety
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(t: &Tile<'_>, acc: &mut [f32]) {
        unsafe { tile_simd::<Avx2, 3, 4>(t, acc) }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    //! NEON micro-kernel.

    use std::arch::aarch64::*;

    use super::{tile_simd, Simd, Tile};

    struct Neon;

    impl Simd for Neon {
        type V = float32x4_t;
        const LANES: usize = 4;
        #[inline(always)]
        unsafe fn splat(a: f32) -> float32x4_t {
            unsafe { vdupq_n_f32(a) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> float32x4_t {
            unsafe { vld1q_f32(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: float32x4_t) {
            unsafe { vst1q_f32(p, v) }
        }
        #[inline(always)]
        unsafe fn fma(a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
            // c + a * b, rounded once
            unsafe { vfmaq_f32(c, a, b) }
        }
        #[inline(always)]
        unsafe fn prefetch(_p: *const f32) {}
    }

    /// # Safety
    /// NEON is available (AArch64 base ISA).
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn tile_neon(t: &Tile<'_>, acc: &mut [f32]) {
        unsafe { tile_simd::<Neon, 6, 4>(t, acc) }
    }
}
