//! The non-linear 4-bit types `block_iq4_nl` (32 elements) and `block_iq4_xs` (256 elements)
//! of `ggml-common.h`, decoded as `dequantize_row_iq4_nl` / `dequantize_row_iq4_xs` of
//! `ggml-quants.c` (and the `IQ4_NL` / `IQ4_XS` classes of the `gguf` package's
//! `gguf/quants.py`), in the same order of `f32` operations.
//!
//! Every function takes exactly one block's bytes and its output values; the caller
//! (`dequantize`) has checked the sizes.

use super::half16;

/// `kvalues_iq4nl` of `ggml-common.h`: the 16 levels a 4-bit index selects.
const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// 16 bytes of nibble indices -> 32 values `dl * kvalues_iq4nl[nibble]`: low nibbles are
/// elements 0..16, high nibbles 16..32.
#[inline]
fn iq4_32(qs: &[u8], dl: f32, y: &mut [f32]) {
    for j in 0..16 {
        y[j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0F) as usize] as f32;
        y[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
    }
}

/// `block_iq4_nl` (18 bytes: `half d; uint8 qs[16];`) -> 32 values
/// `d * kvalues_iq4nl[nibble]`, as `dequantize_row_iq4_nl`.
pub(super) fn iq4_nl(b: &[u8], y: &mut [f32]) {
    iq4_32(&b[2..18], half16(b, 0), y);
}

/// `block_iq4_xs` (136 bytes: `half d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128];`)
/// -> 256 values, as `dequantize_row_iq4_xs`.
///
/// Sub-block `ib` (32 elements, 16 bytes of `qs`) has the 6-bit scale `ls` with low 4 bits
/// from nibble `ib % 2` of `scales_l[ib / 2]` and high 2 bits from bits `2ib..2ib+2` of
/// `scales_h`; values `(d * (ls - 32)) * kvalues_iq4nl[nibble]`, nibbles as `IQ4_NL`.
pub(super) fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    let qs = &b[8..136];
    for (ib, (q, out)) in qs.chunks_exact(16).zip(y.chunks_exact_mut(32)).enumerate() {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((scales_h >> (2 * ib)) & 3) as u8;
        let ls = (low | (high << 4)) as i32 - 32;
        iq4_32(q, d * ls as f32, out);
    }
}
