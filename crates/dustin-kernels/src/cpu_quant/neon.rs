//! NEON group products (AArch64, 128-bit vectors).
//!
//! A 16-byte vector is one half of a block of 32: the `q` of both operands at
//! [`super::blocks::run`]`(b, h)`, so no shuffling is needed. The products of a block's two
//! halves go into one accumulator of 4 `i32` lanes whose sum is the block's dot product `D`
//! (`Q6_K`: one accumulator per half, times its sub-block scale), exactly: [`Neon`] multiplies
//! bytes to `i16` (`smull`, `smlal2`: two products per `i16`, at most `2 * 128 * 127` in
//! magnitude, `Q8_0`'s `-128` included) and adds pairs into `i32` (`sadalp`); [`NeonDot`] uses
//! `sdot` (every weight fits in `i8`: unsigned ones are at most 63). Two levels of pairwise
//! sums (`addp`) over the accumulators of 4 blocks put block `b` in lane `b mod 4`, and the
//! float part runs on 4 lanes at a time with the operations of
//! [`super::blocks::dot_portable`], in its order: a separate multiply and add each (`fmul`,
//! `fadd`, never `fmla`), so every value is rounded as there.

use std::arch::aarch64::*;
use std::arch::asm;

use super::blocks::{run, ActGroup, Fmt, Kind, WGroup};
use super::tile::{tile_body, Kern, Task};

/// The product of 16-byte vectors added to `acc`: the lanes of the result sum to the lanes
/// of `acc` plus `sum_i w_i a_i` (signed bytes, `|w_i a_i| <= 128 * 127`), exactly.
trait Dot16 {
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t;
}

/// NEON (AArch64 base ISA): `smull` and `smlal2` to `i16`, then `sadalp` to `i32`.
pub(super) struct Neon;
/// NEON with the dot product extension (`FEAT_DotProd`): `sdot`.
pub(super) struct NeonDot;

impl Dot16 for Neon {
    #[inline(always)]
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
        unsafe {
            // each i16 lane: two products of at most 128 * 127 in magnitude, no overflow
            let p = vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(a)), w, a);
            vpadalq_s16(acc, p)
        }
    }
}

impl Dot16 for NeonDot {
    #[inline(always)]
    unsafe fn dot16(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // `vdotq_s32` is not stable in Rust; `sdot` is the instruction it stands for
        // SAFETY: the caller's function enables `dotprod` (`tile_neon_dot`); registers only.
        unsafe {
            asm!(
                "sdot {acc:v}.4s, {w:v}.16b, {a:v}.16b",
                acc = inout(vreg) acc,
                w = in(vreg) w,
                a = in(vreg) a,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }
}

/// Half `h` of block `b` of the weights, as `i8` (unsigned `q` are at most 63).
///
/// # Safety
/// NEON is available; `b < 8`, `h < 2`.
#[inline(always)]
unsafe fn load_w(w: &WGroup, b: usize, h: usize) -> int8x16_t {
    debug_assert!(b < 8 && h < 2);
    unsafe { vreinterpretq_s8_u8(vld1q_u8(w.q.as_ptr().add(run(b, h)))) }
}

/// Half `h` of block `b` of the activations.
///
/// # Safety
/// NEON is available; `b < 8`, `h < 2`.
#[inline(always)]
unsafe fn load_a(a: &ActGroup, b: usize, h: usize) -> int8x16_t {
    debug_assert!(b < 8 && h < 2);
    unsafe { vld1q_s8(a.q.as_ptr().add(run(b, h))) }
}

/// Lane `i` of the result: the sum of the lanes of `p[i]`.
///
/// # Safety
/// NEON is available.
#[inline(always)]
unsafe fn lane_sums(p: &[int32x4_t; 4]) -> int32x4_t {
    unsafe { vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3])) }
}

/// Lane `i`: the dot product of both halves of block `4 j + i`.
///
/// # Safety
/// NEON (and what `D` needs) is available; `j < 2`.
#[inline(always)]
unsafe fn block_dots<D: Dot16>(w: &WGroup, a: &ActGroup, j: usize) -> int32x4_t {
    unsafe {
        let mut p = [vdupq_n_s32(0); 4];
        for (i, p) in p.iter_mut().enumerate() {
            let b = 4 * j + i;
            let d0 = D::dot16(vdupq_n_s32(0), load_w(w, b, 0), load_a(a, b, 0));
            *p = D::dot16(d0, load_w(w, b, 1), load_a(a, b, 1));
        }
        lane_sums(&p)
    }
}

/// Lane `i`: the dot product of half `h` of block `4 j + i`.
///
/// # Safety
/// NEON (and what `D` needs) is available; `j < 2`, `h < 2`.
#[inline(always)]
unsafe fn half_dots<D: Dot16>(w: &WGroup, a: &ActGroup, j: usize, h: usize) -> int32x4_t {
    unsafe {
        let mut p = [vdupq_n_s32(0); 4];
        for (i, p) in p.iter_mut().enumerate() {
            let b = 4 * j + i;
            *p = D::dot16(vdupq_n_s32(0), load_w(w, b, h), load_a(a, b, h));
        }
        lane_sums(&p)
    }
}

/// Lanes `4 j .. 4 j + 4` of `v`.
///
/// # Safety
/// NEON is available; `j < 2`.
#[inline(always)]
unsafe fn quarter(v: int16x8_t, j: usize) -> int16x4_t {
    unsafe {
        if j == 0 {
            vget_low_s16(v)
        } else {
            vget_high_s16(v)
        }
    }
}

/// [`super::blocks::dot_portable`] with vectors: blocks `4 j .. 4 j + 4` per step `j`.
///
/// # Safety
/// NEON (and what `D` needs) is available.
#[inline(always)]
unsafe fn group<D: Dot16, F: Fmt>(w: &WGroup, a: &ActGroup, acc: &mut [f32; 8]) {
    unsafe {
        let shift = vdupq_n_s32(F::SHIFT as i32);
        for j in 0..2 {
            let s = vld1q_s32(a.s.as_ptr().add(4 * j));
            let d = match F::KIND {
                Kind::Signed | Kind::Min => block_dots::<D>(w, a, j),
                Kind::Offset => vsubq_s32(block_dots::<D>(w, a, j), vshlq_s32(s, shift)),
                Kind::Q6 => {
                    // .0: the scales (sums) of halves 0 of blocks 0..8, .1: of halves 1
                    let sc = vld2q_s16(w.sc16.as_ptr());
                    let s16 = vld2q_s16(a.s16.as_ptr());
                    let (c0, c1) = (quarter(sc.0, j), quarter(sc.1, j));
                    let off = vmlal_s16(vmull_s16(c0, quarter(s16.0, j)), c1, quarter(s16.1, j));
                    let d0 = vmulq_s32(vmovl_s16(c0), half_dots::<D>(w, a, j, 0));
                    let d = vmlaq_s32(d0, vmovl_s16(c1), half_dots::<D>(w, a, j, 1));
                    vsubq_s32(d, vshlq_s32(off, shift))
                }
            };
            let mut t = vmulq_f32(vld1q_f32(w.scale.as_ptr().add(4 * j)), vcvtq_f32_s32(d));
            if F::KIND == Kind::Min {
                let m = vmulq_f32(vld1q_f32(w.min.as_ptr().add(4 * j)), vcvtq_f32_s32(s));
                t = vaddq_f32(t, m);
            }
            let c = vmulq_f32(vld1q_f32(a.d.as_ptr().add(4 * j)), t);
            let ap = acc.as_mut_ptr().add(4 * j);
            vst1q_f32(ap, vaddq_f32(vld1q_f32(ap), c));
        }
    }
}

/// [`super::blocks::fifth_bits`] with vectors: byte `i` takes byte `i / 8` of `qh`, tests
/// bit `i mod 8` and keeps `0x10` where it is set.
///
/// # Safety
/// NEON is available.
#[inline(always)]
unsafe fn fifth_bits_neon(qh: u32) -> [u8; 32] {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    unsafe {
        let [b0, b1, b2, b3] = qh.to_le_bytes();
        let bit = vld1q_u8(BIT.as_ptr());
        let ten = vdupq_n_u8(0x10);
        let lo = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
        let hi = vcombine_u8(vdup_n_u8(b2), vdup_n_u8(b3));
        let mut out = [0u8; 32];
        vst1q_u8(out.as_mut_ptr(), vandq_u8(vtstq_u8(lo, bit), ten));
        vst1q_u8(out.as_mut_ptr().add(16), vandq_u8(vtstq_u8(hi, bit), ten));
        out
    }
}

/// The group product, prefetch and fifth bits of a NEON kind `$t` with the block product
/// `$t: Dot16` (`f16` stays [`super::blocks::f16_to_f32`]: NEON's `fcvtl` from `f16` needs
/// a newer Rust than the workspace's minimum).
macro_rules! neon_kern {
    ($t:ty) => {
        impl Kern for $t {
            #[inline(always)]
            unsafe fn dot<F: Fmt>(w: &WGroup, a: &ActGroup, acc: &mut [f32; 8]) {
                unsafe { group::<$t, F>(w, a, acc) }
            }

            #[inline(always)]
            unsafe fn prefetch(p: *const u8) {
                // SAFETY: a prefetch hint does not fault, whatever the address.
                unsafe {
                    asm!(
                        "prfm pldl1keep, [{p}]",
                        p = in(reg) p,
                        options(nostack, preserves_flags, readonly),
                    );
                }
            }

            #[inline(always)]
            unsafe fn fifth_bits(qh: u32) -> [u8; 32] {
                unsafe { fifth_bits_neon(qh) }
            }
        }
    };
}

neon_kern!(Neon);
neon_kern!(NeonDot);

/// One tile with NEON.
///
/// # Safety
/// NEON is available (it is part of the AArch64 base ISA).
#[target_feature(enable = "neon")]
pub(super) unsafe fn tile_neon<F: Fmt>(t: &Task<'_>, out: &mut [f32]) {
    unsafe { tile_body::<Neon, F>(t, out) }
}

/// One tile with NEON and `sdot`.
///
/// # Safety
/// NEON and the dot product extension are available.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn tile_neon_dot<F: Fmt>(t: &Task<'_>, out: &mut [f32]) {
    unsafe { tile_body::<NeonDot, F>(t, out) }
}
