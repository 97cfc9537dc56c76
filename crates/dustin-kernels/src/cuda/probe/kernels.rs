//! The launch-cost probe kernels.

// Device code: nested `if`s and explicit casts keep the generated C++ predictable.
#![allow(
    clippy::collapsible_if,
    clippy::unnecessary_cast,
    clippy::manual_div_ceil,
    clippy::manual_is_multiple_of
)]

use cubecl::prelude::*;

/// Launch-cost probe, tensor arguments: `out[i] = a[i] + b[i]` for `i < len`. Each tensor
/// argument's shape and strides are dynamic metadata, which cubecl-cuda 0.10 uploads to the
/// device before every launch (`launch_checked`: `create_with_data`); for
/// [`crate::cuda::launch_probe`].
#[cube(launch)]
pub fn probe_tensor_kernel<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    out: &mut Tensor<F>,
    len: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < len as usize {
        out[i] = a[i] + b[i];
    }
}

/// Launch-cost probe, array arguments: the same sum as [`probe_tensor_kernel`], with only
/// static metadata (buffer lengths, passed as kernel parameters: no upload).
#[cube(launch)]
pub fn probe_array_kernel<F: Float>(
    a: &Array<F>,
    b: &Array<F>,
    out: &mut Array<F>,
    len: u32,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS as usize;
    if i < len as usize {
        out[i] = a[i] + b[i];
    }
}
