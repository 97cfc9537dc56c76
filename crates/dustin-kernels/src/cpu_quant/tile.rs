//! One rayon task of a product: a tile of weight rows times a chunk of `x` rows, generic over
//! the instruction set ([`Kern`]) and the block format ([`Fmt`]).

use super::blocks::{self, ActGroup, Fmt, WGroup, GROUP};
use super::formats;
#[cfg(target_arch = "aarch64")]
use super::neon;
#[cfg(target_arch = "x86_64")]
use super::x86;
use super::{QuantIsa, QuantMatrix, QuantType, MAX_CHUNK_ROWS, PREFETCH_BYTES};

/// One rayon task: weight rows `j0 .. j0 + width` times `x` rows `r0 .. r0 + xc`.
pub(super) struct Task<'a> {
    pub w: &'a QuantMatrix,
    /// All rows' activations, `groups` per row.
    pub acts: &'a [ActGroup],
    pub groups: usize,
    pub r0: usize,
    pub xc: usize,
    pub j0: usize,
    pub width: usize,
    pub bias: Option<&'a [f32]>,
}

/// A group product of one instruction set: adds the values of the 8 blocks of `w` times `a`
/// to the 8 lanes of `acc` (`blocks::dot_portable` is the definition).
pub(super) trait Kern {
    /// # Safety
    /// The instruction set of `Self` is available.
    unsafe fn dot<F: Fmt>(w: &WGroup, a: &ActGroup, acc: &mut [f32; 8]);

    /// Hints the cache to load the line of `p` (which need not be in bounds); nothing by
    /// default.
    ///
    /// # Safety
    /// The instruction set of `Self` is available.
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}

    /// `f16` bits to `f32`, exactly ([`blocks::f16_to_f32`] by default).
    ///
    /// # Safety
    /// The instruction set of `Self` is available.
    #[inline(always)]
    unsafe fn f16(h: u16) -> f32 {
        blocks::f16_to_f32(h)
    }

    /// `0x10` in element `i` where bit `i` of `qh` is set ([`blocks::fifth_bits`] by
    /// default).
    ///
    /// # Safety
    /// The instruction set of `Self` is available.
    #[inline(always)]
    unsafe fn fifth_bits(qh: u32) -> [u8; 32] {
        blocks::fifth_bits(qh)
    }

    /// A `Q4_K` super-block's 128 bytes of `qs` into a group's `q` (laid out by
    /// [`blocks::run`]): byte `32 c + l` holds element `l` of block `2 c` (low nibble) and of
    /// block `2 c + 1` (high nibble). By default a byte loop (NEON, portable); x86 overrides
    /// it with whole vectors.
    ///
    /// # Safety
    /// The instruction set of `Self` is available.
    #[inline(always)]
    unsafe fn k4_nibbles(qs: &[u8; 128], q: &mut [u8; GROUP]) {
        for c in 0..4 {
            for h in 0..2 {
                for j in 0..16 {
                    let v = qs[32 * c + 16 * h + j];
                    q[blocks::run(2 * c, h) + j] = v & 0x0F;
                    q[blocks::run(2 * c + 1, h) + j] = v >> 4;
                }
            }
        }
    }

    /// A `Q6_K` super-block's 6-bit quants (`ql`, its 128 bytes of low nibbles, and `qh`, its
    /// 64 bytes of high bit pairs) into a group's `q` (laid out by [`blocks::run`]): element
    /// `l` of block `4 n + k` takes a nibble of `ql[64 n + l]` (`k` even) or `ql[64 n + l +
    /// 32]` (`k` odd), low for `k < 2`, high else, and bits `2 k .. 2 k + 2` of
    /// `qh[32 n + l]`, as ggml's `dequantize_row_q6_K`. By default a byte loop (NEON,
    /// portable); x86 overrides it with whole vectors.
    ///
    /// # Safety
    /// The instruction set of `Self` is available.
    #[inline(always)]
    unsafe fn q6k_quants(ql: &[u8; 128], qh: &[u8; 64], q: &mut [u8; GROUP]) {
        for n in 0..2 {
            for h in 0..2 {
                for j in 0..16 {
                    let l = 16 * h + j;
                    let (a, b) = (ql[64 * n + l], ql[64 * n + l + 32]);
                    let bits = qh[32 * n + l];
                    q[blocks::run(4 * n, h) + j] = (a & 0x0F) | ((bits & 3) << 4);
                    q[blocks::run(4 * n + 1, h) + j] = (b & 0x0F) | (((bits >> 2) & 3) << 4);
                    q[blocks::run(4 * n + 2, h) + j] = (a >> 4) | (((bits >> 4) & 3) << 4);
                    q[blocks::run(4 * n + 3, h) + j] = (b >> 4) | (((bits >> 6) & 3) << 4);
                }
            }
        }
    }

    /// Vectors `2 k` and `2 k + 1` of a group (`out[..32]` and `out[32..]`, laid out by
    /// [`blocks::run`]) from the 32 bytes of blocks `k` (`a`) and `k + 4` (`b`) in element
    /// order (`Q8_0`'s quants): half `h` of `a`, then half `h` of `b`, in vector `2 k + h`.
    /// Each vector is written whole, so that the product's 32-byte loads can take it from
    /// the store buffer.
    ///
    /// # Safety
    /// The instruction set of `Self` is available.
    #[inline(always)]
    unsafe fn pair_bytes(a: &[u8; 32], b: &[u8; 32], out: &mut [u8; 64]) {
        for h in 0..2 {
            let mut v = [0u8; 32];
            v[..16].copy_from_slice(&a[16 * h..16 * h + 16]);
            v[16..].copy_from_slice(&b[16 * h..16 * h + 16]);
            out[32 * h..32 * h + 32].copy_from_slice(&v);
        }
    }

    /// Vectors `2 k` and `2 k + 1` of a group (`out[..32]` and `out[32..]`, laid out by
    /// [`blocks::run`]) from the 16 bytes of nibbles of blocks `k` (`a`) and `k + 4` (`b`) of
    /// a `Q4_*` / `Q5_*` format: low nibbles are elements 0..16, high nibbles 16..32, and
    /// with `FIFTH`, bit `i` of `ha` (`hb`) is bit 4 of element `i` of block `k` (`k + 4`).
    /// By default from [`Kern::fifth_bits`] and byte loops (NEON, portable); x86 overrides it
    /// with one vector of each block pair's nibbles.
    ///
    /// # Safety
    /// The instruction set of `Self` is available.
    #[inline(always)]
    unsafe fn pair_nibbles<const FIFTH: bool>(
        a: &[u8; 16],
        b: &[u8; 16],
        ha: u32,
        hb: u32,
        out: &mut [u8; 64],
    ) {
        let (fa, fb) = if FIFTH {
            // SAFETY: as this function's.
            unsafe { (Self::fifth_bits(ha), Self::fifth_bits(hb)) }
        } else {
            ([0; 32], [0; 32])
        };
        // each vector built whole, then written (as `pair_bytes`)
        let (mut lo, mut hi) = ([0u8; 32], [0u8; 32]);
        for j in 0..16 {
            lo[j] = (a[j] & 0x0F) | fa[j];
            lo[16 + j] = (b[j] & 0x0F) | fb[j];
            hi[j] = (a[j] >> 4) | fa[16 + j];
            hi[16 + j] = (b[j] >> 4) | fb[16 + j];
        }
        out[..32].copy_from_slice(&lo);
        out[32..].copy_from_slice(&hi);
    }
}

/// The portable group product.
pub(super) struct Portable;

impl Kern for Portable {
    #[inline(always)]
    unsafe fn dot<F: Fmt>(w: &WGroup, a: &ActGroup, acc: &mut [f32; 8]) {
        blocks::dot_portable::<F>(w, a, acc)
    }
}

/// The tile `t` into `out` (`xc` rows of `width` values): per weight row, each group decoded
/// once and multiplied with every `x` row of the chunk, then the lanes summed and the bias
/// added.
///
/// # Safety
/// The instruction set of `K` is available; `t.xc <= MAX_CHUNK_ROWS`, the ranges of `t` lie in
/// its slices and `out.len() == t.xc * t.width` (as `quant_matmul_with` builds them).
#[inline(always)]
pub(super) unsafe fn tile_body<K: Kern, F: Fmt>(t: &Task<'_>, out: &mut [f32]) {
    let rb = t.w.row_bytes();
    let mut wg = WGroup::ZERO;
    let mut acc = [[0.0f32; 8]; MAX_CHUNK_ROWS];
    let acc = &mut acc[..t.xc];
    let acts = &t.acts[t.r0 * t.groups..(t.r0 + t.xc) * t.groups];
    // bytes of a whole group
    let gb = F::TY.block_bytes() * (GROUP / F::TY.block_elems());
    for c in 0..t.width {
        let j = t.j0 + c;
        let row = &t.w.data[j * rb..(j + 1) * rb];
        acc.fill([0.0; 8]);
        for g in 0..t.groups {
            let ahead = row.as_ptr().wrapping_add(g * gb + PREFETCH_BYTES);
            for line in (0..gb).step_by(64) {
                // SAFETY: as this function's; a prefetch does not access memory.
                unsafe { K::prefetch(ahead.wrapping_add(line)) }
            }
            // SAFETY: as this function's.
            unsafe { F::decode::<K>(row, g, &mut wg) };
            for (a, xa) in acc.iter_mut().zip(acts[g..].iter().step_by(t.groups)) {
                // SAFETY: as this function's.
                unsafe { K::dot::<F>(&wg, xa, a) }
            }
        }
        let bias = t.bias.map(|b| b[j]);
        for (r, a) in acc.iter().enumerate() {
            out[r * t.width + c] = blocks::finish(a, bias);
        }
    }
}

/// One tile with `isa` (available) in format `F`.
fn tile_in<F: Fmt>(isa: QuantIsa, t: &Task<'_>, out: &mut [f32]) {
    debug_assert_eq!(F::TY, t.w.ty);
    match isa {
        // SAFETY: the features were detected at run time (`QuantIsa::available`, checked by
        // `quant_matmul_with`); the task's ranges are built in range there.
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx512Vnni => unsafe { x86::tile_vnni::<F>(t, out) },
        #[cfg(target_arch = "x86_64")]
        QuantIsa::AvxVnni => unsafe { x86::tile_avxvnni::<F>(t, out) },
        #[cfg(target_arch = "x86_64")]
        QuantIsa::Avx2 => unsafe { x86::tile_avx2::<F>(t, out) },
        #[cfg(target_arch = "aarch64")]
        QuantIsa::NeonDot => unsafe { neon::tile_neon_dot::<F>(t, out) },
        #[cfg(target_arch = "aarch64")]
        QuantIsa::Neon => unsafe { neon::tile_neon::<F>(t, out) },
        // SAFETY: the portable product needs no feature; ranges as above.
        _ => unsafe { tile_body::<Portable, F>(t, out) },
    }
}

/// One tile with `isa` in the weight's format.
pub(super) fn run_tile(isa: QuantIsa, t: &Task<'_>, out: &mut [f32]) {
    match t.w.ty {
        QuantType::Q4_0 => tile_in::<formats::Q4_0>(isa, t, out),
        QuantType::Q4_1 => tile_in::<formats::Q4_1>(isa, t, out),
        QuantType::Q5_0 => tile_in::<formats::Q5_0>(isa, t, out),
        QuantType::Q5_1 => tile_in::<formats::Q5_1>(isa, t, out),
        QuantType::Q8_0 => tile_in::<formats::Q8_0>(isa, t, out),
        QuantType::Q4K => tile_in::<formats::Q4K>(isa, t, out),
        QuantType::Q5K => tile_in::<formats::Q5K>(isa, t, out),
        QuantType::Q6K => tile_in::<formats::Q6K>(isa, t, out),
    }
}
