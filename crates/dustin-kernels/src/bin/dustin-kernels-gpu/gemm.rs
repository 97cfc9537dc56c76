//! `gemm`: the projections' GEMMs and the causal prefill attention after them.

use burn_tensor::{Distribution, Tensor};
use dustin_kernels::cuda::RingConfig;
use dustin_kernels::prelude::*;

use crate::bench::emitter;
use crate::bench::time_us;
use crate::prefill::prefill_attention;
use crate::{config, tweak, B};

/// "Measure first": Burn's autotuned bf16 matmul (this binary is built without
/// fusion) at the projection shapes of Qwen2.5-7B and 72B (and their LM head, decode rows
/// only), prefill rows (4k..32k tokens) and decode / verify rows (1, 8, 16, 40, 80, 128;
/// also our skinny GEMMs, `KernelOps::skinny_linear`: the tensor-core kernel up to 128 rows,
/// op `skinny_mma`, the ring kernel up to 128, `skinny_ring`, and the CUDA-core one up to 16,
/// op `skinny`), 30 untimed calls first
/// (autotuning), then the mean of 10; beside each, `KernelOps::prefill_linear` (cuBLAS, `op`
/// `cublas`: each call waits for cubecl's queue before and for cuBLAS after, as the model
/// runs it); then the causal prefill
/// attention of [`prefill_attention`]. With `no_burn`, neither Burn's matmul nor the attention
/// (the cuBLAS and skinny rows only); with `decode_only`, the decode / verify rows only; with
/// `model` (`7B` or `72B`), that model's shapes only. One JSON line a shape; TFLOP/s count
/// `2 m k n`, TB/s the weight read.
pub(crate) fn gemm(
    json: Option<&str>,
    quick: bool,
    no_burn: bool,
    decode_only: bool,
    model: Option<&str>,
    ring_configs: &[RingConfig],
) {
    let dev = Default::default();
    let mut emit = emitter(json);
    let prefill: &[usize] = if decode_only {
        &[]
    } else if quick {
        &[16384]
    } else {
        &[4096, 16384, 32768]
    };
    // 40 and 80: verification at batch 8 and 16, gamma 4
    let decode: &[usize] = &[1, 8, 16, 40, 80, 128];
    // (model, hidden, intermediate, q/o width, k/v width): the published configs
    for (name, h, inter, qo, kvo) in [
        ("7B", 3584usize, 18944usize, 3584usize, 512usize),
        ("72B", 8192, 29568, 8192, 1024),
    ] {
        if model.is_some_and(|m| m != name) {
            continue;
        }
        for (k, n, what) in [
            (h, qo, "q/o"),
            (h, kvo, "k/v"),
            (h, inter, "gate/up"),
            (inter, h, "down"),
            // the LM head, vocab_size 152,064 in both configs (decode rows only: prefill
            // computes the last position's logits)
            (h, 152_064, "lm_head"),
        ] {
            let prefill: &[usize] = if what == "lm_head" { &[] } else { prefill };
            let w = Tensor::<B, 2>::random([k, n], Distribution::Normal(0.0, 0.02), &dev);
            for &m in prefill.iter().chain(decode) {
                let x = Tensor::<B, 2>::random([m, k], Distribution::Normal(0.0, 1.0), &dev);
                let flops = 2.0 * (m * k * n) as f64;
                let reps = 10;
                let lib = B::prefill_gemm_name(&dev);
                let run = || B::prefill_linear(x.clone(), w.clone(), None);
                match run() {
                    Ok(_) => {
                        let us = time_us(3, reps, || {
                            let _ = run();
                        });
                        emit(format!(
                            "{{\"op\":\"{lib}\",\"model\":\"{name}\",\"proj\":\"{what}\",\"m\":{m},\"k\":{k},\"n\":{n},\"us\":{us:.2},\"tflops\":{:.2},\"weight_tbps\":{:.3}}}",
                            flops / us / 1e6,
                            (2 * k * n) as f64 / us / 1e6
                        ));
                    }
                    Err(e) => emit(
                        serde_json::json!({"op": lib, "m": m, "error": e.to_string()}).to_string(),
                    ),
                }
                if !no_burn {
                    let us = time_us(30, reps, || {
                        let _ = x.clone().matmul(w.clone());
                    });
                    emit(format!(
                        "{{\"op\":\"matmul\",\"model\":\"{name}\",\"proj\":\"{what}\",\"m\":{m},\"k\":{k},\"n\":{n},\"us\":{us:.2},\"tflops\":{:.2},\"weight_tbps\":{:.3}}}",
                        flops / us / 1e6,
                        (2 * k * n) as f64 / us / 1e6
                    ));
                }
                // our split-K skinny GEMMs on the same operands (decode / verify rows): the
                // tensor-core kernel and the ring kernel (up to MMA_MAX_ROWS rows) and the
                // CUDA-core one (up to SKINNY_MAX_ROWS)
                use dustin_kernels::cuda::SkinnyKernel;
                // the ring kernel in its current shape, then each of `ring_configs`
                let ring_default = config().ring;
                let mut runs: Vec<(SkinnyKernel, String, usize, Option<RingConfig>)> = vec![(
                    SkinnyKernel::Mma,
                    "skinny_mma".into(),
                    dustin_kernels::cuda::MMA_MAX_ROWS,
                    None,
                )];
                if ring_configs.is_empty() {
                    runs.push((
                        SkinnyKernel::Ring,
                        "skinny_ring".into(),
                        dustin_kernels::cuda::MMA_MAX_ROWS,
                        None,
                    ));
                }
                for &c in ring_configs {
                    runs.push((
                        SkinnyKernel::Ring,
                        format!("skinny_ring_{c}"),
                        dustin_kernels::cuda::MMA_MAX_ROWS,
                        Some(c),
                    ));
                }
                runs.push((
                    SkinnyKernel::Cores,
                    "skinny".into(),
                    dustin_kernels::SKINNY_MAX_ROWS,
                    None,
                ));
                // the tensor-core kernels again with the split reduction inside the GEMM's
                // launch (`_fused`), where the default runs a reduce kernel after it
                use dustin_kernels::cuda::SplitReduce;
                let split_default = config().split_reduce;
                let mut runs: Vec<_> = runs
                    .into_iter()
                    .map(|(kernel, label, max, ring)| (kernel, label, max, ring, split_default))
                    .collect();
                if split_default == SplitReduce::Kernel {
                    for (kernel, label) in [
                        (SkinnyKernel::Mma, "skinny_mma_fused"),
                        (SkinnyKernel::Ring, "skinny_ring_fused"),
                    ] {
                        let max = dustin_kernels::cuda::MMA_MAX_ROWS;
                        runs.push((kernel, label.into(), max, None, SplitReduce::Fused));
                    }
                }
                for (kernel, label, max, ring, split) in runs {
                    if m > max {
                        continue;
                    }
                    tweak(|c| c.skinny_kernel = kernel);
                    tweak(|c| c.ring = ring.unwrap_or(ring_default));
                    tweak(|c| c.split_reduce = split);
                    let run = || B::skinny_linear(x.clone(), w.clone(), None);
                    match run() {
                        Ok(_) => {
                            let us = time_us(5, reps, || {
                                let _ = run();
                            });
                            emit(format!(
                                "{{\"op\":\"{label}\",\"model\":\"{name}\",\"proj\":\"{what}\",\"m\":{m},\"k\":{k},\"n\":{n},\"us\":{us:.2},\"weight_tbps\":{:.3}}}",
                                (2 * k * n) as f64 / us / 1e6
                            ));
                        }
                        Err(e) => emit(
                            serde_json::json!({"op": label, "m": m, "error": e.to_string()})
                                .to_string(),
                        ),
                    }
                }
                tweak(|c| c.ring = ring_default);
                tweak(|c| c.skinny_kernel = dustin_kernels::cuda::SkinnyKernel::Auto);
                tweak(|c| c.split_reduce = split_default);
            }
        }
        // the products of one input as the model issues them at prefill rows
        // (`prefill_linear_many`: one pair of device waits) against the same products one
        // call each, in the same process: q+k+v (with Qwen2.5's q/k/v biases) and gate+up
        for (what, widths, bias) in [
            ("q+k+v", vec![qo, kvo, kvo], true),
            ("gate+up", vec![inter, inter], false),
        ] {
            let parts: Vec<(Tensor<B, 2>, Option<Tensor<B, 1>>)> = widths
                .iter()
                .map(|&n| {
                    let w = Tensor::<B, 2>::random([h, n], Distribution::Normal(0.0, 0.02), &dev);
                    let b = bias.then(|| {
                        Tensor::<B, 1>::random([n], Distribution::Normal(0.0, 0.02), &dev)
                    });
                    (w, b)
                })
                .collect();
            let n_sum: usize = widths.iter().sum();
            for &m in prefill {
                let x = Tensor::<B, 2>::random([m, h], Distribution::Normal(0.0, 1.0), &dev);
                let flops = 2.0 * (m * h * n_sum) as f64;
                let together = || B::prefill_linear_many(x.clone(), parts.clone());
                let apart = || -> dustin_kernels::Result<()> {
                    for (w, b) in &parts {
                        B::prefill_linear(x.clone(), w.clone(), b.clone())?;
                    }
                    Ok(())
                };
                match together().and_then(|_| apart()) {
                    Ok(()) => {
                        for (label, us) in [
                            ("cublas_many", time_us(3, 10, || {
                                let _ = together();
                            })),
                            ("cublas_each", time_us(3, 10, || {
                                let _ = apart();
                            })),
                        ] {
                            emit(format!(
                                "{{\"op\":\"{label}\",\"model\":\"{name}\",\"proj\":\"{what}\",\"m\":{m},\"k\":{h},\"n\":{n_sum},\"us\":{us:.2},\"tflops\":{:.2}}}",
                                flops / us / 1e6
                            ));
                        }
                    }
                    Err(e) => emit(
                        serde_json::json!({"op": "cublas_many", "model": name, "proj": what, "m": m, "error": e.to_string()})
                            .to_string(),
                    ),
                }
            }
        }
    }
    if !no_burn && !decode_only {
        prefill_attention(&mut emit, quick);
    }
}
