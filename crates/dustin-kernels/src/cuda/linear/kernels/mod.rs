//! The skinny GEMM kernels (CUDA cores, tensor cores, the `cp.async` ring) and their split
//! reductions. Shapes and formulas are documented on the launchers in [`super`]; these files
//! hold the device code only.

mod reduce;
mod ring;
mod skinny;

pub use reduce::*;
pub use ring::*;
pub use skinny::*;
