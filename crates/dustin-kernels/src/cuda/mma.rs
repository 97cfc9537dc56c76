//! Device code shared by the attention and linear kernels: one tensor-core MMA on register
//! fragments.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::cmma;
use cubecl::prelude::*;

/// One `mma.sync.m16n8k16` (bf16/f16 in, f32 accumulate) on register fragments: the A
/// fragment is `a[a0 .. a0 + 4]`, the B fragment `b0`, `b1`, the accumulator
/// `c[c0 .. c0 + 2]` (PTX ISA, "Matrix Fragments for mma.m16n8k16"; the register layouts
/// are those of cubecl's `MmaDefinition` on CUDA).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn mma_16816<F: Float>(
    def: cmma::MmaDefinition<F, F, f32>,
    a: &Array<Vector<F, Const<2>>>,
    #[comptime] a0: usize,
    b0: Vector<F, Const<2>>,
    b1: Vector<F, Const<2>>,
    c: &mut Array<Vector<f32, Const<2>>>,
    #[comptime] c0: usize,
) {
    let mut fa = Array::<Vector<F, Const<2>>>::new(4usize);
    #[unroll]
    for i in 0..4usize {
        fa[i] = a[a0 + i];
    }
    let mut fb = Array::<Vector<F, Const<2>>>::new(2usize);
    fb[0] = b0;
    fb[1] = b1;
    let mut fc = Array::<Vector<f32, Const<2>>>::new(2usize);
    fc[0] = c[c0];
    fc[1] = c[c0 + 1];
    def.execute_inplace(&fa, &fb, &mut fc);
    c[c0] = fc[0];
    c[c0 + 1] = fc[1];
}
