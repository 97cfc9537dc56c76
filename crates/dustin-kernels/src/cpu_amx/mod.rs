//! Prefill products over block weights with Intel AMX (`AMX-BF16` tile instructions):
//! `y = x . W^T + bias` for `x` `[m, k]` in f32 and `W` `[n, k]` in ggml blocks
//! ([`QuantMatrix`]), at close to f32 accuracy.
//!
//! Why: a prefill chunk multiplies hundreds of rows by every weight, which is bound by
//! arithmetic, not by reading weights. An AMX tile product (`tdpbf16ps`: a 16 x 16 f32 tile
//! plus a 16 x 32 by 32 x 16 bf16 product, 16,384 flops) issues every 16 cycles on a
//! Sapphire or Emerald Rapids core (Intel's optimization manual, "Intel AMX"): 1,024 flops a
//! cycle against 64 for AVX-512 f32 FMAs.
//!
//! Accuracy: bf16 keeps 8 of f32's 24 significant bits. Each operand is split into two bf16
//! parts, `v = hi + lo` with `hi = bf16(v)` and `lo = bf16(v - hi)` (together 16 bits), and
//! the product takes `x_hi W_hi + x_lo W_hi + x_hi W_lo` (the `x_lo W_lo` term is below
//! 2^-16 relative): three tile products where one would do, so a relative error near
//! 2^-16 per term instead of 2^-8 (Henry, McFarlin, Tang, "Leveraging the bfloat16 artificial
//! intelligence datatype for higher-precision computations", ARITH 2019, the `bf16x3`
//! scheme). The tiles accumulate in f32.
//!
//! How:
//! - **Tasks**: panels of [`PANEL`] rows of `W` (output features), up to four panels a
//!   rayon task (fewer where the weight has few: every thread gets two tasks or more).
//! - **Weights**, per task and block of 256 values of `k` (one ggml group): decoded to f32
//!   ([`crate::cpu_quant::dequantize_group`]'s decoders, compiled for AVX-512), split and
//!   laid out as the tiles' `B` operand (per 32 `k`: 16 rows of 16 pairs), `hi` and `lo`:
//!   128 KiB for four panels, which stay in L2 while every row block passes over them. The
//!   model holds no decoded weight.
//! - **Activations** are split once per call into `hi` and `lo` bf16 `A` tiles laid out
//!   whole (1 KiB each; `m` rounded up to 32 with zero rows), so a tile load reads one
//!   kilobyte and not 16 rows a page apart.
//! - **Tiles**: a block of 32 rows by a panel's 32 columns is four f32 `C` tiles, kept in the
//!   task's accumulators between blocks of `k`; per 32 `k`, two `A` tiles and two `B` tiles
//!   at a time feed 12 tile products. The bias is added when the accumulators are copied out.
//! - **Alignment**: every tile buffer starts on 64 bytes; tile rows that crossed cache
//!   lines made the loads 5 times slower.
//!
//! Needs Linux (the tile data must be requested from the kernel, `arch_prctl
//! ARCH_REQ_XCOMP_PERM`) and an x86-64 CPU with `AMX-TILE` and `AMX-BF16` ([`available`]);
//! elsewhere callers take the other paths.

use crate::cpu_quant::QuantMatrix;
use crate::{KernelError, Result};

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod pack;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tiles;

/// Weight rows (output features) per task: two 16-column `C` tiles.
pub const PANEL: usize = 32;

/// `x` rows per block of `C` tiles: two 16-row tiles.
pub const ROW_BLOCK: usize = 32;

/// Elements of `k` per tile product: one `A` tile row of 32 bf16.
pub const K_STEP: usize = 32;

/// Whether this machine and process run AMX tile products: the CPU reports `AMX-TILE` and
/// `AMX-BF16` (CPUID leaf 7) and the kernel grants the tile data state (`arch_prctl`,
/// asked once per process). `false` on other targets.
pub fn available() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(tiles::request)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// `y = x . W^T + bias` with AMX tiles: `x` `[m, cols]` row-major f32, `w` `[rows, cols]` in
/// blocks, `bias` `[rows]`; returns `y` `[m, rows]` row-major. Each output is the f32 sum of
/// the three split products (module docs), within about `2^-15 * sum |x_i w_i|` of the exact
/// product of `x` and the decoded weights.
///
/// # Errors
/// [`KernelError::Unsupported`] where [`available`] is false; [`KernelError::Shape`] naming
/// `x` when its length is not `m * cols`, `bias` when its length is not `rows`;
/// [`KernelError::InvalidInput`] naming `cols` when it is not a multiple of [`K_STEP`] (every
/// ggml block format's width is), `m` when the output does not fit in memory.
pub fn amx_matmul(x: &[f32], m: usize, w: &QuantMatrix, bias: Option<&[f32]>) -> Result<Vec<f32>> {
    if !available() {
        return Err(KernelError::Unsupported(
            "AMX tile products on this machine (CPUID AMX-TILE and AMX-BF16, Linux)".into(),
        ));
    }
    w.check_operands(x, m, bias)?;
    let (rows, cols) = (w.rows(), w.cols());
    if !cols.is_multiple_of(K_STEP) {
        return Err(KernelError::invalid(
            "cols",
            format!("a multiple of {K_STEP}"),
            cols,
        ));
    }
    let m_pad = m.div_ceil(ROW_BLOCK) * ROW_BLOCK;
    if m_pad.checked_mul(rows).is_none() || m_pad.checked_mul(cols).is_none() {
        return Err(KernelError::invalid(
            "m",
            format!("an output [m, {rows}] that fits in memory"),
            m,
        ));
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        tiles::matmul(x, m, w, bias)
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        Err(KernelError::Unsupported(
            "AMX tile products on this target (x86-64 Linux only)".into(),
        ))
    }
}
