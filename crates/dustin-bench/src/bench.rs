//! `dustin-bench bench`: prefill and decode speed of a model with random weights at the
//! shapes of an HF `config.json` (for example
//! `../shared/data/qwen2.5/Qwen2.5-7B-Instruct.config.json`).
//! Random weights make the text meaningless; the timings are real.

use dustin_kernels::KernelOps;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use dustin_core::{DenseHook, Phase};
use dustin_qwen::generate::{prefill, resolve_prefill_chunk};
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2, QwenConfig};

use dustin_cli::backend::DeviceKind;
use dustin_cli::CliError;

/// Arguments of `dustin-bench bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// HF `config.json` giving the model shape.
    #[arg(long)]
    pub config: PathBuf,
    /// Sequences in the batch.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 4096)]
    pub prompt_len: usize,
    /// Decode steps timed.
    #[arg(long, default_value_t = 128)]
    pub decode: usize,
    /// Untimed decode steps first (JIT compilation and autotuning on the GPU).
    #[arg(long, default_value_t = 8)]
    pub warmup: usize,
    /// Prefill chunks, tokens (comma-separated, each timed in turn with every path below);
    /// 0 (the default) for the backend's own (16384 on CUDA, 512 on the CPU;
    /// `dustin_qwen::generate::auto_prefill_chunk`).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub chunk: Vec<usize>,
    /// Attention of the prefill chunks (comma-separated; each timed in turn on the same
    /// model, one JSON line each): `kernel` (`KernelOps::prefill_attention`, the default; on
    /// CUDA the FlashAttention-2 style kernel, or the flash-decoding split kernel for chunks
    /// too small to fill the GPU) or `plain` (the model's Burn ops: the masked score
    /// matrix of each chunk). On the CPU both are Burn ops.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kernel")]
    pub prefill_attention: Vec<PrefillPath>,
    /// Linear layers of the prefill chunks (comma-separated; each timed in turn, with each
    /// `--prefill-attention` path): `cublas` (`KernelOps::prefill_linear`, the default: cuBLAS
    /// on CUDA where `libcublas` loads, Burn's matmul elsewhere; the report's
    /// `prefill_gemm_lib` says which ran) or `burn` (Burn's matmul).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "cublas")]
    pub prefill_gemm: Vec<PrefillGemm>,
    /// Warps per block of the CUDA flash kernel's prefill (comma-separated, each timed in
    /// turn with every path above): 4 (64 query rows a block, the default) or 8 (128 rows;
    /// `dustin_kernels::cuda::set_prefill_warps`). Other backends ignore it.
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub prefill_warps: Vec<usize>,
    /// Query m-tiles (16 rows each) per warp of the CUDA causal prefill (comma-separated,
    /// each timed in turn with every path above): 0 (automatic, the default: `prefill_kernel`
    /// for chunks of 512 or more, its K/V tiles in a ring of two buffers from 8192 keys;
    /// `flash_kernel` below; `dustin_kernels::cuda::PREFILL_TILES`), 1
    /// (`flash_kernel`), 2 (`prefill_kernel`: 32 rows a warp, 4 warps a block whatever
    /// `--prefill-warps` says) or 3 (`prefill_kernel` with K and V staged apart by
    /// `cp.async`); `dustin_kernels::cuda::set_prefill_tiles`. Other backends ignore it.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub prefill_tiles: Vec<usize>,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// `--prefill-gemm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrefillGemm {
    /// `KernelOps::prefill_linear` (`Qwen2::with_prefill_gemm(true)`).
    Cublas,
    /// Burn's matmul (`Qwen2::with_prefill_gemm(false)`).
    Burn,
}

/// `--prefill-attention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PrefillPath {
    /// `KernelOps::prefill_attention` (`Qwen2::with_prefill_attention(true)`).
    Kernel,
    /// The model's own Burn ops (`Qwen2::with_prefill_attention(false)`).
    Plain,
}

/// `dustin-bench bench`.
pub fn run(args: BenchArgs) -> Result<(), CliError> {
    validate(&args)?;
    dustin_cli::with_backend!(args.device, |B, dev| run_on::<B>(&args, &dev))
}

/// Most positions of a sequence and most prompt tokens of a batch: 2^24, the
/// `max_position_embeddings` bound of `QwenConfig` (as `e2e` and `tp-check`).
const MAX_TOKENS: usize = 1 << 24;

/// The sizes, before any weights are built (a zero batch indexed an empty prompt list; huge
/// sizes wrapped or aborted the process while allocating).
fn validate(a: &BenchArgs) -> Result<(), CliError> {
    let bad = |m: String| Err(CliError::Usage(m));
    if a.batch == 0 {
        return bad("--batch 0: expected at least 1 sequence".into());
    }
    if a.prompt_len == 0 {
        return bad("--prompt-len 0: expected at least 1 prompt token".into());
    }
    if a.decode == 0 {
        return bad("--decode 0: nothing would be timed (expected at least 1 step)".into());
    }
    if let Some(w) = a.prefill_warps.iter().find(|&&w| w != 4 && w != 8) {
        return bad(format!("--prefill-warps {w}: expected 4 or 8"));
    }
    if let Some(t) = a.prefill_tiles.iter().find(|&&t| t > 3) {
        return bad(format!("--prefill-tiles {t}: expected 0, 1, 2 or 3"));
    }
    let positions = a
        .prompt_len
        .saturating_add(a.warmup)
        .saturating_add(a.decode)
        .saturating_add(1);
    if positions > MAX_TOKENS {
        return bad(format!(
            "--prompt-len {} + --warmup {} + --decode {}: at most {MAX_TOKENS} positions",
            a.prompt_len, a.warmup, a.decode
        ));
    }
    if a.batch.saturating_mul(a.prompt_len) > MAX_TOKENS {
        return bad(format!(
            "--batch {} x --prompt-len {}: at most {MAX_TOKENS} prompt tokens in all",
            a.batch, a.prompt_len
        ));
    }
    Ok(())
}

fn sync<B: KernelOps>(t: burn_tensor::Tensor<B, 3>) {
    // reading one value waits for the device queue
    let [b, n, v] = t.dims();
    let _ = t.slice([b - 1..b, n - 1..n, v - 1..v]).into_data();
}

fn run_on<B: KernelOps>(args: &BenchArgs, dev: &B::Device) -> Result<(), CliError> {
    let mut cfg = QwenConfig::from_file(&args.config)?;
    let cap = args.prompt_len + args.warmup + args.decode + 1;
    // a 32k prompt plus the decode steps passes Qwen2.5's 32768 positions; with random
    // weights the RoPE table is simply extended (as in e2e)
    cfg.max_position_embeddings = cfg.max_position_embeddings.max(cap);
    let t = Instant::now();
    let model = Qwen2::<B>::random(&cfg, cap, dev)?;
    let init_secs = t.elapsed().as_secs_f64();
    let vocab = cfg.vocab_size as u32;
    let prompts: Vec<Vec<u32>> = (0..args.batch)
        .map(|b| {
            (0..args.prompt_len)
                .map(|i| ((i * 7919 + b * 104729) as u32) % vocab)
                .collect()
        })
        .collect();
    // time to first token per chunk and path: the whole batch's prefill and its last logits
    // read back
    let mut prefills = Vec::with_capacity(args.prefill_attention.len());
    let mut cache = None;
    let runs = args.chunk.iter().flat_map(|&c| {
        args.prefill_attention.iter().flat_map(move |&p| {
            args.prefill_gemm
                .iter()
                .flat_map(move |&g| args.prefill_warps.iter().map(move |&w| (p, g, w)))
                .flat_map(move |(p, g, w)| args.prefill_tiles.iter().map(move |&t| (c, p, g, w, t)))
        })
    });
    for (chunk, path, gemm, warps, tiles) in runs {
        let kernels = dustin_kernels::KernelConfig {
            prefill_attention: (path == PrefillPath::Kernel).into(),
            prefill_gemm: (gemm == PrefillGemm::Cublas).into(),
            prefill_warps: warps,
            prefill_tiles: tiles,
            ..*model.kernel_config()
        };
        let m = model.clone().with_kernel_config(kernels);
        // the automatic chunk of this path (the plain one builds score matrices: 512)
        let chunk = resolve_prefill_chunk(&m, &DenseHook, None, chunk);
        // the first prompt run untimed before each path's prefill: every chunk of it, so
        // the kernels that only later chunks take (on CUDA the ring of `prefill_kernel`
        // from 8192 keys) are compiled before the timing too
        let warm: Vec<Vec<u32>> = vec![prompts[0].clone()];
        let (_, l, _) = prefill(&m, &warm, cap, None, &mut DenseHook, chunk, false)?;
        let _ = l.into_data();
        drop(cache.take());
        let t = Instant::now();
        let (c, last, _) = prefill(&m, &prompts, cap, None, &mut DenseHook, chunk, false)?;
        let _ = last.into_data();
        prefills.push((chunk, path, gemm, warps, tiles, t.elapsed().as_secs_f64()));
        cache = Some(c);
    }
    let mut cache = cache.ok_or_else(|| {
        CliError::Usage(
            "--prefill-attention, --prefill-gemm: expected at least one path each".into(),
        )
    })?;
    let step = |cache: &mut dustin_kv::DenseKvCache<B>| -> Result<(), CliError> {
        let toks: Vec<Vec<u32>> = (0..args.batch)
            .map(|b| vec![(b as u32 * 31 + 7) % vocab])
            .collect();
        let out = model.forward(
            &toks,
            cache,
            &mut DenseHook,
            ForwardOpts {
                phase: Phase::Decode,
                logits: LogitsMode::Last,
                layers: None,
            },
        )?;
        if let Some(l) = out.logits {
            sync(l.argmax(2).float());
        }
        Ok(())
    };
    for _ in 0..args.warmup {
        step(&mut cache)?;
    }
    let t = Instant::now();
    for _ in 0..args.decode {
        step(&mut cache)?;
    }
    let decode_secs = t.elapsed().as_secs_f64();
    for (chunk, path, gemm, warps, tiles, prefill_secs) in prefills {
        let lib = match gemm {
            PrefillGemm::Cublas => B::prefill_gemm_name(dev),
            PrefillGemm::Burn => "burn",
        };
        let report = serde_json::json!({
            "config": args.config.display().to_string(),
            "device": format!("{:?}", args.device),
            "batch": args.batch,
            "prompt_len": args.prompt_len,
            "chunk": chunk,
            "prefill_attention": format!("{path:?}").to_lowercase(),
            "prefill_gemm_lib": lib,
            "prefill_warps": warps,
            "prefill_tiles": tiles,
            "init_secs": init_secs,
            "prefill_secs": prefill_secs,
            "prefill_tokens_per_sec": (args.batch * args.prompt_len) as f64 / prefill_secs,
            "decode_steps": args.decode,
            "decode_ms_per_step": 1e3 * decode_secs / args.decode as f64,
            "decode_tokens_per_sec": (args.batch * args.decode) as f64 / decode_secs,
        });
        println!("{report}");
    }
    Ok(())
}
