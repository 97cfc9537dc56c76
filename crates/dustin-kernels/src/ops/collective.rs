//! [`CollectiveOps`]: the collective ops of [`KernelOps`](crate::KernelOps).

use super::KernelBackend;
use crate::KernelError;
use crate::Result;
#[cfg(doc)]
#[allow(unused_imports)]
use crate::*;
use burn_tensor::Tensor;

/// Collectives over a tensor-parallel device group.
///
/// Part of [`KernelOps`](crate::KernelOps); every method defaults to the plain path.
pub trait CollectiveOps: KernelBackend {
    /// Whether [`KernelOps::all_reduce_sum`](crate::CollectiveOps::all_reduce_sum) runs on the device (NCCL on CUDA); `false`: the
    /// backend has no collective and a tensor-parallel group sums on the host instead
    /// (`dustin_qwen::tp`).
    const COLLECTIVE: bool = false;

    /// All-reduce (sum) of `x` over the devices of a tensor-parallel group: every rank calls
    /// it with a tensor of the same shape and dtype, with the same `group` (the devices in
    /// rank order, each listed once), in the same order of calls; each gets the elementwise
    /// sum over the ranks. `x` `[batch, seq, hidden]` in the compute dtype.
    ///
    /// On CUDA this is NCCL's `ncclAllReduce` through Burn 0.21's `DistributedBackend`
    /// (cubecl-cuda's communicator, one per device group, made at the first call, on a
    /// stream of its own that the compute stream then waits on).
    ///
    /// # Errors
    /// [`KernelError::Unsupported`] on backends without a collective (the default; see
    /// [`KernelOps::COLLECTIVE`](crate::CollectiveOps::COLLECTIVE)); [`KernelError::InvalidInput`] for a group of fewer than two
    /// devices or one that lists a device twice.
    fn all_reduce_sum(x: Tensor<Self, 3>, group: &[Self::Device]) -> Result<Tensor<Self, 3>> {
        let _ = (x, group);
        Err(KernelError::Unsupported(
            "all-reduce on this backend (no device collective; sum on the host)".into(),
        ))
    }
}
