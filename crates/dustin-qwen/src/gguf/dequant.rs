//! Dequantisation of ggml tensor data to `f32`.
//!
//! Block layouts are those of `ggml-common.h` (all little-endian, `ggml_half` = IEEE f16), and
//! the arithmetic follows the reference `dequantize_row_*` functions of `ggml-quants.c` in the
//! same order of `f32` operations, so results match ggml and the `gguf` Python package
//! (`gguf.quants.dequantize`) bit for bit:
//!
//! | type | block struct | elements | bytes | value |
//! |---|---|---|---|---|
//! | `Q8_0` | `{ half d; int8 qs[32]; }` | 32 | 34 | `d * qs[i]` |
//! | `Q4_0` | `{ half d; uint8 qs[16]; }` | 32 | 18 | `(nibble - 8) * d`; low nibbles are elements 0..16, high nibbles 16..32 |
//! | `Q4_1` | `{ half d; half m; uint8 qs[16]; }` | 32 | 20 | `nibble * d + m`, nibbles as `Q4_0` |
//! | `Q4_K` | `{ half d; half dmin; uint8 scales[12]; uint8 qs[128]; }` | 256 | 144 | 8 sub-blocks of 32 with 6-bit scale `sc` and min `m`: `(d*sc) * nibble - (dmin*m)` |
//! | `Q6_K` | `{ uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d; }` | 256 | 210 | 16 sub-blocks of 16: `(d*scales[s]) * (q6 - 32)` |
//!
//! Plain types: `F32`, `F16`, `BF16` (upper half of an `f32`).

use half::f16;
use thiserror::Error;

use super::types::{GgmlType, SUPPORTED_TYPES};

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
/// [`DequantError::Unsupported`] for a type other than F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K,
/// Q6_K; [`DequantError::PartialBlock`] / [`DequantError::Size`] when `data` does not hold
/// exactly `out.len()` elements.
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
        GgmlType::Q8_0 => {
            for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(34)) {
                q8_0(b, o);
            }
        }
        GgmlType::Q4_0 => {
            for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(18)) {
                q4_0(b, o);
            }
        }
        GgmlType::Q4_1 => {
            for (o, b) in dst.chunks_exact_mut(32).zip(src.chunks_exact(20)) {
                q4_1(b, o);
            }
        }
        GgmlType::Q4K => {
            for (o, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(144)) {
                q4_k(b, o);
            }
        }
        GgmlType::Q6K => {
            for (o, b) in dst.chunks_exact_mut(256).zip(src.chunks_exact(210)) {
                q6_k(b, o);
            }
        }
        // `dequantize` rejects the others before calling this.
        _ => {}
    }
}

/// The `ggml_half` at byte `at` of `b`, as `f32`.
#[inline]
fn half16(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// `block_q8_0` (34 bytes) -> 32 values: `d * qs[i]`.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    for (o, &q) in y.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// `block_q4_0` (18 bytes) -> 32 values: `(nibble - 8) * d`.
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

/// `block_q4_1` (20 bytes) -> 32 values: `nibble * d + m`.
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

/// `get_scale_min_k4` of `ggml-quants.c`: the 6-bit scale and min of sub-block `j` (0..8) from
/// the 12 packed bytes of a `Q4_K` block.
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

/// `block_q4_K` (144 bytes) -> 256 values, as `dequantize_row_q4_K`.
fn q4_k(b: &[u8], y: &mut [f32]) {
    let d = half16(b, 0);
    let min = half16(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (chunk, (q, out)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let is = 2 * chunk;
        let (sc, m) = scale_min_k4(is, scales);
        let d1 = d * sc as f32;
        let m1 = min * m as f32;
        let (sc, m) = scale_min_k4(is + 1, scales);
        let d2 = d * sc as f32;
        let m2 = min * m as f32;
        for l in 0..32 {
            out[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `block_q6_K` (210 bytes) -> 256 values, as `dequantize_row_q6_K`.
fn q6_k(b: &[u8], y: &mut [f32]) {
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
            dequantize(GgmlType::Q5K, &[0; 176], &mut vec![0.0; 256]),
            Err(DequantError::Unsupported(GgmlType::Q5K))
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
