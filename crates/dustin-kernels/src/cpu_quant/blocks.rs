//! The two operands of a group product, in the layouts every instruction set reads:
//! [`ActGroup`] (256 activations of one row quantized to `i8` in blocks of 32) and
//! [`WGroup`] (256 weights of one row decoded from their ggml blocks to small integers with
//! per-block scales, by the decoders of `formats`), the activation quantizer and the
//! portable group product that defines what every instruction set computes.

use super::tile::Kern;
use super::QuantType;

/// Elements of a group: eight blocks of 32 (one k-quant super-block), the unit the decoders
/// produce.
pub const GROUP: usize = 256;

/// Elements of an activation block (one scale `d`).
pub(super) const BLOCK: usize = 32;

/// Where the 16 elements `16 h .. 16 h + 16` (half `h`) of block `b` (0..8) of a group lie in
/// the `q` arrays of [`ActGroup`] and [`WGroup`]: at `32 (2 (b mod 4) + h) + 16 (b / 4)`. So
/// the 32-byte vector `v = 2 k + h` holds half `h` of block `k` in its low 16 bytes and of
/// block `k + 4` in its high 16 bytes: a product of vectors `2 k` and `2 k + 1` summed in
/// lanes of 4 bytes leaves block `k` in lanes 0..4 and block `k + 4` in lanes 4..8, and two
/// levels of pairwise sums (`vphaddd`) put block `b` in lane `b` (module `x86`).
#[inline(always)]
pub(super) const fn run(b: usize, h: usize) -> usize {
    32 * (2 * (b % 4) + h) + 16 * (b / 4)
}

/// 256 activations of one row (a row is zero-padded to whole groups): `q = round(x / d[b])`
/// for the elements of block `b` (laid out by [`run`]), with `d[b] = amax(block) / 127` (0
/// for a block of zeros, and for padding), `s[b]` the sum of the block's `q` and
/// `s16[2 b + h]` the sum of its half `h` (the offsets of `Q4_0`, `Q5_0` and `Q6_K`, the
/// minima of `Q4_1`, `Q5_1`, `Q4_K` and `Q5_K`). 352 bytes, aligned for 32-byte loads.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct ActGroup {
    pub q: [i8; GROUP],
    pub d: [f32; 8],
    pub s: [i32; 8],
    pub s16: [i16; 16],
}

impl ActGroup {
    /// All zero: the padding past a row's end.
    pub const ZERO: Self = Self {
        q: [0; GROUP],
        d: [0.0; 8],
        s: [0; 8],
        s16: [0; 16],
    };
}

/// 256 weights of one row, decoded (`q` laid out by [`run`], as the activations): the block
/// of 32 `b` stands for `scale[b] * q + min[b]` (the [`Kind::Min`] formats),
/// `scale[b] * (q - o)` (the [`Kind::Offset`] formats, `o = 1 << F::SHIFT`), `scale[b] * q`
/// with `q` read as `i8` ([`Kind::Signed`]) or, for `Q6_K`, `scale[b] * sc * (q - 32)` with
/// the scale `sc = sc16[2 b + h]` of its half `h` (a sub-block of 16), also kept per vector
/// `v = 2 k + h` of `q` as `sub[v]` = `[sc16[2 k + h]; 8] ++ [sc16[2 (k + 4) + h]; 8]` (the
/// multipliers of the vector's 16 pair sums). Blocks past a row's end are all zero.
#[repr(C, align(32))]
#[derive(Clone, Copy)]
pub(super) struct WGroup {
    pub q: [u8; GROUP],
    pub scale: [f32; 8],
    pub min: [f32; 8],
    pub sc16: [i16; 16],
    pub sub: [[i16; 16]; 8],
}

impl WGroup {
    /// All zero (decoders overwrite what they use).
    pub const ZERO: Self = Self {
        q: [0; GROUP],
        scale: [0.0; 8],
        min: [0.0; 8],
        sc16: [0; 16],
        sub: [[0; 16]; 8],
    };
}

/// How a block's integer dot product `D = sum q_w q_a` becomes its value (see [`WGroup`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Unsigned `q`, value `scale * (q - (1 << SHIFT))`: `D - (s << SHIFT)`.
    Offset,
    /// Unsigned `q`, value `scale * q + min`: `scale * D + min * s`.
    Min,
    /// `q` read as `i8`, value `scale * q`.
    Signed,
    /// `Q6_K`: unsigned 6-bit `q`, sub-block scales, offset 32.
    Q6,
}

/// A ggml block format: how its rows decode into [`WGroup`]s.
pub(super) trait Fmt {
    /// The format.
    const TY: QuantType;
    /// How its blocks' dot products become values.
    const KIND: Kind;
    /// `log2` of the offset of [`Kind::Offset`] (and 5 for `Q6_K`'s 32).
    const SHIFT: u32 = 0;
    /// Group `g` of the weight row `row` (whole blocks of [`Fmt::TY`]) into `out`, with the
    /// conversions of `K`.
    ///
    /// # Safety
    /// The instruction set of `K` is available.
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup);
}

/// IEEE half-precision bits to `f32`, exactly (every f16 is an f32): the exponent and
/// mantissa bits move to an f32's place and a multiplication by `2^112` rebiases the exponent
/// (subnormals included); infinities and NaNs keep the all-ones exponent, NaNs come out quiet
/// (as x86's `vcvtph2ps` makes them).
#[inline(always)]
pub(super) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let rest = u32::from(h & 0x7fff) << 13;
    let v = if h & 0x7c00 == 0x7c00 {
        let quiet = if h & 0x03ff != 0 { 0x0040_0000 } else { 0 };
        f32::from_bits(rest | 0x7f80_0000 | quiet)
    } else {
        f32::from_bits(rest) * f32::from_bits(0x7780_0000) // 2^112
    };
    f32::from_bits(v.to_bits() | sign)
}

/// Element `i` of the result is `0x10` (bit 4) where bit `i` of `qh` is set, else 0: the
/// fifth bits of a `Q5_0` / `Q5_1` block.
#[inline(always)]
pub(super) fn fifth_bits(qh: u32) -> [u8; BLOCK] {
    std::array::from_fn(|i| u8::from((qh >> i) & 1 == 1) << 4)
}

/// Quantizes one row `x` (its length a multiple of 32 or not) into `out`, `ceil(len / 256)`
/// groups; blocks past the end are zero. As ggml's `quantize_row_q8_0` with an f32 scale:
/// `d = amax / 127`, `q = round(x / d)` (half away from zero) through `1 / d`. A NaN in a
/// block makes its `d` NaN, so the products it enters are NaN (its `q` are 0).
#[inline(always)]
pub(super) fn quantize_row(x: &[f32], out: &mut [ActGroup]) {
    for (g, ag) in out.iter_mut().enumerate() {
        for b in 0..8 {
            let start = (g * 8 + b) * BLOCK;
            let mut qs = [0i8; BLOCK];
            let Some(xb) = x.get(start..(start + BLOCK).min(x.len())) else {
                ag.q[run(b, 0)..run(b, 0) + 16].fill(0);
                ag.q[run(b, 1)..run(b, 1) + 16].fill(0);
                ag.d[b] = 0.0;
                ag.s[b] = 0;
                ag.s16[2 * b] = 0;
                ag.s16[2 * b + 1] = 0;
                continue;
            };
            let amax = xb.iter().fold(0.0f32, |m, &v| {
                let a = v.abs();
                // NaN sticks: `a > NaN` is false and `m` stays NaN
                if a > m || a.is_nan() {
                    a
                } else {
                    m
                }
            });
            let d = amax / 127.0;
            // 0 for a block of zeros (and one below 2^-128 * 127, whose 1 / d overflows: its
            // q are then 0, an error far below any f32 product of interest); NaN for a NaN
            let id = 1.0 / d;
            let id = if id.is_finite() { id } else { 0.0 };
            for (q, &v) in qs.iter_mut().zip(xb) {
                *q = (v * id).round().clamp(-127.0, 127.0) as i8;
            }
            let half = |h: &[i8]| h.iter().map(|&q| i16::from(q)).sum::<i16>();
            let (s0, s1) = (half(&qs[..16]), half(&qs[16..]));
            ag.q[run(b, 0)..run(b, 0) + 16].copy_from_slice(&qs[..16]);
            ag.q[run(b, 1)..run(b, 1) + 16].copy_from_slice(&qs[16..]);
            ag.d[b] = d;
            ag.s16[2 * b] = s0;
            ag.s16[2 * b + 1] = s1;
            ag.s[b] = i32::from(s0) + i32::from(s1);
        }
    }
}

/// The portable group product: block `b`'s integer dot product `D` exactly, then its value
/// `c = d_a * (scale * D)` (`d_a * (scale * D + min * s)` for [`Kind::Min`]), rounded after
/// each operation, added to lane `b` of `acc`. The SIMD kernels compute the same `D` and the
/// same float operations in the same order.
#[inline(always)]
pub(super) fn dot_portable<F: Fmt>(w: &WGroup, a: &ActGroup, acc: &mut [f32; 8]) {
    let mut dots = [0i32; 8];
    for (b, d) in dots.iter_mut().enumerate() {
        // half h of block b
        let half = |h: usize| -> i32 {
            let r = run(b, h)..run(b, h) + 16;
            w.q[r.clone()]
                .iter()
                .zip(&a.q[r])
                .map(|(&w, &a)| {
                    let w = if F::KIND == Kind::Signed {
                        i32::from(w as i8)
                    } else {
                        i32::from(w)
                    };
                    w * i32::from(a)
                })
                .sum()
        };
        *d = match F::KIND {
            Kind::Signed | Kind::Min => half(0) + half(1),
            Kind::Offset => half(0) + half(1) - (a.s[b] << F::SHIFT),
            Kind::Q6 => {
                let (s0, s1) = (i32::from(w.sc16[2 * b]), i32::from(w.sc16[2 * b + 1]));
                let off = s0 * i32::from(a.s16[2 * b]) + s1 * i32::from(a.s16[2 * b + 1]);
                s0 * half(0) + s1 * half(1) - (off << F::SHIFT)
            }
        };
    }
    for b in 0..8 {
        let mut t = w.scale[b] * dots[b] as f32;
        if F::KIND == Kind::Min {
            t += w.min[b] * a.s[b] as f32;
        }
        acc[b] += a.d[b] * t;
    }
}

/// A row's value from its 8 lanes: `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`, plus
/// the bias last.
#[inline(always)]
pub(super) fn finish(a: &[f32; 8], bias: Option<f32>) -> f32 {
    let s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    match bias {
        Some(b) => s + b,
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_tile_the_group() {
        let mut seen = [false; GROUP];
        for b in 0..8 {
            for h in 0..2 {
                for j in 0..16 {
                    assert!(!seen[run(b, h) + j]);
                    seen[run(b, h) + j] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
        // vector 2 k + h: block k low, block k + 4 high
        assert_eq!((run(1, 1), run(5, 1), run(7, 0)), (96, 112, 208));
    }

    #[test]
    fn f16_conversion_is_exact_for_every_value() {
        for h in 0..=u16::MAX {
            let ours = f16_to_f32(h);
            let theirs = half::f16::from_bits(h).to_f32();
            if theirs.is_nan() {
                assert!(ours.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(ours.to_bits(), theirs.to_bits(), "{h:#06x}");
            }
        }
    }

    #[test]
    fn activation_blocks_round_half_away_and_sum() {
        let mut x = vec![0.0f32; 40];
        x[0] = 127.0;
        x[1] = -2.5;
        x[2] = 0.5;
        x[17] = 3.0;
        x[32] = -1.0;
        let mut g = [ActGroup::ZERO];
        quantize_row(&x, &mut g);
        let g = &g[0];
        let q = |b: usize, i: usize| g.q[run(b, i / 16) + i % 16];
        assert_eq!(
            (g.d[0], q(0, 0), q(0, 1), q(0, 2), q(0, 17)),
            (1.0, 127, -3, 1, 3)
        );
        assert_eq!((g.s16[0], g.s16[1], g.s[0]), (125, 3, 128));
        // the second block (8 elements, zero-padded): d = 1/127, q = -127
        assert_eq!((q(1, 0), g.s[1], g.d[1]), (-127, -127, 1.0 / 127.0));
        assert_eq!((g.d[2], g.s[7]), (0.0, 0));
    }
}
