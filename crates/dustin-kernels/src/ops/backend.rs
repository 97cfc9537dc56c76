//! [`KernelBackend`]: the base ops of [`KernelOps`](crate::KernelOps).

use crate::KernelConfig;
#[cfg(doc)]
#[allow(unused_imports)]
use crate::*;
use burn_tensor::backend::Backend;

/// What every kernel trait builds on: whether the backend runs fused device kernels and the
/// kernel choices installed per device ([`KernelConfig`]).
///
/// Part of [`KernelOps`](crate::KernelOps); every method defaults to the plain path.
pub trait KernelBackend: Backend {
    /// Whether this backend runs the ops as fused device kernels. Callers with an equivalent
    /// plain path of their own (the model's attention, the selectors' top-k) use the ops only
    /// when this is true, so CPU numerics stay those of the plain path; `false` for
    /// [`burn_flex::Flex`], `true` for the CUDA backend.
    const FUSED: bool = false;

    /// Installs `config` as the kernel choices of `device`: the launch paths of every op on
    /// that device read them from then on (until the next call). The model installs its
    /// [`KernelConfig`] at the start of each forward pass. Nothing by default (one kernel per
    /// op); on CUDA the config, [`KernelConfig::normalized`], per device.
    fn set_kernel_config(_device: &Self::Device, _config: &KernelConfig) {}

    /// The kernel choices installed for `device` ([`KernelOps::set_kernel_config`](crate::KernelBackend::set_kernel_config);
    /// [`KernelConfig::default`] where none was).
    fn kernel_config(_device: &Self::Device) -> KernelConfig {
        KernelConfig::default()
    }
}
