//! `dustin kernel-check`: the element-wise ops the model runs per layer (RMSNorm, the SwiGLU
//! product, RoPE, the dequantization of packed substitute weights, the skinny GEMM of
//! decoding; `KernelOps::rms_norm`, `silu_mul`, `rope`, `dequantize_packed`,
//! `skinny_linear`) against float64 loops
//! (`dustin_kernels::check::check_elementwise`), on fresh random inputs with odd sizes and a
//! strided RoPE input. On CUDA the outputs are poisoned with NaN first, so an element a kernel
//! leaves unwritten fails. Bound (normwise relative error): 1e-2 for bf16 on CUDA, 1e-5 for
//! f32 on the CPU. Exit status 1 on any failure.

use clap::Args;

use crate::backend::DeviceKind;
use crate::CliError;

/// Arguments of `dustin kernel-check`.
#[derive(Debug, Args)]
pub struct KernelCheckArgs {
    /// Where to run (`cuda` checks the fused kernels, `cpu` the plain path).
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// Runs the checks and prints one line per (case, op).
///
/// # Errors
/// [`CliError::Usage`] naming how many results failed; a CPU-only build asked for `cuda`.
pub fn run(a: KernelCheckArgs) -> Result<(), CliError> {
    let bound = match a.device {
        DeviceKind::Cpu => 1e-5,
        DeviceKind::Cuda => 1e-2,
    };
    #[cfg(feature = "cuda")]
    dustin_kernels::cuda::set_poison_outputs(a.device == DeviceKind::Cuda);
    let rows = crate::with_backend!(a.device, |B, dev| Ok::<_, CliError>(
        dustin_kernels::check::check_elementwise::<B>(&dev, bound)
    ))?;
    #[cfg(feature = "cuda")]
    dustin_kernels::cuda::set_poison_outputs(false);
    for r in &rows {
        println!("{r}");
    }
    let failed = rows.iter().filter(|r| !r.ok()).count();
    println!("kernel-check: {} results, {failed} failures", rows.len());
    if failed > 0 {
        return Err(CliError::Usage(format!(
            "kernel-check failed: {failed} of {} results over the bound {bound:.0e}",
            rows.len()
        )));
    }
    Ok(())
}
