//! The `dustin` command: the demo, generation, evaluation, benchmarks and checks (one
//! subcommand each; `dustin --help` lists them).
//!
//! Backends: the CPU (`burn-flex`, f32) always; CUDA (`burn-cuda`, bf16 or f32) when built
//! with `--features cuda`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod backend;
mod bench;
mod bench_e2e;
mod bench_subspec;
mod chat;
mod demo;
mod eval;
mod fetch;
mod generate;
mod host_profile;
mod kernel_check;
mod models;
mod pair;
mod plot_e2e;
mod ppl;
mod tp_check;
mod upload_check;

/// dustin: speculative decoding with draft-augmented sparse verification for long contexts.
#[derive(Debug, Parser)]
#[command(name = "dustin", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The main job: Qwen2.5-Coder-0.5B drafting for Qwen2.5-Coder-1.5B on a shipped source
    /// file, in five modes (autoregressive; speculative with dense, dustin, streaming and
    /// quest verification), printing one table (also written as JSON, Markdown and SVG).
    Demo(demo::DemoArgs),
    /// Generate a continuation of a prompt file, or a chat reply with --chat (autoregressive,
    /// or speculative with --draft).
    Generate(generate::GenerateArgs),
    /// Perplexity of a text file under a model (dense attention) and a tokenizer round trip.
    Ppl(ppl::PplArgs),
    /// Time prefill and decode of a random-weight model at the shapes of a config.json.
    Bench(bench::BenchArgs),
    /// End-to-end decoding speed at real model shapes (random weights): autoregressive vs
    /// speculative with each selector, under a stated acceptance schedule.
    BenchE2e(Box<bench_e2e::E2eArgs>),
    /// Plot tokens/s against context length per mode from `bench-e2e --json` rows (SVG and
    /// a Markdown table).
    PlotE2e(plot_e2e::PlotE2eArgs),
    /// SubSpec at a GPU-memory budget: offloaded autoregressive decoding vs a substitute
    /// draft, random weights at real shapes, acceptance from a schedule.
    BenchSubspec(bench_subspec::SubspecArgs),
    /// Tensor parallelism check: the target split over --tp devices against the whole
    /// model, same random weights (logits and greedy tokens).
    TpCheck(tp_check::TpCheckArgs),
    /// Host-to-device copies of weight matrices: Burn's pageable path against page-locked
    /// memory (bit-for-bit check and GB/s; CUDA).
    UploadCheck(upload_check::UploadCheckArgs),
    /// The per-layer kernels (RMSNorm, SwiGLU product, RoPE, packed dequantization, skinny
    /// GEMM) against float64 references on random inputs, then a 2-layer random model's
    /// logits through the kernels against the model's own Burn ops (`--device cuda`: the
    /// fused CUDA kernels, outputs poisoned first).
    KernelCheck(kernel_check::KernelCheckArgs),
    /// Evaluations per selector and budget against dense verification: `eval fidelity`,
    /// `eval pg19` (perplexity) and `eval longbench` (LongBench scores).
    Eval(eval::EvalArgs),
    /// Download a model by name into the cache (default: qwen2.5-coder-1.5b-instruct;
    /// `--list` shows the names), or check one already there.
    FetchModel(fetch::FetchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Bench(a) => bench::run(a),
        Command::BenchE2e(a) => bench_e2e::run(*a),
        Command::PlotE2e(a) => plot_e2e::run(a),
        Command::BenchSubspec(a) => bench_subspec::run(a),
        Command::Ppl(a) => ppl::run(a),
        Command::TpCheck(a) => tp_check::run(a),
        Command::UploadCheck(a) => upload_check::run(a),
        Command::KernelCheck(a) => kernel_check::run(a),
        Command::Eval(a) => eval::run(a),
        Command::FetchModel(a) => fetch::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ CliError::Cancelled { .. }) => {
            eprintln!("{e}");
            ExitCode::from(130)
        }
        Err(e) => {
            let msg = e.to_string();
            eprintln!("error: {msg}");
            // causes whose text the message already carries (an I/O error after its path)
            // are not repeated
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                let cause = s.to_string();
                if !msg.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                }
                src = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

/// Checks `--gamma`: 1 ..= [`dustin_spec::MAX_GAMMA`] draft tokens per iteration.
///
/// # Errors
/// [`CliError::Usage`] naming the value and the range.
pub(crate) fn check_gamma(gamma: usize) -> Result<(), CliError> {
    if gamma == 0 || gamma > dustin_spec::MAX_GAMMA {
        return Err(CliError::Usage(format!(
            "--gamma {gamma}: expected 1 ..= {}",
            dustin_spec::MAX_GAMMA
        )));
    }
    Ok(())
}

/// Creates the output folder `--out` (and its parents) and checks that a file can be
/// written in it, so that a bad folder is named before any work is done.
///
/// # Errors
/// [`CliError::Usage`] when `out` is a file; [`CliError::Io`] naming `--out` when the
/// folder cannot be created or written.
pub(crate) fn create_out_dir(out: &std::path::Path) -> Result<(), CliError> {
    if out.exists() && !out.is_dir() {
        return Err(CliError::Usage(format!(
            "--out {}: a file, expected a folder (created when missing)",
            out.display()
        )));
    }
    let io = |source| CliError::Io {
        path: format!("--out {}", out.display()),
        source,
    };
    std::fs::create_dir_all(out).map_err(io)?;
    let probe = out.join(format!(".dustin-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(io)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Errors of the command line.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A bad argument.
    #[error("{0}")]
    Usage(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Model loading or running failed.
    #[error(transparent)]
    Model(#[from] dustin_qwen::QwenError),
    /// The engine failed.
    #[error(transparent)]
    Spec(#[from] dustin_spec::SpecError),
    /// A core error.
    #[error(transparent)]
    Core(#[from] dustin_core::CoreError),
    /// Fetching a model failed (boxed: it carries the instructions for placing the file by
    /// hand).
    #[error(transparent)]
    Fetch(Box<fetch::FetchError>),
    /// Generation was cancelled (Ctrl-C); finished and partial texts were written.
    #[error(
        "cancelled: {cancelled} of {total} sequences were unfinished (their partial text and \
         the finished ones were written out)"
    )]
    Cancelled {
        /// Sequences cut short.
        cancelled: usize,
        /// Sequences in the batch.
        total: usize,
    },
}
