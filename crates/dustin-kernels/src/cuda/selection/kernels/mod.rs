//! The selection kernels: head-subset score reduction, Quest page bounds and scores, the
//! `dustin` estimator's fold and mix, and top-k. Shapes and formulas are documented on the
//! launchers in [`super`]; these files hold the device code only.

mod estimator;
mod score;
mod topk;

pub use estimator::*;
pub use score::*;
pub use topk::*;
