//! The two operands of a group product, in the layouts every instruction set reads:
//! [`ActGroup`] (256 activations of one row quantized to `i8` in blocks of 32) and
//! [`WGroup`] (256 weights of one row decoded from their ggml blocks to small integers with
//! per-block scales), and the decoders of the eight ggml block formats into [`WGroup`].
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

use super::tile::Kern;
use super::QuantType;

/// Elements of a group: eight blocks of [`BLOCK`] (one k-quant super-block).
pub(super) const GROUP: usize = 256;

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

/// The `ggml_half` at byte `at` of `b` (`at + 2 <= b.len()`), converted by `K`.
///
/// # Safety
/// The instruction set of `K` is available.
#[inline(always)]
unsafe fn half_at<K: Kern>(b: &[u8], at: usize) -> f32 {
    unsafe { K::f16(u16::from_le_bytes([b[at], b[at + 1]])) }
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

/// Group `g` of a row of 32-element blocks of `N` bytes: blocks `8 g .. 8 g + 8`, each
/// decoded by `f` into its 32 `q` in element order (returning its `(scale, min)`) and laid
/// out by [`run`]; blocks past the row's end are zero. Blocks `k` and `k + 4` are decoded
/// together and their vectors written whole (32-byte stores that the products' loads can
/// take from the store buffer), with fixed-size arrays throughout so that this vectorizes.
#[inline(always)]
fn blocks32<const N: usize>(
    row: &[u8],
    g: usize,
    out: &mut WGroup,
    f: impl Fn(&[u8; N], &mut [u8; BLOCK]) -> (f32, f32),
) {
    for k in 0..4 {
        let mut q = [[0u8; BLOCK]; 2];
        for (p, qp) in q.iter_mut().enumerate() {
            let b = k + 4 * p;
            let i = g * 8 + b;
            let (s, m) = match row.get(i * N..).and_then(|r| r.first_chunk::<N>()) {
                Some(blk) => f(blk, qp),
                None => (0.0, 0.0),
            };
            out.scale[b] = s;
            out.min[b] = m;
        }
        for h in 0..2 {
            let mut v = [0u8; 32];
            v[..16].copy_from_slice(&q[0][16 * h..16 * h + 16]);
            v[16..].copy_from_slice(&q[1][16 * h..16 * h + 16]);
            out.q[32 * (2 * k + h)..32 * (2 * k + h) + 32].copy_from_slice(&v);
        }
    }
}

/// The 16 nibbles at `b[at..at + 16]` into `q`: low nibbles to elements 0..16, high nibbles
/// to 16..32.
#[inline(always)]
fn nibbles<const N: usize>(b: &[u8; N], at: usize, q: &mut [u8; BLOCK]) {
    for j in 0..16 {
        let v = b[at + j];
        q[j] = v & 0x0F;
        q[j + 16] = v >> 4;
    }
}

/// The 5-bit values of a `Q5_0` / `Q5_1` block: [`nibbles`] at `at`, plus bit `i` of the
/// little-endian `u32` at `b[at - 4..at]` as bit 4 of element `i` (expanded by `K`).
///
/// # Safety
/// The instruction set of `K` is available.
#[inline(always)]
unsafe fn nibbles5<K: Kern, const N: usize>(b: &[u8; N], at: usize, q: &mut [u8; BLOCK]) {
    nibbles(b, at, q);
    let qh = u32::from_le_bytes([b[at - 4], b[at - 3], b[at - 2], b[at - 1]]);
    // SAFETY: as this function's.
    let hi = unsafe { K::fifth_bits(qh) };
    for (v, h) in q.iter_mut().zip(hi) {
        *v |= h;
    }
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

impl Fmt for Q4_0 {
    const TY: QuantType = QuantType::Q4_0;
    const KIND: Kind = Kind::Offset;
    const SHIFT: u32 = 3;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        blocks32::<18>(row, g, out, |b, q| {
            nibbles(b, 2, q);
            (unsafe { half_at::<K>(b, 0) }, 0.0)
        });
    }
}

impl Fmt for Q4_1 {
    const TY: QuantType = QuantType::Q4_1;
    const KIND: Kind = Kind::Min;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        blocks32::<20>(row, g, out, |b, q| {
            nibbles(b, 4, q);
            (unsafe { half_at::<K>(b, 0) }, unsafe { half_at::<K>(b, 2) })
        });
    }
}

impl Fmt for Q5_0 {
    const TY: QuantType = QuantType::Q5_0;
    const KIND: Kind = Kind::Offset;
    const SHIFT: u32 = 4;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        blocks32::<22>(row, g, out, |b, q| {
            unsafe { nibbles5::<K, 22>(b, 6, q) };
            (unsafe { half_at::<K>(b, 0) }, 0.0)
        });
    }
}

impl Fmt for Q5_1 {
    const TY: QuantType = QuantType::Q5_1;
    const KIND: Kind = Kind::Min;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        blocks32::<24>(row, g, out, |b, q| {
            unsafe { nibbles5::<K, 24>(b, 8, q) };
            (unsafe { half_at::<K>(b, 0) }, unsafe { half_at::<K>(b, 2) })
        });
    }
}

impl Fmt for Q8_0 {
    const TY: QuantType = QuantType::Q8_0;
    const KIND: Kind = Kind::Signed;
    #[inline(always)]
    unsafe fn decode<K: Kern>(row: &[u8], g: usize, out: &mut WGroup) {
        blocks32::<34>(row, g, out, |b, q| {
            for (o, &v) in q.iter_mut().zip(&b[2..]) {
                *o = v;
            }
            (unsafe { half_at::<K>(b, 0) }, 0.0)
        });
    }
}

/// The 6-bit scales and minima of the 8 sub-blocks from the 12 packed bytes `sc` of a
/// `block_q4_K` / `block_q5_K`: [`scale_min_k4`] for every sub-block at once, on 32-bit words
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
        // byte 16 + 32 c + l: element l of block 2 c (low nibble) and of block 2 c + 1 (high)
        for c in 0..4 {
            for h in 0..2 {
                for j in 0..16 {
                    let v = blk[16 + 32 * c + 16 * h + j];
                    out.q[run(2 * c, h) + j] = v & 0x0F;
                    out.q[run(2 * c + 1, h) + j] = v >> 4;
                }
            }
        }
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
        // element l of block 4 n + k (element 128 n + 32 k + l of the super-block): bits of
        // ql[64 n + l (+ 32 for k odd)] (low nibble for k < 2, high for k >= 2) and bits
        // 2 k .. 2 k + 2 of qh[32 n + l], as `dequantize_row_q6_K`
        for n in 0..2 {
            for h in 0..2 {
                for j in 0..16 {
                    let l = 16 * h + j;
                    let (a, b) = (blk[64 * n + l], blk[64 * n + l + 32]);
                    let bits = blk[128 + 32 * n + l];
                    out.q[run(4 * n, h) + j] = (a & 0x0F) | ((bits & 3) << 4);
                    out.q[run(4 * n + 1, h) + j] = (b & 0x0F) | (((bits >> 2) & 3) << 4);
                    out.q[run(4 * n + 2, h) + j] = (a >> 4) | (((bits >> 4) & 3) << 4);
                    out.q[run(4 * n + 3, h) + j] = (b >> 4) | (((bits >> 6) & 3) << 4);
                }
            }
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
