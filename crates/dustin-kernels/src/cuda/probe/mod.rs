//! The launch-cost probe (`dustin-kernels-gpu launchcost`).

mod kernels;

use super::*;

/// How [`launch_probe`] launches its kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchProbe {
    /// Three tensor arguments (shapes and strides uploaded per launch).
    Tensor,
    /// Three array arguments (no per-launch upload).
    Array,
}

/// Launches `a + b` into `out` `launches` times with the argument kind of `probe`, without
/// waiting for the GPU (`dustin-kernels-gpu launchcost` times it; a measuring tool for the
/// host cost of a launch). `a`, `b`, `out`: any shape, the same number of elements,
/// contiguous, one float dtype.
///
/// # Errors
/// [`KernelError::InvalidInput`] when the element counts or dtypes differ or a tensor is not
/// contiguous.
pub fn launch_probe<F: FloatElement, I: IntElement, BT: BoolElement, const D: usize>(
    a: &Tensor<Cube<F, I, BT>, D>,
    b: &Tensor<Cube<F, I, BT>, D>,
    out: &Tensor<Cube<F, I, BT>, D>,
    probe: LaunchProbe,
    launches: usize,
) -> Result<()> {
    let [a, b, out] = [a, b, out].map(|t| t.clone().into_primitive().tensor());
    let len = a.meta.shape().num_elements();
    for (name, t) in [("b", &b), ("out", &out)] {
        let found = (t.meta.shape().num_elements(), t.dtype);
        if found != (len, a.dtype) {
            return Err(KernelError::invalid(
                name,
                format!("a's element count and dtype {:?}", (len, a.dtype)),
                format!("{found:?}"),
            ));
        }
    }
    for (name, t) in [("a", &a), ("b", &b), ("out", &out)] {
        if !t.is_contiguous() {
            return Err(KernelError::invalid(
                name,
                "a contiguous tensor",
                format!("strides {:?}", t.meta.strides()),
            ));
        }
    }
    let count = elementwise_count(len)?;
    let dim = CubeDim::new_1d(ELEM_THREADS as u32);
    for _ in 0..launches {
        match probe {
            LaunchProbe::Tensor => kernels::probe_tensor_kernel::launch::<CudaRuntime>(
                &a.client,
                count.clone(),
                dim,
                a.clone().into_tensor_arg(),
                b.clone().into_tensor_arg(),
                out.clone().into_tensor_arg(),
                len as u32,
                a.dtype.into(),
            ),
            LaunchProbe::Array => kernels::probe_array_kernel::launch::<CudaRuntime>(
                &a.client,
                count.clone(),
                dim,
                a.clone().into_array_arg(),
                b.clone().into_array_arg(),
                out.clone().into_array_arg(),
                len as u32,
                a.dtype.into(),
            ),
        }
    }
    Ok(())
}
