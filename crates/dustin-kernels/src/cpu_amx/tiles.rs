//! The AMX instructions (inline assembly: Rust has no stable AMX intrinsics) and the
//! product's tasks.

use std::arch::asm;

use rayon::prelude::*;

use super::pack::{self, Aligned, A_TILE, BLOCK_STEPS, B_TILE_PAIRS};
use super::{K_STEP, PANEL, ROW_BLOCK};
use crate::cpu_quant::QuantMatrix;
use crate::Result;

/// `ARCH_REQ_XCOMP_PERM` and `XFEATURE_XTILEDATA` (Linux `arch/x86/include/uapi/asm/prctl.h`
/// and the kernel's `Documentation/arch/x86/xstate.rst`).
const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// CPUID leaf 7 reports `AMX-BF16` (EDX bit 22) and `AMX-TILE` (bit 24), and the kernel
/// grants this process the tile data state.
pub(super) fn request() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // leaf 7 is read only where leaf 0 reports it
    let max = __cpuid_count(0, 0).eax;
    if max < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    if (edx >> 22) & 1 == 0 || (edx >> 24) & 1 == 0 {
        return false;
    }
    // SAFETY: a plain system call with integer arguments; it fails cleanly (non-zero) where
    // the kernel does not know or refuses the request.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// The tile configuration `ldtilecfg` reads (palette 1): 64 bytes.
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Every one of the 8 tiles 16 rows of 64 bytes: `tmm0..3` the `C` tiles (16 x 16 f32),
/// `tmm4..5` the `A` tiles (16 rows x 32 bf16), `tmm6..7` the `B` tiles (16 pairs x 16
/// columns x 2 bf16).
const CONFIG: TileConfig = TileConfig {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// A pointer the tasks write disjoint columns of the output through.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: each task writes only the columns of its own panels (see `matmul`).
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

/// Most panels a task takes: 128 weight rows, whose `B` tiles of one block of `k` (128 KiB,
/// `hi` and `lo`) stay in L2 while every row block passes over them.
const MAX_GROUP: usize = 4;

/// [`super::amx_matmul`] after its checks (AMX available, shapes valid).
pub(super) fn matmul(
    x: &[f32],
    m: usize,
    w: &QuantMatrix,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>> {
    let (n, k) = (w.rows(), w.cols());
    let m_pad = m.div_ceil(ROW_BLOCK) * ROW_BLOCK;
    let mut y = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return Ok(y);
    }
    let (ah, al) = pack::split_rows(x, k, m_pad);
    let panels = n.div_ceil(PANEL);
    // enough tasks for every thread twice over where the weight has that many panels
    let group = (panels / (2 * rayon::current_num_threads()).max(1)).clamp(1, MAX_GROUP);
    let out = Out(y.as_mut_ptr());
    (0..panels.div_ceil(group))
        .into_par_iter()
        .for_each(|task| {
            let p0 = task * group;
            let task = Group {
                w,
                ah: ah.as_slice(),
                al: al.as_slice(),
                m,
                m_pad,
                k,
                j0: p0 * PANEL,
                panels: group.min(panels - p0),
            };
            // SAFETY: AMX is available (checked by `amx_matmul`); the A tiles hold `m_pad * k`
            // values each, 64-byte aligned; the task writes only columns
            // `j0 .. j0 + panels * PANEL` (below `n`) of `y`'s `m` rows, which no other task
            // writes, while `y` outlives the tasks.
            unsafe { task.run(out, bias) }
        });
    Ok(y)
}

/// One task: every row block of `A` times a group of panels of weights.
struct Group<'a> {
    w: &'a QuantMatrix,
    ah: &'a [u16],
    al: &'a [u16],
    m: usize,
    m_pad: usize,
    k: usize,
    j0: usize,
    panels: usize,
}

impl Group<'_> {
    /// Writes rows `0 .. m`, columns `j0 .. j0 + panels * PANEL` (those below `n`) of `y`
    /// (`[m, n]` at `out`), plus the bias.
    ///
    /// Per block of `k` (256 values, [`BLOCK_STEPS`] steps): the group's `B` tiles decoded
    /// and split ([`pack::pack_block`]), then for each row block the 32 rows' `A` tiles of
    /// the block (32 KiB, L1) against each panel: the four `C` tiles loaded from the task's
    /// accumulators (zero at the first block), 12 tile products a step, stored back.
    ///
    /// # Safety
    /// AMX is available and granted; `ah`, `al` hold `m_pad * k` values laid out by
    /// [`pack::split_rows`], 64-byte aligned; `out` points at `m * n` writable f32 of which
    /// no other thread touches these columns.
    unsafe fn run(&self, out: Out, bias: Option<&[f32]>) {
        let (k, panels) = (self.k, self.panels);
        let steps_total = k / K_STEP;
        let row_blocks = self.m_pad / ROW_BLOCK;
        // C tiles: per row block and panel four tiles of 16 x 16 f32, one after another
        let mut acc = Aligned::<f32>::zeroed(row_blocks * panels * 4 * 256);
        let tile_pairs = BLOCK_STEPS * panels * 2 * B_TILE_PAIRS;
        let mut bh = Aligned::<u32>::zeroed(tile_pairs);
        let mut bl = Aligned::<u32>::zeroed(tile_pairs);
        let sb = 64usize; // bytes between rows of a tile
                          // SAFETY: `CONFIG` is a valid palette-1 configuration (64 bytes, aligned).
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
        for g in 0..steps_total.div_ceil(BLOCK_STEPS) {
            let s0 = g * BLOCK_STEPS;
            let steps = BLOCK_STEPS.min(steps_total - s0);
            pack::pack_block(
                self.w,
                self.j0,
                panels,
                g,
                steps,
                bh.as_mut_slice(),
                bl.as_mut_slice(),
            );
            let (bhp, blp) = (bh.as_slice().as_ptr(), bl.as_slice().as_ptr());
            for r in 0..row_blocks {
                // the A tiles of row block r from step s0: two halves, `hi` and `lo`
                let a0 = (r * steps_total + s0) * 2 * A_TILE;
                for p in 0..panels {
                    let c = acc.as_mut_slice()[(r * panels + p) * 4 * 256..].as_mut_ptr();
                    // SAFETY: four 1 KiB tiles at `c` within `acc`.
                    unsafe {
                        if g == 0 {
                            asm!(
                                "tilezero tmm0",
                                "tilezero tmm1",
                                "tilezero tmm2",
                                "tilezero tmm3",
                                options(nostack, nomem)
                            );
                        } else {
                            asm!(
                                "tileloadd tmm0, [{c} + {s}*1]",
                                "tileloadd tmm1, [{c} + {s}*1 + 1024]",
                                "tileloadd tmm2, [{c} + {s}*1 + 2048]",
                                "tileloadd tmm3, [{c} + {s}*1 + 3072]",
                                c = in(reg) c, s = in(reg) sb,
                                options(nostack, readonly),
                            );
                        }
                    }
                    for s in 0..steps {
                        let a = a0 + 2 * s * A_TILE;
                        let b = (s * panels + p) * 2 * B_TILE_PAIRS;
                        // SAFETY: the A tiles of row block r, step s0 + s (both halves) and
                        // the B tiles of step s, panel p (both halves) lie in their buffers
                        // (`pack`'s layouts); all 64-byte aligned.
                        unsafe {
                            asm!(
                                // x_hi W_lo
                                "tileloadd tmm4, [{ah} + {s}*1]",
                                "tileloadd tmm5, [{ah} + {s}*1 + 1024]",
                                "tileloadd tmm6, [{bl} + {s}*1]",
                                "tileloadd tmm7, [{bl} + {s}*1 + 1024]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                // x_hi W_hi
                                "tileloadd tmm6, [{bh} + {s}*1]",
                                "tileloadd tmm7, [{bh} + {s}*1 + 1024]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                // x_lo W_hi
                                "tileloadd tmm4, [{al} + {s}*1]",
                                "tileloadd tmm5, [{al} + {s}*1 + 1024]",
                                "tdpbf16ps tmm0, tmm4, tmm6",
                                "tdpbf16ps tmm1, tmm4, tmm7",
                                "tdpbf16ps tmm2, tmm5, tmm6",
                                "tdpbf16ps tmm3, tmm5, tmm7",
                                ah = in(reg) self.ah.as_ptr().add(a),
                                al = in(reg) self.al.as_ptr().add(a),
                                bh = in(reg) bhp.add(b),
                                bl = in(reg) blp.add(b),
                                s = in(reg) sb,
                                options(nostack, readonly),
                            )
                        };
                    }
                    // SAFETY: as the load above.
                    unsafe {
                        asm!(
                            "tilestored [{c} + {s}*1], tmm0",
                            "tilestored [{c} + {s}*1 + 1024], tmm1",
                            "tilestored [{c} + {s}*1 + 2048], tmm2",
                            "tilestored [{c} + {s}*1 + 3072], tmm3",
                            c = in(reg) c, s = in(reg) sb,
                            options(nostack),
                        )
                    };
                }
            }
        }
        // SAFETY: releases the tile state configured above.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
        // the accumulators into y, plus the bias: tile (h, t) of row block r and panel p
        // holds rows 32 r + 16 h .., columns 32 p + 16 t ..
        let n = self.w.rows();
        let acc = acc.as_slice();
        for row in 0..self.m {
            let (r, h, i) = (row / ROW_BLOCK, (row % ROW_BLOCK) / 16, row % 16);
            for p in 0..panels {
                for t in 0..2 {
                    let j = self.j0 + PANEL * p + 16 * t;
                    if j >= n {
                        continue;
                    }
                    let width = 16.min(n - j);
                    let src = &acc[((r * panels + p) * 4 + 2 * h + t) * 256 + 16 * i..][..width];
                    // SAFETY: row < m, columns j .. j + width < n: this task's columns.
                    let dst =
                        unsafe { std::slice::from_raw_parts_mut(out.0.add(row * n + j), width) };
                    match bias {
                        Some(b) => {
                            for ((d, &s), &b) in dst.iter_mut().zip(src).zip(&b[j..j + width]) {
                                *d = s + b;
                            }
                        }
                        None => dst.copy_from_slice(src),
                    }
                }
            }
        }
    }
}
