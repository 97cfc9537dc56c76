//! The operands of the tile products in bf16: activations split into `hi` and `lo` `A`
//! tiles, blocks of weights decoded, split and laid out as `B` tiles, and the 64-byte
//! aligned buffers they live in.

use rayon::prelude::*;

use super::{K_STEP, PANEL, ROW_BLOCK};
use crate::cpu_quant::{group_of, QuantMatrix, GROUP};

/// The bits of `v` rounded to the nearest bf16 (ties to even), in the high half of an f32's
/// bits (the low half zero); a NaN stays a NaN. Branch-free, so loops over it vectorize.
#[inline(always)]
fn round_bits(b: u32) -> u32 {
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    // a NaN's payload could carry into the sign: keep it a (quiet) NaN instead
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    if nan {
        (b | 0x0040_0000) & 0xffff_0000
    } else {
        rounded
    }
}

/// `v = hi + lo` in bf16: `hi = bf16(v)`, `lo = bf16(v - hi)` (the subtraction is exact).
#[inline(always)]
pub(super) fn split(v: f32) -> (u16, u16) {
    let hi = round_bits(v.to_bits());
    let lo = round_bits((v - f32::from_bits(hi)).to_bits());
    ((hi >> 16) as u16, (lo >> 16) as u16)
}

/// The `hi` and `lo` pairs of `(a, b)`: `a` in the low half of each.
#[inline(always)]
fn split_pair(a: f32, b: f32) -> (u32, u32) {
    let (ha, la) = split(a);
    let (hb, lb) = split(b);
    (
        u32::from(ha) | (u32::from(hb) << 16),
        u32::from(la) | (u32::from(lb) << 16),
    )
}

/// A cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// Element types whose all-zero bits are a value (so a zeroed buffer is initialized).
pub(super) trait Zeroable: Copy {}
impl Zeroable for u16 {}
impl Zeroable for u32 {}
impl Zeroable for f32 {}

/// A zeroed buffer that starts on a 64-byte boundary: a tile load whose rows cross cache
/// lines ran 5 times slower (the allocator's large blocks start 16 bytes past a page).
pub(super) struct Aligned<T: Zeroable> {
    lines: Vec<Line>,
    len: usize,
    _values: std::marker::PhantomData<T>,
}

impl<T: Zeroable> Aligned<T> {
    /// `len` zeros.
    pub(super) fn zeroed(len: usize) -> Self {
        let bytes = len * size_of::<T>();
        Self {
            lines: vec![Line([0; 64]); bytes.div_ceil(64)],
            len,
            _values: std::marker::PhantomData,
        }
    }

    /// The values.
    pub(super) fn as_slice(&self) -> &[T] {
        // SAFETY: the lines are `len * size_of::<T>()` or more initialized bytes, aligned to
        // 64 (more than `T`'s alignment), and all-zero bits are a `T` (`Zeroable`); every
        // write goes through a `T`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast(), self.len) }
    }

    /// The values, mutable.
    pub(super) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as `as_slice`, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast(), self.len) }
    }
}

/// Values of one `A` tile: 16 rows of 32 bf16.
pub(super) const A_TILE: usize = 512;

/// `x` `[m, k]` split into `hi` and `lo` bf16 `A` tiles, rows past `m` zero: for row block
/// `r` (32 rows), step `s` (32 `k`) and half `h`, the tile at `((r k / 32 + s) 2 + h) A_TILE`
/// holds rows `32 r + 16 h ..` (16) at columns `32 s ..` (32), 64 bytes a row. A tile of
/// rows of `x` itself would read 16 rows `2 k` bytes apart, a page or more each; the tiles
/// laid out whole read one kilobyte.
pub(super) fn split_rows(x: &[f32], k: usize, m_pad: usize) -> (Aligned<u16>, Aligned<u16>) {
    use std::arch::is_x86_feature_detected as has;
    let mut hi = Aligned::zeroed(m_pad * k);
    let mut lo = Aligned::zeroed(m_pad * k);
    let block = ROW_BLOCK * k;
    let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl");
    hi.as_mut_slice()
        .par_chunks_mut(block)
        .zip(lo.as_mut_slice().par_chunks_mut(block))
        .enumerate()
        .for_each(|(r, (h, l))| {
            let rows = &x[(r * ROW_BLOCK * k).min(x.len())..((r + 1) * ROW_BLOCK * k).min(x.len())];
            if avx512 {
                // SAFETY: the features were detected above.
                unsafe { split_block_avx512(rows, k, h, l) }
            } else {
                split_block(rows, k, h, l)
            }
        });
    (hi, lo)
}

/// [`split_block`] compiled with AVX-512.
///
/// # Safety
/// The CPU has AVX-512F, BW and VL.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
unsafe fn split_block_avx512(rows: &[f32], k: usize, h: &mut [u16], l: &mut [u16]) {
    split_block(rows, k, h, l)
}

/// The rows `rows` (at most 32 of `k` values) of one row block into its `A` tiles `h`, `l`.
#[inline(always)]
fn split_block(rows: &[f32], k: usize, h: &mut [u16], l: &mut [u16]) {
    for (i, row) in rows.chunks_exact(k).enumerate() {
        let (half, i) = (i / 16, i % 16);
        for (s, seg) in row.chunks_exact(K_STEP).enumerate() {
            let at = (2 * s + half) * A_TILE + 32 * i;
            // slices of the tile row first, so that the loop has no bounds checks and
            // vectorizes
            let (hs, ls) = (&mut h[at..at + K_STEP], &mut l[at..at + K_STEP]);
            for ((hv, lv), &v) in hs.iter_mut().zip(ls.iter_mut()).zip(seg) {
                (*hv, *lv) = split(v);
            }
        }
    }
}

/// Values of one `B` tile: 16 rows (pairs of `k`) of 16 columns of 2 bf16, as 256 pairs.
pub(super) const B_TILE_PAIRS: usize = 256;

/// Steps of [`K_STEP`] in a block of `k`: one ggml group of 256 values, what the decoders
/// produce at a time.
pub(super) const BLOCK_STEPS: usize = GROUP / K_STEP;

/// The weight rows `j0 .. j0 + panels * PANEL` (those past the weight zero), elements
/// `256 g ..` of `k` (group `g` of the weight's rows, `steps` steps of 32), split into `hi`
/// and `lo` `B` tiles: the tile of step `s`, panel `p` and half `t` at
/// `((s panels + p) 2 + t) B_TILE_PAIRS` holds in row `i`, column `j`, the pair
/// `w[j0 + 32 p + 16 t + j][256 g + 32 s + 2 i + e]` (`e = 0, 1`; `e = 0` in the low half).
/// Compiled for AVX-512 where the CPU has it (every CPU with AMX does), so that the decoders
/// and the splits vectorize; `g` must be a group of `w`.
pub(super) fn pack_block(
    w: &QuantMatrix,
    j0: usize,
    panels: usize,
    g: usize,
    steps: usize,
    hi: &mut [u32],
    lo: &mut [u32],
) {
    use std::arch::is_x86_feature_detected as has;
    if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("f16c") {
        // SAFETY: the features were detected above.
        unsafe { pack_block_avx512(w, j0, panels, g, steps, hi, lo) }
    } else {
        pack_block_body(w, j0, panels, g, steps, hi, lo)
    }
}

/// [`pack_block`] compiled with AVX-512.
///
/// # Safety
/// The CPU has AVX-512F, BW, VL and F16C.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn pack_block_avx512(
    w: &QuantMatrix,
    j0: usize,
    panels: usize,
    g: usize,
    steps: usize,
    hi: &mut [u32],
    lo: &mut [u32],
) {
    pack_block_body(w, j0, panels, g, steps, hi, lo)
}

/// [`pack_block`]'s work, inlined into each instruction set's function.
#[inline(always)]
fn pack_block_body(
    w: &QuantMatrix,
    j0: usize,
    panels: usize,
    g: usize,
    steps: usize,
    hi: &mut [u32],
    lo: &mut [u32],
) {
    let mut vals = [0.0f32; GROUP];
    for p in 0..panels {
        for t in 0..PANEL / 16 {
            for j in 0..16 {
                let row = j0 + PANEL * p + 16 * t + j;
                if row < w.rows() {
                    group_of(w, row, g, &mut vals);
                } else {
                    vals = [0.0; GROUP];
                }
                for (s, seg) in vals.chunks_exact(K_STEP).take(steps).enumerate() {
                    let at = ((s * panels + p) * 2 + t) * B_TILE_PAIRS + j;
                    let mut ph = [0u32; 16];
                    let mut pl = [0u32; 16];
                    for (i, v) in seg.chunks_exact(2).enumerate() {
                        (ph[i], pl[i]) = split_pair(v[0], v[1]);
                    }
                    for i in 0..16 {
                        hi[at + 16 * i] = ph[i];
                        lo[at + 16 * i] = pl[i];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_of(h: u16) -> f32 {
        f32::from_bits(u32::from(h) << 16)
    }

    #[test]
    fn split_keeps_sixteen_bits() {
        // 1 + 2^-12 needs 13 bits: bf16 alone rounds it to 1, hi + lo keeps it
        let v = 1.0 + 2f32.powi(-12);
        let (h, l) = split(v);
        assert_eq!(f32_of(h), 1.0);
        assert_eq!(f32_of(h) + f32_of(l), v);
        // ties to even: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7
        assert_eq!(f32_of(split(1.0 + 2f32.powi(-8)).0), 1.0);
        assert_eq!(
            f32_of(split(1.0 + 3.0 * 2f32.powi(-8)).0),
            1.0 + 2f32.powi(-6)
        );
        // a NaN whose payload is all ones stays a NaN (a plain rounding would carry it to -0)
        assert!(f32_of(split(f32::from_bits(0x7fff_ffff)).0).is_nan());
        assert!(f32_of(split(f32::NAN).0).is_nan());
    }
}
