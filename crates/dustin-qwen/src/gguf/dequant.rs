//! Dequantisation of ggml tensor data to `f32`.
//!
//! Block layouts are those of `ggml-common.h` (all little-endian, `ggml_half` = IEEE f16), and
//! the arithmetic follows the reference `dequantize_row_*` functions of `ggml-quants.c` in the
//! same order of `f32` operations, so results match ggml and the `gguf` Python package
//! (`gguf.quants.dequantize`, `gguf/quants.py`) bit for bit. Legacy 32-element blocks are
//! decoded in this file, k-quants (256-element super-blocks) in `dequant/kquants.rs`, the
//! non-linear 4-bit `IQ4` types in `dequant/iquants.rs`:
//!
//! | type | block struct | elements | bytes | value |
//! |---|---|---|---|---|
//! | `Q8_0` | `block_q8_0 { half d; int8 qs[32]; }` | 32 | 34 | `d * qs[i]` |
//! | `Q4_0` | `block_q4_0 { half d; uint8 qs[16]; }` | 32 | 18 | `(nibble - 8) * d`; low nibbles are elements 0..16, high nibbles 16..32 |
//! | `Q4_1` | `block_q4_1 { half d; half m; uint8 qs[16]; }` | 32 | 20 | `nibble * d + m`, nibbles as `Q4_0` |
//! | `Q5_0` | `block_q5_0 { half d; uint8 qh[4]; uint8 qs[16]; }` | 32 | 22 | `(q5 - 16) * d`; nibbles as `Q4_0`, bit `i` of the little-endian `u32` `qh` is bit 4 of element `i` |
//! | `Q5_1` | `block_q5_1 { half d; half m; uint8 qh[4]; uint8 qs[16]; }` | 32 | 24 | `q5 * d + m`, `q5` as `Q5_0` |
//! | `Q2_K` | `block_q2_K { uint8 scales[16]; uint8 qs[64]; half d; half dmin; }` | 256 | 84 | 16 sub-blocks of 16 with 4-bit scale and min: `(d*sc) * q2 - (dmin*m)` |
//! | `Q3_K` | `block_q3_K { uint8 hmask[32]; uint8 qs[64]; uint8 scales[12]; half d; }` | 256 | 110 | 16 sub-blocks of 16 with 6-bit scale: `(d*(sc-32)) * (q2 - 4*!hbit)` |
//! | `Q4_K` | `block_q4_K { half d; half dmin; uint8 scales[12]; uint8 qs[128]; }` | 256 | 144 | 8 sub-blocks of 32 with 6-bit scale `sc` and min `m`: `(d*sc) * nibble - (dmin*m)` |
//! | `Q5_K` | `block_q5_K { half d; half dmin; uint8 scales[12]; uint8 qh[32]; uint8 qs[128]; }` | 256 | 176 | as `Q4_K` with a fifth bit from `qh`: `(d*sc) * q5 - (dmin*m)` |
//! | `Q6_K` | `block_q6_K { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d; }` | 256 | 210 | 16 sub-blocks of 16: `(d*scales[s]) * (q6 - 32)` |
//! | `IQ4_NL` | `block_iq4_nl { half d; uint8 qs[16]; }` | 32 | 18 | `d * kvalues_iq4nl[nibble]`, nibbles as `Q4_0` |
//! | `IQ4_XS` | `block_iq4_xs { half d; uint16 scales_h; uint8 scales_l[4]; uint8 qs[128]; }` | 256 | 136 | 8 sub-blocks of 32 with 6-bit scale: `(d*(sc-32)) * kvalues_iq4nl[nibble]` |
//!
//! Plain types: `F32`, `F16`, `BF16` (upper half of an `f32`).

use half::f16;
use thiserror::Error;

use super::types::{GgmlType, SUPPORTED_TYPES};

mod iquants;
mod kquants;

/// Why a buffer could not be dequantised.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DequantError {
    /// The type has no dequantiser here.
    #[error("ggml type {0} is not supported (supported: {SUPPORTED_TYPES})")]
    Unsupported(GgmlType),
    /// The element count is not a whole number of blocks.
    #[error("{n} elements are not a whole number of {ty} blocks of {block}")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// Elements asked for.
        n: usize,
        /// Elements per block.
        block: u64,
    },
    /// The byte buffer does not hold exactly the blocks for the element count.
    #[error("{n} elements of {ty} take {expected} bytes, got {found}")]
    Size {
        /// The type.
        ty: GgmlType,
        /// Elements asked for.
        n: usize,
        /// Bytes they take.
        expected: u64,
        /// Bytes given.
        found: usize,
    },
}

/// Bytes that `n` elements of `ty` take, or `None` when `n` is not a whole number of blocks
/// (or the size overflows).
pub fn byte_size(ty: GgmlType, n: u64) -> Option<u64> {
    if !n.is_multiple_of(ty.block_size()) {
        return None;
    }
    (n / ty.block_size()).checked_mul(ty.type_size())
}

/// Dequantises `data` (whole blocks of `ty`, as stored in a GGUF file) into `out`, one `f32`
/// per element; `out.len()` is the element count.
///
/// Large buffers are split over the available CPU threads (by whole blocks).
///
/// # Errors
/// [`DequantError::Unsupported`] for a type that [`GgmlType::is_supported`] rejects (the list
/// is [`SUPPORTED_TYPES`]); [`DequantError::PartialBlock`] / [`DequantError::Size`] when
/// `data` does not hold exactly `out.len()` elements.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), DequantError> {
    if !ty.is_supported() {
        return Err(DequantError::Unsupported(ty));
    }
    let n = out.len();
    let expected = byte_size(ty, n as u64).ok_or(DequantError::PartialBlock {
        ty,
        n,
        block: ty.block_size(),
    })?;
    if expected != data.len() as u64 {
        return Err(DequantError::Size {
            ty,
            n,
            expected,
            found: data.len(),
        });
    }
    // Sizes are checked: from here on every block is whole.
    let bs = ty.block_size() as usize;
    let ts = ty.type_size() as usize;
    let blocks = n / bs;
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    const PARALLEL_MIN: usize = 1 << 20;
    if threads <= 1 || n < PARALLEL_MIN {
        dequant_blocks(ty, data, out);
        return Ok(());
    }
    let per = blocks.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (src, dst) in data.chunks(per * ts).zip(out.chunks_mut(per * bs)) {
            s.spawn(move || dequant_blocks(ty, src, dst));
        }
    });
    Ok(())
}

/// Dequantises whole blocks; `src` and `dst` hold the same number of blocks (checked by the
/// caller).
fn dequant_blocks(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = half16(b, 0);
            }
        }
        GgmlType::BF16 => {
            for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
        GgmlType::Q8_0 => each_block(ty, src, dst, q8_0),
        GgmlType::Q4_0 => each_block(ty, src, dst, q4_0),
        GgmlType::Q4_1 => each_block(ty, src, dst, q4_1),
        GgmlType::Q5_0 => each_block(ty, src, dst, q5_0),
        GgmlType::Q5_1 => each_block(ty, src, dst, q5_1),
        GgmlType::Q2K => each_block(ty, src, dst, kquants::q2_k),
        GgmlType::Q3K => each_block(ty, src, dst, kquants::q3_k),
        GgmlType::Q4K => each_block(ty, src, dst, kquants::q4_k),
        GgmlType::Q5K => each_block(ty, src, dst, kquants::q5_k),
        GgmlType::Q6K => each_block(ty, src, dst, kquants::q6_k),
        GgmlType::IQ4NL => each_block(ty, src, dst, iquants::iq4_nl),
        GgmlType::IQ4XS => each_block(ty, src, dst, iquants::iq4_xs),
        // `dequantize` rejects the others before calling this.
        _ => {}
    }
}

/// Calls `f` on each `(block bytes, block values)` pair of `ty`'s geometry: `f` gets exactly
/// `ty.type_size()` bytes and `ty.block_size()` values.
#[inline]
fn each_block(ty: GgmlType, src: &[u8], dst: &mut [f32], f: impl Fn(&[u8], &mut [f32])) {
    let bs = ty.block_size() as usize;
    let ts = ty.type_size() as usize;
    for (o, b) in dst.chunks_exact_mut(bs).zip(src.chunks_exact(ts)) {
        f(b, o);
    }
}

/// The `ggml_half` at byte `at` of `b`, as `f32`.
#[inline]
fn half16(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// `block_q8_0` (34 bytes) -> 32 values: `d * qs[i]`, as `dequantize_row_q8_0`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// `block_q4_0` (18 bytes) -> 32 values: `(nibble - 8) * d`, as `dequantize_row_q4_0`.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        let x0 = (qs[j] & 0x0F) as i32 - 8;
        let x1 = (qs[j] >> 4) as i32 - 8;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// `block_q4_1` (20 bytes) -> 32 values: `nibble * d + m`, as `dequantize_row_q4_1`.
fn q4_1(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    let m = half16(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        let x0 = (qs[j] & 0x0F) as f32;
        let x1 = (qs[j] >> 4) as f32;
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
    }
}

/// The 5-bit values `j` and `j + 16` (`j` in 0..16) of a `block_q5_0` / `block_q5_1`: the low
/// and high nibble of `qs[j]`, with bit 4 from bits `j` and `j + 16` of `qh`.
#[inline]
fn q5_pair(qs: &[u8], qh: u32, j: usize) -> (u8, u8) {
    let h0 = ((qh >> j) & 1) as u8;
    let h1 = ((qh >> (j + 16)) & 1) as u8;
    ((qs[j] & 0x0F) | (h0 << 4), (qs[j] >> 4) | (h1 << 4))
}

/// `block_q5_0` (22 bytes) -> 32 values: `(q5 - 16) * d`, as `dequantize_row_q5_0`.
fn q5_0(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let qs = &b[6..22];
    for j in 0..16 {
        let (x0, x1) = q5_pair(qs, qh, j);
        y[j] = (x0 as i32 - 16) as f32 * d;
        y[j + 16] = (x1 as i32 - 16) as f32 * d;
    }
}

/// `block_q5_1` (24 bytes) -> 32 values: `q5 * d + m`, as `dequantize_row_q5_1`.
fn q5_1(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    let m = half16(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let qs = &b[8..24];
    for j in 0..16 {
        let (x0, x1) = q5_pair(qs, qh, j);
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_by_hand() {
        let mut b = vec![0u8; 34];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = 4;
        b[3] = (-6i8) as u8;
        let mut y = vec![0.0; 32];
        dequantize(GgmlType::Q8_0, &b, &mut y).unwrap();
        assert_eq!(&y[..3], &[2.0, -3.0, 0.0]);
    }

    #[test]
    fn q4_1_by_hand() {
        let mut b = vec![0u8; 20];
        b[0..2].copy_from_slice(&f16::from_f32(2.0).to_bits().to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(-1.0).to_bits().to_le_bytes());
        b[4] = 0x3A; // low 0xA -> element 0, high 0x3 -> element 16
        let mut y = vec![0.0; 32];
        dequantize(GgmlType::Q4_1, &b, &mut y).unwrap();
        assert_eq!((y[0], y[16], y[1]), (19.0, 5.0, -1.0));
    }

    #[test]
    fn q5_0_by_hand() {
        let mut b = vec![0u8; 22];
        b[0..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        // qh bit 0 -> element 0 gets bit 4; bit 17 -> element 17 gets bit 4
        b[2..6].copy_from_slice(&(1u32 | 1 << 17).to_le_bytes());
        b[6] = 0x3A; // low 0xA -> element 0, high 0x3 -> element 16
        b[7] = 0x50; // low 0x0 -> element 1, high 0x5 -> element 17
        let mut y = vec![0.0; 32];
        dequantize(GgmlType::Q5_0, &b, &mut y).unwrap();
        // (26 - 16) / 2, (3 - 16) / 2, (0 - 16) / 2, (21 - 16) / 2
        assert_eq!((y[0], y[16], y[1], y[17]), (5.0, -6.5, -8.0, 2.5));
    }

    #[test]
    fn size_errors() {
        let mut y = vec![0.0; 31];
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 34], &mut y),
            Err(DequantError::PartialBlock { .. })
        ));
        let mut y = vec![0.0; 32];
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 33], &mut y),
            Err(DequantError::Size { .. })
        ));
        assert_eq!(
            dequantize(GgmlType::IQ2XXS, &[0; 66], &mut vec![0.0; 256]),
            Err(DequantError::Unsupported(GgmlType::IQ2XXS))
        );
    }

    #[test]
    fn parallel_matches_serial() {
        // 2^20 + 32 elements of Q8_0 with varied bytes.
        let blocks = (1 << 15) + 1;
        let data: Vec<u8> = (0..blocks * 34)
            .map(|i| {
                if i % 34 == 1 {
                    0x3C
                } else {
                    (i * 7 % 251) as u8
                }
            })
            .collect();
        let mut par = vec![0.0; blocks * 32];
        dequantize(GgmlType::Q8_0, &data, &mut par).unwrap();
        let mut ser = vec![0.0; blocks * 32];
        dequant_blocks(GgmlType::Q8_0, &data, &mut ser);
        assert_eq!(par, ser);
    }
}
