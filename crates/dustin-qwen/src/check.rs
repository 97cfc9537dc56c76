//! A whole-model check of the backend's kernels: the logits of a small random Qwen2 computed
//! through [`KernelOps`] (fused attention, RMSNorm, SwiGLU, RoPE, the skinny GEMM and its
//! grouped q/k/v and gate/up forms on CUDA; `dustin_kernels::plain` on the CPU) against the model's own Burn ops
//! ([`Qwen2::with_kernels`]`(Some(false))`, fused element-wise ops and skinny GEMM off: the path
//! `tests/hf_parity.rs` holds to HF transformers on the CPU).
//!
//! `dustin_kernels::check` holds each kernel to a float64 loop; this one checks that the model
//! wires them right: strided projections into RoPE, the KV cache, a ragged batch, and the
//! decode and verify row counts that take the fused attention and the skinny GEMM.
//! `dustin-bench kernel-check` runs both.

use burn_tensor::Tensor;
use dustin_core::{DenseHook, Phase};
use dustin_kernels::check::CheckRow;
use dustin_kernels::KernelOps;

use crate::generate::prefill;
use crate::{ForwardOpts, LogitsMode, Qwen2, QwenConfig, QwenError, Result};

/// The checked model: Qwen2.5-0.5B-Instruct's layer shapes (hidden 896, 14 query and 2 KV
/// heads of 64, MLP 4864, q/k/v bias, `../shared/data/qwen2.5/Qwen2.5-0.5B-Instruct.config.json`)
/// with 2 layers and a 4096-token vocabulary, so the check takes seconds on the CPU.
pub const CHECK_CONFIG: &str = r#"{
  "model_type": "qwen2", "vocab_size": 4096, "hidden_size": 896, "intermediate_size": 4864,
  "num_hidden_layers": 2, "num_attention_heads": 14, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
  "tie_word_embeddings": true, "hidden_act": "silu"
}"#;

/// Two prompts (300 and 20 tokens, each prefilled on its own: more than 16 rows, so the
/// fused element-wise ops and [`KernelOps::prefill_attention`](dustin_kernels::AttentionOps::prefill_attention), and the skinny GEMM only for
/// the 20 rows when [`KernelOps::skinny_max_rows`](dustin_kernels::LinearOps::skinny_max_rows) allows them (the opt-in tensor-core kernel
/// on CUDA); the 300 rows also take [`KernelOps::prefill_linear`](dustin_kernels::LinearOps::prefill_linear), cuBLAS on CUDA), then
/// one decode step of the ragged batch (2 rows through each linear layer) and one 5-token
/// verification pass (10 rows): logits of the kernel path against the model path, normwise
/// relative error
/// ([`dustin_kernels::reference::rel_err`], infinite for a non-finite value on either side)
/// against `bound`. Three rows (op `model`): the prefill's last-token logits `[2, vocab]`, the
/// decode step's `[2, 1, vocab]`, the verification's `[2, 5, vocab]`; a row whose logits do not
/// have that length on either side fails with the lengths as its error. Three more (op
/// `model+grp`) with the grouped q/k/v and gate/up GEMMs on ([`Qwen2::with_grouped_gemm`]),
/// so a failure says which path it is in. RoPE and the cache write run as one op
/// ([`Qwen2::with_rope_kv_write`]) on the `model` path and as three on `model+grp`.
///
/// # Errors
/// A model error of either path (building the model, the forward passes, reading logits back).
pub fn check_model<B: KernelOps>(device: &B::Device, bound: f64) -> Result<Vec<CheckRow>> {
    let cfg = QwenConfig::from_json(CHECK_CONFIG, "dustin_qwen::check::CHECK_CONFIG")?;
    let base = Qwen2::<B>::random(&cfg, 384, device)?;
    let model_path = base
        .clone()
        .with_kernels(Some(false))
        .with_fused_elementwise(false)
        .with_skinny_gemm(false)
        .with_prefill_gemm(false)
        .with_fused_residual(false)
        .with_kv_write_kernel(false);
    let kernel_path = base
        .with_kernels(Some(true))
        .with_fused_elementwise(true)
        .with_skinny_gemm(true)
        .with_grouped_gemm(false)
        .with_fused_residual(true)
        .with_kv_write_kernel(true)
        .with_rope_kv_write(true)
        .with_prefill_gemm(true);
    let grouped_path = kernel_path
        .clone()
        .with_grouped_gemm(true)
        .with_rope_kv_write(false);
    let mut rows = compare(&model_path, &kernel_path, bound, "model")?;
    rows.extend(compare(&model_path, &grouped_path, bound, "model+grp")?);
    Ok(rows)
}

/// The rows of [`check_model`] for `got` against `reference`.
fn compare<B: KernelOps>(
    reference: &Qwen2<B>,
    got: &Qwen2<B>,
    bound: f64,
    op: &'static str,
) -> Result<Vec<CheckRow>> {
    let vocab = reference.config.vocab_size;
    let want = run(reference)?;
    let got = run(got)?;
    let cases = [
        ("prefill 300 + 20 tokens, last logits", 2 * vocab),
        ("decode B=2 x 1 token", 2 * vocab),
        ("verify B=2 x 5 tokens", 10 * vocab),
    ];
    Ok(cases
        .iter()
        .zip(want.iter().zip(&got))
        .map(|(&(case, len), (r, g))| {
            let r64: Vec<f64> = r.iter().map(|&x| f64::from(x)).collect();
            let (err, error) = if r.len() != len || g.len() != len {
                (
                    f64::INFINITY,
                    Some(format!(
                        "logits of {} (model path) and {} (kernel path) values, expected {len}",
                        r.len(),
                        g.len()
                    )),
                )
            } else {
                (dustin_kernels::reference::rel_err(g, &r64), None)
            };
            CheckRow {
                case: case.to_string(),
                op,
                err,
                bound,
                error,
            }
        })
        .collect())
}

/// The three logits vectors of [`check_model`] for one path.
fn run<B: KernelOps>(m: &Qwen2<B>) -> Result<[Vec<f32>; 3]> {
    let vocab = m.config.vocab_size as u32;
    let prompt = |len: usize, seed: u32| -> Vec<u32> {
        (0..len as u32)
            .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed) % vocab)
            .collect()
    };
    let prompts = vec![prompt(300, 11), prompt(20, 29)];
    let (mut cache, last, _) = prefill(m, &prompts, 320, None, &mut DenseHook, 512, false)?;
    let step = |cache: &mut _, tokens: &[Vec<u32>]| -> Result<Vec<f32>> {
        let out = m.forward(
            tokens,
            cache,
            &mut DenseHook,
            ForwardOpts {
                phase: Phase::Decode,
                logits: LogitsMode::All,
                layers: None,
            },
        )?;
        let logits = out.logits.ok_or_else(|| {
            QwenError::Core(dustin_core::CoreError::invalid(
                "logits",
                "the logits of every position (LogitsMode::All)",
                "none",
            ))
        })?;
        host(logits)
    };
    let decode = step(&mut cache, &[vec![7], vec![4001]])?;
    let verify = step(&mut cache, &[vec![1, 2, 3, 4, 5], vec![90, 91, 92, 93, 94]])?;
    Ok([host(last)?, decode, verify])
}

fn host<B: KernelOps, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| QwenError::Core(dustin_core::CoreError::Other(Box::new(e))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::{Flex, FlexDevice};

    /// On the CPU the kernel path is `dustin_kernels::plain`, the same Burn ops in the same
    /// order (bit-identical today, as in `tests/sparse_attention.rs`), so this run checks that
    /// both paths take these shapes (two prompts, ragged decode and verify) end to end. The check
    /// that can catch a kernel is the CUDA run, `dustin-bench kernel-check --device cuda`.
    #[test]
    fn kernel_path_matches_the_model_path_on_the_cpu() {
        let rows = check_model::<Flex>(&FlexDevice, 1e-4).unwrap();
        assert_eq!(rows.len(), 6);
        for r in &rows {
            println!("{r}");
            assert!(r.ok(), "{r}");
        }
    }

    /// The check can fail: the same comparison with another random model standing in for
    /// the kernel path (other weights) is far over the bound on every row.
    #[test]
    fn a_different_model_fails_every_row() {
        use burn_tensor::backend::Backend;
        let cfg = QwenConfig::from_json(CHECK_CONFIG, "test").unwrap();
        Flex::seed(&FlexDevice, 1);
        let a = Qwen2::<Flex>::random(&cfg, 384, &FlexDevice).unwrap();
        Flex::seed(&FlexDevice, 2);
        let b = Qwen2::<Flex>::random(&cfg, 384, &FlexDevice).unwrap();
        let rows = compare(&a, &b, 1e-2, "model").unwrap();
        assert_eq!(rows.len(), 3);
        for r in &rows {
            println!("{r}");
            assert!(
                !r.ok() && r.err > 0.1,
                "two random models gave close logits: {r}"
            );
        }
        // and the same model against itself passes exactly
        for r in compare(&a, &a, 1e-6, "model").unwrap() {
            assert_eq!(r.err, 0.0, "{r}");
        }
    }
}
