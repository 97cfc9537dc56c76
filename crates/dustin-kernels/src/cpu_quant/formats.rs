//! The decoders of the eight ggml block formats into [`WGroup`]s (one group of 256
//! elements of a weight row at a time, laid out by [`run`]).
//!
//! Block layouts are those of ggml's `ggml-common.h` (little-endian, `ggml_half` = IEEE f16);
//! the values they stand for are those of `dequantize_row_*` in ggml's `ggml-quants.c`:
//!
//! | type | block | elements | bytes | value |
//! |---|---|---|---|---|
//! | `Q4_0` | `half d; uint8 qs[16]` | 32 | 18 | `d * (q - 8)`; low nibbles are elements 0..16, high nibbles 16..32 |
//! | `Q4_1` | `half d; half m; uint8 qs[16]` | 32 | 20 | `d * q + m`, nibbles as `Q4_0` |
//! | `Q5_0` | `half d; uint8 qh[4]; uint8 qs[16]` | 32 | 22 | `d * (q - 16)`; nibbles as `Q4_0`, bit `i` of the little-endian `u32` `qh` is bit 4 of element `i` |
//! | `Q5_1` | `half d; half m; uint8 qh[4]; uint8 qs[16]` | 32 | 24 | `d * q + m`, `q` as `Q5_0` |
//! | `Q8_0` | `half d; int8 qs[32]` | 32 | 34 | `d * q` |
//! | `Q4_K` | `half d; half dmin; uint8 scales[12]; uint8 qs[128]` | 256 | 144 | 8 sub-blocks of 32 with 6-bit scale `sc` and min `m`: `(d * sc) * q - dmin * m`; each 32 bytes of `qs` hold two sub-blocks (low nibbles, then high) |
//! | `Q5_K` | `half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]` | 256 | 176 | as `Q4_K`, bit 4 of element `32 j + l` from bit `j` of `qh[l]` |
//! | `Q6_K` | `uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d` | 256 | 210 | 16 sub-blocks of 16: `(d * scales[s]) * (q - 32)` |

use super::blocks::{run, Fmt, Kind, WGroup};
use super::tile::Kern;
use super::QuantType;

/// The `ggml_half` at byte `at` of `b` (`at + 2 <= b.len()`), converted by `K`.
///
/// # Safety
/// The instruction set of `K` is available.
#[inline(always)]
unsafe fn half_at<K: Kern>(b: &[u8], at: usize) -> f32 {
    unsafe { K::f16(u16::from_le_bytes([b[at], b[at + 1]])) }
}

/// A format of 32-element blocks of `N` bytes (the `Q*_0` / `Q*_1` formats).
trait Block32<const N: usize> {
    /// A block's `(scale, min)`.
    ///
    /// # Safety
    /// The instruction set of `K` is available.
    unsafe fn scales<K: Kern>(blk: &[u8; N]) -> (f32, f32);

    /// Vectors `2 k` and `2 k + 1` of a group (`out[..32]`, `out[32..]`, laid out by [`run`])
    /// from blocks `k` (`a`) and `k + 4` (`b`).
    ///
    /// # Safety
    /// The instruction set of `K` is available.
    unsafe fn pair<K: Kern>(a: &[u8; N], b: &[u8; N], out: &mut [u8; 64]);
}

/// Group `g` of a row of the 32-element blocks of `B`: blocks `8 g .. 8 g + 8`, blocks `k` and
/// `k + 4` decoded together by [`Block32::pair`] straight into their two vectors; blocks past
/// the row's end are zero. Fixed-size arrays throughout so that this vectorizes, and no
/// closures: a closure would not inherit the instruction set of the `#[target_feature]`
/// function it ends up in, and the intrinsics in it would stay calls.
///
/// # Safety
/// The instruction set of `K` is available.
#[inline(always)]
unsafe fn blocks32<K: Kern, B: Block32<N>, const N: usize>(row: &[u8], g: usize, out: &mut WGroup) {
    let zero = [0u8; N];
    for k in 0..4 {
        let (i, j) = (g * 8 + k, g * 8 + k + 4);
        let a = row.get(i * N..).and_then(|r| r.first_chunk::<N>());
        let b = row.get(j * N..).and_then(|r| r.first_chunk::<N>());
        let (sa, ma) = match a {
            // SAFETY: as this function's.
            Some(a) => unsafe { B::scales::<K>(a) },
            None => (0.0, 0.0),
        };
        let (sb, mb) = match b {
            // SAFETY: as this function's.
            Some(b) => unsafe { B::scales::<K>(b) },
            None => (0.0, 0.0),
        };
        (out.scale[k], out.min[k], out.scale[k + 4], out.min[k + 4]) = (sa, ma, sb, mb);
        let pair = out.q[64 * k..64 * k + 64]
            .first_chunk_mut::<64>()
            .expect("a group holds 4 pairs of 64 bytes");
        // SAFETY: as this function's.
        unsafe {
            // both blocks present (every group but a row's last) on a path of its own: one
            // call with `unwrap_or` for both ran `Q5_0` and `Q8_0` products of one row 1.1x
            // slower (2-core EPYC)
            match (a, b) {
                (Some(a), Some(b)) => B::pair::<K>(a, b, pair),
                // blocks past the row's end (the last group of a row of 32-element blocks)
                _ => B::pair::<K>(a.unwrap_or(&zero), b.unwrap_or(&zero), pair),
            }
        }
    }
}

/// The 16 bytes of `b` from `at`.
#[inline(always)]
fn bytes16<const N: usize>(b: &[u8; N], at: usize) -> &[u8; 16] {
    b[at..at + 16].first_chunk::<16>().expect("16 bytes")
}

/// The little-endian `u32` of `b` at `at`.
#[inline(always)]
fn u32_at<const N: usize>(b: &[u8; N], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `block_q4_0`.
pub(super) struct Q4_0;
/// `block_q4_1`.
pub(super) struct Q4_1;
/// `block_q5_0`.
pub(super) struct Q5_0;
/// `block_q5_1`.
pub(super) struct Q5_1;
/// `block_q8_0`.
pub(super) struct Q8_0;
/// `block_q4_K`.
pub(super) struct Q4K;
/// `block_q5_K`.
pub(super) struct Q5K;
/// `block_q6_K`.
pub(super) struct Q6K;

impl Block32<18> for Q4_0 {
    #[inline(always)]
    unsafe fn scales<K: Kern>(b: &[u8; 18]) -> (f32, f32) {
        // SAFETY: as this function's.
        unsafe { (half_at::<K>(b, 0), 0.0) }
    }

    #[inline(always)]
    unsafe fn pair<K: Kern>(a: &[u8; 18], b: &[u8; 18], out: &mut [u8; 64]) {
        // SAFETY: as this function's.
        unsafe { K::pair_nibbles::<false>(bytes16(a, 2), bytes16(b, 2), 0, 0, out) }
    }
}

impl Fmt for Q4_0 {
    const TY: QuantType = QuantType::Q4_0;
    const KIND: Kind = Kind::Offset;
    const SHIFT: u32 = 3;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        // SAFETY: as this function's.
        unsafe { blocks32::<K, Self, 18>(row, g, out) }
    }
}

impl Block32<20> for Q4_1 {
    #[inline(always)]
    unsafe fn scales<K: Kern>(b: &[u8; 20]) -> (f32, f32) {
        // SAFETY: as this function's.
        unsafe { (half_at::<K>(b, 0), half_at::<K>(b, 2)) }
    }

    #[inline(always)]
    unsafe fn pair<K: Kern>(a: &[u8; 20], b: &[u8; 20], out: &mut [u8; 64]) {
        // SAFETY: as this function's.
        unsafe { K::pair_nibbles::<false>(bytes16(a, 4), bytes16(b, 4), 0, 0, out) }
    }
}

impl Fmt for Q4_1 {
    const TY: QuantType = QuantType::Q4_1;
    const KIND: Kind = Kind::Min;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        // SAFETY: as this function's.
        unsafe { blocks32::<K, Self, 20>(row, g, out) }
    }
}

impl Block32<22> for Q5_0 {
    #[inline(always)]
    unsafe fn scales<K: Kern>(b: &[u8; 22]) -> (f32, f32) {
        // SAFETY: as this function's.
        unsafe { (half_at::<K>(b, 0), 0.0) }
    }

    #[inline(always)]
    unsafe fn pair<K: Kern>(a: &[u8; 22], b: &[u8; 22], out: &mut [u8; 64]) {
        let (ha, hb) = (u32_at(a, 2), u32_at(b, 2));
        // SAFETY: as this function's.
        unsafe { K::pair_nibbles::<true>(bytes16(a, 6), bytes16(b, 6), ha, hb, out) }
    }
}

impl Fmt for Q5_0 {
    const TY: QuantType = QuantType::Q5_0;
    const KIND: Kind = Kind::Offset;
    const SHIFT: u32 = 4;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        // SAFETY: as this function's.
        unsafe { blocks32::<K, Self, 22>(row, g, out) }
    }
}

impl Block32<24> for Q5_1 {
    #[inline(always)]
    unsafe fn scales<K: Kern>(b: &[u8; 24]) -> (f32, f32) {
        // SAFETY: as this function's.
        unsafe { (half_at::<K>(b, 0), half_at::<K>(b, 2)) }
    }

    #[inline(always)]
    unsafe fn pair<K: Kern>(a: &[u8; 24], b: &[u8; 24], out: &mut [u8; 64]) {
        let (ha, hb) = (u32_at(a, 4), u32_at(b, 4));
        // SAFETY: as this function's.
        unsafe { K::pair_nibbles::<true>(bytes16(a, 8), bytes16(b, 8), ha, hb, out) }
    }
}

impl Fmt for Q5_1 {
    const TY: QuantType = QuantType::Q5_1;
    const KIND: Kind = Kind::Min;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        // SAFETY: as this function's.
        unsafe { blocks32::<K, Self, 24>(row, g, out) }
    }
}

impl Block32<34> for Q8_0 {
    #[inline(always)]
    unsafe fn scales<K: Kern>(b: &[u8; 34]) -> (f32, f32) {
        // SAFETY: as this function's.
        unsafe { (half_at::<K>(b, 0), 0.0) }
    }

    #[inline(always)]
    unsafe fn pair<K: Kern>(a: &[u8; 34], b: &[u8; 34], out: &mut [u8; 64]) {
        let (a, b) = (a[2..].first_chunk::<32>(), b[2..].first_chunk::<32>());
        // SAFETY: as this function's.
        unsafe { K::pair_bytes(a.expect("32 quants"), b.expect("32 quants"), out) }
    }
}

impl Fmt for Q8_0 {
    const TY: QuantType = QuantType::Q8_0;
    const KIND: Kind = Kind::Signed;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        // SAFETY: as this function's.
        unsafe { blocks32::<K, Self, 34>(row, g, out) }
    }
}

/// The 6-bit scales and minima of the 8 sub-blocks from the 12 packed bytes `sc` of a
/// `block_q4_K` / `block_q5_K`: `get_scale_min_k4` for every sub-block at once, on 32-bit words
/// (as ggml's `ggml_vec_dot_q4_K_q8_K` unpacks them with `kmask1..3`).
#[inline(always)]
fn scales_mins_k4(sc: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let word =
        |i: usize| u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    let (u0, u1, u2) = (word(0), word(1), word(2));
    // sub-blocks 0..4: the low 6 bits of bytes 0..4 (scales) and 4..8 (minima); 4..8: the
    // nibbles of bytes 8..12 with the top 2 bits of bytes 0..4 (scales) and 4..8 (minima)
    let sc_hi = (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4);
    let m_hi = ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4);
    let bytes = |lo: u32, hi: u32| (u64::from(hi) << 32 | u64::from(lo)).to_le_bytes();
    (bytes(u0 & LOW6, sc_hi), bytes(u1 & LOW6, m_hi))
}

/// `get_scale_min_k4` of `ggml-quants.c`: the 6-bit scale and min of sub-block `j` (0..8)
/// from the 12 packed bytes `sc` of a `block_q4_K` / `block_q5_K` (the definition
/// [`scales_mins_k4`] is tested against).
#[cfg(test)]
fn scale_min_k4(j: usize, sc: &[u8]) -> (u8, u8) {
    if j < 4 {
        (sc[j] & 63, sc[j + 4] & 63)
    } else {
        (
            (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4),
            (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4),
        )
    }
}

/// The super-block `g` of a k-quant row (`N` bytes per block), or `None` past its end
/// (then `out` is zeroed).
#[inline(always)]
fn super_block<'a, const N: usize>(
    row: &'a [u8],
    g: usize,
    out: &mut WGroup,
) -> Option<&'a [u8; N]> {
    let blk = row.get(g * N..).and_then(|r| r.first_chunk::<N>());
    if blk.is_none() {
        *out = WGroup::ZERO;
    }
    blk
}

/// The scales `d * sc` and minima `-(dmin * m)` of the 8 sub-blocks of a `Q4_K` / `Q5_K`
/// block (bytes 0..16: `d`, `dmin`, the 12 packed scales), rounded as `dequantize_row_q4_K`.
///
/// # Safety
/// The instruction set of `K` is available.
#[inline(always)]
unsafe fn k4_scales<K: Kern, const N: usize>(blk: &[u8; N], out: &mut WGroup) {
    // SAFETY: as this function's.
    let (d, dmin) = unsafe { (half_at::<K>(blk, 0), half_at::<K>(blk, 2)) };
    let (sc, m) = scales_mins_k4(&[
        blk[4], blk[5], blk[6], blk[7], blk[8], blk[9], blk[10], blk[11], blk[12], blk[13],
        blk[14], blk[15],
    ]);
    for j in 0..8 {
        out.scale[j] = d * f32::from(sc[j]);
        out.min[j] = -(dmin * f32::from(m[j]));
    }
}

impl Fmt for Q4K {
    const TY: QuantType = QuantType::Q4K;
    const KIND: Kind = Kind::Min;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        let Some(blk) = super_block::<144>(row, g, out) else {
            return;
        };
        // SAFETY: as this function's.
        unsafe { k4_scales::<K, _>(blk, out) };
        let qs = blk[16..]
            .first_chunk::<128>()
            .expect("a block_q4_K holds 128 bytes of qs");
        // SAFETY: as this function's.
        unsafe { K::k4_nibbles(qs, &mut out.q) };
    }
}

impl Fmt for Q5K {
    const TY: QuantType = QuantType::Q5K;
    const KIND: Kind = Kind::Min;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        let Some(blk) = super_block::<176>(row, g, out) else {
            return;
        };
        // SAFETY: as this function's.
        unsafe { k4_scales::<K, _>(blk, out) };
        // qh = bytes 16..48, qs = bytes 48..176; element l of blocks 2 c and 2 c + 1 takes
        // bits 2 c and 2 c + 1 of qh[l]
        for c in 0..4 {
            for h in 0..2 {
                for j in 0..16 {
                    let l = 16 * h + j;
                    let (v, bits) = (blk[48 + 32 * c + l], blk[16 + l]);
                    out.q[run(2 * c, h) + j] = (v & 0x0F) | (((bits >> (2 * c)) & 1) << 4);
                    out.q[run(2 * c + 1, h) + j] = (v >> 4) | (((bits >> (2 * c + 1)) & 1) << 4);
                }
            }
        }
    }
}

impl Fmt for Q6K {
    const TY: QuantType = QuantType::Q6K;
    const KIND: Kind = Kind::Q6;
    const SHIFT: u32 = 5;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        let Some(blk) = super_block::<210>(row, g, out) else {
            return;
        };
        // ql = bytes 0..128, qh = 128..192, scales = 192..208, d = 208..210
        // SAFETY: as this function's.
        let d = unsafe { half_at::<K>(blk, 208) };
        out.scale = [d; 8];
        for i in 0..16 {
            out.sc16[i] = i16::from(blk[192 + i] as i8);
        }
        for v in 0..8 {
            let (k, h) = (v / 2, v % 2);
            let (lo, hi) = out.sub[v].split_at_mut(8);
            lo.fill(out.sc16[2 * k + h]);
            hi.fill(out.sc16[2 * (k + 4) + h]);
        }
        let ql = blk
            .first_chunk::<128>()
            .expect("a block_q6_K holds 128 bytes of ql");
        let qh = blk[128..].first_chunk::<64>().expect("and 64 bytes of qh");
        // SAFETY: as this function's.
        unsafe { K::q6k_quants(ql, qh, &mut out.q) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_k4_scales_match_get_scale_min_k4() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..10_000 {
            let mut sc = [0u8; 12];
            for b in &mut sc {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                *b = (state >> 56) as u8;
            }
            let (s, m) = scales_mins_k4(&sc);
            for j in 0..8 {
                assert_eq!((s[j], m[j]), scale_min_k4(j, &sc), "{sc:?} {j}");
            }
        }
    }
}
