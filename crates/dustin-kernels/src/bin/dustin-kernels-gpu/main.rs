//! GPU check and benchmark of the dustin-kernels CUDA ops (built with `--features cuda`,
//! staged by `cargo run -p xtask -- gpu-kernels`).
//!
//! - `check`: every op against the float64 references of `dustin_kernels::reference` on fresh
//!   random bf16 inputs, outputs poisoned with NaN first, stale cache slots NaN, odd sizes.
//!   Bound: normwise relative error `max|out - ref| / max|ref| < 1e-2`; top-k must match
//!   exactly. Exit code 1 on any failure.
//! - `bench`: Qwen2.5-7B / 72B attention shapes with 5 query tokens, and the 0.5B draft's
//!   (14 query / 2 KV heads, head_dim 64) with 1, batch 1 / 8 / 16, context 8k / 16k / 32k:
//!   dense, sparse at budgets 512 / 1024 / 2048 (+4 sinks +64 window), head-subset scoring
//!   of two query heads over one KV head's keys, top-k; microseconds per layer and TB/s of
//!   KV read. JSON lines go to `--json PATH` as well. `--verify-kernel auto|flash|split` and
//!   `--flash-buffers 1|2|3` pick the attention kernel and the flash kernel's tile buffers.
//! - `topk`: GPU time of both top-k kernels (`cuda::TopkKernel`) side by side at the
//!   selectors' shapes, each run checked against the float64-ordered reference; `check --op
//!   topk` checks both kernels too.
//! - `ktime --op OP [--model 7B|72B]`: one op of `bench` at B=8, 32k alone (2 warm-up calls,
//!   then 5), for a trace of its kernels' GPU time (`scripts/gpu_prefill.sh ktime`).
//! - `--score-buffers 1|2|3`, `--sparse-waves 1..8` and `--dense-waves 1..16` (any
//!   command): the flash kernel's K tile buffers in score mode, and the waves of blocks
//!   sparse and dense verification's splits aim for.
//! - `check --op skinny`: the skinny GEMMs alone (decode and verify rows, three weights of one
//!   `x`, SwiGLU), with the default kernel choice and with the ring kernel forced, each with
//!   the split reduction in its own reduce kernel and inside the GEMM's launch.
//! - `--split-reduce fused|kernel` (any command): where the skinny GEMMs sum their splits
//!   (`cuda::SplitReduce`; `kernel`, a reduce kernel after the GEMM, by default).
//! - `gemm [--decode-only] [--no-burn] [--ring-configs 64x32x4,128x64x3]`: the projections'
//!   GEMMs (see [`gemm()`]), the ring kernel once per listed block shape.
//! - `--ring-config COLSxKCxBUFS` (any command): the ring kernel's block shape
//!   (`cuda::RingConfig`).

use burn_tensor::{Tensor, TensorData};
use dustin_kernels::cuda::{self, AttentionKernel, RingConfig};
use dustin_kernels::KernelConfig;

mod bench;
mod check;
mod gemm;
mod op_checks;
mod prefill;
mod probes;

use bench::{bench, emitter, topk_bench};
use check::check;
use gemm::gemm;
use prefill::prefill_attention;
use probes::{ktime, launch_cost};

type B = burn_cuda::Cuda<half::bf16, i32>;

const BOUND: f64 = 1e-2;

fn dev() -> burn_cuda::CudaDevice {
    dustin_kernels::cuda::compile_cache::init_runtime_config();
    burn_cuda::CudaDevice::default()
}

/// The kernel choices installed for the device the checks run on.
fn config() -> KernelConfig {
    cuda::config(&dev())
}

/// Changes the kernel choices of the device the checks run on ([`cuda::update_config`]).
fn tweak(change: impl FnOnce(&mut KernelConfig)) {
    cuda::update_config(&dev(), change)
}

fn to_f32<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .unwrap_or_default()
}

fn upload<const D: usize>(v: Vec<f32>, shape: [usize; D]) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v, shape), &dev())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    let quick = args.iter().any(|a| a == "--quick");
    let verify_kernel = match args
        .iter()
        .position(|a| a == "--verify-kernel")
        .map(|i| args.get(i + 1).map(String::as_str))
    {
        None | Some(Some("auto")) => AttentionKernel::Auto,
        Some(Some("flash")) => AttentionKernel::Flash,
        Some(Some("split")) => AttentionKernel::Split,
        Some(other) => {
            eprintln!("--verify-kernel: expected auto, flash or split, got {other:?}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match args
        .iter()
        .position(|a| a == "--flash-buffers")
        .map(|i| args.get(i + 1).and_then(|s| s.parse::<usize>().ok()))
    {
        None => {}
        Some(Some(n)) if (1..=3).contains(&n) => tweak(|c| c.flash_buffers = n),
        Some(other) => {
            eprintln!("--flash-buffers: expected 1, 2 or 3, got {other:?}");
            return std::process::ExitCode::FAILURE;
        }
    }
    for (flag, most, set) in [
        (
            "--score-buffers",
            3,
            (|c, n| c.score_buffers = n) as fn(&mut KernelConfig, usize),
        ),
        ("--sparse-waves", 8, |c, n| c.sparse_waves = n),
        ("--dense-waves", 16, |c, n| c.dense_waves = n),
    ] {
        match args
            .iter()
            .position(|a| a == flag)
            .map(|i| args.get(i + 1).and_then(|s| s.parse::<usize>().ok()))
        {
            None => {}
            Some(Some(n)) if (1..=most).contains(&n) => tweak(|c| set(c, n)),
            Some(other) => {
                eprintln!("{flag}: expected a number from 1 to {most}, got {other:?}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    // the ring kernel's block shape for every command; `gemm --ring-configs` times a list
    let ring_list = |flag: &str| -> Result<Vec<RingConfig>, String> {
        match args.iter().position(|a| a == flag) {
            None => Ok(Vec::new()),
            Some(i) => {
                let v = args
                    .get(i + 1)
                    .ok_or_else(|| format!("{flag}: expected COLSxKCxBUFS[,..], got nothing"))?;
                v.split(',')
                    .map(|c| RingConfig::parse(c).map_err(|e| format!("{flag}: {e}")))
                    .collect()
            }
        }
    };
    let (ring_one, ring_configs) = match (ring_list("--ring-config"), ring_list("--ring-configs")) {
        (Ok(one), Ok(many)) if one.len() <= 1 => (one, many),
        (Ok(_), Ok(_)) => {
            eprintln!("--ring-config: expected one COLSxKCxBUFS (--ring-configs takes a list)");
            return std::process::ExitCode::FAILURE;
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("{e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if let Some(&c) = ring_one.first() {
        tweak(|k| k.ring = c);
    }
    // where the skinny GEMMs sum their splits, for every command
    if let Some(i) = args.iter().position(|a| a == "--split-reduce") {
        use dustin_kernels::cuda::SplitReduce;
        match args.get(i + 1).map(String::as_str) {
            Some("fused") => tweak(|c| c.split_reduce = SplitReduce::Fused),
            Some("kernel") => tweak(|c| c.split_reduce = SplitReduce::Kernel),
            other => {
                eprintln!("--split-reduce: expected fused or kernel, got {other:?}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    let op = args
        .iter()
        .position(|a| a == "--op")
        .and_then(|i| args.get(i + 1))
        .map_or("all", String::as_str);
    let mut failures = 0;
    match args.get(1).map(String::as_str) {
        Some("check") => failures = check(op),
        Some("bench") => bench(json, quick, verify_kernel),
        Some("gemm") => gemm(
            json,
            quick,
            args.iter().any(|a| a == "--no-burn"),
            args.iter().any(|a| a == "--decode-only"),
            args.iter()
                .position(|a| a == "--model")
                .and_then(|i| args.get(i + 1))
                .map(String::as_str),
            &ring_configs,
        ),
        Some("prefill") => {
            let mut emit = emitter(json);
            prefill_attention(&mut emit, quick);
        }
        Some("launchcost") => launch_cost(json),
        Some("topk") => failures = topk_bench(json),
        Some("ktime") => {
            let model = args
                .iter()
                .position(|a| a == "--model")
                .and_then(|i| args.get(i + 1))
                .map_or("7B", String::as_str);
            if let Err(e) = ktime(op, model) {
                eprintln!("{e}");
                return std::process::ExitCode::from(2);
            }
        }
        Some("all") => {
            failures = check(op);
            bench(json, quick, verify_kernel);
        }
        _ => {
            eprintln!("usage: dustin-kernels-gpu check [--op dense|prefill|sparse|scores|quest|topk|elementwise|skinny|dustin] | bench [--quick] [--verify-kernel auto|flash|split] [--flash-buffers 1|2|3] [--json PATH] | gemm [--quick] [--no-burn] [--decode-only] [--model 7B|72B] [--ring-configs COLSxKCxBUFS,..] [--json PATH] | prefill [--quick] [--json PATH] | ktime --op dense|sparse512|sparse1024|sparse2048|score [--model 7B|72B] | launchcost [--json PATH] | topk [--json PATH] | all; any of them [--score-buffers 1|2|3] [--sparse-waves 1..8] [--dense-waves 1..16] [--ring-config COLSxKCxBUFS] [--split-reduce fused|kernel]");
            return std::process::ExitCode::from(2);
        }
    }
    if failures == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
