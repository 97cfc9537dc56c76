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

    /// What `device` is, for the rows a benchmark or an evaluation stores beside its timings:
    /// on the CPU backend the processor's model name and the threads of the compute pool
    /// (`cpu: Intel(R) Xeon(R) ..., 2 threads`), on CUDA the card's name and ordinal
    /// (`cuda:0 NVIDIA H100 80GB HBM3`). Default: Burn's [`Backend::name`].
    fn device_description(device: &Self::Device) -> String {
        Self::name(device)
    }
}

/// The processor's model name (the first `model name` of `/proc/cpuinfo` on Linux; `None`
/// where that file is missing or has none), for [`KernelBackend::device_description`].
pub(crate) fn cpu_model_name() -> Option<String> {
    model_name_of(&std::fs::read_to_string("/proc/cpuinfo").ok()?)
}

/// The first `model name` value of a `/proc/cpuinfo` text, its runs of spaces made one.
fn model_name_of(cpuinfo: &str) -> Option<String> {
    cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|rest| rest.split_once(':'))
        .map(|(_, name)| name.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::model_name_of;

    #[test]
    fn model_name_is_the_first_entry_with_its_spaces_collapsed() {
        // the layout of a Linux /proc/cpuinfo (x86): `key<TAB>: value`, one block a thread
        let info = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel\t\t: 143\n\
                    model name\t: Intel(R) Xeon(R)  Platinum 8480+\nstepping\t: 8\n\n\
                    processor\t: 1\nmodel name\t: Other\n";
        assert_eq!(
            model_name_of(info).as_deref(),
            Some("Intel(R) Xeon(R) Platinum 8480+")
        );
        // `model` alone is not `model name`; no entry and an empty value give none
        assert_eq!(model_name_of("model\t\t: 143\n"), None);
        assert_eq!(model_name_of("model name\t: \n"), None);
    }
}
