//! The attention kernels. Shapes and formulas are documented on the launchers in
//! [`super`]; these files hold the device code only.
//!
//! Block layout of the split kernel (flash-decoding, one block per (split, row block, slot,
//! sequence), 128 threads = 4 warps): a tile of 64 keys (and values) is staged in shared
//! memory; warp `w` computes the scores of keys `16w .. 16w + 16` for all the block's rows on
//! tensor cores; then four threads per row run its online softmax over the tile (16 keys
//! each, two quad shuffles per reduction, 32 rows per pass); `P V` accumulates in WMMA
//! fragments, warp `w` owning output columns `d/4 * w ..`. A block stops at the last key
//! any of its rows can see (causal among the new tokens), which is what makes the kernel
//! serve prefill chunks too.
//! The running maximum of a row is only moved when a tile's maximum exceeds it by more than
//! [`RESCALE_SLACK`] (so the accumulators are rescaled rarely; `exp(s - m)` stays below
//! `e^8` and the final normalisation is exact). Masked logits and empty maxima are `f32::MIN`
//! (CubeCL's C++ output has no spelling for an infinite constant).
//!
//! Every kernel and constant is re-exported here.

mod flash;
mod prefill;
mod split;

pub use flash::*;
pub use prefill::*;
pub use split::*;
