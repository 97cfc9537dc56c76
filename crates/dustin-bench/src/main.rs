//! The `dustin-bench` command: dustin's lab instruments, apart from the product commands of
//! `dustin`. They measure and check rather than generate text:
//!
//! - `bench`: prefill and decode speed of a random-weight model at the shapes of a
//!   `config.json`;
//! - `e2e`: end-to-end decoding speed at real model shapes (random weights), autoregressive
//!   against speculative decoding with each selector under a stated acceptance schedule,
//!   with a bandwidth floor next to every row;
//! - `plot`: tokens/s against context length per mode from `e2e --json` rows (SVG and a
//!   Markdown table);
//! - `subspec`: SubSpec at a GPU-memory budget, offloaded autoregressive decoding against a
//!   substitute draft;
//! - `tp-check`: the tensor-parallel model against the whole model, same random weights;
//! - `upload-check`: host-to-device copies of weight matrices, pageable against page-locked
//!   memory;
//! - `kernel-check`: the per-layer kernels against float64 references, then a 2-layer random
//!   model through the kernels against its own Burn ops.
//!
//! The backend choice, generation options, host profile and errors are `dustin-cli`'s
//! library's, shared with `dustin`. Backends: the CPU (`burn-flex`, f32) always; CUDA
//! (`burn-cuda`, bf16 or f32) when built with `--features cuda`.

#![warn(missing_docs)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use dustin_cli::exit_code;

mod bench;
mod e2e;
mod jsonl;
mod kernel_check;
mod lookahead_check;
mod plot;
mod subspec;
mod tp_check;
mod upload_check;

/// dustin-bench: dustin's lab instruments (speed benchmarks at real model shapes with random
/// weights, their plots, and checks of the kernels, tensor parallelism and host-to-device
/// copies).
#[derive(Debug, Parser)]
#[command(name = "dustin-bench", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Time prefill and decode of a random-weight model at the shapes of a config.json.
    Bench(bench::BenchArgs),
    /// End-to-end decoding speed at real model shapes (random weights): autoregressive vs
    /// speculative with each selector, under a stated acceptance schedule.
    E2e(Box<e2e::E2eArgs>),
    /// Plot tokens/s against context length per mode from `e2e --json` rows (SVG and a
    /// Markdown table).
    Plot(plot::PlotArgs),
    /// SubSpec at a GPU-memory budget: offloaded autoregressive decoding vs a substitute
    /// draft, random weights at real shapes, acceptance from a schedule.
    Subspec(subspec::SubspecArgs),
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    exit_code(match cli.command {
        Command::Bench(a) => bench::run(a),
        Command::E2e(a) => e2e::run(*a),
        Command::Plot(a) => plot::run(a),
        Command::Subspec(a) => subspec::run(a),
        Command::TpCheck(a) => tp_check::run(a),
        Command::UploadCheck(a) => upload_check::run(a),
        Command::KernelCheck(a) => kernel_check::run(a),
    })
}
