//! Block weights decoded to f32: the values ggml's `dequantize_row_*` (`ggml-quants.c`)
//! computes, from the same decoders the products use ([`Fmt::decode`] into [`WGroup`]s).

use std::ops::Range;

use super::blocks::{run, Fmt, Kind, WGroup, GROUP};
use super::formats;
use super::tile::Portable;
use super::{QuantMatrix, QuantType};
use crate::{KernelError, Result};

/// Rows `rows` of `w` decoded to f32 into `out` (`rows.len() * w.cols()` values, row-major),
/// each value rounded as ggml's `dequantize_row_*` rounds it: `(d * sc) * q - dmin * m` for
/// `Q4_K` / `Q5_K`, `(d * sc) * (q - 32)` for `Q6_K`, `d * (q - o)` for `Q4_0` / `Q5_0`,
/// `d * q + m` for `Q4_1` / `Q5_1`, `d * q` for `Q8_0`.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming `rows` when the range lies past `w`'s rows, `out`
/// when its length is not `rows.len() * w.cols()`.
pub fn dequantize_rows(w: &QuantMatrix, rows: Range<usize>, out: &mut [f32]) -> Result<()> {
    if rows.start > rows.end || rows.end > w.rows() {
        return Err(KernelError::invalid(
            "rows",
            format!("a range within the weight's {} rows", w.rows()),
            format!("{rows:?}"),
        ));
    }
    if out.len() != rows.len() * w.cols() {
        return Err(KernelError::invalid(
            "out",
            format!(
                "{} values ({} rows of {})",
                rows.len() * w.cols(),
                rows.len(),
                w.cols()
            ),
            out.len(),
        ));
    }
    let cols = w.cols();
    let mut vals = [0.0f32; GROUP];
    for (j, dst) in rows.zip(out.chunks_exact_mut(cols.max(1))) {
        for (g, part) in dst.chunks_mut(GROUP).enumerate() {
            group_of(w, j, g, &mut vals);
            part.copy_from_slice(&vals[..part.len()]);
        }
    }
    Ok(())
}

/// The values of a decoded group into `out` (its first `out.len()` elements, up to 256).
#[inline(always)]
fn group_values<F: Fmt>(wg: &WGroup, out: &mut [f32]) {
    for (b, blk) in out.chunks_mut(32).enumerate() {
        for (h, half) in blk.chunks_mut(16).enumerate() {
            let q = &wg.q[run(b, h)..run(b, h) + 16];
            let (s, m) = (wg.scale[b], wg.min[b]);
            match F::KIND {
                Kind::Min => half
                    .iter_mut()
                    .zip(q)
                    .for_each(|(v, &q)| *v = s * f32::from(q) + m),
                Kind::Offset => {
                    let o = 1i16 << F::SHIFT;
                    half.iter_mut()
                        .zip(q)
                        .for_each(|(v, &q)| *v = f32::from(i16::from(q) - o) * s);
                }
                Kind::Signed => half
                    .iter_mut()
                    .zip(q)
                    .for_each(|(v, &q)| *v = f32::from(q as i8) * s),
                Kind::Q6 => {
                    let ds = s * f32::from(wg.sc16[2 * b + h]);
                    half.iter_mut()
                        .zip(q)
                        .for_each(|(v, &q)| *v = ds * f32::from(i16::from(q) - 32));
                }
            }
        }
    }
}

/// Group `g` (elements `256 g .. 256 g + 256`) of row `row` of `w` decoded to f32 as
/// [`dequantize_rows`] decodes it; elements past the row's end are 0.
///
/// # Errors
/// [`KernelError::InvalidInput`] naming `row` or `g` when past the weight.
pub fn dequantize_group(
    w: &QuantMatrix,
    row: usize,
    g: usize,
    out: &mut [f32; GROUP],
) -> Result<()> {
    if row >= w.rows() {
        return Err(KernelError::invalid(
            "row",
            format!("a row below {}", w.rows()),
            row,
        ));
    }
    if g >= w.cols().div_ceil(GROUP) {
        return Err(KernelError::invalid(
            "g",
            format!("a group below {}", w.cols().div_ceil(GROUP)),
            g,
        ));
    }
    group_of(w, row, g, out);
    Ok(())
}

/// [`dequantize_group`] without its checks (`row` and `g` within `w`), inlined into its
/// caller so that it compiles with the caller's instruction set.
#[inline(always)]
pub(crate) fn group_of(w: &QuantMatrix, row: usize, g: usize, out: &mut [f32; GROUP]) {
    let rb = w.row_bytes();
    let bytes = &w.data()[row * rb..(row + 1) * rb];
    let n = GROUP.min(w.cols() - g * GROUP);
    out[n..].fill(0.0);
    match w.quant_type() {
        QuantType::Q4_0 => group_in::<formats::Q4_0>(bytes, g, &mut out[..n]),
        QuantType::Q4_1 => group_in::<formats::Q4_1>(bytes, g, &mut out[..n]),
        QuantType::Q5_0 => group_in::<formats::Q5_0>(bytes, g, &mut out[..n]),
        QuantType::Q5_1 => group_in::<formats::Q5_1>(bytes, g, &mut out[..n]),
        QuantType::Q8_0 => group_in::<formats::Q8_0>(bytes, g, &mut out[..n]),
        QuantType::Q4K => group_in::<formats::Q4K>(bytes, g, &mut out[..n]),
        QuantType::Q5K => group_in::<formats::Q5K>(bytes, g, &mut out[..n]),
        QuantType::Q6K => group_in::<formats::Q6K>(bytes, g, &mut out[..n]),
    }
}

/// Group `g` of the row `bytes` in format `F` into `out`.
#[inline(always)]
fn group_in<F: Fmt>(bytes: &[u8], g: usize, out: &mut [f32]) {
    let mut wg = WGroup::ZERO;
    // SAFETY: the portable decoders need no instruction set; `bytes` is whole blocks.
    unsafe { F::decode::<Portable>(bytes, g, &mut wg) };
    group_values::<F>(&wg, out);
}
