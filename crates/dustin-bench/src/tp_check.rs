//! `dustin-bench tp-check`: the tensor-parallel model against the whole model with the same
//! random weights. The whole model (the target's config with its first `--target-layers`
//! layers) is drawn on device 0, split into `--tp` shards ([`Qwen2::shard`]), and both run the
//! same batch: a prefill of `--ctx` tokens, then `--steps` greedy decode steps whose tokens
//! are the whole model's (teacher forcing, so every step's logits compare). Printed: the
//! largest logit difference relative to the largest logit, whether every rank got the same
//! logits, and how often the shards' greedy token equals the whole model's.

use std::path::PathBuf;

use burn_tensor::Tensor;
use clap::{Args, ValueEnum};
use dustin_core::{DenseHook, Phase};
use dustin_kernels::KernelOps;
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2, QwenConfig, TpGroup, TpRank};

use dustin_cli::backend::DeviceKind;
use dustin_cli::CliError;

/// Compute dtype of `tp-check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckDtype {
    /// float32 (the CPU's; bound 1e-4 on the CPU, 1.3e-2 on CUDA, whose matmuls run in TF32).
    F32,
    /// bfloat16 (CUDA only; bound 5e-2).
    Bf16,
}

impl CheckDtype {
    /// Largest difference allowed between the sharded and the whole model's logits, relative
    /// to the largest whole-model logit, on `device`. Each rank rounds its partial sums before
    /// they are added, once per attention and MLP block, so the bound is our choice of about
    /// 13 epsilons of the arithmetic the matmuls use, for a few layers:
    /// - f32 on the CPU: 1e-4 (true f32, a changed summation order; about 100 x f32's
    ///   epsilon, and still far above what the CPU gives, 1.8e-6);
    /// - f32 on CUDA: 1.3e-2 = 13 x 2^-10, since cubek-matmul 0.2 stages f32 operands as TF32
    ///   on tensor cores (`definition/blueprint.rs`: f32 lhs/rhs become `tf32` in shared
    ///   memory and registers when the device supports it), whose epsilon is 2^-10;
    /// - bf16: 5e-2 = 13 x 2^-8.
    pub fn bound(self, device: DeviceKind) -> f32 {
        match (self, device) {
            (CheckDtype::F32, DeviceKind::Cpu) => 1e-4,
            (CheckDtype::F32, DeviceKind::Cuda) => 1.3e-2,
            (CheckDtype::Bf16, _) => 5e-2,
        }
    }
}

/// Arguments of `dustin-bench tp-check`.
#[derive(Debug, Args)]
pub struct TpCheckArgs {
    /// HF `config.json` of the target (for example Qwen2.5-72B-Instruct's).
    #[arg(long)]
    pub target: PathBuf,
    /// Keep only the first N layers (the whole model must fit device 0). Default: 4, or all
    /// of a smaller model's.
    #[arg(long)]
    pub target_layers: Option<usize>,
    /// Ranks (devices `0 .. tp` on CUDA; one shared device on the CPU).
    #[arg(long, default_value_t = 2)]
    pub tp: usize,
    /// Sequences.
    #[arg(long, default_value_t = 2)]
    pub batch: usize,
    /// Prompt tokens per sequence (the random model's RoPE table is extended past the
    /// config's `max_position_embeddings` when needed). `--batch x (--ctx + --steps)` is at
    /// most 2^24.
    #[arg(long, default_value_t = 64)]
    pub ctx: usize,
    /// Decode steps after the prefill (at most 10000).
    #[arg(long, default_value_t = 8)]
    pub steps: usize,
    /// Compute dtype (bf16 needs `--device cuda`).
    #[arg(long, value_enum, default_value_t = CheckDtype::F32)]
    pub dtype: CheckDtype,
    /// Sum the ranks' partial results on the host even on CUDA (checks NCCL's all-reduce
    /// against the host path).
    #[arg(long)]
    pub host_sum: bool,
    /// Copy the shards from the whole model through host memory instead of device to device
    /// (checks the device copy against the plain upload path).
    #[arg(long)]
    pub host_copy: bool,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// What `tp-check` found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TpCheckReport {
    /// Ranks.
    pub tp: usize,
    /// Layers of the model.
    pub layers: usize,
    /// Largest |sharded - whole| logit over every sequence, step and vocabulary entry.
    pub max_abs_diff: f32,
    /// Largest |whole| logit.
    pub max_abs_logit: f32,
    /// `max_abs_diff / max_abs_logit`.
    pub rel_diff: f32,
    /// Whether every rank's logits were bit-identical to rank 0's.
    pub ranks_identical: bool,
    /// Greedy tokens of the shards equal to the whole model's, and of how many.
    pub top1_agree: (usize, usize),
    /// The bound `rel_diff` was held to.
    pub bound: f32,
}

/// Most tokens (`batch x (ctx + steps)`) a check runs: the other benchmarks' 2^24.
const MAX_TOKENS: usize = 1 << 24;
/// Most decode steps (each keeps a `[batch, vocab]` row of logits per model on the host).
const MAX_STEPS: usize = 10_000;

/// `dustin-bench tp-check`.
pub fn run(a: TpCheckArgs) -> Result<(), CliError> {
    if a.tp == 0 || a.batch == 0 || a.ctx == 0 {
        return Err(CliError::Usage(format!(
            "--tp {} --batch {} --ctx {}: each must be at least 1",
            a.tp, a.batch, a.ctx
        )));
    }
    if a.target_layers == Some(0) {
        return Err(CliError::Usage(
            "--target-layers 0: expected at least one layer".into(),
        ));
    }
    // the same limits as the other benchmarks: the whole model's logits of every step are
    // kept on the host
    if a.batch.saturating_mul(a.ctx.saturating_add(a.steps)) > MAX_TOKENS {
        return Err(CliError::Usage(format!(
            "--batch {} x (--ctx {} + --steps {}): at most {MAX_TOKENS} tokens in all",
            a.batch, a.ctx, a.steps
        )));
    }
    if a.steps > MAX_STEPS {
        return Err(CliError::Usage(format!(
            "--steps {}: at most {MAX_STEPS}",
            a.steps
        )));
    }
    let report = match (a.device, a.dtype) {
        (DeviceKind::Cpu, CheckDtype::F32) => {
            check::<burn_flex::Flex>(&a, |_| burn_flex::FlexDevice)?
        }
        (DeviceKind::Cpu, CheckDtype::Bf16) => {
            return Err(CliError::Usage(
                "--dtype bf16 needs --device cuda (the CPU backend computes in f32)".into(),
            ))
        }
        #[cfg(feature = "cuda")]
        (DeviceKind::Cuda, CheckDtype::F32) => {
            check::<burn_cuda::Cuda<f32, i32>>(&a, burn_cuda::CudaDevice::new)?
        }
        #[cfg(feature = "cuda")]
        (DeviceKind::Cuda, CheckDtype::Bf16) => {
            check::<burn_cuda::Cuda<half::bf16, i32>>(&a, burn_cuda::CudaDevice::new)?
        }
        #[cfg(not(feature = "cuda"))]
        (DeviceKind::Cuda, _) => return Err(CliError::Usage(
            "--device cuda needs a CUDA build: cargo build --release --features cuda -p dustin-bench"
                .into(),
        )),
    };
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
    println!(
        "tp-check: {} ranks, {} layers: max |diff| {:.3e} of max |logit| {:.3e} (relative {:.2e}, bound {:.0e}); ranks identical: {}; greedy tokens equal: {}/{}",
        report.tp,
        report.layers,
        report.max_abs_diff,
        report.max_abs_logit,
        report.rel_diff,
        report.bound,
        report.ranks_identical,
        report.top1_agree.0,
        report.top1_agree.1
    );
    if !report.rel_diff.is_finite() || report.rel_diff > report.bound || !report.ranks_identical {
        return Err(CliError::Usage(format!(
            "tp-check failed: relative difference {:.2e} (bound {:.0e}), ranks identical: {}",
            report.rel_diff, report.bound, report.ranks_identical
        )));
    }
    Ok(())
}

/// Logits rows `[step][sequence][vocab]` and the greedy token per (step, sequence) of `m`,
/// fed `forced` tokens after the prefill when given (else its own greedy tokens).
type Trace = (Vec<Vec<Vec<f32>>>, Vec<Vec<u32>>);

fn trace<B: KernelOps>(
    m: &Qwen2<B>,
    prompts: &[Vec<u32>],
    steps: usize,
    forced: Option<&[Vec<u32>]>,
) -> Result<Trace, CliError> {
    let batch = prompts.len();
    let ctx = prompts[0].len();
    let mut cache = m.new_cache(batch, ctx + steps + 1, None);
    let opts = ForwardOpts {
        phase: Phase::Decode,
        logits: LogitsMode::Last,
        layers: None,
    };
    let mut rows = Vec::new();
    let mut tokens = Vec::new();
    let mut input: Vec<Vec<u32>> = prompts.to_vec();
    for step in 0..=steps {
        let out = m.forward(&input, &mut cache, &mut DenseHook, opts)?;
        let logits: Tensor<B, 3> = out
            .logits
            .ok_or_else(|| CliError::Usage("no logits".into()))?;
        let [b, _, v] = logits.dims();
        let d: Vec<f32> = logits
            .into_data()
            .convert::<f32>()
            .into_vec()
            .map_err(|e| CliError::Usage(format!("logits: {e:?}")))?;
        let step_rows: Vec<Vec<f32>> = (0..b).map(|i| d[i * v..(i + 1) * v].to_vec()).collect();
        let greedy: Vec<u32> = step_rows
            .iter()
            .map(|r| {
                r.iter()
                    .enumerate()
                    .fold((0usize, f32::NEG_INFINITY), |best, (i, &x)| {
                        if x > best.1 {
                            (i, x)
                        } else {
                            best
                        }
                    })
                    .0 as u32
            })
            .collect();
        input = match forced {
            Some(f) if step < f.len() => f[step].iter().map(|&t| vec![t]).collect(),
            _ => greedy.iter().map(|&t| vec![t]).collect(),
        };
        rows.push(step_rows);
        tokens.push(greedy);
    }
    Ok((rows, tokens))
}

fn check<B: KernelOps>(
    a: &TpCheckArgs,
    dev_of: impl Fn(usize) -> B::Device,
) -> Result<TpCheckReport, CliError> {
    let mut cfg = QwenConfig::from_file(&a.target)?;
    let layers = a.target_layers.unwrap_or(cfg.num_hidden_layers.min(4));
    if layers > cfg.num_hidden_layers {
        return Err(CliError::Usage(format!(
            "--target-layers {layers}: the config has {}",
            cfg.num_hidden_layers
        )));
    }
    cfg.num_hidden_layers = layers;
    // a split that cannot work is refused before the whole model is drawn and traced
    dustin_qwen::tp::check_divisible("num_attention_heads", cfg.num_attention_heads, a.tp)?;
    dustin_qwen::tp::check_divisible("num_key_value_heads", cfg.kv_heads(), a.tp)?;
    dustin_qwen::tp::check_divisible("intermediate_size", cfg.intermediate_size, a.tp)?;
    // random weights: the RoPE table is extended to the positions the check runs, whatever
    // the config's max_position_embeddings says
    let positions = a.ctx + a.steps + 2;
    cfg.max_position_embeddings = cfg.max_position_embeddings.max(positions);
    let devices: Vec<B::Device> = (0..a.tp).map(dev_of).collect();
    B::seed(&devices[0], 0x5eed);
    let whole = Qwen2::<B>::random(&cfg, positions, &devices[0])?;
    let vocab = cfg.vocab_size;
    let prompts: Vec<Vec<u32>> = (0..a.batch)
        .map(|b| {
            (0..a.ctx)
                .map(|i| ((i * 7919 + b * 104_729 + 13) % vocab) as u32)
                .collect()
        })
        .collect();
    let t0 = std::time::Instant::now();
    let (want, want_tokens) = trace(&whole, &prompts, a.steps, None)?;
    eprintln!(
        "tp-check: whole model traced in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let group = if a.host_sum {
        TpGroup::<B>::new_host_sum(devices)?
    } else {
        TpGroup::<B>::new(devices)?
    };
    let shards = (0..a.tp)
        .map(|r| {
            let t = std::time::Instant::now();
            let s = whole.shard_with(TpRank::new(r, group.clone())?, a.host_copy)?;
            eprintln!(
                "tp-check: rank {r} sharded in {:.1} s",
                t.elapsed().as_secs_f64()
            );
            Ok(s)
        })
        .collect::<Result<Vec<_>, CliError>>()?;
    drop(whole);
    eprintln!(
        "tp-check: {} ranks ({}, shards copied {}), {} layers, batch {}, ctx {}, {} steps",
        a.tp,
        if group.on_device() {
            "device all-reduce"
        } else {
            "host all-reduce"
        },
        if a.host_copy {
            "through the host"
        } else {
            "device to device"
        },
        cfg.num_hidden_layers,
        a.batch,
        a.ctx,
        a.steps
    );
    let traces: Vec<Result<Trace, CliError>> = std::thread::scope(|s| {
        let hands: Vec<_> = shards
            .iter()
            .map(|m| s.spawn(|| trace(m, &prompts, a.steps, Some(&want_tokens))))
            .collect();
        hands
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(CliError::Usage("a rank panicked".into())))
            })
            .collect()
    });
    let traces = traces.into_iter().collect::<Result<Vec<_>, _>>()?;
    let (got, got_tokens) = &traces[0];
    let ranks_identical = traces.iter().all(|(r, _)| r == got);
    let mut max_abs_diff = 0f32;
    let mut max_abs_logit = 0f32;
    for (gs, ws) in got.iter().zip(&want) {
        for (g, w) in gs.iter().zip(ws) {
            for (x, y) in g.iter().zip(w) {
                max_abs_diff = max_abs_diff.max((x - y).abs());
                max_abs_logit = max_abs_logit.max(y.abs());
            }
        }
    }
    let pairs = got_tokens
        .iter()
        .flatten()
        .zip(want_tokens.iter().flatten());
    let total = want_tokens.iter().map(Vec::len).sum();
    let agree = pairs.filter(|(g, w)| g == w).count();
    Ok(TpCheckReport {
        tp: a.tp,
        layers: cfg.num_hidden_layers,
        max_abs_diff,
        max_abs_logit,
        rel_diff: max_abs_diff / max_abs_logit.max(f32::MIN_POSITIVE),
        ranks_identical,
        top1_agree: (agree, total),
        bound: a.dtype.bound(a.device),
    })
}
