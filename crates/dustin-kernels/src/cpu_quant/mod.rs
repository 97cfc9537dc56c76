//! Matrix products on the CPU over weights kept in their GGUF (ggml) block formats:
//! `y = x . W^T + bias` with `W` in `Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`, `Q4_K`, `Q5_K` or
//! `Q6_K` blocks (layouts of ggml's `ggml-common.h`), as llama.cpp's CPU backend computes them.
//!
//! Why: decoding is bound by the bytes of weights read per token. Qwen2.5-Coder-1.5B in f32
//! is 6.2 GB; its Q4_K_M file (`Q4_K` and `Q6_K` blocks) is 1.1 GB. Dequantizing to f32 at
//! load time throws that away; reading the blocks in the product keeps it.
//!
//! How (the scheme of ggml's `ggml_vec_dot_*_q8_0` / `*_q8_K`):
//! - **Activations** are quantized once per call, per row, in blocks of 32: `d = amax / 127`
//!   (f32), `q = round(x / d)` in `i8`, with the sums of `q` per block and per half block
//!   (`blocks::ActGroup`, rows zero-padded to groups of 256).
//! - **Weights** are decoded a group of 256 elements at a time (one k-quant super-block, or 8
//!   blocks of 32) into small integers (4 to 8 bits) and per-block f32 scales
//!   (`blocks::WGroup`); each group is decoded once per tile and chunk of `x` rows and then
//!   multiplied with every row of the chunk.
//! - **Per block of 32**, the integer dot product `D = sum q_w q_a` is exact in `i32`; the
//!   formats' offsets (`Q4_0`'s 8, `Q5_0`'s 16, `Q6_K`'s 32) come off through the activation
//!   sums (`dot(q_w - o, q_a) = D - o sum(q_a)`), the minima of `Q4_1`, `Q5_1`, `Q4_K`,
//!   `Q5_K` through the block sum times the min, and `Q6_K`'s sub-block scales of 16 multiply
//!   its two half dot products. The block's value is then
//!   `c = d_a * (scale * D)` (`d_a * (scale * D + min * sum(q_a))` with minima), one f32
//!   rounding per operation, no fused multiply-add.
//! - **Float accumulation**: block `b` of a row goes to lane `b mod 8` of 8 f32 accumulators,
//!   in block order; the output is `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`, plus
//!   the bias last. Every instruction set computes the same integers and the same float
//!   operations in this order, so [`QuantIsa::Portable`] and the SIMD paths agree bit for
//!   bit, and a row's output does not depend on the other rows of `x` nor on the tiling or
//!   thread split (the speculative decoder relies on this batch invariance).
//! - **SIMD** (chosen at run time, [`QuantIsa::detect`]): on x86-64, AVX2 (`vpmaddubsw`,
//!   signed weights through the sign trick), AVX-VNNI or AVX-512 VNNI on 256-bit vectors
//!   (`vpdpbusd`), with F16C for the scales (module `x86`). Both operands of a group lay
//!   their 32-byte vectors out so that vector `2 k + h` holds half `h` of blocks `k` and
//!   `k + 4` (`blocks::run`): the products of two vectors summed in lanes of 4 bytes leave
//!   blocks `k` and `k + 4` in one accumulator, and three `vphaddd` per group and row put
//!   block `b` in lane `b` for the float part. On AArch64, NEON on 128-bit vectors (module
//!   `neon`), each vector a half block of that layout: `sdot` where the CPU has the dot
//!   product extension ([`QuantIsa::NeonDot`]), else `smull` / `smlal2` and `sadalp`
//!   ([`QuantIsa::Neon`], base ISA); two levels of `addp` put 4 blocks in the 4 lanes of
//!   the float part, a multiply and an add apart as on x86 (no `fmla`). The NEON paths have
//!   been run (bit for bit against the portable one) under user-mode emulation (QEMU) only,
//!   not on Arm hardware, and are not timed. The decoders are plain Rust over fixed-size
//!   arrays, inlined into each instruction set's `#[target_feature]` function, where the
//!   compiler vectorizes them; on x86-64 the quants of the 32-element formats, `Q4_K` and
//!   `Q6_K` are unpacked with AVX2 instead (two blocks' nibbles, or bytes, a 32-byte vector
//!   written whole: at the 0.5B draft's gate projection, `[4864 x 896]` in `Q5_0`, a
//!   product of one row took about 0.75x the time of the compiler's version on a 2-core
//!   AMD EPYC; `Q6_K` 0.9x at the 1.5B's gate; `docs/perf.md`, "CPU: quantized weights"). Other targets run the portable path.
//! - **Threads**: tiles of output rows (weight rows) on the rayon pool (the one Burn-flex
//!   uses). `x` rows go in chunks of at most [`MAX_CHUNK_ROWS`] whose quantized activations
//!   fit in [`CHUNK_BYTES`] (L2), so prefill products of thousands of rows decode each weight
//!   group once per chunk and keep their activations in cache.
//!
//! Accuracy: against the float64 product with the dequantized weights, the error is that of
//! rounding the activations (at most half a step, `amax / 254` per element, times `|w|`)
//! plus f32 rounding of the per-block sums (`crates/dustin-qwen/tests/quant_matmul.rs`).
//!
//! Cost (`cargo bench -p dustin-kernels --bench quant_gemm`, 2-core Xeon VM (Emerald Rapids),
//! [`QuantIsa::AvxVnni`], cold weights, medians of 2 runs; ms, and GB/s of weight bytes read):
//!
//! | Qwen2.5-1.5B weight | m | `Q4_K` | `Q6_K` | f32 ([`crate::cpu_skinny`]) |
//! |---|---|---|---|---|
//! | gate `[8960 x 1536]` | 1 | 0.55 (14.1) | 0.81 (13.9) | 3.46 (15.9) |
//! | | 5 | 0.95 | 1.50 | 4.41 |
//! | | 16 | 2.59 | 3.91 | 7.24 |
//! | LM head `[151936 x 1536]` | 1 | 9.1 (14.4) | 13.5 (14.2) | 52.5 (17.8) |
//! | | 5 | 16.8 | 24.1 | 79.8 |
//!
//! A prefill chunk of 512 rows of the gate projection took 101 ms in `Q4_K` against 144 ms
//! for Burn's f32 matmul.

use rayon::prelude::*;

use crate::{KernelError, Result};

mod blocks;
mod decode;
mod formats;
#[cfg(target_arch = "aarch64")]
mod neon;
mod tile;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use blocks::GROUP;
// the AMX products' decoder (`cpu_amx`, x86-64 Linux only)
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use decode::group_of;
pub use decode::{dequantize_group, dequantize_rows};

use blocks::ActGroup;
use tile::{run_tile, Task};

/// Most `x` rows of a chunk (rows whose products with a weight group are computed while it
/// is decoded): bounds the per-tile accumulators, 64 rows of 8 f32 (2 KiB, L1).
pub const MAX_CHUNK_ROWS: usize = 64;

/// Bytes of quantized activations a chunk of `x` rows keeps (352 bytes per 256 elements):
/// 256 KiB stays in a 1-2 MiB L2 beside the weights streaming through.
pub const CHUNK_BYTES: usize = 256 << 10;

/// Most weight rows per tile (a tile is one rayon task).
pub const MAX_TILE_ROWS: usize = 256;

/// Bytes ahead of the group being decoded that a tile prefetches (the weight rows of a tile
/// are contiguous): about a memory latency (~100 ns) of decoding at one row of `x`, a few
/// groups of 144-272 bytes. With the hardware prefetcher alone a `Q4_K` product of one row
/// read 9.4 GB/s, 12.4 GB/s with this (gate projection of Qwen2.5-1.5B, 2-core Xeon).
pub const PREFETCH_BYTES: usize = 1024;

/// Work (weight bytes times `x` rows) below which the product runs on the calling thread:
/// a few microseconds, about what a rayon fork-join costs.
const PARALLEL_MIN_WORK: usize = 1 << 18;

/// ggml block formats the products read (`enum ggml_type` of ggml's `ggml.h`; block layouts
/// of `ggml-common.h`, see the table in this module's `formats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's names
pub enum QuantType {
    /// `block_q4_0`: 32 elements, f16 `d`, 16 bytes of nibbles; `w = d * (q - 8)`.
    Q4_0,
    /// `block_q4_1`: 32 elements, f16 `d` and `m`, 16 bytes of nibbles; `w = d * q + m`.
    Q4_1,
    /// `block_q5_0`: 32 elements, f16 `d`, 32 high bits, 16 bytes of nibbles;
    /// `w = d * (q - 16)`.
    Q5_0,
    /// `block_q5_1`: 32 elements, f16 `d` and `m`, high bits, nibbles; `w = d * q + m`.
    Q5_1,
    /// `block_q8_0`: 32 elements, f16 `d`, 32 `i8`; `w = d * q`.
    Q8_0,
    /// `block_q4_K`: 256 elements in 8 sub-blocks of 32 with 6-bit scales and minima;
    /// `w = d * sc * q - dmin * m`.
    Q4K,
    /// `block_q5_K`: `Q4_K` with a fifth bit per element.
    Q5K,
    /// `block_q6_K`: 256 elements in 16 sub-blocks of 16 with `i8` scales;
    /// `w = d * sc * (q - 32)`.
    Q6K,
}

impl QuantType {
    /// The type for a ggml type id (`Q4_0` = 2, `Q4_1` = 3, `Q5_0` = 6, `Q5_1` = 7,
    /// `Q8_0` = 8, `Q4_K` = 12, `Q5_K` = 13, `Q6_K` = 14); `None` for any other id.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Some(match id {
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            _ => return None,
        })
    }

    /// Elements per block: 32, or 256 (`QK_K`) for the k-quants.
    pub const fn block_elems(self) -> usize {
        match self {
            Self::Q4_0 | Self::Q4_1 | Self::Q5_0 | Self::Q5_1 | Self::Q8_0 => 32,
            Self::Q4K | Self::Q5K | Self::Q6K => 256,
        }
    }

    /// Bytes per block: 18, 20, 22, 24, 34, 144, 176, 210.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4K => 144,
            Self::Q5K => 176,
            Self::Q6K => 210,
        }
    }

    /// ggml's name: `"Q4_0"`, `"Q4_1"`, `"Q5_0"`, `"Q5_1"`, `"Q8_0"`, `"Q4_K"`, `"Q5_K"`,
    /// `"Q6_K"`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
        }
    }
}

/// A weight `[rows, cols]` = `[out_features, in_features]` in GGUF's layout: each of the
/// `rows` rows is `cols / block_elems` consecutive blocks (a GGUF 2-D tensor with
/// `ne0 = cols`, `ne1 = rows`, exactly as the file stores it).
#[derive(Clone)]
pub struct QuantMatrix {
    ty: QuantType,
    rows: usize,
    cols: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for QuantMatrix {
    /// The type and shape (not the bytes).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl QuantMatrix {
    /// A weight of `rows` rows of `cols` elements from its blocks `data` (row-major, as a
    /// GGUF file stores the tensor).
    ///
    /// # Errors
    /// [`KernelError::InvalidInput`] naming `cols` when it is not a multiple of
    /// [`QuantType::block_elems`], `data` when its length is not
    /// `rows * cols / block_elems * block_bytes` (or that size overflows).
    pub fn new(ty: QuantType, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self> {
        let be = ty.block_elems();
        if !cols.is_multiple_of(be) {
            return Err(KernelError::invalid(
                "cols",
                format!("a multiple of {be} (the elements of a {} block)", ty.name()),
                cols,
            ));
        }
        let need = (cols / be)
            .checked_mul(ty.block_bytes())
            .and_then(|r| r.checked_mul(rows));
        if need != Some(data.len()) {
            return Err(KernelError::invalid(
                "data",
                match need {
                    Some(n) => format!(
                        "{n} bytes ({rows} rows of {} {} blocks of {} bytes)",
                        cols / be,
                        ty.name(),
                        ty.block_bytes()
                    ),
                    None => format!("a size that fits in memory for [{rows}, {cols}]"),
                },
                format!("{} bytes", data.len()),
            ));
        }
        Ok(Self {
            ty,
            rows,
            cols,
            data,
        })
    }

    /// The block format.
    pub fn quant_type(&self) -> QuantType {
        self.ty
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The blocks, row after row.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Bytes per row: `cols / block_elems * block_bytes`.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_elems() * self.ty.block_bytes()
    }

    /// Bytes of the whole weight (`data().len()`): what a product reads.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Checks the operands of a product `x . W^T + bias`: `x` holds `m` rows of
    /// [`cols`](Self::cols), `bias` (when given) one value a row of the weight.
    ///
    /// # Errors
    /// [`KernelError::Shape`] naming `x` or `bias`.
    pub(crate) fn check_operands(&self, x: &[f32], m: usize, bias: Option<&[f32]>) -> Result<()> {
        if m.checked_mul(self.cols) != Some(x.len()) {
            return Err(KernelError::Shape {
                name: "x",
                expected: vec![m, self.cols],
                found: vec![x.len()],
            });
        }
        if let Some(b) = bias {
            if b.len() != self.rows {
                return Err(KernelError::Shape {
                    name: "bias",
                    expected: vec![self.rows],
                    found: vec![b.len()],
                });
            }
        }
        Ok(())
    }
}

/// An instruction set the products run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuantIsa {
    /// x86-64 AVX-512 VNNI with AVX-512VL (and AVX2): `vpdpbusd` on 256-bit vectors (the
    /// compiler may use 512-bit vectors in the decoders).
    Avx512Vnni,
    /// x86-64 AVX-VNNI (VEX-encoded `vpdpbusd`, no AVX-512; with AVX2): preferred where both
    /// VNNI kinds exist.
    AvxVnni,
    /// x86-64 AVX2 (and F16C, as every instruction set here): `vpmaddubsw` and `vpmaddwd`.
    Avx2,
    /// AArch64 NEON with the dot product extension (`FEAT_DotProd`, optional from Armv8.2,
    /// required from Armv8.4): `sdot` on 128-bit vectors.
    NeonDot,
    /// AArch64 NEON (base ISA): `smull` / `smlal2` to `i16` and `sadalp` to `i32`.
    Neon,
    /// Any target: scalar integer dot products (vectorized as far as the compiler's
    /// baseline target allows).
    Portable,
}

impl QuantIsa {
    /// The instruction sets this machine runs, best first ([`QuantIsa::Portable`] always).
    pub fn available() -> Vec<Self> {
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            // F16C came with AVX2 on every x86 core (Haswell, Zen)
            let avx2 = has!("avx2") && has!("f16c");
            // AVX-VNNI first: where a core has both, the code compiled without AVX-512 (256-bit
            // vectors only) ran 5-20% faster (a 2-core Emerald Rapids Xeon, interleaved timings)
            if avx2 && has!("avxvnni") {
                v.push(Self::AvxVnni);
            }
            if avx2 && has!("avx512f") && has!("avx512vl") && has!("avx512vnni") {
                v.push(Self::Avx512Vnni);
            }
            if avx2 {
                v.push(Self::Avx2);
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            // NEON is part of the AArch64 base ISA; detected all the same for targets built
            // without it
            if has!("neon") {
                if has!("dotprod") {
                    v.push(Self::NeonDot);
                }
                v.push(Self::Neon);
            }
        }
        v.push(Self::Portable);
        v
    }

    /// The best instruction set of this machine (the first of [`QuantIsa::available`]).
    pub fn detect() -> Self {
        Self::available()[0]
    }

    /// Its name, for reports: `"avx512vnni"`, `"avxvnni"`, `"avx2"`, `"neondot"`, `"neon"` or
    /// `"portable"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512Vnni => "avx512vnni",
            Self::AvxVnni => "avxvnni",
            Self::Avx2 => "avx2",
            Self::NeonDot => "neondot",
            Self::Neon => "neon",
            Self::Portable => "portable",
        }
    }
}

/// The instruction set [`quant_matmul`] uses on this machine ([`QuantIsa::detect`]'s name).
pub fn quant_isa() -> &'static str {
    QuantIsa::detect().name()
}

/// `y = x . W^T + bias`: `x` `[m, cols]` row-major f32, `w` `[rows, cols]` in ggml blocks,
/// `bias` `[rows]`; returns `y` `[m, rows]` row-major. Any `m` (1 to 64 for decoding and
/// verification, thousands for prefill); each weight group is decoded once per tile and
/// chunk of up to [`MAX_CHUNK_ROWS`] rows (module docs). Runs with [`QuantIsa::detect`].
///
/// # Errors
/// [`KernelError::Shape`] naming `x` when its length is not `m * cols`, `bias` when its
/// length is not `rows`; [`KernelError::InvalidInput`] naming `m` when `m * rows` overflows.
pub fn quant_matmul(
    x: &[f32],
    m: usize,
    w: &QuantMatrix,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>> {
    quant_matmul_with(QuantIsa::detect(), x, m, w, bias)
}

/// [`quant_matmul`] with the instruction set `isa` (for tests and benchmarks): the same
/// values, bit for bit, on every instruction set.
///
/// # Errors
/// As [`quant_matmul`]; [`KernelError::Unsupported`] when this machine lacks `isa`
/// ([`QuantIsa::available`]).
pub fn quant_matmul_with(
    isa: QuantIsa,
    x: &[f32],
    m: usize,
    w: &QuantMatrix,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>> {
    if !QuantIsa::available().contains(&isa) {
        return Err(KernelError::Unsupported(format!(
            "instruction set {} on this machine",
            isa.name()
        )));
    }
    w.check_operands(x, m, bias)?;
    let (rows, cols) = (w.rows, w.cols);
    let Some(n) = m.checked_mul(rows) else {
        return Err(KernelError::invalid(
            "m",
            format!("an output [m, {rows}] that fits in memory"),
            m,
        ));
    };
    let mut y = vec![0.0f32; n];
    if m == 0 || rows == 0 {
        return Ok(y);
    }
    let groups = cols.div_ceil(GROUP);
    let parallel = w.bytes().saturating_mul(m) >= PARALLEL_MIN_WORK;
    let acts = quantize(isa, x, m, cols, groups, parallel);

    let threads = if parallel {
        rayon::current_num_threads()
    } else {
        1
    };
    let tr = rows.div_ceil(4 * threads).clamp(1, MAX_TILE_ROWS);
    let chunk = (CHUNK_BYTES / (groups.max(1) * size_of::<ActGroup>())).clamp(1, MAX_CHUNK_ROWS);
    let task = |r0: usize, xc: usize, t: usize, out: &mut [f32]| {
        let j0 = t * tr;
        let width = tr.min(rows - j0);
        let task = Task {
            w,
            acts: &acts,
            groups,
            r0,
            xc,
            j0,
            width,
            bias,
        };
        run_tile(isa, &task, &mut out[..xc * width]);
    };
    if m == 1 {
        // the tile-major layout of one row is the row itself
        let run = |(t, out): (usize, &mut [f32])| task(0, 1, t, out);
        if parallel {
            y.par_chunks_mut(tr).enumerate().for_each(run);
        } else {
            y.chunks_mut(tr).enumerate().for_each(run);
        }
        return Ok(y);
    }
    let tiles = rows.div_ceil(tr);
    let xc_max = chunk.min(m);
    // tile-major results of one chunk: tile t holds `xc x width` values
    let mut tmp = vec![0.0f32; tiles * xc_max * tr];
    let mut r0 = 0;
    while r0 < m {
        let xc = xc_max.min(m - r0);
        let used = &mut tmp[..tiles * xc * tr];
        let run = |(t, out): (usize, &mut [f32])| task(r0, xc, t, out);
        if parallel {
            used.par_chunks_mut(xc * tr).enumerate().for_each(run);
        } else {
            used.chunks_mut(xc * tr).enumerate().for_each(run);
        }
        for (t, tile) in used.chunks(xc * tr).enumerate() {
            let j0 = t * tr;
            let width = tr.min(rows - j0);
            for (r, src) in tile.chunks(width).take(xc).enumerate() {
                let at = (r0 + r) * rows + j0;
                y[at..at + width].copy_from_slice(src);
            }
        }
        r0 += xc;
    }
    Ok(y)
}

/// The quantized activations of `x` `[m, cols]`: `groups` [`ActGroup`]s per row.
fn quantize(
    isa: QuantIsa,
    x: &[f32],
    m: usize,
    cols: usize,
    groups: usize,
    parallel: bool,
) -> Vec<ActGroup> {
    let mut acts = vec![ActGroup::ZERO; m * groups];
    if groups == 0 {
        return acts;
    }
    let one = |(xr, out): (&[f32], &mut [ActGroup])| match isa {
        // SAFETY: `isa` is available (checked by `quant_matmul_with`).
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx512Vnni | QuantIsa::AvxVnni | QuantIsa::Avx2 => unsafe {
            x86::quantize_avx2(xr, out)
        },
        _ => blocks::quantize_row(xr, out),
    };
    if parallel && m > 1 {
        x.par_chunks(cols)
            .zip(acts.par_chunks_mut(groups))
            .for_each(one);
    } else {
        x.chunks(cols).zip(acts.chunks_mut(groups)).for_each(one);
    }
    acts
}
