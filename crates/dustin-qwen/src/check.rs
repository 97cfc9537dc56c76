//! A whole-model check of the backend's kernels: the logits of a small random Qwen2 computed
//! through [`KernelOps`] (fused attention, RMSNorm, SwiGLU, RoPE and the skinny GEMM on
//! CUDA; `dustin_kernels::plain` on the CPU) against the model's own Burn ops
//! ([`Qwen2::with_kernels`]`(Some(false))`, fused element-wise ops and skinny GEMM off: the path
//! `tests/hf_parity.rs` holds to HF transformers on the CPU).
//!
//! `dustin_kernels::check` holds each kernel to a float64 loop; this one checks that the model
//! wires them right (strided projections, ragged batches, the KV cache, the decode and verify
//! row counts that take the skinny GEMM). `dustin kernel-check` runs both.

use burn_tensor::Tensor;
use dustin_core::{DenseHook, Phase};
use dustin_kernels::check::CheckRow;
use dustin_kernels::KernelOps;

use crate::generate::prefill;
use crate::{ForwardOpts, LogitsMode, Qwen2, QwenConfig, Result};

/// The checked model: Qwen2.5-0.5B-Instruct's layer shapes (hidden 896, 14 query and 2 KV
/// heads of 64, MLP 4864, q/k/v bias, `../shared/data/qwen2.5/Qwen2.5-0.5B-Instruct.config.json`)
/// with 2 layers and a 4096-token vocabulary, so the check takes seconds on the CPU.
pub const CHECK_CONFIG: &str = r#"{
  "model_type": "qwen2", "vocab_size": 4096, "hidden_size": 896, "intermediate_size": 4864,
  "num_hidden_layers": 2, "num_attention_heads": 14, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
  "tie_word_embeddings": true, "hidden_act": "silu"
}"#;

/// Two ragged prompts (37 and 20 tokens), then one decode step (2 rows through each linear
/// layer) and one 5-token verification pass (10 rows): logits of the kernel path against the
/// model path, normwise relative error ([`dustin_kernels::reference::rel_err`]) against `bound`.
/// Three rows: the prefill's last-token logits `[2, vocab]`, the decode step's `[2, 1,
/// vocab]`, the verification's `[2, 5, vocab]`.
///
/// # Errors
/// A model error of either path (building the model, the forward passes).
pub fn check_model<B: KernelOps>(device: &B::Device, bound: f64) -> Result<Vec<CheckRow>> {
    let cfg = QwenConfig::from_json(CHECK_CONFIG, "dustin_qwen::check::CHECK_CONFIG")?;
    let base = Qwen2::<B>::random(&cfg, 128, device)?;
    let model_path = base
        .clone()
        .with_kernels(Some(false))
        .with_fused_elementwise(false)
        .with_skinny_gemm(false);
    let kernel_path = base
        .with_kernels(Some(true))
        .with_fused_elementwise(true)
        .with_skinny_gemm(true);
    let reference = run(&model_path)?;
    let got = run(&kernel_path)?;
    let cases = [
        "prefill 37 + 20 tokens, last logits",
        "decode B=2 x 1 token",
        "verify B=2 x 5 tokens",
    ];
    Ok(cases
        .iter()
        .zip(reference.iter().zip(&got))
        .map(|(case, (r, g))| {
            let r64: Vec<f64> = r.iter().map(|&x| f64::from(x)).collect();
            CheckRow {
                case: (*case).to_string(),
                op: "model",
                err: dustin_kernels::reference::rel_err(g, &r64),
                bound,
                error: None,
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
    let prompts = vec![prompt(37, 11), prompt(20, 29)];
    let (mut cache, last, _) = prefill(m, &prompts, 64, None, &mut DenseHook, 512, false)?;
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
        Ok(host(out.logits))
    };
    let decode = step(&mut cache, &[vec![7], vec![4001]])?;
    let verify = step(&mut cache, &[vec![1, 2, 3, 4, 5], vec![90, 91, 92, 93, 94]])?;
    Ok([host(Some(last)), decode, verify])
}

fn host<B: KernelOps, const D: usize>(t: Option<Tensor<B, D>>) -> Vec<f32> {
    t.map(|t| {
        t.into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap_or_default()
    })
    .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::{Flex, FlexDevice};

    /// On the CPU the kernel path is `dustin_kernels::plain`, the same Burn ops in the same
    /// order (bit-identical today, as in `tests/sparse_attention.rs`), so this run checks that
    /// both paths take these shapes (ragged prefill, decode, verify) end to end. The check
    /// that can catch a kernel is the CUDA run, `dustin kernel-check --device cuda`.
    #[test]
    fn kernel_path_matches_the_model_path_on_the_cpu() {
        let rows = check_model::<Flex>(&FlexDevice, 1e-4).unwrap();
        assert_eq!(rows.len(), 3);
        for r in &rows {
            println!("{r}");
            assert!(r.ok(), "{r}");
        }
    }

    /// The check can fail: a model whose kernel path differs (another random model, so other
    /// weights) is far over the bound.
    #[test]
    fn different_logits_fail_the_bound() {
        use burn_tensor::backend::Backend;
        let cfg = QwenConfig::from_json(CHECK_CONFIG, "test").unwrap();
        Flex::seed(&FlexDevice, 1);
        let a = Qwen2::<Flex>::random(&cfg, 128, &FlexDevice).unwrap();
        Flex::seed(&FlexDevice, 2);
        let b = Qwen2::<Flex>::random(&cfg, 128, &FlexDevice).unwrap();
        let (ra, rb) = (run(&a).unwrap(), run(&b).unwrap());
        let r64: Vec<f64> = ra[1].iter().map(|&x| f64::from(x)).collect();
        let err = dustin_kernels::reference::rel_err(&rb[1], &r64);
        assert!(err > 1e-2, "two random models gave close logits: {err}");
    }
}
