//! AVX2 and AVX-512 VNNI group products (256-bit vectors), and the AVX2 decoders of the
//! quants of the 32-element formats, `Q4_K` and `Q6_K`.
//!
//! The `q` of both operands are laid out by [`super::blocks::run`]: vector `2 k + h` holds
//! half `h` of block `k` (low 16 bytes) and of block `k + 4` (high 16 bytes). The products
//! of vectors `2 k` and `2 k + 1` go into one accumulator of 8 `i32` lanes, each the sum of
//! 4 adjacent products `q_w q_a` (AVX2: `vpmaddubsw` to pairs in `i16`, then `vpmaddwd` by
//! ones; VNNI: `vpdpbusd`), so lanes 0..4 hold block `k` and lanes 4..8 block `k + 4`; two
//! levels of `vphaddd` over the 4 accumulators leave block `b`'s dot product `D` in lane `b`,
//! exactly (no `i16` pair can saturate: unsigned weights are at most 63, activations at most
//! 127 in magnitude, and `Q8_0`'s signed weights go through the sign trick, `|q_w| <= 128`).
//! The float part then runs on the 8 lanes with the operations of
//! [`super::blocks::dot_portable`], in its order.

use std::arch::x86_64::*;

use super::blocks::{ActGroup, Fmt, Kind, WGroup};
use super::tile::{tile_body, Kern, Task};

/// The product of 32-byte vectors added to `acc`: lane `l` gets the sum of products
/// `4 l .. 4 l + 4` of unsigned `w` and signed `a`.
trait Dot4 {
    unsafe fn dot4(acc: __m256i, w: __m256i, a: __m256i) -> __m256i;
}

/// AVX2: `vpmaddubsw` then `vpmaddwd` with ones.
pub(super) struct Avx2;
/// AVX-512 VNNI (256-bit, `avx512vl`): `vpdpbusd`.
pub(super) struct Vnni;
/// AVX-VNNI (VEX-encoded, no AVX-512): `vpdpbusd`.
pub(super) struct AvxVnni;

impl Dot4 for Avx2 {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        unsafe {
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
            _mm256_add_epi32(acc, p)
        }
    }
}

impl Dot4 for Vnni {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(acc, w, a) }
    }
}

impl Dot4 for AvxVnni {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, a) }
    }
}

/// `v << shift` per `i32` lane for the shifts the formats use (3, 4, 5).
#[inline(always)]
unsafe fn shl(v: __m256i, shift: u32) -> __m256i {
    unsafe {
        match shift {
            3 => _mm256_slli_epi32::<3>(v),
            4 => _mm256_slli_epi32::<4>(v),
            5 => _mm256_slli_epi32::<5>(v),
            s => _mm256_sll_epi32(v, _mm_cvtsi32_si128(s as i32)),
        }
    }
}

/// The 32-byte vector `v` of the `q` of a group (`i8` or `u8`, 32-byte aligned).
///
/// # Safety
/// AVX is available; `v < 8`; `q` is 32-byte aligned (as in [`WGroup`] and [`ActGroup`]).
#[inline(always)]
unsafe fn load<T>(q: &[T; 256], v: usize) -> __m256i {
    debug_assert_eq!(size_of::<T>(), 1);
    unsafe { _mm256_load_si256(q.as_ptr().cast::<__m256i>().add(v)) }
}

/// The products of vectors `2 k` and `2 k + 1` of `w` and `a` summed in lanes of 4 bytes:
/// block `k` in lanes 0..4, block `k + 4` in lanes 4..8 (with `Q6_K`'s sub-block scales).
/// A function, not a closure: a closure would not inherit the `#[target_feature]`s of the
/// function it is inlined into, and its intrinsics would stay calls.
///
/// # Safety
/// AVX2 (and for [`Vnni`] / [`AvxVnni`], their VNNI) is available; `k < 4`.
#[inline(always)]
unsafe fn pair<D: Dot4, F: Fmt>(w: &WGroup, a: &ActGroup, k: usize) -> __m256i {
    unsafe {
        let (v0, v1) = (2 * k, 2 * k + 1);
        let (w0, w1) = (load(&w.q, v0), load(&w.q, v1));
        let (a0, a1) = (load(&a.q, v0), load(&a.q, v1));
        match F::KIND {
            Kind::Signed => {
                let p = D::dot4(
                    _mm256_setzero_si256(),
                    _mm256_abs_epi8(w0),
                    _mm256_sign_epi8(a0, w0),
                );
                D::dot4(p, _mm256_abs_epi8(w1), _mm256_sign_epi8(a1, w1))
            }
            Kind::Q6 => {
                let s0 = _mm256_load_si256(w.sub[v0].as_ptr().cast());
                let s1 = _mm256_load_si256(w.sub[v1].as_ptr().cast());
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, a0), s0);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, a1), s1);
                _mm256_add_epi32(p0, p1)
            }
            Kind::Offset | Kind::Min => {
                let p = D::dot4(_mm256_setzero_si256(), w0, a0);
                D::dot4(p, w1, a1)
            }
        }
    }
}

/// [`super::blocks::dot_portable`] with vectors.
///
/// # Safety
/// AVX2 (and for [`Vnni`] / [`AvxVnni`], their VNNI) is available.
#[inline(always)]
unsafe fn group<D: Dot4, F: Fmt>(w: &WGroup, a: &ActGroup, acc: &mut [f32; 8]) {
    unsafe {
        let mut pairs = [_mm256_setzero_si256(); 4];
        for (k, p) in pairs.iter_mut().enumerate() {
            *p = pair::<D, F>(w, a, k);
        }
        // lanes 0..4 of pairs[k] hold block k, lanes 4..8 block k + 4
        let h01 = _mm256_hadd_epi32(pairs[0], pairs[1]);
        let h23 = _mm256_hadd_epi32(pairs[2], pairs[3]);
        let mut d = _mm256_hadd_epi32(h01, h23);
        match F::KIND {
            Kind::Offset => {
                let s = _mm256_load_si256(a.s.as_ptr().cast());
                d = _mm256_sub_epi32(d, shl(s, F::SHIFT));
            }
            Kind::Q6 => {
                let sc = _mm256_load_si256(w.sc16.as_ptr().cast());
                let s16 = _mm256_load_si256(a.s16.as_ptr().cast());
                d = _mm256_sub_epi32(d, shl(_mm256_madd_epi16(sc, s16), F::SHIFT));
            }
            Kind::Min | Kind::Signed => {}
        }
        let mut t = _mm256_mul_ps(_mm256_load_ps(w.scale.as_ptr()), _mm256_cvtepi32_ps(d));
        if F::KIND == Kind::Min {
            let s = _mm256_cvtepi32_ps(_mm256_load_si256(a.s.as_ptr().cast()));
            t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_load_ps(w.min.as_ptr()), s));
        }
        let c = _mm256_mul_ps(_mm256_load_ps(a.d.as_ptr()), t);
        let ap = acc.as_mut_ptr();
        _mm256_storeu_ps(ap, _mm256_add_ps(_mm256_loadu_ps(ap), c));
    }
}

/// `f16` bits to `f32` with F16C's `vcvtph2ps` (exact; the same values as
/// [`super::blocks::f16_to_f32`]).
///
/// # Safety
/// F16C is available.
#[inline(always)]
unsafe fn f16_f16c(h: u16) -> f32 {
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h)))) }
}

/// [`Kern::pair_nibbles`] with vectors: the nibbles of blocks `k` and `k + 4` in the two
/// 128-bit lanes, masked (low) and shifted (high); with `FIFTH`, byte `i` of each lane takes
/// byte `i / 8` of its block's `qh` (bytes 0, 1 for the low nibbles' elements 0..16, bytes
/// 2, 3 for the high ones'), tests bit `i mod 8` against a mask and adds `0x10` where it is
/// set.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn pair_nibbles_avx2<const FIFTH: bool>(
    a: &[u8; 16],
    b: &[u8; 16],
    ha: u32,
    hb: u32,
    out: &mut [u8; 64],
) {
    unsafe {
        let v = _mm256_loadu2_m128i(b.as_ptr().cast(), a.as_ptr().cast());
        let low4 = _mm256_set1_epi8(0x0F);
        let mut lo = _mm256_and_si256(v, low4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
        if FIFTH {
            let h = _mm256_setr_epi32(ha as i32, 0, 0, 0, hb as i32, 0, 0, 0);
            #[rustfmt::skip]
            let (s_lo, s_hi) = (
                _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                ),
                _mm256_setr_epi8(
                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                ),
            );
            lo = _mm256_or_si256(lo, fifth_of(h, s_lo));
            hi = _mm256_or_si256(hi, fifth_of(h, s_hi));
        }
        let p = out.as_mut_ptr().cast::<__m256i>();
        _mm256_storeu_si256(p, lo);
        _mm256_storeu_si256(p.add(1), hi);
    }
}

/// [`Kern::pair_bytes`] with two 128-bit loads a vector and 32-byte stores.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn pair_bytes_avx2(a: &[u8; 32], b: &[u8; 32], out: &mut [u8; 64]) {
    unsafe {
        let (a, b) = (a.as_ptr(), b.as_ptr());
        let lo = _mm256_loadu2_m128i(b.cast(), a.cast());
        let hi = _mm256_loadu2_m128i(b.add(16).cast(), a.add(16).cast());
        let p = out.as_mut_ptr().cast::<__m256i>();
        _mm256_storeu_si256(p, lo);
        _mm256_storeu_si256(p.add(1), hi);
    }
}

/// [`Kern::k4_nibbles`] with vectors: blocks `2 c` and `2 c + 1` (`c < 2`) share their bytes
/// of `qs` (low and high nibbles), and so do blocks `2 c + 4` and `2 c + 5`, whose halves
/// sit in the upper lanes of the same vectors: one 32-byte vector of `qs` bytes a `(c, h)`,
/// masked for vector `2 (2 c) + h` and shifted for vector `2 (2 c + 1) + h`.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn k4_nibbles_avx2(qs: &[u8; 128], q: &mut [u8; 256]) {
    unsafe {
        let src = qs.as_ptr();
        let dst = q.as_mut_ptr().cast::<__m256i>();
        let low4 = _mm256_set1_epi8(0x0F);
        for c in 0..2 {
            for h in 0..2 {
                let at = 32 * c + 16 * h;
                let v = _mm256_loadu2_m128i(src.add(at + 64).cast(), src.add(at).cast());
                _mm256_storeu_si256(dst.add(2 * (2 * c) + h), _mm256_and_si256(v, low4));
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low4);
                _mm256_storeu_si256(dst.add(2 * (2 * c + 1) + h), hi);
            }
        }
    }
}

/// [`Kern::q6k_quants`] with vectors: for each half `h`, the bytes of `ql` and `qh` of blocks
/// `k` (`n = 0`, low lanes) and `k + 4` (`n = 1`, high lanes) in one vector each; 16-bit
/// shifts then byte masks take each block's nibble and bit pair (the bits a shift moves
/// across a byte are masked off).
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn q6k_quants_avx2(ql: &[u8; 128], qh: &[u8; 64], q: &mut [u8; 256]) {
    unsafe {
        let (l, hb) = (ql.as_ptr(), qh.as_ptr());
        let dst = q.as_mut_ptr().cast::<__m256i>();
        let low4 = _mm256_set1_epi8(0x0F);
        let bits45 = _mm256_set1_epi8(0x30);
        for h in 0..2 {
            let at = 16 * h;
            let a = _mm256_loadu2_m128i(l.add(64 + at).cast(), l.add(at).cast());
            let b = _mm256_loadu2_m128i(l.add(96 + at).cast(), l.add(32 + at).cast());
            let x = _mm256_loadu2_m128i(hb.add(32 + at).cast(), hb.add(at).cast());
            // block k's bit pair (bits 2 k, 2 k + 1 of qh) moved to bits 4, 5
            let hi = [
                _mm256_and_si256(_mm256_slli_epi16::<4>(x), bits45),
                _mm256_and_si256(_mm256_slli_epi16::<2>(x), bits45),
                _mm256_and_si256(x, bits45),
                _mm256_and_si256(_mm256_srli_epi16::<2>(x), bits45),
            ];
            let lo = [
                _mm256_and_si256(a, low4),
                _mm256_and_si256(b, low4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(a), low4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(b), low4),
            ];
            for k in 0..4 {
                _mm256_storeu_si256(dst.add(2 * k + h), _mm256_or_si256(lo[k], hi[k]));
            }
        }
    }
}

/// `0x10` in byte `i` where bit `i mod 8` of byte `spread[i]` of `h`'s lane is set.
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
unsafe fn fifth_of(h: __m256i, spread: __m256i) -> __m256i {
    unsafe {
        let bytes = _mm256_shuffle_epi8(h, spread);
        let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }
}

/// The group product, prefetch and conversions of an x86 instruction set `$t` with the
/// block product `$t: Dot4`.
macro_rules! x86_kern {
    ($t:ty) => {
        impl Kern for $t {
            #[inline(always)]
            unsafe fn dot<F: Fmt>(w: &WGroup, a: &ActGroup, acc: &mut [f32; 8]) {
                unsafe { group::<$t, F>(w, a, acc) }
            }

            #[inline(always)]
            unsafe fn prefetch(p: *const u8) {
                unsafe { _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()) }
            }

            #[inline(always)]
            unsafe fn f16(h: u16) -> f32 {
                unsafe { f16_f16c(h) }
            }

            #[inline(always)]
            unsafe fn pair_nibbles<const FIFTH: bool>(
                a: &[u8; 16],
                b: &[u8; 16],
                ha: u32,
                hb: u32,
                out: &mut [u8; 64],
            ) {
                unsafe { pair_nibbles_avx2::<FIFTH>(a, b, ha, hb, out) }
            }

            #[inline(always)]
            unsafe fn pair_bytes(a: &[u8; 32], b: &[u8; 32], out: &mut [u8; 64]) {
                unsafe { pair_bytes_avx2(a, b, out) }
            }

            #[inline(always)]
            unsafe fn k4_nibbles(qs: &[u8; 128], q: &mut [u8; 256]) {
                unsafe { k4_nibbles_avx2(qs, q) }
            }

            #[inline(always)]
            unsafe fn q6k_quants(ql: &[u8; 128], qh: &[u8; 64], q: &mut [u8; 256]) {
                unsafe { q6k_quants_avx2(ql, qh, q) }
            }
        }
    };
}

x86_kern!(Avx2);
x86_kern!(Vnni);
x86_kern!(AvxVnni);

/// One tile with AVX2.
///
/// # Safety
/// AVX2 and F16C are available.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn tile_avx2<F: Fmt>(t: &Task<'_>, out: &mut [f32]) {
    unsafe { tile_body::<Avx2, F>(t, out) }
}

/// One tile with AVX-512 VNNI on 256-bit vectors.
///
/// # Safety
/// AVX2, F16C, AVX-512F, VL and VNNI are available.
#[target_feature(enable = "avx2,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn tile_vnni<F: Fmt>(t: &Task<'_>, out: &mut [f32]) {
    unsafe { tile_body::<Vnni, F>(t, out) }
}

/// One tile with AVX-VNNI on 256-bit vectors.
///
/// # Safety
/// AVX2, F16C and AVX-VNNI are available.
#[target_feature(enable = "avx2,f16c,avxvnni")]
pub(super) unsafe fn tile_avxvnni<F: Fmt>(t: &Task<'_>, out: &mut [f32]) {
    unsafe { tile_body::<AvxVnni, F>(t, out) }
}

/// Quantizes rows of activations with AVX2 code generation (the rounding vectorizes).
///
/// # Safety
/// AVX2 is available.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_avx2(x: &[f32], out: &mut [ActGroup]) {
    super::blocks::quantize_row(x, out)
}
