//! `ktime` and `launchcost`: one op's kernels for a GPU-time trace, and the host's cost per
//! launch.

use burn_tensor::{Distribution, Int, Tensor};
use dustin_kernels::prelude::*;

use crate::bench::{emitter, selection, time_us};
use crate::{dev, B};

/// One op at B=8, 32k context, 5 query tokens, for a GPU-time trace (`gpu_prefill.sh ktime`
/// runs it under Nsight Compute, which times every kernel alone): 2 warm-up calls, then 5
/// calls. `op`: `dense`, `sparse512`, `sparse1024`, `sparse2048` (+4 sinks +64 window, as in
/// `bench`) or `score` (two query heads over one KV head's keys); `model`: `7B` or `72B`
/// (their published attention shapes). Prints the host time per call as well.
pub(crate) fn ktime(op: &str, model: &str) -> Result<(), String> {
    let (hq, kvh) = match model {
        "7B" => (28usize, 4usize),
        "72B" => (64, 8),
        other => return Err(format!("--model: expected 7B or 72B, got {other:?}")),
    };
    let (b, ctx, n, d) = (8usize, 32768usize, 5usize, 128usize);
    let scale = 1.0 / (d as f32).sqrt();
    let q = Tensor::<B, 4>::random([b, hq, n, d], Distribution::Uniform(-1.0, 1.0), &dev());
    let k = Tensor::<B, 4>::random(
        [b, kvh, ctx + n, d],
        Distribution::Uniform(-1.0, 1.0),
        &dev(),
    );
    let v = Tensor::<B, 4>::random(
        [b, kvh, ctx + n, d],
        Distribution::Uniform(-1.0, 1.0),
        &dev(),
    );
    let lens = vec![ctx; b];
    let budget = match op {
        "dense" | "score" => 0,
        "sparse512" => 512,
        "sparse1024" => 1024,
        "sparse2048" => 2048,
        other => {
            return Err(format!(
                "--op: expected dense, sparse512, sparse1024, sparse2048 or score, got {other:?}"
            ))
        }
    };
    // only the sparse ops read a selection
    let (idx, counts) = if budget > 0 {
        selection(b, kvh, ctx, budget, budget as u64)
    } else {
        (Tensor::<B, 3, Int>::zeros([b, kvh, 1], &dev()), vec![0; b])
    };
    let heads = [0usize, 1];
    let call = || match op {
        "dense" => {
            let _ = B::verify_attention(q.clone(), k.clone(), v.clone(), &lens, scale);
        }
        "score" => {
            let _ = B::head_subset_scores(q.clone(), k.clone(), &lens, &heads, scale);
        }
        _ => {
            let _ = B::sparse_verify_attention(
                q.clone(),
                k.clone(),
                v.clone(),
                &lens,
                idx.clone(),
                &counts,
                scale,
            );
        }
    };
    let us = time_us(2, 5, call);
    println!("ktime {model} {op} B={b} ctx={ctx}: {us:.1} us per call from the host (5 calls)");
    Ok(())
}

/// Host time per launch (`launchcost`): streams of launches timed from the first to the
/// GPU's last completion, so a figure is the host's cost per launch unless the GPU is slower.
/// The draft's shapes (Qwen2.5-0.5B: hidden 896, 8 rows): the probe kernel with tensor
/// arguments (shapes and strides uploaded per launch) and with array arguments (none), Burn's
/// own add (an allocation and a tensor-argument kernel), and the q projection through
/// `KernelOps::skinny_linear` (2 launches and 2 allocations a call).
pub(crate) fn launch_cost(json: Option<&str>) {
    use dustin_kernels::cuda::{launch_probe, LaunchProbe};
    let dev = dev();
    let mut emit = emitter(json);
    let (m, h) = (8usize, 896usize);
    // flat: CUDA allocations of 2-d tensors are pitched (896 bf16 rows 1024 apart), and the
    // probe kernels index flat
    let a = Tensor::<B, 1>::random([m * h], Distribution::Normal(0.0, 1.0), &dev);
    let b = Tensor::<B, 1>::random([m * h], Distribution::Normal(0.0, 1.0), &dev);
    let o = Tensor::<B, 1>::zeros([m * h], &dev);
    let x = Tensor::<B, 2>::random([m, h], Distribution::Normal(0.0, 1.0), &dev);
    let w = Tensor::<B, 2>::random([h, h], Distribution::Normal(0.0, 0.02), &dev);
    let bias = Tensor::<B, 1>::random([h], Distribution::Normal(0.0, 0.02), &dev);
    let n = 20_000;
    for round in 0..2 {
        for probe in [LaunchProbe::Tensor, LaunchProbe::Array] {
            let us = time_us(1, 1, || {
                if let Err(e) = launch_probe(&a, &b, &o, probe, n) {
                    eprintln!("launch_probe: {e}");
                }
            });
            emit(format!(
                "{{\"op\":\"launch_probe\",\"args\":\"{probe:?}\",\"round\":{round},\"launches\":{n},\"us_per_launch\":{:.2}}}",
                us / n as f64
            ));
        }
        let us = time_us(200, n, || {
            let _ = a.clone() + b.clone();
        });
        emit(format!(
            "{{\"op\":\"burn_add\",\"round\":{round},\"launches\":{n},\"us_per_launch\":{us:.2}}}"
        ));
        let calls = n / 4;
        let us = time_us(200, calls, || {
            let _ = B::skinny_linear(x.clone(), w.clone(), Some(bias.clone()));
        });
        emit(format!(
            "{{\"op\":\"skinny_linear\",\"m\":{m},\"k\":{h},\"n\":{h},\"round\":{round},\"calls\":{calls},\"us_per_call\":{us:.2}}}"
        ));
    }
}
