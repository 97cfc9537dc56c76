//! `dustin-bench kernel-check`: the element-wise ops the model runs per layer (RMSNorm, the
//! SwiGLU product, RoPE, the dequantization of packed substitute weights, the skinny GEMM
//! of decoding; `KernelOps::rms_norm`, `silu_mul`, `rope`, `dequantize_packed`,
//! `skinny_linear`) against float64 loops
//! (`dustin_kernels::check::check_elementwise`), on fresh random inputs with odd sizes and a
//! strided RoPE input. On CUDA the outputs are poisoned with NaN first, so an element a kernel
//! leaves unwritten fails. Bound (normwise relative error): 1e-2 for bf16 on CUDA, 1e-5 for
//! f32 on the CPU. Then the whole model (`dustin_qwen::check::check_model`): a 2-layer random
//! Qwen2 at Qwen2.5-0.5B's layer shapes, its logits through the kernels against the model's own
//! Burn ops, prefill, decode and verify ([`MODEL_BOUND_BF16`] on CUDA, 1e-4 on the CPU), and
//! the draft's lookahead of a proposal against that of a forced window of the same tokens
//! (`crate::lookahead_check`, same bounds). Exit status 1 on any failure.

use clap::Args;

use dustin_cli::backend::DeviceKind;
use dustin_cli::CliError;

/// Arguments of `dustin-bench kernel-check`.
#[derive(Debug, Args)]
pub struct KernelCheckArgs {
    /// Where to run (`cuda` checks the fused kernels, `cpu` the plain path).
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// Only the whole-model rows (skip the per-kernel rows, which take most of the time on
    /// CUDA).
    #[arg(long)]
    pub model_only: bool,
}

/// Bound of the whole-model rows in bf16: two layers and the LM head, each op rounded to bf16
/// in a different order on the two paths (each op alone is held to 1e-2).
pub const MODEL_BOUND_BF16: f64 = 3e-2;

/// The whole-model rows; a model error becomes a failed row carrying the error.
fn model_rows<B: dustin_kernels::KernelOps>(
    dev: &B::Device,
    bound: f64,
) -> Vec<dustin_kernels::check::CheckRow> {
    dustin_qwen::check::check_model::<B>(dev, bound).unwrap_or_else(|e| {
        vec![dustin_kernels::check::CheckRow {
            case: "2-layer random Qwen2".into(),
            op: "model",
            err: f64::INFINITY,
            bound,
            error: Some(e.to_string()),
        }]
    })
}

/// Runs the checks and prints one line per (case, op).
///
/// # Errors
/// [`CliError::Usage`] naming how many results failed; a CPU-only build asked for `cuda`.
pub fn run(a: KernelCheckArgs) -> Result<(), CliError> {
    let (bound, model_bound) = match a.device {
        DeviceKind::Cpu => (1e-5, 1e-4),
        DeviceKind::Cuda => (1e-2, MODEL_BOUND_BF16),
    };
    #[cfg(feature = "cuda")]
    dustin_kernels::cuda::set_poison_outputs(a.device == DeviceKind::Cuda);
    // each group is printed as soon as it is done, so a run cut short by a time limit still
    // shows what finished (on CUDA the model rows compile their kernels first: minutes)
    let rows = dustin_cli::with_backend!(a.device, |B, dev| {
        let mut rows = if a.model_only {
            Vec::new()
        } else {
            dustin_kernels::check::check_elementwise::<B>(&dev, bound)
        };
        for r in &rows {
            println!("{r}");
        }
        let mut model = model_rows::<B>(&dev, model_bound);
        model.extend(crate::lookahead_check::lookahead_rows::<B>(
            &dev,
            model_bound,
        ));
        for r in &model {
            println!("{r}");
        }
        rows.extend(model);
        Ok::<_, CliError>(rows)
    })?;
    #[cfg(feature = "cuda")]
    dustin_kernels::cuda::set_poison_outputs(false);
    let failed = rows.iter().filter(|r| !r.ok()).count();
    println!("kernel-check: {} results, {failed} failures", rows.len());
    if failed > 0 {
        return Err(CliError::Usage(format!(
            "kernel-check failed: {failed} of {} results over their bound ({bound:.0e} per \
             kernel, {model_bound:.0e} for the model rows)",
            rows.len()
        )));
    }
    Ok(())
}
