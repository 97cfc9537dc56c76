//! `dustin-bench subspec`: decoding speed of a target that does not fit its GPU-memory
//! budget (SubSpec): plain offloaded autoregressive decoding against speculative decoding
//! with a substitute draft, each planned under the same `--gpu-memory` budget.
//!
//! - `ar`: [`plan_offload`] without a substitute keeps as many bottom layers resident as fit;
//!   every token streams the offloaded ones from host memory.
//! - `subspec`: [`plan_offload`] with a substitute: more layers are offloaded, each with a
//!   packed `bits`-bit copy on the GPU ([`substitute_model`]); the draft is the target with
//!   those copies in place of the offloaded layers (resident layers, embedding and LM head
//!   shared), and each verification streams the offloaded layers once for `gamma + 1`
//!   positions.
//!
//! Random bf16 weights make acceptance meaningless, so the speculative rows run the engine
//! under a forced schedule ([`SpeculativeDecoder::set_forced_acceptance`]): mean acceptance
//! length `--accept` (tokens per iteration); everything else (draft, verify with the layer
//! copies, accept, rollback) is measured. Each mode runs with prefetching on and off
//! (`--prefetch`): whether the copy of the next layer overlaps the current layer's compute.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use dustin_core::{DenseHook, TokenId};
use dustin_kernels::KernelOps;
use dustin_qwen::{plan_offload, substitute_model, Qwen2, QwenConfig, SubstituteConfig};
use dustin_spec::{autoregressive, ModelDrafter, ModelVerifier, SpecConfig, SpeculativeDecoder};

use dustin_cli::backend::DeviceKind;
use dustin_cli::generate::parse_bytes;
use dustin_cli::CliError;

/// Mean acceptance length (tokens per iteration) of SmolLM2-135M's substitute draft (4 bits,
/// group 64, layers 15-29 of 30) at gamma 4 on a 1,949-token excerpt, greedy (docs/perf.md,
/// "SubSpec substitute drafter on the CPU"). Not pi: the measured figure.
#[allow(clippy::approx_constant)]
pub const SMOLLM2_SUBSTITUTE_TAU: f64 = 3.14;

/// Arguments of `dustin-bench subspec`.
#[derive(Debug, Args)]
pub struct SubspecArgs {
    /// HF `config.json` of the target (for example Qwen2.5-7B-Instruct's).
    #[arg(long)]
    pub target: PathBuf,
    /// GPU memory the model, its substitute and the KV caches may take, e.g. `8G`.
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_memory: u64,
    /// Modes (comma-separated): `ar` (offloaded autoregressive) and `subspec`.
    #[arg(long, value_delimiter = ',', default_value = "ar,subspec")]
    pub modes: Vec<String>,
    /// Prompt tokens per sequence (prefilled for real).
    #[arg(long, default_value_t = 256)]
    pub ctx: usize,
    /// Sequences.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// Draft tokens per iteration.
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// Mean acceptance length (tokens per iteration) of the `subspec` rows, 1 ..= gamma + 1.
    /// Default: SmolLM2-135M's substitute draft (4 bits, group 64, layers 15-29) at gamma 4,
    /// docs/perf.md.
    #[arg(long, default_value_t = SMOLLM2_SUBSTITUTE_TAU)]
    pub accept: f64,
    /// Bits of the substitute's codes (2 ..= 8).
    #[arg(long, default_value_t = 4)]
    pub bits: u32,
    /// Group length of the substitute's quantization.
    #[arg(long, default_value_t = 64)]
    pub group: usize,
    /// Where the subspec draft keeps its KV: `own` (a cache of its own) or `target` (it
    /// attends to the target's cache, `dustin_spec::TargetKv`; `--draft substitute:kv=target`).
    #[arg(long, default_value = "own")]
    pub kv: String,
    /// Prefetch settings measured (comma-separated `on`, `off`).
    #[arg(long, value_delimiter = ',', default_value = "on,off")]
    pub prefetch: Vec<String>,
    /// Host memory of the offloaded weights measured (comma-separated `pageable`, `pinned`):
    /// `pageable` copies each through Burn's `Tensor::from_data`, `pinned` moves them to
    /// page-locked memory once after the build and copies each by one DMA transfer
    /// (`Qwen2::pin_offloaded`). Pageable rows run first; on the CPU both are the same path.
    /// Default `pinned`: 50-52 GB/s against 0.4 GB/s on the H200 machine (`dustin-bench
    /// upload-check`, docs/perf.md).
    #[arg(long, value_delimiter = ',', default_value = "pinned")]
    pub upload: Vec<String>,
    /// How RMSNorm, the SwiGLU product, RoPE and the substitutes' dequantization run in
    /// target and draft (`e2e --elementwise`): `fused` kernels (the default) or
    /// `plain` Burn ops.
    #[arg(long, value_enum, default_value_t = crate::e2e::Elementwise::Fused)]
    pub elementwise: crate::e2e::Elementwise,
    /// Linear layers of at most 16 rows in target and draft through the skinny GEMM kernel
    /// (`on`, the default) or Burn's matmul (`off`), as `e2e --skinny-gemm`.
    #[arg(long, value_enum, default_value_t = crate::e2e::OnOff::On)]
    pub skinny_gemm: crate::e2e::OnOff,
    /// With the skinny GEMM: q/k/v and gate/up/SiLU as grouped GEMMs (`on`, the default) or
    /// one skinny GEMM per projection (`off`), as `e2e --grouped-gemm`.
    #[arg(long, value_enum, default_value_t = crate::e2e::OnOff::On)]
    pub grouped_gemm: crate::e2e::OnOff,
    /// Iterations run first and not timed.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Iterations timed.
    #[arg(long, default_value_t = 3)]
    pub iters: usize,
    /// Append one JSON line per row to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// One measured row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// `ar` or `subspec`.
    pub mode: String,
    /// Where the subspec draft keeps its KV (`own`, `target`).
    pub kv: String,
    /// Whether the next offloaded layer was staged during the current layer's compute.
    pub prefetch: bool,
    /// The `--upload` setting of the row (`pageable` or `pinned`).
    pub upload: String,
    /// What ran for the element-wise ops (`--elementwise`; `plain` on the CPU, which has no
    /// fused kernels).
    pub elementwise: crate::e2e::Elementwise,
    /// Whether the skinny GEMM kernel ran (`--skinny-gemm`; `off` on the CPU, which has no
    /// such kernel).
    pub skinny_gemm: crate::e2e::OnOff,
    /// Whether the grouped GEMMs ran (`--grouped-gemm`, with the skinny GEMM; `off` on the
    /// CPU).
    pub grouped_gemm: crate::e2e::OnOff,
    /// Whether the offloaded weights were in page-locked host memory: `--upload pinned` on a
    /// backend that has it (CUDA) with something offloaded; `false` on the CPU, which runs
    /// the `pinned` rows through pageable memory.
    pub pinned: bool,
    /// Page-locked uploads the driver refused so far in the process (each then went through
    /// pageable memory; `dustin_qwen::offload::pinned_fallbacks`).
    pub pinned_fallbacks: usize,
    /// The budget, bytes.
    pub gpu_memory: u64,
    /// Target layers resident / offloaded.
    pub resident: usize,
    /// See `resident`.
    pub offloaded: usize,
    /// Bytes the plan puts on the GPU.
    pub planned_bytes: u64,
    /// Weight bytes resident on the device, target and substitute (measured on the model
    /// objects: packed sizes, no host weights).
    pub device_weight_bytes: u64,
    /// Bytes copied from host memory per target forward pass.
    pub streamed_bytes: u64,
    /// Prompt tokens, sequences, draft tokens per iteration (0 for `ar`).
    pub ctx: usize,
    /// See `ctx`.
    pub batch: usize,
    /// See `ctx`.
    pub gamma: usize,
    /// Mean tokens per sequence per iteration of the schedule (1 for `ar`); tokens/s uses
    /// it, since an iteration's time does not depend on how many drafts are accepted.
    pub tau: f64,
    /// Mean tokens per sequence per iteration over the timed iterations (the schedule's
    /// `floor` pattern over that window; equals `tau` over a whole period).
    pub tau_measured: f64,
    /// Mean milliseconds per iteration.
    pub draft_ms: f64,
    /// See `draft_ms`.
    pub verify_ms: f64,
    /// Accept and commit.
    pub other_ms: f64,
    /// Sum.
    pub iter_ms: f64,
    /// Tokens per second over the batch.
    pub tokens_per_sec: f64,
    /// `streamed_bytes / verify time`: the host-to-device rate the verification achieved,
    /// GB/s (compute included).
    pub stream_gb_per_sec: f64,
    /// Seconds to build the model(s) (random draw, offload, quantization).
    pub build_secs: f64,
    /// Device allocator after the build and a cleanup, bytes in use and reserved (main and
    /// prefetch streams; `null` where the backend does not say).
    pub mem_after_build: Option<(u64, u64)>,
    /// The same after the timed iterations (before any cleanup): the pool's high-water mark
    /// of the run as far as the allocator keeps it.
    pub mem_after_run: Option<(u64, u64)>,
}

fn validate(a: &SubspecArgs) -> Result<SubstituteConfig, CliError> {
    let bad = |m: String| Err(CliError::Usage(m));
    dustin_cli::check_gamma(a.gamma)?;
    if !(a.accept.is_finite() && a.accept >= 1.0 && a.accept <= (a.gamma + 1) as f64) {
        return bad(format!(
            "--accept {}: expected a mean acceptance length in 1 ..= gamma + 1 = {}",
            a.accept,
            a.gamma + 1
        ));
    }
    if a.ctx == 0 || a.batch == 0 || a.iters == 0 {
        return bad("--ctx, --batch and --iters must be at least 1".into());
    }
    if a.warmup + a.iters > 10_000 {
        return bad(format!(
            "--warmup {} + --iters {}: at most 10000 iterations",
            a.warmup, a.iters
        ));
    }
    if a.batch.saturating_mul(a.ctx) > 1 << 24 {
        return bad(format!(
            "--batch {} x --ctx {}: at most {} prompt tokens in all",
            a.batch,
            a.ctx,
            1 << 24
        ));
    }
    if let Some(m) = a.modes.iter().find(|m| *m != "ar" && *m != "subspec") {
        return bad(format!("--modes {m}: expected ar or subspec"));
    }
    if a.kv != "own" && a.kv != "target" {
        return bad(format!("--kv {}: expected own or target", a.kv));
    }
    if let Some(p) = a.prefetch.iter().find(|p| *p != "on" && *p != "off") {
        return bad(format!("--prefetch {p}: expected on or off"));
    }
    if let Some(u) = a.upload.iter().find(|u| *u != "pageable" && *u != "pinned") {
        return bad(format!("--upload {u}: expected pageable or pinned"));
    }
    for (flag, list) in [
        ("--modes", &a.modes),
        ("--prefetch", &a.prefetch),
        ("--upload", &a.upload),
    ] {
        if let Some((_, v)) = list
            .iter()
            .enumerate()
            .find(|(i, v)| list[..*i].contains(v))
        {
            return bad(format!("{flag} {}: {v} is listed twice", list.join(",")));
        }
    }
    let cfg = SubstituteConfig {
        bits: a.bits,
        group: a.group,
    };
    cfg.validate()
        .map_err(|e| CliError::Usage(format!("--bits / --group: {e}")))?;
    Ok(cfg)
}

/// `dustin-bench subspec`.
pub fn run(args: SubspecArgs) -> Result<(), CliError> {
    let sub = validate(&args)?;
    crate::jsonl::check_json_path(args.json.as_deref(), &[args.target.as_path()])?;
    dustin_cli::with_backend!(args.device, |B, dev| run_on::<B>(&args, sub, &dev))
}

fn run_on<B: KernelOps>(
    args: &SubspecArgs,
    sub: SubstituteConfig,
    dev: &B::Device,
) -> Result<(), CliError> {
    let tcfg = QwenConfig::from_file(&args.target)?;
    let bytes = dustin_core::memory::float_bytes::<B>();
    let max_new = (args.warmup + args.iters + 2) * (args.gamma + 1);
    let extra = max_new + 2 * (args.gamma + 2);
    let positions = args.ctx + extra + 1;
    if positions > tcfg.max_position_embeddings {
        return Err(CliError::Usage(format!(
            "--ctx {}: the prompt and the {} tokens the run generates pass the target's \
             max_position_embeddings = {} (largest --ctx: {})",
            args.ctx,
            positions - args.ctx,
            tcfg.max_position_embeddings,
            tcfg.max_position_embeddings
                .saturating_sub(positions - args.ctx)
        )));
    }
    let vocab = tcfg.vocab_size;
    let prompts: Vec<Vec<TokenId>> = (0..args.batch)
        .map(|b| {
            (0..args.ctx)
                .map(|i| ((i * 7919 + b * 104_729 + 13) % vocab) as TokenId)
                .collect()
        })
        .collect();
    // every plan is checked before anything is built or printed, and every mode's problem
    // is named at once (each mode needs its own minimum)
    let problems: Vec<String> = args
        .modes
        .iter()
        .filter_map(|mode| {
            plan_for(args, &tcfg, mode, sub, bytes, positions)
                .err()
                .map(|e| e.to_string())
        })
        .collect();
    if !problems.is_empty() {
        return Err(CliError::Usage(problems.join("; ")));
    }
    println!(
        "| mode | prefetch | upload | resident / offloaded | planned GB | device weights GB | streamed GB | tau | draft ms | verify ms | iter ms | tokens/s | stream GB/s |"
    );
    println!("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for mode in &args.modes {
        let spec = mode == "subspec";
        let plan = plan_for(args, &tcfg, mode, sub, bytes, positions)?;
        let t = Instant::now();
        let target = Qwen2::<B>::random_offloaded(&tcfg, positions, dev, &plan.offloaded)?;
        let draft = if spec {
            Some(Arc::new(substitute_model(&target, &plan.offloaded, sub)?))
        } else {
            None
        };
        let build_secs = t.elapsed().as_secs_f64();
        dustin_qwen::offload::memory_cleanup::<B>(dev);
        let mem_after_build = dustin_qwen::offload::memory_usage::<B>(dev);
        let device_weight_bytes = target.device_bytes() as u64
            + draft.as_ref().map_or(0, |d| {
                // the draft shares every tensor but the substitutes' packed matrices
                d.layers
                    .iter()
                    .zip(&target.layers)
                    .filter(|(_, t)| t.is_offloaded())
                    .map(|(l, _)| l.device_bytes())
                    .sum::<usize>() as u64
            });
        // an offloaded layer keeps its norms and biases (and its substitute) on the device;
        // each target forward pass copies its seven matrices
        let streamed_bytes = streamed_matrices(&target);
        if spec && plan.offloaded.is_empty() {
            eprintln!(
                "note: the whole target fits --gpu-memory: nothing is offloaded and the subspec \
                 draft is the target itself"
            );
        }
        eprintln!(
            "subspec: {mode}: {} resident, {} offloaded; built in {build_secs:.1} s",
            plan.resident,
            plan.offloaded.len()
        );
        let mut target = target;
        let uploads: Vec<bool> = ["pageable", "pinned"]
            .iter()
            .filter(|u| args.upload.iter().any(|a| a == *u))
            .map(|u| *u == "pinned")
            .collect();
        for pinned in uploads {
            if pinned {
                let t = Instant::now();
                target.pin_offloaded()?;
                if plan.offloaded.is_empty() {
                    eprintln!("subspec: {mode}: nothing is offloaded, nothing to pin");
                } else if target.offloaded_pinned() {
                    eprintln!(
                        "subspec: {mode}: offloaded weights moved to page-locked memory in {:.1} s",
                        t.elapsed().as_secs_f64()
                    );
                } else {
                    eprintln!(
                        "subspec: {mode}: this backend has no page-locked memory; the `pinned` rows copy through pageable memory (their `pinned` field says false)"
                    );
                }
            }
            let pinned_now = pinned && !plan.offloaded.is_empty() && target.offloaded_pinned();
            for p in &args.prefetch {
                let prefetch = p == "on";
                let fused = args.elementwise == crate::e2e::Elementwise::Fused;
                let skinny = args.skinny_gemm == crate::e2e::OnOff::On;
                let grouped = args.grouped_gemm == crate::e2e::OnOff::On;
                let target = Arc::new(
                    target
                        .clone()
                        .with_prefetch(prefetch)
                        .with_fused_elementwise(fused)
                        .with_skinny_gemm(skinny)
                        .with_grouped_gemm(grouped),
                );
                let tau = if spec { args.accept } else { 1.0 };
                let cfg = SpecConfig {
                    gamma: if spec { args.gamma } else { 1 },
                    max_new_tokens: ((args.warmup + args.iters + 1) as f64 * tau).ceil() as usize
                        + 1,
                    ..SpecConfig::default()
                };
                let out = match &draft {
                    None => {
                        let mut v = ModelVerifier::new(target.clone(), DenseHook, extra, vocab);
                        autoregressive(&mut v, &prompts, &cfg, None, &mut |_, _| {})?
                    }
                    Some(d) => {
                        let d = Arc::new(
                            (**d)
                                .clone()
                                .with_prefetch(prefetch)
                                .with_fused_elementwise(fused)
                                .with_skinny_gemm(skinny)
                                .with_grouped_gemm(grouped),
                        );
                        let drafter = ModelDrafter::new(d, None, extra);
                        let verifier = ModelVerifier::new(target.clone(), DenseHook, extra, vocab);
                        let (drafter, verifier) = if args.kv == "target" {
                            let kv = dustin_spec::TargetKv::new();
                            (
                                drafter.with_target_kv(kv.clone()),
                                verifier.with_target_kv(kv),
                            )
                        } else {
                            (drafter, verifier)
                        };
                        let mut dec = SpeculativeDecoder::new(drafter, verifier);
                        dec.set_forced_acceptance(Some(tau - 1.0))?;
                        dec.generate(&prompts, &cfg, None, &mut |_, _| {})?
                    }
                };
                let mem_after_run = dustin_qwen::offload::memory_usage::<B>(dev);
                let w = crate::e2e::timed_window(&out.iterations, args.warmup, args.iters, mode)?;
                let (draft_ms, verify_ms) = (w.draft_ms, w.verify_ms);
                let other_ms = w.accept_ms + w.commit_ms;
                let iter_ms = draft_ms + verify_ms + other_ms;
                let tau_measured = w.tau_measured;
                let row = Row {
                    mode: mode.clone(),
                    kv: args.kv.clone(),
                    prefetch,
                    upload: if pinned { "pinned" } else { "pageable" }.into(),
                    elementwise: if B::FUSED && fused {
                        crate::e2e::Elementwise::Fused
                    } else {
                        crate::e2e::Elementwise::Plain
                    },
                    skinny_gemm: if B::FUSED && skinny {
                        crate::e2e::OnOff::On
                    } else {
                        crate::e2e::OnOff::Off
                    },
                    grouped_gemm: if B::FUSED && skinny && grouped {
                        crate::e2e::OnOff::On
                    } else {
                        crate::e2e::OnOff::Off
                    },
                    pinned: pinned_now,
                    pinned_fallbacks: dustin_qwen::offload::pinned_fallbacks(),
                    gpu_memory: args.gpu_memory,
                    resident: plan.resident,
                    offloaded: plan.offloaded.len(),
                    planned_bytes: plan.total_bytes,
                    device_weight_bytes,
                    streamed_bytes,
                    ctx: args.ctx,
                    batch: args.batch,
                    gamma: if spec { args.gamma } else { 0 },
                    tau,
                    tau_measured,
                    draft_ms,
                    verify_ms,
                    other_ms,
                    iter_ms,
                    tokens_per_sec: args.batch as f64 * tau / (iter_ms / 1e3),
                    stream_gb_per_sec: streamed_bytes as f64 / 1e9 / (verify_ms / 1e3),
                    build_secs,
                    mem_after_build,
                    mem_after_run,
                };
                println!(
                "| {} | {} | {} | {} / {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {:.3} | {:.2} |",
                row.mode,
                p,
                if pinned_now { "pinned" } else { "pageable" },
                row.resident,
                row.offloaded,
                row.planned_bytes as f64 / 1e9,
                row.device_weight_bytes as f64 / 1e9,
                row.streamed_bytes as f64 / 1e9,
                row.tau,
                row.draft_ms,
                row.verify_ms,
                row.iter_ms,
                row.tokens_per_sec,
                row.stream_gb_per_sec
            );
                if let (Some(b), Some(r)) = (row.mem_after_build, row.mem_after_run) {
                    eprintln!(
                    "  device allocator: after build {:.2} GB in use / {:.2} GB reserved; after the run {:.2} / {:.2} GB",
                    b.0 as f64 / 1e9,
                    b.1 as f64 / 1e9,
                    r.0 as f64 / 1e9,
                    r.1 as f64 / 1e9
                );
                }
                if let Some(path) = &args.json {
                    crate::jsonl::append_json(path, &row)?;
                }
                dustin_qwen::offload::memory_cleanup::<B>(dev);
            }
        }
    }
    Ok(())
}

/// The offload plan of `mode` under the budget.
fn plan_for(
    args: &SubspecArgs,
    tcfg: &QwenConfig,
    mode: &str,
    sub: SubstituteConfig,
    bytes: usize,
    positions: usize,
) -> Result<dustin_qwen::OffloadPlan, CliError> {
    let spec = mode == "subspec";
    // KV caches: the target's, and the draft's own (target-shaped) for subspec
    let kv = (tcfg.kv_bytes_per_token(bytes) as u64)
        * (args.batch * positions) as u64
        * if spec { 2 } else { 1 };
    plan_offload(
        tcfg,
        args.gpu_memory,
        bytes as f64,
        kv,
        spec.then_some(sub),
        args.prefetch.iter().any(|p| p == "on"),
    )
    .map_err(|e| CliError::Usage(format!("--gpu-memory ({mode}): {e}")))
}

/// Bytes of the offloaded layers' matrices (what one forward pass copies to the device).
fn streamed_matrices<B: KernelOps>(target: &Qwen2<B>) -> u64 {
    target
        .layers
        .iter()
        .filter(|l| l.is_offloaded())
        .flat_map(|l| l.linears())
        .map(|lin| match &lin.weight {
            dustin_qwen::Weight::Host(h) => h.bytes() as u64,
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> SubspecArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            a: SubspecArgs,
        }
        let mut v = vec!["x", "--target", "t.json", "--gpu-memory", "8G"];
        v.extend_from_slice(extra);
        W::try_parse_from(v).unwrap().a
    }

    #[test]
    fn offloaded_rows_stream_the_offloaded_matrices() {
        let dir = std::env::temp_dir().join(format!("dustin-subspec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 6 layers of hidden 64, intermediate 512, 4 heads / 2 KV heads of 16: 110_592
        // matrix weights a layer (2*64*64 + 2*64*32 + 3*64*512), f32 on the CPU
        let cfg = dir.join("config.json");
        std::fs::write(
            &cfg,
            r#"{"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 512,
                "max_position_embeddings": 512, "num_attention_heads": 4,
                "num_hidden_layers": 6, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "tie_word_embeddings": false, "vocab_size": 256}"#,
        )
        .unwrap();
        let json = dir.join("rows.jsonl");
        let _ = std::fs::remove_file(&json);
        let mut a = args(&[
            "--ctx",
            "8",
            "--iters",
            "2",
            "--modes",
            "ar,subspec",
            "--kv",
            "target",
            "--upload",
            "pinned,pageable",
            "--elementwise",
            "fused",
            "--skinny-gemm",
            "on",
            "--grouped-gemm",
            "on",
        ]);
        a.target = cfg;
        a.gpu_memory = 2_200_000;
        a.json = Some(json.clone());
        let sub = validate(&a).unwrap();
        run_on::<burn_flex::Flex>(&a, sub, &burn_flex::FlexDevice).unwrap();
        let rows: Vec<serde_json::Value> = std::fs::read_to_string(&json)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            rows.len(),
            8,
            "two modes x pageable, pinned x prefetch on, off"
        );
        // pageable rows first whatever the order asked, then pinned, per mode
        let upload: Vec<&str> = rows.iter().map(|r| r["upload"].as_str().unwrap()).collect();
        let (pg, pn) = ("pageable", "pinned");
        assert_eq!(upload, [pg, pg, pn, pn, pg, pg, pn, pn], "{rows:?}");
        for r in &rows {
            // the CPU has no page-locked memory: the pinned rows copy through pageable memory,
            // say so, and nothing was refused
            assert_eq!(r["pinned"].as_bool(), Some(false), "{r}");
            assert_eq!(r["pinned_fallbacks"].as_u64(), Some(0), "{r}");
            // nor fused kernels: the rows say the plain ops ran
            assert_eq!(r["elementwise"].as_str(), Some("plain"), "{r}");
            assert_eq!(r["skinny_gemm"].as_str(), Some("off"), "{r}");
            assert_eq!(r["grouped_gemm"].as_str(), Some("off"), "{r}");
            let off = r["offloaded"].as_u64().unwrap();
            assert!(off > 0 && off + r["resident"].as_u64().unwrap() == 6, "{r}");
            assert_eq!(
                r["streamed_bytes"].as_u64().unwrap(),
                off * 110_592 * 4,
                "{r}"
            );
            assert!(r["planned_bytes"].as_u64().unwrap() <= 2_200_000);
            let tau = r["tau"].as_f64().unwrap();
            let iter = r["iter_ms"].as_f64().unwrap();
            assert!((r["tokens_per_sec"].as_f64().unwrap() - tau / (iter / 1e3)).abs() < 1e-6);
        }
        // SubSpec spends budget on substitutes: it offloads more layers than plain offloading
        let off = |m: &str| {
            rows.iter().find(|r| r["mode"] == m).unwrap()["offloaded"]
                .as_u64()
                .unwrap()
        };
        assert!(off("subspec") > off("ar"));
        // a budget too small for either mode names both minimums at once
        let mut small = args(&["--ctx", "8", "--modes", "ar,subspec"]);
        small.target = a.target.clone();
        small.gpu_memory = 100_000;
        let e = run_on::<burn_flex::Flex>(&small, sub, &burn_flex::FlexDevice)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--gpu-memory (ar)") && e.contains("--gpu-memory (subspec)"),
            "{e}"
        );
        // a prompt that leaves no room for the run before max_position_embeddings (512)
        a.ctx = 500;
        let e = run_on::<burn_flex::Flex>(&a, sub, &burn_flex::FlexDevice)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--ctx 500") && e.contains("max_position_embeddings = 512"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn bad_settings_are_named() {
        let cases: [(&[&str], &str); 11] = [
            (&["--kv", "shared"], "--kv shared: expected own or target"),
            (
                &["--warmup", "20000"],
                "--warmup 20000 + --iters 3: at most 10000 iterations",
            ),
            (
                &["--batch", "100000000000"],
                "at most 16777216 prompt tokens in all",
            ),
            (
                &["--accept", "6"],
                "--accept 6: expected a mean acceptance length in 1 ..= gamma + 1 = 5",
            ),
            (&["--accept", "0.5"], "--accept 0.5"),
            (
                &["--modes", "ar,fast"],
                "--modes fast: expected ar or subspec",
            ),
            (
                &["--prefetch", "maybe"],
                "--prefetch maybe: expected on or off",
            ),
            (&["--bits", "9"], "--bits / --group"),
            (
                &["--upload", "pinned,mapped"],
                "--upload mapped: expected pageable or pinned",
            ),
            (
                &["--prefetch", "off,off"],
                "--prefetch off,off: off is listed twice",
            ),
            (&["--modes", "ar,subspec,ar"], "ar is listed twice"),
        ];
        for (extra, want) in cases {
            let e = validate(&args(extra)).unwrap_err().to_string();
            assert!(e.contains(want), "{extra:?}: {e}");
        }
        assert!(validate(&args(&[])).is_ok());
    }
}
