//! k-quant super-blocks of 256 elements (`QK_K` in `ggml-common.h`): `block_q2_K`,
//! `block_q3_K`, `block_q4_K`, `block_q5_K`, `block_q6_K`, decoded as `dequantize_row_q2_K`
//! ... `dequantize_row_q6_K` of `ggml-quants.c` (and the `Q2_K` ... `Q6_K` classes of the
//! `gguf` package's `gguf/quants.py`), in the same order of `f32` operations.
//!
//! Every function takes exactly one block's bytes and 256 output values; the caller
//! (`dequantize`) has checked the sizes.

use super::half16;

/// `get_scale_min_k4` of `ggml-quants.c`: the 6-bit scale and min of sub-block `j` (0..8) from
/// the 12 packed `scales` bytes of a `block_q4_K` / `block_q5_K`.
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `block_q2_K` (84 bytes: `uint8 scales[16]; uint8 qs[64]; half d; half dmin;`) -> 256
/// values, as `dequantize_row_q2_K`.
///
/// Sub-block `s` (16 elements) has scale `scales[s] & 0xF` and min `scales[s] >> 4`; each
/// 128-element half takes 32 bytes of `qs`, element `32 * k + l` of the half being bits
/// `2k..2k+2` of byte `l`. Value: `(d * sc) * q - (dmin * m)`.
pub(super) fn q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = half16(b, 80);
    let min = half16(b, 82);
    for (h, (q, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(128)).enumerate() {
        for k in 0..4 {
            let shift = 2 * k;
            for half in 0..2 {
                let sc = scales[8 * h + 2 * k + half];
                let dl = d * (sc & 0x0F) as f32;
                let ml = min * (sc >> 4) as f32;
                let q = &q[16 * half..16 * half + 16];
                let o = &mut out[32 * k + 16 * half..32 * k + 16 * half + 16];
                for (o, &q) in o.iter_mut().zip(q) {
                    *o = dl * ((q >> shift) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// The 16 signed 6-bit scales of a `block_q3_K` (its 12 packed `scales` bytes), minus 32 as
/// in `dequantize_row_q3_K`: scale `i` has low 4 bits from nibble `i / 8` of byte `i % 8`
/// and high 2 bits from bits `2 * (i / 4)` of byte `8 + i % 4`.
#[inline]
fn q3_k_scales(sc: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = (sc[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// `block_q3_K` (110 bytes: `uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; half d;`) ->
/// 256 values, as `dequantize_row_q3_K`.
///
/// The low 2 bits of element `128 * h + 32 * k + l` are bits `2k..2k+2` of `qs[32 * h + l]`;
/// bit `4 * h + k` of `hmask[l]` clear subtracts 4. Value: `(d * (sc - 32)) * q` over
/// sub-blocks of 16.
pub(super) fn q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3_k_scales(&b[96..108]);
    let d = half16(b, 108);
    for (h, (q, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(128)).enumerate() {
        for k in 0..4 {
            let shift = 2 * k;
            let bit = 4 * h + k;
            for half in 0..2 {
                let dl = d * scales[8 * h + 2 * k + half] as f32;
                let range = 16 * half..16 * half + 16;
                let o = &mut out[32 * k + 16 * half..32 * k + 16 * half + 16];
                for ((o, &q), &m) in o.iter_mut().zip(&q[range.clone()]).zip(&hmask[range]) {
                    let low = ((q >> shift) & 3) as i8;
                    let sub = if (m >> bit) & 1 == 0 { 4 } else { 0 };
                    *o = dl * (low - sub) as f32;
                }
            }
        }
    }
}

/// The scales and minima of sub-blocks `is` and `is + 1` of a `Q4_K` / `Q5_K` block:
/// `[d * sc(is), dmin * m(is), d * sc(is + 1), dmin * m(is + 1)]` (`dequantize_row_q4_K`).
fn pair_scales(is: usize, d: f32, min: f32, scales: &[u8]) -> [f32; 4] {
    let (sc1, m1) = scale_min_k4(is, scales);
    let (sc2, m2) = scale_min_k4(is + 1, scales);
    [
        d * sc1 as f32,
        min * m1 as f32,
        d * sc2 as f32,
        min * m2 as f32,
    ]
}

/// `block_q4_K` (144 bytes: `half d; half dmin; uint8 scales[12]; uint8 qs[128];`) -> 256
/// values, as `dequantize_row_q4_K`: 8 sub-blocks of 32, `(d * sc) * nibble - (dmin * m)`;
/// each 32 bytes of `qs` hold two sub-blocks (low nibbles, then high nibbles).
pub(super) fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    let min = half16(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (q, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let is = 2 * chunk;
        let [d1, m1, d2, m2] = pair_scales(is, d, min, scales);
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `block_q5_K` (176 bytes: `half d; half dmin; uint8 scales[12]; uint8 qh[32];
/// uint8 qs[128];`) -> 256 values, as `dequantize_row_q5_K`: `Q4_K`'s layout plus bit 4 of
/// element `32 * j + l` (sub-block `j`) from bit `j` of `qh[l]`.
pub(super) fn q5_k(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    let min = half16(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (chunk, (q, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let is = 2 * chunk;
        let [d1, m1, d2, m2] = pair_scales(is, d, min, scales);
        for l in 0..32 {
            let h1 = ((qh[l] >> is) & 1) << 4;
            let h2 = ((qh[l] >> (is + 1)) & 1) << 4;
            out[l] = d1 * ((q[l] & 0x0F) | h1) as f32 - m1;
            out[l + 32] = d2 * ((q[l] >> 4) | h2) as f32 - m2;
        }
    }
}

/// `block_q6_K` (210 bytes: `uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d;`) -> 256
/// values, as `dequantize_row_q6_K`: 16 sub-blocks of 16, `(d * scales[s]) * (q6 - 32)`.
pub(super) fn q6_k(b: &[u8], y: &mut [f32]) {
    let ql_all = &b[0..128];
    let qh_all = &b[128..192];
    let sc_all = &b[192..208];
    let d = half16(b, 208);
    for n in 0..2 {
        let ql = &ql_all[64 * n..64 * n + 64];
        let qh = &qh_all[32 * n..32 * n + 32];
        let sc = &sc_all[8 * n..8 * n + 8];
        let out = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            out[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            out[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            out[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            out[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}
